"""The data plane (seeds 003–004 and the Spark pipeline): rows from an upstream's
feeds to the sinks, in order, with checkpoints that only move forward.

Where each concept lives:

=================================  ==========================================
``events``                         spans, row changes, DDL, resolved ts, micro-batches
``types``                          ``TypeCode``: MySQL column type bytes and their groups
``source``                         the ``Source`` contract: long-lived feeds per span
``sink``                           the ``Sink`` contract: flush before return, idempotent replay
``codec``                          the ``Codec`` contract: message formats for message sinks
``filter``                         ``TableFilter`` (TiDB's table-filter syntax)
``frontier``                       ``SpanFrontier``: the minimum resolved ts over spans, forward only
``logservice/``                    ``EventStore``: sorted, bounded-memory buffers publishing resolved chunks
``pipeline/``                      the Spark runtime: the ``cdcflow`` data source, one streaming query per changefeed
``span_executor``                  ``SpanExecutor``: the boundary the control plane drives (seed 002's TableExecutor),
                                   and how a capture gets one: ``ExecutorContext``, factories registered by name
=================================  ==========================================
"""
