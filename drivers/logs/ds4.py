"""ds4-server log lines -> typed numeric events.

Lines look like `MMDD HH:MM:SS ds4-server: <message>` (local time, no year). The message grammar
is in reference/ds4-server.md section 3. Each line kind is recognised by a fixed phrase, then every
field is looked up on its own (`gen=`, `finish=`, ...) so optional flags between fields
(`TOOLS`, `RESPPROTO`, `THINKING`, `vision=`) never break a match.

Nothing free-form leaves this module: file paths (`file=`), error messages (`error="..."`), tool
ids and names, hosts, cache directories are never copied into an event. Names that do come out
(`reason`, `key`, `kind`, flags) are checked against closed vocabularies; anything unknown becomes
`other` and is counted.
"""

from __future__ import annotations

import datetime as dt
import functools
import re
from collections.abc import Iterable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import ClassVar

from drivers.logs.base import (
    ParseStats,
    SubstringCounter,
    Vocab,
    field_float,
    field_int,
    int_field,
    strip_ansi,
    word_field,
)

# ---------------------------------------------------------------------------------------------
# Closed vocabularies (the only names that may leave the parser)

FLAGS = frozenset({"RESPPROTO", "TOOLS", "THINKING", "DSML_START", "DSML_END"})
MISS_REASONS = Vocab(
    "token-mismatch",
    "incoming-prompt-shorter-than-live-checkpoint",
    "no-live-checkpoint",
    "live-prefix-match",
)
STORE_REASONS = Vocab("cold", "continued", "evict", "shutdown")
KEY_KINDS = Vocab("token-text", "responses-visible", "thinking-visible", "visible-transcript", "tool-visible")
EVICT_REASONS = Vocab("disk-cache-full")
FINISH_REASONS = Vocab("stop", "length", "tool_calls", "error")
SKIP_REASONS = Vocab("too-large", "tool-map-overflow", "budget", "staging-failed")
CONT_MATCHES = Vocab("visible-prefix", "tool-output-ids")
CANCEL_REASONS = Vocab("shutdown", "client-gone")
CROSS_QUANT = Vocab("accept", "reject")
BACKENDS = Vocab("metal", "cuda", "cpu", "vulkan", "rocm", "sim")

# ---------------------------------------------------------------------------------------------
# Events


@dataclass(frozen=True, slots=True, kw_only=True)
class Event:
    """Base of every ds4 event: when (seconds since Jan 1 of the log's first year) and which line."""

    kind: ClassVar[str] = "event"
    t: float | None
    line: int

    def to_dict(self) -> dict[str, object]:
        d: dict[str, object] = {"kind": self.kind}
        for k, v in asdict(self).items():
            d[k] = sorted(v) if isinstance(v, frozenset) else v
        return d


@dataclass(frozen=True, slots=True, kw_only=True)
class SpanEvent(Event):
    """A per-request line carrying `ctx=A..B:C`: A cached, B effective prompt, C to prefill."""

    api: str  # "chat" | "completion"
    cached: int
    prompt: int
    todo: int
    flags: frozenset[str]


@dataclass(frozen=True, slots=True, kw_only=True)
class PromptStart(SpanEvent):
    kind: ClassVar[str] = "prompt_start"


@dataclass(frozen=True, slots=True, kw_only=True)
class PrefillProgress(SpanEvent):
    kind: ClassVar[str] = "prefill_progress"
    phase: str  # "prefill" | "tool-rebuild"
    done: int
    total: int
    chunk_tps: float | None
    avg_tps: float | None
    seconds: float | None


@dataclass(frozen=True, slots=True, kw_only=True)
class PromptDone(SpanEvent):
    kind: ClassVar[str] = "prompt_done"
    seconds: float | None


@dataclass(frozen=True, slots=True, kw_only=True)
class Decoding(SpanEvent):
    """Decode progress. Here the span is absolute positions: cached=start, prompt=end."""

    kind: ClassVar[str] = "decoding"
    gen: int | None
    chunk_tps: float | None
    avg_tps: float | None
    seconds: float | None


