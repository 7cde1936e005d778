"""Peer load generators (AIPerf, guidellm, inference-perf; vLLM's bench if it installs) on our server.

Each peer is its PyPI release in its own venv under the cache dir, driven against the same
reference server with the same request shape (streamed chat, 64-token replies, 20 ms to the first
token), closed loop at a ladder of concurrencies. Its per-request TTFTs are read from its own
export and matched with the server's truth: by X-Request-ID where the peer sends one (AIPerf),
else by the server id `#N` that starts every reply and chat id (guidellm, inference-perf).
Rate and CPU come from the server's stamps and from sampling the peer's process tree, so every
tool, ours included, is measured the same way.
"""

from __future__ import annotations

import contextlib
import glob
import json
import os
import re
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson
import psutil

from bench.server import RunningServer
from bench.stats import ErrorStats, ttft_errors
from replay.trace.synth import WORDS

AIPERF, GUIDELLM, INFERENCE_PERF, VLLM = "aiperf", "guidellm", "inference-perf", "vllm"
VERSIONS = {AIPERF: "0.13.0", GUIDELLM: "0.8.1", INFERENCE_PERF: "0.7.0", VLLM: "0.33.0"}
INSTALL_TIMEOUT_S = 1800
_SERVER_ID = re.compile(r"#(\d+)")

Record = tuple[int, str, float]  # (concurrency, truth key, client TTFT ms)


# --- interpreters and venvs ----------------------------------------------------------------


