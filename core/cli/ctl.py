"""``cdcflow cli``: manage a running cluster through its REST API (``--server``)."""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import time
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlsplit

from cdcflow.core.cli._common import EXIT_CONFIG, EXIT_OK, print_json
from cdcflow.core.config.settings import CHANGEFEED_ID_PATTERN, DEFAULT_API_ADDR, DEFAULT_TOKEN_ENV
from cdcflow.core.errors import ConfigInvalidError, ConfigIssue

_CHANGEFEED_VERBS = {
    "create": "create a changefeed (--sink-uri or --config, --changefeed-id, --start-ts, --target-ts)",
    "pause": "pause a changefeed (-c ID)",
    "resume": "resume a paused or warning changefeed (-c ID)",
    "remove": "remove a changefeed (-c ID)",
    "update": "update a paused changefeed's sink URI, config or target ts (-c ID)",
    "list": "list changefeeds (--all to include finished and failed ones)",
    "query": "show one changefeed's state, checkpoint and error (-c ID)",
    "move-table": "move a table's spans to another capture, without a gap (-c ID --table-id T --target-capture C)",
    "list-tables": "show where each span of a changefeed runs and its scheduling state (-c ID)",
    "statistics": "show a changefeed's rows/s, checkpoint and resolved lag, once or every --interval seconds (-c ID)",
}


def server_url(value: str) -> str:
    """``--server``: ``[http[s]://]host:port`` (argparse type: anything else is a usage error)."""
    url = value if "://" in value else f"http://{value}"
    try:
        parts = urlsplit(url)
        _ = parts.port  # a port that is not a number 0-65535 raises
    except ValueError:
        parts = None
    ok = (
        parts is not None
        and parts.scheme in ("http", "https")
        and parts.hostname is not None
        and re.fullmatch(r"[A-Za-z0-9._-]+|[0-9A-Fa-f:.]+", parts.hostname) is not None
        and parts.path in ("", "/")
        and not parts.query
        and not parts.fragment
        and not parts.username
    )
    if not ok:
        raise argparse.ArgumentTypeError(
            f"{value!r} is not a server address: give [http://|https://]host:port (e.g. http://127.0.0.1:8300)"
        )
    return url.rstrip("/")


def changefeed_id(value: str) -> str:
    """``-c``: a changefeed id as the server accepts it (argparse type)."""
    if not CHANGEFEED_ID_PATTERN.match(value):
        raise argparse.ArgumentTypeError(
            f"{value!r} is not a changefeed id: ids contain letters and digits, words joined by single dashes "
            "(e.g. orders-to-kafka)"
        )
    return value


def _add_connection_options(parser: argparse.ArgumentParser, *, top: bool) -> None:
    """--server, --json and the TLS/token options; accepted before the group (``cli --server …
    changefeed list``) and after the verb (``cli changefeed list --server …``, as TiCDC's users type)."""

    def default(value: Any) -> Any:
        return value if top else argparse.SUPPRESS  # after the verb: only what is given overrides

    parser.add_argument(
        "--server", type=server_url, default=default(f"http://{DEFAULT_API_ADDR}"), help="address of any capture's API"
    )
    parser.add_argument("--json", action="store_true", default=default(False), help="print JSON for scripts")
    parser.add_argument("--ca", metavar="PEM", default=default(None), help="CA certificate that signs the server's")
    parser.add_argument("--cert", metavar="PEM", default=default(None), help="client certificate (PEM) for TLS")
    parser.add_argument("--key", metavar="PEM", default=default(None), help="private key of --cert (PEM)")
    parser.add_argument(
        "--token-env",
        metavar="NAME",
        default=default(DEFAULT_TOKEN_ENV),
        help=f"environment variable holding the API's bearer token (default {DEFAULT_TOKEN_ENV}; sent when set)",
    )


