"""Placeholder checkpoint files in `--kv-disk-dir`, so a user can watch the directory fill and empty.

Each `<sha1>.kv` file is small: a magic line, a fixed-size JSON header (ds4's header fields, with
the modelled size in `size`) and the checkpoint's tokens, compressed. The tokens are what let a
restarted simulator restore from files an earlier run left, as ds4 does. The accounted sizes are
always the modelled ones, never the bytes on disk.

The tokens are stored one JSON line per block, as a raw deflate stream made of one segment per
block, each ended by a full flush (byte-aligned, no back-references into earlier segments), so the
segments concatenate into a valid stream. A conversation's checkpoints share most blocks, and a
block's segment is compressed once and cached: writing a file costs its new blocks only.
"""

from __future__ import annotations

import os
import sys
import zlib
from collections import OrderedDict
from pathlib import Path

import orjson

from replay.sim.model.disk import Checkpoint
from replay.sim.model.seq import TokenSeq
from replay.sim.model.tokenizer import Block

MAGIC_V1 = b"DS4SIM-KV 1\n"  # the tokens as one compressed JSON list (still read)
MAGIC = b"DS4SIM-KV 2\n"
HEADER_BYTES = 512
_END = zlib.compressobj(1, zlib.DEFLATED, -15).flush(zlib.Z_FINISH)  # an empty final block


def _segment(block: Block) -> bytes:
    enc = zlib.compressobj(1, zlib.DEFLATED, -15)
    return enc.compress(orjson.dumps(block) + b"\n") + enc.flush(zlib.Z_FULL_FLUSH)


class _Segments:
    """Compressed segments of recently written blocks, least recently used dropped past `limit`
    bytes. Keyed by identity: the cached entry holds its block, so an id is never reused under it."""

    def __init__(self, limit: int = 64 * 1024 * 1024) -> None:
        self.limit = limit
        self.bytes = 0
        self._cache: OrderedDict[int, tuple[Block, bytes]] = OrderedDict()

    def get(self, block: Block) -> bytes:
        entry = self._cache.get(id(block))
        if entry is not None and entry[0] is block:
            self._cache.move_to_end(id(block))
            return entry[1]
        seg = _segment(block)
        if entry is not None:
            self.bytes -= len(entry[1])
        self._cache[id(block)] = (block, seg)
        self.bytes += len(seg)
        while self.bytes > self.limit and len(self._cache) > 1:
            _, (_, old) = self._cache.popitem(last=False)
            self.bytes -= len(old)
        return seg

    def payload(self, seq: TokenSeq) -> bytes:
        parts: list[bytes] = []
        for block, end in zip(seq.blocks, seq.ends, strict=True):
            if end <= seq.n:
                parts.append(self.get(block))
            else:
                cut = len(block) - (end - seq.n)
                if cut > 0:
                    parts.append(_segment(block[:cut]))
                break
        parts.append(_END)
        return b"".join(parts)


class CheckpointFiles:
    """Mirror of the model's disk store; `epoch0` maps virtual seconds to wall epochs."""

    def __init__(self, directory: str | Path, epoch0: float) -> None:
        self.dir = Path(directory)
        self.epoch0 = epoch0
        self.dir.mkdir(parents=True, exist_ok=True)
        os.chmod(self.dir, 0o700)
        self._segments = _Segments()

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
        payload = self._segments.payload(cp.seq)
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
        if not data.startswith((MAGIC, MAGIC_V1)):
            raise ValueError("not a simulator checkpoint")
        start = len(MAGIC)
        header = orjson.loads(data[start : start + HEADER_BYTES])
        body = data[start + HEADER_BYTES :]
        if data.startswith(MAGIC_V1):
            lines = [orjson.loads(zlib.decompress(body))]
        else:
            lines = [orjson.loads(line) for line in zlib.decompress(body, -15).splitlines()]
        seq = TokenSeq(tuple(tuple(map(sys.intern, line)) for line in lines))
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
