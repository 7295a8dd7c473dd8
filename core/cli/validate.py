"""``cdcflow validate FILE``: check a connectors.yaml without starting anything."""

from __future__ import annotations

import argparse
import sys

from cdcflow.core.cli._common import EXIT_CONFIG, EXIT_OK, print_json
from cdcflow.core.config.loader import load_deployment
from cdcflow.core.errors import ConfigInvalidError


def add_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "validate",
        help="validate a connectors.yaml",
        description=(
            "Validate a connectors.yaml: YAML syntax, the server section, every connector, and every "
            "plugin section against the plugin's own config model. Prints each problem as "
            "FILE:LINE:COLUMN: FIELD.PATH: message, and exits 0 when the file is valid, "
            f"{EXIT_CONFIG} when it is not. ${{ENV}} references are expanded from the environment."
        ),
    )
    parser.add_argument("file", help="path of the connectors.yaml to check")
    parser.add_argument("--json", action="store_true", help="print the result as JSON")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    try:
        deployment = load_deployment(args.file, args.plugins)
    except ConfigInvalidError as exc:
        if args.json:
            print_json({"valid": False, "error": exc.to_dict()})
        else:
            for issue in exc.issues or []:
                sys.stderr.write(f"{issue}\n")
            if not exc.issues:
                sys.stderr.write(f"{exc}\n")
            sys.stderr.write(f"{args.file}: invalid ({len(exc.issues) or 1} problem(s))\n")
        return EXIT_CONFIG
    if args.json:
        print_json(
            {
                "valid": True,
                "connectors": [
                    {
                        "name": c.name,
                        "source": c.source.type_name,
                        "sinks": [s.type_name for s in c.sinks],
                        "scheduler": c.scheduler.type_name,
                    }
                    for c in deployment.connectors
                ],
            }
        )
        return EXIT_OK
    names = ", ".join(c.name for c in deployment.connectors) or "no connectors"
    print(f"{args.file}: valid ({len(deployment.connectors)} connector(s): {names})")
    return EXIT_OK
