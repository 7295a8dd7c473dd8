"""The playground as a plugin: the ``cdcflow playground`` command, and the
in-process upstream of a ``tikv`` source with ``playground`` set.

The tikv source does not import the playground: it declares the hook
``cdcflow_tikv_embedded_upstream``, which this plugin implements with the
process's shared playground (:mod:`.embedded`). The playground's own modules
are imported when a hook is first called, so loading the plugin stays cheap.
"""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from cdcflow.core.plugin import hookimpl

if TYPE_CHECKING:
    from cdcflow.plugins.sources.playground.playground import Playground
    from cdcflow.plugins.sources.tikv.config import EmbeddedPlaygroundConfig

__all__ = ["cdcflow_add_commands", "cdcflow_tikv_embedded_upstream"]


@hookimpl
def cdcflow_tikv_embedded_upstream(options: EmbeddedPlaygroundConfig) -> Playground:
    from cdcflow.plugins.sources.playground.embedded import embedded_playground

    return embedded_playground(stores=options.stores, rate=options.rate, seed=options.seed)


@hookimpl
def cdcflow_add_commands(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    from cdcflow.plugins.sources.playground import cli

    cli.add_parser(subparsers)
