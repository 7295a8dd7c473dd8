"""Options of the ``cockroachdb`` source."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from cdcflow.core.plugin import PluginConfig

__all__ = ["CockroachDBSourceConfig", "EmbeddedCockroachConfig"]


class EmbeddedCockroachConfig(PluginConfig):
    """The in-process CockroachDB playground the source starts (or attaches to) when it opens."""

    rate: float = Field(50.0, ge=0, description="Transactions per second of the shop workload (0: none).")
    seed: int = Field(0, ge=0, description="Workload seed.")


class CockroachDBSourceConfig(PluginConfig):
    """Where the CockroachDB cluster is and how its changefeeds are opened."""

    dsn: str = Field(
        "postgresql://root@127.0.0.1:26257/defaultdb?sslmode=disable",
        description=(
            "PostgreSQL connection URI of the cluster (any node or the load balancer), with the database "
            "to replicate, e.g. postgresql://cdc@crdb:26257/shop?sslmode=verify-full&sslrootcert=ca.crt. "
            "Put the password in PGPASSWORD or ${VAR}; it is never logged."
        ),
    )
    sql_schema: str = Field("public", description="The SQL schema whose tables are replicated.")
    resolved_interval: float = Field(
        1.0,
        gt=0,
        description="Seconds between resolved rows of each feed (changefeed `resolved` and "
        "`min_checkpoint_frequency`); bounds how fast the checkpoint moves and how much a restart repeats.",
    )
    initial_scan: Literal["no", "yes"] = Field(
        "no",
        description="Changefeed `initial_scan`: no (default) streams changes after the span's checkpoint; yes "
        "also scans the table at the cursor on every feed start (rows at or below the checkpoint are "
        "duplicates and dropped, so it only costs bandwidth).",
    )
    retry_budget: float = Field(
        300.0,
        gt=0,
        description="Seconds a feed keeps reconnecting (with backoff) without receiving a resolved row "
        "before it fails with ErrPDUnavailable (3001), which the changefeed retries later.",
    )
    connect_timeout: float = Field(10.0, gt=0, description="Seconds to wait for a connection.")
    table_poll_interval: float = Field(
        1.0,
        gt=0,
        description="Seconds between two reads of the catalog for tables created or dropped while the changefeed "
        "runs; the changefeed's checkpoint trails the last read.",
    )
    playground: bool | EmbeddedCockroachConfig = Field(
        False,
        description="true or {rate, seed}: start (or attach to) this process's CockroachDB playground when the "
        "source opens and read its `shop` database instead of `dsn`. false: a real cluster.",
    )

    def embedded_playground(self) -> EmbeddedCockroachConfig | None:
        """The playground options, or None when the source reads a real cluster."""
        if self.playground is True:
            return EmbeddedCockroachConfig()
        if isinstance(self.playground, EmbeddedCockroachConfig):
            return self.playground
        return None
