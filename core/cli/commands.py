"""The built-in sub-commands of ``cdcflow``, registered as a plugin.

Every sub-command, built-in or not, is added through the
``cdcflow_add_commands`` hook; this module adds cdcflow's own, first
(``tryfirst``), in the order ``cdcflow --help`` lists them. A plugin adds its
commands after them (the playground plugin adds ``cdcflow playground``).
"""

from __future__ import annotations

import argparse
from types import ModuleType

from cdcflow.core.cli import ctl, plugins, run, server, validate, version
from cdcflow.core.plugin.hookspec import hookimpl

__all__ = ["COMMANDS", "cdcflow_add_commands"]

#: Sub-command modules, each with ``add_parser(subparsers)``, in the order ``cdcflow --help`` lists them.
COMMANDS: tuple[ModuleType, ...] = (run, server, ctl, validate, plugins, version)


@hookimpl(tryfirst=True)
def cdcflow_add_commands(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    for module in COMMANDS:
        module.add_parser(subparsers)