def add_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "cli",
        help="manage changefeeds and captures of a running cluster",
        description="Talk to a running cdcflow cluster through its REST API (--server).",
    )
    _add_connection_options(parser, top=True)
    groups = parser.add_subparsers(dest="group", metavar="{changefeed,capture}", required=True)

    changefeed = groups.add_parser("changefeed", help="manage changefeeds", description="Manage changefeeds.")
    verbs = changefeed.add_subparsers(dest="verb", metavar="VERB", required=True)
    for verb, text in _CHANGEFEED_VERBS.items():
        sub = verbs.add_parser(verb, help=text, description=text[0].upper() + text[1:] + ".")
        sub.add_argument(
            "-c", "--changefeed-id", type=changefeed_id, required=verb not in ("create", "list"), help="changefeed id"
        )
        _add_connection_options(sub, top=False)
        if verb in ("create", "update"):
            sub.add_argument("--sink-uri", help="sink URI (its scheme picks the sink plugin)")
            sub.add_argument(
                "--config", metavar="FILE", help="JSON or YAML with source, sinks, filter, scheduler (API fields)"
            )
            sub.add_argument("--target-ts", type=int, help="stop (finished) at this TSO")
        if verb == "create":
            sub.add_argument("--start-ts", type=int, help="replicate changes after this TSO (default: now)")
            sub.add_argument(
                "--initial-snapshot",
                action="store_true",
                default=None,
                help="first copy every row of the filtered tables as of the start ts, then stream the changes",
            )
        if verb == "resume":
            sub.add_argument("--overwrite-checkpoint-ts", type=int, help="resume from this TSO instead")
        if verb == "list":
            sub.add_argument("-a", "--all", action="store_true", help="include finished and failed changefeeds")
        if verb == "statistics":
            sub.add_argument(
                "--interval",
                type=positive_seconds,
                help="report every this many seconds until interrupted (default: once, rates over 1 s)",
            )
            sub.add_argument("--count", type=int, default=0, help="with --interval: stop after this many reports")
        if verb == "move-table":
            sub.add_argument("--table-id", type=int, required=True, help="id of the table to move")
            sub.add_argument("--target-capture", required=True, help="id of the capture to move it to")
        sub.set_defaults(func=run)

    capture = groups.add_parser("capture", help="inspect captures", description="Inspect captures.")
    capture_verbs = capture.add_subparsers(dest="verb", metavar="VERB", required=True)
    listing = capture_verbs.add_parser("list", help="list captures and the owner", description="List captures.")
    _add_connection_options(listing, top=False)
    listing.set_defaults(func=run)


def _config_file(path: str) -> dict[str, Any]:
    """The mapping of a ``--config`` file; 1001 naming the file (and line) when it is missing or not one."""
    from cdcflow.core.config.yamlsrc import load_located

    try:
        text = Path(path).read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigInvalidError(
            f"--config {path}: not UTF-8 text (byte {exc.start}); save it as UTF-8 JSON or YAML",
            [ConfigIssue("not UTF-8 text", file=path)],
        ) from None
    except OSError as exc:
        raise ConfigInvalidError(
            f"--config {path}: cannot read it ({exc.strerror or exc}); give a JSON or YAML file",
            [ConfigIssue(f"cannot read it: {exc.strerror or exc}", file=path)],
        ) from None
    doc = load_located(text, path)
    if doc.issues:
        raise ConfigInvalidError(f"--config {path}: {doc.issues[0]}", list(doc.issues))
    if not isinstance(doc.data, dict):
        kind = type(doc.data).__name__
        raise ConfigInvalidError(
            f"--config {path}: the file holds a {kind}, not a mapping of changefeed fields "
            "(source, sinks, filter, scheduler, ...)",
            [ConfigIssue(f"expected a mapping, found a {kind}", file=path, line=1)],
        )
    return doc.data


def changefeed_path(cf: str, suffix: str = "") -> str:
    """``/api/v2/changefeeds/<id>`` with the id percent-encoded (a ``?`` or ``/`` stays part of the id)."""
    return f"/api/v2/changefeeds/{quote(cf, safe='')}{suffix}"


def _body(args: argparse.Namespace) -> dict[str, Any]:
    body: dict[str, Any] = {}
    if getattr(args, "config", None):
        body.update(_config_file(args.config))
    if args.changefeed_id:
        body["changefeed_id"] = args.changefeed_id
    if getattr(args, "sink_uri", None):
        body["sinks"] = [{"uri": args.sink_uri}]
    if getattr(args, "start_ts", None) is not None:
        body["start_ts"] = args.start_ts
    if getattr(args, "target_ts", None) is not None:
        body["target_ts"] = args.target_ts
    if getattr(args, "initial_snapshot", None):
        body["initial_snapshot"] = True
    return body


def run(args: argparse.Namespace) -> int:
    try:
        return _run(args)
    except ConfigInvalidError as exc:  # --config, --ca/--cert/--key: nothing was sent
        sys.stderr.write(f"cdcflow: {exc}\n")
        return EXIT_CONFIG