def _version_of(python: str) -> tuple[int, int] | None:
    try:
        out = subprocess.run(
            [python, "-c", "import sys; print(*sys.version_info[:2])"],
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    parts = out.stdout.split()
    return (int(parts[0]), int(parts[1])) if out.returncode == 0 and len(parts) == 2 else None


def find_python(minimum: tuple[int, int]) -> tuple[str | None, str]:
    """An interpreter >= `minimum`: this one, pythonX.Y on PATH, pyenv's versions, or uv's."""
    if sys.version_info[:2] >= minimum:
        return sys.executable, "this interpreter"
    candidates: list[str] = []
    for minor in range(minimum[1], minimum[1] + 4):
        name = f"python{minimum[0]}.{minor}"
        candidates += sorted(
            glob.glob(os.path.expanduser(f"~/.pyenv/versions/{minimum[0]}.{minor}.*/bin/{name}")),
            reverse=True,
        )
        found = shutil.which(name)
        if found and "/shims/" not in found:
            candidates.append(found)
    uv = shutil.which("uv")
    if uv:
        out = subprocess.run(
            [uv, "python", "find", f">={minimum[0]}.{minimum[1]}"],
            capture_output=True,
            text=True,
            check=False,
        )
        if out.returncode == 0 and out.stdout.strip():
            candidates.append(out.stdout.strip())
    for cand in candidates:
        version = _version_of(cand)
        if version and version >= minimum:
            return cand, cand
    return (
        None,
        f"no Python >= {minimum[0]}.{minimum[1]} found (looked on PATH, in ~/.pyenv/versions and with uv)",
    )


@dataclass(slots=True)
class Venv:
    name: str
    path: Path
    ok: bool = False
    reason: str = ""
    size_mib: float | None = None
    python: str | None = None

    @property
    def bin(self) -> Path:
        return self.path / "bin"


def _dir_mib(path: Path) -> float:
    total = 0
    for root, _dirs, files in os.walk(path):
        for f in files:
            with contextlib.suppress(OSError):  # a file removed while we walk
                total += os.lstat(os.path.join(root, f)).st_size
    return round(total / 2**20, 1)


def ensure_venv(
    cache: Path, name: str, python: str, packages: list[list[str]], log: Callable[[str], None]
) -> Venv:
    """A venv at `cache/name` with `packages` installed (each list is one pip install), reused when done."""
    venv = Venv(name=name, path=(cache / name).resolve(), python=python)
    marker = venv.path / ".replay-bench.json"
    want = {"packages": packages}
    if marker.exists() and orjson.loads(marker.read_bytes()) == want:
        venv.ok, venv.size_mib = True, _dir_mib(venv.path)
        return venv
    cache.mkdir(parents=True, exist_ok=True)
    shutil.rmtree(venv.path, ignore_errors=True)
    install_log = cache / f"{name}.install.log"
    log(f"installing {name} into {venv.path} (log: {install_log}) ...")
    with open(install_log, "wb") as out:
        steps = [[python, "-m", "venv", str(venv.path)]]
        steps += [
            [str(venv.bin / "python"), "-m", "pip", "install", "--disable-pip-version-check", "-q", *pkgs]
            for pkgs in packages
        ]
        for argv in steps:
            try:
                done = subprocess.run(
                    argv, stdout=out, stderr=subprocess.STDOUT, timeout=INSTALL_TIMEOUT_S, check=False
                )
            except subprocess.TimeoutExpired:
                venv.reason = f"install timed out after {INSTALL_TIMEOUT_S}s: {' '.join(argv[-3:])}"
                return venv
            if done.returncode != 0:
                venv.reason = (
                    f"install failed ({' '.join(argv[3:])}), exit {done.returncode}; see {install_log}"
                )
                return venv
    marker.write_bytes(orjson.dumps(want))
    venv.ok, venv.size_mib = True, _dir_mib(venv.path)
    return venv


def local_cpu_torch(python: str) -> str | None:
    """A CPU-only torch wheel for `python` in pip's find-links dirs (or $REPLAY_BENCH_TORCH_WHEEL)."""
    env = os.environ.get("REPLAY_BENCH_TORCH_WHEEL")
    if env and Path(env).exists():
        return env
    version = _version_of(python)
    if version is None:
        return None
    out = subprocess.run([python, "-m", "pip", "config", "list"], capture_output=True, text=True, check=False)
    dirs = [
        v.strip("'\"")
        for line in out.stdout.splitlines()
        if "find-links" in line
        for v in line.split("=", 1)[1:]
    ]
    for links in dirs:
        for d in links.split():
            found = sorted(
                glob.glob(
                    os.path.join(d.removeprefix("file://"), f"torch-*+cpu-cp{version[0]}{version[1]}-*.whl")
                )
            )
            if found:
                return found[-1]
    return None


def tokenizer_dir(venv: Venv, cache: Path) -> Path:
    """A small local word-level tokenizer (our synthetic vocabulary): the peers need one, the hub is unreachable."""
    out = cache / "tokenizer"
    if (out / "tokenizer.json").exists():
        return out
    out.mkdir(parents=True, exist_ok=True)
    script = (
        "import json,sys\n"
        "from tokenizers import Tokenizer, models, pre_tokenizers, decoders\n"
        "vocab={'[UNK]':0}\n"
        "for w in json.loads(sys.argv[2]): vocab.setdefault(w, len(vocab))\n"
        "tok=Tokenizer(models.WordLevel(vocab=vocab, unk_token='[UNK]'))\n"
        "tok.pre_tokenizer=pre_tokenizers.WhitespaceSplit()\n"
        "tok.decoder=decoders.WordPiece(prefix='##', cleanup=False)\n"
        "tok.save(sys.argv[1]+'/tokenizer.json')\n"
        "json.dump({'tokenizer_class':'PreTrainedTokenizerFast','unk_token':'[UNK]','model_max_length':1000000}, open(sys.argv[1]+'/tokenizer_config.json','w'))\n"
    )
    subprocess.run(
        [str(venv.bin / "python"), "-c", script, str(out), json.dumps(list(WORDS))],
        check=True,
        capture_output=True,
    )
    return out


# --- measuring a peer ----------------------------------------------------------------------


class TreeCpu:
    """Samples the CPU time of a process tree, so CPU can be cut to the load window afterwards."""

    def __init__(self, pid: int, every_s: float = 0.1) -> None:
        self.pid = pid
        self.every_s = every_s
        self.samples: list[tuple[int, float]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> TreeCpu:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(5)

    def _total(self) -> float | None:
        try:
            root = psutil.Process(self.pid)
            procs = [root, *root.children(recursive=True)]
        except psutil.Error:
            return None
        total = 0.0
        for p in procs:
            try:
                t = p.cpu_times()
            except psutil.Error:
                continue
            total += t.user + t.system + t.children_user + t.children_system
        return total

    def _run(self) -> None:
        while not self._stop.is_set():
            total = self._total()
            if total is not None:
                self.samples.append((time.perf_counter_ns(), total))
            self._stop.wait(self.every_s)

    def between(self, start_ns: int, end_ns: int) -> float | None:
        """CPU seconds used between two moments (linear between samples)."""

        def at(t: int) -> float | None:
            prev = None
            for ts, cpu in self.samples:
                if ts >= t:
                    if prev is None:
                        return cpu
                    (t0, c0) = prev
                    return c0 + (cpu - c0) * (t - t0) / max(ts - t0, 1)
                prev = (ts, cpu)
            return prev[1] if prev else None

        a, b = at(start_ns), at(end_ns)
        return None if a is None or b is None else b - a


@dataclass(slots=True)
class PeerPoint:
    concurrency: int
    requests: int = 0
    rate: float = 0.0  # completed per second, from the server's own stamps
    cpu_ms_per_request: float | None = None
    error: ErrorStats = field(default_factory=ErrorStats)

    def to_json(self) -> dict[str, Any]:
        return {
            "concurrency": self.concurrency,
            "requests": self.requests,
            "rate": self.rate,
            "cpu_ms_per_request": self.cpu_ms_per_request,
            "ttft_error": self.error.to_json(),
        }


def points_from(records: list[Record], truth: dict[str, list[Any]], cpu: TreeCpu | None) -> list[PeerPoint]:
    """Group a peer's records by concurrency; rate and CPU over each group's server-stamped window."""
    out: list[PeerPoint] = []
    for c in sorted({r[0] for r in records}):
        mine = {key: ttft for cc, key, ttft in records if cc == c}
        rows = [truth[k] for k in mine if k in truth and truth[k][4] is not None]
        point = PeerPoint(concurrency=c, error=ttft_errors(mine, truth))
        point.requests = len(rows)
        if rows:
            start, end = min(r[2] for r in rows), max(r[4] for r in rows)
            span = (end - start) / 1e9
            point.rate = round(len(rows) / span, 1) if span > 0 else 0.0
            used = cpu.between(start, end) if cpu else None
            point.cpu_ms_per_request = round(used / len(rows) * 1e3, 3) if used is not None else None
        out.append(point)
    return out


def _run_logged(
    argv: list[str], log_path: Path, timeout_s: float, cwd: Path, env: dict[str, str] | None = None
) -> tuple[int, TreeCpu]:
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            argv,
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=cwd,
            env={**os.environ, **(env or {})},
            start_new_session=True,
        )
        with TreeCpu(proc.pid) as cpu:
            try:
                code = proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, 9)  # the group of the process we started, nothing else
                proc.wait()
                code = -9
    return code, cpu


