"""Which worker SGLang's router sent each request to, from the router's own log.

sglang-router 0.3.2 says it nowhere in its replies: a response carries `x-request-id` (the one the
client sent, else one it makes) and no header naming the worker; `x-smg-target-worker` and
`x-smg-routing-key` are request headers its manual and consistent-hashing policies read. Its log
does say it, at `--log-level debug` (which the driver sets unless the flags set a level): inside
the request's span, which names the `request_id`, the event `Sending request url=WORKER`
(sgl-model-gateway src/observability/events.rs, in the span of src/middleware.rs). The engine
sends `X-Request-ID: RUN-ID` on every request, so each such line names one request of the run.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from pathlib import Path
from typing import Any

_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_SENT = re.compile(r'request_id="[^"]*?-(\d+)".*\bSending request url=(\S+)')


def routed_records(log_path: Path | None, requests: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """One `server` record per request the router's log says it sent (event `routed`: the
    request's `seq` and the worker's URL). A request the router sent again (its retries) keeps
    the last worker it went to. A trace request replayed more than once (`--loop`) carries the
    same id each time, so a retry cannot be told from the next replay: those get no record."""
    if log_path is None or not Path(log_path).exists():
        return []
    seqs: dict[int, list[int]] = {}
    for rec in requests:
        seqs.setdefault(int(rec["id"]), []).append(int(rec["seq"]))
    placed: dict[int, tuple[str, int]] = {}
    with open(log_path, encoding="utf-8", errors="replace") as log:
        for n, raw in enumerate(log, 1):
            if "Sending request" not in raw:
                continue
            m = _SENT.search(_ANSI.sub("", raw))
            if m is None:
                continue
            options = seqs.get(int(m.group(1)))
            if options is not None and len(options) == 1:
                placed[options[0]] = (m.group(2).rstrip("/"), n)
    return [
        {
            "kind": "server",
            "event": "routed",
            "request_seq": seq,
            "backend": url,
            "source": "router",
            "line": n,
        }
        for seq, (url, n) in sorted(placed.items())
    ]
