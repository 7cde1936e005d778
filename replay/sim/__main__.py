"""`python -m replay.sim [ds4-style flags]`: run the simulated ds4-server."""

from replay.sim.server.process import serve

raise SystemExit(serve())
