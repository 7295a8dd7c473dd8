"""Benchmarks: each reports a rate next to a baseline measured in the same run (``make bench``)."""