@dataclass(frozen=True, slots=True, kw_only=True)
class Finish(SpanEvent):
    """Last line of every request; the error text, if any, is never carried, only the flag."""

    kind: ClassVar[str] = "finish"
    gen: int | None
    reason: str | None
    seconds: float | None
    error: bool


@dataclass(frozen=True, slots=True, kw_only=True)
class RequestAbort(SpanEvent):
    """Client went away or a stream write failed (`stream closed during prefill`, ...)."""

    kind: ClassVar[str] = "request_abort"
    cause: str  # closed: "closed-during-prefill" | "final-stream-failed" | "prefill-failed" | "stream-start-failed"


@dataclass(frozen=True, slots=True, kw_only=True)
class PrefillCancelled(Event):
    kind: ClassVar[str] = "prefill_cancelled"
    cached: int | None
    prompt: int | None
    todo: int | None
    reason: str | None


@dataclass(frozen=True, slots=True, kw_only=True)
class ToolCalls(Event):
    """Tool calls emitted; ids and names are private and stay in the log."""

    kind: ClassVar[str] = "tool_calls"
    cached: int | None
    prompt: int | None
    todo: int | None
    n: int | None
    raw: int | None
    resp: bool


@dataclass(frozen=True, slots=True, kw_only=True)
class LiveMiss(Event):
    kind: ClassVar[str] = "live_miss"
    live: int | None
    prompt: int | None
    common: int | None
    vision: int | None
    reason: str | None
    resp: bool


@dataclass(frozen=True, slots=True, kw_only=True)
class Continuation(Event):
    """A live continuation bound by a non-token path (`responses`, `anthropic`, `thinking`)."""

    kind: ClassVar[str] = "continuation"
    via: str  # "responses" | "anthropic" | "thinking"
    match: str | None
    ids: int | None
    cached: int | None
    prompt: int | None


@dataclass(frozen=True, slots=True, kw_only=True)
class DiskHit(Event):
    """A disk checkpoint restore; the file path is never carried."""

    kind: ClassVar[str] = "disk_hit"
    tokens: int | None
    text_bytes: int | None
    quant: int | None
    key: str | None
    load_ms: float | None
    consumed: bool
    resp: bool


@dataclass(frozen=True, slots=True, kw_only=True)
class Store(Event):
    kind: ClassVar[str] = "store"
    reason: str | None
    tokens: int | None
    trimmed: int | None
    key: str | None
    mib: float | None
    ms: float | None


@dataclass(frozen=True, slots=True, kw_only=True)
class StoreSkipped(Event):
    kind: ClassVar[str] = "store_skipped"
    tokens: int | None
    reason: str | None


@dataclass(frozen=True, slots=True, kw_only=True)
class Eviction(Event):
    kind: ClassVar[str] = "eviction"
    reason: str | None
    tokens: int | None
    hits: int | None
    mib: float | None


@dataclass(frozen=True, slots=True, kw_only=True)
class DiskError(Event):
    kind: ClassVar[str] = "disk_error"
    cause: str  # closed: store-failed | create-failed | load-failed | discarded | replaced-incompatible


@dataclass(frozen=True, slots=True, kw_only=True)
class DiskCacheConfig(Event):
    """`KV disk cache DIR (budget=..., ...)`: the settings in force; DIR is not carried."""

    kind: ClassVar[str] = "disk_cache_config"
    budget_mib: int | None
    cross_quant: str | None
    min_tokens: int | None
    cold_max: int | None
    continued: int | None
    trim: int | None
    align: int | None
    hit_half_life_s: int | None


@dataclass(frozen=True, slots=True, kw_only=True)
class ContextBuffers(Event):
    kind: ClassVar[str] = "context_buffers"
    mib: float | None
    ctx: int | None
    backend: str | None
    prefill_chunk: int | None
    raw_kv_rows: int | None
    compressed_kv_rows: int | None


@dataclass(frozen=True, slots=True, kw_only=True)
class ResidentSessions(Event):
    kind: ClassVar[str] = "resident_sessions"
    sessions: int | None
    gib: float | None


