"""connectors.yaml: the model, the loader and its located error reports."""

from cdcflow.core.config.loader import (
    DEFAULT_SCHEDULER,
    Connector,
    Deployment,
    PluginChoice,
    load_deployment,
    validate_text,
)
from cdcflow.core.config.settings import (
    ConnectorSettings,
    DeploymentFile,
    FilterSettings,
    ServerSettings,
    SparkSettings,
)

__all__ = [
    "DEFAULT_SCHEDULER",
    "Connector",
    "ConnectorSettings",
    "Deployment",
    "DeploymentFile",
    "FilterSettings",
    "PluginChoice",
    "ServerSettings",
    "SparkSettings",
    "load_deployment",
    "validate_text",
]
