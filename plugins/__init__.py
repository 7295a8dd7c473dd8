"""Built-in cdcflow plugins: sources, sinks, schedulers and codecs.

They are registered through the same plugin manager as third-party plugins
(see :mod:`cdcflow.core.plugin.manager`).
"""
