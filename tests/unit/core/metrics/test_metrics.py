"""The metric definitions, their exposition, the reference page and the Grafana dashboard."""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from cdcflow.core.control.changefeed import ChangeFeedInfo, ChangefeedState, ChangeFeedStatus
from cdcflow.core.errors import DownstreamUnavailableError
from cdcflow.core.metrics import (
    METRICS,
    CaptureMetrics,
    ExecutorStats,
    FeedStats,
    Snapshot,
    metric_names,
    reference_markdown,
)

REPO = Path(__file__).resolve().parents[4]
DASHBOARD = REPO / "docs" / "how-to" / "cdcflow-dashboard.json"


def tso(unix_seconds: float) -> int:
    return int(unix_seconds * 1000) << 18


def samples(text: bytes) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text.decode())
        for s in family.samples
    }


def snapshot(now: float, *changefeeds: tuple[str, ChangefeedState, float, float]) -> Snapshot:
    records = [
        (ChangeFeedInfo(cf, {"type": "ticker"}, [], state=state), ChangeFeedStatus(tso(checkpoint), tso(resolved)))
        for cf, state, checkpoint, resolved in changefeeds
    ]
    stats = ExecutorStats(
        source="tikv",
        checkpoint_ts=tso(now - 3),
        resolved_ts=tso(now - 1),
        spans_by_state={"replicating": 4},
        rows_read=120,
        bytes_read=4800,
        memory_bytes=1000,
        memory_quota_bytes=2000,
        spilled_bytes=300,
        chunk_bytes=400,
        chunks_pending=2,
        feed=FeedStats(memory_bytes=50, regions=6, regions_initializing=1, regions_lagging=2, incremental_scan_rows=9),
    )
    return Snapshot(records, captures=2, is_owner=True, term=7, rejoins=1, executors={"cf-a": stats}, now=now)


def test_every_name_follows_prometheus_conventions():
    for spec in METRICS:
        assert re.fullmatch(r"cdcflow_[a-z0-9_]+", spec.name), spec.name
        assert (spec.kind == "counter") == spec.name.endswith("_total"), spec.name
        if spec.unit in ("seconds", "bytes"):
            assert spec.name.removesuffix("_total").endswith(f"_{spec.unit}"), spec.name
    assert len({spec.name for spec in METRICS}) == len(METRICS)


def test_a_scrape_shows_every_metric_with_its_values():
    now = time.time()
    metrics = CaptureMetrics()
    recorder = metrics.changefeed("cf-a")
    recorder.sink_flushed("kafka", 100, 4000, 0.2)
    recorder.sink_flushed("kafka", 50, None, 0.1)
    recorder.batch_done(150, 0.5)
    recorder.tasks_done([0.1, 0.3])
    recorder.error(DownstreamUnavailableError("down"), retried=True)
    metrics.metastore_call("list_changefeeds", 0.002, None)
    metrics.metastore_call("update_checkpoints", 0.5, OSError("gone"))
    text = metrics.exposition(
        snapshot(now, ("cf-a", ChangefeedState.NORMAL, now - 10, now - 2), ("cf-b", ChangefeedState.FAILED, now, now))
    )
    got = samples(text)
    cf = (("changefeed", "cf-a"),)
    assert 9.5 < got[("cdcflow_changefeed_checkpoint_lag_seconds", cf)] < 11
    assert abs(got[("cdcflow_changefeed_checkpoint_timestamp_seconds", cf)] - (now - 10)) < 0.01
    assert got[("cdcflow_changefeed_state", (("changefeed", "cf-b"),))] == 2
    assert got[("cdcflow_changefeeds", (("state", "failed"),))] == 1
    assert got[("cdcflow_changefeeds", (("state", "paused"),))] == 0
    assert got[("cdcflow_capture_is_owner", ())] == 1 and got[("cdcflow_coordinator_term", ())] == 7
    assert 2.5 < got[("cdcflow_processor_checkpoint_lag_seconds", cf)] < 4
    assert got[("cdcflow_processor_spans", (("changefeed", "cf-a"), ("state", "replicating")))] == 4
    src = (("changefeed", "cf-a"), ("source", "tikv"))
    assert got[("cdcflow_source_rows_read_total", src)] == 120
    assert got[("cdcflow_eventfeed_regions_lagging", src)] == 2
    sink = (("changefeed", "cf-a"), ("sink", "kafka"))
    assert got[("cdcflow_sink_rows_written_total", sink)] == 150
    assert got[("cdcflow_sink_written_bytes_total", sink)] == 4000
    assert got[("cdcflow_sink_flush_duration_seconds_count", sink)] == 2
    assert got[("cdcflow_sink_batch_rows_bucket", (*sink[:1], ("le", "100.0"), sink[1]))] == 2
    assert got[("cdcflow_spark_task_duration_seconds_count", cf)] == 2
    code = (("changefeed", "cf-a"), ("code", str(int(DownstreamUnavailableError.code))))
    assert got[("cdcflow_retries_total", code)] == 1 and got[("cdcflow_errors_total", code)] == 1
    assert got[("cdcflow_metastore_errors_total", (("operation", "update_checkpoints"),))] == 1
    # Every series is a declared metric, and every declared metric shows up.
    shown = {name for name, _ in got} | {f.name for f in text_string_to_metric_families(text.decode())}
    assert {name for name, _ in got} <= metric_names()
    assert {spec.name for spec in METRICS} <= shown | {spec.name.removesuffix("_total") for spec in METRICS}


