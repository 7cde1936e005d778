"""`python -m bench` (what `just bench` runs)."""

from bench.main import main

if __name__ == "__main__":
    raise SystemExit(main())
