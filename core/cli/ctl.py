"""``cdcflow cli``: manage a running cluster through its REST API (``--server``)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from cdcflow.core.cli._common import EXIT_OK, print_json
from cdcflow.core.config.settings import DEFAULT_API_ADDR

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
}


def add_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "cli",
        help="manage changefeeds and captures of a running cluster",
        description="Talk to a running cdcflow cluster through its REST API (--server).",
    )
    parser.add_argument("--server", default=f"http://{DEFAULT_API_ADDR}", help="address of any capture's API")
    parser.add_argument("--json", action="store_true", help="print JSON for scripts")
    groups = parser.add_subparsers(dest="group", metavar="{changefeed,capture}", required=True)

    changefeed = groups.add_parser("changefeed", help="manage changefeeds", description="Manage changefeeds.")
    verbs = changefeed.add_subparsers(dest="verb", metavar="VERB", required=True)
    for verb, text in _CHANGEFEED_VERBS.items():
        sub = verbs.add_parser(verb, help=text, description=text[0].upper() + text[1:] + ".")
        sub.add_argument("-c", "--changefeed-id", required=verb not in ("create", "list"), help="changefeed id")
        if verb in ("create", "update"):
            sub.add_argument("--sink-uri", help="sink URI (its scheme picks the sink plugin)")
            sub.add_argument(
                "--config", metavar="FILE", help="JSON or YAML with source, sinks, filter, scheduler (API fields)"
            )
            sub.add_argument("--target-ts", type=int, help="stop (finished) at this TSO")
        if verb == "create":
            sub.add_argument("--start-ts", type=int, help="replicate changes after this TSO (default: now)")
        if verb == "resume":
            sub.add_argument("--overwrite-checkpoint-ts", type=int, help="resume from this TSO instead")
        if verb == "list":
            sub.add_argument("-a", "--all", action="store_true", help="include finished and failed changefeeds")
        if verb == "move-table":
            sub.add_argument("--table-id", type=int, required=True, help="id of the table to move")
            sub.add_argument("--target-capture", required=True, help="id of the capture to move it to")
        sub.set_defaults(func=run)

    capture = groups.add_parser("capture", help="inspect captures", description="Inspect captures.")
    capture_verbs = capture.add_subparsers(dest="verb", metavar="VERB", required=True)
    capture_verbs.add_parser("list", help="list captures and the owner", description="List captures.").set_defaults(
        func=run
    )


def _body(args: argparse.Namespace) -> dict[str, Any]:
    body: dict[str, Any] = {}
    if getattr(args, "config", None):
        import yaml

        loaded = yaml.safe_load(Path(args.config).read_text(encoding="utf-8")) or {}
        body.update(loaded)
    if args.changefeed_id:
        body["changefeed_id"] = args.changefeed_id
    if getattr(args, "sink_uri", None):
        body["sinks"] = [{"uri": args.sink_uri}]
    if getattr(args, "start_ts", None) is not None:
        body["start_ts"] = args.start_ts
    if getattr(args, "target_ts", None) is not None:
        body["target_ts"] = args.target_ts
    return body


def run(args: argparse.Namespace) -> int:
    from cdcflow.core.api.client import ApiClient

    client = ApiClient(args.server)
    cf = getattr(args, "changefeed_id", None)
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
    if verb == "query":
        result = client.call("GET", f"/api/v2/changefeeds/{cf}")
        return _show(args, result, _changefeed_detail(result))
    if verb == "create":
        result = client.call("POST", "/api/v2/changefeeds", _body(args))
        return _show(
            args, result, f"Create changefeed successfully!\nID: {result['id']}\n" + _changefeed_detail(result)
        )
    if verb == "move-table":
        body = {"table_id": args.table_id, "target_capture_id": args.target_capture}
        result = client.call("POST", f"/api/v2/changefeeds/{cf}/move_table", body)
        n = len(result["spans"])
        return _show(args, result, f"Moving {n} span(s) of table {args.table_id} to {args.target_capture}\n")
    if verb == "list-tables":
        result = client.call("GET", f"/api/v2/changefeeds/{cf}/tables")
        return _show(args, result, _span_table(result["items"]))
    if verb == "update":
        result = client.call("PUT", f"/api/v2/changefeeds/{cf}", _body(args))
        return _show(args, result, f"Update changefeed config successfully!\nID: {cf}\n")
    if verb == "pause":
        client.call("POST", f"/api/v2/changefeeds/{cf}/pause")
    elif verb == "resume":
        body = {}
        if args.overwrite_checkpoint_ts is not None:
            body["overwrite_checkpoint_ts"] = args.overwrite_checkpoint_ts
        client.call("POST", f"/api/v2/changefeeds/{cf}/resume", body)
    elif verb == "remove":
        client.call("DELETE", f"/api/v2/changefeeds/{cf}")
    return _show(args, {"id": cf, "verb": verb, "ok": True}, f"{verb.capitalize()} changefeed {cf}: done\n")


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


def _changefeed_detail(i: dict[str, Any]) -> str:
    lines = [
        f"state:       {i['state']}",
        f"checkpoint:  {i['checkpoint_tso']} ({i['checkpoint_time']} UTC)",
        f"resolved ts: {i['resolved_ts']}",
        f"epoch:       {i['epoch']}",
    ]
    if i.get("error"):
        lines.append(f"error:       {json.dumps(i['error'])}")
    return "\n".join(lines) + "\n"
