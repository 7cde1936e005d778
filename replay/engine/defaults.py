"""Each replay option's default, written once: the command line's options, `ReplayOptions`
(runs.options), the engine's config and the pipeline read them from here. It imports nothing, so
the command line reads them when it starts without loading the engine.
"""

from __future__ import annotations

# A request may take minutes: a cold prefill of a 100K+-token prompt on a local server.
TIMEOUT_S = 1800.0
PLAN = "alternate"
SPEED = 1.0  # timed and closed-loop: trace seconds per replayed second
HISTORY = "live"  # the server's own replies go back into the history, as an agent's would
# A/B: both arms resend the recorded replies, so a reply that differs (a numerics change) cannot
# change what later requests compare.
AB_HISTORY = "recorded"
THINK = "off"
LOOP = "auto"  # asyncio's own loop (engine.run.loop_options says why not uvloop)
CONNECTIONS = "auto"  # as the server: engine.connections
# A scenario's arms run on the simulator (`scenario run`): a shorter timeout than a real server's.
SCENARIO_TIMEOUT_S = 600.0
