"""The shape of ``connectors.yaml``: a ``server`` section and a list of connectors.

Plugin sections (``source``, ``sinks[]``, ``scheduler``) are kept as raw
mappings here and validated by the loader against the selected plugin's own
config model, so that plugins own their options (STYLE §8).
"""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, ValidationInfo, field_validator, model_validator

from cdcflow.core.config.units import ByteSize, Duration
from cdcflow.core.data.filter import DEFAULT_FILTER_RULES, TableFilter
from cdcflow.core.plugin.base import kebab

__all__ = [
    "CHANGEFEED_ID_PATTERN",
    "CONNECTOR_OPTIONS",
    "DEFAULT_API_ADDR",
    "DEFAULT_DATA_DIR",
    "DEFAULT_ERROR_STUCK_DURATION",
    "DEFAULT_GC_TTL",
    "DEFAULT_KEEP_WORKERS",
    "DEFAULT_MEMORY_QUOTA",
    "DEFAULT_RECLAIM_INTERVAL",
    "DEFAULT_SPILL_DISK_QUOTA",
    "DEFAULT_TRIGGER_INTERVAL",
    "MAX_CHANGEFEED_ID_LENGTH",
    "MAX_TSO",
    "MIN_MEMORY_QUOTA",
    "QUICK_JIT_MAX_CORES",
    "ColumnSelectorSettings",
    "ConnectorSettings",
    "DeploymentFile",
    "FilterSettings",
    "SecuritySettings",
    "ServerSettings",
    "SparkSettings",
]

#: Changefeed ids, as TiCDC accepts them: words of letters and digits joined by dashes.
CHANGEFEED_ID_PATTERN = re.compile(r"^[a-zA-Z0-9]+(-[a-zA-Z0-9]+)*$")
#: The longest changefeed id (TiCDC's limit); ids name files and directories.
MAX_CHANGEFEED_ID_LENGTH = 128
#: The largest TSO a setting may name: a TSO is stored as a signed 64-bit integer.
MAX_TSO = 2**63 - 1
#: The smallest memory-quota a changefeed can run with.
MIN_MEMORY_QUOTA = 1024**2


def _start_ts(value: object) -> object:
    if value == "now":
        return value
    ts: int | None = None
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        ts = value
    elif isinstance(value, str) and value.isascii() and value.isdigit() and len(value) <= 20:
        ts = int(value)
    if ts is None:
        raise ValueError("start-ts must be a TSO (a non-negative integer) or 'now'")
    if ts > MAX_TSO:
        raise ValueError(f"start-ts must be a TSO of at most {MAX_TSO} (2^63 - 1)")
    return ts


