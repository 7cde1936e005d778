"""OpenTelemetry GenAI spans (the `gen_ai.*` semantic conventions) to our trace format.

SRC is OTLP JSON as the OpenTelemetry Collector's file exporter writes it (one
`{"resourceSpans": [{"resource", "scopeSpans": [{"spans": [...]}]}]}` a line, `.jsonl`, or one such
object in a `.json` file), the flat span lists inference-perf replays
(`{"spans": [{"span_id", "start_time", "attributes": {...}}]}`), or a folder of them. A span is a
request when its `gen_ai.operation.name` is `chat` (or `text_completion`, `generate_content`, or
its name starts with `chat `) and it carries the prompt: `gen_ai.input.messages` (the current
conventions, `parts` of type text / tool_call / tool_call_response, or OpenAI-shaped `content` and
`tool_calls`), with `gen_ai.system_instructions`, or the older indexed `gen_ai.prompt.N.role` /
`.content` attributes. The reply is `gen_ai.output.messages` (or `gen_ai.completion.0.content`,
`gen_ai.output.text`); `gen_ai.usage.input_tokens`, `.output_tokens` and
`.cache_read.input_tokens` are the usage; `gen_ai.request.max_tokens`, `.temperature`,
`gen_ai.tool.definitions` the params; the provider (`gen_ai.provider.name`, `gen_ai.system`)
picks the API.

A session is `gen_ai.conversation.id` (or `session.id`, `exgentic.session.id`), else the span's
trace id. Requests are sent at the span's start; its end is when the reply had arrived, so `after`
carries the think and tool time to the next request of the session (capped by `--gap-cap`).

Streaming: a `.json` file is first streamed span by span (ijson) into a temporary JSONL beside
OUT, so no document is ever whole in memory; then a first pass reads each line once and keeps, per request span, only its time, session
and where it is (byte offset, span index); the second pass, in time order, re-reads each span's
line (the last few parsed lines are kept) and lets a session go after its last request.

What the format loses: spans record what the instrumentation captured, so a prompt is only as
whole as the instrumentation's capture (content capture is opt-in in the conventions: a span
without messages is no request, and counted as `no_prompt`); tool definitions are kept only
where `gen_ai.tool.definitions` was captured; images and other non-text parts are dropped (counted);
a span's timing is the client's view of the call, not when the server got it.
"""

from __future__ import annotations

import datetime as _dt
import tempfile
from collections import OrderedDict
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import ijson
import orjson

from replay.errors import TraceError, UsageError
from replay.importers.base import ImportOptions, SessionInfo, Step, progress_bar, tree_size, write_trace
from replay.trace.model import Message

_LLM_OPS = {"chat", "text_completion", "generate_content"}
_SESSION_KEYS = ("gen_ai.conversation.id", "session.id", "exgentic.session.id")


def _value(v: Any) -> Any:
    """An OTLP `AnyValue` as a plain value."""
    if not isinstance(v, dict):
        return v
    for key in ("stringValue", "boolValue", "doubleValue"):
        if key in v:
            return v[key]
    if "intValue" in v:
        try:
            return int(v["intValue"])
        except (TypeError, ValueError):
            return None
    if "arrayValue" in v:
        return [_value(x) for x in (v["arrayValue"] or {}).get("values") or ()]
    if "kvlistValue" in v:
        return _attrs((v["kvlistValue"] or {}).get("values") or ())
    return None


def _attrs(raw: Any) -> dict[str, Any]:
    if isinstance(raw, dict):
        return raw
    out: dict[str, Any] = {}
    if isinstance(raw, list):
        for kv in raw:
            if isinstance(kv, dict) and isinstance(kv.get("key"), str):
                out[kv["key"]] = _value(kv.get("value"))
    return out


def _time(span: dict[str, Any], nano: str, iso: str) -> float | None:
    if span.get(nano) is not None:
        try:
            return int(span[nano]) / 1e9
        except (TypeError, ValueError):
            return None
    stamp = span.get(iso)
    if isinstance(stamp, str):
        try:
            when = _dt.datetime.fromisoformat(stamp.replace("Z", "+00:00"))
        except ValueError:
            return None
        if when.tzinfo is None:
            when = when.replace(tzinfo=_dt.UTC)
        return when.timestamp()
    return None


