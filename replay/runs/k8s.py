"""Kubernetes manifests for a run sharded over N client hosts: an Indexed Job, not a coordinator.

Kubernetes already starts N pods, numbers them (`JOB_COMPLETION_INDEX`, 0..N-1) and collects their
exit codes; each pod runs `replay run --shard auto/N`, which turns its index into shard i/N, and
`--start-at`, so the N shards begin their schedules at one instant (a barrier by the clock, as
k6-operator and inference-perf do it). Nothing here talks to a cluster: the manifests are printed
for `kubectl apply -f -`.

The trace travels in a ConfigMap when it fits (the API server refuses objects over 1 MiB), else
from a volume claim the user has filled. Results go to a shared volume claim, one file per shard;
a small collector pod mounts it, so `kubectl cp` can fetch the files after the Job is done.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from replay.errors import UsageError
from replay.runs.barrier import parse_instant

CONFIGMAP_LIMIT = 1_000_000  # bytes of trace a ConfigMap may carry (the object limit is 1 MiB)
TRACE_DIR = "/trace"
RESULTS_DIR = "/results"
# Per-pod requests: one core per worker process (each is single-threaded and CPU-bound at full
# rate), and memory for the trace in each process plus in-flight requests.
MEMORY_BASE_MIB = 512
MEMORY_PER_WORKER_MIB = 512
_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]{0,50}[a-z0-9])?$")


@dataclass(frozen=True, kw_only=True)
class ShardedRun:
    """What `replay k8s render` is asked for; every field is checked in `manifests`."""

    name: str
    trace: Path
    shards: int
    target: str
    start_at: str  # ISO 8601 instant, the same for every shard
    image: str
    workers: int = 1
    namespace: str | None = None
    trace_claim: str | None = None  # a PVC that holds the trace at its file name
    results_claim: str | None = None  # an existing RWX PVC; default: the manifests create one
    results_size: str = "1Gi"
    run_args: tuple[str, ...] = ()  # more `replay run` options (plan, concurrency, ...)


def manifests(run: ShardedRun) -> list[dict[str, Any]]:
    """The objects to apply, in order: the trace's ConfigMap, the results claim, the Job, the collector."""
    _check(run)
    trace_bytes = run.trace.stat().st_size
    if run.trace_claim is None and trace_bytes > CONFIGMAP_LIMIT:
        raise UsageError(
            f"{run.trace}: {trace_bytes:,} bytes is more than a ConfigMap holds ({CONFIGMAP_LIMIT:,}); "
            "copy it onto a volume claim and name it with --trace-claim"
        )
    results_claim = run.results_claim or f"{run.name}-results"
    objects: list[dict[str, Any]] = []
    if run.trace_claim is None:
        objects.append(_configmap(run))
    if run.results_claim is None:
        objects.append(_results_claim(run, results_claim))
    objects.append(_job(run, results_claim))
    objects.append(_collector(run, results_claim))
    return objects


def to_yaml(objects: list[dict[str, Any]]) -> str:
    """Multi-document YAML whose documents are JSON (JSON is YAML 1.2): `kubectl apply -f -` reads it."""
    return "".join("---\n" + orjson.dumps(o, option=orjson.OPT_INDENT_2).decode() + "\n" for o in objects)


def collect_commands(run: ShardedRun) -> list[str]:
    """How to fetch and merge the shards' results once the Job has completed."""
    ns = f" -n {run.namespace}" if run.namespace else ""
    return [
        f"kubectl wait{ns} --for=condition=complete --timeout=24h job/{run.name}",
        f"kubectl cp{ns} {run.name}-collect:{RESULTS_DIR} ./{run.name}-results",
        f"replay report --merge ./{run.name}-results/*.jsonl --html ./{run.name}-report",
        f"kubectl delete{ns} job/{run.name} pod/{run.name}-collect",
    ]


def _check(run: ShardedRun) -> None:
    if not _DNS_LABEL.match(run.name):
        raise UsageError(f"--name {run.name!r}: lower-case letters, digits and '-', at most 52 characters")
    if run.shards < 1:
        raise UsageError("--shards must be at least 1")
    if run.workers < 1:
        raise UsageError("--workers must be at least 1")
    if not run.trace.is_file():
        raise UsageError(f"{run.trace}: no such trace file")
    if not run.target.startswith(("http://", "https://")):
        raise UsageError(f"--target must be the server's URL as the pods reach it, not {run.target!r}")
    parse_instant(run.start_at)
    for claim in (run.trace_claim, run.results_claim):
        if claim is not None and not _DNS_LABEL.match(claim):
            raise UsageError(f"volume claim {claim!r} is not a valid Kubernetes name")