# --- the peers -----------------------------------------------------------------------------


def run_aiperf(
    venv: Venv, tok: Path, url: str, ladder: list[int], duration_s: float, work: Path
) -> tuple[list[Record], TreeCpu, str]:
    out = work / "aiperf"
    shutil.rmtree(out, ignore_errors=True)
    argv = [
        str(venv.bin / "aiperf"), "profile", "--model", "ref", "--tokenizer", str(tok), "--url", url,
        "--endpoint-type", "chat", "--streaming", "--concurrency", ",".join(map(str, ladder)),
        "--benchmark-duration", str(duration_s), "--benchmark-grace-period", "10",
        "--prompt-input-tokens-mean", "200", "--prompt-input-tokens-stddev", "0",
        "--prompt-output-tokens-mean", "64", "--prompt-output-tokens-stddev", "0",
        "--ui", "none", "--artifact-dir", str(out), "--export-level", "records",
        "--no-server-metrics", "--no-gpu-telemetry",
    ]  # fmt: skip
    code, cpu = _run_logged(argv, work / "aiperf.log", 120 + len(ladder) * (duration_s + 60), work)
    records: list[Record] = []
    for c in ladder:
        path = out / (f"concurrency_{c}" if len(ladder) > 1 else "") / "profile_export.jsonl"
        if not path.exists():
            continue
        for line in path.read_bytes().splitlines():
            obj = orjson.loads(line)
            ttft = (obj.get("metrics") or {}).get("time_to_first_token")
            if ttft and not obj.get("error"):
                records.append((c, obj["metadata"]["x_request_id"], float(ttft["value"])))
    return records, cpu, "" if code == 0 else f"aiperf exited {code}; see {work / 'aiperf.log'}"


