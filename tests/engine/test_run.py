"""The replay loop end to end against the scripted SSE server on 127.0.0.1."""

from __future__ import annotations

import dataclasses
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import anyio
import orjson
import pytest

from replay.engine.plans import make_plan
from replay.engine.run import Engine, EngineConfig
from replay.metrics.record import RequestRecord
from replay.metrics.results import read_results
from replay.runs.recording import Recording, close_all, run_engines, run_recordings, run_trace
from replay.trace import TraceWriter, read_trace
from tests.support.scripted_server import Script

SAMPLE = Path("traces/sample.jsonl")
USAGE = {"prompt_tokens": 1000, "completion_tokens": 3, "prompt_tokens_details": {"cached_tokens": 400}}


def replay(server, trace_path, out, plan="alternate", history="live", max_duration=None, **plan_kw):
    config = EngineConfig(base_url=server.url, history=history, timeout_s=5.0, run_id="t")
    return run_trace(
        read_trace(trace_path),
        make_plan(plan, **plan_kw),
        config,
        out,
        {"kind": "scripted"},
        max_duration_s=max_duration,
        keep_records=True,
    )


def lines(path):
    return [orjson.loads(x) for x in Path(path).read_bytes().splitlines()]


def test_sample_replay_writes_every_field_and_classifies_switches(scripted_server, tmp_path):
    scripted_server.default = Script(first_token_delay_s=0.02, usage=USAGE)
    outcome = replay(scripted_server, SAMPLE, tmp_path / "r.jsonl")
    assert outcome.exit_code == 0 and outcome.requests == 9
    res = read_results(tmp_path / "r.jsonl")
    assert res.run["format"] == "agent-replay-results/2"
    assert res.run["trace"]["sha256"] and res.run["plan"]["plan"] == "alternate"
    recs = res.requests
    assert [r["switch"] for r in recs[:3]] == [["cold"], ["cold"], ["switch"]]
    assert recs[2]["from_session"] == "cron"
    assert recs[-1]["switch"] == ["switch", "compaction"]
    for r in recs:
        assert r["status"] == "ok"
        assert r["ttft_s"] >= 0.02
        assert (r["prompt_tokens"], r["cached_tokens"], r["reprocessed_tokens"]) == (1000, 400, 600)
        assert r["reprocessed_source"] == "derived"
        assert r["latency_s"] >= r["ttft_s"]
    assert res.summary_line["outcome"] == "done"
    assert res.summary.classes["switch"].count == 7
    for r in recs:  # the stamps before the first token reach the results too
        assert r["connect_s"] >= 0 and 0 < r["headers_s"] <= r["first_byte_s"] <= r["ttft_s"]


def test_the_sink_gets_each_request_record_with_every_moment_stamped_in_order(scripted_server):
    scripted_server.default = Script(first_token_delay_s=0.01, usage=USAGE)
    got: list[RequestRecord] = []
    trace = read_trace(SAMPLE)
    engine = Engine(trace, make_plan("alternate"), EngineConfig(base_url=scripted_server.url), got.append)
    anyio.run(engine.run)
    assert sorted(r.request_id for r in got) == [r.id for r in trace.requests]
    for r in got:
        assert r.ok, r.error
        assert r.message is not None and r.output_sha1 is not None
        stamps = [
            r.t_origin,
            r.t_scheduled,
            r.t_start,
            r.t_connected,
            r.t_sent,
            r.t_headers,
            r.t_first_byte,
            r.t_first_token,
            r.t_last_token,
            r.t_end,
        ]
        assert None not in stamps and stamps == sorted(stamps), stamps
        assert r.ttft_us == round(r.ttft_s * 1e6)


def test_live_history_splices_the_servers_reply_and_maps_tool_ids(scripted_server, tmp_path):
    scripted_server.default = Script(
        usage=USAGE, tool_calls=[{"id": "live-1", "name": "read_file", "arguments": "{}"}], token_text="live"
    )
    replay(scripted_server, SAMPLE, tmp_path / "r.jsonl")
    third = scripted_server.seen[2].body["messages"]  # main's second turn
    assistant = [m for m in third if m["role"] == "assistant"]
    tool = [m for m in third if m["role"] == "tool"]
    assert assistant[0]["tool_calls"][0]["id"] == "live-1"
    assert "live" in assistant[0]["content"]
    assert tool[0]["tool_call_id"] == "live-1"


