"""``cdcflow plugins``: list every registered plugin by kind, type name and origin."""

from __future__ import annotations

import argparse
from typing import Any

from cdcflow.core.cli._common import EXIT_OK, print_json
from cdcflow.core.plugin.manager import PluginManager

KINDS = ["sources", "sinks", "schedulers", "codecs", "executors"]


def add_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "plugins",
        help="list registered plugins",
        description=(
            "List every registered plugin (sources, sinks, schedulers, codecs, and the span executors "
            "--executor names) with its type name, summary and origin: builtin, or the entry point and "
            "distribution it came from. Set CDCFLOW_DISABLE_PLUGIN_AUTOLOAD=1 to list the built-ins only."
        ),
    )
    parser.add_argument("--kind", choices=KINDS, help="only this kind")
    parser.add_argument("--json", action="store_true", help="print JSON, including each config schema")
    parser.set_defaults(func=run)


def _entries(pm: PluginManager, kind: str) -> list[dict[str, Any]]:
    """``type``, ``summary``, ``origin``, ``origin_kind`` (and the config schema) of each plugin of ``kind``."""
    if kind == "executors":
        return [
            {"type": e.name, "summary": e.summary, "origin": str(e.origin), "origin_kind": e.origin.kind}
            for e in pm.executors
        ]
    return [
        {**entry.cls.describe(), "origin": str(entry.origin), "origin_kind": entry.origin.kind}
        for entry in pm.registries()[kind]
    ]


def run(args: argparse.Namespace) -> int:
    pm: PluginManager = args.plugins
    kinds = [args.kind] if args.kind else KINDS
    if args.json:
        print_json({kind: _entries(pm, kind) for kind in kinds})
        return EXIT_OK
    for kind in kinds:
        entries = _entries(pm, kind)
        print(f"{kind}:")
        if not entries:
            print("  (none)")
        width = max((len(e["type"]) for e in entries), default=0)
        for entry in entries:
            print(f"  {entry['type']:<{width}}  {entry['summary']}")
            print(f"  {'':<{width}}  from {entry['origin']}")
    return EXIT_OK
