"""Kubernetes manifests for a run sharded over N client hosts: an Indexed Job, not a coordinator.

Kubernetes already starts N pods, numbers them (`JOB_COMPLETION_INDEX`, 0..N-1) and collects their
exit codes; each pod runs `replay run --shard auto/N`, which turns its index into shard i/N, and
`--start-at`, so the N shards begin their schedules at one instant (a barrier by the clock, as
k6-operator and inference-perf do it). Nothing here talks to a cluster: the manifests are printed
for `kubectl apply -f -`.

A shard is one part of one load, so it is never run twice on purpose: its own failure ends its
index only (the others run on), and a shard that finished exits 0 even when some of its requests
failed (they are in its results; `--fail-on-errors` for the strict reading). Only a pod lost to a
disruption (a node drain, a preemption) is started again: late, and it says by how much.

The trace travels in a ConfigMap when it fits (the API server refuses objects over 1 MiB), else
from a volume claim the user has filled. Results go to a shared volume claim, one file per pod;
a small collector pod mounts it while the shards run and for a day after (`runs.k8s_collect`), so
`kubectl cp` can fetch the files. Every object carries the run's labels: one `kubectl delete -l`
removes them all.
"""

from __future__ import annotations

import datetime as dt
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from replay.engine.routing import split_targets
from replay.errors import UsageError
from replay.runs.barrier import parse_instant
from replay.trace.reader import iter_records

CONFIGMAP_LIMIT = 1_000_000  # bytes of trace a ConfigMap may carry (the object limit is 1 MiB)
TRACE_DIR = "/trace"
RESULTS_DIR = "/results"
# One file per pod, so a pod started again after a disruption never meets its first attempt's
# file; `--workers` parts (`.partKofM.jsonl`) sit beside it and stay out of this glob.
RESULTS_FILE = "shard-$(JOB_COMPLETION_INDEX).$(POD_NAME).results.jsonl"
RESULTS_GLOB = "*.results.jsonl"
_INDEX_FIELD = "metadata.annotations['batch.kubernetes.io/job-completion-index']"  # set by the Job
# Per-pod requests: one core per worker process (each is single-threaded and CPU-bound at full
# rate), and memory for the trace in each process plus in-flight requests.
MEMORY_BASE_MIB = 512
MEMORY_PER_WORKER_MIB = 512
# How long the finished Job (its pods, their logs) and the collector stay for `kubectl cp`.
KEEP_S = 24 * 3600
# How long after the start the collector waits for every shard's summary before it stops waiting
# (a pod killed without writing one is never seen to finish): the field reports' longest log,
# 43 hours, replayed at its own pace, fits.
WAIT_S = 48 * 3600
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
    storage_class: str | None = None  # of the results claim the manifests create
    fail_on_errors: bool = False  # a shard whose requests partly failed fails its index
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


def warnings(run: ShardedRun) -> list[str]:
    """What will not go as the user likely expects, said before anything is applied. Reads the
    whole trace (validating it: a bad line is refused here, not in N pods)."""
    said = []
    busy = _sessions_with_requests(run.trace)
    if run.shards > busy:
        said.append(
            f"{run.shards} shards for {busy} session(s) with requests: each session is replayed whole "
            f"by one shard, so {run.shards - busy} pod(s) will start and replay nothing (--shards {busy})"
        )
    if run.results_claim is None and run.storage_class is None:
        said.append(
            "the results claim asks ReadWriteMany of the cluster's default storage class; many "
            "(block disks) cannot give it, and the pods then stay Pending past the start: name a "
            "class that can with --storage-class (NFS, CephFS, EFS, Filestore, Azure Files), or an "
            "existing claim with --results-claim"
        )
    return said


def to_yaml(objects: list[dict[str, Any]]) -> str:
    """Multi-document YAML whose documents are JSON (JSON is YAML 1.2): `kubectl apply -f -` reads it."""
    return "".join("---\n" + orjson.dumps(o, option=orjson.OPT_INDENT_2).decode() + "\n" for o in objects)


def selector(run: ShardedRun) -> str:
    """The label selector of every object the manifests create (and of the Job's pods)."""
    return ",".join(f"{key}={value}" for key, value in _labels(run).items())


def collect_commands(run: ShardedRun) -> list[str]:
    """How to wait for the Job, fetch and merge the shards' results, and remove what was applied.

    A Job ends Complete, or Failed when an index failed, and `kubectl wait` takes one condition
    (a wait for Complete alone sits out its timeout on a failed Job), so the wait looks at the
    Job's true conditions every 30 s until one is either: plain sh, no process left behind."""
    ns = f" -n {run.namespace}" if run.namespace else ""
    job = f"kubectl get{ns} job/{run.name}"
    return [
        f"until {job} -o jsonpath='{{.status.conditions[?(@.status==\"True\")].type}}' "
        f"| grep -qwE 'Complete|Failed'; do sleep 30; done; {job}",
        f"kubectl cp{ns} {run.name}-collect:{RESULTS_DIR} ./{run.name}-results",
        f"replay report --merge ./{run.name}-results/{RESULTS_GLOB} --html ./{run.name}-report",
        f"kubectl delete{ns} job,pod,configmap,pvc -l {selector(run)}",
    ]


