"""The reference server's own ceiling, measured with wrk (native C, Debian's `wrk` package).

If the server could not go much faster than the clients under test, their "max rate" would be
the server's. wrk drives it with keep-alive connections, plain (GET /v1/models) and streamed
(the same 64-token reply the clients get, with no first-token delay).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

from bench.server import RunningServer

_LUA = """wrk.method = "POST"
wrk.headers["Content-Type"] = "application/json"
wrk.body = '{"model":"ref","messages":[{"role":"user","content":"hello"}],"stream":true,"max_tokens":64,"bench":{"first_token_ms":0}}'
"""
_RATE = re.compile(r"Requests/sec:\s+([\d.]+)")
_LAT = re.compile(r"^\s+(50|99)(?:\.000)?%\s+([\d.]+)(us|ms|s)\s*$", re.M)
_UNIT = {"us": 1e-3, "ms": 1.0, "s": 1e3}


def ensure_wrk(log) -> tuple[str | None, str]:
    """wrk's path, installing Debian's package when possible; else None and why."""
    found = shutil.which("wrk")
    if found:
        return found, "found"
    apt = shutil.which("apt-get")
    if apt is None or os.geteuid() != 0:
        return (
            None,
            "wrk is missing and cannot be installed here (needs root and apt-get: apt-get install -y wrk)",
        )
    log("installing wrk with apt-get ...")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    done = subprocess.run([apt, "install", "-y", "-qq", "wrk"], capture_output=True, env=env, check=False)
    if done.returncode != 0:
        subprocess.run([apt, "update", "-qq"], capture_output=True, env=env, check=False)
        done = subprocess.run([apt, "install", "-y", "-qq", "wrk"], capture_output=True, env=env, check=False)
    found = shutil.which("wrk")
    if found:
        return found, "installed with apt-get"
    return None, f"wrk is missing and apt-get install failed: {done.stderr.decode().strip()[-160:]}"


def parse_wrk(text: str) -> dict[str, float | None]:
    rate = _RATE.search(text)
    lat = {m.group(1): float(m.group(2)) * _UNIT[m.group(3)] for m in _LAT.finditer(text)}
    return {
        "rate": float(rate.group(1)) if rate else None,
        "latency_p50_ms": lat.get("50"),
        "latency_p99_ms": lat.get("99"),
    }


def ceiling(srv: RunningServer, work: Path, duration_s: float, log) -> dict[str, Any]:
    wrk, how = ensure_wrk(log)
    out: dict[str, Any] = {"wrk": how, "server": srv.note, "loop": srv.loop}
    if wrk is None:
        out["status"] = "missing"
        return out
    lua = work / "stream.lua"
    lua.write_text(_LUA)
    for name, extra in (
        ("plain", [f"{srv.url}/v1/models"]),
        ("streamed", ["-s", str(lua), f"{srv.url}/v1/chat/completions"]),
    ):
        cpu0, t0 = srv.cpu_s(), time.perf_counter()
        argv = [wrk, "-t1", "-c64", f"-d{duration_s:g}s", "--latency", *extra]
        done = subprocess.run(argv, capture_output=True, text=True, timeout=duration_s + 60, check=False)
        used = (srv.cpu_s() - cpu0) / (time.perf_counter() - t0)
        out[name] = {**parse_wrk(done.stdout), "server_cpu": round(used, 3)}
        if done.returncode != 0:
            out[name]["error"] = done.stderr.strip()[-200:]
    srv.clear()
    out["status"] = "ok"
    return out
