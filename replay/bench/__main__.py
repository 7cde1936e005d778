"""`python -m replay.bench` (what `just bench` runs)."""

from replay.bench.main import main

if __name__ == "__main__":
    raise SystemExit(main())
