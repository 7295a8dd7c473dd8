"""Entry point of the ``cdcflow`` command: builds the parser from one module per sub-command."""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Sequence
from types import ModuleType

from cdcflow.core.cli import ctl, playground, plugins, run, server, validate, version
from cdcflow.core.cli._common import EXIT_ERROR
from cdcflow.core.errors import CdcflowError

__all__ = ["COMMANDS", "build_parser", "main"]

#: Sub-command modules, in the order ``cdcflow --help`` lists them.
COMMANDS: tuple[ModuleType, ...] = (run, server, ctl, playground, validate, plugins, version)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="cdcflow",
        description=(
            "cdcflow streams row changes out of TiKV and CockroachDB-style upstreams into Spark tables, "
            "MySQL and Kafka. Connectors are declared in connectors.yaml; plugins add sources, sinks, "
            "schedulers and message formats."
        ),
    )
    parser.add_argument("--log-level", default="warning", choices=["debug", "info", "warning", "error"])
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for module in COMMANDS:
        module.add_parser(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    # gRPC's C core writes INFO lines straight to stderr (e.g. "skipping fork() handlers" each
    # time Spark launches a process); it reads this before its first import, which is later.
    os.environ.setdefault("GRPC_VERBOSITY", "DEBUG" if args.log_level == "debug" else "ERROR")
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        code: int = args.func(args)
    except CdcflowError as exc:
        sys.stderr.write(f"cdcflow: {exc}\n")
        return EXIT_ERROR
    except KeyboardInterrupt:
        return 130
    return code


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
