"""Built-in source plugins."""
