"""End to end: `python -m replay.sim --server llama` as a child process, driven over HTTP.

Each test starts its own simulator (explicit PID, 127.0.0.1, `--port 0`) on a generated test
model, waits for llama-server's readiness line and stops it with one SIGTERM by PID.
"""

from __future__ import annotations

import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest

from drivers.logs import llamacpp as ll
from drivers.logs.effective import llamacpp_settings
from replay.serverside.llamacpp import assemble
from replay.sim.server.flags import flag_problem
from replay.testing.gguf_model import make_model
from replay.trace.synth import synth_text

pytestmark = pytest.mark.e2e

READY = re.compile(r"server is listening on http://127\.0\.0\.1:(\d+)")


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("models")
    return {
        "llama": make_model(d / "tiny-llama.gguf"),
        "gemma2": make_model(d / "tiny-gemma2.gguf", arch="gemma2", swa=256),
    }


class LlamaSim:
    """One simulator child process serving llama-server; its stderr (the log) collected by line."""

    def __init__(self, *args: str, scale: float = 100.0, cwd: Path | None = None) -> None:
        cmd = [
            sys.executable,
            "-m",
            "replay.sim",
            "--server",
            "llama",
            "--port",
            "0",
            "--time-scale",
            str(scale),
            *args,
        ]
        self.proc = subprocess.Popen(
            cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, cwd=cwd
        )
        self.lines: list[str] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        deadline = time.monotonic() + 60
        port = None
        while port is None and time.monotonic() < deadline:
            for line in list(self.lines):
                if m := READY.search(line):
                    port = m.group(1)
            if self.proc.poll() is not None:
                break
            time.sleep(0.02)
        if port is None:
            self.stop()
            raise AssertionError("simulator did not start:\n" + "\n".join(self.lines[-20:]))
        self.url = f"http://127.0.0.1:{port}"

    def _read(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self.lines.append(line.rstrip("\n"))

    def chat(self, text: str, max_tokens: int = 8, **extra: Any) -> httpx.Response:
        body = {"messages": [{"role": "user", "content": text}], "max_tokens": max_tokens, **extra}
        return httpx.post(f"{self.url}/v1/chat/completions", json=body, timeout=60)

    def action(self, slot: int, action: str, filename: str) -> httpx.Response:
        return httpx.post(f"{self.url}/slots/{slot}?action={action}", json={"filename": filename}, timeout=60)

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._reader.join(timeout=5)
        return self.proc.returncode

    def __enter__(self) -> LlamaSim:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def timings(r: httpx.Response) -> tuple[int, int]:
    assert r.status_code == 200, r.text
    t = r.json()["timings"]
    return t["cache_n"], t["prompt_n"]


def test_it_answers_as_llama_server_and_its_log_reads_as_llama_servers(models: dict[str, Path]) -> None:
    with LlamaSim("-m", str(models["llama"]), "-np", "1", "-c", "16384", "-lv", "4", "--metrics") as sim:
        a, b = synth_text(1500, 1), synth_text(1500, 2)
        got = [timings(sim.chat(t)) for t in (a, a, synth_text(1560, 1), b, synth_text(1560, 1))]
        # The captured real server's answers for these prompts (tests/data/llama/llama_server_basic).
        assert got == [(0, 1514), (1513, 1), (1505, 69), (5, 1509), (1573, 1)]
        r = sim.chat(a)
        body = r.json()
        assert body["usage"]["prompt_tokens_details"]["cached_tokens"] == body["timings"]["cache_n"]
        assert body["usage"]["prompt_tokens"] == body["timings"]["cache_n"] + body["timings"]["prompt_n"]
        assert (
            body["system_fingerprint"] == "b11549-sim" == httpx.get(f"{sim.url}/props").json()["build_info"]
        )
        slots = httpx.get(f"{sim.url}/slots").json()
        assert [s["id"] for s in slots] == [0] and slots[0]["n_prompt_tokens"] == 1514 + 7
        metrics = httpx.get(f"{sim.url}/metrics").text
        cached = sum(c for c, _ in got) + body["timings"]["cache_n"]
        assert f"llamacpp:prompt_tokens_cached_total {cached}\n" in metrics
    parsed = ll.parse_lines(sim.lines)
    assert parsed.stats.unrecognised == 0
    settings = llamacpp_settings(parsed.events)
    assert (
        settings["n_parallel"] == 1 and settings["cache_ram_mib"] == 8192 and settings["log_verbosity"] == 4
    )
    tasks, _ = assemble(parsed.events)
    assert [(t.prompt, t.cached) for t in tasks] == [
        (1514, 0),
        (1514, 1513),
        (1574, 1505),
        (1514, 5),
        (1574, 1573),
        (1514, 1505),
    ]


def test_a_slot_file_restores_checkpoints_on_b11549_and_not_on_b11063(
    models: dict[str, Path], tmp_path: Path
) -> None:
    """E5 on the sliding-window model: save, a new server, restore, resend with a changed end."""
    first, changed = synth_text(1500, 1), synth_text(1500, 1) + " and more words here"
    for build, resumed in (("11549", True), ("11063", False)):
        slots = tmp_path / build
        slots.mkdir()
        flags = (
            "-m",
            str(models["gemma2"]),
            "-np",
            "1",
            "--slot-save-path",
            str(slots),
            "-lv",
            "4",
            "--build",
            build,
        )
        with LlamaSim(*flags) as sim:
            assert timings(sim.chat(first)) == (0, 1514)
            saved = sim.action(0, "save", "doc.bin").json()
            assert saved["n_saved"] == 1521
        with LlamaSim(*flags) as sim:
            restored = sim.action(0, "restore", "doc.bin").json()
            assert (restored["n_restored"], restored["n_read"]) == (1521, saved["n_written"])
            cached, _ = timings(sim.chat(changed))
        assert (cached > 500) == resumed, build
        forcing = any("forcing full prompt re-processing" in line for line in sim.lines)
        assert forcing == (not resumed)


def test_refusals_are_llama_servers(models: dict[str, Path], tmp_path: Path) -> None:
    with LlamaSim("-m", str(models["llama"]), "-np", "1", "-c", "4096") as sim:
        assert sim.action(0, "save", "x.bin").status_code == 501  # no --slot-save-path
        assert httpx.get(f"{sim.url}/metrics").status_code == 501
        over = sim.chat(synth_text(5000, 3))
        assert over.status_code == 400
        err = over.json()["error"]
        assert err["type"] == "exceed_context_size_error" and err["n_ctx"] == 4096
        bad = httpx.post(
            f"{sim.url}/v1/chat/completions", json={"messages": [{"role": "user", "content": 3}]}
        )
        assert bad.status_code == 400
    (tmp_path / "s").mkdir()
    with LlamaSim("-m", str(models["llama"]), "--slot-save-path", str(tmp_path / "s"), "--no-slots") as sim:
        assert httpx.get(f"{sim.url}/slots").status_code == 501
        assert sim.action(0, "save", "../x.bin").json()["error"]["message"] == "Invalid filename"
        assert sim.action(0, "restore", "missing.bin").status_code == 400


def test_a_stream_is_shaped_as_llama_servers(models: dict[str, Path]) -> None:
    with LlamaSim("-m", str(models["llama"]), "-np", "1") as sim:
        body = {
            "messages": [{"role": "user", "content": "the cat"}],
            "max_tokens": 3,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        with httpx.stream("POST", f"{sim.url}/v1/chat/completions", json=body, timeout=30) as r:
            data = [line[6:] for line in r.iter_lines() if line.startswith("data: ")]
    chunks = [orjson.loads(d) for d in data[:-1]]
    assert data[-1] == "[DONE]"
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": None}
    assert [c["choices"][0]["delta"].get("content") for c in chunks[1:4]] and len(chunks) == 6
    assert chunks[4]["choices"][0]["finish_reason"] == "length" and "timings" in chunks[4]
    assert chunks[5]["choices"] == [] and chunks[5]["usage"]["completion_tokens"] == 3


def test_flags_llama_server_does_not_have_are_refused() -> None:
    assert flag_problem(["--server", "llama", "--kv-disk-dir", "x"]) is not None
    assert flag_problem(["--server", "llama", "-np", "2", "--cache-ram", "0", "-ctxcp", "4"]) is None
    assert flag_problem(["--preset", "qwen38-q2"]) is None  # ds4's stays the default
    done = subprocess.run(
        [sys.executable, "-m", "replay.sim", "--server", "llama", "--kv-disk-dir", "x"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2 and "--kv-disk-dir" in done.stderr
