"""Maintainer manager (every capture) and maintainers (one per changefeed): seed 000's
bootstrap and heartbeat flow, table-set changes, and the placement of spans by the scheduler."""