def _spans(obj: Any) -> Iterator[tuple[dict[str, Any], dict[str, Any]]]:
    """(span, resource attributes) of one OTLP or flat object, in file order."""
    if not isinstance(obj, dict):
        return
    if isinstance(obj.get("resourceSpans"), list):
        for rs in obj["resourceSpans"]:
            if not isinstance(rs, dict):
                continue
            resource = _attrs((rs.get("resource") or {}).get("attributes"))
            for ss in rs.get("scopeSpans") or rs.get("instrumentationLibrarySpans") or ():
                if isinstance(ss, dict):
                    for span in ss.get("spans") or ():
                        if isinstance(span, dict):
                            yield span, resource
    elif isinstance(obj.get("spans"), list):
        for span in obj["spans"]:
            if isinstance(span, dict):
                yield span, _attrs(span.get("resource_attributes"))


def _is_request(span: dict[str, Any], attrs: dict[str, Any]) -> bool:
    op = attrs.get("gen_ai.operation.name")
    name = str(span.get("name") or "")
    return op in _LLM_OPS or (op is None and name.startswith("chat "))


def _text(part: Any) -> str | None:
    if isinstance(part, str):
        return part
    if isinstance(part, dict) and part.get("type") in (None, "text", "input_text", "output_text"):
        text = part.get("content", part.get("text"))
        return text if isinstance(text, str) else None
    return None


def _args(value: Any) -> str:
    if isinstance(value, str):
        return value
    return orjson.dumps(value if value is not None else {}).decode()


def _message(m: Any, dropped: list[int]) -> list[Message]:
    """A conventions message (`parts`) or an OpenAI-shaped one as our messages (a tool message per
    tool result part)."""
    if not isinstance(m, dict):
        raise ValueError("a message must be an object")
    role = m.get("role")
    if role not in ("system", "developer", "user", "assistant", "tool"):
        raise ValueError(f"unknown role {role!r}")
    out: list[Message] = []
    texts: list[str] = []
    calls: list[dict[str, Any]] = []
    if isinstance(m.get("parts"), list):
        for p in m["parts"]:
            kind = p.get("type") if isinstance(p, dict) else None
            if kind == "tool_call":
                calls.append(
                    {
                        "id": str(p.get("id") or ""),
                        "name": str(p.get("name") or ""),
                        "arguments": _args(p.get("arguments")),
                    }
                )
            elif kind == "tool_call_response":
                resp = p.get("response", p.get("result"))
                out.append(
                    {
                        "role": "tool",
                        "tool_call_id": str(p.get("id") or ""),
                        "content": resp if isinstance(resp, str) else _args(resp),
                    }
                )
            elif (t := _text(p)) is not None:
                texts.append(t)
            else:
                dropped[0] += 1
    else:
        content = m.get("content")
        if isinstance(content, list):
            for p in content:
                t = _text(p)
                if t is None:
                    dropped[0] += 1
                else:
                    texts.append(t)
        elif isinstance(content, str):
            texts.append(content)
        for c in m.get("tool_calls") or ():
            if isinstance(c, dict):
                fn = c.get("function") if isinstance(c.get("function"), dict) else c
                calls.append(
                    {
                        "id": str(c.get("id") or ""),
                        "name": str(fn.get("name") or ""),
                        "arguments": _args(fn.get("arguments")),
                    }
                )
    if role == "tool" and not m.get("parts"):
        return [
            {
                "role": "tool",
                "tool_call_id": str(m.get("tool_call_id") or m.get("id") or ""),
                "content": "\n".join(texts),
            }
        ]
    if texts or calls or not out:
        msg: Message = {"role": role, "content": "\n".join(texts)}
        if role == "tool":
            msg["tool_call_id"] = str(m.get("tool_call_id") or m.get("id") or "")
        if calls:
            msg["tool_calls"] = calls
        out.insert(0, msg)
    return out


