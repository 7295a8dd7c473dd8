"""assert_replicated reads back Spark table sinks and Kafka topics in canal-json.

One ``cdcflow run`` (through the ``cdcflow_deployment`` fixture) replicates the playground's
shop workload to a Spark table sink writing snapshot and change log, a second one writing the
change log only, and two canal-json topics, with and without TiDB's extension (watermarks and
commit ts, or none); every shop table in every sink must equal the playground's snapshot.
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
        "server": {"spark": {"master": "local[1]", "conf": {"spark.sql.shuffle.partitions": "2"}}},
        "connectors": [
            {
                "name": "shop-sinks",
                "source": {"type": "tikv", "pd": ["127.0.0.1:2379"], "tidb-status": "127.0.0.1:10080"},
                "sinks": [
                    {"uri": "spark://"},
                    {"uri": "spark://./changes?mode=changelog"},
                    {"uri": "kafka://127.0.0.1:9092/shop-canal?protocol=canal-json&partition-num=2"},
                    {
                        "uri": "kafka://127.0.0.1:9092/shop-canal-tidb?protocol=canal-json"
                        "&enable-tidb-extension=true&partition-num=3"
                    },
                ],
                "filter": {"rules": ["shop.*"]},
            }
        ],
    }
    path.write_text(yaml.safe_dump(doc))
    return path


@pytest.mark.timeout(400)
def test_spark_tables_and_canal_json_topics_equal_the_playground(tmp_path, cdcflow_deployment, cdcflow_playground):
    deployment = cdcflow_deployment(connectors(tmp_path))
    cdcflow_playground.run_workload(80)
    deployment.wait_checkpoint(cdcflow_playground.now())
    readers = deployment.readers()
    assert [r.kind for r in readers] == ["spark", "spark", "kafka:canal-json", "kafka:canal-json"]
    for table in TABLES:
        compared = deployment.assert_replicated(table)
        assert len(compared) == 4 and all(rows > 0 for rows in compared.values()), compared
