"""The llamacpp kind end to end on the xllamacpp wheel: same target file, a real llama.cpp server."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import httpx
import psutil
import pytest

from drivers.launch import start_target

pytestmark = [
    pytest.mark.llama,
    pytest.mark.e2e,
    pytest.mark.skipif(
        importlib.util.find_spec("xllamacpp") is None, reason="xllamacpp is not installed (the [llama] extra)"
    ),
]


def test_llamacpp_target_on_xllamacpp(tmp_path: Path) -> None:
    from replay.testing.gguf_model import make_model

    model = make_model(tmp_path / "tiny.gguf")
    toml = tmp_path / "x.toml"
    toml.write_text(
        f"kind = 'llamacpp'\nbinary = 'xllamacpp'\nmodel = '{model}'\nflags = ['-c', '2048', '-t', '1']\n"
        "ready_timeout = 60\nstop_timeout = 10\n"
    )
    with start_target(toml, tmp_path / "run") as served:
        assert served.build["version"].startswith("xllamacpp ")
        assert served.build["argv"][-4:] == ["-c", "2048", "-t", "1"]
        body = {"messages": [{"role": "user", "content": "the cat"}], "max_tokens": 3, "temperature": 0}
        r = httpx.post(f"{served.url}/v1/chat/completions", json=body, timeout=30)
        assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 3
        assert "llamacpp:prompt_tokens_total" in httpx.get(f"{served.url}/metrics", timeout=10).text
        pid = served.pid
    assert served.process is not None and served.process.stop().how == "terminated"
    assert not psutil.pid_exists(pid)
