"""Field figure vs modelled figure: a scenario's `[[expect]]` rows evaluated on its arms' results.

Everything is read from the results files a run wrote (request records and the `server` records
parsed from the simulator's own log), so a check says what a user's own run of the scenario shows.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from replay.metrics.results import RunResults
from replay.scenario.expect import EVENT_METRICS, REQUEST_METRICS, Expect

Record = dict[str, Any]

# The reasons of ds4's disk saves (`kv cache stored`): llama-server's stores are not disk saves.
DISK_SAVES = ("evict", "shutdown", "cold", "continued")


@dataclass(frozen=True, slots=True)
class Verdict:
    scenario: str
    expect: Expect
    modelled: str
    value: float | None  # the modelled figure compared (None: no request selected)
    holds: bool
    # The figures behind `modelled`: (lowest, highest) of the requests' values for a stat of
    # "all", else (value, value); None when nothing was selected.
    span: tuple[float, float] | None = None
    # The same row on a wall-clock run of the arm on the simulator (None: not run): how far a
    # user's own `scenario run` strays from the modelled-time walk the row is judged on.
    run: Verdict | None = None

    def with_run(self, run: Verdict) -> Verdict:
        return Verdict(self.scenario, self.expect, self.modelled, self.value, self.holds, self.span, run)

    @property
    def spread(self) -> float | None:
        """How far the run's figures are from the walk's, relative to the larger (0 = the same;
        for a range, the farther of its two ends); None when either selected nothing."""
        if self.run is None or self.run.span is None or self.span is None:
            return None
        return max(_relative(a, b) for a, b in zip(self.span, self.run.span, strict=True))

    @property
    def strays(self) -> bool:
        """Whether the wall-clock run is farther from the walk than half the row's margin (its
        tolerance, or its slack where wider), or selected requests the walk did not (or none it
        did): a user's own `scenario run` would not show what the row is judged on."""
        if self.run is None:
            return False
        if self.span is None or self.run.span is None:
            return self.span is not self.run.span
        e = self.expect
        return any(
            abs(a - b) > max(max(abs(a), abs(b)) * e.tolerance, e.slack) / 2
            for a, b in zip(self.span, self.run.span, strict=True)
        )

    @property
    def status(self) -> str:
        if self.expect.gap is not None:
            return "gap (holds)" if self.holds else "known gap"
        return "ok" if self.holds else "FAIL"

    @property
    def failed(self) -> bool:
        return not self.holds and self.expect.gap is None

    def to_json(self) -> dict[str, Any]:
        e = self.expect
        return {
            "scenario": self.scenario,
            "arm": e.arm,
            "selection": e.selection,
            "metric": e.metric,
            "stat": e.stat,
            "field": [e.lo, e.hi],
            "source": e.source,
            "about": e.about,
            "tolerance": e.tolerance,
            "slack": e.slack,
            "modelled": self.modelled,
            "value": self.value,
            "status": self.status,
            "gap": e.gap,
            "run": None if self.run is None else {"modelled": self.run.modelled, "value": self.run.value},
            "spread": self.spread,
            "strays": self.strays,
        }


def _relative(a: float, b: float) -> float:
    return 0.0 if a == b else abs(a - b) / max(abs(a), abs(b))


