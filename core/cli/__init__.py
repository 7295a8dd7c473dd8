"""The ``cdcflow`` command line: one module per sub-command (see :mod:`.main`)."""
