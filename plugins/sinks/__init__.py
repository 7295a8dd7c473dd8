"""Built-in sink plugins."""