class ArmView:
    """One arm's results with the derived per-request figures the metrics need."""

    def __init__(
        self,
        res: RunResults,
        initial_files: int = 0,
        labels: dict[int, str] | None = None,
        texts: dict[int, str] | None = None,
    ) -> None:
        self.res = res
        self.labels = labels or {}  # trace request id -> the label of the step that made it
        self.texts = texts or {}  # trace request id -> the text a router matches (a fleet arm)
        self._moves: dict[int, float] | None = None
        self.requests = sorted(res.requests, key=lambda r: r["seq"])
        target = res.run.get("target") or {}
        plan = res.run.get("plan") or {}
        self.scale = float(target.get("time_scale") or plan.get("speed") or 1.0)
        self.initial_files = initial_files
        self._prev: dict[int, Record] = {}
        last: dict[str, Record] = {}
        for rec in self.requests:
            if rec["session"] in last:
                self._prev[rec["seq"]] = last[rec["session"]]
            last[rec["session"]] = rec

    def events(self, kind: str) -> list[Record]:
        return [s for s in self.res.server if s.get("event") == kind]

    def sent_at(self, rec: Record) -> float:
        """Modelled seconds since trace time 0 when the request was sent."""
        return float(rec.get("sent_s") or 0.0) * self.scale

    def select(self, e: Expect) -> list[Record]:
        out = [r for r in self.requests if r.get("status") == "ok"]
        if e.window is not None:
            lo, hi = e.window
            out = [r for r in out if lo <= self.sent_at(r) < hi]
        if e.step is not None:
            step = e.step
            out = [r for r in out if self.labels.get(r["id"], "").startswith(step)]
        if e.session is not None:
            out = [r for r in out if r["session"] == e.session]
        if e.tag is not None:
            out = [r for r in out if r.get("tag") == e.tag]
        if e.switch is not None:
            out = [r for r in out if e.switch in (r.get("switch") or [])]
        if e.last is not None:
            out = out[-e.last :]
        return out

    def request_value(self, metric: str, rec: Record) -> float | None:
        m = rec.get("modelled") or {}
        match metric:
            case "call_s":
                return float(m.get("total_s", rec.get("latency_s") or 0.0))
            case "queue_s" | "restore_s" | "prefill_s":
                return float(m.get(metric, 0.0))
            case "prompt_tokens" | "cached_tokens" | "reprocessed_tokens":
                return float(rec.get(metric) or 0)
            case "reread_beyond_growth":
                prev = self._prev.get(rec["seq"])
                if prev is None:
                    return None
                # what the session added itself: its prompt's growth less the reply it carries back
                growth = rec["prompt_tokens"] - prev["prompt_tokens"] - (prev.get("output_tokens") or 0)
                return float(rec["reprocessed_tokens"] - growth)
            case "prefill_tps":
                prefill = float(m.get("prefill_s") or 0.0)
                done = rec.get("reprocessed_tokens") or 0
                return done / prefill if prefill > 0 and done > 0 else None
            case "decode_tps":
                decode = float(m.get("decode_s") or 0.0)
                out = rec.get("output_tokens") or 0
                return out / decode if decode > 0 and out > 1 else None
            case "live_miss_common":
                misses = [s for s in self.events("live_miss") if s.get("request_seq") == rec["seq"]]
                return float(misses[0]["common"]) if misses else None
            case "moved_reread_vs_model":
                return self.moved_rereads().get(rec["seq"])
        raise ValueError(metric)

    def moved_rereads(self) -> dict[int, float]:
        """Per request that moved replica: its re-processed tokens less the model's for the
        replica it landed on (`FleetCache`, walked over the run's own placements)."""
        if self._moves is None:
            from replay.sim.router import FleetCache, Routed

            urls = list(dict.fromkeys(r["backend"] for r in self.requests if r.get("backend")))
            cache = FleetCache(max(1, len(urls)))
            last: dict[str, int] = {}
            self._moves = {}
            for rec in self.requests:
                url = rec.get("backend")
                if url is None or rec.get("status") != "ok":
                    continue
                w = urls.index(url)
                r = Routed(
                    rec["session"], "", int(rec["prompt_tokens"] or 0), int(rec.get("output_tokens") or 0)
                )
                if rec["session"] in last and last[rec["session"]] != w:
                    self._moves[rec["seq"]] = float(rec["reprocessed_tokens"] - cache.reread(w, r))
                cache.serve(w, r)
                last[rec["session"]] = w
        return self._moves

    def stay_pct(self) -> float | None:
        pairs = [
            (prev.get("backend"), rec.get("backend"))
            for rec in self.requests
            if (prev := self._prev.get(rec["seq"])) is not None and rec.get("status") == "ok"
        ]
        pairs = [(a, b) for a, b in pairs if a is not None and b is not None]
        return 100.0 * sum(1 for a, b in pairs if a == b) / len(pairs) if pairs else None

    def model_agrees_pct(self) -> float | None:
        """The run's placements against the router model's over the same texts in the same
        order, each arriving to the loads the run had then (the requests each replica was
        serving: sent before it and not yet answered)."""
        from replay.sim.router import RouterConfig, agreement, routed_from

        fleet = (self.res.run.get("target") or {}).get("fleet") or self.res.run.get("fleet") or {}
        policy = fleet.get("router")
        placed = [r for r in self.requests if r.get("backend") and r["id"] in self.texts]
        if policy is None or not placed:
            return None
        # The order the router chose in: its log's, where it named every request (requests
        # sent side by side reach it in an order of their own), else the order they were sent.
        chose = {s["request_seq"]: s.get("line", 0) for s in self.events("routed")}
        if all(r["seq"] in chose for r in placed):
            placed.sort(key=lambda r: chose[r["seq"]])
        urls = list(dict.fromkeys(r["backend"] for r in placed))
        workers = max(int(fleet.get("replicas") or 0), len(urls))
        routed = [routed_from(r["session"], self.texts[r["id"]], r) for r in placed]
        observed = [urls.index(r["backend"]) for r in placed]
        loads = []
        for r in placed:
            at = float(r.get("sent_s") or 0.0)
            held = [0] * workers
            for other in placed:
                if other is r:
                    break
                if float(other.get("sent_s") or 0.0) + float(other.get("latency_s") or 0.0) > at:
                    # sent before it (the router chose for it first) and not answered when it was sent
                    held[urls.index(other["backend"])] += 1
            loads.append(held)
        return 100.0 * agreement(routed, observed, RouterConfig(policy), workers, loads) / len(placed)

    def run_value(self, metric: str, selected: Sequence[Record], scoped: bool = False) -> float | None:
        """A count from the server's log; `scoped`: only the events of the selected requests."""
        served = self._before_shutdown()
        if scoped:
            seqs = {r["seq"] for r in selected}
            served = [s for s in served if s.get("request_seq") in seqs]
        evicted = [s for s in served if s["event"] == "evict"]
        saved = [s for s in served if s["event"] == "store" and s.get("reason") in DISK_SAVES]
        match metric:
            case "evictions":
                return float(len(evicted))
            case "evictions_zero_hits":
                return float(sum(1 for s in evicted if s.get("hits") == 0))
            case "evicted_with_hits":
                return float(sum(1 for s in evicted if s.get("hits")))
            case "restores":
                return float(sum(1 for s in served if s["event"] == "restore"))
            case "saves":
                return float(len(saved))
            case "saves_over_evict_saves":
                evict_saves = sum(1 for s in saved if s.get("reason") == "evict")
                return len(saved) / evict_saves if evict_saves else None
            case "top_cut_restores":
                cut = self._top_cut(served)
                return float(len(cut)) if cut else 0.0
            case "live_misses":
                return float(sum(1 for s in served if s["event"] == "live_miss"))
            case "files_at_end":
                stores = sum(1 for s in served if s["event"] == "store")
                consumed = sum(1 for s in served if s["event"] == "restore" and s.get("consumed"))
                return float(self.initial_files + stores - len(evicted) - consumed)
            case "slots_used":
                return float(len({(r.get("modelled") or {}).get("slot") for r in self.requests}))
            case "span_s":
                if not selected:
                    return None
                ends = [
                    self.sent_at(r) + float((r.get("modelled") or {}).get("total_s") or 0.0) for r in selected
                ]
                return max(ends) - min(self.sent_at(r) for r in selected)
            case "checkpoints_made" | "checkpoint_depth_min" | "checkpoint_depth_max":
                prompts = {r["seq"]: r.get("prompt_tokens") or 0 for r in selected}
                made = [
                    s
                    for s in served
                    if s["event"] == "store"
                    and s.get("reason") == "checkpoint"
                    and s.get("tokens") is not None
                ]
                if metric == "checkpoints_made":
                    return float(len(made))
                depths = [
                    prompts[s["request_seq"]] - s["tokens"] for s in made if s.get("request_seq") in prompts
                ]
                if not depths:
                    return None
                return float(min(depths) if metric == "checkpoint_depth_min" else max(depths))
            case "host_cache_gib":
                stored = [
                    s["mib"] for s in served if s["event"] == "store" and s.get("reason") == "host_cache"
                ]
                return max(stored) / 1024 if stored else None
            case "slot_file_gib" | "slot_save_s" | "slot_restore_s":
                restarts = self.res.restarts
                if not restarts:
                    return None
                save, restore = restarts[0].get("save") or {}, restarts[0].get("restore") or {}
                if metric == "slot_file_gib":
                    return save["n_written"] / 2**30 if "n_written" in save else None
                ms = save.get("save_ms") if metric == "slot_save_s" else restore.get("restore_ms")
                return ms / 1000 if ms is not None else None
            case "stay_pct":
                return self.stay_pct()
            case "model_agrees_pct":
                return self.model_agrees_pct()
            case "cache_reuse_in_effect":
                effective = (self.res.run.get("target") or {}).get("effective") or {}
                value = effective.get("cache_reuse")
                return float(value) if isinstance(value, int | float) else None
            case "second_half_ratio" | "second_half_prefill_ratio":
                half = len(selected) // 2
                amount = "reprocessed_tokens" if metric == "second_half_ratio" else "prefill_s"
                first = sum(self.request_value(amount, r) or 0.0 for r in selected[:half])
                second = sum(self.request_value(amount, r) or 0.0 for r in selected[len(selected) - half :])
                return second / first if first else None
        raise ValueError(metric)

    def event_values(self, metric: str, selected: Sequence[Record], scoped: bool = False) -> list[float]:
        """One value per log event (EVENT_METRICS), for the row's stat to sum up."""
        served = self._before_shutdown()
        if scoped:
            seqs = {r["seq"] for r in selected}
            served = [s for s in served if s.get("request_seq") in seqs]
        match metric:
            case "save_gib":
                return [
                    s["mib"] / 1024
                    for s in served
                    if s["event"] == "store" and s.get("reason") in DISK_SAVES and s.get("mib") is not None
                ]
            case "top_cut_coverage":
                prompts = {r["seq"]: r.get("prompt_tokens") or 0 for r in self.requests}
                return [
                    100.0 * s["tokens"] / prompts[s["request_seq"]]
                    for s in self._top_cut(served)
                    if prompts.get(s.get("request_seq"))
                ]
        raise ValueError(metric)

    @staticmethod
    def _top_cut(served: Sequence[Record]) -> list[Record]:
        """The restores of the cut restored most often (ties: the one restored first), in order."""
        by_cut: dict[int, list[Record]] = {}
        for s in served:
            if s["event"] == "restore" and s.get("tokens") is not None:
                by_cut.setdefault(int(s["tokens"]), []).append(s)
        return max(by_cut.values(), key=len, default=[])

    def _before_shutdown(self) -> list[Record]:
        """Server records of the startup pass and of the requests: the shutdown save and its
        evictions (attributed to no request, after the first that is) are not the workload's."""
        out: list[Record] = []
        started = False
        for s in sorted(self.res.server, key=lambda s: s.get("line", 0)):
            if s.get("request_seq") is not None:
                started = True
            elif started:
                continue
            out.append(s)
        return out