def test_recorded_history_resends_the_trace(scripted_server, tmp_path):
    scripted_server.default = Script(usage=USAGE, token_text="live")
    replay(scripted_server, SAMPLE, tmp_path / "r.jsonl", history="recorded")
    third = scripted_server.seen[2].body["messages"]
    assistant = [m for m in third if m["role"] == "assistant"]
    assert assistant[0]["tool_calls"][0]["id"] == "main-call-0"
    assert not assistant[0].get("content")


def _max_overlap(seen) -> int:
    # The server stamps `done_ns` after its last byte, so the client can be done first: wait.
    deadline = time.monotonic() + 5.0
    while any(s.done_ns is None for s in seen) and time.monotonic() < deadline:
        time.sleep(0.01)
    edges = sorted([(s.recv_ns, 1) for s in seen] + [(s.done_ns, -1) for s in seen])
    level = peak = 0
    for _, step in edges:
        level += step
        peak = max(peak, level)
    return peak


def _many_sessions(path, sessions=6, turns=3):
    with TraceWriter(path, source="test") as w:
        for s in range(sessions):
            w.session(f"s{s}")
        for turn in range(turns):
            for s in range(sessions):
                msgs = [{"role": "user", "content": f"s{s} turn {t}"} for t in range(turn + 1)]
                w.request(f"s{s}", turn * 0.05 + s * 0.01, msgs, {"max_tokens": 3})
    return path


def test_overlap_never_exceeds_k_in_flight(scripted_server, tmp_path):
    scripted_server.default = Script(first_token_delay_s=0.05, usage=USAGE)
    trace = _many_sessions(tmp_path / "t.jsonl")
    outcome = replay(scripted_server, trace, tmp_path / "r.jsonl", plan="overlap", concurrency=3)
    assert outcome.requests == 18
    assert _max_overlap(scripted_server.seen) == 3
    assert any("concurrent" in r["switch"] for r in outcome.results)


def test_recordings_replay_side_by_side_into_separate_files(scripted_server, tmp_path):
    scripted_server.default = Script(first_token_delay_s=0.05, usage=USAGE)
    config = EngineConfig(base_url=scripted_server.url, timeout_s=5.0, run_id="t")
    runs = [
        Recording(
            read_trace(_many_sessions(tmp_path / f"{name}.jsonl", sessions=1, turns=4)),
            make_plan("alternate"),
            config,
            tmp_path / f"{name}.results.jsonl",
            {"kind": name},
            keep_records=True,
        )
        for name in ("a", "b")
    ]
    outcomes = run_recordings(runs, None)
    assert [o.requests for o in outcomes] == [4, 4]
    assert [read_results(o.out).run["target"]["kind"] for o in outcomes] == ["a", "b"]
    # Each trace is one request at a time; only running both at once puts two in flight.
    assert _max_overlap(scripted_server.seen) == 2


def test_timed_plan_measures_from_the_intended_time_and_reports_lag(scripted_server, tmp_path):
    scripted_server.default = Script(first_token_delay_s=0.12, usage=USAGE)
    trace = _many_sessions(tmp_path / "t.jsonl", sessions=2, turns=3)
    outcome = replay(scripted_server, trace, tmp_path / "r.jsonl", plan="timed", speed=1.0, concurrency=1)
    assert outcome.lag_p50_s is not None and outcome.lag_p99_s is not None
    late = [r for r in outcome.results if r["lag_s"] > 0.05]
    # Six requests due within 110 ms, one at a time, 120 ms each: the queueing shows as lag.
    assert late
    for r in late:
        assert r["ttft_sched_s"] == pytest.approx(r["lag_s"] + r["ttft_s"], abs=2e-6)
    summary = read_results(tmp_path / "r.jsonl").summary_line
    assert summary["lag_p99_s"] >= 0.05