class _Settings(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", alias_generator=kebab, populate_by_name=True)


#: A capture's directory for local state; the metastore file and the Spark warehouse
#: are in it unless configured elsewhere.
DEFAULT_DATA_DIR = "./data"
#: Seconds between two sweeps of a capture's data directory for removed changefeeds' files (5 min).
DEFAULT_RECLAIM_INTERVAL = 300.0
#: Seconds between two looks of a changefeed's streaming query for new resolved data.
DEFAULT_TRIGGER_INTERVAL = 0.5
#: Seconds between two runs of the job that keeps Spark's idle Python workers (server.spark.keep-workers).
DEFAULT_KEEP_WORKERS = 40.0
#: Machines with at most this many cores get Spark's JVM with the quick JIT only (server.spark.jit: auto).
QUICK_JIT_MAX_CORES = 4
#: Rows a micro-batch holds at most, by default (server.spark.max-batch-rows). Each batch
#: also costs a fixed part, about 0.16 s on two cores (Spark's offset and commit logs, its
#: planning, the job's start, the commit): at 250,000 rows that is a tenth of a catch-up
#: batch's time on two task slots, at 100,000 a quarter (docs/explanation/
#: log-service-and-pipeline.md, "What a batch costs besides its rows"). A crash replays at
#: most one batch; a task sorts at most its share of one in its worker.
DEFAULT_MAX_BATCH_ROWS = 250_000


class SparkSettings(_Settings):
    """Where the data pipeline runs."""

    master: str = Field("local[*]", description="spark.master: local[*] in the capture's process, or a cluster URL.")
    app_name: str = Field("cdcflow", description="Spark application name.")
    warehouse_dir: str = Field(f"{DEFAULT_DATA_DIR}/lake", description="spark.sql.warehouse.dir for Spark table sinks.")
    conf: dict[str, str] = Field(default_factory=dict, description="Extra Spark properties; applied last.")
    trigger_interval: Duration = Field(
        DEFAULT_TRIGGER_INTERVAL,
        gt=0,
        description="How often each changefeed's streaming query looks for new resolved data (e.g. 500ms).",
    )
    max_batch_rows: int = Field(
        DEFAULT_MAX_BATCH_ROWS,
        ge=0,
        description=(
            "Rows a micro-batch may hold: a larger resolved interval (a catch-up, an initial scan) is "
            "published and read as several batches, so the checkpoint moves during it (0: no bound; "
            "one transaction is never split)."
        ),
    )

    keep_workers: Duration = Field(
        DEFAULT_KEEP_WORKERS,
        ge=0,
        description=(
            "How often a one-task-per-core Spark job runs while no other job does, so that Spark does not "
            "end the idle Python workers (it does after a minute without Python work) and the first batch "
            "after a quiet spell does not start them and import the task modules again (0: never; keep it "
            "under a minute)."
        ),
    )

    snapshot_read_ahead: bool = Field(
        True,
        description=(
            "While Spark's session and Python workers start, a capture with an initial snapshot to take "
            "reads its parts itself, as many at once as Spark runs tasks on its machine (N of local[N], "
            "else its cores), into the same part files; Spark's read takes the parts left (false: every "
            "part is read in a Spark task)."
        ),
    )

    jit: Literal["auto", "quick", "full"] = Field(
        "auto",
        description=(
            "How the JVM of a local-mode Spark compiles: quick (its first-tier compiler only: cheap to "
            "compile, code somewhat slower), full (the JVM's default, both tiers: the second compiles "
            "for a minute or more after a start, on the cores the pipeline needs), or auto (quick on machines "
            f"of at most {QUICK_JIT_MAX_CORES} cores, full on larger ones). Cluster masters are left as configured."
        ),
    )

    class_cache: bool = Field(
        True,
        description=(
            "Local masters: Spark's JVM maps the classes it loads at start from an archive it wrote at an "
            "earlier exit (the JDK's class-data sharing), for a start seconds shorter; one archive of about "
            "160 MB per Java, Spark and JVM options (false: every start loads them from the jars)."
        ),
    )
    class_cache_dir: str = Field(
        "",
        description=(
            "Where those archives are kept (empty: $XDG_CACHE_HOME/cdcflow/spark-classes, else "
            "~/.cache/cdcflow/spark-classes); shared by the captures of a machine."
        ),
    )

    @field_validator("conf", mode="before")
    @classmethod
    def _stringify(cls, value: Any) -> Any:
        if isinstance(value, dict):
            return {str(k): str(v).lower() if isinstance(v, bool) else str(v) for k, v in value.items()}
        return value


#: host:port of a capture's REST API.
DEFAULT_API_ADDR = "127.0.0.1:8300"
#: Seconds the upstream GC safepoint is kept (24 h), and failed changefeeds protected.
DEFAULT_GC_TTL = 86400.0


#: The environment variable the API's bearer token is read from, by default.
DEFAULT_TOKEN_ENV = "CDCFLOW_API_TOKEN"


class SecuritySettings(_Settings):
    """Who may use the REST API, how captures talk to each other, and which sinks API clients may create."""

    ca: str = Field("", description="CA certificate (PEM) that signs the server's and the clients' certificates.")
    cert: str = Field("", description="This capture's certificate (PEM): the API serves HTTPS with it.")
    key: str = Field("", description="The private key (PEM) of 'cert'.")
    cert_allowed_cn: list[str] = Field(
        default_factory=list,
        description="Common names of the client certificates the API accepts (empty: any certificate the CA signed).",
    )
    token_env: str = Field(
        "",
        description=f"Environment variable holding the API's bearer token (e.g. {DEFAULT_TOKEN_ENV}); empty: no token.",
    )
    allow_insecure_bind: bool = Field(
        False, description="Serve the API on a non-loopback address without client certificates or a token."
    )
    allowed_sinks: list[str] | None = Field(
        None,
        description="Sink URI schemes or sink types API clients may create (unset: every installed sink).",
    )
    file_roots: list[str] = Field(
        default_factory=list,
        description="Directories file sinks created through the API must write under (empty: anywhere).",
    )

    @model_validator(mode="after")
    def _tls_triple(self) -> SecuritySettings:
        given = [bool(self.ca), bool(self.cert), bool(self.key)]
        if any(given) and not all(given):
            raise ValueError("ca, cert and key go together: set all three (TLS) or none")
        return self

    @field_validator("token_env")
    @classmethod
    def _env_name(cls, value: str) -> str:
        if value and not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", value):
            raise ValueError(f"{value!r} is not an environment variable name (letters, digits, underscores)")
        return value

    @property
    def tls(self) -> bool:
        return bool(self.ca and self.cert and self.key)


class ServerSettings(_Settings):
    """The capture process: metastore, API, data directory, Spark."""

    metastore: str = Field(
        f"sqlite:///{DEFAULT_DATA_DIR}/meta.db",
        description="Metastore URL: sqlite:///path (one node) or etcd://host:port[,host:port] (cluster).",
    )
    api_addr: str = Field(DEFAULT_API_ADDR, description="host:port the REST API listens on.")
    advertise_addr: str = Field("", description="host:port other captures use to reach this one; api-addr when empty.")
    data_dir: str = Field(DEFAULT_DATA_DIR, description="Directory for the event store's spill files and local state.")
    gc_ttl: Duration = Field(DEFAULT_GC_TTL, description="TTL of the upstream GC safepoint cdcflow keeps (e.g. 24h).")
    reclaim_interval: Duration = Field(
        DEFAULT_RECLAIM_INTERVAL,
        ge=0,
        description="How often the capture deletes the files (event store, Spark checkpoint, snapshot) of "
        "changefeeds that no longer exist from its data-dir; also once when it starts (0: never).",
    )
    log_level: Literal["debug", "info", "warning", "error"] = Field("info", description="Log level.")
    spark: SparkSettings = Field(default_factory=SparkSettings, description="Spark settings.")
    metrics: bool = Field(
        True,
        description="Record data-plane metrics (rows, bytes, flush and batch durations, errors) and metastore "
        "latency for /metrics; false: /metrics serves only what it reads when scraped.",
    )
    security: SecuritySettings = Field(
        default_factory=SecuritySettings, description="TLS, API authentication and the sinks API clients may create."
    )

    @field_validator("metastore")
    @classmethod
    def _metastore_scheme(cls, value: str) -> str:
        if not (value.startswith("sqlite://") or value.startswith("etcd://")):
            raise ValueError("the metastore URL must start with sqlite:// or etcd://")
        return value

    @field_validator("api_addr")
    @classmethod
    def _host_port(cls, value: str) -> str:
        host, sep, port = value.rpartition(":")
        if not sep or not host or not port.isdigit() or not 0 <= int(port) <= 65535:
            raise ValueError(f"{value!r} is not host:port (e.g. 127.0.0.1:8300)")
        return value


class ColumnSelectorSettings(_Settings):
    """Which columns of some tables are replicated."""

    matcher: list[str] = Field(description="Table-filter rules of the tables this selector applies to.")
    columns: list[str] = Field(
        description="Column patterns to keep (* ? [] wildcards, ! to exclude; the last match wins)."
    )

    @field_validator("matcher")
    @classmethod
    def _parse_matcher(cls, rules: list[str]) -> list[str]:
        for i, rule in enumerate(rules):
            problem = TableFilter.check(rule)
            if problem:
                raise ValueError(f"matcher {i} {problem}")
        return rules


class FilterSettings(_Settings):
    """Which tables a connector replicates."""

    rules: list[str] = Field(
        default_factory=lambda: list(DEFAULT_FILTER_RULES),
        description="Table-filter rules (schema.table with * ? [] wildcards, ! to exclude); the last match wins.",
    )
    case_sensitive: bool = Field(False, description="Compare schema and table names case-sensitively.")
    ignore_txn_start_ts: list[int] = Field(
        default_factory=list, description="Skip the transactions with these start ts."
    )
    column_selectors: list[ColumnSelectorSettings] = Field(
        default_factory=list,
        description="Per-table column selection; the first selector whose matcher matches a table applies.",
    )

    @field_validator("rules")
    @classmethod
    def _parse_rules(cls, rules: list[str]) -> list[str]:
        for i, rule in enumerate(rules):
            problem = TableFilter.check(rule)
            if problem:
                raise ValueError(f"rule {i} {problem}")
        return rules

    def table_filter(self) -> TableFilter:
        return TableFilter(self.rules, case_sensitive=self.case_sensitive)


#: Bytes of buffered changes per changefeed before they spill (1 GiB).
DEFAULT_MEMORY_QUOTA = 1024**3
#: Event-store disk per changefeed; 0: no limit.
DEFAULT_SPILL_DISK_QUOTA = 0
#: Seconds a changefeed may stay Warning before it becomes Failed (30 min).
DEFAULT_ERROR_STUCK_DURATION = 1800.0


class ConnectorSettings(_Settings):
    """One connector: a changefeed from a source into one or more sinks."""

    name: str = Field(description="Changefeed id: letters and digits, words joined by dashes.")
    description: str = Field("", description="Free text shown in listings.")
    source: dict[str, Any] = Field(description="The source plugin: 'type' plus its options.")
    sinks: list[dict[str, Any]] = Field(
        min_length=1, description="Sink plugins: each 'type' (or a 'uri' whose scheme picks it) plus options."
    )
    scheduler: dict[str, Any] | None = Field(None, description="The scheduler plugin; the default when omitted.")
    start_ts: Annotated[int | Literal["now"], BeforeValidator(_start_ts)] = Field(
        "now", description="Replicate changes committed after this TSO, or 'now'."
    )
    target_ts: int = Field(0, ge=0, le=MAX_TSO, description="Stop (state finished) at this TSO; 0 means never.")
    initial_snapshot: bool = Field(
        False,
        description="First copy every row of every table in the filter as of the start ts (rows with commit ts = "
        "start ts, op insert), read in parallel Spark tasks, then stream the changes above it. Sources that "
        "cannot read a table as of one ts refuse it.",
    )
    filter: FilterSettings = Field(default_factory=FilterSettings, description="Table filter.")
    transforms: list[dict[str, Any]] = Field(
        default_factory=list,
        description="Transforms applied in order between the source and the sinks: each a 'type' (filter, "
        "project, mask, route, python, or a plugin's) plus 'tables' (table-filter rules; empty: every table) "
        "and its options.",
    )
    memory_quota: ByteSize = Field(
        DEFAULT_MEMORY_QUOTA,
        description="Memory per changefeed for buffered changes before they spill: the source's feeds take their "
        "share (tikv: a quarter), the event store the rest. At least 1MiB.",
    )
    spill_disk_quota: ByteSize = Field(
        DEFAULT_SPILL_DISK_QUOTA,
        description="Event-store disk (spill runs, resolved chunks) per changefeed; feeds pause at it; 0: no limit. "
        "Otherwise at least memory-quota: a full memory buffer must fit on disk when it spills.",
    )
    error_stuck_duration: Duration = Field(
        DEFAULT_ERROR_STUCK_DURATION,
        gt=0,
        description="How long a changefeed may stay Warning before it becomes Failed.",
    )

    @field_validator("name")
    @classmethod
    def _name(cls, value: str) -> str:
        if len(value) > MAX_CHANGEFEED_ID_LENGTH:
            raise ValueError(
                f"the connector name has {len(value)} characters; at most {MAX_CHANGEFEED_ID_LENGTH} are allowed"
            )
        if not CHANGEFEED_ID_PATTERN.match(value):
            raise ValueError(
                f"{value!r} is not a valid connector name: use letters and digits, words joined by single dashes"
            )
        return value

    @field_validator("memory_quota")
    @classmethod
    def _memory_minimum(cls, value: int) -> int:
        if value < MIN_MEMORY_QUOTA:
            raise ValueError(f"memory-quota is {value} bytes; a changefeed needs at least 1MiB")
        return value

    @field_validator("spill_disk_quota")
    @classmethod
    def _disk_holds_memory(cls, value: int, info: ValidationInfo) -> int:
        memory = info.data.get("memory_quota")
        if value and memory is not None and value < memory:
            raise ValueError(
                f"spill-disk-quota ({value} bytes) is below memory-quota ({memory} bytes): the changefeed could "
                "never spill a full memory buffer and would stall; give at least memory-quota, or 0 for no limit"
            )
        return value


#: The connector's own options: every field but its name, its plugin sections and its
#: start ts. A changefeed record (``ChangeFeedInfo``) keeps each in a field of the same
#: name, defaulting to the one declared here; API requests and answers, the stored JSON
#: and the section a capture validates again all follow this list.
CONNECTOR_OPTIONS: tuple[str, ...] = tuple(
    name for name in ConnectorSettings.model_fields if name not in {"name", "source", "sinks", "scheduler", "start_ts"}
)


class DeploymentFile(_Settings):
    """The whole file."""

    server: ServerSettings = Field(default_factory=ServerSettings, description="The capture process.")
    connectors: list[ConnectorSettings] = Field(default_factory=list, description="The connectors.")
