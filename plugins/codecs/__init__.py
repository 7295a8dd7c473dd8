"""Built-in codecs (message formats) for message-oriented sinks."""
