"""Mooncake traces (one JSON object per line: `timestamp` ms, `input_length`, `output_length`,
`hash_ids` of 512-token blocks) to and from our trace format, so workloads move between this tool
and AIPerf / SGLang benchmarks.

Import: block id h becomes synthetic text seeded by h, so two requests share prompt text exactly
where their hash ids are equal (the last block may be partial: it is the prefix, in words, of the
same id's full block). Sessions come from the block-prefix tree: a request continues the session of
an earlier request whose whole blocks it extends, but only where those reach beyond the blocks
every request begins with (a shared system prompt says nothing about the conversation); anything
else starts a session. Each prompt is one user message whose
content is its blocks joined by newlines; each newline is a token, so a block after the first has
one word fewer and the prompt is `input_length` tokens long (`replay.record.tokens`).

Export: each request's materialised prompt is cut into 512-token blocks with the same tokenizer; a
block's id is a chained hash of everything up to its end, numbered in first-seen order, so equal
prefixes get equal ids. An imported trace exports to its original ids up to that renumbering.
"""

from __future__ import annotations

import hashlib
from array import array
from bisect import bisect_left
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import orjson

from replay.errors import TraceError, UsageError
from replay.importers.base import ImportOptions, jsonl, progress_bar
from replay.record.tokens import PART_SEPARATOR_TOKENS, tokens
from replay.trace.materialize import materialize, recorded_reply
from replay.trace.reader import read_trace
from replay.trace.writer import TraceWriter

BLOCK = 512
SEED_BASE = 0x4D43_0000_0000  # keeps block seeds apart from other synthetic seeds


