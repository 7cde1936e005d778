"""No command destroys a user's file (issue 33): every verb that writes one follows `replay.outputs`.

For each verb, on an output that already exists: the command failing after its checks (with
`--force`, so the failure comes later) leaves it byte for byte; the command that would succeed,
without `--force`, is refused in one line (exit 2) and leaves it byte for byte; with `--force` it
is replaced (a folder is written into). Paths that cannot be outputs (a folder, a missing parent,
a place no file can be made) are one line and exit 2 before anything is sent or started.
"""

from __future__ import annotations

import re
import socket
import subprocess
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from unittest import mock

import httpx
import orjson
import pytest

from drivers.process import ChildProcess
from replay.cli import main
from replay.trace.reader import validate
from tests.support.agentstores import MORNING, codex_rollout
from tests.support.trace_strategies import write_trace

PY = sys.executable
SAMPLE = Path(__file__).parent.parent.parent / "traces" / "sample.jsonl"
OLD = b"precious: a file the user has\n"


def replay(*args: object, timeout: float = 180) -> subprocess.CompletedProcess[str]:
    argv = [PY, "-m", "replay", *map(str, args)]
    return subprocess.run(argv, capture_output=True, text=True, timeout=timeout)


def one_line(proc: subprocess.CompletedProcess[str]) -> str:
    lines = [line for line in proc.stderr.splitlines() if line.strip() and "RuntimeWarning" not in line]
    assert len(lines) == 1, proc.stderr
    return lines[0]


def in_process(capsys: pytest.CaptureFixture[str], *args: object) -> subprocess.CompletedProcess[str]:
    """`replay ARGS` run by the CLI's own `main` in this process: for refusals, which start nothing."""
    argv = ["replay", *map(str, args)]
    with mock.patch.object(sys, "argv", argv), pytest.raises(SystemExit) as ended:
        main()
    captured = capsys.readouterr()
    return subprocess.CompletedProcess(argv, ended.value.code or 0, captured.out, captured.err)


def snapshot(path: Path) -> dict[str, bytes]:
    """Every file at or under `path`, by its path relative to `path`'s folder."""
    if path.is_file():
        return {path.name: path.read_bytes()}
    return {str(p.relative_to(path.parent)): p.read_bytes() for p in sorted(path.rglob("*")) if p.is_file()}


def temporaries(folder: Path) -> list[Path]:
    return [p for p in folder.rglob(".*.tmp")]


# ---- every verb ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Inputs:
    tmp: Path
    sim_url: str
    trace: Path  # three short requests: all of them fit the test simulator's context
    results: Path  # a run's results, for `report --html`
    bad_trace: Path  # line 3 is not JSON
    bad_results: Path
    codex_good: Path
    codex_bad: Path  # a second rollout, an hour later, ends in a broken line


@pytest.fixture(scope="module")
def inputs(tmp_path_factory: pytest.TempPathFactory, sim_url: str) -> Inputs:
    tmp = tmp_path_factory.mktemp("inputs")
    trace = write_trace(tmp / "short.jsonl", [
        {"kind": "trace", "format": "agent-replay-trace/1"},
        {"kind": "session", "id": "s", "api": "openai", "model": "m"},
        *({"kind": "request", "id": n, "session": "s", "t": 0, "params": {"max_tokens": 4},
           "append": [{"role": "user", "content": f"q{n}"}]} for n in (1, 2, 3)),
    ])  # fmt: skip
    results = tmp / "results.jsonl"
    proc = replay("run", trace, "--target", sim_url, "--out", results, "--quiet")
    assert proc.returncode == 0, proc.stderr
    bad_trace = tmp / "bad.jsonl"
    lines = SAMPLE.read_bytes().splitlines()
    bad_trace.write_bytes(b"\n".join([*lines[:2], b'{"kind": "request", "id": ', *lines[3:]]) + b"\n")
    bad_results = tmp / "bad-results.jsonl"
    bad_results.write_bytes(b'{"kind": "request"}\n')
    codex_rollout(tmp / "good" / "rollout-a.jsonl")
    codex_rollout(tmp / "bad" / "rollout-a.jsonl")
    late = codex_rollout(
        tmp / "bad" / "rollout-b.jsonl", sid="0199a1b2-c3d4-7e5f-8a9b-0c1d2e3f4a5c", start=MORNING + 3600
    )
    kept = late.read_bytes().splitlines()[:-2]
    late.write_bytes(b"\n".join([*kept, b'{"broken']) + b"\n")
    return Inputs(tmp, sim_url, trace, results, bad_trace, bad_results, tmp / "good", tmp / "bad")


