"""/metrics and ``cdcflow cli changefeed statistics`` during a real run: the playground's
workload through a ``cdcflow run`` capture (TiKV source over gRPC, Spark, Kafka sink).

One capture serves every test of the module (a Spark start-up is most of the time)."""

from __future__ import annotations

import json
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from cdcflow.core.data.events import tso_physical_ms
from cdcflow.core.metrics import metric_names
from cdcflow.plugins.sinks.kafka.mock import mock_cluster
from cdcflow.plugins.sources.playground import Playground
from tests.e2e.e2e_kafka import CDCFLOW, CHANGEFEED, CaptureProcess

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]

RATE = 30.0  # workload transactions per second
Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


class Run:
    def __init__(self, pg: Playground, capture: CaptureProcess, address: str) -> None:
        self.pg, self.capture, self.address = pg, capture, address

    def scrape(self) -> Samples:
        with urllib.request.urlopen(f"http://{self.address}/metrics", timeout=30) as resp:
            assert resp.headers["Content-Type"].startswith("text/plain")
            text = resp.read().decode()
        return {
            (s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text)
            for s in family.samples
        }

    def statistics(self, *flags: str) -> subprocess.CompletedProcess[str]:
        command = [CDCFLOW, "cli", "changefeed", "statistics", "-c", CHANGEFEED, "--server", self.address, *flags]
        return subprocess.run(command, capture_output=True, text=True, timeout=120, check=False)


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Run]:
    tmp = Path(tmp_path_factory.mktemp("metrics"))
    cluster = mock_cluster(3)
    topic = "e2e-metrics"
    cluster.create_topic(topic, 3, 3)
    with Playground(stores=3, seed=23, ddl_every=0, split_keys=0, split_bytes=0) as pg:
        capture = CaptureProcess(tmp, pg, cluster.bootstrap_servers, topic, pg.now())
        capture.start()
        try:
            pg.start_workload(RATE)
            capture.wait_checkpoint(pg.now())  # the pipeline is up and keeps up with live commits
            yield Run(pg, capture, capture.api_address())
        finally:
            pg.stop_workload()
            capture.stop()
            capture.kill()


def total(samples: Samples, name: str, **labels: str) -> float:
    """The sum of ``name``'s samples whose labels include ``labels``."""
    return sum(v for (n, ls), v in samples.items() if n == name and labels.items() <= dict(ls).items())


def one(samples: Samples, name: str) -> float:
    return samples[(name, (("changefeed", CHANGEFEED),))]


def test_counters_move_while_the_workload_runs(run: Run):
    first = run.scrape()
    deadline = time.monotonic() + 60
    while True:
        time.sleep(2)
        second = run.scrape()
        if total(second, "cdcflow_spark_batch_rows_count") >= total(first, "cdcflow_spark_batch_rows_count") + 3:
            break
        assert time.monotonic() < deadline, f"no micro-batch in 60 s; capture log:\n{run.capture.log_tail()}"
    cf = {"changefeed": CHANGEFEED}
    for name in (
        "cdcflow_source_rows_read_total",
        "cdcflow_source_read_bytes_total",
        "cdcflow_sink_rows_written_total",
        "cdcflow_sink_written_bytes_total",
        "cdcflow_sink_flush_duration_seconds_count",
        "cdcflow_spark_batch_duration_seconds_count",
        "cdcflow_spark_task_duration_seconds_count",
    ):
        assert total(second, name, **cf) > total(first, name, **cf), name
    assert total(second, "cdcflow_sink_rows_written_total", changefeed=CHANGEFEED, sink="kafka") > 0
    assert total(second, "cdcflow_metastore_operation_duration_seconds_count", operation="update_checkpoints") > 0
    assert total(second, "cdcflow_eventfeed_regions", **cf) >= 1
    assert total(second, "cdcflow_eventfeed_regions_initializing", **cf) == 0  # scans long done
    assert total(second, "cdcflow_processor_spans", changefeed=CHANGEFEED, state="replicating") >= 1
    assert total(second, "cdcflow_event_store_memory_quota_bytes", **cf) > 0
    assert second[("cdcflow_capture_is_owner", ())] == 1
    assert second[("cdcflow_changefeeds", (("state", "normal"),))] == 1
    assert one(second, "cdcflow_changefeed_state") == 0
    assert {name for name, _ in second} <= metric_names()
    # Nothing failed or was retried in a healthy run.
    assert total(second, "cdcflow_errors_total") == 0


def test_lags_agree_with_the_metastore(run: Run):
    for _ in range(3):
        _, before = run.capture.checkpoint()
        scraped_at = time.time()
        samples = run.scrape()
        _, after = run.capture.checkpoint()
        persisted = one(samples, "cdcflow_changefeed_checkpoint_timestamp_seconds")
        # The scraped checkpoint is the one the metastore held during the scrape.
        assert tso_physical_ms(before) / 1000 - 1e-3 <= persisted <= tso_physical_ms(after) / 1000 + 1e-3
        lag = one(samples, "cdcflow_changefeed_checkpoint_lag_seconds")
        assert 0 <= lag <= time.time() - tso_physical_ms(before) / 1000 + 1e-3
        assert lag >= scraped_at - persisted - 1e-3
        assert lag < 60, "a changefeed keeping up with 30 txn/s lags by seconds, not minutes"
        # Resolved is ahead of the checkpoint; this capture's in-memory checkpoint is ahead of the persisted one.
        assert one(samples, "cdcflow_changefeed_resolved_lag_seconds") <= lag + 1e-3
        assert one(samples, "cdcflow_processor_checkpoint_lag_seconds") <= lag + 1e-3
        assert (
            one(samples, "cdcflow_processor_resolved_lag_seconds")
            <= one(samples, "cdcflow_processor_checkpoint_lag_seconds") + 1e-3
        )
        time.sleep(1)


def test_statistics_once_as_json(run: Run):
    done = run.statistics("--json")
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report["id"] == CHANGEFEED and report["state"] == "normal"
    assert report["rows_read_per_second"] > 0 and report["rows_written_per_second"] > 0
    assert 0 <= report["checkpoint_lag_seconds"] < 60
    assert report["resolved_lag_seconds"] <= report["checkpoint_lag_seconds"] + 1e-3
    assert report["captures"] == 1 and report["rows_written"] > 0


def test_statistics_every_interval_as_a_table(run: Run):
    done = run.statistics("--interval", "1", "--count", "2")
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert len(lines) == 3 and lines[0].split()[:2] == ["CHANGEFEED", "STATE"], done.stdout
    assert all(line.split()[0] == CHANGEFEED and line.split()[1] == "normal" for line in lines[1:])


def test_statistics_of_an_unknown_changefeed_and_a_bad_interval(run: Run):
    missing = subprocess.run(
        [CDCFLOW, "cli", "changefeed", "statistics", "-c", "nope", "--server", run.address],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert missing.returncode != 0 and "nope" in missing.stderr
    bad = run.statistics("--interval", "0")
    assert bad.returncode == 2 and "above 0" in bad.stderr
