"""The client's own benchmark: a reference SSE server, accuracy, rate, memory, peers side by side."""
