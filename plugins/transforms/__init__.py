"""Built-in transforms: filter, project, mask, route, python (Kafka Connect's SMTs, run by Spark)."""
