"""The cdcflow release version (single source for packaging and ``cdcflow version``)."""

__version__ = "0.1.0"
