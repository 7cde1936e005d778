"""Placeholder checkpoint files in `--kv-disk-dir`, so a user can watch the directory fill and empty.

Each `<sha1>.kv` file is small: a magic line, a fixed-size JSON header (ds4's header fields, with
the modelled size in `size`) and the checkpoint's tokens, compressed. The tokens are what let a
restarted simulator restore from files an earlier run left, as ds4 does. The accounted sizes are
always the modelled ones, never the bytes on disk.
"""

from __future__ import annotations

import os
import sys
import zlib
from pathlib import Path

import orjson

from replay.sim.disk import Checkpoint
from replay.sim.seq import TokenSeq

MAGIC = b"DS4SIM-KV 1\n"
HEADER_BYTES = 512


class CheckpointFiles:
    """Mirror of the model's disk store; `epoch0` maps virtual seconds to wall epochs."""

    def __init__(self, directory: str | Path, epoch0: float) -> None:
        self.dir = Path(directory)
        self.epoch0 = epoch0
        self.dir.mkdir(parents=True, exist_ok=True)
        os.chmod(self.dir, 0o700)

    def path(self, cp: Checkpoint) -> Path:
        return self.dir / cp.name

    def load(self) -> tuple[list[Checkpoint], list[tuple[Path, str]]]:
        """Checkpoints found in the directory, and the files that could not be read (path, why)."""
        found: list[Checkpoint] = []
        bad: list[tuple[Path, str]] = []
        for path in sorted(self.dir.glob("*.kv")):
            try:
                found.append(self._read(path))
            except (OSError, ValueError, zlib.error, orjson.JSONDecodeError) as exc:
                bad.append((path, str(exc) or type(exc).__name__))
        return found, bad

    def write(self, cp: Checkpoint) -> None:
        path = self.path(cp)
        tmp = path.with_name(f"{path.name}.tmp.{os.getpid()}")
        payload = zlib.compress(orjson.dumps(cp.seq.tokens()), 1)
        with open(tmp, "wb") as fh:
            fh.write(MAGIC)
            fh.write(self._header(cp))
            fh.write(payload)
        os.replace(tmp, path)

    def update(self, cp: Checkpoint) -> None:
        """Rewrite the header in place after a hit (hits and last-used, as ds4 bumps them)."""
        path = self.path(cp)
        try:
            with open(path, "r+b") as fh:
                fh.seek(len(MAGIC))
                fh.write(self._header(cp))
        except FileNotFoundError:
            pass

    def delete(self, cp: Checkpoint) -> None:
        self.path(cp).unlink(missing_ok=True)

    def _header(self, cp: Checkpoint) -> bytes:
        header = orjson.dumps(
            {
                "tokens": cp.tokens,
                "reason": cp.reason,
                "key": cp.key,
                "size": cp.size,
                "hits": cp.hits,
                "trimmed": cp.trimmed,
                "created": self.epoch0 + cp.created,
                "last_used": self.epoch0 + cp.last_used,
            }
        )
        if len(header) > HEADER_BYTES - 1:
            raise ValueError("checkpoint header too long")
        return header.ljust(HEADER_BYTES - 1) + b"\n"

    def _read(self, path: Path) -> Checkpoint:
        data = path.read_bytes()
        if not data.startswith(MAGIC):
            raise ValueError("not a simulator checkpoint")
        start = len(MAGIC)
        header = orjson.loads(data[start : start + HEADER_BYTES])
        tokens = orjson.loads(zlib.decompress(data[start + HEADER_BYTES :]))
        seq = TokenSeq((tuple(map(sys.intern, tokens)),))
        if len(seq) != header["tokens"]:
            raise ValueError("token count does not match header")
        cp = Checkpoint(
            seq=seq,
            reason=header["reason"],
            key=header["key"],
            size=int(header["size"]),
            created=float(header["created"]) - self.epoch0,
            last_used=float(header["last_used"]) - self.epoch0,
            hits=int(header["hits"]),
            trimmed=int(header.get("trimmed", 0)),
        )
        cp._name = path.name
        return cp
