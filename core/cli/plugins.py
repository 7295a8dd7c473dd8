"""``cdcflow plugins``: list every registered plugin by kind, type name and origin."""

from __future__ import annotations

import argparse

from cdcflow.core.cli._common import EXIT_OK, print_json
from cdcflow.core.plugin.manager import PluginManager


def add_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "plugins",
        help="list registered plugins",
        description=(
            "List every registered plugin (sources, sinks, schedulers, codecs) with its type name, "
            "summary and origin: builtin, or the entry point and distribution it came from. "
            "Set CDCFLOW_DISABLE_PLUGIN_AUTOLOAD=1 to list the built-ins only."
        ),
    )
    parser.add_argument("--kind", choices=["sources", "sinks", "schedulers", "codecs"], help="only this kind")
    parser.add_argument("--json", action="store_true", help="print JSON, including each config schema")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    pm = PluginManager.default()
    registries = pm.registries()
    kinds = [args.kind] if args.kind else list(registries)
    if args.json:
        print_json(
            {
                kind: [
                    {**entry.cls.describe(), "origin": str(entry.origin), "origin_kind": entry.origin.kind}
                    for entry in registries[kind]
                ]
                for kind in kinds
            }
        )
        return EXIT_OK
    for kind in kinds:
        entries = list(registries[kind])
        print(f"{kind}:")
        if not entries:
            print("  (none)")
        width = max((len(e.type_name) for e in entries), default=0)
        for entry in entries:
            print(f"  {entry.type_name:<{width}}  {entry.cls.one_line_summary()}")
            print(f"  {'':<{width}}  from {entry.origin}")
    return EXIT_OK
