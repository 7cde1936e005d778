"""What the server's own log says about a run: settings in force, and cache events per request.

The run header carries the settings the server printed at startup, not the flags it was given (a
requested cache setting is not evidence that it is in effect). After the run, ds4-format logs
(ds4-server and the simulator) are correlated with the run's requests into `server` records:
restores, stores, evictions and live misses, numbers only; llama-server logs the same way by task
(``llamacpp``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from drivers.logs import ds4, llamacpp
from drivers.logs.base import ParseStats
from drivers.logs.effective import ds4_settings, llamacpp_settings, warn_missing
from replay.metrics.results import RunResults
from replay.serverside.ds4 import correlate
from replay.serverside.llamacpp import correlate as llama_correlate

DS4_FORMAT_KINDS = ("ds4", "sim")


def log_kind(kind: str, argv: list[str] | tuple[str, ...]) -> str:
    """The format a server's log is in: the simulator writes llama-server's when it plays it
    (`--server llama`), ds4's otherwise."""
    args = list(argv)
    llama = "--server=llama" in args or any(
        a == "--server" and i + 1 < len(args) and args[i + 1] == "llama" for i, a in enumerate(args)
    )
    return "llamacpp" if kind == "sim" and llama else kind


def effective_settings(kind: str, log_path: Path | None) -> dict[str, Any]:
    """Settings the server printed at startup; empty when it keeps no log we can read."""
    if log_path is None or not Path(log_path).exists():
        return {}
    if kind in DS4_FORMAT_KINDS:
        return dict(ds4_settings(ds4.parse_files([log_path]).events))
    if kind == "llamacpp":
        return dict(llamacpp_settings(llamacpp.parse_files([log_path]).events))
    return {}


# Flags whose effect the server's startup log shows, by the setting name the log parsers use.
_REQUESTED = {
    "ds4": {
        "--kv-disk-space-mb": "kv_disk_budget_mib",
        "--kv-cache-min-tokens": "kv_cache_min_tokens",
        "--kv-cache-cold-max-tokens": "kv_cache_cold_max_tokens",
        "--kv-cache-continued-interval-tokens": "kv_cache_continued_interval_tokens",
        "--kv-cache-boundary-trim-tokens": "kv_cache_boundary_trim_tokens",
        "--kv-cache-boundary-align-tokens": "kv_cache_boundary_align_tokens",
        "-c": "ctx",
        "--ctx": "ctx",
        "--prefill-chunk": "prefill_chunk",
        "--batched-session": "batched_sessions",
    },
    "llamacpp": {
        "-np": "n_parallel",
        "--parallel": "n_parallel",
        "--cache-reuse": "cache_reuse",
        "--cache-ram": "cache_ram_mib",
        "-cram": "cache_ram_mib",
        "-ctxcp": "ctx_checkpoints",
        "--ctx-checkpoints": "ctx_checkpoints",
        "-cms": "checkpoint_min_step",
        "--checkpoint-min-step": "checkpoint_min_step",
    },
}
_REQUESTED["sim"] = _REQUESTED["ds4"]


def requested_settings(kind: str, argv: list[str]) -> dict[str, Any]:
    """The cache settings a server's command line asks for, by the names its startup log uses."""
    names = _REQUESTED.get(kind, {})
    out: dict[str, Any] = {}
    for i, arg in enumerate(argv):
        flag, eq, value = arg.partition("=")
        if flag in names and (eq or i + 1 < len(argv)):
            raw = value if eq else argv[i + 1]
            out[names[flag]] = int(raw) if raw.lstrip("-").isdigit() else raw
    return out


def setting_warnings(kind: str, argv: list[str], effective: dict[str, Any]) -> list[str]:
    """One line per requested cache setting the server's startup log does not show in effect."""
    if not effective:
        return []
    return warn_missing(requested_settings(kind, argv), effective)


def server_records(kind: str, log_path: Path | None, requests: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """`server` records for the results file, attributed to request `seq` where the log allows; the
    last one (`log_parse`) says how much of the log was understood."""
    if log_path is None or not Path(log_path).exists():
        return []
    if kind == "llamacpp":
        llama = llamacpp.parse_files([log_path])
        return [*llama_correlate(requests, llama.events), parse_record(llama.stats)]
    if kind not in DS4_FORMAT_KINDS:
        return []
    parsed = ds4.parse_files([log_path])
    return [*(dict(r) for r in correlate(requests, parsed.events)), parse_record(parsed.stats)]


def parse_record(stats: ParseStats) -> dict[str, Any]:
    """The log's parse counts as a `server` record: lines unrecognised, those about a cache apart,
    and the parser's warnings (built from numbers and its own words only)."""
    return {
        "kind": "server",
        "request_seq": None,
        "event": "log_parse",
        "lines": stats.lines,
        "recognised": stats.recognised,
        "unrecognised": stats.unrecognised,
        "unrecognised_cache": stats.unrecognised_cache,
        "warnings": stats.warnings,
    }


def log_warnings(server: list[dict[str, Any]]) -> list[str]:
    """What a results file's `log_parse` record says a reader must know: cache lines the parser
    did not recognise (the run's cache figures may be short of what the server did)."""
    out = []
    for rec in server:
        if rec.get("event") == "log_parse" and rec.get("unrecognised_cache"):
            out.append(
                f"the server log has {rec['unrecognised_cache']} line(s) about its caches that this tool does "
                "not recognise: its stores, restores and evictions may be undercounted"
            )
    return out


def records_beside(res: RunResults) -> list[dict[str, Any]]:
    """`server` records from the ds4-format log beside the results (`X.server.log`, or the one the
    header names) when the results file carries none: the report then still shows the disk."""
    target = res.run.get("target") or {}
    candidates = [target.get("log"), Path(res.path).with_suffix(".server.log")]
    build = target.get("build") or {}
    kind = log_kind(
        str(target.get("kind") or "ds4"), build.get("argv") or [] if isinstance(build, dict) else []
    )
    for candidate in candidates:
        if candidate and Path(candidate).is_file():
            known = kind in DS4_FORMAT_KINDS or kind == "llamacpp"
            return server_records(kind if known else "ds4", Path(candidate), res.requests)
    return []
