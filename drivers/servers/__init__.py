"""One module per server kind."""
