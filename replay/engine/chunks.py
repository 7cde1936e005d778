"""The chunked transfer coding of a response body, undone across network reads.

A streamed reply arrives as one chunk per event (a 64-token reply is ~66 chunks, often in one
read), so this loop runs per event; it is compiled with the engine's hot path (client CPU per request), which
is why it lives apart from `http1`'s connection classes (those build on asyncio's and stay source).
"""

from __future__ import annotations

_LINE_MAX = 4096  # a chunk-size line longer than this is not a server's
_FAST_DIGITS = 15  # sizes up to 2**60 are read digit by digit; longer ones by `int`


class ChunkError(ValueError):
    """The body breaks the chunked framing."""


class Dechunker:
    """One body's framing state; `feed` each read in order until `done`."""

    def __init__(self) -> None:
        self.left = 0  # bytes still due in the current chunk
        self.line = b""  # a chunk-size line split across reads
        self.done = False  # the last (zero-size) chunk's size line has been read
        self.rest = b""  # what followed that line in its read: the trailer section's start

    def reset(self) -> None:
        self.left = 0
        self.line = b""
        self.done = False
        self.rest = b""

    def feed(self, data: bytes) -> bytes:
        """The chunk payloads in one network read; the framing is consumed, the state kept."""
        parts: list[bytes] = []
        pos = 0
        end = len(data)
        while pos < end:
            left = self.left
            if left:
                take = min(left, end - pos)
                parts.append(data[pos : pos + take] if take < end or pos else data)
                pos += take
                self.left = left - take
                continue
            if not self.line:
                # The canonical framing, read without slicing: the CRLF that closes a chunk's
                # data, or a bare hex size and CRLF. Anything else (extensions, spaces, a line
                # split across reads, bad sizes) takes the general path below.
                if data[pos] == 13 and pos + 1 < end and data[pos + 1] == 10:
                    pos += 2
                    continue
                size = 0
                i = pos
                stop = min(end, pos + _FAST_DIGITS)
                while i < stop:
                    c = data[i]
                    if 48 <= c <= 57:
                        size = size * 16 + (c - 48)
                    elif 97 <= c <= 102:
                        size = size * 16 + (c - 87)
                    elif 65 <= c <= 70:
                        size = size * 16 + (c - 55)
                    else:
                        break
                    i += 1
                if i > pos and i + 1 < end and data[i] == 13 and data[i + 1] == 10:
                    pos = i + 2
                    if size == 0:
                        self.done = True
                        self.rest = data[pos:]
                        break
                    self.left = size
                    continue
            eol = data.find(b"\n", pos)
            if eol < 0:
                self.line += data[pos:]
                if len(self.line) > _LINE_MAX:
                    raise ChunkError("chunk size line too long")
                break
            line = data[pos:eol]
            if self.line:
                line = self.line + line
                self.line = b""
            pos = eol + 1
            size_text = line.split(b";", 1)[0].strip()
            if not size_text:
                continue  # the CRLF that closes a chunk's data
            try:
                size = int(size_text, 16)
            except ValueError:
                raise ChunkError(f"bad chunk size {size_text[:20]!r}") from None
            if size == 0:
                self.done = True  # the data is complete; the trailer section only frames
                self.rest = data[pos:]
                break
            self.left = size
        if len(parts) == 1:
            return parts[0]
        return b"".join(parts)