def run_guidellm(
    venv: Venv, tok: Path, url: str, ladder: list[int], duration_s: float, work: Path
) -> tuple[list[Record], TreeCpu, str]:
    out = work / "guidellm.json"
    out.unlink(missing_ok=True)
    argv = [
        str(venv.bin / "guidellm"), "run",
        "--backend", f"kind=openai_http,target={url},model=ref,request_format=/v1/chat/completions",
        "--profile", "kind=concurrent,streams=1", "--override", "profile.streams", ",".join(map(str, ladder)),
        "--data", "kind=synthetic_text,prompt_tokens=200,output_tokens=64",
        "--tokenizer", f"kind=huggingface_auto,model={tok}",
        "--constraint", f"kind=max_duration,seconds={duration_s:g}",
        "--output", f"kind=json,path={out}", "--disable-console-interactive",
    ]  # fmt: skip
    code, cpu = _run_logged(argv, work / "guidellm.log", 180 + len(ladder) * (duration_s + 30), work)
    records: list[Record] = []
    if out.exists():
        doc = orjson.loads(out.read_bytes())
        for bench in doc.get("benchmarks", []):
            streams = ((bench.get("config") or {}).get("strategy") or {}).get("streams")
            for req in (bench.get("requests") or {}).get("successful", []):
                m = _SERVER_ID.match(req.get("output") or "")
                if m and req.get("time_to_first_token_ms") is not None:
                    records.append(
                        (int(streams or 0), f"#{m.group(1)}", float(req["time_to_first_token_ms"]))
                    )
    return records, cpu, "" if code == 0 else f"guidellm exited {code}; see {work / 'guidellm.log'}"


def run_inference_perf(
    venv: Venv, tok: Path, url: str, ladder: list[int], duration_s: float, work: Path, est_rate: float = 800.0
) -> tuple[list[Record], TreeCpu | None, str]:
    """One invocation per concurrency: its records carry no stage, and each run is quick to start."""
    records: list[Record] = []
    cpus: list[TreeCpu] = []
    problems: list[str] = []
    for c in ladder:
        out = work / f"inference-perf-c{c}"
        shutil.rmtree(out, ignore_errors=True)
        n = max(c * 4, int(min(est_rate, c * 50) * duration_s))
        config = {
            "api": {"type": "chat", "streaming": True, "headers": {"X-Bench-Tokens": "64"}},
            "data": {"type": "mock"},
            "load": {"type": "concurrent", "stages": [{"num_requests": n, "concurrency_level": c}]},
            "server": {"type": "vllm", "model_name": "ref", "base_url": url, "ignore_eos": True},
            "tokenizer": {"pretrained_model_name_or_path": str(tok)},
            "report": {"request_lifecycle": {"summary": True, "per_stage": False, "per_request": True}},
            "storage": {"local_storage": {"path": str(out)}},
        }
        cfg = work / f"inference-perf-c{c}.json"  # YAML is a superset of JSON
        cfg.write_text(json.dumps(config))
        code, cpu = _run_logged(
            [str(venv.bin / "inference-perf"), "-c", str(cfg)],
            work / f"inference-perf-c{c}.log",
            120 + duration_s * 6,
            work,
        )
        cpus.append(cpu)
        if code != 0:
            problems.append(f"inference-perf c={c} exited {code}")
        path = out / "per_request_lifecycle_metrics.json"
        if not path.exists():
            continue
        for req in orjson.loads(path.read_bytes()):
            if req.get("error"):
                continue
            metrics = (req.get("info") or {}).get("response_metrics") or {}
            times = metrics.get("output_token_times") or []
            m = _SERVER_ID.search(
                (metrics.get("response_chunks") or [""])[0]
                if metrics.get("response_chunks")
                else req.get("response") or ""
            )
            if times and m:
                records.append((c, f"#{m.group(1)}", (times[0] - req["start_time"]) * 1e3))
    merged = _MergedCpu(cpus)
    return records, merged, "; ".join(problems)


class _MergedCpu(TreeCpu):
    """Several runs' samplers read as one (their windows never overlap)."""

    def __init__(self, parts: list[TreeCpu]) -> None:
        self.parts = parts

    def between(self, start_ns: int, end_ns: int) -> float | None:
        for part in self.parts:
            if part.samples and part.samples[0][0] <= start_ns and part.samples[-1][0] >= end_ns:
                return part.between(start_ns, end_ns)
        return None