Argv = Callable[[Inputs, Path], list[object]]


@dataclass(frozen=True)
class Verb:
    """A verb, its output, the command that succeeds and one that fails after the output's check."""

    name: str
    output: str  # a file name, or a folder name ending in /
    succeeds: Argv
    fails: Argv

    @property
    def folder(self) -> bool:
        return self.output.endswith("/")


def _codex(i: Inputs, src: Path, out: Path) -> list[object]:
    return ["import", "codex", src, out]


def _scenario(i: Inputs, out: Path) -> list[object]:
    return ["scenario", "run", "batched-routing", "--arm", "upstream", "--param", "rounds=1",
            "--param", "scale=0.1", "--time-scale", "10000", "--out", out]  # fmt: skip


def _k8s(i: Inputs, out: Path) -> list[object]:
    return ["k8s", "render", SAMPLE, "--shards", "1", "--target", "http://vllm:8000", "--out", out]


VERBS = [
    Verb(
        "run",
        "r.jsonl",
        lambda i, out: ["run", i.trace, "--target", i.sim_url, "--out", out, "--quiet"],
        lambda i, out: ["run", i.trace, "--target", "http://127.0.0.1:1", "--out", out, "--quiet"],
    ),
    Verb(
        "run --workers 2",
        "r.jsonl",
        lambda i, out: ["run", i.trace, "--target", i.sim_url, "--out", out, "--quiet", "--workers", "2"],
        lambda i, out: ["run", i.trace, "--target", "http://127.0.0.1:1", "--out", out, "--workers", "2"],
    ),
    Verb(
        "import",
        "t.jsonl",
        lambda i, out: _codex(i, i.codex_good, out),
        lambda i, out: _codex(i, i.codex_bad, out),
    ),
    Verb(
        "export",
        "m.jsonl",
        lambda i, out: ["export", "mooncake", SAMPLE, out],
        lambda i, out: ["export", "mooncake", i.bad_trace, out],
    ),
    Verb(
        "anonymize",
        "a.jsonl",
        lambda i, out: ["anonymize", SAMPLE, out, "--key", "k"],
        lambda i, out: ["anonymize", i.bad_trace, out, "--key", "k"],
    ),
    Verb(
        "scenario generate",
        "s.jsonl",
        lambda i, out: ["scenario", "generate", "batched-routing", "--out", out, "--param", "rounds=1"],
        lambda i, out: ["scenario", "generate", "batched-routing", "--out", out, "--param", "nonsense=1"],
    ),
    Verb("scenario run", "sr/", _scenario, lambda i, out: [*_scenario(i, out), "--arm", "nope"]),
    Verb(
        "report --html",
        "html/",
        lambda i, out: ["report", i.results, "--html", out],
        lambda i, out: ["report", i.bad_results, "--html", out],
    ),
    Verb("k8s render", "k.yaml", _k8s, lambda i, out: [*_k8s(i, out), "--start-in", "-1"]),
    Verb(
        "llama make-model",
        "tiny.gguf",
        lambda i, out: ["llama", "make-model", out],
        lambda i, out: ["llama", "make-model", out, "--arch", "nope"],
    ),
    Verb(
        "probe",
        "probe/",
        lambda i, out: ["probe", "--target", "sim", "--out", out],
        lambda i, out: ["probe", "--target", "sim", "--out", out, "--slot", "-1"],
    ),
]


def existing(path: Path, folder: bool) -> Path:
    """An output that is already there: a file, or a folder holding one (a report's page)."""
    if folder:
        path.mkdir()
        (path / "index.html").write_bytes(OLD)
    else:
        path.write_bytes(OLD)
    return path


