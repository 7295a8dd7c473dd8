"""``cdcflow server``: run one capture (a node of a cdcflow cluster)."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import signal
import sys

from cdcflow.core.cli._common import EXIT_CONFIG, EXIT_OK
from cdcflow.core.data.span_executor import DEFAULT_EXECUTOR
from cdcflow.core.errors import ConfigInvalidError

__all__ = ["add_parser", "run", "serve"]


def add_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "server",
        help="run a capture (cluster node)",
        description=(
            "Run one capture: register with the metastore under a session, campaign for owner, host a "
            "maintainer manager and serve the REST API. SIGTERM or Ctrl-C drains it gracefully."
        ),
    )
    parser.add_argument("--config", metavar="FILE", help="connectors.yaml whose server section to use")
    parser.add_argument("--metastore", help="metastore URL (sqlite:///path or etcd://host:port[,...])")
    parser.add_argument("--addr", type=host_port, help="host:port of the REST API (port 0: any free port)")
    parser.add_argument("--message-addr", type=host_port, help="host:port of the inter-capture gRPC server")
    parser.add_argument("--data-dir", help="directory for local state")
    parser.add_argument("--session-ttl", type=float, help="seconds a capture survives without keepalive")
    parser.add_argument("--gc-tick", type=float, help="seconds between GC safepoint updates")
    parser.add_argument(
        "--executor",
        metavar="NAME",
        default=DEFAULT_EXECUTOR,
        help=f"span executor registered by a plugin: {DEFAULT_EXECUTOR} (default, the data pipeline), "
        "in-process (the test kit's, no Spark), …",
    )
    parser.add_argument(
        "--tls-ca", help="CA certificate (PEM) for inter-capture TLS (default: server.security.ca of --config)"
    )
    parser.add_argument("--tls-cert", help="this capture's certificate (PEM) for inter-capture TLS")
    parser.add_argument("--tls-key", help="this capture's private key (PEM) for inter-capture TLS")
    parser.set_defaults(func=run)


def host_port(value: str) -> str:
    """``host:port`` with a port 0-65535 (argparse type: anything else is a usage error)."""
    host, sep, port = value.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise argparse.ArgumentTypeError(f"{value!r} is not host:port with a port 0-65535 (e.g. 127.0.0.1:8300)")
    return value


async def serve(args: argparse.Namespace, *, on_ready: object = None) -> None:
    """Start the capture and its API; return after a graceful drain. ``args.plugins``
    is the plugin manager; ``args.executor`` names the span executor."""
    from cdcflow.core.api.security import ApiSecurity
    from cdcflow.core.api.server import ApiServer
    from cdcflow.core.config import ServerSettings, load_deployment
    from cdcflow.core.control.capture import Capture, CaptureOptions
    from cdcflow.core.control.messaging.grpc import TLSConfig
    from cdcflow.core.control.metastore import open_metastore

    plugins = args.plugins
    factory = plugins.executors.factory(args.executor)
    settings = load_deployment(args.config, plugins).server if args.config else ServerSettings()
    metastore = args.metastore or settings.metastore
    tls = TLSConfig(args.tls_ca, args.tls_cert, args.tls_key) if args.tls_ca else None
    # Flags not given are None and leave the file's (or the default) value.
    options = CaptureOptions.from_server(
        settings,
        api_addr=args.addr or None,
        message_addr=args.message_addr,
        data_dir=args.data_dir or None,
        session_ttl=args.session_ttl,
        gc_tick=args.gc_tick,
        tls=tls,
    )
    host, _, port = options.api_addr.rpartition(":")
    security = ApiSecurity.for_api(settings.security, options.api_addr)  # refused before anything starts
    store = open_metastore(metastore)
    plugins.executors.start(args.executor, options.server or settings, plugins)  # Spark starts beside the capture
    capture = Capture(store, plugins, factory, options)
    api = ApiServer(capture, host, int(port), security)
    real_port = await api.start()
    capture.options = dataclasses.replace(options, api_addr=f"{host}:{real_port}")
    sys.stderr.write(f"cdcflow server: API on {security.scheme}://{host}:{real_port}, metastore {metastore}\n")
    sys.stderr.flush()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        with contextlib.suppress(NotImplementedError):
            loop.add_signal_handler(sig, lambda: asyncio.ensure_future(capture.drain()))
    try:
        await capture.serve()
    finally:
        await api.stop()
        await store.close()
        await asyncio.to_thread(plugins.executors.stop, args.executor)  # Spark ends before the process


def run(args: argparse.Namespace) -> int:
    from cdcflow.core.api.security import SecurityConfigError
    from cdcflow.core.config import load_deployment

    try:
        if args.config:
            load_deployment(args.config, args.plugins)
    except ConfigInvalidError as exc:  # the file's problems, as `cdcflow validate` reports them
        sys.stderr.write(f"cdcflow: {exc}\n")
        return EXIT_CONFIG
    try:
        asyncio.run(serve(args))
    except SecurityConfigError as exc:
        sys.stderr.write(f"cdcflow: {exc}\n")
        return EXIT_CONFIG
    return EXIT_OK
