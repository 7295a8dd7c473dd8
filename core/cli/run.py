"""``cdcflow run FILE``: run a connectors.yaml on one embedded capture."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import logging
import signal
import sys
import time
from collections.abc import Callable, Collection, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from cdcflow.core.cli._common import EXIT_CONFIG, EXIT_OK
from cdcflow.core.cli.logs import LOG_FORMATS
from cdcflow.core.data.span_executor import DEFAULT_EXECUTOR
from cdcflow.core.errors import ConfigInvalidError

if TYPE_CHECKING:
    from cdcflow.core.api.server import ApiServer
    from cdcflow.core.config.loader import Connector
    from cdcflow.core.control.capture import Capture
    from cdcflow.core.control.changefeed import ChangeFeedInfo
    from cdcflow.core.control.coordinator.coordinator import Coordinator
    from cdcflow.core.control.metastore.base import MetaStore
    from cdcflow.core.plugin.manager import PluginManager

log = logging.getLogger(__name__)


def add_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "run",
        help="run a connectors.yaml on one embedded capture",
        description=(
            "Validate FILE, start a single embedded capture on the file's metastore, create the file's "
            "connectors (those not yet created) and replicate until --duration elapses or Ctrl-C, with a "
            "live view on a terminal (a table per changefeed, a progress bar while one catches up), plain "
            "progress lines otherwise, and a summary on exit."
        ),
    )
    parser.add_argument("file", help="connectors.yaml to run")
    parser.add_argument("--duration", metavar="SECONDS", type=float, help="stop after this many seconds")
    parser.add_argument(
        "--executor",
        metavar="NAME",
        default=DEFAULT_EXECUTOR,
        help=f"span executor registered by a plugin: {DEFAULT_EXECUTOR} (default, the data pipeline), "
        "in-process (the test kit's, no Spark), …",
    )
    parser.add_argument(
        "--plain",
        action="store_true",
        help="print a progress line every 10 s on stderr instead of the live view (the default when stdout is "
        "not a terminal)",
    )
    parser.add_argument(
        "--log-format",
        choices=LOG_FORMATS,
        default=argparse.SUPPRESS,
        help="as cdcflow --log-format: json logs one JSON object per line",
    )
    parser.set_defaults(func=run)


async def run_file(
    path: str,
    duration: float | None,
    *,
    plugins: PluginManager,
    executor: str = DEFAULT_EXECUTOR,
    live: bool = False,
) -> dict[str, Any]:
    """Run the file's connectors on one embedded capture with the executor named
    ``executor``; return the final changefeed states. ``live``: draw the rich view
    on stdout instead of printing plain progress lines on stderr."""
    from cdcflow.core.api.security import ApiSecurity
    from cdcflow.core.api.server import ApiServer
    from cdcflow.core.cli.progress import LiveView, ProgressReporter
    from cdcflow.core.config import load_deployment
    from cdcflow.core.config.yamlsrc import load_located
    from cdcflow.core.control.capture import Capture, CaptureOptions
    from cdcflow.core.control.coordinator.spec import info_from_connector
    from cdcflow.core.control.metastore import open_metastore

    factory = plugins.executors.factory(executor)
    deployment = load_deployment(path, plugins)
    progress = ProgressReporter(live=LiveView.for_terminal() if live else None)
    plugins.register(progress, name="cdcflow-run-progress")
    raw = load_located(Path(path).read_text(encoding="utf-8"), path).data["connectors"] or []
    declared = [info_from_connector(c, s) for c, s in zip(deployment.connectors, raw, strict=True)]
    server = deployment.server
    security = ApiSecurity.for_api(server.security, server.api_addr)  # refused before anything starts
    store = open_metastore(server.metastore)
    options = CaptureOptions.from_server(server)
    capture = Capture(store, plugins, factory, options)
    host, _, port = server.api_addr.rpartition(":")
    api = ApiServer(capture, host, int(port), security)
    # The API's address is taken before Spark starts (its JVM and workers open ports of
    # their own): a port given in api-addr is not lost to them, and port 0 takes a free one.
    real_port = await api.start()
    capture.options = dataclasses.replace(options, api_addr=f"{host}:{real_port}")
    log.info("API on %s://%s:%d", security.scheme, host, real_port)
    plugins.executors.start(executor, server, plugins)  # Spark starts beside the capture
    serving = asyncio.create_task(capture.serve())
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        with contextlib.suppress(NotImplementedError):
            loop.add_signal_handler(sig, stop.set)
    try:
        while capture.coordinator is None or not capture.coordinator._tasks:
            if serving.done():
                await serving
            await asyncio.sleep(0.05)
        await _declare(capture.coordinator, store, declared, _ephemeral(deployment.connectors))
        deadline = None if duration is None else time.monotonic() + duration
        while not stop.is_set() and (deadline is None or time.monotonic() < deadline):
            progress.render(await store.list_changefeeds())
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(stop.wait(), 1.0)
    finally:
        progress.close()
        await _stop(capture, serving, api, lambda: plugins.executors.stop(executor))
        final = await store.list_changefeeds()
        summary = {info.id: (info.state.value, status.checkpoint_ts) for info, status in final}
        await store.close()
    for line in progress.summary(final):
        sys.stdout.write(line + "\n")
    return summary


async def _stop(
    capture: Capture, serving: asyncio.Task[None], api: ApiServer, stop_executor: Callable[[], None]
) -> None:
    """Drain the capture (every batch flushed), stop its API, then what its executor
    started (Spark's JVM and workers end before the process and its in-process servers)."""
    await capture.drain()
    await serving
    await api.stop()
    await asyncio.to_thread(stop_executor)


def _ephemeral(connectors: Sequence[Connector]) -> set[str]:
    """The connectors whose upstream lives only as long as this process (see :func:`_declare`)."""
    from cdcflow.core.config.sourcecheck import upstream_is_embedded

    return {c.name for c in connectors if upstream_is_embedded(c)}


async def _declare(
    coordinator: Coordinator, store: MetaStore, declared: list[ChangeFeedInfo], ephemeral: Collection[str] = ()
) -> None:
    """Create the file's changefeeds; one that exists takes the file's declaration.

    A changefeed in ``ephemeral`` reads an upstream that lives only as long as
    this process (the embedded playground): one the metastore kept from an
    earlier run replicated another upstream, and its checkpoint means nothing
    to this one, so it is replaced by a new changefeed as declared.
    """
    from cdcflow.core.errors import DuplicateChangefeedIDError

    for info in declared:
        try:
            await coordinator.create(info)
        except DuplicateChangefeedIDError:
            if info.id in ephemeral:
                await _replace(coordinator, store, info)
            else:
                await _apply_declaration(coordinator, store, info)


async def _replace(coordinator: Coordinator, store: MetaStore, declared: ChangeFeedInfo) -> None:
    """Remove the stored changefeed of ``declared``'s id and create ``declared`` (see :func:`_declare`)."""
    record = await store.get_changefeed(declared.id)
    await coordinator.remove(declared.id)
    await coordinator.create(declared)
    checkpoint = f" (checkpoint {_utc(record[1].checkpoint_ts)})" if record is not None else ""
    sys.stderr.write(
        f"{declared.id}: its upstream is the embedded playground, new in every run; the previous run's "
        f"changefeed{checkpoint} is replaced by a new one from its start-ts. What the previous run "
        "wrote stays in the sinks\n"
    )


def _utc(ts: int) -> str:
    """A TSO's physical time."""
    from cdcflow.core.data.events import tso_utc_text

    return f"{tso_utc_text(ts)} UTC"


async def _apply_declaration(coordinator: Coordinator, store: MetaStore, declared: ChangeFeedInfo) -> None:
    """An existing changefeed takes the file's declaration when it changed since
    (the file is the truth, as in Kafka Connect's standalone mode); its start ts
    and checkpoint are kept. A running changefeed is paused, updated and resumed;
    a paused or failed one is updated and left as it is."""
    from cdcflow.core.control.coordinator.spec import declaration_changes

    record = await store.get_changefeed(declared.id)
    if record is None:
        return
    stored = record[0]
    changed = declaration_changes(stored, declared)
    if not changed:
        return
    running = stored.state.runs
    if running:
        await coordinator.pause(declared.id)
    await coordinator.update(declared.with_changes(created_at=stored.created_at, start_ts=stored.start_ts))
    if running:
        await coordinator.resume(declared.id)
    sys.stderr.write(
        f"{declared.id}: {', '.join(changed)} changed in the file since the changefeed was created; "
        f"applied{', resuming from its checkpoint' if running else f' (it stays {stored.state.value})'}\n"
    )


def run(args: argparse.Namespace) -> int:
    from cdcflow.core.api.security import SecurityConfigError
    from cdcflow.core.config import load_deployment

    try:
        load_deployment(args.file, args.plugins)
    except ConfigInvalidError as exc:  # the file's problems, as `cdcflow validate` reports them
        sys.stderr.write(f"cdcflow: {exc}\n")
        return EXIT_CONFIG
    try:
        live = not args.plain and sys.stdout.isatty()
        asyncio.run(run_file(args.file, args.duration, plugins=args.plugins, executor=args.executor, live=live))
    except SecurityConfigError as exc:  # server.security or the API address: nothing was started
        sys.stderr.write(f"cdcflow: {exc}\n")
        return EXIT_CONFIG
    return EXIT_OK
