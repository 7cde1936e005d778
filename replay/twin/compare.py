"""Two runs of one trace, side by side: where the model agrees with the real server.

Per request (matched by the trace's request id): re-processed tokens (`reprocessed_tokens`, the
server's `timings.prompt_n`), cached tokens, and from each side's `server` records (its log read by
the project's parsers) the restores, evictions and context checkpoints created and restored. The
agreement is the fraction of requests whose re-processed tokens are equal. For each disagreement
the first divergence is the first log event where the two sides part (by event and its source or
reason, in log order within the request), with both sides' records as evidence: numbers and event
names only, never the log's text.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import orjson

FORMAT = 1  # of RESULTS.twin.json

# The figures compared per request, each side's, in the order a row shows them.
FIELDS = ("reprocessed", "cached", "restores", "evictions", "checkpoints_made", "checkpoints_used")


def twin_path(results: str | Path) -> Path:
    """RESULTS.twin.json beside the results: `x.results.jsonl` -> `x.twin.json`."""
    results = Path(results)
    name = results.name
    for suffix in (".results.jsonl", ".jsonl"):
        if name.endswith(suffix):
            return results.with_name(name[: -len(suffix)] + ".twin.json")
    return results.with_name(name + ".twin.json")


def read_twin(results: str | Path) -> dict[str, Any] | None:
    """The twin document beside a results file, if there is a readable one."""
    path = twin_path(results)
    try:
        doc = orjson.loads(path.read_bytes())
    except (OSError, orjson.JSONDecodeError):
        return None
    return doc if isinstance(doc, dict) and doc.get("format") == FORMAT and "rows" in doc else None


def _by_seq(server: Sequence[Mapping[str, Any]]) -> dict[int, list[Mapping[str, Any]]]:
    out: dict[int, list[Mapping[str, Any]]] = {}
    for rec in server:
        seq = rec.get("request_seq")
        if isinstance(seq, int):
            out.setdefault(seq, []).append(rec)
    return out


def _side(request: Mapping[str, Any], records: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """One side's figures for one request."""
    restores = [r for r in records if r.get("event") == "restore"]
    return {
        "reprocessed": request.get("reprocessed_tokens"),
        "cached": request.get("cached_tokens"),
        "restores": len(restores),
        "evictions": sum(1 for r in records if r.get("event") == "evict"),
        "checkpoints_made": sum(
            1 for r in records if r.get("event") == "store" and r.get("reason") == "checkpoint"
        ),
        "checkpoints_used": sum(1 for r in restores if r.get("source") == "checkpoint"),
        "slot": next((r.get("slot") for r in records if r.get("event") == "request"), None),
        "status": request.get("status"),
    }


_EVIDENCE_KEYS = ("event", "line", "slot", "selected_by", "sim", "source", "reason", "tokens", "mib")
_EVIDENCE_KEYS += ("cached", "prompt", "prefill")


