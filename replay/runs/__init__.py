"""One replay pipeline and what hangs on it: targets, workers, probe, A/B, scenario arms, k8s (server logs and counters: `replay.serverside`)."""
