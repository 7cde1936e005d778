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

# Every built-in scenario's field figures against the simulator (exit 1 if one fails).
check:
    replay scenario check

# Lint, format check, and the import rules of DESIGN.md (.importlinter).
lint:
    ruff check .
    ruff format --check .
    lint-imports

# Benchmarks: the client's own overhead, rate, memory, accuracy.
bench:
    python -m bench
