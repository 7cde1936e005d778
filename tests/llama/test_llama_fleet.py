"""SGLang's router (kind `sglang-router`, the [fleet] extra) in front of two real llama-servers
(xllamacpp, `replicas = 2`): each started and stopped by its PID, conversations kept on the server
that holds them under the cache-aware policy."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

from replay.metrics.results import read_results
from replay.trace import TraceWriter
from tests.support.llamakit import require_xllamacpp

pytestmark = pytest.mark.llama


def _router_or_skip() -> None:
    if importlib.util.find_spec("sglang_router") is None:
        if os.environ.get("REPLAY_REQUIRE_FLEET") == "1":
            pytest.fail("REPLAY_REQUIRE_FLEET=1 but sglang-router is not installed (pip install '.[fleet]')")
        pytest.skip("sglang-router is not installed (the [fleet] extra)")


def _trace(path: Path, sessions: int = 3, turns: int = 3) -> Path:
    with TraceWriter(path, source="test") as w:
        for s in range(sessions):
            w.session(f"s{s}")
        for turn in range(turns):
            for s in range(sessions):
                msgs = [
                    {"role": "user", "content": " ".join(f"s{s}t{t}w{i}" for i in range(60))}
                    for t in range(turn + 1)
                ]
                w.request(f"s{s}", turn * 0.05 + s * 0.01, msgs, {"max_tokens": 4})
    return path


@pytest.mark.parametrize("policy", ["cache_aware", "round_robin"])
def test_a_cache_aware_router_keeps_each_conversation_on_the_llama_server_that_holds_it(
    tiny_llama: Path, tmp_path: Path, policy: str
) -> None:
    """Three conversations over two servers of two slots: cache-aware routing keeps each where its
    prompt is cached; round robin sends every other turn to the server that never saw it."""
    require_xllamacpp()
    _router_or_skip()
    (tmp_path / "llamas.toml").write_text(
        f'kind = "llamacpp"\nname = "llama"\nbinary = "xllamacpp"\nmodel = "{tiny_llama}"\nreplicas = 2\n'
        'flags = ["-c", "8192", "-np", "2", "-t", "1"]\nready_timeout = 60\nstop_timeout = 10\n'
    )
    router = tmp_path / "router.toml"
    router.write_text(
        f'kind = "sglang-router"\npolicy = "{policy}"\nbackend = "llamas.toml"\nready_timeout = 120\n'
    )
    out = tmp_path / "r.jsonl"
    done = subprocess.run(
        [sys.executable, "-m", "replay", "run", str(_trace(tmp_path / "t.jsonl")), "--server", str(router),
         "--history", "recorded", "--timeout", "120", "--quiet", "--out", str(out)],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    res = read_results(out)
    workers = res.run["target"]["build"]["workers"]
    assert [w["kind"] for w in workers] == ["llamacpp", "llamacpp"] and len({w["pid"] for w in workers}) == 2
    last: dict[str, int] = {}
    stayed = 0
    for line in sorted(res.requests, key=lambda x: x["id"]):
        assert line["status"] == "ok", line
        before = last.get(line["session"])
        last[line["session"]] = line["prompt_tokens"]
        stayed += before is not None and line["cached_tokens"] >= before - 8
    if policy == "cache_aware":
        assert stayed == 6  # every continuing request found its previous prompt in its server's slot
    else:
        assert stayed < 6  # 3 sessions round 2 servers: a session's turns alternate servers
    pids = [res.run["target"]["build"]["pid"], *(w["pid"] for w in workers)]
    assert not any(psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE for p in pids)