@dataclass(frozen=True, slots=True, kw_only=True)
class BatchedMode(Event):
    kind: ClassVar[str] = "batched_mode"
    resident_sessions: int | None
    prefill_quantum: int | None
    mixed_prefill_quantum: int | None
    decode_coalesce_us: int | None


@dataclass(frozen=True, slots=True, kw_only=True)
class Listening(Event):
    """Readiness; only the port is carried (the host is text from the log)."""

    kind: ClassVar[str] = "listening"
    port: int | None


@dataclass(frozen=True, slots=True, kw_only=True)
class ListenFailed(Event):
    kind: ClassVar[str] = "listen_failed"
    port: int | None


@dataclass(frozen=True, slots=True, kw_only=True)
class ShutdownRequested(Event):
    kind: ClassVar[str] = "shutdown_requested"


@dataclass(frozen=True, slots=True, kw_only=True)
class ShutdownPersist(Event):
    kind: ClassVar[str] = "shutdown_persist"
    slot: int | None
    tokens: int | None


@dataclass(frozen=True, slots=True, kw_only=True)
class DecodeBatch(Event):
    kind: ClassVar[str] = "decode_batch"
    count: int | None
    ms: float | None
    ok: bool


STARTUP_KINDS = (ContextBuffers, DiskCacheConfig, ResidentSessions, BatchedMode, Listening, ListenFailed)
"""Events a server prints while starting; a run of them marks a (re)start of the process."""

# ---------------------------------------------------------------------------------------------
# Timestamps


def seconds_of_year(month: int, day: int, hh: int, mm: int, ss: int, *, year: int | None = None) -> int:
    """Seconds since Jan 1 00:00:00 for a year-less `MMDD HH:MM:SS` stamp.

    Without a year the calendar has Feb 29, so a leap-day stamp parses and Dec 31 -> Jan 1 is one
    second apart after the wrap; the price is a phantom day between Feb 28 and Mar 1 in a
    non-leap year. Pass `year` to be exact.
    """
    return _day_index(month, day, 2000 if year is None else year) * 86400 + hh * 3600 + mm * 60 + ss


@functools.lru_cache(maxsize=1024)
def _day_index(month: int, day: int, year: int) -> int:
    """Days since Jan 1 (2000, the default, is a leap year); cached, as every line asks."""
    return (dt.date(year, month, day) - dt.date(year, 1, 1)).days


def _year_seconds(year: int | None) -> int:
    if year is None:
        return 366 * 86400
    return (dt.date(year + 1, 1, 1) - dt.date(year, 1, 1)).days * 86400


_WRAP_BACKSTEP = 180 * 86400
"""A stamp this far before the previous one means the year turned (Dec -> Jan), not a clock step."""


class _Clock:
    """Turns year-less stamps into a monotone-ish timeline across a Dec -> Jan wrap."""

    def __init__(self, year: int | None) -> None:
        self._year = year
        self._offset = 0
        self._last_raw: int | None = None

    def stamp(self, month: int, day: int, hh: int, mm: int, ss: int) -> float | None:
        try:
            raw = seconds_of_year(month, day, hh, mm, ss, year=self._year)
        except ValueError:
            return None
        if self._last_raw is not None and raw < self._last_raw - _WRAP_BACKSTEP:
            self._offset += _year_seconds(self._year)
            if self._year is not None:
                self._year += 1
                raw = seconds_of_year(month, day, hh, mm, ss, year=self._year)
        self._last_raw = raw
        return float(raw + self._offset)


# ---------------------------------------------------------------------------------------------
# Line grammar

