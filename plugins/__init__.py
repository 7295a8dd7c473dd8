"""Built-in cdcflow plugins: sources, sinks, schedulers and codecs.

They are registered through the same plugin manager as third-party plugins
(see :mod:`cdcflow.core.plugin.manager`).
"""

# The plugin system first: core.codec and core.sink import it, and it imports
# them back, so importing a plugin module before it would start in the middle
# of that cycle.
import cdcflow.core.plugin  # noqa: F401
