"""The CockroachDB playground: a PostgreSQL-wire server with CockroachDB's changefeeds, in process.

It speaks the PostgreSQL v3 protocol on 127.0.0.1 (startup, trust / cleartext /
SCRAM-SHA-256, simple and extended query), runs the SQL the ``cockroachdb``
source and a psql/psycopg user need over an MVCC store with HLC timestamps,
streams sinkless ``CREATE CHANGEFEED`` rows, and runs a shop workload with
fault injection. See docs/how-to/replicate-from-cockroachdb.md.
"""

from cdcflow.plugins.sources.cockroach_playground.playground import CockroachPlayground

__all__ = ["CockroachPlayground"]
