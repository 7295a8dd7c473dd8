"""The playground upstream: an in-process PD + TiKV stores + TiDB status API.

It speaks the real protocols (``pdpb.PD``, ``cdcpb.ChangeData``, TiDB's status
HTTP API) on 127.0.0.1, backed by an MVCC store with Percolator transactions,
regions that split and move, and a transactional workload. See
docs/reference/playground.md.
"""

from cdcflow.plugins.sources.playground.playground import Playground

__all__ = ["Playground"]
