"""``cdcflow cli``: manage a running cluster through its REST API."""

from __future__ import annotations

import argparse

from cdcflow.core.cli._common import unavailable

_CHANGEFEED_VERBS = {
    "create": "create a changefeed (--sink-uri, --changefeed-id, --start-ts, --target-ts, --config)",
    "pause": "pause a changefeed (-c ID)",
    "resume": "resume a paused or warning changefeed (-c ID)",
    "remove": "remove a changefeed (-c ID)",
    "update": "update a paused changefeed's sink URI, config or target ts (-c ID)",
    "list": "list changefeeds (--all to include finished and removed)",
    "query": "show one changefeed's state, checkpoint and error (-c ID)",
}


def add_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "cli",
        help="manage changefeeds and captures of a running cluster",
        description="Talk to a running cdcflow cluster through its REST API (--server).",
    )
    parser.add_argument("--server", default="http://127.0.0.1:8300", help="address of any capture's API")
    parser.add_argument("--json", action="store_true", help="print JSON for scripts")
    groups = parser.add_subparsers(dest="group", metavar="{changefeed,capture}", required=True)

    changefeed = groups.add_parser("changefeed", help="manage changefeeds", description="Manage changefeeds.")
    verbs = changefeed.add_subparsers(dest="verb", metavar="VERB", required=True)
    for verb, text in _CHANGEFEED_VERBS.items():
        sub = verbs.add_parser(verb, help=text, description=text[0].upper() + text[1:] + ".")
        sub.add_argument("-c", "--changefeed-id", help="changefeed id")
        sub.set_defaults(func=run)

    capture = groups.add_parser("capture", help="inspect captures", description="Inspect captures.")
    capture_verbs = capture.add_subparsers(dest="verb", metavar="VERB", required=True)
    capture_verbs.add_parser("list", help="list captures and the owner", description="List captures.").set_defaults(
        func=run
    )


def run(args: argparse.Namespace) -> int:
    return unavailable(f"cli {args.group} {args.verb}", f"send the request to the cluster at {args.server}.")
