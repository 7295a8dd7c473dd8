"""Entry point of the ``cdcflow`` command.

The plugin manager is loaded first: every sub-command is added by a plugin
through the ``cdcflow_add_commands`` hook (cdcflow's own by
:mod:`cdcflow.core.cli.commands`), and the commands run with that manager
(``args.plugins``).
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Sequence

from cdcflow.core.cli._common import EXIT_ERROR
from cdcflow.core.errors import CdcflowError
from cdcflow.core.plugin.manager import PluginManager

__all__ = ["LOG_LEVELS", "build_parser", "main"]

LOG_LEVELS = ("debug", "info", "warning", "error")


def build_parser(plugins: PluginManager | None = None) -> argparse.ArgumentParser:
    """The ``cdcflow`` parser with the sub-commands of every plugin of ``plugins``
    (default: the built-ins and installed plugins, ``PluginManager.default()``)."""
    plugins = plugins or PluginManager.default()
    parser = argparse.ArgumentParser(
        prog="cdcflow",
        description=(
            "cdcflow streams row changes out of TiKV and CockroachDB-style upstreams into Spark tables, "
            "MySQL and Kafka. Connectors are declared in connectors.yaml; plugins add sources, sinks, "
            "schedulers, message formats, executors and commands."
        ),
    )
    parser.add_argument("--log-level", default="warning", choices=LOG_LEVELS)
    parser.set_defaults(plugins=plugins)
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    plugins.add_commands(subparsers)
    return parser


def _log_level(argv: Sequence[str] | None) -> str:
    """``--log-level``, read before the plugins load (the full parser needs them
    and reports a wrong value)."""
    early = argparse.ArgumentParser(add_help=False)
    early.add_argument("--log-level", default="warning")
    known, _ = early.parse_known_args(argv)
    return str(known.log_level) if known.log_level in LOG_LEVELS else "warning"


def main(argv: Sequence[str] | None = None) -> int:
    level = _log_level(argv)
    # gRPC's C core writes INFO lines straight to stderr (e.g. "skipping fork() handlers" each
    # time Spark launches a process); it reads this before its first import, when plugins load.
    os.environ.setdefault("GRPC_VERBOSITY", "DEBUG" if level == "debug" else "ERROR")
    logging.basicConfig(level=level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        parser = build_parser()
    except CdcflowError as exc:  # a plugin that cannot load: no command can run
        sys.stderr.write(f"cdcflow: {exc}\n")
        return EXIT_ERROR
    args = parser.parse_args(argv)
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