def _run(args: argparse.Namespace) -> int:
    from cdcflow.core.api.client import ApiClient

    client = ApiClient(args.server, ca=args.ca, cert=args.cert, key=args.key, token=os.environ.get(args.token_env))
    cf: str = getattr(args, "changefeed_id", None) or ""
    if args.group == "capture":
        result = client.call("GET", "/api/v2/captures")
        return _show(args, result, _capture_table(result))
    verb = args.verb
    if verb == "list":
        result = client.call("GET", "/api/v2/changefeeds?state=all")
        if not args.all:
            result["items"] = [i for i in result["items"] if i["state"] not in ("finished", "failed", "removed")]
            result["total"] = len(result["items"])
        return _show(args, result, _changefeed_table(result["items"]))
    if verb in ("query", "statistics", "list-tables"):
        return _read_one(args, client, cf)
    if verb == "create":
        result = client.call("POST", "/api/v2/changefeeds", _body(args))
        return _show(
            args, result, f"Create changefeed successfully!\nID: {result['id']}\n" + _changefeed_detail(result)
        )
    if verb == "move-table":
        body = {"table_id": args.table_id, "target_capture_id": args.target_capture}
        result = client.call("POST", changefeed_path(cf, "/move_table"), body)
        n = len(result["spans"])
        return _show(args, result, f"Moving {n} span(s) of table {args.table_id} to {args.target_capture}\n")
    if verb == "update":
        result = client.call("PUT", changefeed_path(cf), _body(args))
        return _show(args, result, f"Update changefeed config successfully!\nID: {cf}\n")
    if verb == "pause":
        client.call("POST", changefeed_path(cf, "/pause"))
    elif verb == "resume":
        body = {}
        if args.overwrite_checkpoint_ts is not None:
            body["overwrite_checkpoint_ts"] = args.overwrite_checkpoint_ts
        client.call("POST", changefeed_path(cf, "/resume"), body)
    elif verb == "remove":
        client.call("DELETE", changefeed_path(cf))
    return _show(args, {"id": cf, "verb": verb, "ok": True}, f"{verb.capitalize()} changefeed {cf}: done\n")


def _read_one(args: argparse.Namespace, client: Any, cf: str) -> int:
    """The verbs that read one changefeed: query, statistics, list-tables."""
    if args.verb == "query":
        result = client.call("GET", changefeed_path(cf))
        return _show(args, result, _changefeed_detail(result))
    if args.verb == "statistics":
        return _statistics(args, client, cf)
    result = client.call("GET", changefeed_path(cf, "/tables"))
    return _show(args, result, _span_table(result["items"]))


def positive_seconds(value: str) -> float:
    """``--interval``: seconds > 0 (argparse type)."""
    try:
        seconds = float(value)
    except ValueError:
        seconds = 0.0
    if not seconds > 0:
        raise argparse.ArgumentTypeError(f"{value!r} is not a number of seconds above 0 (e.g. 5)")
    return seconds


def _statistics(args: argparse.Namespace, client: Any, cf: str) -> int:
    """TiCDC's ``changefeed statistics``: rates from two answers of the statistics API."""
    path = changefeed_path(cf, "/statistics")
    interval = args.interval or 1.0
    reports = 0
    before = client.call("GET", path)
    try:
        while True:
            time.sleep(interval)
            after = client.call("GET", path)
            report = statistics_report(before, after)
            if args.json:
                print_json(report)
            else:
                sys.stdout.write(_statistics_text(report, header=reports == 0))
            sys.stdout.flush()
            reports += 1
            if args.interval is None or (args.count and reports >= args.count):
                return EXIT_OK
            before = after
    except KeyboardInterrupt:
        return EXIT_OK


def statistics_report(before: dict[str, Any], after: dict[str, Any]) -> dict[str, Any]:
    """One report: ``after``'s progress and the rates since ``before`` (a counter that went
    down — an executor restarted — counts from zero)."""
    seconds = max(float(after["time"]) - float(before["time"]), 1e-9)

    def rate(key: str) -> float:
        delta = int(after[key]) - int(before[key])
        return round((delta if delta >= 0 else int(after[key])) / seconds, 1)

    return {
        "id": after["id"],
        "state": after["state"],
        "checkpoint_tso": after["checkpoint_tso"],
        "checkpoint_lag_seconds": after["checkpoint_lag_seconds"],
        "resolved_lag_seconds": after["resolved_lag_seconds"],
        "rows_read_per_second": rate("rows_read"),
        "rows_written_per_second": rate("rows_written"),
        "bytes_written_per_second": rate("bytes_written"),
        "batches_per_second": rate("batches"),
        "rows_read": after["rows_read"],
        "rows_written": after["rows_written"],
        "captures": len(after["captures"]),
        "interval_seconds": round(seconds, 3),
    }


