"""The playground as a plugin: the ``cdcflow playground`` command.

The playground's own modules are imported when a hook is first called, so
loading the plugin stays cheap.
"""

from __future__ import annotations

import argparse

from cdcflow.core.plugin import hookimpl

__all__ = ["cdcflow_add_commands"]


@hookimpl
def cdcflow_add_commands(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    from cdcflow.plugins.sources.playground import cli

    cli.add_parser(subparsers)