def test_every_fault_is_recorded_and_the_run_goes_on(scripted_server, tmp_path):
    faults = [
        Script(fault="http_error", http_status=503),
        Script(fault="reset_before_headers"),
        Script(fault="reset_mid_stream", fault_after=1),
        Script(fault="no_done"),
        Script(fault="event_error"),
        Script(fault="hang", hang_s=10),
    ]
    scripted_server.queue.extend(faults)
    scripted_server.default = Script(usage=USAGE)
    trace = _many_sessions(tmp_path / "t.jsonl", sessions=3, turns=3)
    config = EngineConfig(base_url=scripted_server.url, timeout_s=1.0, run_id="f")
    outcome = run_trace(
        read_trace(trace), make_plan("alternate"), config, tmp_path / "r.jsonl", {}, keep_records=True
    )
    statuses = [r["status"] for r in outcome.results]
    assert statuses[:6] == [
        "http_error",
        "stream_broken",
        "stream_broken",
        "stream_broken",
        "server_error",
        "timeout",
    ]
    assert statuses[6:] == ["ok"] * 3
    assert outcome.errors == 6 and outcome.exit_code == 1
    assert all(r["error"] and "request f-" in r["error"] for r in outcome.results[:6])
    assert read_results(tmp_path / "r.jsonl").summary.classes["all"].errors == 6


def test_max_duration_cuts_the_run_and_keeps_what_was_measured(scripted_server, tmp_path):
    scripted_server.default = Script(first_token_delay_s=0.1, usage=USAGE)
    trace = _many_sessions(tmp_path / "t.jsonl", sessions=2, turns=10)
    outcome = replay(scripted_server, trace, tmp_path / "r.jsonl", max_duration=0.45)
    assert outcome.outcome == "max-duration"
    assert 2 <= outcome.requests < 20
    res = read_results(tmp_path / "r.jsonl")
    assert res.summary_line["outcome"] == "max-duration"
    assert len([r for r in res.requests if r["status"] == "ok"]) == outcome.requests


def _cli(*args, **kw):
    return subprocess.run([sys.executable, "-m", "replay", *args], capture_output=True, text=True, **kw)


