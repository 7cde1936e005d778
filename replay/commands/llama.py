"""`replay llama make-model`: tiny random-weight GGUF models for a real llama.cpp target."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from rich.console import Console


@dataclass(frozen=True, kw_only=True, slots=True)
class MakeModelArgs:
    path: Path
    layers: int = 2
    dim: int = 64
    arch: str = "llama"
    swa: int = 256
    ctx: int = 16384
    seed: int = 0
    slow: bool = False  # 8 layers x 512 dims: a cache miss costs seconds
    force: bool = False  # replace an existing model file (once the new one is complete)


def make_model(args: MakeModelArgs, console: Console) -> int:
    from replay.outputs import check_file
    from replay.testing.gguf_model import SLOW
    from replay.testing.gguf_model import make_model as write_model

    check_file(args.path, option="PATH", force=args.force)

    size = {**{"layers": args.layers, "dim": args.dim}, **(SLOW if args.slow else {})}
    written = write_model(args.path, arch=args.arch, swa=args.swa, ctx=args.ctx, seed=args.seed, **size)
    console.print(f"wrote {written} ({written.stat().st_size:,} bytes)", highlight=False)
    return 0
