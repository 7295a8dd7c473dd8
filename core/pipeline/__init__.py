"""The data pipeline on Spark: the ``cdcflow`` data source, one streaming query per
changefeed, and the data plane's span executor (ARCHITECTURE.md, "Data pipeline on Spark").

Import :mod:`cdcflow.core.pipeline.executor` for :func:`create_span_executor`;
PySpark is imported only when a query starts.
"""
