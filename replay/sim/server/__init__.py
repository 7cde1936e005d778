"""The simulator's HTTP server: app, wire formats, ds4-format log, checkpoint files, flags, process lifecycle."""
