"""`replay k8s render`: manifests that a recent Kubernetes accepts, for an Indexed Job of N shards."""

from __future__ import annotations

import re
import subprocess
import sys
import tomllib
from pathlib import Path

import kubernetes_validate
import orjson
import pytest

from replay.errors import UsageError
from replay.runs import k8s
from replay.runs.k8s import ShardedRun, manifests, to_yaml

ROOT = Path(__file__).resolve().parents[2]
SAMPLE = ROOT / "traces" / "sample.jsonl"
KUBERNETES = kubernetes_validate.latest_version()  # the newest schema the package ships


def _run(**kw: object) -> ShardedRun:
    base: dict[str, object] = dict(
        name="morning",
        trace=SAMPLE,
        shards=4,
        target="http://ds4.inference.svc:8000",
        start_at="2026-12-01T16:30:00Z",
        image="registry.example/agent-replay:0.1.0",
        workers=2,
    )
    base.update(kw)
    return ShardedRun(**base)  # type: ignore[arg-type]


def _documents(text: str) -> list[dict]:
    return [orjson.loads(doc) for doc in text.split("---\n") if doc.strip()]


@pytest.mark.parametrize(
    "run",
    [
        _run(),
        _run(
            namespace="bench",
            trace_claim="traces",
            results_claim="shared-results",
            run_args=("--plan", "overlap"),
        ),
    ],
    ids=["configmap", "claims"],
)
def test_every_manifest_validates_against_a_recent_kubernetes_schema(run: ShardedRun) -> None:
    docs = _documents(to_yaml(manifests(run)))
    assert docs
    for doc in docs:
        kubernetes_validate.validate(doc, KUBERNETES, strict=True)  # raises on any unknown or wrong field


def test_the_job_is_indexed_with_one_pod_per_shard_all_at_once() -> None:
    job = next(o for o in manifests(_run()) if o["kind"] == "Job")
    spec = job["spec"]
    assert spec["completionMode"] == "Indexed"
    assert spec["completions"] == spec["parallelism"] == 4
    container = spec["template"]["spec"]["containers"][0]
    args = container["args"]
    assert args[args.index("--shard") + 1] == "auto/4"
    assert args[args.index("--start-at") + 1] == "2026-12-01T16:30:00Z"
    assert args[args.index("--out") + 1] == "/results/shard-$(JOB_COMPLETION_INDEX).jsonl"
    assert container["env"][0]["name"] == "JOB_COMPLETION_INDEX"
    assert container["resources"]["requests"]["cpu"] == "2"  # one core per worker process
    assert spec["template"]["spec"]["securityContext"]["runAsNonRoot"] is True


def test_a_small_trace_travels_in_a_configmap_a_large_one_needs_a_claim(tmp_path: Path) -> None:
    kinds = [o["kind"] for o in manifests(_run())]
    assert kinds == ["ConfigMap", "PersistentVolumeClaim", "Job", "Pod"]
    big = tmp_path / "big.jsonl"
    big.write_bytes(SAMPLE.read_bytes() * (k8s.CONFIGMAP_LIMIT // SAMPLE.stat().st_size + 1))
    with pytest.raises(UsageError, match="--trace-claim"):
        manifests(_run(trace=big))
    objects = manifests(_run(trace=big, trace_claim="traces"))
    assert [o["kind"] for o in objects] == ["PersistentVolumeClaim", "Job", "Pod"]


@pytest.mark.parametrize(
    ("kw", "problem"),
    [
        ({"start_at": "2026-12-01T16:30:00"}, "no UTC offset"),
        ({"start_at": "half past four"}, "ISO 8601"),
        ({"name": "Morning_Run"}, "--name"),
        ({"shards": 0}, "--shards"),
        ({"target": "ds4:8000"}, "--target"),
    ],
)
def test_bad_requests_are_refused_before_anything_is_written(kw: dict[str, object], problem: str) -> None:
    with pytest.raises(UsageError, match=problem):
        manifests(_run(**kw))


def test_the_cli_prints_manifests_on_stdout_and_how_to_collect_on_stderr() -> None:
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "replay",
            "k8s",
            "render",
            str(SAMPLE),
            "--shards",
            "3",
            "--target",
            "http://x:8000",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    docs = _documents(done.stdout)
    assert [d["kind"] for d in docs] == ["ConfigMap", "PersistentVolumeClaim", "Job", "Pod"]
    assert "kubectl apply -f -" in done.stderr and "replay report" in done.stderr
    start = docs[2]["spec"]["template"]["spec"]["containers"][0]["args"]
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", start[start.index("--start-at") + 1])


def test_the_containerfile_installs_the_package_as_pyproject_declares_it() -> None:
    """The image cannot be built here (no container registry to pull a base from), so its install
    step is checked against the package: what it copies, the Python it runs, its user, its entrypoint."""
    text = (ROOT / "Containerfile").read_text()
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    copied = {part for line in re.findall(r"^COPY (?!--from)(.+)$", text, re.M) for part in line.split()[:-1]}
    packages = {p.rstrip("*") for p in project["tool"]["setuptools"]["packages"]["find"]["include"]}
    assert packages <= copied
    assert {"pyproject.toml", "setup.py", project["project"]["readme"]} <= copied
    bases = re.findall(r"^FROM \S+python:(\d+)\.(\d+)", text, re.M)
    need = tuple(int(x) for x in project["project"]["requires-python"].removeprefix(">=").split("."))
    assert bases and all((int(a), int(b)) >= need for a, b in bases)
    assert (
        re.search(r"^RUN pip wheel .* \.$", text, re.M) and "pip install --no-cache-dir /wheels/*.whl" in text
    )
    (entry,) = re.findall(r'^ENTRYPOINT \["(\w+)"\]', text, re.M)
    assert entry in project["project"]["scripts"]
    (user,) = re.findall(r"^USER (\d+)$", text, re.M)
    assert int(user) == k8s._SECURITY["runAsUser"] != 0
