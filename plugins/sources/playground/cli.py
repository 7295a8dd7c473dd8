"""``cdcflow playground``: an in-process upstream (PD + TiKV + TiDB status API, or CockroachDB).

Starts the playground of ``cdcflow.plugins.sources.playground`` on 127.0.0.1
(with ``--cockroach``: the CockroachDB playground of
``cdcflow.plugins.sources.cockroach_playground``, a PostgreSQL-wire server with
sinkless changefeeds), prints its addresses, runs the shop workload at
``--rate`` and stops cleanly on Ctrl-C, SIGTERM or after ``--duration`` seconds.
The playground plugin adds the command (``cdcflow_add_commands``).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import signal
import sys
import threading

from cdcflow.core.cli._common import EXIT_ERROR, EXIT_OK, EXIT_USAGE
from cdcflow.plugins.sources.playground.playground import Playground

__all__ = ["add_parser", "run"]


def _port(text: str) -> int:
    value = int(text)
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"port must be 0..65535 (0 = any free port), got {value}")
    return value


def _non_negative(text: str) -> float:
    value = float(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be 0 or more, got {text}")
    return value


def add_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "playground",
        help="run the playground upstream",
        description=(
            "Run an in-process upstream that speaks PD's and TiKV's gRPC protocols and TiDB's status API "
            "on 127.0.0.1, with a transactional workload on the shop tables. Prints the addresses; "
            "Ctrl-C stops it. With --cockroach: a CockroachDB stand-in speaking the PostgreSQL wire protocol "
            "(sinkless changefeeds) instead; prints its DSN."
        ),
    )
    parser.add_argument("--stores", type=int, default=3, help="number of TiKV stores (default 3)")
    parser.add_argument(
        "--rate", type=_non_negative, default=100.0, help="workload transactions per second (default 100; 0: none)"
    )
    parser.add_argument(
        "--pd-port", type=_port, default=2379, help="PD gRPC port (default 2379, PD's own; 0: any free port)"
    )
    parser.add_argument(
        "--status-port", type=_port, default=10080, help="TiDB status API port (default 10080; 0: any free port)"
    )
    parser.add_argument(
        "--duration", type=_non_negative, default=0.0, help="stop after this many seconds (default 0: until Ctrl-C)"
    )
    parser.add_argument("--seed", type=int, default=0, help="seed of the workload (same seed, same transactions)")
    parser.add_argument("--json", action="store_true", help="print the addresses as one JSON line")
    parser.add_argument(
        "--cockroach",
        action="store_true",
        help="run the CockroachDB playground (PostgreSQL wire protocol, sinkless changefeeds) instead",
    )
    parser.add_argument(
        "--sql-port", type=_port, default=26257, help="with --cockroach: SQL port (default 26257; 0: any free port)"
    )
    parser.add_argument(
        "--password", default=None, help="with --cockroach: require this password for user root (SCRAM-SHA-256)"
    )
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    if args.cockroach:
        return _run_cockroach(args)
    if args.stores < 1:
        sys.stderr.write(f"cdcflow playground: --stores must be at least 1, got {args.stores}\n")
        return EXIT_USAGE
    playground = Playground(
        stores=args.stores, pd_port=args.pd_port, status_port=args.status_port, rate=args.rate, seed=args.seed
    )
    stop = threading.Event()
    previous = signal.signal(signal.SIGTERM, lambda *_: stop.set())
    try:
        with playground:
            _print_addresses(playground, as_json=args.json)
            with contextlib.suppress(KeyboardInterrupt):  # Ctrl-C is the normal way to stop
                stop.wait(args.duration or None)
            stats = playground.stop_workload()
    finally:
        signal.signal(signal.SIGTERM, previous)
    sys.stdout.write(f"playground stopped: {stats.transactions} transactions, {stats.rows} rows, {stats.ddls} DDLs\n")
    return EXIT_OK


def _wait(duration: float) -> None:
    stop = threading.Event()
    previous = signal.signal(signal.SIGTERM, lambda *_: stop.set())
    try:
        with contextlib.suppress(KeyboardInterrupt):  # Ctrl-C is the normal way to stop
            stop.wait(duration or None)
    finally:
        signal.signal(signal.SIGTERM, previous)


def _run_cockroach(args: argparse.Namespace) -> int:
    from cdcflow.plugins.sources.cockroach_playground import CockroachPlayground

    playground = CockroachPlayground(rate=args.rate, seed=args.seed, port=args.sql_port, password=args.password)
    try:
        playground.start()
    except OSError as exc:
        playground.stop()
        sys.stderr.write(f"cdcflow playground: cannot listen on 127.0.0.1:{args.sql_port}: {exc}\n")
        return EXIT_ERROR
    try:
        if args.json:
            sys.stdout.write(json.dumps({"dsn": playground.dsn, "port": playground.port}) + "\n")
        else:
            lines = [
                "cdcflow CockroachDB playground is up (database shop: customers, products, orders)",
                f"  DSN  {playground.dsn}",
                "Use it from a connector with:",
                f'  source: {{type: cockroachdb, dsn: "{playground.dsn}"}}',
                "Ctrl-C stops it.",
            ]
            sys.stdout.write("\n".join(lines) + "\n")
        sys.stdout.flush()
        _wait(args.duration)
    finally:
        stats = playground.stop()
    sys.stdout.write(f"playground stopped: {stats.transactions} transactions, {stats.rows} rows, {stats.ddls} DDLs\n")
    return EXIT_OK


def _print_addresses(playground: Playground, *, as_json: bool) -> None:
    addresses = playground.addresses()
    if as_json:
        sys.stdout.write(json.dumps({**addresses, "cluster_id": playground.cluster_id}) + "\n")
    else:
        lines = [
            f"cdcflow playground is up (cluster id {playground.cluster_id})",
            f"  PD               {addresses['pd']}",
            f"  TiDB status API  http://{addresses['tidb_status']}",
            *(f"  TiKV store {sid}     {addr}" for sid, addr in addresses["stores"].items()),
            "Use it from connectors.yaml with:",
            f"  export CDCFLOW_PD={addresses['pd']} CDCFLOW_TIDB_STATUS={addresses['tidb_status']}",
            "Ctrl-C stops it.",
        ]
        sys.stdout.write("\n".join(lines) + "\n")
    sys.stdout.flush()
