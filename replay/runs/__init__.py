"""One replay pipeline and what hangs on it: targets, workers, server logs and counters, probe, A/B, scenario arms."""
