"""The cache model held against a real server, request by request (`replay twin`).

A twin compares two results files of the same trace: one from the real server, one from the
simulator configured from that server's effective settings. Both carry `server` records (the real
server's log and the simulator's, read by the same parsers), so per request both sides give
re-processed tokens, cached tokens, restores, evictions and checkpoint use. This package only
compares and renders; `runs` produces the two runs.
"""