def _sessions_with_requests(trace: Path) -> int:
    return len({obj["session"] for _, obj in iter_records(trace) if obj["kind"] == "request"})


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
    if "," in run.target:  # several servers, routed by each pod (--run-arg=--routing=...)
        split_targets(run.target)
    parse_instant(run.start_at)
    for claim in (run.trace_claim, run.results_claim):
        if claim is not None and not _DNS_LABEL.match(claim):
            raise UsageError(f"volume claim {claim!r} is not a valid Kubernetes name")
    if run.storage_class is not None and not re.fullmatch(
        r"[a-z0-9]([-.a-z0-9]{0,251}[a-z0-9])?", run.storage_class
    ):
        raise UsageError(f"--storage-class {run.storage_class!r} is not a valid Kubernetes name")


def _labels(run: ShardedRun) -> dict[str, str]:
    return {"app.kubernetes.io/name": "agent-replay", "app.kubernetes.io/instance": run.name}


def _meta(run: ShardedRun, name: str) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "labels": _labels(run)}
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
    spec: dict[str, Any] = {
        "accessModes": ["ReadWriteMany"],  # every shard's pod writes its own file at once
        "resources": {"requests": {"storage": run.results_size}},
    }
    if run.storage_class is not None:
        spec["storageClassName"] = run.storage_class
    return {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": _meta(run, name),
        "spec": spec,
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


# What a namespace under the restricted Pod Security Standard admits: non-root, the runtime's
# seccomp profile, no privilege escalation, no capabilities.
_SECURITY = {
    "runAsNonRoot": True,
    "runAsUser": 10001,  # the image's `replay` user
    "runAsGroup": 10001,
    "fsGroup": 10001,
    "seccompProfile": {"type": "RuntimeDefault"},
}
_CONTAINER_SECURITY = {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}}


def _pod_spec(containers: list[dict[str, Any]], volumes: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "restartPolicy": "Never",
        "automountServiceAccountToken": False,  # nothing here talks to the API server
        "securityContext": _SECURITY,
        "containers": containers,
        "volumes": volumes,
    }


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
        f"{RESULTS_DIR}/{RESULTS_FILE}",
        "--quiet",
        "--fail-on-errors" if run.fail_on_errors else "--no-fail-on-errors",
        *run.run_args,
    ]
    memory = f"{MEMORY_BASE_MIB + MEMORY_PER_WORKER_MIB * run.workers}Mi"
    container = {
        "name": "replay",
        "image": run.image,
        "args": args,
        "env": [  # stated so that `$(JOB_COMPLETION_INDEX)` and `$(POD_NAME)` expand in args
            {"name": "JOB_COMPLETION_INDEX", "valueFrom": {"fieldRef": {"fieldPath": _INDEX_FIELD}}},
            {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
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
            # A shard's own failure ends its index, never the others: they are most of the load.
            # Run again, it would send its requests twice into one load.
            "backoffLimitPerIndex": 0,
            "podFailurePolicy": {
                "rules": [
                    {  # a pod lost to a node drain, preemption or eviction starts again (late, and
                        # says by how much); its first attempt's file stays beside the new one
                        "action": "Ignore",
                        "onPodConditions": [{"type": "DisruptionTarget", "status": "True"}],
                    },
                    {  # the same as backoffLimitPerIndex 0, said where a cluster that lacks that
                        # field refuses it at apply, instead of running failed shards again
                        "action": "FailIndex",
                        "onExitCodes": {"containerName": "replay", "operator": "NotIn", "values": [0]},
                    },
                ]
            },
            "ttlSecondsAfterFinished": KEEP_S,  # the Job and its pods (their logs) go a day after
            "template": {
                "metadata": {"labels": _labels(run)},
                "spec": _pod_spec([container], _volumes(run, results_claim)),
            },
        },
    }


def _collector(run: ShardedRun, results_claim: str) -> dict[str, Any]:
    """A pod that holds the results volume open for `kubectl cp`: until every shard has written its
    summary (or `WAIT_S` after the start), then `KEEP_S` more; its log says which and why."""
    until = dt.datetime.fromtimestamp(parse_instant(run.start_at) + WAIT_S, dt.UTC)
    command = ["python", "-m", "replay.runs.k8s_collect", RESULTS_DIR, "--shards", str(run.shards)]
    command += ["--wait-until", until.isoformat().replace("+00:00", "Z"), "--keep", str(KEEP_S)]
    container = {
        "name": "collect",
        "image": run.image,
        "command": command,
        "resources": {"requests": {"cpu": "10m", "memory": "32Mi"}, "limits": {"memory": "64Mi"}},
        "volumeMounts": [{"name": "results", "mountPath": RESULTS_DIR, "readOnly": True}],
        "securityContext": _CONTAINER_SECURITY,
    }
    volumes = [{"name": "results", "persistentVolumeClaim": {"claimName": results_claim}}]
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": _meta(run, f"{run.name}-collect"),
        "spec": _pod_spec([container], volumes),
    }
