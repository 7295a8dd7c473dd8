"""The connectors file cdcflow_deployment runs: the servers' addresses in, the user's options kept."""

from __future__ import annotations

import pytest
import yaml

from cdcflow.core.errors import ConfigInvalidError
from cdcflow.core.testing.deployment import Deployment
from cdcflow.core.testing.servers import KafkaServer, MariaDB

FILE = """\
server:
  spark: {master: "local[1]", conf: {spark.ui.enabled: "false"}}
connectors:
  - name: shop
    source: {type: tikv, pd: ["10.0.0.10:2379"], tidb-status: "10.0.0.10:10080", playground: false}
    sinks:
      - uri: mysql://cdcflow:secret@10.0.0.20:3306/?safe-mode=true
      - uri: kafka://10.0.0.30:9092/shop-changes?protocol=open-protocol&partition-num=3
    filter: {rules: ["shop.*"]}
"""


@pytest.fixture
def connectors(tmp_path):
    path = tmp_path / "connectors.yaml"
    path.write_text(FILE)
    return path


def test_addresses_are_the_servers_and_options_stay(connectors, tmp_path):
    deployment = Deployment(connectors, tmp_path / "run", overrides={"connectors": {"shop": {"memory-quota": "64MiB"}}})
    deployment.mysql = MariaDB("127.0.0.1", 40001, "root", "pw")
    deployment.kafka = KafkaServer("127.0.0.1:40002")
    assert deployment.needs() == {"playground", "mysql", "kafka"}
    doc = deployment.render()
    sinks = [s["uri"] for s in doc["connectors"][0]["sinks"]]
    assert sinks == [
        "mysql://root:pw@127.0.0.1:40001/?safe-mode=true",
        "kafka://127.0.0.1:40002/shop-changes?protocol=open-protocol&partition-num=3",
    ]
    server = doc["server"]
    assert server["metastore"] == f"sqlite:///{tmp_path / 'run' / 'meta.db'}"
    assert server["api-addr"].startswith("127.0.0.1:") and server["data-dir"] == str(tmp_path / "run" / "data")
    assert server["spark"]["master"] == "local[1]" and server["spark"]["conf"] == {"spark.ui.enabled": "false"}
    assert doc["connectors"][0]["memory-quota"] == "64MiB"
    assert doc["connectors"][0]["filter"] == {"rules": ["shop.*"]}
    yaml.safe_dump(doc)  # what cdcflow run reads


def test_an_override_for_a_connector_the_file_lacks_is_a_config_error(connectors, tmp_path):
    deployment = Deployment(connectors, tmp_path / "run", overrides={"connectors": {"shopp": {"start-ts": 1}}})
    with pytest.raises(
        ConfigInvalidError, match=r"overrides.connectors.shopp: no connector named 'shopp' \(known: shop\)"
    ):
        deployment.render()


def test_an_invalid_file_fails_with_its_line(tmp_path):
    path = tmp_path / "connectors.yaml"
    path.write_text(FILE.replace("filter: {rules", "filtre: {rules"))
    with pytest.raises(ConfigInvalidError) as failed:
        Deployment(path, tmp_path / "run")
    assert str(path) in str(failed.value)
    assert any(issue.line == 9 and "filtre" in issue.message for issue in failed.value.issues)


SINKS = """\
server:
  spark: {master: "local[1]", warehouse-dir: ./lake}
connectors:
  - name: shop
    source: {type: tikv, pd: ["10.0.0.10:2379"], tidb-status: "10.0.0.10:10080", playground: false}
    sinks:
      - uri: mysql://root@10.0.0.20:3306/
      - uri: kafka://10.0.0.30:9092/op?protocol=open-protocol
      - uri: kafka://10.0.0.30:9092/canal?protocol=canal-json&enable-tidb-extension=true
      - uri: spark://./tables?mode=changelog
      - uri: spark://
      - uri: kafka://10.0.0.30:9092/avro?protocol=avro&schema-registry=http://10.0.0.40:8081
      - uri: file:///tmp/shop-files?protocol=json
"""


def rendered(tmp_path, text: str) -> Deployment:
    path = tmp_path / "connectors.yaml"
    path.write_text(text)
    deployment = Deployment(path, tmp_path / "run")
    deployment.tmp_dir.mkdir()
    deployment.document = deployment.render()
    deployment.file.write_text(yaml.safe_dump(deployment.document))
    return deployment


def test_sinks_it_cannot_compare_fail_by_name_unless_skipped(tmp_path):
    deployment = rendered(tmp_path, SINKS)
    with pytest.raises(AssertionError) as failed:
        deployment.readers()
    message = str(failed.value)
    assert "/avro?protocol=avro&schema-registry=http://10.0.0.40:8081 (Kafka in avro)" in message
    assert "file:///tmp/shop-files?protocol=json (a file sink)" in message
    assert "skip=" in message and "mysql://" not in message
    with pytest.raises(AssertionError) as failed:
        deployment.assert_replicated("orders")  # before anything is read
    assert "avro" in str(failed.value)

    readers = deployment.readers(skip=("kafka:avro", "file"))
    assert [r.kind for r in readers] == ["mysql", "kafka:open-protocol", "kafka:canal-json", "spark", "spark"]
    assert readers[2].options == {"bootstrap": "10.0.0.30:9092", "topic": "canal"}
    lake = str((deployment.tmp_dir / "lake").resolve())
    assert readers[3].options == {"root": str((deployment.tmp_dir / "tables").resolve()), "mode": "changelog"}
    assert readers[4].options == {"root": lake, "mode": "both"}


def test_a_spark_sink_writing_catalog_tables_by_merge_is_not_compared(tmp_path):
    text = SINKS.split("      - uri: mysql", maxsplit=1)[0] + (
        "      - {uri: 'spark://', table-format: merge, catalog-database: lake}\n"
    )
    with pytest.raises(AssertionError, match="MERGE INTO"):
        rendered(tmp_path, text).readers()
