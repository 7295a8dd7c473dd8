"""The control plane (seeds 000–002): which changefeeds exist, in which state, and
which capture replicates which span.

Where each seed concept lives:

=================================  ==========================================
``capture``                        :class:`Capture`, one ``cdcflow server`` process (seed 001)
``changefeed``                     ``ChangeFeedInfo`` / ``ChangeFeedStatus`` and seed 000's states
``coordinator/``                   ``Coordinator`` (on the owner) and its ``Controller``
``maintainer/``                    ``MaintainerManager`` (every capture) and ``Maintainer`` (one per changefeed)
``scheduling/``                    the ``Scheduler`` contract, its protocol, and the capture-side ``Agent``
``span_host``                      ``SpanHost``: a capture's agents and span executors, one per changefeed
``messaging/``                     the message center: in-process queues and gRPC streams between captures
``metastore/``                     the ``MetaStore`` interface, SQLite and etcd
``gc/``                            GC safepoints: the upstream's ``GCSafepointKeeper`` and the ``GCManager``
=================================  ==========================================

The control plane decides; the data plane (:mod:`cdcflow.core.data`) carries
out, through the :class:`~cdcflow.core.data.span_executor.SpanExecutor` of each
changefeed on each capture.
"""