def vllm_verdict(cache: Path, log: Callable[[str], None], allow_slow_check: bool) -> dict[str, Any]:
    """Can vLLM's `bench serve` be installed without a GPU? Decided from pip's own resolution."""
    version = VERSIONS[VLLM]
    report = cache / f"vllm-{version}.dry-run.json"
    if not report.exists():
        if not allow_slow_check:
            return {
                "status": "not-checked",
                "reason": "pip's dry-run resolution of vllm takes ~3 min; run without --quick to check",
            }
        log("resolving vllm with pip --dry-run (no download of the wheels; ~3 min) ...")
        cache.mkdir(parents=True, exist_ok=True)
        done = subprocess.run(
            [
                sys.executable,
                "-m",
                "pip",
                "install",
                "--dry-run",
                "--ignore-installed",
                "-q",
                "--report",
                str(report),
                f"vllm=={version}",
            ],
            capture_output=True,
            timeout=900,
            check=False,
        )
        if done.returncode != 0:
            return {
                "status": "not-installable",
                "reason": f"pip could not resolve vllm=={version}: {done.stderr.decode()[-200:]}",
            }
    doc = orjson.loads(report.read_bytes())
    names = [(i["metadata"]["name"], i["metadata"]["version"]) for i in doc.get("install", [])]
    cuda = sorted(n for n, _ in names if n.startswith("nvidia-"))
    torch = next((v for n, v in names if n == "torch"), None)
    if cuda:
        return {
            "status": "not-installed",
            "reason": f"vllm {version} pins torch=={torch}, whose PyPI wheel pulls {len(cuda)} CUDA packages "
            f"({', '.join(cuda[:4])}, ...; several GB) and there is no CPU wheel for it on PyPI; a GPU-less install is not possible",
            "packages": len(names),
        }
    return {"status": "installable", "reason": "no CUDA packages in the resolution", "packages": len(names)}


@dataclass(slots=True)
class PeerResult:
    name: str
    version: str
    status: str = "ok"  # ok | failed | not-installed | not-checked
    reason: str = ""
    venv_mib: float | None = None
    python: str | None = None
    points: list[PeerPoint] = field(default_factory=list)

    @property
    def best(self) -> PeerPoint | None:
        rated = [p for p in self.points if p.requests]
        return max(rated, key=lambda p: p.rate) if rated else None

    def point(self, concurrency: int) -> PeerPoint | None:
        return next((p for p in self.points if p.concurrency == concurrency), None)

    def to_json(self) -> dict[str, Any]:
        best = self.best
        one = self.point(1)
        return {
            "name": self.name,
            "version": self.version,
            "status": self.status,
            "reason": self.reason,
            "venv_mib": self.venv_mib,
            "python": self.python,
            "max_rate": best.rate if best else None,
            "max_rate_concurrency": best.concurrency if best else None,
            "error_p50_at_max_ms": best.error.p50_ms if best else None,
            "error_p99_at_max_ms": best.error.p99_ms if best else None,
            "cpu_ms_per_request_at_max": best.cpu_ms_per_request if best else None,
            "error_1_stream": one.error.to_json() if one else None,
            "points": [p.to_json() for p in self.points],
        }


def run_peer(
    name: str,
    srv: RunningServer,
    cache: Path,
    work: Path,
    ladder: list[int],
    duration_s: float,
    log: Callable[[str], None],
) -> PeerResult:
    """Install (once) and drive one peer; never raises for the peer's own failures."""
    result = PeerResult(name=name, version=VERSIONS[name])
    minimum = (3, 12) if name == INFERENCE_PERF else (3, 11)
    python, where = find_python(minimum)
    if python is None:
        result.status, result.reason = (
            "not-installed",
            f"{name} needs Python >= {minimum[0]}.{minimum[1]}: {where}",
        )
        return result
    result.python = python
    packages = [[f"{name}=={VERSIONS[name]}"]]
    if name == GUIDELLM:
        wheel = local_cpu_torch(python)
        if wheel is None:
            result.status = "not-installed"
            result.reason = (
                "guidellm hard-depends on torch; PyPI's Linux torch pulls CUDA wheels (~6 GB venv) and no CPU torch "
                "wheel was found in pip's find-links (set REPLAY_BENCH_TORCH_WHEEL to one)"
            )
            return result
        packages = [[wheel], *packages]
    venv = ensure_venv(cache, name, python, packages, log)
    result.venv_mib = venv.size_mib
    if not venv.ok:
        result.status, result.reason = "not-installed", venv.reason
        return result
    tok = tokenizer_dir(venv, cache)
    work.mkdir(parents=True, exist_ok=True)
    srv.clear()
    log(f"driving {name} at concurrency {','.join(map(str, ladder))} ({duration_s:g} s each) ...")
    runner = {AIPERF: run_aiperf, GUIDELLM: run_guidellm, INFERENCE_PERF: run_inference_perf}[name]
    records, cpu, problem = runner(venv, tok, srv.url, ladder, duration_s, work)
    truth = srv.truth(clear=True)
    result.points = points_from(records, truth, cpu)
    if not records:
        result.status, result.reason = "failed", problem or f"{name} produced no per-request records"
    elif problem:
        result.reason = problem
    return result
