"""``cdcflow server``: run one capture (a node of a cdcflow cluster)."""

from __future__ import annotations

import argparse

from cdcflow.core.cli._common import unavailable


def add_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "server",
        help="run a capture (cluster node)",
        description=(
            "Run one capture: register with the metastore under a session, campaign for owner, host a "
            "maintainer manager and serve the REST API."
        ),
    )
    parser.add_argument("--config", metavar="FILE", help="connectors.yaml whose server section to use")
    parser.add_argument("--metastore", help="metastore URL (sqlite:///path or etcd://host:port[,...])")
    parser.add_argument("--addr", help="host:port of the REST API and inter-capture messages")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    return unavailable(
        "server",
        "register a capture in the metastore, campaign for owner and run the changefeeds placed on it.",
    )
