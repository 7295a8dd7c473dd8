"""The REST API (TiCDC OpenAPI v2 shape) and its client."""
