"""``cdcflow run FILE``: run a connectors.yaml on one embedded capture."""

from __future__ import annotations

import argparse

from cdcflow.core.cli._common import unavailable


def add_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "run",
        help="run a connectors.yaml on one embedded capture",
        description=(
            "Validate FILE, start a single embedded capture on the file's metastore, create the file's "
            "connectors and replicate until --duration elapses or Ctrl-C, with a live progress line and "
            "a summary on exit."
        ),
    )
    parser.add_argument("file", help="connectors.yaml to run")
    parser.add_argument("--duration", metavar="SECONDS", type=float, help="stop after this many seconds")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    return unavailable(
        "run",
        "start one embedded capture, create the file's connectors and replicate with a progress line.",
    )
