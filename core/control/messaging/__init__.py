"""Messages between captures: message types, the message center, the gRPC transport."""
