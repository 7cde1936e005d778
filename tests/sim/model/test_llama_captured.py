"""The llama model replays the captured real-server sessions (tests/data/llama) and answers as the
server did: per request `cache_n` and `prompt_n`, per slot file its bytes, and the checkpoints and
host-cache saves its log shows, at the same token counts and sizes."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from drivers.logs import llamacpp as ll
from replay.sim.model.llama import events as ev
from replay.sim.model.llama.config import LlamaConfig, llama_config
from replay.sim.model.llama.context import SlotFile
from replay.sim.model.llama.engine import LlamaModel
from tests.support.llama_jobs import chat_job, words

DATA = Path(__file__).resolve().parents[2] / "data" / "llama"
SESSIONS = [
    "llama_server_basic",
    "llama_server_np2",
    "llama_server_swa",
    "llama_server_swa_forcing",
    "llama_server_swa_full",
]


def config_for(steps: dict[str, Any]) -> LlamaConfig:
    """The recorded flags as the model's settings (the launcher's defaults: one slot)."""
    flags = list(steps["flags"])
    values: dict[str, Any] = {"n_parallel": 1}
    names = {"-c": "n_ctx", "-np": "n_parallel", "--cache-ram": "cache_ram_mib", "-ctxcp": "ctx_checkpoints"}
    names["--cache-reuse"] = "cache_reuse"
    i = 0
    while i < len(flags):
        flag = flags[i]
        if flag in names:
            values[names[flag]] = int(flags[i + 1])
            i += 2
            continue
        if flag == "--swa-full":
            values["swa_full"] = True
        i += 1 if flag in ("--metrics", "--swa-full") else 2
    return llama_config("tiny-gemma2" if steps["arch"] == "gemma2" else "tiny-llama", **values)


def replay_steps(steps: dict[str, Any]) -> tuple[list[tuple[dict[str, Any], Any]], list[ev.Event]]:
    """Each recorded step with what the model answered (a result, a slot action, or None for a
    request the server refused before it reached a slot)."""
    model = LlamaModel(config_for(steps))
    files: dict[str, SlotFile] = {}
    out: list[tuple[dict[str, Any], Any]] = []
    events: list[ev.Event] = []
    ids = 0
    for step in steps["steps"]:
        action = (step.get("request") or {}).get("action")
        if action is not None and "error" in step["response"]:
            continue  # refused by the HTTP layer (a bad file name): the sim server's to check
        if action is not None:
            ids += 1
            filename = step["response"].get("filename", "")
            model.slot_action(ids, 0, action, filename, files.get(filename), at=model.now)
            done = model.run_until_idle()
            events += done
            if action == "save":
                saved = model.saved_file(ids)
                assert saved is not None
                files[filename] = saved
            out += [(step, e) for e in done if isinstance(e, ev.SlotAction)]
            continue
        requests = step.get("concurrent") or ([step] if "request" in step else [])
        if not requests:
            continue
        for req in requests:
            r = req["request"]
            ids += 1
            prefix = tuple(r["prefix"]) if r.get("prefix") else None
            params = {k: r[k] for k in ("cache_prompt", "id_slot") if k in r}
            model.submit(
                chat_job(ids, words(r["words"], r["seed"], prefix), r["max_tokens"], **params), model.now
            )
        done = model.run_until_idle()
        events += done
        finished = [e for e in done if isinstance(e, ev.Finished)]
        by_job = {e.job_id: e.result for e in finished}
        for k, req in enumerate(requests):
            out.append((req, by_job[ids - len(requests) + 1 + k]))
    return out, events


@pytest.mark.parametrize("session", SESSIONS)
def test_every_request_reuses_what_the_real_server_reused(session: str) -> None:
    steps = json.loads((DATA / f"{session}.steps.json").read_text())
    answered, _ = replay_steps(steps)
    assert answered
    for step, got in answered:
        if isinstance(got, ev.SlotAction):
            want = step["response"]
            if got.action == "save":
                assert (got.tokens, got.bytes) == (want["n_saved"], want["n_written"]), step["step"]
            elif got.action == "restore":
                assert (got.tokens, got.bytes) == (want["n_restored"], want["n_read"]), step["step"]
            else:
                assert got.tokens == want["n_erased"], step["step"]
            continue
        if "error" in step:
            assert got.error == step["error"]["message"], step["step"]
            continue
        timings = step["timings"]
        assert (got.cache_n, got.prompt_n) == (timings["cache_n"], timings["prompt_n"]), step["step"]
        assert got.prompt_tokens == step["usage"]["prompt_tokens"], step["step"]


def _log_events(session: str) -> list[ll.Event]:
    return ll.parse_files([DATA / f"{session}.log"]).events


@pytest.mark.parametrize("session", ["llama_server_swa", "llama_server_swa_forcing", "llama_server_swa_full"])
def test_checkpoints_are_made_where_the_real_server_made_them(session: str) -> None:
    steps = json.loads((DATA / f"{session}.steps.json").read_text())
    _, events = replay_steps(steps)
    modelled = [
        (
            e.checkpoint.n_tokens,
            e.checkpoint.pos_min,
            e.checkpoint.pos_max,
            f"{e.checkpoint.size / 2**20:.3f}",
        )
        for e in events
        if isinstance(e, ev.CheckpointCreated)
    ]
    real = [
        (e.n_tokens, e.pos_min, e.pos_max, f"{e.mib:.3f}")
        for e in _log_events(session)
        if isinstance(e, ll.CheckpointCreated)
    ]
    assert modelled == real
    restored = [(e.checkpoint.n_tokens, e.n_past) for e in events if isinstance(e, ev.CheckpointRestored)]
    assert restored == [
        (e.n_tokens, e.n_past) for e in _log_events(session) if isinstance(e, ll.CheckpointRestored)
    ]
    forced = sum(isinstance(e, ev.FullReprocess) for e in events)
    assert forced == sum(isinstance(e, ll.FullReprocess) for e in _log_events(session))


@pytest.mark.parametrize("session", ["llama_server_basic", "llama_server_swa"])
def test_the_host_cache_saves_and_loads_what_the_real_server_did(session: str) -> None:
    steps = json.loads((DATA / f"{session}.steps.json").read_text())
    _, events = replay_steps(steps)
    saves = [(e.tokens, f"{e.bytes / 2**20:.3f}") for e in events if isinstance(e, ev.PromptSaved)]
    real = [(e.tokens, f"{e.mib:.3f}") for e in _log_events(session) if isinstance(e, ll.PromptCacheSave)]
    assert saves == real
    loads = [(f"{e.f_keep:.3f}", f"{e.f_sim:.3f}") for e in events if isinstance(e, ev.PromptLoaded)]
    real_loads = [
        (f"{e.f_keep:.3f}", f"{e.sim:.3f}") for e in _log_events(session) if isinstance(e, ll.PromptCacheLoad)
    ]
    assert loads == real_loads
    states = [(len(e.entries), f"{e.bytes / 2**20:.3f}") for e in events if isinstance(e, ev.CacheState)]
    real_states = [
        (e.prompts, f"{e.mib:.3f}") for e in _log_events(session) if isinstance(e, ll.PromptCacheState)
    ]
    assert states == real_states