@pytest.mark.parametrize(("sig", "code"), [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_a_signal_to_a_real_run_leaves_a_parseable_results_file(scripted_server, tmp_path, sig, code):
    scripted_server.default = Script(first_token_delay_s=0.2, usage=USAGE)
    trace = _many_sessions(tmp_path / "t.jsonl", sessions=2, turns=20)
    out = tmp_path / "r.jsonl"
    argv = ["run", str(trace), "--target", scripted_server.url, "--out", str(out), "--quiet"]
    proc = subprocess.Popen(
        [sys.executable, "-m", "replay", *argv], stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and (
        not out.exists() or out.read_bytes().count(b'"kind":"request"') < 2
    ):
        time.sleep(0.05)
    os.kill(proc.pid, sig)
    assert proc.wait(timeout=20) == code
    objs = lines(out)  # every line parses
    assert objs[0]["kind"] == "run"
    (summary,) = [o for o in objs if o["kind"] == "summary"]
    assert summary["outcome"] == signal.Signals(sig).name
    done = [o for o in objs if o["kind"] == "request" and o["status"] == "ok"]
    assert len(done) >= 2
    assert all(o["status"] in ("ok", "cancelled") for o in objs if o["kind"] == "request")


def test_malformed_trace_exits_2_and_sends_nothing(scripted_server, tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text(SAMPLE.read_text().replace('"keep":2', '"keep":99', 1))
    result = _cli(
        "run", str(bad), "--target", scripted_server.url, "--out", str(tmp_path / "r.jsonl"), "--quiet"
    )
    assert result.returncode == 2
    assert f"{bad}:" in result.stderr and "keep 99" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1
    assert scripted_server.seen == []
    assert not (tmp_path / "r.jsonl").exists()


def test_unreachable_target_is_a_clear_error_before_the_run(tmp_path):
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    result = _cli(
        "run", str(SAMPLE), "--target", f"http://127.0.0.1:{port}", "--out", str(tmp_path / "r.jsonl")
    )
    assert result.returncode == 2
    assert "unreachable" in result.stderr
    assert not (tmp_path / "r.jsonl").exists()


def test_validate_and_report_cli(scripted_server, tmp_path):
    assert "ok (2 sessions, 9 requests" in _cli("validate", str(SAMPLE)).stdout
    scripted_server.default = Script(usage=USAGE)
    replay(scripted_server, SAMPLE, tmp_path / "a.jsonl")
    replay(scripted_server, SAMPLE, tmp_path / "b.jsonl")
    text = _cli("report", "--merge", str(tmp_path / "a.jsonl"), str(tmp_path / "b.jsonl")).stdout
    assert "2 files merged" in text and "switch" in text
    doc = orjson.loads(
        _cli("report", "--json", "--merge", str(tmp_path / "a.jsonl"), str(tmp_path / "b.jsonl")).stdout
    )
    assert doc["classes"]["all"]["count"] == 18
    assert doc["classes"]["switch"]["mean_reprocessed"] == 600


def test_requested_cache_settings_are_checked_against_the_startup_log():
    from replay.serverside.logs import requested_settings, setting_warnings

    argv = ["ds4-server", "--kv-disk-space-mb", "65536", "--kv-cache-cold-max-tokens=0", "-c", "32768"]
    assert requested_settings("ds4", argv) == {
        "kv_disk_budget_mib": 65536,
        "kv_cache_cold_max_tokens": 0,
        "ctx": 32768,
    }
    effective = {"kv_disk_budget_mib": 4096, "kv_cache_cold_max_tokens": 0, "ctx": 32768}
    (warning,) = setting_warnings("ds4", argv, effective)
    assert "kv_disk_budget_mib=65536" in warning and "4096" in warning
    llama = ["llama-server", "-np", "2", "--cache-reuse", "256"]
    (dropped,) = setting_warnings(
        "llamacpp", llama, {"n_parallel": 2, "cache_reuse": 0, "cache_reuse_disabled_by": "multimodal"}
    )
    assert "cache_reuse=256" in dropped and "multimodal" in dropped


def test_closed_loop_waits_for_the_previous_reply_plus_tool_time(scripted_server, tmp_path):
    scripted_server.default = Script(first_token_delay_s=0.05, usage=USAGE)
    path = tmp_path / "t.jsonl"
    reply = {"message": {"role": "assistant", "content": "ok"}, "finish": "stop", "output_tokens": 3}
    with TraceWriter(path, source="test") as w:
        w.session("a")
        w.session("b")
        msgs = {"a": [{"role": "user", "content": "a0"}], "b": [{"role": "user", "content": "b0"}]}
        last: dict[str, int] = {}
        for turn in range(3):
            for sid, start in (("a", 0.0), ("b", 0.02)):
                after = {"request": last[sid], "delay_s": 0.2} if sid in last else None
                last[sid] = w.request(sid, start + turn * 10, list(msgs[sid]), {}, reply=reply, after=after)
                msgs[sid] = msgs[sid] + [reply["message"], {"role": "user", "content": f"{sid}{turn + 1}"}]
    outcome = replay(scripted_server, path, tmp_path / "r.jsonl", plan="closed-loop", speed=1.0)
    recs = {r["id"]: r for r in outcome.results}
    by_session = {"a": [1, 3, 5], "b": [2, 4, 6]}
    for ids in by_session.values():
        for prev, nxt in zip(ids, ids[1:], strict=False):
            done = recs[prev]["sent_s"] + recs[prev]["latency_s"]
            # Sent after the previous reply plus the recorded tool time, not at the trace's t (10 s later).
            assert recs[nxt]["sent_s"] >= done + 0.2 - 0.005
            assert recs[nxt]["sent_s"] < done + 0.2 + 0.15
    assert recs[2]["sent_s"] >= 0.02  # a session's first request starts at its own t
    # The two sessions overlap: each only waits for itself.
    assert any("concurrent" in r["switch"] for r in outcome.results)


def test_closed_loop_on_the_simulator_counts_a_reply_done_at_its_modelled_end(scripted_server, tmp_path):
    """`modelled_done` (a scenario on our simulator at the plan's speed): the next request is
    due the tool time after the reply's modelled end (its due plus x_sim's total_s), not after
    this host read the reply, whose delay would pile up along the session's chain."""
    script = Script(first_token_delay_s=0.3, usage=USAGE, extra_final={"x_sim": {"total_s": 0.05}})
    scripted_server.default = script
    path = tmp_path / "t.jsonl"
    reply = {"message": {"role": "assistant", "content": "ok"}, "finish": "stop", "output_tokens": 3}
    with TraceWriter(path, source="test") as w:
        w.session("a")
        first = w.request("a", 0.0, [{"role": "user", "content": "a0"}], {}, reply=reply)
        msgs = [{"role": "user", "content": "a0"}, reply["message"], {"role": "user", "content": "a1"}]
        w.request("a", 10.0, msgs, {}, reply=reply, after={"request": first, "delay_s": 0.1})
    config = EngineConfig(base_url=scripted_server.url, timeout_s=5.0, run_id="t", modelled_done=True)
    plan = make_plan("closed-loop", speed=1.0)
    outcome = run_trace(
        read_trace(path), plan, config, tmp_path / "r.jsonl", {"kind": "scripted"}, keep_records=True
    )
    one, two = sorted(outcome.results, key=lambda r: r["id"])
    # due at 0 + 0.05 modelled + 0.1 tool time: sent as soon as the reply is in (0.3 s), not 0.1 s later
    assert two["scheduled_s"] == pytest.approx(one["scheduled_s"] + 0.15, abs=0.002)
    assert two["sent_s"] < one["sent_s"] + one["latency_s"] + 0.08


def test_workers_and_shards_from_the_cli_cover_every_request_once(scripted_server, tmp_path):
    scripted_server.default = Script(usage=USAGE)
    trace = _many_sessions(tmp_path / "t.jsonl", sessions=6, turns=2)
    url = scripted_server.url
    merged = tmp_path / "w.jsonl"
    assert (
        _cli("run", str(trace), "--target", url, "--out", str(merged), "--workers", "2", "--quiet").returncode
        == 0
    )
    assert sorted(r["id"] for r in read_results(merged).requests) == list(range(1, 13))
    assert (tmp_path / "w.part1of2.jsonl").exists() and (tmp_path / "w.part2of2.jsonl").exists()
    parts = []
    for i in (1, 2):
        part = tmp_path / f"s{i}.jsonl"
        assert (
            _cli(
                "run", str(trace), "--target", url, "--out", str(part), "--shard", f"{i}/2", "--quiet"
            ).returncode
            == 0
        )
        parts.append(read_results(part))
    ids = [r["id"] for res in parts for r in res.requests]
    assert sorted(ids) == list(range(1, 13))  # each request replayed by exactly one shard
    assert {p.run["target"]["shard"] for p in parts} == {"1/2", "2/2"}
    bad = _cli("run", str(trace), "--target", url, "--out", str(tmp_path / "x.jsonl"), "--shard", "3/2")
    assert bad.returncode == 2 and "--shard must be i/N" in bad.stderr


def test_run_on_the_simulator_records_the_servers_log_memory_and_build(tmp_path):
    out = tmp_path / "r.jsonl"
    result = _cli("run", str(SAMPLE), "--target", "sim", "--out", str(out), "--quiet")
    assert result.returncode == 0, result.stderr
    objs = lines(out)
    run = objs[0]
    assert run["target"]["kind"] == "sim" and run["target"]["build"]["pid"]
    assert run["target"]["effective"]["kv_disk_budget_mib"] == 4096  # from the server's startup log
    kinds = {o["kind"] for o in objs}
    assert {"run", "request", "summary", "server", "metrics", "memory"} <= kinds
    (memory,) = [o for o in objs if o["kind"] == "memory"]
    assert memory["pid"] == run["target"]["build"]["pid"] and memory["peak_rss_bytes"] > 10 << 20
    requests = [o for o in objs if o["kind"] == "request"]
    assert all(r["reprocessed_source"] == "server" and r["modelled"]["total_s"] > 0 for r in requests)
    restores = [o for o in objs if o["kind"] == "server" and o.get("event") == "restore"]
    assert restores and all(o["request_seq"] for o in restores)


def test_responses_chains_are_remade_with_the_servers_own_response_ids(scripted_server, tmp_path):
    """A request recorded with `previous_response_id` goes with the id this run's server gave the
    earlier reply and only the messages after it; instructions go every time (never inherited),
    also when only the later request has them."""
    path = tmp_path / "chain.jsonl"
    reply = {"message": {"role": "assistant", "content": "x"}, "finish": "stop", "output_tokens": 3}
    with TraceWriter(path, source="test") as w:
        w.session("c", api="openai-responses")
        user = [{"role": "user", "content": "a"}]
        w.request("c", 0.0, user, {"max_tokens": 3}, reply=reply)
        later = [
            {"role": "system", "content": "inst"},
            *user,
            reply["message"],
            {"role": "user", "content": "b"},
        ]
        w.request("c", 1.0, later, {"max_tokens": 3, "previous_response": 1}, reply=reply)
        third = [*later, reply["message"], {"role": "user", "content": "c"}]
        w.request("c", 2.0, third, {"max_tokens": 3, "previous_response": 2}, reply=reply)
    outcome = replay(scripted_server, path, tmp_path / "r.jsonl")
    assert outcome.exit_code == 0
    first, second, last = (s.body for s in scripted_server.seen[-3:])
    assert "previous_response_id" not in first and "instructions" not in first
    for body, text in ((second, "b"), (last, "c")):
        assert body["previous_response_id"] == "resp_scripted" and body["instructions"] == "inst"
        assert body["input"] == [
            {"type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]}
        ]


def test_a_recording_runs_the_engines_it_is_given_each_carrying_the_last_ones_state(
    scripted_server, tmp_path, monkeypatch
):
    # A run that restarts its server: one engine per part of the trace, the later ones made with
    # the earlier ones' sessions, switch tracker and request index; the recording builds none.
    import replay.runs.recording as recording_module
    from replay.runs.pipeline import _detach  # what a run that restarts its server sends next

    scripted_server.default = Script(usage=USAGE)
    trace = read_trace(SAMPLE)
    plan, config = make_plan("alternate"), EngineConfig(base_url=scripted_server.url, timeout_s=5.0)
    built: list[Engine] = []

    class Counted(Engine):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            built.append(self)

    monkeypatch.setattr(recording_module, "Engine", Counted)
    recording = Recording(trace, plan, config, tmp_path / "r.jsonl", {"kind": "scripted"}, True)
    head, tail = trace.requests[:4], trace.requests[4:]
    first = Engine(
        dataclasses.replace(trace, requests=head),
        plan,
        config,
        recording.sink,
        by_id=trace.by_id(),  # every request of the trace: the later part's replies are found
        release_replies=False,  # the second part reads the replies the first would drop
    )
    recording.take(first)
    assert run_engines([recording], 30) == "done"
    second = Engine(
        dataclasses.replace(trace, requests=_detach(tail, first.sessions, first.by_id)),
        plan,
        config,
        recording.sink,
        by_id=first.by_id,
        tracker=first.tracker,
        sessions=first.sessions,
        release_replies=False,
    )
    assert (second.by_id, second.tracker, second.sessions) == (first.by_id, first.tracker, first.sessions)
    assert second.sessions is first.sessions and not second.release_replies
    recording.take(second)
    assert run_engines([recording], 30) == "done"
    (outcome,) = close_all([recording], "done")
    assert outcome.requests == 9 and built == []  # no engine made and thrown away
    switches = [r["switch"] for r in read_results(tmp_path / "r.jsonl").requests]
    assert ["cold"] not in switches[4:]  # the second engine knew the sessions the first had sent
    with pytest.raises(ValueError, match="sink"):
        recording.take(Engine(trace, plan, config, lambda rec: None))
