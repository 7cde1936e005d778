"""What every log parser shares: ANSI stripping, closed vocabularies, parse statistics and the
count cross-check.

A parser that silently matches nothing looks exactly like a server that did nothing (a field
report lost a day to a regex that stopped matching when a `TOOLS` flag appeared between two
fields). So every parser counts the lines it did not recognise, and counts plain substrings next
to the events it parsed: a disagreement is a warning, never a silent zero.

Nothing here ever holds text taken from a log line: warnings are built from our own constants and
numbers only, because logs carry users' private prompts and model output.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field

_ANSI = re.compile(r"\x1b\[[0-9;?]*[ -/]*[@-~]|\x1b[@-Z\\-_]")

OTHER = "other"
"""What a closed-vocabulary field becomes when the log holds a value we do not know."""


def strip_ansi(line: str) -> str:
    """Drop colour codes a server prints when its stderr is a TTY (and stray trailing newline)."""
    return _ANSI.sub("", line).rstrip("\r\n")


@dataclass(frozen=True, slots=True)
class CountCheck:
    """Lines containing `needle` against events of `kind` parsed from those lines."""

    kind: str
    needle: str
    lines: int
    events: int

    @property
    def ok(self) -> bool:
        return self.lines == self.events

    def warning(self) -> str:
        return (
            f"{self.kind}: {self.lines} line(s) contain {self.needle.strip()!r} "
            f"but {self.events} {self.kind} event(s) were parsed"
        )


@dataclass
class ParseStats:
    """How much of a log a parser understood, and whether its counts add up."""

    lines: int = 0
    blank: int = 0
    recognised: int = 0
    known_ignored: int = 0
    """Lines of a known kind that carry nothing we use (engine chatter, tool-map rewrites...)."""
    unrecognised: int = 0
    unrecognised_cache: int = 0
    """Of the unrecognised lines, those about a cache (a parser that knows the line would have
    counted a store, restore or eviction)."""
    unknown_values: int = 0
    """Closed-vocabulary fields whose value was outside the vocabulary (emitted as `other`)."""
    by_kind: Counter[str] = field(default_factory=Counter)
    checks: list[CountCheck] = field(default_factory=list)

    @property
    def warnings(self) -> list[str]:
        out = [c.warning() for c in self.checks if not c.ok]
        if self.unrecognised_cache:
            out.append(
                f"{self.unrecognised_cache} line(s) about the server's caches were not recognised: "
                "its cache events (stores, restores, evictions) may be undercounted"
            )
        if self.unknown_values:
            out.append(
                f"{self.unknown_values} field value(s) outside the known vocabulary, counted as 'other'"
            )
        return out

    def to_dict(self) -> dict[str, object]:
        return {
            "lines": self.lines,
            "blank": self.blank,
            "recognised": self.recognised,
            "known_ignored": self.known_ignored,
            "unrecognised": self.unrecognised,
            "unrecognised_cache": self.unrecognised_cache,
            "unknown_values": self.unknown_values,
            "by_kind": dict(sorted(self.by_kind.items())),
            "checks": [
                {"kind": c.kind, "needle": c.needle.strip(), "lines": c.lines, "events": c.events, "ok": c.ok}
                for c in self.checks
            ],
            "warnings": self.warnings,
        }


class SubstringCounter:
    """Counts lines containing each needle, independently of any regex, for the cross-check."""

    def __init__(self, needles: Iterable[tuple[str, str]]) -> None:
        self._needles = list(needles)  # (event kind, needle)
        self._counts: Counter[str] = Counter()

    def observe(self, line: str) -> None:
        for kind, needle in self._needles:
            if needle in line:
                self._counts[kind] += 1

    def checks(self, by_kind: Counter[str]) -> list[CountCheck]:
        return [
            CountCheck(kind=kind, needle=needle, lines=self._counts[kind], events=by_kind[kind])
            for kind, needle in self._needles
        ]


class Vocab:
    """A closed set of names a field may take; anything else becomes `other` and is counted."""

    def __init__(self, *names: str) -> None:
        self.names = frozenset(names)

    def __call__(self, value: str | None, stats: ParseStats) -> str | None:
        if value is None:
            return None
        if value in self.names:
            return value
        stats.unknown_values += 1
        return OTHER


def field_int(pattern: re.Pattern[str], text: str) -> int | None:
    """One numeric field, found on its own so that flags inserted between fields do not matter."""
    m = pattern.search(text)
    return int(m.group(1)) if m else None


def field_float(pattern: re.Pattern[str], text: str) -> float | None:
    m = pattern.search(text)
    return float(m.group(1)) if m else None


def int_field(name: str) -> re.Pattern[str]:
    """`name=123` as a standalone field (not the tail of a longer name such as `raw_name=`)."""
    return re.compile(rf"(?:^|[\s(,]){re.escape(name)}=(-?\d+)\b")


def word_field(name: str) -> re.Pattern[str]:
    """`name=word` whose value is later checked against a closed vocabulary."""
    return re.compile(rf"(?:^|[\s(,]){re.escape(name)}=([^\s,()]+)")
