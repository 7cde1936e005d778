"""Anonymisation: every text becomes synthetic text of the same token count, keyed by a secret.

The seed of each synthetic text is an HMAC of the original under the user's key, so identical
text stays identical (a system prompt repeated in every request, tool definitions, a prefix two
sessions share) and different text stays different, and nobody without the key can test a guess
of the original against the trace. Long texts are cut into blocks of `block_tokens` tokens whose
seeds are chained (each block's seed covers everything before it, as a prefix cache's block
hashes do): two texts that share their first blocks keep sharing them, and the first difference
changes every block after it, as it would on a server.

Structure is kept: roles, message counts, tool-call ids (renamed, pairing intact), timings,
usage, finish reasons, statuses. Names (tools, schema properties, argument keys, session ids,
blob ids) become identifiers of as many tokens drawn from the same keyed hash, consistently
everywhere. Tool-call arguments keep their JSON layout, only their strings change. Token counts
are the simulator's (`replay.record.tokens`), so on the simulator an anonymised trace prefills
what the original did; long texts split into parts pay for the newline that joins them.
"""

from __future__ import annotations

import hashlib
import hmac
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson

from replay.errors import TraceError, UsageError
from replay.outputs import replacing
from replay.record.tokens import PART_SEPARATOR_TOKENS, count_tokens, token_starts
from replay.trace.model import FORMAT, Message
from replay.trace.reader import validate
from replay.trace.synth import synth_text

BLOCK_TOKENS = 128
# JSON-schema keywords whose string values are vocabulary, not user text.
_SCHEMA_KEEP = {"type", "format", "$schema"}
_SCHEMA_NAMES = {"properties", "patternProperties", "$defs", "definitions"}
_SCHEMA_TEXT = {"description", "title"}
_MEMO_MAX = 8192
_JSON_STRING = re.compile(r'"((?:[^"\\]|\\.)*)"(\s*:)?')


