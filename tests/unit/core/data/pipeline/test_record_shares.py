"""record_shares: how tasks that read a batch apart split it by key, without Spark's shuffle."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pyarrow as pa
from hypothesis import given
from hypothesis import strategies as st

from cdcflow.core.data.pipeline.tasks import record_shares

COLUMNS = ("table_id", "key")

keys = st.one_of(st.none(), st.binary(max_size=80))
records = st.lists(st.tuples(st.integers(-(2**63), 2**63 - 1), keys), max_size=60)


def batch(rows: list[tuple[int, bytes | None]]) -> pa.RecordBatch:
    ids, found = zip(*rows, strict=True) if rows else ((), ())
    return pa.record_batch([pa.array(ids, pa.int64()), pa.array(found, pa.binary())], names=list(COLUMNS))


def one_hash(table_id: int, key: bytes | None, shares: int) -> int:
    """The share of one record, as a batch of its own: the reference the batch is held to."""
    return int(record_shares(batch([(table_id, key)]), COLUMNS, shares)[0])


@given(records, st.integers(1, 7))
def test_each_record_gets_the_share_it_gets_alone_whatever_else_is_in_its_batch(rows, shares):
    got = record_shares(batch(rows), COLUMNS, shares)
    assert got.dtype == np.uint64 and len(got) == len(rows)
    assert [int(s) for s in got] == [one_hash(t, k, shares) for t, k in rows]
    assert all(0 <= s < shares for s in got)


@given(records, st.integers(0, 60), st.integers(2, 5))
def test_a_slice_of_a_batch_splits_as_the_batch_does(rows, start, shares):
    whole = batch(rows)
    start = min(start, len(rows))
    part = whole.slice(start)  # record batches read from a file start at an offset too
    assert list(record_shares(part, COLUMNS, shares)) == list(record_shares(whole, COLUMNS, shares)[start:])


def test_equal_keys_of_one_table_share_and_other_tables_spread():
    rows = [(7, b"t_r%06d" % i) for i in range(2_000)]
    first = record_shares(batch(rows), COLUMNS, 3)
    assert list(first) == list(record_shares(batch(rows), COLUMNS, 3))
    counts = np.bincount(first.astype(np.int64), minlength=3)
    assert counts.min() > 2_000 / 3 * 0.8  # near an even split for keys that differ in a byte or two
    tables = record_shares(batch([(t, b"same key") for t in range(300)]), COLUMNS, 2)
    assert 100 < int(tables.sum()) < 200  # the table id is part of the hash


def test_the_shares_are_the_same_in_another_process():
    """Tasks run in other Python workers: the split must not depend on the process (no
    seeded hash), or a key's records would be kept by two tasks, or by none."""
    rows = [(i % 5, b"key-%d" % i) for i in range(500)] + [(1, None), (2, b"")]
    here = [int(s) for s in record_shares(batch(rows), COLUMNS, 4)]
    script = (
        "import pyarrow as pa, sys; from cdcflow.core.data.pipeline.tasks import record_shares\n"
        f"rows = {rows!r}\n"
        "ids, keys = zip(*rows)\n"
        "b = pa.record_batch([pa.array(ids, pa.int64()), pa.array(keys, pa.binary())], names=['table_id', 'key'])\n"
        "print(','.join(str(int(s)) for s in record_shares(b, ('table_id', 'key'), 4)))\n"
    )
    out = subprocess.run([sys.executable, "-c", script], check=True, capture_output=True, text=True).stdout
    assert [int(s) for s in out.strip().split(",")] == here
