"""GC safepoints (seed 000 "GC safepoint/屏障管理"): what an MVCC upstream must keep.

* :mod:`.keeper` — :class:`GCSafepointKeeper`, the contract a source plugin implements
  to set and remove a service GC safepoint upstream;
* :mod:`.manager` — :class:`GCManager`, the coordinator's upkeep of one safepoint per
  upstream at the minimum checkpoint of the changefeeds that still need protection.
"""
