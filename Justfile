# agent-replay tasks. `just --list` shows them.

# Install the package and the dev tools into the current Python environment.
setup:
    python -m pip install -e '.[dev]'

# Replay a scenario on the embedded simulator and print the report.
demo:
    replay demo

# The whole test suite (unit + end-to-end on 127.0.0.1).
test:
    python -m pytest -q

# Lint and format check.
lint:
    ruff check .
    ruff format --check .

# Benchmarks: the client's own overhead, rate, memory, accuracy.
bench:
    python -m bench

# Soak the replay, the recorder and the simulator: RSS, fds and rate every 5 s, against #23's targets.
# `just soak --minutes 1`, `just soak --only record`.
soak *ARGS:
    python -m bench.soak {{ARGS}}
