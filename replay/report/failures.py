"""Why requests failed: a run's failed requests grouped by status and cause, with the first of each.

A run where every request failed has a table of dashes; the reason is in each `request` line's
`error`, which names the request first (`request 4deed101-1 POST /v1/chat/completions: HTTP 501:
...`). Without that name the errors of one cause are equal, so they count as one row; a server's
HTML error page is read as its text.
"""

from __future__ import annotations

import html
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

EXAMPLES = 3  # requests named per cause
SHOWN = 5  # causes printed; the rest are counted
CAUSE_CHARS = 160

# The request an error names first: the engine's `request RUN-ID METHOD PATH: ` or, for a request
# cancelled in flight, `request ID (SESSION) `.
_WHERE = re.compile(r"^request \S+(?: [A-Z]+ \S+:| \([^)]*\))\s*")
_TAG = re.compile(r"<(head|script|style)\b.*?</\1\s*>|<[^>]*>", re.S | re.I)  # the head repeats the body


def cause(error: object) -> str:
    """The part of an error that is the same for every request it hit, on one short line."""
    text = _WHERE.sub("", error if isinstance(error, str) else "").strip()
    if "<" in text and re.search(r"<(!doctype|html|body|h1|p)\b", text, re.I):
        text = html.unescape(_TAG.sub(" ", text))
    text = " ".join(text.split()) or "(no error text)"
    return text if len(text) <= CAUSE_CHARS else text[: CAUSE_CHARS - 3].rstrip() + "..."


@dataclass(slots=True)
class FailureGroup:
    status: str  # http_error | timeout | connect_error | stream_broken | bad_payload | cancelled | ...
    cause: str
    count: int = 0
    examples: list[dict[str, Any]] = field(default_factory=list)  # the first requests: seq, id, session

    def to_dict(self) -> dict[str, Any]:
        return {"status": self.status, "cause": self.cause, "count": self.count, "examples": self.examples}


def failure_groups(requests: Iterable[dict[str, Any]]) -> list[FailureGroup]:
    """Every request line whose status is not `ok`, grouped by (status, cause), most frequent first."""
    groups: dict[tuple[str, str], FailureGroup] = {}
    for line in requests:
        status = str(line.get("status"))
        if status == "ok":
            continue
        why = cause(line.get("error"))
        group = groups.get((status, why))
        if group is None:
            group = groups[(status, why)] = FailureGroup(status=status, cause=why)
        group.count += 1
        if len(group.examples) < EXAMPLES:
            group.examples.append({k: line.get(k) for k in ("seq", "id", "session")})
    return sorted(groups.values(), key=lambda g: -g.count)


def failure_lines(groups: list[FailureGroup], total: int, label: str = "") -> list[str]:
    """The terminal's account of the failures: one line per cause and the requests it hit first."""
    if not groups:
        return []
    failed = sum(g.count for g in groups)
    lines = [f"{label + ': ' if label else ''}{failed:,} of {total:,} requests failed:"]
    for group in groups[:SHOWN]:
        first = ", ".join(f"request {e['id']} ({e['session']})" for e in group.examples)
        lines.append(f"  {group.count:>6,} {group.status}: {group.cause}")
        lines.append(f"         first: {first}" + (", ..." if group.count > len(group.examples) else ""))
    if len(groups) > SHOWN:
        rest = groups[SHOWN:]
        lines.append(
            f"  and {sum(g.count for g in rest):,} more in {len(rest)} other causes "
            "(`error` of each `request` line in the results file)"
        )
    return lines