_PREFIX = re.compile(
    r"(?:^|\s)(?:(?P<mo>\d\d)(?P<dd>\d\d) (?P<h>\d\d):(?P<m>\d\d):(?P<s>\d\d) )?ds4-server: (?P<msg>.*)$"
)
_ENGINE = re.compile(r"^\s*ds4:")
_SPAN_HEAD = re.compile(r"^(chat|completion) ctx=(\d+)\.\.(\d+):(\d+)(?=\s|$)")
_SPAN_ANY = re.compile(r"ctx=(\d+)\.\.(\d+):(\d+)")
_TRAILING_SECONDS = re.compile(r"\s(\d+(?:\.\d+)?)s\s*$")
_PROGRESS = re.compile(r"\schunk (\d+)/(\d+) \(")
_FLAG_TOKEN = re.compile(r"^[A-Z][A-Z_]*$")
_FINISH_REASON = re.compile(r"\sfinish=([^\s\"]+)")
_CHUNK_TPS = re.compile(r"\schunk=(\d+(?:\.\d+)?) t/s")
_AVG_TPS = re.compile(r"\savg=(\d+(?:\.\d+)?) t/s")
_SIZE_MIB = re.compile(r"(?:^|\s)size=(\d+(?:\.\d+)?) MiB")
_SAVE_MS = re.compile(r"(?:^|\s)save=(\d+(?:\.\d+)?) ms")
_LOAD_MS = re.compile(r"(?:^|\s)load=(\d+(?:\.\d+)?) ms")
_BUDGET = re.compile(r"(?:^|[\s(,])budget=(\d+) MiB")
_HALF_LIFE = re.compile(r"(?:^|[\s(,])hit_half_life=(\d+)s")
_TAIL_PAREN = re.compile(r"\(([^()]*)\)\s*$")
_CTXBUF_MIB = re.compile(r"^context buffers (\d+(?:\.\d+)?) MiB")
_RESIDENT = re.compile(r"^(\d+) resident sessions request at least (\d+(?:\.\d+)?) GiB")
_PORT_END = re.compile(r":(\d+)/?\s*$")
_LISTEN_FAIL_PORT = re.compile(r"^failed to listen on \S*?:(\d+)(?::|\s|$)")
_ELAPSED_MS = re.compile(r"(?:^|\s)elapsed=(\d+(?:\.\d+)?) ms")
_STATUS = re.compile(r"(?:^|\s)status=(\w+)")
_RAW = re.compile(r"\sraw_(?:dsml|tool_text)=(\d+)")

_F = {
    name: int_field(name)
    for name in (
        "live",
        "prompt",
        "common",
        "tokens",
        "trimmed",
        "text",
        "quant",
        "hits",
        "gen",
        "min",
        "cold_max",
        "continued",
        "trim",
        "align",
        "ctx",
        "prefill_chunk",
        "raw_kv_rows",
        "compressed_kv_rows",
        "resident_sessions",
        "prefill_quantum",
        "mixed_prefill_quantum",
        "decode_coalesce_us",
        "ids",
        "cached",
        "n",
        "slot",
        "count",
    )
}
_W = {name: word_field(name) for name in ("reason", "key", "vision", "match", "cross-quant", "backend")}

_IGNORED_PREFIXES = (
    "thinking live checkpoint remembered",
    "tool checkpoint ",
    "MTP speculative decoding is disabled",
    "tracing session to",
    "dropping queued request",
    "another ds4 process",
)

_CROSS_CHECKS = (
    ("finish", " finish="),
    ("store", "kv cache stored "),
    ("live_miss", "live kv cache miss"),
    ("disk_hit", "kv cache hit "),
    ("eviction", "kv cache evicted "),
    ("prompt_start", " prompt start"),
    ("prompt_done", " prompt done "),
    ("disk_cache_config", "KV disk cache "),
    ("listening", "ds4-server: listening on "),
)


def _flags(head: str, stats: ParseStats) -> frozenset[str]:
    """Upper-case tokens of a request line; unknown ones are counted, never emitted."""
    found = set()
    for tok in head.split():
        if _FLAG_TOKEN.match(tok):
            if tok in FLAGS:
                found.add(tok)
            else:
                stats.unknown_values += 1
    return frozenset(found)


def _vision(msg: str) -> int | None:
    m = _W["vision"].search(msg)
    if not m:
        return None
    v = m.group(1).lower()
    if v.isdigit():
        return int(v)
    return {"yes": 1, "true": 1, "on": 1, "no": 0, "false": 0, "off": 0}.get(v)