def _tool(t: Any) -> Any:
    """A conventions tool definition (`{"type": "function", "name", "parameters"}`) in the OpenAI
    chat shape the trace keeps; one already in that shape as it is."""
    if isinstance(t, dict) and "function" not in t and "name" in t:
        fn = {k: t[k] for k in ("name", "description", "parameters") if k in t}
        return {"type": "function", "function": fn}
    return t


def _json_attr(attrs: dict[str, Any], key: str) -> Any:
    raw = attrs.get(key)
    if isinstance(raw, str):
        try:
            return orjson.loads(raw)
        except orjson.JSONDecodeError:
            raise ValueError(f"{key} is not JSON") from None
    return raw


def prompt_of(attrs: dict[str, Any], dropped: list[int]) -> list[Message]:
    """The messages a span says were sent (empty when it captured none)."""
    messages: list[Message] = []
    system = _json_attr(attrs, "gen_ai.system_instructions")
    if system:
        parts = system if isinstance(system, list) else [system]
        text = "\n".join(t for p in parts if (t := _text(p)) is not None)
        messages.append({"role": "system", "content": text})
    raw = _json_attr(attrs, "gen_ai.input.messages")
    if raw is not None:
        if not isinstance(raw, list):
            raise ValueError("gen_ai.input.messages must be a list")
        for m in raw:
            messages.extend(_message(m, dropped))
        return messages
    i = 0
    while f"gen_ai.prompt.{i}.role" in attrs:  # the older indexed attributes (OpenLLMetry)
        m = {
            "role": attrs[f"gen_ai.prompt.{i}.role"],
            "content": attrs.get(f"gen_ai.prompt.{i}.content") or "",
        }
        messages.extend(_message(m, dropped))
        i += 1
    return messages


def reply_of(attrs: dict[str, Any], dropped: list[int]) -> Message | None:
    out = _json_attr(attrs, "gen_ai.output.messages")
    if isinstance(out, list):
        for m in out:
            if isinstance(m, dict) and m.get("role", "assistant") == "assistant":
                got = _message({**m, "role": "assistant"}, dropped)
                return got[0] if got else None
    for key in ("gen_ai.completion.0.content", "gen_ai.output.text", "gen_ai.completion"):
        if isinstance(attrs.get(key), str):
            return {"role": "assistant", "content": attrs[key]}
    return None


def _int(attrs: dict[str, Any], *keys: str) -> int | None:
    for key in keys:
        v = attrs.get(key)
        if isinstance(v, (int, float)) and not isinstance(v, bool) and v >= 0:
            return int(v)
    return None


@dataclass(slots=True)
class _Entry:
    t: float
    end: float
    session: str
    path: Path
    offset: int
    line: int
    index: int  # the span's place among the request spans of its line


def _files(src: Path) -> list[Path]:
    if src.is_dir():
        found = sorted(p for p in src.rglob("*") if p.suffix in (".json", ".jsonl") and p.is_file())
        if not found:
            raise UsageError(f"{src}: no .json or .jsonl OTLP files in this folder")
        return found
    return [src]


def _lines(path: Path, advance: Any = None) -> Iterator[tuple[int, int, bytes]]:
    """(line number, byte offset, raw) of each non-empty line; a `.json` file is one object."""
    with open(path, "rb") as handle:
        if path.suffix == ".json":
            data = handle.read()
            if advance:
                advance(len(data))
            yield 1, 0, data
            return
        offset = 0
        for n, raw in enumerate(handle, 1):
            if advance:
                advance(len(raw))
            if raw.strip():
                yield n, offset, raw
            offset += len(raw)


def _where(path: Path, line: int) -> tuple[str, int]:
    """The file and line an error names: a spilled `.json` file is its original, at line 1."""
    original = _NAMES.get(path)
    return (str(path), line) if original is None else (str(original), 1)


def _parse(path: Path, line: int, raw: bytes) -> Any:
    try:
        obj = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise TraceError(*_where(path, line), f"bad JSON: {exc}") from None
    if not isinstance(obj, dict) or not ("resourceSpans" in obj or "spans" in obj):
        raise TraceError(*_where(path, line), "not OTLP JSON: no 'resourceSpans' (or 'spans') list")
    return obj