class Anonymizer:
    """Keyed, deterministic replacement of every text in trace objects."""

    def __init__(
        self, key: str | bytes, count: Callable[[str], int] = count_tokens, block_tokens: int = BLOCK_TOKENS
    ) -> None:
        if not key:
            raise ValueError("the anonymisation key must not be empty")
        self._key = key.encode() if isinstance(key, str) else key
        self._count = count
        self.block_tokens = block_tokens
        self._memo: dict[str, Any] = {}

    def _mac(self, *parts: bytes) -> bytes:
        mac = hmac.new(self._key, digestmod=hashlib.sha256)
        for part in parts:
            mac.update(len(part).to_bytes(8, "little"))
            mac.update(part)
        return mac.digest()

    @staticmethod
    def _seed(digest: bytes) -> int:
        return int.from_bytes(digest[:8], "little") >> 1

    # --- text --------------------------------------------------------------------------

    def text(self, text: str) -> Any:
        """Trace content for `text`: a synth object, a list of them (long text), or ""."""
        cached = self._memo.get(text)
        if cached is not None:
            return cached
        starts = token_starts(text) if self._count is count_tokens else None
        n = len(starts) if starts is not None else self._count(text)
        if n == 0:
            out: Any = ""
        elif n <= self.block_tokens or starts is None:
            out = {"synth": {"tokens": n, "seed": self._seed(self._mac(b"text", text.encode()))}}
        else:
            out = []
            chained = b"text"
            for i in range(0, n, self.block_tokens):
                end = starts[i + self.block_tokens] if i + self.block_tokens < n else len(text)
                chained = self._mac(chained, text[starts[i] : end].encode())
                size = min(self.block_tokens, n - i) - (PART_SEPARATOR_TOKENS if i else 0)
                out.append({"synth": {"tokens": size, "seed": self._seed(chained)}})
        if len(self._memo) < _MEMO_MAX:
            self._memo[text] = out
        return out

    def plain(self, text: str) -> str:
        """Synthetic text as a literal string, for places that must stay strings (JSON values)."""
        n = self._count(text)
        return synth_text(n, self._seed(self._mac(b"plain", text.encode()))) if n else ""

    def name(self, name: str) -> str:
        """An identifier of as many tokens: letter runs from the keyed hash, joined by '_'.

        Letters rather than dictionary words, so that different names never collide.
        """
        if not name:
            return name
        n = max(1, self._count(name))
        digest = self._mac(b"name", name.encode())
        while len(digest) < n * 8:
            digest += self._mac(b"more", digest)
        words = []
        for k in range((n + 1) // 2):
            chunk = digest[k * 8 : k * 8 + 8]
            words.append("".join(chr(ord("a") + b % 26) for b in chunk[: 5 + chunk[7] % 4]))
        return "_".join(words) + ("_" if n % 2 == 0 else "")

    def call_id(self, call_id: str) -> str:
        if not call_id:
            return call_id
        return "tc_" + self._mac(b"call", call_id.encode()).hex()[:20]

    def content(self, value: Any) -> Any:
        if isinstance(value, str):
            return self.text(value)
        if isinstance(value, list):
            out: list[Any] = []
            for part in value:
                new = self.content(part)
                out.extend(new if isinstance(new, list) else [new])
            return out
        if isinstance(value, dict) and "$blob" in value:
            return {"$blob": self.name(str(value["$blob"]))}
        return value  # already synthetic

    # --- structures --------------------------------------------------------------------

    def arguments(self, arguments: str) -> str:
        """Tool-call arguments: JSON text rewritten in place (its layout kept), keys renamed like
        schema properties, string values replaced; text that is not JSON is replaced whole."""
        try:
            orjson.loads(arguments)
        except orjson.JSONDecodeError:
            return self.plain(arguments)

        def swap(match: re.Match[str]) -> str:
            body, colon = match.group(1), match.group(2)
            if colon is not None:
                return f'"{self.name(body)}"{colon}'
            return f'"{self.plain(body)}"'

        return _JSON_STRING.sub(swap, arguments)

    def message(self, msg: Message) -> Message:
        if "$reply" in msg:
            return msg
        if "$blob" in msg:
            return {"$blob": self.name(str(msg["$blob"]))}
        out: Message = {"role": msg.get("role")}
        if "content" in msg:
            out["content"] = self.content(msg["content"]) if msg["content"] is not None else None
        if msg.get("tool_calls"):
            out["tool_calls"] = [
                {
                    "id": self.call_id(str(c.get("id", ""))),
                    "name": self.name(str(c.get("name", ""))),
                    "arguments": self.arguments(str(c.get("arguments", ""))),
                }
                for c in msg["tool_calls"]
            ]
        if "tool_call_id" in msg:
            out["tool_call_id"] = self.call_id(str(msg["tool_call_id"]))
        if isinstance(msg.get("reasoning"), str):
            out["reasoning"] = self.plain(msg["reasoning"])
        return out

    def messages(self, messages: list[Message]) -> list[Message]:
        return [self.message(m) for m in messages]

    def schema(self, obj: Any, key: str | None = None) -> Any:
        """A JSON schema: keywords kept, property names renamed, descriptions and values replaced."""
        if isinstance(obj, dict):
            out: dict[str, Any] = {}
            for k, v in obj.items():
                if k in _SCHEMA_NAMES and isinstance(v, dict):
                    out[k] = {self.name(str(pk)): self.schema(pv) for pk, pv in v.items()}
                elif k == "required" and isinstance(v, list):
                    out[k] = [self.name(x) if isinstance(x, str) else x for x in v]
                elif k == "$ref" and isinstance(v, str):
                    head, _, last = v.rpartition("/")
                    out[k] = f"{head}/{self.name(last)}" if head else self.name(v)
                else:
                    out[k] = self.schema(v, k)
            return out
        if isinstance(obj, list):
            return [self.schema(v, key) for v in obj]
        if isinstance(obj, str):
            if key in _SCHEMA_KEEP:
                return obj
            return self.plain(obj)
        return obj

    def tools(self, tools: Any) -> Any:
        if isinstance(tools, dict) and "$blob" in tools:
            return {"$blob": self.name(str(tools["$blob"]))}
        if not isinstance(tools, list):
            return tools
        out = []
        for t in tools:
            if not isinstance(t, dict):
                out.append(t)
                continue
            fn = t.get("function", t)
            new_fn: dict[str, Any] = {}
            for k, v in fn.items():
                if k == "name":
                    new_fn[k] = self.name(str(v))
                elif k == "description" and isinstance(v, str):
                    new_fn[k] = self.plain(v)
                elif k == "parameters":
                    new_fn[k] = self.schema(v)
                else:
                    new_fn[k] = self.schema(v, k)
            out.append({**t, "function": new_fn} if "function" in t else new_fn)
        return out

    def extra(self, obj: Any, key: str | None = None) -> Any:
        """Request fields passed as is (`params.extra`): keys are API vocabulary; text is replaced."""
        if isinstance(obj, dict):
            return {k: self.extra(v, k) for k, v in obj.items()}
        if isinstance(obj, list):
            return [self.extra(v, key) for v in obj]
        if isinstance(obj, str):
            if key == "type":
                return obj
            if key == "name":
                return self.name(obj)
            return self.plain(obj)
        return obj

    def params(self, params: dict[str, Any]) -> dict[str, Any]:
        out = dict(params)
        for k, v in params.items():
            if isinstance(v, dict) and "$blob" in v:
                out[k] = {"$blob": self.name(str(v["$blob"]))}
            elif k == "tools":
                out[k] = self.tools(v)
            elif k == "extra":
                out[k] = self.extra(v)
        return out

    def reply(self, reply: dict[str, Any] | None) -> dict[str, Any] | None:
        if reply is None:
            return None
        out = dict(reply)
        if isinstance(reply.get("message"), dict):
            out["message"] = self.message(reply["message"])
        if isinstance(reply.get("error"), str):
            out["error"] = self.plain(reply["error"])
        return out

    def blob_value(self, value: Any) -> Any:
        """A blob: tools, a message, or content; which one is told by its shape."""
        if (
            isinstance(value, list)
            and value
            and all(isinstance(t, dict) and ("function" in t) for t in value)
        ):
            return self.tools(value)
        if isinstance(value, dict) and "role" in value:
            return self.message(value)
        if isinstance(value, dict) and "$blob" not in value and "synth" not in value:
            return self.extra(value)
        return self.content(value)

    def labels(self, labels: dict[str, Any]) -> dict[str, Any]:
        """Session labels: the recorder's own vocabulary (`label_source`) kept, other values renamed."""
        return {
            k: self.name(v) if isinstance(v, str) and k != "label_source" else v for k, v in labels.items()
        }


def anonymize_trace(
    src: str | Path, dst: str | Path, key: str, block_tokens: int = BLOCK_TOKENS
) -> dict[str, int]:
    """Write an anonymised copy of trace `src` to `dst`; returns counts of what was rewritten.

    The input is validated first (streaming), then rewritten line by line: the output keeps every
    line, id, delta (`parent`, `keep`, `$reply`), timing and usage of the input.
    """
    src, dst = str(src), str(dst)
    if Path(src).resolve() == Path(dst).resolve():
        raise TraceError(dst, 0, "output would overwrite the input")
    validate(src)
    anon = Anonymizer(key, block_tokens=block_tokens)
    counts = {"sessions": 0, "blobs": 0, "requests": 0, "messages": 0}
    with open(src, "rb") as inp, open(dst, "wb") as out:
        for raw in inp:
            if not raw.strip():
                continue
            obj = orjson.loads(raw)
            kind = obj["kind"]
            if kind == "trace":
                obj = {**obj, "format": FORMAT, "notes": "anonymized with a keyed hash"}
            elif kind == "session":
                counts["sessions"] += 1
                obj = {**obj, "id": anon.name(obj["id"]), "labels": anon.labels(obj.get("labels") or {})}
            elif kind == "blob":
                counts["blobs"] += 1
                obj = {**obj, "id": anon.name(obj["id"]), "value": anon.blob_value(obj["value"])}
            elif kind == "unrecorded":
                pass  # method, path, counts and the recorder's reason: no text of the agent's
            elif kind == "rejected":
                obj = {**obj, "sha256": anon.name(obj["sha256"])}
            else:
                counts["requests"] += 1
                counts["messages"] += len(obj.get("append") or ())
                obj = {
                    **obj,
                    "session": anon.name(obj["session"]),
                    "append": anon.messages(obj.get("append") or []),
                    "params": anon.params(obj.get("params") or {}),
                }
                if obj.get("reply") is not None:
                    obj["reply"] = anon.reply(obj["reply"])
            out.write(orjson.dumps(obj) + b"\n")
    return counts


def run_anonymize(src: str | Path, dst: str | Path, key: str) -> str:
    """`replay anonymize IN OUT --key SECRET`: rewrite into a temporary sibling of OUT, check it,
    rename it to OUT; say what was done."""
    if not key:
        raise UsageError("--key must not be empty: it is what makes the synthetic text unguessable")
    if not Path(src).exists():
        raise UsageError(f"{src} does not exist")
    if Path(src).resolve() == Path(dst).resolve():
        raise TraceError(str(dst), 0, "output would overwrite the input")
    with replacing(Path(dst)) as written:
        counts = anonymize_trace(src, written, key)
        validate(written)
    return (
        f"{dst}: {counts['requests']} requests in {counts['sessions']} sessions anonymized "
        f"({counts['messages']} messages, {counts['blobs']} blobs)"
    )