@pytest.mark.e2e
@pytest.mark.parametrize("verb", VERBS, ids=[v.name for v in VERBS])
def test_an_existing_output_survives_a_failure_and_is_replaced_only_with_force(
    tmp_path: Path, inputs: Inputs, verb: Verb
) -> None:
    out = existing(tmp_path / verb.output.rstrip("/"), verb.folder)
    before = snapshot(out)

    failed = replay(*verb.fails(inputs, out), "--force")
    assert failed.returncode not in (0, 1), failed.stderr
    assert snapshot(out) == before and not temporaries(tmp_path)

    refused = replay(*verb.succeeds(inputs, out))
    assert refused.returncode == 2
    assert "--force" in one_line(refused)
    assert snapshot(out) == before and not temporaries(tmp_path)

    done = replay(*verb.succeeds(inputs, out), "--force")
    assert done.returncode == 0, done.stderr
    assert not temporaries(tmp_path)
    if verb.folder:
        assert (out / "index.html").read_bytes() != OLD or len(snapshot(out)) > 1
    else:
        assert out.read_bytes() != OLD
        if out.suffix == ".jsonl" and verb.name not in ("export",) and not verb.name.startswith("run"):
            validate(out)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def taken_port() -> Iterator[int]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        yield s.getsockname()[1]


def test_record_listens_before_it_opens_the_trace(tmp_path: Path, taken_port: int) -> None:
    """The field report: with the port taken, a 13-line trace was left with its header line only."""
    out = tmp_path / "day.jsonl"
    out.write_bytes(SAMPLE.read_bytes())
    before = out.read_bytes()
    for force in ([], ["--force"]):
        proc = replay("record", "--upstream", "http://127.0.0.1:9", "--listen", f"127.0.0.1:{taken_port}",
                      "--out", out, *force)  # fmt: skip
        assert proc.returncode == 2
        assert ("Address already in use" if force else "--force") in one_line(proc)
        assert out.read_bytes() == before
    argv = [PY, "-m", "replay", "record", "--upstream", "http://127.0.0.1:9", "--listen",
            f"127.0.0.1:{free_port()}", "--out", str(out), "--log", str(tmp_path / "calls.jsonl")]  # fmt: skip
    with ChildProcess([*argv, "--force"], log_path=tmp_path / "record.log", name="record") as child:
        url = child.wait_for_line(re.compile(r"listening on (http://127\.0\.0\.1:\d+)"), timeout=60).group(1)
        assert (
            httpx.get(url + "/_replay/openapi.json", timeout=30).status_code == 200
        )  # serving: signals handled
        stopped = child.stop()
    assert stopped.returncode == 0, (tmp_path / "record.log").read_text()
    assert validate(out)["requests"] == 0 and out.read_bytes() != before


# ---- paths that cannot be outputs ----------------------------------------------------------------


def unwritable(tmp_path: Path) -> Path:
    """A folder no file can be created in, for this user: a read-only one, or (as root, who may
    write anywhere the permission bits say no) /sys, whose top the kernel keeps closed."""
    folder = tmp_path / "read-only"
    folder.mkdir()
    folder.chmod(0o555)
    for candidate in (folder, Path("/sys")):
        try:
            (candidate / "probe").open("xb").close()
        except OSError:
            return candidate
        (candidate / "probe").unlink()
    pytest.skip("this user can create files everywhere, even in /sys")


BAD_PATHS: dict[str, Callable[[Path], tuple[Path, str]]] = {
    "a folder": lambda tmp: ((tmp / "d").resolve(), "is a folder; name a file"),
    "a missing parent": lambda tmp: (tmp / "nowhere" / "x.out", "no folder"),
    "no permission": lambda tmp: (unwritable(tmp) / "x.out", "cannot create files in"),
}
FILE_VERBS: dict[str, Callable[[Path, Path], list[object]]] = {
    "record": lambda out, tmp: [
        "record",
        "--upstream",
        "http://127.0.0.1:9",
        "--listen",
        "127.0.0.1:0",
        "--out",
        out,
    ],
    "record --log": lambda out, tmp: [
        "record",
        "--upstream",
        "http://127.0.0.1:9",
        "--listen",
        "127.0.0.1:0",
        "--out",
        tmp / "fresh.jsonl",
        "--log",
        out,
    ],  # fmt: skip
    "run": lambda out, tmp: ["run", SAMPLE, "--out", out, "--quiet"],
    "import": lambda out, tmp: ["import", "sharegpt", SAMPLE, out],
    "export": lambda out, tmp: ["export", "mooncake", SAMPLE, out],
    "anonymize": lambda out, tmp: ["anonymize", SAMPLE, out, "--key", "k"],
    "scenario generate": lambda out, tmp: ["scenario", "generate", "switching", "--out", out],
    "k8s render": lambda out, tmp: [
        "k8s",
        "render",
        SAMPLE,
        "--shards",
        "1",
        "--target",
        "http://h:1",
        "--out",
        out,
    ],
    "llama make-model": lambda out, tmp: ["llama", "make-model", out],
}


