"""``cdcflow playground``: an in-process upstream (PD + TiKV + TiDB status API)."""

from __future__ import annotations

import argparse

from cdcflow.core.cli._common import unavailable


def add_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "playground",
        help="run the playground upstream",
        description=(
            "Run an in-process upstream that speaks PD's and TiKV's gRPC protocols and TiDB's status API "
            "on 127.0.0.1, with a transactional workload and on-demand fault injection."
        ),
    )
    parser.add_argument("--stores", type=int, default=3, help="number of TiKV stores (default 3)")
    parser.add_argument("--rate", type=float, default=100.0, help="workload transactions per second")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    return unavailable(
        "playground",
        "serve PD, TiKV EventFeed and TiDB status endpoints on 127.0.0.1 with a running workload.",
    )
