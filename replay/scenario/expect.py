"""A scenario's field expectations: `[[expect]]` rows, each a figure of a field report as data.

A row names the arm it is about, which requests it looks at (the steps whose label starts with a
text, a window of modelled clock time, a session, a tag, a switch class, the last N), the metric and how the requests' values are summed up, the field
figure (one value or a range) with its tolerance, and the report and section it comes from. A
figure the model cannot reach carries `gap = "why"`: it is shown, never counted as a failure, and
the spec's notes say why. Rows are written from the report, never tuned to what the model gives.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

# Per-request metrics: the value of each selected request (modelled seconds, token counts).
REQUEST_METRICS: tuple[str, ...] = (
    "call_s",  # send -> last token, queueing included (the modelled `total_s`)
    "queue_s",
    "restore_s",
    "prefill_s",
    "prompt_tokens",
    "cached_tokens",
    "reprocessed_tokens",
    # re-processed tokens beyond what the session added itself since its previous request (its
    # prompt's growth less the reply it carries back): 0 when the previous state (prompt + reply)
    # came back whole, from live KV or from disk
    "reread_beyond_growth",
    "live_miss_common",  # `common=` of the request's live-miss line
    "prefill_tps",  # re-processed tokens / modelled prefill seconds
    "decode_tps",  # output tokens / modelled decode seconds
    # a fleet: for a request served by another replica than its session's previous one, its
    # re-processed tokens less what the router model (sim.router) says that replica
    # re-reads (the prompt beyond the session's last prompt and reply it served; all of it if
    # it never served the session)
    "moved_reread_vs_model",
)
# Counts from the server's own log: the whole run, or the selected requests' events when the row
# selects requests (files_at_end and slots_used are always whole-run).
RUN_METRICS: tuple[str, ...] = (
    "evictions",
    "evictions_zero_hits",
    "evicted_with_hits",
    "restores",
    "live_misses",
    "files_at_end",  # checkpoint files on disk after the last request (before the shutdown save)
    "slots_used",
    # modelled seconds from the first selected request's send to the last one's last token (a
    # window's length, a reply's run of calls)
    "span_s",
    # the selected requests' re-processed tokens, second half over first half (round 2 / round 1)
    "second_half_ratio",
    # the same ratio of their modelled prompt times (ds4's `prompt done`: the prefill and the saves
    # written during it, not the disk load before it), as a report that timed its rounds measured it
    "second_half_prefill_ratio",
    # disk saves (ds4's `kv cache stored`, every reason: evict, cold, continued), and all of them
    # over the evict saves alone (how many saves the cold and continued ones add)
    "saves",
    "saves_over_evict_saves",
    # the most restores of one cut (restores of the same token count: report 000 names a file by
    # its `tokens=`), and that cut's restores' coverage, restored / prompt tokens, percent (a stat
    # sums them up; "all" holds when every one is in the range)
    "top_cut_restores",
    "top_cut_coverage",
    # the size of each disk save, GiB (a stat sums them up: median, max)
    "save_gib",
    # llama-server: context checkpoints the selected requests created (`created context checkpoint`),
    # and how many tokens before their prompt's end the nearest and the farthest of them lie
    "checkpoints_made",
    "checkpoint_depth_min",
    "checkpoint_depth_max",
    # llama-server: the largest state the host prompt cache stored (`saving prompt ... total state
    # size`), GiB
    "host_cache_gib",
    # llama-server slot files around a restart (the probe's E5): the file's size (GiB) and the
    # modelled seconds of its save and its restore
    "slot_file_gib",
    "slot_save_s",
    "slot_restore_s",
    # llama-server: `--cache-reuse` as the startup log shows it in effect (0 when turned off)
    "cache_reuse_in_effect",
    # a fleet: the percentage of continuing requests (a session's second and later) served by
    # the replica that served the session's previous request
    "stay_pct",
    # a fleet behind SGLang's router: the percentage of requests whose replica is the one the
    # router model places them on (the arm's policy over the trace's texts, one request at a
    # time, up to the router's own numbering of its workers)
    "model_agrees_pct",
)
# Run metrics with one value per log event rather than one per run: summed up by the row's stat.
EVENT_METRICS: tuple[str, ...] = ("top_cut_coverage", "save_gib")
METRICS: tuple[str, ...] = REQUEST_METRICS + RUN_METRICS
STATS: tuple[str, ...] = ("all", "min", "max", "median", "mean", "sum", "count")


@dataclass(frozen=True, slots=True)
class Expect:
    """One expectation; `lo == hi` for a single field figure."""

    arm: str
    metric: str
    lo: float
    hi: float
    stat: str = "all"
    window: tuple[float, float] | None = None  # trace seconds, from a clock window
    window_text: str = ""
    step: str | None = None  # requests of the steps whose label starts with this
    session: str | None = None
    tag: str | None = None
    switch: str | None = None
    last: int | None = None
    tolerance: float = 0.1  # relative
    slack: float = 0.0  # absolute, for figures at or near zero
    source: str = ""
    about: str = ""
    gap: str | None = None

    @property
    def field(self) -> str:
        return _num(self.lo) if self.lo == self.hi else f"{_num(self.lo)}-{_num(self.hi)}"

    @property
    def bounds(self) -> tuple[float, float]:
        """The field figure widened by the tolerance (relative, or `slack` if that is wider)."""
        return (
            self.lo - max(abs(self.lo) * self.tolerance, self.slack),
            self.hi + max(abs(self.hi) * self.tolerance, self.slack),
        )

    @property
    def scoped(self) -> bool:
        """Whether the row selects requests (run counts then count only their events)."""
        return any(
            x is not None for x in (self.window, self.step, self.session, self.tag, self.switch, self.last)
        )

    @property
    def selection(self) -> str:
        parts = [
            f"{self.window_text}" if self.window_text else "",
            f"step {self.step!r}" if self.step else "",
        ]
        parts += [f"session {self.session}" if self.session else "", f"tag {self.tag}" if self.tag else ""]
        parts += [f"{self.switch}es" if self.switch else "", f"last {self.last}" if self.last else ""]
        return ", ".join(p for p in parts if p) or "all requests"


def _num(x: float) -> str:
    if float(x).is_integer():
        return f"{int(x):,}"
    return f"{x:.3g}"


_CLOCK = re.compile(r"^\s*(\d{1,2}):(\d{2})\s*-\s*(\d{1,2}):(\d{2})\s*$")


def clock_window(text: str, clock_s: float | None) -> tuple[float, float]:
    """`"06:45-07:41"` as trace seconds, given the clock time (seconds after midnight) of trace 0."""
    m = _CLOCK.match(text)
    if not m:
        raise ValueError(f"window must look like 06:45-07:41, got {text!r}")
    if clock_s is None:
        raise ValueError("a clock window needs [scenario] clock (the report's time of trace 0)")
    h1, m1, h2, m2 = (int(g) for g in m.groups())
    start, end = (h1 * 60 + m1) * 60 - clock_s, (h2 * 60 + m2) * 60 - clock_s
    return (start, end + 60.0)  # the end minute is inclusive


def parse_expect(row: dict[str, Any], clock_s: float | None) -> Expect:
    """One `[[expect]]` table (already type-checked key by key by the spec loader); ValueError
    with the problem otherwise."""
    value = row.get("value")
    if isinstance(value, list):
        if len(value) != 2 or not all(isinstance(v, int | float) and not isinstance(v, bool) for v in value):
            raise ValueError("value must be a number or a range [low, high]")
        lo, hi = float(value[0]), float(value[1])
    elif isinstance(value, int | float) and not isinstance(value, bool):
        lo = hi = float(value)
    else:
        raise ValueError("value must be a number or a range [low, high]")
    if lo > hi:
        raise ValueError("value range must be [low, high]")
    metric = row["metric"]
    if metric not in METRICS:
        raise ValueError(f"metric must be one of {', '.join(METRICS)}, got {metric!r}")
    stat = row.get("stat", "all")
    if stat not in STATS:
        raise ValueError(f"stat must be one of {', '.join(STATS)}, got {stat!r}")
    window_text = row.get("window", "")
    window = clock_window(window_text, clock_s) if window_text else None
    return Expect(
        arm=row["arm"],
        metric=metric,
        lo=lo,
        hi=hi,
        stat=stat,
        window=window,
        window_text=window_text,
        step=row.get("step"),
        session=row.get("session"),
        tag=row.get("tag"),
        switch=row.get("switch"),
        last=row.get("last"),
        tolerance=float(row.get("tolerance", 0.1)),
        slack=float(row.get("slack", 0.0)),
        source=row.get("source", ""),
        about=row.get("about", ""),
        gap=row.get("gap"),
    )