def _meta(run: ShardedRun, name: str) -> dict[str, Any]:
    meta: dict[str, Any] = {
        "name": name,
        "labels": {"app.kubernetes.io/name": "agent-replay", "app.kubernetes.io/instance": run.name},
    }
    if run.namespace:
        meta["namespace"] = run.namespace
    return meta


def _configmap(run: ShardedRun) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": _meta(run, f"{run.name}-trace"),
        "data": {run.trace.name: run.trace.read_text(encoding="utf-8")},
    }


def _results_claim(run: ShardedRun, name: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": _meta(run, name),
        "spec": {
            "accessModes": ["ReadWriteMany"],  # every shard's pod writes its own file at once
            "resources": {"requests": {"storage": run.results_size}},
        },
    }


def _volumes(run: ShardedRun, results_claim: str) -> list[dict[str, Any]]:
    trace = (
        {"name": "trace", "persistentVolumeClaim": {"claimName": run.trace_claim, "readOnly": True}}
        if run.trace_claim
        else {"name": "trace", "configMap": {"name": f"{run.name}-trace"}}
    )
    return [trace, {"name": "results", "persistentVolumeClaim": {"claimName": results_claim}}]


def _mounts() -> list[dict[str, Any]]:
    return [
        {"name": "trace", "mountPath": TRACE_DIR, "readOnly": True},
        {"name": "results", "mountPath": RESULTS_DIR},
    ]


_SECURITY = {
    "runAsNonRoot": True,
    "runAsUser": 10001,  # the image's `replay` user
    "fsGroup": 10001,
}
_CONTAINER_SECURITY = {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}}


def _job(run: ShardedRun, results_claim: str) -> dict[str, Any]:
    args = [
        "run",
        f"{TRACE_DIR}/{run.trace.name}",
        "--target",
        run.target,
        "--shard",
        f"auto/{run.shards}",
        "--start-at",
        run.start_at,
        "--workers",
        str(run.workers),
        "--out",
        f"{RESULTS_DIR}/shard-$(JOB_COMPLETION_INDEX).jsonl",
        "--quiet",
        *run.run_args,
    ]
    memory = f"{MEMORY_BASE_MIB + MEMORY_PER_WORKER_MIB * run.workers}Mi"
    container = {
        "name": "replay",
        "image": run.image,
        "args": args,
        "env": [
            {  # set for Indexed Jobs; stated so that `$(JOB_COMPLETION_INDEX)` expands in args
                "name": "JOB_COMPLETION_INDEX",
                "valueFrom": {
                    "fieldRef": {
                        "fieldPath": "metadata.annotations['batch.kubernetes.io/job-completion-index']"
                    }
                },
            }
        ],
        "resources": {
            "requests": {"cpu": str(run.workers), "memory": memory},
            "limits": {"memory": memory},
        },
        "volumeMounts": _mounts(),
        "securityContext": _CONTAINER_SECURITY,
    }
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": _meta(run, run.name),
        "spec": {
            "completionMode": "Indexed",
            "completions": run.shards,
            "parallelism": run.shards,  # all shards at once: they are one load, not N in turn
            "backoffLimit": 0,  # a shard run again would send its requests twice into one load
            "template": {
                "metadata": {"labels": _meta(run, run.name)["labels"]},
                "spec": {
                    "restartPolicy": "Never",
                    "securityContext": _SECURITY,
                    "containers": [container],
                    "volumes": _volumes(run, results_claim),
                },
            },
        },
    }


def _collector(run: ShardedRun, results_claim: str) -> dict[str, Any]:
    """A pod that only holds the results volume open, for `kubectl cp` after the Job."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": _meta(run, f"{run.name}-collect"),
        "spec": {
            "restartPolicy": "Never",
            "securityContext": _SECURITY,
            "containers": [
                {
                    "name": "collect",
                    "image": run.image,
                    "command": ["python", "-c", "import time; time.sleep(7 * 24 * 3600)"],
                    "resources": {"requests": {"cpu": "10m", "memory": "32Mi"}, "limits": {"memory": "64Mi"}},
                    "volumeMounts": [{"name": "results", "mountPath": RESULTS_DIR, "readOnly": True}],
                    "securityContext": _CONTAINER_SECURITY,
                }
            ],
            "volumes": [{"name": "results", "persistentVolumeClaim": {"claimName": results_claim}}],
        },
    }