def _rows(src: Path, advance: Callable[[int], None] = lambda n: None) -> Iterator[dict[str, Any]]:
    """The rows one at a time, each checked (a bad one is a `TraceError` at file:line)."""
    for n, row in jsonl(src, advance):
        if not isinstance(row, dict):
            raise TraceError(str(src), n, "a mooncake row must be a JSON object")
        for key in ("timestamp", "input_length", "output_length", "hash_ids"):
            if key not in row:
                raise TraceError(str(src), n, f"mooncake row is missing '{key}'")
        ids, length = row["hash_ids"], row["input_length"]
        if not isinstance(ids, list) or not all(isinstance(h, int) for h in ids):
            raise TraceError(str(src), n, "hash_ids must be a list of integers")
        if not isinstance(length, int) or length < 0 or len(ids) != -(-length // BLOCK):
            raise TraceError(str(src), n, f"input_length {length} does not fit {len(ids)} blocks of {BLOCK}")
        row["_line"] = n
        yield row


class _Seen:
    """Block ids seen so far: a bitmap for the dense small ids Mooncake traces use (an eighth of a
    byte each, where a set of ints takes ~60 bytes), a set for any other."""

    BITMAP_MAX = 1 << 28  # ids below this go in the bitmap (at most 32 MiB, as large as the ids)

    def __init__(self) -> None:
        self.bits = bytearray()
        self.other: set[int] = set()

    def add(self, h: int) -> bool:
        """Mark `h` seen; whether it was seen before."""
        if not 0 <= h < self.BITMAP_MAX:
            if h in self.other:
                return True
            self.other.add(h)
            return False
        byte, bit = h >> 3, 1 << (h & 7)
        if byte >= len(self.bits):
            self.bits.extend(bytes(max(byte + 1 - len(self.bits), len(self.bits))))
        was = bool(self.bits[byte] & bit)
        self.bits[byte] |= bit
        return was


class _Prefixes:
    """Chained prefix hash -> session number, the latest one set for a hash winning: the newest
    entries in a dict, older ones in sorted arrays of 16 bytes an entry (a dict takes ~100), merged
    as they grow so a lookup searches a few of them."""

    RECENT = 1 << 16

    def __init__(self) -> None:
        self.recent: dict[int, int] = {}
        self.levels: list[tuple[array[int], array[int]]] = []  # oldest first; sorted unique keys

    def get(self, key: int) -> int | None:
        found = self.recent.get(key)
        if found is not None:
            return found
        for keys, values in reversed(self.levels):
            i = bisect_left(keys, key)
            if i < len(keys) and keys[i] == key:
                return values[i]
        return None

    def set(self, key: int, value: int) -> None:
        self.recent[key] = value
        if len(self.recent) >= self.RECENT:
            order = sorted(self.recent)
            level = (array("q", order), array("q", (self.recent[k] for k in order)))
            self.recent = {}
            self.levels.append(level)
            while len(self.levels) > 1 and len(self.levels[-2][0]) <= 2 * len(self.levels[-1][0]):
                newer = self.levels.pop()
                self.levels[-1] = _merge(self.levels[-1], newer)


def _merge(
    older: tuple[array[int], array[int]], newer: tuple[array[int], array[int]]
) -> tuple[array[int], array[int]]:
    """Two sorted levels as one; where both hold a key, the newer's value."""
    (ak, av), (bk, bv) = older, newer
    keys, values = array("q"), array("q")
    i = j = 0
    while i < len(ak) and j < len(bk):
        if ak[i] < bk[j]:
            keys.append(ak[i])
            values.append(av[i])
            i += 1
        else:
            if ak[i] == bk[j]:
                i += 1
            keys.append(bk[j])
            values.append(bv[j])
            j += 1
    keys.extend(ak[i:])
    values.extend(av[i:])
    keys.extend(bk[j:])
    values.extend(bv[j:])
    return keys, values


def _full(row: dict[str, Any]) -> int:
    """How many of the row's blocks are whole (the last may be partial)."""
    ids, length = row["hash_ids"], row["input_length"]
    return len(ids) if length % BLOCK == 0 else len(ids) - 1


def _shared(src: Path) -> tuple[int, int, float]:
    """First pass: rows, whole blocks every row begins with (the common system prompt), first time."""
    common: list[int] | None = None
    rows = 0
    t0 = float("inf")
    for row in _rows(src):
        rows += 1
        t0 = min(t0, row["timestamp"])
        ids = row["hash_ids"][: _full(row)]
        if common is None:
            common = list(ids)
        else:
            k = 0
            while k < len(common) and k < len(ids) and common[k] == ids[k]:
                k += 1
            del common[k:]
    return rows, len(common or ()), t0


def import_mooncake(
    src: str | Path,
    out: str | Path,
    api: str = "openai",
    model: str = "default",
    options: ImportOptions | None = None,
) -> dict[str, int]:
    """Convert a Mooncake JSONL trace into a trace at `out`.

    Sessions by the block-prefix tree: a request continues the session of the latest earlier
    request whose whole blocks it extends, provided they reach beyond the blocks every request
    shares; otherwise it starts a session. Prefixes are kept as chained hashes, one per request.
    """
    options = options or ImportOptions()
    if options.sessions:
        raise UsageError("mooncake has no session ids to filter by (sessions are inferred)")
    src = Path(src)
    rows, shared, t0 = _shared(src)
    if not rows:
        raise TraceError(str(src), 0, "no requests in the mooncake trace")
    # chained hash of a whole-block prefix -> session; a continuation must extend more than `shared`
    prefixes = _Prefixes()
    counts = {
        "requests": 0,
        "sessions": 0,
        "blocks": 0,
        "shared_blocks": 0,
        "common_blocks": shared,
        "filtered": 0,
    }
    seen_blocks = _Seen()
    notes = f"imported from mooncake trace {src.name}; {BLOCK}-token blocks as synthetic text"
    with (
        TraceWriter(out, source="import:mooncake", notes=notes) as writer,
        progress_bar(src.stat().st_size, "mooncake", options) as advance,
    ):
        for row in _rows(src, advance):
            ids: list[int] = row["hash_ids"]
            length: int = row["input_length"]
            when = t0_epoch(row["timestamp"])
            if (options.since is not None and when < options.since) or (
                options.until is not None and when >= options.until
            ):
                counts["filtered"] += 1
                continue
            full = _full(row)
            chain: list[int] = []
            h = 0
            for block in ids[:full]:
                h = hash((h, block))
                chain.append(h)
            number = None
            for k in range(full, shared, -1):
                number = prefixes.get(chain[k - 1])
                if number is not None:
                    break
            if number is None:
                counts["sessions"] += 1
                number = counts["sessions"]
                writer.session(f"mc{number}", api=api, model=model, labels={"source": "mooncake"})
            session = f"mc{number}"
            if full > shared:
                prefixes.set(chain[full - 1], number)
            parts = []
            for i, h_id in enumerate(ids):
                size = BLOCK if i < len(ids) - 1 or length % BLOCK == 0 else length % BLOCK
                if i:
                    size -= PART_SEPARATOR_TOKENS  # the newline joining it to the previous block
                parts.append({"synth": {"tokens": size, "seed": SEED_BASE + h_id}})
                counts["shared_blocks"] += seen_blocks.add(h_id)
            counts["blocks"] += len(ids)
            output = int(row["output_length"])
            writer.request(
                session,
                (row["timestamp"] - t0) / 1000.0,
                [{"role": "user", "content": parts}],
                params={"max_tokens": output, "stream": True},
                reply={"output_tokens": output, "finish": "length"},
            )
            counts["requests"] += 1
    return counts


def t0_epoch(ms: float) -> float:
    """Mooncake timestamps are milliseconds (from the trace's start, or epoch): as seconds."""
    return ms / 1000.0


class _BlockIds:
    """Chained block hashes -> small integers, in first-seen order."""

    def __init__(self) -> None:
        self.ids: dict[bytes, int] = {}

    def of(self, digest: bytes) -> int:
        found = self.ids.get(digest)
        if found is None:
            found = self.ids[digest] = len(self.ids)
        return found


def _prompt_tokens(messages: list[dict[str, Any]], cache: dict[str, tuple[str, ...]]) -> list[str]:
    """The prompt as tokens; message boundaries become tokens of their own only for hashing."""
    out: list[str] = []
    for m in messages:
        out.append(f"\x00{m.get('role')}")
        for part in (m.get("content") or "", *(c.get("arguments", "") for c in m.get("tool_calls") or ())):
            words = cache.get(part)
            if words is None:
                words = cache[part] = tokens(part)
            out.extend(words)
    return out


def export_mooncake(src: str | Path, out: str | Path) -> dict[str, int]:
    """Write trace `src` as a Mooncake JSONL trace at `out` (recorded replies stand in the history)."""
    trace = read_trace(src)
    replies = recorded_reply(trace.by_id())
    numbering = _BlockIds()
    cache: dict[str, tuple[str, ...]] = {}
    counts = {"requests": 0, "blocks": 0}
    with open(out, "wb") as handle:
        for req in sorted(trace.requests, key=lambda r: (r.t, r.id)):
            stream = _prompt_tokens(materialize(req, replies), cache)
            ids: list[int] = []
            digest = b""
            length = 0
            block: list[str] = []
            for tok in stream:
                block.append(tok)
                if tok.startswith("\x00"):
                    continue
                length += 1
                if length % BLOCK == 0:
                    digest = hashlib.blake2b(digest + "\x01".join(block).encode(), digest_size=16).digest()
                    ids.append(numbering.of(digest))
                    block = []
            if length % BLOCK:
                digest = hashlib.blake2b(digest + "\x01".join(block).encode(), digest_size=16).digest()
                ids.append(numbering.of(digest))
            reply = req.reply or {}
            output = (
                reply.get("output_tokens")
                or req.params.get("max_tokens")
                or (req.usage or {}).get("output_tokens")
                or 0
            )
            row = {
                "timestamp": round(req.t * 1000),
                "input_length": length,
                "output_length": int(output),
                "hash_ids": ids,
            }
            handle.write(orjson.dumps(row) + b"\n")
            counts["requests"] += 1
            counts["blocks"] += len(ids)
    return counts
