"""Playground throughput: the workload alone against the workload with an EventFeed subscriber.

Run:  .venv/bin/python benchmarks/bench_playground.py [--transactions N] [--rounds R]

Each round starts two fresh playgrounds with the same seed (so the same
transactions) and runs ``N`` workload transactions:

* baseline — no EventFeed stream open;
* with-feed — one ``EventFeedV2`` stream (stream-multiplexing) registered on
  every region before the workload starts; the round ends when the client
  has received every COMMIT row.

It reports (median over rounds) transactions/s of each, the rows/s the
client received over loopback gRPC, and the ratio with-feed/baseline, i.e.
what serving one change stream costs the upstream's write path.
"""

from __future__ import annotations

import argparse
import queue
import statistics
import threading
import time
from collections.abc import Iterator
from typing import Any

import grpc

from cdcflow.plugins.sources.playground import Playground
from cdcflow.plugins.sources.tikv.kvproto import cdcpb_pb2, cdcpb_pb2_grpc, kvrpcpb_pb2, metapb_pb2

SEED = 17


def _baseline(transactions: int) -> float:
    with Playground(stores=1, seed=SEED, split_keys=0, ddl_every=0) as pg:
        began = time.perf_counter()
        pg.run_workload(transactions)
        return time.perf_counter() - began


def _requests(pg: Playground, outbox: queue.Queue[Any]) -> Iterator[Any]:
    for request_id, region in enumerate(pg.regions(), start=1):
        yield cdcpb_pb2.ChangeDataRequest(
            header=cdcpb_pb2.Header(cluster_id=pg.cluster_id),
            region_id=region.id,
            region_epoch=metapb_pb2.RegionEpoch(conf_ver=region.conf_ver, version=region.version),
            checkpoint_ts=pg.now(),
            start_key=region.start,
            end_key=region.end,
            request_id=request_id,
            extra_op=kvrpcpb_pb2.ReadOldValue,
        )
    while outbox.get() is not None:
        pass


def _with_feed(transactions: int) -> tuple[float, int]:
    with Playground(stores=1, seed=SEED, split_keys=0, ddl_every=0) as pg:
        channel = grpc.insecure_channel(pg.store_addresses[1])
        outbox: queue.Queue[Any] = queue.Queue()
        call = cdcpb_pb2_grpc.ChangeDataStub(channel).EventFeedV2(
            _requests(pg, outbox), metadata=[("features", "stream-multiplexing")]
        )
        counts = {"init": 0, "commit": 0, "rows": 0}
        ready, done = threading.Event(), threading.Event()
        regions = len(pg.regions())

        def read() -> None:
            try:
                for message in call:
                    for event in message.events:
                        for row in event.entries.entries:
                            counts["rows"] += 1
                            if row.type == cdcpb_pb2.Event.INITIALIZED:
                                counts["init"] += 1
                                if counts["init"] == regions:
                                    ready.set()
                            elif row.type == cdcpb_pb2.Event.COMMIT:
                                counts["commit"] += 1
                    if done.is_set() and counts["commit"] >= target[0]:
                        return
            except grpc.RpcError:  # cancelled at the end of the round
                pass

        target = [1 << 62]
        reader = threading.Thread(target=read, daemon=True)
        reader.start()
        ready.wait(30)
        began = time.perf_counter()
        stats = pg.run_workload(transactions)
        target[0] = stats.keys
        done.set()
        while counts["commit"] < stats.keys:
            time.sleep(0.001)
        elapsed = time.perf_counter() - began
        outbox.put(None)
        call.cancel()
        reader.join(10)
        channel.close()
        return elapsed, counts["rows"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--transactions", type=int, default=1500)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    base, feed, rows = [], [], []
    for _ in range(args.rounds):
        base.append(args.transactions / _baseline(args.transactions))
        elapsed, received = _with_feed(args.transactions)
        feed.append(args.transactions / elapsed)
        rows.append(received / elapsed)
    b, f = statistics.median(base), statistics.median(feed)
    print(f"baseline   {b:10.0f} tx/s  (workload, no subscriber)")
    print(f"with-feed  {f:10.0f} tx/s  {statistics.median(rows):10.0f} rows/s received over loopback gRPC")
    print(f"ratio with-feed/baseline = {f / b:.2f}")


if __name__ == "__main__":
    main()