def _request_spans(
    path: Path, line: int, obj: Any
) -> Iterator[tuple[dict[str, Any], dict[str, Any], dict[str, Any]]]:
    for span, resource in _spans(obj):
        attrs = _attrs(span.get("attributes"))
        if _is_request(span, attrs):
            yield span, attrs, resource


def _session_of(span: dict[str, Any], attrs: dict[str, Any]) -> str:
    for key in _SESSION_KEYS:
        if attrs.get(key) not in (None, ""):
            return str(attrs[key])
    return str(span.get("traceId") or span.get("trace_id") or "trace")


def _spill(path: Path, spill: Path) -> None:
    """A `.json` file streamed span by span (ijson: the document is never whole in memory) into
    JSONL, one span a line, so the two passes read it as they read the collector's files."""
    with open(path, "rb") as handle:
        head = handle.read(1 << 16)
    prefix = "resourceSpans.item.scopeSpans.item.spans.item" if b'"resourceSpans"' in head else "spans.item"
    try:
        with open(path, "rb") as handle, open(spill, "wb") as sink:
            for span in ijson.items(handle, prefix, use_float=True):
                sink.write(orjson.dumps({"spans": [span]}) + b"\n")
    except (ijson.JSONError, ijson.IncompleteJSONError) as exc:
        raise TraceError(str(path), 1, f"bad JSON: {exc}") from None
    except TypeError as exc:  # a value orjson cannot write (an integer beyond 64 bits)
        raise TraceError(str(path), 1, f"bad value: {exc}") from None


def import_otel(src: str | Path, out: str | Path, options: ImportOptions | None = None) -> dict[str, int]:
    """Convert OTLP JSON GenAI spans at `src` into a trace at `out` (see the module docstring)."""
    options = options or ImportOptions()
    src = Path(src)
    with tempfile.TemporaryDirectory(prefix="otel-", dir=Path(out).parent) as tmp:
        files = []
        for k, path in enumerate(_files(src)):
            if path.suffix == ".json":
                _parse_head(path)
                spill = Path(tmp) / f"{k}.jsonl"
                _spill(path, spill)
                _NAMES[spill] = path
                files.append(spill)
            else:
                files.append(path)
        try:
            return _import(src, files, Path(out), options)
        finally:
            for f in files:
                _NAMES.pop(f, None)


# a spilled `.json` file -> the file the user gave (errors name it, at line 1: one document)
_NAMES: dict[Path, Path] = {}


def _parse_head(path: Path) -> None:
    """A `.json` file must be one OTLP or flat span document: refuse anything else at once."""
    with open(path, "rb") as handle:
        head = handle.read(1 << 16).lstrip()
    if not head.startswith(b"{") or not (b'"resourceSpans"' in head or b'"spans"' in head):
        try:
            obj = orjson.loads(path.read_bytes()) if len(head) < (1 << 16) else None
        except orjson.JSONDecodeError as exc:
            raise TraceError(str(path), 1, f"bad JSON: {exc}") from None
        if obj is None or not isinstance(obj, dict) or not ("resourceSpans" in obj or "spans" in obj):
            raise TraceError(str(path), 1, "not OTLP JSON: no 'resourceSpans' (or 'spans') list")


def _import(src: Path, files: list[Path], out: Path, options: ImportOptions) -> dict[str, int]:
    entries: list[_Entry] = []
    extra = {"spans": 0, "no_prompt": 0, "dropped_parts": 0}
    with progress_bar(2 * tree_size(files), "otel", options) as advance:
        for path in files:
            for n, offset, raw in _lines(path, advance):
                obj = _parse(path, n, raw)
                for k, (span, attrs, _res) in enumerate(_request_spans(path, n, obj)):
                    t = _time(span, "startTimeUnixNano", "start_time")
                    if t is None:
                        raise TraceError(
                            str(path), n, f"span {span.get('spanId') or span.get('span_id')!r}: no start time"
                        )
                    end = _time(span, "endTimeUnixNano", "end_time")
                    entries.append(_Entry(t, max(t, end or t), _session_of(span, attrs), path, offset, n, k))
        entries.sort(key=lambda e: (e.t, str(e.path), e.line, e.index))
        last: dict[str, int] = {}
        for i, e in enumerate(entries):
            last[e.session] = i
        counts = write_trace(
            _steps(entries, last, extra, advance, options),
            Path(out),
            "import:otel",
            f"imported from OpenTelemetry GenAI spans {src.name}",
            options,
        )
    return {**extra, **counts}