def _statistics_text(r: dict[str, Any], *, header: bool) -> str:
    line = (
        f"{r['id']:<20} {r['state']:<8} {r['checkpoint_lag_seconds']:>10.1f} {r['resolved_lag_seconds']:>10.1f} "
        f"{r['rows_read_per_second']:>10.1f} {r['rows_written_per_second']:>10.1f} "
        f"{r['batches_per_second']:>8.2f} {r['rows_written']:>12}\n"
    )
    if not header:
        return line
    head = (
        f"{'CHANGEFEED':<20} {'STATE':<8} {'CKPT LAG s':>10} {'RSLV LAG s':>10} "
        f"{'READ r/s':>10} {'WRITE r/s':>10} {'BATCH/s':>8} {'ROWS WRITTEN':>12}\n"
    )
    return head + line


def _show(args: argparse.Namespace, result: Any, text: str) -> int:
    if args.json:
        print_json(result)
    else:
        sys.stdout.write(text)
    return EXIT_OK


def _capture_table(result: dict[str, Any]) -> str:
    lines = [f"{'ID':<14} {'OWNER':<6} ADDRESS"]
    for c in result["items"]:
        lines.append(f"{c['id']:<14} {'yes' if c['is_owner'] else '':<6} {c['address']}")
    return "\n".join(lines) + "\n"


def _changefeed_table(items: list[dict[str, Any]]) -> str:
    lines = [f"{'ID':<24} {'STATE':<9} {'CHECKPOINT':<20} CHECKPOINT TIME"]
    for i in items:
        lines.append(f"{i['id']:<24} {i['state']:<9} {i['checkpoint_tso']:<20} {i['checkpoint_time']}")
    return "\n".join(lines) + "\n"


def _span_table(items: list[dict[str, Any]]) -> str:
    lines = [f"{'TABLE':<10} {'STATE':<12} {'PRIMARY':<14} {'SECONDARY':<14} CHECKPOINT"]
    for i in items:
        primary, secondary = i["primary"] or "-", i["secondary"] or "-"
        lines.append(f"{i['table_id']:<10} {i['state']:<12} {primary:<14} {secondary:<14} {i['checkpoint_ts']}")
    return "\n".join(lines) + "\n"


def snapshot_progress_line(p: dict[str, Any]) -> str:
    """One line for the REST ``snapshot_progress`` object: parts and rows, rate and ETA."""
    done, total = int(p["parts_done"]), int(p["parts_total"])
    percent = 100.0 * done / total if total else 100.0
    line = (
        f"{p['phase']}, {done}/{total} {p['unit']}s ({percent:.0f}%), "
        f"{int(p['rows_done']):,}/~{max(int(p['rows_done']), int(p['rows_estimate'])):,} rows, "
        f"{float(p['rows_per_second']):,.0f} rows/s"
    )
    if p.get("captures", 0) > 1:
        line += f", on {p['captures']} captures"
    eta = p.get("eta_seconds")
    if p["phase"] != "done":
        line += f", ETA {eta:.0f}s" if eta is not None else ", ETA unknown"
    return line + f" (started {p['started']} UTC)"


def _changefeed_detail(i: dict[str, Any]) -> str:
    lines = [
        f"state:       {i['state']}",
        f"checkpoint:  {i['checkpoint_tso']} ({i['checkpoint_time']} UTC)",
        f"resolved ts: {i['resolved_ts']}",
        f"epoch:       {i['epoch']}",
    ]
    if i.get("initial_snapshot"):
        lines.append(f"snapshot:    {'done' if i.get('snapshot_done') else 'in progress'} (at {i['start_ts']})")
        progress = i.get("snapshot_progress")
        if progress:
            lines.append(f"progress:    {snapshot_progress_line(progress)}")
    if i.get("error"):
        lines.append(f"error:       {json.dumps(i['error'])}")
    return "\n".join(lines) + "\n"