def routing_texts(trace_path: str | Path) -> dict[int, str]:
    """Per trace request, the text SGLang's router matches (`sim.router.routing_text`),
    with the recorded replies in the history (a live run's own replies differ in their words, not
    in where a session's earlier text ends)."""
    from replay.sim.router import routing_text
    from replay.trace.materialize import materialize, recorded_reply, text_of
    from replay.trace.reader import read_trace

    trace = read_trace(trace_path)
    by_id = {r.id: r for r in trace.requests}
    reply_for = recorded_reply(by_id)
    return {
        r.id: routing_text([text_of(m.get("content")) for m in materialize(r, reply_for)])
        for r in trace.requests
    }


def _summary(values: list[float], stat: str) -> float | None:
    if stat == "count":
        return float(len(values))
    if not values:
        return None
    match stat:
        case "min":
            return min(values)
        case "max":
            return max(values)
        case "median":
            return float(statistics.median(values))
        case "mean":
            return statistics.fmean(values)
        case "sum":
            return float(sum(values))
    raise ValueError(stat)


def _show(x: float) -> str:
    if abs(x) >= 100 or float(x).is_integer():
        return f"{x:,.0f}"
    return f"{x:.3g}"


def evaluate(scenario: str, e: Expect, arm: ArmView) -> Verdict:
    lo, hi = e.bounds
    selected = arm.select(e)
    if e.metric in EVENT_METRICS:
        return _judge(scenario, e, arm.event_values(e.metric, selected, scoped=e.scoped), lo, hi)
    if e.metric not in REQUEST_METRICS:
        value = arm.run_value(e.metric, selected, scoped=e.scoped)
        if value is None:
            return Verdict(scenario, e, "n/a", None, False)
        return Verdict(scenario, e, _show(value), value, lo <= value <= hi, (value, value))
    values = [v for r in selected if (v := arm.request_value(e.metric, r)) is not None]
    return _judge(scenario, e, values, lo, hi)


def _judge(scenario: str, e: Expect, values: list[float], lo: float, hi: float) -> Verdict:
    """The values summed up by the row's stat ("all": each must hold) against the bounds."""
    if e.stat == "all":
        if not values:
            return Verdict(scenario, e, "no requests", None, False)
        low, high = min(values), max(values)
        shown = _show(low) if low == high else f"{_show(low)}-{_show(high)}"
        inside = sum(1 for v in values if lo <= v <= hi)
        if inside < len(values):
            shown += f" ({len(values) - inside} of {len(values)} outside)"
        value = low if low < lo else high
        return Verdict(scenario, e, shown, value, inside == len(values), (low, high))
    value = _summary(values, e.stat)
    if value is None:
        return Verdict(scenario, e, "no requests", None, False)
    return Verdict(scenario, e, _show(value), value, lo <= value <= hi, (value, value))
