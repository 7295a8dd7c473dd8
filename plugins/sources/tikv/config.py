"""Options of the ``tikv`` source."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from cdcflow.core.plugin import PluginConfig

__all__ = ["EmbeddedPlaygroundConfig", "TiKVSourceConfig"]


class EmbeddedPlaygroundConfig(PluginConfig):
    """The in-process playground upstream the source starts (or attaches to) when it opens."""

    stores: int = Field(3, ge=1, le=16, description="Number of TiKV stores of the playground.")
    rate: float = Field(100.0, ge=0, description="Transactions per second of the shop workload (0: none).")
    seed: int = Field(0, ge=0, description="Workload seed (and cluster id).")


class TiKVSourceConfig(PluginConfig):
    """Where the TiKV cluster is and how to read it."""

    pd: list[str] = Field(
        default_factory=lambda: ["127.0.0.1:2379"],
        min_length=1,
        description="PD endpoints (host:port); the PD leader is followed automatically.",
    )
    tidb_status: str = Field(
        "127.0.0.1:10080", description="TiDB status API (host:port) serving table schemas and DDL history."
    )
    kv_api: Literal["tidb", "rawkv", "txnkv"] = Field(
        "tidb", description="tidb: decode TiDB rows; rawkv/txnkv: emit key/value changes of key-spans."
    )
    key_spans: list[list[str]] = Field(
        default_factory=list,
        description="For rawkv/txnkv: [start, end) key pairs (hex) to replicate.",
    )
    snapshot_range_keys: int = Field(
        0,
        ge=0,
        description="Initial snapshot (initial-snapshot: true): cut each region into ranges of about this many "
        "keys, one Spark task each; 0: one range per region.",
    )
    snapshot_page_size: int = Field(2048, ge=1, le=1_000_000, description="Initial snapshot: keys per KvScan request.")
    resolve_lock_interval: float = Field(
        20.0,
        ge=0,
        description="Seconds a region's resolved ts may stand still before the source lists the region's locks "
        "below the current TSO (KvScanLock) and resolves those of committed or expired transactions, as TiCDC "
        "does; an abandoned lock otherwise holds the changefeed's checkpoint forever. Live transactions' locks are "
        "left alone. 0: never (not used with kv-api rawkv).",
    )
    gc_service_id: str = Field("cdcflow", description="Service id of the GC safepoint kept in PD.")
    ca: str = Field("", description="CA certificate file for TLS to PD and TiKV; empty for plaintext.")
    cert: str = Field("", description="Client certificate file for TLS.")
    key: str = Field("", description="Client private key file for TLS.")
    playground: bool | EmbeddedPlaygroundConfig = Field(
        False,
        description=(
            "true or {stores, rate, seed}: start (or attach to) this process's playground upstream when the "
            "source opens and read it instead of `pd` / `tidb-status`; one playground per process, the first "
            "opener's options win. false: a real cluster."
        ),
    )

    def embedded_playground(self) -> EmbeddedPlaygroundConfig | None:
        """The playground options, or None when the source reads a real cluster."""
        if self.playground is True:
            return EmbeddedPlaygroundConfig()
        if isinstance(self.playground, EmbeddedPlaygroundConfig):
            return self.playground
        return None