@pytest.mark.parametrize("bad", list(BAD_PATHS))
@pytest.mark.parametrize("verb", list(FILE_VERBS))
def test_a_path_that_cannot_be_an_output_is_one_line_and_exit_2_before_anything(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], verb: str, bad: str
) -> None:
    (tmp_path / "d").mkdir()
    out, words = BAD_PATHS[bad](tmp_path)
    proc = in_process(capsys, *FILE_VERBS[verb](out, tmp_path))
    assert proc.returncode == 2, proc.stderr
    line = one_line(proc)
    assert line.startswith("error: ") and words in line and str(out) in line, line
    assert "listening" not in proc.stdout and "Traceback" not in proc.stderr
    assert not (tmp_path / "fresh.jsonl").exists()  # record opened no trace


FOLDER_VERBS: dict[str, Callable[[Path], list[object]]] = {
    "scenario run": lambda out: ["scenario", "run", "switching", "--out", out],
    "scenario check": lambda out: ["scenario", "check", "switching", "--out", out],
    "demo": lambda out: ["demo", "--out", out],
    "probe": lambda out: ["probe", "--target", "sim", "--out", out],
    "report --html": lambda out: ["report", SAMPLE, "--html", out],
    "ab --out-dir": lambda out: ["ab", SAMPLE, "--a", "a.toml", "--b", "b.toml", "--out-dir", out],
}
BAD_FOLDERS: dict[str, Callable[[Path], tuple[Path, str]]] = {
    "a file": lambda tmp: (tmp / "f", "is a file; name a folder"),
    "a missing parent": lambda tmp: (tmp / "nowhere" / "x", "no folder"),
    "no permission": lambda tmp: (unwritable(tmp) / "x", "cannot create files in"),
    "a folder with files": lambda tmp: (tmp / "d", "is not empty"),
}


@pytest.mark.parametrize("bad", list(BAD_FOLDERS))
@pytest.mark.parametrize("verb", list(FOLDER_VERBS))
def test_a_folder_that_cannot_take_the_output_is_one_line_and_exit_2_before_anything(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], verb: str, bad: str
) -> None:
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "kept.txt").write_bytes(OLD)
    (tmp_path / "f").write_bytes(OLD)
    out, words = BAD_FOLDERS[bad](tmp_path)
    proc = in_process(capsys, *FOLDER_VERBS[verb](out))
    assert proc.returncode == 2, proc.stderr
    line = one_line(proc)
    assert words in line and str(out) in line, line
    assert (tmp_path / "d" / "kept.txt").read_bytes() == OLD and (tmp_path / "f").read_bytes() == OLD
    assert sorted(p.name for p in tmp_path.iterdir() if p.name != "read-only") == ["d", "f"]


@pytest.mark.e2e
def test_a_second_scenario_run_never_replaces_the_first_ones_report(tmp_path: Path) -> None:
    argv = ["scenario", "run", "batched-routing", "--arm", "upstream", "--param", "rounds=1",
            "--param", "scale=0.1", "--time-scale", "10000"]  # fmt: skip
    for n in (1, 2):
        proc = subprocess.run(
            [PY, "-m", "replay", *argv], capture_output=True, text=True, timeout=180, cwd=tmp_path
        )
        assert proc.returncode == 0, proc.stderr
        assert f"replay-scenario/batched-routing/run-{n}/report/index.html" in proc.stdout.replace("\n", "")
    first, second = (tmp_path / "replay-scenario" / "batched-routing" / f"run-{n}" for n in (1, 2))
    for run in (first, second):
        assert (run / "report" / "index.html").exists()
        assert orjson.loads((run / "batched-routing-upstream.results.jsonl").read_bytes().splitlines()[0])
