"""The ``kafka`` sink: TiCDC Open Protocol (or canal-json, json) to Kafka or the in-process mock cluster."""

from cdcflow.plugins.sinks.kafka.config import KafkaSinkConfig
from cdcflow.plugins.sinks.kafka.sink import KafkaSink, cdcflow_register_sinks

__all__ = ["KafkaSink", "KafkaSinkConfig", "cdcflow_register_sinks"]
