# agent-replay tasks. `just --list` shows them.

# Install the package and the dev tools into the current Python environment.
setup:
    python -m pip install -e '.[dev]'

# Replay a scenario on the embedded simulator and print the report.
demo:
    replay demo

# The test suite (unit + end-to-end on 127.0.0.1) but for the tests that took a worker more than a
# few seconds (marker `slow`, listed in tests/slow.txt: `just test-slow`), one pytest-xdist worker
# per core; a test file's tests stay on one worker with their module's servers. Then the tests that
# hold a budget of a few wall-clock ms (marker `timing`) alone, one at a time, with no neighbour on
# the other core. The real agents run in `just agents`.
test:
    python -m pytest -q -m "not agents and not timing and not slow" -n auto --dist loadfile
    python -m pytest -q -m "timing and not agents"

# The tests `just test` leaves out (tests/slow.txt): whole scenarios, memory slopes over thousands
# of requests, signals to process trees, real llama.cpp builds. CI runs them after `just test`.
test-slow:
    python -m pytest -q -m "slow and not agents" -n auto --dist loadfile

# Every test: `just test` then `just test-slow`.
test-all: test test-slow

# Re-measure which tests are slow (on an idle machine: about 15 minutes on two cores): the whole
# suite with --durations=0, then `just test`'s tests alone; tests/slow.txt is rewritten with the
# tests over 2.5 s of a worker in either run.
test-profile:
    python -m pytest -q -p no:cacheprovider -m "not agents" -n auto --dist loadfile --durations=0 > .profile-all.txt || true
    python -m tests.support.slow_list .profile-all.txt --over 2.5 > tests/slow.txt
    python -m pytest -q -p no:cacheprovider -m "not agents and not slow" -n auto --dist loadfile --durations=0 > .profile-fast.txt || true
    python -m tests.support.slow_list .profile-all.txt .profile-fast.txt --over 2.5 > tests/slow.txt
    rm .profile-all.txt .profile-fast.txt

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

# Real agents (Claude Code, Codex, OpenCode from npm; Hermes from PyPI), installed into
# ~/.cache/agent-replay/agents (REPLAY_AGENTS_DIR), each run headless against the simulator through
# the recorder; their traces must validate and replay 100% ok. `just agents claude-code codex`: some.
agents *names:
    #!/usr/bin/env bash
    set -euo pipefail
    names="{{names}}"
    names="${names:-claude-code codex opencode hermes}"
    python -m tests.agents.install $names
    REPLAY_REQUIRE_AGENTS="$names" python -m pytest -q -s -m agents tests/agents -k "${names// / or }"

# Soak the replay, the recorder and the simulator: RSS, fds and rate every 5 s, against the soak targets (bench/soak.py).
# `just soak --minutes 1`, `just soak --only record`.
soak *ARGS:
    python -m bench.soak {{ARGS}}
