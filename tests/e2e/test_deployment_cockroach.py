"""cdcflow_deployment on a connectors file whose source is CockroachDB, against the CockroachDB playground.

``cdcflow run`` reads the ``cdcflow_cockroach_playground`` through its DSN (the file's address
replaced) and writes MariaDB (whose tables the fixture creates: the source replicates no CREATE
TABLE) and a Kafka topic in canal-json with TiDB's extension; ``assert_replicated`` compares both
with the playground's snapshot, typed by CockroachDB's column types.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

pytestmark = pytest.mark.integration

TABLES = ("customers", "products", "orders")


def connectors(tmp_path: Path) -> Path:
    path = tmp_path / "connectors.yaml"
    doc = {
        "server": {
            "spark": {"master": "local[1]", "trigger-interval": 0.3, "conf": {"spark.sql.shuffle.partitions": "2"}}
        },
        "connectors": [
            {
                "name": "crdb-shop",
                "source": {
                    "type": "cockroachdb",
                    "dsn": "postgresql://root@10.0.0.50:26257/shop?sslmode=disable",
                    "resolved-interval": 0.3,
                },
                "sinks": [
                    {"uri": "mysql://root@10.0.0.20:3306/"},
                    {"uri": "kafka://10.0.0.30:9092/crdb-canal?protocol=canal-json&enable-tidb-extension=true"},
                ],
                "filter": {"rules": ["shop.*"]},
            }
        ],
    }
    path.write_text(yaml.safe_dump(doc))
    return path


@pytest.mark.timeout(400)
def test_a_cockroachdb_source_is_replicated_and_compared(tmp_path, cdcflow_deployment, cdcflow_cockroach_playground):
    deployment = cdcflow_deployment(connectors(tmp_path))
    source = deployment.document["connectors"][0]["source"]
    assert source["dsn"] == cdcflow_cockroach_playground.dsn
    for _ in range(60):
        cdcflow_cockroach_playground.workload.step()
    deployment.wait_checkpoint(cdcflow_cockroach_playground.now().commit_ts)
    for table in TABLES:
        compared = deployment.assert_replicated(table)
        assert len(compared) == 2 and all(rows > 0 for rows in compared.values()), compared