def _steps(
    entries: list[_Entry], last: dict[str, int], extra: dict[str, int], advance: Any, options: ImportOptions
) -> Iterator[Step]:
    cache: OrderedDict[tuple[Path, int], list[tuple[dict[str, Any], dict[str, Any], dict[str, Any]]]] = (
        OrderedDict()
    )
    infos: dict[str, SessionInfo] = {}
    shift = 0.0
    prev_t: float | None = None
    cap = options.gap_cap
    for i, e in enumerate(entries):
        key = (e.path, e.offset)
        spans = cache.get(key)
        if spans is None:
            with open(e.path, "rb") as handle:
                handle.seek(e.offset)
                raw = handle.read() if e.path.suffix == ".json" else handle.readline()
            advance(len(raw))
            spans = list(_request_spans(e.path, e.line, _parse(e.path, e.line, raw)))
            cache[key] = spans
            while len(cache) > 4:
                cache.popitem(last=False)
        else:
            cache.move_to_end(key)
        span, attrs, resource = spans[e.index]
        extra["spans"] += 1
        if cap is not None and prev_t is not None and e.t - prev_t > cap:
            shift += e.t - prev_t - cap
        prev_t = e.t
        where = f"span {span.get('spanId') or span.get('span_id')!r}"
        dropped = [0]
        try:
            messages = prompt_of(attrs, dropped)
            reply = reply_of(attrs, dropped)
        except ValueError as exc:
            raise TraceError(*_where(e.path, e.line), f"{where}: {exc}") from None
        extra["dropped_parts"] += dropped[0]
        ends = ()
        info = infos.get(e.session)
        if info is None:
            provider = str(attrs.get("gen_ai.provider.name") or attrs.get("gen_ai.system") or "")
            info = infos[e.session] = SessionInfo(
                key=e.session,
                api="anthropic" if "anthropic" in provider.lower() else "openai",
                model=str(
                    attrs.get("gen_ai.request.model") or attrs.get("gen_ai.response.model") or "default"
                ),
                labels={"source": "otel", "service": str(resource.get("service.name") or "")},
                agent_ids=(e.session,),
            )
        if last[e.session] == i:
            ends = (infos.pop(e.session),)
        if not messages:
            extra["no_prompt"] += 1
            continue
        params: dict[str, Any] = {"stream": True}
        max_tokens = _int(attrs, "gen_ai.request.max_tokens")
        if max_tokens is not None:
            params["max_tokens"] = max_tokens
        if isinstance(attrs.get("gen_ai.request.temperature"), (int, float)):
            params["temperature"] = attrs["gen_ai.request.temperature"]
        try:
            tools = _json_attr(attrs, "gen_ai.tool.definitions")
        except ValueError as exc:
            raise TraceError(*_where(e.path, e.line), f"{where}: {exc}") from None
        if isinstance(tools, list) and tools:
            params["tools"] = [_tool(t) for t in tools]
        prompt = _int(attrs, "gen_ai.usage.input_tokens", "gen_ai.usage.prompt_tokens")
        output = _int(attrs, "gen_ai.usage.output_tokens", "gen_ai.usage.completion_tokens")
        cached = _int(attrs, "gen_ai.usage.cache_read.input_tokens", "gen_ai.usage.cache_read_input_tokens")
        usage = {
            k: v
            for k, v in (("prompt_tokens", prompt), ("cached_tokens", cached), ("output_tokens", output))
            if v is not None
        }
        finish = attrs.get("gen_ai.response.finish_reasons")
        yield Step(
            session=info,
            t=e.t - shift,
            messages=messages,
            reply=reply,
            finish=str(finish[0]) if isinstance(finish, list) and finish else None,
            output_tokens=output,
            usage=usage or None,
            done=e.end - shift,
            params=params,
            ends=ends,
        )