class Ds4Parser:
    """Feeds lines one at a time (for tailing a live log); `finish()` closes the statistics."""

    def __init__(self, *, year: int | None = None) -> None:
        self.stats = ParseStats()
        self._clock = _Clock(year)
        self._t: float | None = None
        self._counter = SubstringCounter(_CROSS_CHECKS)
        self._n = 0

    def feed(self, raw_line: str) -> Event | None:
        self._n += 1
        st = self.stats
        st.lines += 1
        line = strip_ansi(raw_line)
        if not line.strip():
            st.blank += 1
            return None
        self._counter.observe(line)
        m = _PREFIX.search(line)
        if m is None:
            if _ENGINE.match(line):
                st.known_ignored += 1
            else:
                st.unrecognised += 1
            return None
        if m.group("mo") is not None:
            t = self._clock.stamp(*(int(m.group(g)) for g in ("mo", "dd", "h", "m", "s")))
            if t is not None:
                self._t = t
        msg = m.group("msg").strip()
        ev = self._message(msg)
        if ev is None:
            if msg.startswith(_IGNORED_PREFIXES):
                st.known_ignored += 1
            else:
                st.unrecognised += 1
            return None
        st.recognised += 1
        st.by_kind[ev.kind] += 1
        return ev

    def finish(self) -> ParseStats:
        self.stats.checks = self._counter.checks(self.stats.by_kind)
        return self.stats

    # -- dispatch ------------------------------------------------------------------------------

    def _base(self) -> dict[str, object]:
        return {"t": self._t, "line": self._n}

    def _message(self, msg: str) -> Event | None:
        if _SPAN_HEAD.match(msg):
            return self._span_line(msg)
        if msg.startswith("live kv cache miss"):
            return self._live_miss(msg)
        if msg.startswith("kv cache "):
            return self._kv_line(msg)
        if msg.startswith("KV disk cache "):
            return self._disk_config(msg)
        if msg.startswith(
            ("responses live continuation", "anthropic live continuation", "thinking live continuation")
        ):
            return self._continuation(msg)
        if msg.startswith("tool calls "):
            return self._tool_calls(msg)
        if msg.startswith("prefill cancelled"):
            c, p, d = _span_numbers(msg)
            return PrefillCancelled(
                **self._base(),
                cached=c,
                prompt=p,
                todo=d,
                reason=CANCEL_REASONS(_word("reason", msg), self.stats),
            )
        return self._process_line(msg)

    def _span_line(self, msg: str) -> Event | None:
        m = _SPAN_HEAD.match(msg)
        assert m is not None
        api, cached, prompt, todo = m.group(1), int(m.group(2)), int(m.group(3)), int(m.group(4))
        # Cut free text away before looking at fields: the error message and anything after ": ".
        err_at = msg.find(' error="')
        head = msg if err_at < 0 else msg[:err_at]
        head = head.split(": ", 1)[0]
        body = head[m.end() :]
        flags = _flags(body, self.stats)
        common = {
            **self._base(),
            "api": api,
            "cached": cached,
            "prompt": prompt,
            "todo": todo,
            "flags": flags,
        }
        secs = _TRAILING_SECONDS.search(msg)
        seconds = float(secs.group(1)) if secs else None
        fin = _FINISH_REASON.search(body)
        if fin is not None:
            return Finish(
                **common,
                gen=field_int(_F["gen"], body),
                reason=FINISH_REASONS(fin.group(1), self.stats),
                seconds=seconds,
                error=err_at >= 0,
            )
        if body.rstrip().endswith(" prompt start"):
            return PromptStart(**common)
        if " prompt done " in body + " ":
            return PromptDone(**common, seconds=seconds)
        if " decoding " in body + " ":
            return Decoding(
                **common,
                gen=field_int(_F["gen"], body),
                chunk_tps=field_float(_CHUNK_TPS, body),
                avg_tps=field_float(_AVG_TPS, body),
                seconds=seconds,
            )
        prog = _PROGRESS.search(body)
        if prog is not None:
            return PrefillProgress(
                **common,
                phase="tool-rebuild" if " tool checkpoint rebuild " in body else "prefill",
                done=int(prog.group(1)),
                total=int(prog.group(2)),
                chunk_tps=field_float(_CHUNK_TPS, body),
                avg_tps=field_float(_AVG_TPS, body),
                seconds=seconds,
            )
        for phrase, cause in (
            ("stream closed during prefill", "closed-during-prefill"),
            ("final stream failed", "final-stream-failed"),
            ("prefill failed after stream closed", "prefill-failed"),
            ("stream start failed", "stream-start-failed"),
            ("role chunk failed", "stream-start-failed"),
            ("created event failed", "stream-start-failed"),
        ):
            if phrase in head:
                return RequestAbort(**common, cause=cause)
        return None

    def _live_miss(self, msg: str) -> LiveMiss:
        return LiveMiss(
            **self._base(),
            live=field_int(_F["live"], msg),
            prompt=field_int(_F["prompt"], msg),
            common=field_int(_F["common"], msg),
            vision=_vision(msg),
            reason=MISS_REASONS(_word("reason", msg), self.stats),
            resp=" RESPPROTO" in msg,
        )

    def _kv_line(self, msg: str) -> Event | None:
        st = self.stats
        if msg.startswith("kv cache stored "):
            return Store(
                **self._base(),
                reason=STORE_REASONS(_word("reason", msg), st),
                tokens=field_int(_F["tokens"], msg),
                trimmed=field_int(_F["trimmed"], msg),
                key=KEY_KINDS(_word("key", msg), st),
                mib=field_float(_SIZE_MIB, msg),
                ms=field_float(_SAVE_MS, msg),
            )
        if msg.startswith("kv cache hit "):
            head = msg.split(" file=", 1)[0]
            return DiskHit(
                **self._base(),
                tokens=field_int(_F["tokens"], head),
                text_bytes=field_int(_F["text"], head),
                quant=field_int(_F["quant"], head),
                key=KEY_KINDS(_word("key", head), st),
                load_ms=field_float(_LOAD_MS, head),
                consumed=" consumed" in head,
                resp=" RESPPROTO" in head,
            )
        if msg.startswith("kv cache evicted "):
            head = msg.split(" file=", 1)[0]
            return Eviction(
                **self._base(),
                reason=EVICT_REASONS(_word("reason", head), st),
                tokens=field_int(_F["tokens"], head),
                hits=field_int(_F["hits"], head),
                mib=field_float(_SIZE_MIB, head),
            )
        if msg.startswith("kv cache skipped "):
            head = msg.split(" because ", 1)[0]
            reason = _word("reason", head)
            return StoreSkipped(
                **self._base(),
                tokens=field_int(_F["tokens"], head),
                reason=None if reason is None else SKIP_REASONS(reason, st),
            )
        for prefix, cause in (
            ("kv cache store failed", "store-failed"),
            ("kv cache failed to create", "create-failed"),
            ("kv cache load failed", "load-failed"),
            ("kv cache discarded", "discarded"),
            ("kv cache replaced incompatible", "replaced-incompatible"),
        ):
            if msg.startswith(prefix):
                return DiskError(**self._base(), cause=cause)
        return None

    def _disk_config(self, msg: str) -> DiskCacheConfig | None:
        m = _TAIL_PAREN.search(msg)
        if m is None:
            return None
        inner = "(" + m.group(1)
        return DiskCacheConfig(
            **self._base(),
            budget_mib=field_int(_BUDGET, inner),
            cross_quant=CROSS_QUANT(_word("cross-quant", inner), self.stats),
            min_tokens=field_int(_F["min"], inner),
            cold_max=field_int(_F["cold_max"], inner),
            continued=field_int(_F["continued"], inner),
            trim=field_int(_F["trim"], inner),
            align=field_int(_F["align"], inner),
            hit_half_life_s=field_int(_HALF_LIFE, inner),
        )

    def _continuation(self, msg: str) -> Continuation:
        return Continuation(
            **self._base(),
            via=msg.split(" ", 1)[0],
            match=CONT_MATCHES(_word("match", msg), self.stats),
            ids=field_int(_F["ids"], msg),
            cached=field_int(_F["cached"], msg),
            prompt=field_int(_F["prompt"], msg),
        )

    def _tool_calls(self, msg: str) -> ToolCalls:
        head = msg.split(" ids=[", 1)[0]
        c, p, d = _span_numbers(head)
        return ToolCalls(
            **self._base(),
            cached=c,
            prompt=p,
            todo=d,
            n=field_int(_F["n"], head),
            raw=field_int(_RAW, head),
            resp=" RESPPROTO" in head,
        )

    def _process_line(self, msg: str) -> Event | None:
        st = self.stats
        if msg.startswith("context buffers "):
            m = _TAIL_PAREN.search(msg)
            inner = "(" + m.group(1) if m else ""
            return ContextBuffers(
                **self._base(),
                mib=field_float(_CTXBUF_MIB, msg),
                ctx=field_int(_F["ctx"], inner),
                backend=BACKENDS(_lower(_word("backend", inner)), st),
                prefill_chunk=field_int(_F["prefill_chunk"], inner),
                raw_kv_rows=field_int(_F["raw_kv_rows"], inner),
                compressed_kv_rows=field_int(_F["compressed_kv_rows"], inner),
            )
        m = _RESIDENT.match(msg)
        if m:
            return ResidentSessions(**self._base(), sessions=int(m.group(1)), gib=float(m.group(2)))
        if msg.startswith("batched mode enabled"):
            return BatchedMode(
                **self._base(),
                resident_sessions=field_int(_F["resident_sessions"], msg),
                prefill_quantum=field_int(_F["prefill_quantum"], msg),
                mixed_prefill_quantum=field_int(_F["mixed_prefill_quantum"], msg),
                decode_coalesce_us=field_int(_F["decode_coalesce_us"], msg),
            )
        if msg.startswith("listening on "):
            return Listening(**self._base(), port=field_int(_PORT_END, msg))
        if msg.startswith("failed to listen on "):
            return ListenFailed(**self._base(), port=field_int(_LISTEN_FAIL_PORT, msg))
        if msg.startswith("shutdown requested"):
            return ShutdownRequested(**self._base())
        if msg.startswith("persisting ") and "before shutdown" in msg:
            return ShutdownPersist(
                **self._base(), slot=field_int(_F["slot"], msg), tokens=field_int(_F["tokens"], msg)
            )
        if msg.startswith("decode batch "):
            status = _STATUS.search(msg)
            return DecodeBatch(
                **self._base(),
                count=field_int(_F["count"], msg),
                ms=field_float(_ELAPSED_MS, msg),
                ok=bool(status and status.group(1) == "ok"),
            )
        return None


def _word(name: str, text: str) -> str | None:
    m = _W[name].search(text)
    return m.group(1) if m else None


def _lower(v: str | None) -> str | None:
    return None if v is None else v.lower()


def _span_numbers(text: str) -> tuple[int | None, int | None, int | None]:
    m = _SPAN_ANY.search(text)
    if not m:
        return None, None, None
    return int(m.group(1)), int(m.group(2)), int(m.group(3))


# ---------------------------------------------------------------------------------------------
# Whole-log entry points


@dataclass
class Ds4Log:
    events: list[Event]
    stats: ParseStats


def parse_lines(lines: Iterable[str], *, year: int | None = None) -> Ds4Log:
    parser = Ds4Parser(year=year)
    events = [ev for ev in map(parser.feed, lines) if ev is not None]
    return Ds4Log(events=events, stats=parser.finish())


def _read_lines(paths: Iterable[str | Path]) -> Iterator[str]:
    for p in paths:
        with open(p, encoding="utf-8", errors="replace") as fh:
            yield from fh


def parse_files(paths: Iterable[str | Path], *, year: int | None = None) -> Ds4Log:
    """Parse several logs as one stream, in the order given (rotated logs oldest first)."""
    return parse_lines(_read_lines(paths), year=year)
