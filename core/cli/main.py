"""Entry point of the ``cdcflow`` command.

The plugin manager is loaded first: every sub-command is added by a plugin
through the ``cdcflow_add_commands`` hook (cdcflow's own by
:mod:`cdcflow.core.cli.commands`), and the commands run with that manager
(``args.plugins``).
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

from cdcflow.core.cli._common import EXIT_ERROR
from cdcflow.core.cli.logs import LOG_FORMATS, configure_logging
from cdcflow.core.errors import CdcflowError
from cdcflow.core.plugin.manager import PluginManager

__all__ = ["LOG_FORMATS", "LOG_LEVELS", "build_parser", "main"]

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
    parser.add_argument(
        "--log-format",
        default="text",
        choices=LOG_FORMATS,
        help="text (default) or json: one JSON object per line (ts, level, logger, message, changefeed, error_code)",
    )
    parser.set_defaults(plugins=plugins)
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    plugins.add_commands(subparsers)
    return parser


def _log_options(argv: Sequence[str] | None) -> tuple[str, str]:
    """``--log-level`` and ``--log-format``, read before the plugins load (the full parser
    needs them and reports a wrong value); ``--log-format`` may also follow ``run``."""
    early = argparse.ArgumentParser(add_help=False)
    early.add_argument("--log-level", default="warning")
    early.add_argument("--log-format", default="text")
    known, _ = early.parse_known_args(argv)
    level = str(known.log_level) if known.log_level in LOG_LEVELS else "warning"
    return level, str(known.log_format) if known.log_format in LOG_FORMATS else "text"


def main(argv: Sequence[str] | None = None) -> int:
    level, log_format = _log_options(argv)
    # gRPC's C core writes INFO lines straight to stderr (e.g. "skipping fork() handlers" each
    # time Spark launches a process); it reads this before its first import, when plugins load.
    os.environ.setdefault("GRPC_VERBOSITY", "DEBUG" if level == "debug" else "ERROR")
    configure_logging(level, log_format)
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
