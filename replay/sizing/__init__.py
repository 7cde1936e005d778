"""Disk-budget arithmetic over a trace: chains of checkpoints and what-if sweeps (walks replay.sim.model)."""
