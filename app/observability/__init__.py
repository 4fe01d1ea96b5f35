"""What an operator sees of the service: request ids, metrics, the access log."""
