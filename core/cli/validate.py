"""``cdcflow validate FILE``: check a connectors.yaml without starting anything."""

from __future__ import annotations

import argparse
import asyncio
import sys
from pathlib import Path

from cdcflow.core.cli._common import EXIT_CONFIG, EXIT_OK, print_json
from cdcflow.core.config.loader import Deployment, load_deployment
from cdcflow.core.config.sourcecheck import DEFAULT_SOURCE_TIMEOUT, check_transforms, source_issues
from cdcflow.core.config.yamlsrc import load_located
from cdcflow.core.errors import ConfigInvalidError, ConfigIssue


def add_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "validate",
        help="validate a connectors.yaml",
        description=(
            "Validate a connectors.yaml: YAML syntax, the server section, every connector, and every "
            "plugin section against the plugin's own config model. Prints each problem as "
            "FILE:LINE:COLUMN: FIELD.PATH: message, and exits 0 when the file is valid, "
            f"{EXIT_CONFIG} when it is not. ${{ENV}} references are expanded from the environment. "
            "A connector with transforms has them checked against its source's tables (unknown columns, "
            "routes merging tables of different columns) when the source answers; when it does not, a "
            "note says the columns were not checked."
        ),
    )
    parser.add_argument("file", help="path of the connectors.yaml to check")
    parser.add_argument("--json", action="store_true", help="print the result as JSON")
    parser.add_argument(
        "--source-timeout",
        type=float,
        default=DEFAULT_SOURCE_TIMEOUT,
        metavar="SECONDS",
        help=f"time each source gets to list its tables for the transform check (default {DEFAULT_SOURCE_TIMEOUT:g})",
    )
    parser.add_argument("--offline", action="store_true", help="do not contact sources (transform columns unchecked)")
    parser.set_defaults(func=run)


def _check_sources(deployment: Deployment, args: argparse.Namespace) -> tuple[list[ConfigIssue], list[str]]:
    """Problems and notes of every connector's transforms against its source."""
    with_transforms = [(i, c) for i, c in enumerate(deployment.connectors) if c.transforms]
    if not with_transforms:
        return [], []
    if args.offline:
        names = ", ".join(c.name for _, c in with_transforms)
        return [], [f"transform columns and routes were not checked against the sources (--offline): {names}"]
    doc = load_located(Path(args.file).read_text(encoding="utf-8"), args.file)
    issues: list[ConfigIssue] = []
    notes: list[str] = []
    for index, connector in with_transforms:
        check = asyncio.run(check_transforms(connector, args.source_timeout))
        issues += source_issues(connector, check, doc, index)
        if check.note:
            notes.append(check.note)
    issues.sort(key=lambda i: (i.line or 0, i.column or 0))
    return issues, notes


def run(args: argparse.Namespace) -> int:
    notes: list[str] = []
    try:
        deployment = load_deployment(args.file, args.plugins)
        issues, notes = _check_sources(deployment, args)
        if issues:
            count = len(issues)
            raise ConfigInvalidError(f"{args.file}: {count} problem{'s' if count != 1 else ''} found", issues)
    except ConfigInvalidError as exc:
        if args.json:
            print_json({"valid": False, "notes": notes, "error": exc.to_dict()})
        else:
            for note in notes:
                sys.stderr.write(f"note: {note}\n")
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
                "notes": notes,
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
    for note in notes:
        print(f"note: {note}")
    names = ", ".join(c.name for c in deployment.connectors) or "no connectors"
    print(f"{args.file}: valid ({len(deployment.connectors)} connector(s): {names})")
    return EXIT_OK