def _evidence(records: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    return [{k: r[k] for k in _EVIDENCE_KEYS if r.get(k) is not None} for r in records]


def _step(rec: Mapping[str, Any]) -> tuple[Any, ...]:
    """What an event is, apart from where the log put it."""
    if rec.get("event") == "request":
        return ("request", rec.get("slot"), rec.get("cached"), rec.get("prefill"))
    return (rec.get("event"), rec.get("source") or rec.get("reason"), rec.get("tokens"))


def first_divergence(
    real: Sequence[Mapping[str, Any]], model: Sequence[Mapping[str, Any]]
) -> dict[str, Any] | None:
    """The first event (in log order within the request) where the two sides part, each side's
    event there (None when that side has no more events); None if the events are alike."""
    real_steps = [_step(r) for r in real]
    model_steps = [_step(r) for r in model]
    for i in range(max(len(real_steps), len(model_steps))):
        a = real_steps[i] if i < len(real_steps) else None
        b = model_steps[i] if i < len(model_steps) else None
        if a != b:
            return {
                "index": i,
                "real": _evidence([real[i]])[0] if i < len(real) else None,
                "model": _evidence([model[i]])[0] if i < len(model) else None,
            }
    return None


def compare(
    real_requests: Sequence[Mapping[str, Any]],
    real_server: Sequence[Mapping[str, Any]],
    model_requests: Sequence[Mapping[str, Any]],
    model_server: Sequence[Mapping[str, Any]],
) -> dict[str, Any]:
    """The twin document: per-request rows, the agreement, and each disagreement's first divergence."""
    real_by_seq, model_by_seq = _by_seq(real_server), _by_seq(model_server)
    model_by_id = {r["id"]: r for r in model_requests}
    rows: list[dict[str, Any]] = []
    disagreements: list[dict[str, Any]] = []
    first_state: int | None = None
    for req in sorted(real_requests, key=lambda r: r["id"]):
        twin = model_by_id.get(req["id"])
        real_recs = real_by_seq.get(req["seq"], [])
        model_recs = model_by_seq.get(twin["seq"], []) if twin is not None else []
        a = _side(req, real_recs)
        b = _side(twin, model_recs) if twin is not None else None
        agree = b is not None and a["reprocessed"] is not None and a["reprocessed"] == b["reprocessed"]
        same = b is not None and all(a[f] == b[f] for f in FIELDS)
        if not same and first_state is None:
            first_state = req["id"]
        row = {"id": req["id"], "session": req.get("session"), "prompt": req.get("prompt_tokens")}
        row.update(real=a, model=b, agree=agree, same=same)
        rows.append(row)
        if not agree:
            disagreements.append(
                {
                    "id": req["id"],
                    "real": a["reprocessed"],
                    "model": None if b is None else b["reprocessed"],
                    "first_divergence": first_divergence(real_recs, model_recs),
                    "evidence": {"real": _evidence(real_recs), "model": _evidence(model_recs)},
                }
            )
    equal = sum(1 for r in rows if r["agree"])
    return {
        "format": FORMAT,
        "agreement": round(equal / len(rows), 6) if rows else 0.0,
        "requests": len(rows),
        "equal": equal,
        "all_fields_equal": sum(1 for r in rows if r["same"]),
        "first_state_divergence": first_state,
        "rows": rows,
        "disagreements": disagreements,
    }


def _cell(side: Mapping[str, Any] | None, name: str) -> str:
    if side is None:
        return "-"
    v = side.get(name)
    return "?" if v is None else str(v)


def render(doc: Mapping[str, Any]) -> list[str]:
    """The twin as text: one line per request, the agreement, then each disagreement's divergence."""
    lines = [
        f"{'id':>4} {'session':<10} {'prompt':>7}  {'re-processed':>15}  {'cached':>13}  "
        f"{'restores':>9}  {'evictions':>9}  {'ckpt made/used':>15}",
        f"{'':>4} {'':<10} {'':>7}  {'real / model':>15}  {'real / model':>13}",
    ]
    for row in doc["rows"]:
        a, b = row["real"], row["model"]

        def pair(name: str, a: Mapping[str, Any] = a, b: Mapping[str, Any] | None = b) -> str:
            return f"{_cell(a, name)} / {_cell(b, name)}"

        ck = (
            f"{_cell(a, 'checkpoints_made')}/{_cell(a, 'checkpoints_used')} "
            f"| {_cell(b, 'checkpoints_made')}/{_cell(b, 'checkpoints_used')}"
        )
        mark = "" if row["agree"] else "  <- differs"
        lines.append(
            f"{row['id']:>4} {str(row.get('session') or '')[:10]:<10} {_cell(row, 'prompt'):>7}  "
            f"{pair('reprocessed'):>15}  {pair('cached'):>13}  {pair('restores'):>9}  "
            f"{pair('evictions'):>9}  {ck:>15}{mark}"
        )
    lines.append(
        f"agreement {doc['agreement']:.3f} ({doc['equal']} of {doc['requests']} requests re-process the same "
        f"tokens; {doc['all_fields_equal']} agree on every figure)"
    )
    for d in doc["disagreements"]:
        lines.append(f"request {d['id']}: real re-processed {d['real']}, model {d['model']}")
        div = d["first_divergence"]
        if div is None:
            lines.append("  the two logs show the same events for it")
        else:
            lines.append(f"  first divergence at event {div['index']}:")
            lines.append(f"    real : {_fmt(div['real'])}")
            lines.append(f"    model: {_fmt(div['model'])}")
    return lines


def _fmt(rec: Mapping[str, Any] | None) -> str:
    if rec is None:
        return "(no event)"
    return " ".join(f"{k}={v}" for k, v in rec.items())


def model_flags(
    settings: Mapping[str, Any], props: Mapping[str, Any], requested: Sequence[str], model: str | None
) -> list[str]:
    """llama-server flags for the simulator, from the real server's effective settings (its startup
    log, `drivers.logs.effective` names), then `/props` for what the log did not show, then the
    flags the server was started with for the settings neither shows (`-sps`, batch sizes, KV
    types, `--no-cache-prompt`). The simulator's own options parser takes them all."""
    out: list[str] = ["-m", model] if model else []
    defaults = props.get("default_generation_settings") or {}
    n_parallel = settings.get("n_parallel", props.get("total_slots"))
    n_ctx_slot = settings.get("n_ctx_slot", defaults.get("n_ctx") if isinstance(defaults, Mapping) else None)
    unified = settings.get("kv_unified")
    if isinstance(n_parallel, int):
        out += ["-np", str(n_parallel)]
    if isinstance(unified, bool):
        out += ["-kvu" if unified else "-no-kvu"]
    if isinstance(n_ctx_slot, int) and isinstance(n_parallel, int):
        out += ["-c", str(n_ctx_slot if unified else n_ctx_slot * n_parallel)]
    for key, flag in (
        ("cache_ram_mib", "--cache-ram"),
        ("ctx_checkpoints", "--ctx-checkpoints"),
        ("checkpoint_min_step", "--checkpoint-min-step"),
        ("cache_reuse", "--cache-reuse"),
    ):
        if isinstance(settings.get(key), int):
            out += [flag, str(settings[key])]
    if "cache_ram_mib" not in settings:
        out += ["--cache-ram", "0"]  # the log says nothing of a host cache only when it is off
    if isinstance(settings.get("log_verbosity"), int):
        out += ["-lv", str(settings["log_verbosity"])]  # the same cache lines logged on both sides
    if settings.get("swa_full") is True:
        out += ["--swa-full"]
    if isinstance(settings.get("cache_idle_slots"), bool):
        out += ["--cache-idle-slots" if settings["cache_idle_slots"] else "--no-cache-idle-slots"]
    out += passed_through(requested)
    return out


# Flags of the real server whose effect no startup line shows, passed to the model as they were
# given (with their value where they take one).
PASSED = {
    "-sps": 1,
    "--slot-prompt-similarity": 1,
    "-b": 1,
    "--batch-size": 1,
    "-ub": 1,
    "--ubatch-size": 1,
    "-ctk": 1,
    "--cache-type-k": 1,
    "-ctv": 1,
    "--cache-type-v": 1,
    "--no-cache-prompt": 0,
    "-n": 1,
    "--predict": 1,
    "--n-predict": 1,
}


def passed_through(argv: Sequence[str]) -> list[str]:
    out: list[str] = []
    i = 0
    while i < len(argv):
        flag = argv[i].partition("=")[0]
        if flag in PASSED:
            width = 0 if "=" in argv[i] else PASSED[flag]
            out += list(argv[i : i + 1 + width])
            i += 1 + width
        else:
            i += 1
    return out


# ds4's settings (`drivers.logs.effective.ds4_settings` names) and the simulator's flags for them:
# the simulator plays ds4 with ds4's own flags.
DS4_FLAGS = {
    "ctx": "-c",
    "prefill_chunk": "--prefill-chunk",
    "batched_sessions": "--batched-session",
    "kv_disk_budget_mib": "--kv-disk-space-mb",
    "kv_cache_min_tokens": "--kv-cache-min-tokens",
    "kv_cache_cold_max_tokens": "--kv-cache-cold-max-tokens",
    "kv_cache_continued_interval_tokens": "--kv-cache-continued-interval-tokens",
    "kv_cache_boundary_trim_tokens": "--kv-cache-boundary-trim-tokens",
    "kv_cache_boundary_align_tokens": "--kv-cache-boundary-align-tokens",
}


def ds4_model_flags(settings: Mapping[str, Any]) -> list[str]:
    """The simulator's flags (playing ds4) for the settings a ds4 startup log shows."""
    out: list[str] = []
    for key, flag in DS4_FLAGS.items():
        value = settings.get(key)
        if isinstance(value, int) and not isinstance(value, bool):
            out += [flag, str(value)]
    return out
