"""cdcflow core: the model, control plane, log service, pipeline runtime, plugin
manager, configuration and command line of the cdcflow CDC framework.

Plugins (sources, sinks, schedulers, codecs) live in :mod:`cdcflow.plugins`
and in third-party packages; they are loaded through :mod:`cdcflow.core.plugin`.
"""

from cdcflow.core.version import __version__

__all__ = ["__version__"]