def test_each_capture_has_its_own_registry_and_removed_changefeeds_go():
    now = time.time()
    one, two = CaptureMetrics(), CaptureMetrics()
    one.changefeed("cf-a").sink_flushed("file", 10, 100, 0.01)
    one.changefeed("cf-gone").sink_flushed("file", 5, 50, 0.01)
    empty = Snapshot([], captures=1, is_owner=False, term=0, rejoins=0, now=now)
    assert not any(name.startswith("cdcflow_sink_") for name, _ in samples(two.exposition(empty)))
    one.forget(["cf-a"])
    after = samples(one.exposition(empty))
    assert ("cdcflow_sink_rows_written_total", (("changefeed", "cf-a"), ("sink", "file"))) in after
    assert not any(dict(labels).get("changefeed") == "cf-gone" for _, labels in after)


def test_a_capture_with_metrics_off_serves_only_what_is_scraped():
    now = time.time()
    text = CaptureMetrics.disabled().exposition(snapshot(now, ("cf-a", ChangefeedState.NORMAL, now, now)))
    names = {name for name, _ in samples(text)}
    assert "cdcflow_changefeed_checkpoint_lag_seconds" in names
    assert not any(name.startswith(("cdcflow_sink_", "cdcflow_spark_", "cdcflow_metastore_")) for name in names)


def test_the_reference_page_is_current():
    page = REPO / "docs" / "reference" / "metrics.md"
    assert page.read_text() == reference_markdown(), "run: .venv/bin/python -m cdcflow.core.metrics"
    for spec in METRICS:
        assert f"| `{spec.name}` |" in page.read_text()


def _expressions() -> list[tuple[str, str]]:
    dashboard = json.loads(DASHBOARD.read_text())
    return [(p["title"], t["expr"]) for p in dashboard["panels"] for t in p.get("targets", [])]


def test_the_dashboard_has_panels():
    assert len(_expressions()) >= 20


@pytest.mark.parametrize(("title", "expr"), _expressions())
def test_every_dashboard_expression_refers_to_exported_metrics(title, expr):
    names = re.findall(r"\bcdcflow_[a-z0-9_]+", expr)
    assert names, f"{title}: {expr} uses no cdcflow metric"
    unknown = [n for n in names if n not in metric_names()]
    assert not unknown, f"{title}: {expr} refers to {unknown}, which no capture exports"
    assert expr.count("(") == expr.count(")"), f"{title}: unbalanced parentheses in {expr}"
    if "_bucket" in expr:
        assert "histogram_quantile" in expr and "le" in expr, f"{title}: buckets outside histogram_quantile by le"


def test_the_dashboard_shows_every_metric_an_operator_alerts_on():
    used = {n for _, expr in _expressions() for n in re.findall(r"\bcdcflow_[a-z0-9_]+", expr)}
    used = {re.sub(r"_(bucket|sum|count)$", "", n) for n in used}
    missing = {spec.name for spec in METRICS if spec.name not in used and spec.name not in _NOT_ON_THE_DASHBOARD}
    assert not missing, f"metrics not on the dashboard: {sorted(missing)}"


#: Metrics kept off the dashboard on purpose (shown better another way).
_NOT_ON_THE_DASHBOARD = {
    "cdcflow_changefeed_checkpoint_timestamp_seconds",  # the lag panels show the same
    "cdcflow_changefeed_resolved_timestamp_seconds",
    "cdcflow_changefeed_state",  # "Changefeeds by state"
    "cdcflow_processor_spans",
    "cdcflow_event_store_dropped_duplicates_total",
}
