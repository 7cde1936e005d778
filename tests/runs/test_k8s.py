"""`replay k8s render`: manifests that a recent Kubernetes accepts, for an Indexed Job of N shards."""

from __future__ import annotations

import copy
import datetime as dt
import fnmatch
import os
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
# backoffLimitPerIndex and podFailurePolicy's FailIndex: beta and on by default since 1.29 (the
# README says so); the 1.28 schema still requires onPodConditions in every rule.
OLDEST = "1.29.0"


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
    for version in (KUBERNETES, OLDEST):
        for doc in docs:
            kubernetes_validate.validate(doc, version, strict=True)  # raises on any unknown or wrong field


def test_the_job_is_indexed_with_one_pod_per_shard_all_at_once() -> None:
    job = next(o for o in manifests(_run()) if o["kind"] == "Job")
    spec = job["spec"]
    assert spec["completionMode"] == "Indexed"
    assert spec["completions"] == spec["parallelism"] == 4
    container = spec["template"]["spec"]["containers"][0]
    args = container["args"]
    assert args[args.index("--shard") + 1] == "auto/4"
    assert args[args.index("--start-at") + 1] == "2026-12-01T16:30:00Z"
    assert args[args.index("--out") + 1] == "/results/shard-$(JOB_COMPLETION_INDEX).$(POD_NAME).results.jsonl"
    assert [e["name"] for e in container["env"]] == ["JOB_COMPLETION_INDEX", "POD_NAME"]
    assert container["resources"]["requests"]["cpu"] == "2"  # one core per worker process
    assert spec["template"]["spec"]["securityContext"]["runAsNonRoot"] is True


def test_each_pod_routes_over_several_servers_as_run_args_say() -> None:
    targets = "http://vllm-0.svc:8000,http://vllm-1.svc:8000"
    run = _run(target=targets, run_args=("--routing", "round-robin", "--session-header", "X-Session-ID"))
    args = next(o for o in manifests(run) if o["kind"] == "Job")["spec"]["template"]["spec"]["containers"][0][
        "args"
    ]
    assert args[args.index("--target") + 1] == targets
    assert args[-4:] == ["--routing", "round-robin", "--session-header", "X-Session-ID"]


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
        ({"target": "http://a.svc:8000,b.svc:8000"}, "every target of a list must be a URL"),
    ],
)
def test_bad_requests_are_refused_before_anything_is_written(kw: dict[str, object], problem: str) -> None:
    with pytest.raises(UsageError, match=problem):
        manifests(_run(**kw))


def _render(*args: str) -> subprocess.CompletedProcess[str]:
    argv = [sys.executable, "-m", "replay", "k8s", "render", str(SAMPLE), "--target", "http://x:8000", *args]
    return subprocess.run(argv, capture_output=True, text=True, timeout=60)


def test_the_cli_prints_manifests_on_stdout_and_how_to_collect_on_stderr() -> None:
    done = _render("--shards", "3")
    assert done.returncode == 0, done.stderr
    docs = _documents(done.stdout)
    assert [d["kind"] for d in docs] == ["ConfigMap", "PersistentVolumeClaim", "Job", "Pod"]
    assert "kubectl apply -f -" in done.stderr and "replay report" in done.stderr
    start = docs[2]["spec"]["template"]["spec"]["containers"][0]["args"]
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", start[start.index("--start-at") + 1])
    warned = [line for line in done.stderr.splitlines() if line.startswith("warning: ")]
    assert len(warned) == 2, done.stderr  # 3 shards for 2 sessions; no storage class
    assert "3 shards for 2 session(s)" in warned[0] and "--storage-class" in warned[1]
    assert "kubectl delete job,pod,configmap,pvc -l " in done.stderr


def test_the_cli_takes_the_storage_class_and_the_strict_reading() -> None:
    done = _render("--shards", "2", "--storage-class", "nfs-client", "--fail-on-errors")
    assert done.returncode == 0, done.stderr
    assert "warning" not in done.stderr
    claim, job = _documents(done.stdout)[1:3]
    assert claim["spec"]["storageClassName"] == "nfs-client"
    assert "--fail-on-errors" in job["spec"]["template"]["spec"]["containers"][0]["args"]


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


def _job(objects: list[dict]) -> dict:
    return next(o for o in objects if o["kind"] == "Job")


def _pods(objects: list[dict]) -> dict[str, dict]:
    """Every pod the manifests make, as {"metadata", "spec"}: the Job's template and the collector."""
    return {
        "job": _job(objects)["spec"]["template"],
        "collector": next(o for o in objects if o["kind"] == "Pod"),
    }


# --- a shard's failure, a pod's loss -------------------------------------------------------------


def test_a_shards_own_failure_ends_its_index_only_and_a_disrupted_pod_starts_again() -> None:
    """backoffLimit 0 failed the whole Job (and killed the other shards) at the first pod that failed."""
    spec = _job(manifests(_run()))["spec"]
    assert spec["template"]["spec"]["restartPolicy"] == "Never"
    assert spec["backoffLimitPerIndex"] == 0  # never run a shard twice for its own failure
    assert "backoffLimit" not in spec  # the global limit would fail the Job at the first index
    assert "maxFailedIndexes" not in spec  # every other index runs on, however many failed
    first, second = spec["podFailurePolicy"]["rules"]
    assert first == {"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget", "status": "True"}]}
    assert second["action"] == "FailIndex"
    assert second["onExitCodes"] == {"containerName": "replay", "operator": "NotIn", "values": [0]}


@pytest.mark.parametrize(("strict", "flag"), [(False, "--no-fail-on-errors"), (True, "--fail-on-errors")])
def test_a_shard_with_failed_requests_exits_0_unless_asked_to_fail(strict: bool, flag: str) -> None:
    args = _job(manifests(_run(fail_on_errors=strict)))["spec"]["template"]["spec"]["containers"][0]["args"]
    assert flag in args


def test_the_pods_command_line_is_one_replay_run_accepts() -> None:
    from replay.cli import command

    run = command().commands["run"]
    args = _job(manifests(_run(run_args=("--plan", "overlap"))))["spec"]["template"]["spec"]["containers"][0][
        "args"
    ]
    assert args[0] == "run"
    ctx = run.make_context("run", list(args[1:]))  # raises on an option `replay run` does not have
    assert ctx.params["fail_on_errors"] is False and ctx.params["quiet"] is True
    assert ctx.params["plan"] == "overlap"


def test_each_pod_writes_its_own_file_and_the_merge_takes_no_worker_part() -> None:
    """A pod started again after a drain must not meet its first attempt's file; `--workers` parts
    beside a file must stay out of the `replay report` the collect commands print."""
    from replay.runs.workers import part_path

    container = _job(manifests(_run()))["spec"]["template"]["spec"]["containers"][0]
    out = container["args"][container["args"].index("--out") + 1]
    assert "$(POD_NAME)" in out and "$(JOB_COMPLETION_INDEX)" in out
    names = {e["name"]: e["valueFrom"]["fieldRef"]["fieldPath"] for e in container["env"]}
    assert names["POD_NAME"] == "metadata.name"
    written = Path(out.replace("$(JOB_COMPLETION_INDEX)", "1").replace("$(POD_NAME)", "morning-1-x7k9q"))
    assert fnmatch.fnmatch(written.name, k8s.RESULTS_GLOB)
    assert not fnmatch.fnmatch(part_path(written, 1, 2).name, k8s.RESULTS_GLOB)
    report = next(c for c in k8s.collect_commands(_run()) if c.startswith("replay report"))
    assert f"/{k8s.RESULTS_GLOB} " in report


# --- the restricted Pod Security Standard --------------------------------------------------------
# Written from the standard's own tables (kubernetes.io/docs/concepts/security/pod-security-standards,
# Baseline and Restricted): every restricted field and its allowed values. A pod is refused if any
# container (init and ephemeral ones included) breaks any of them.

BASELINE_CAPABILITIES = {
    "AUDIT_WRITE", "CHOWN", "DAC_OVERRIDE", "FOWNER", "FSETID", "KILL", "MKNOD", "NET_BIND_SERVICE",
    "SETFCAP", "SETGID", "SETPCAP", "SETUID", "SYS_CHROOT",
}  # fmt: skip
SAFE_SYSCTLS = {
    "kernel.shm_rmid_forced", "net.ipv4.ip_local_port_range", "net.ipv4.ip_unprivileged_port_start",
    "net.ipv4.tcp_syncookies", "net.ipv4.ping_group_range",
}  # fmt: skip
SELINUX_TYPES = {"", "container_t", "container_init_t", "container_kvm_t"}
RESTRICTED_VOLUMES = {
    "configMap", "csi", "downwardAPI", "emptyDir", "ephemeral", "persistentVolumeClaim", "projected", "secret",
}  # fmt: skip


def restricted_violations(pod: dict) -> list[str]:
    spec, annotations = pod["spec"], (pod.get("metadata") or {}).get("annotations") or {}
    psc = spec.get("securityContext") or {}
    containers = [
        *spec.get("containers", ()),
        *spec.get("initContainers", ()),
        *spec.get("ephemeralContainers", ()),
    ]
    bad: list[str] = []

    def check(ok: bool, what: str) -> None:
        if not ok:
            bad.append(what)

    # Baseline
    for scope, sc in [("pod", psc), *((c["name"], c.get("securityContext") or {}) for c in containers)]:
        check((sc.get("windowsOptions") or {}).get("hostProcess") in (None, False), f"{scope}: hostProcess")
        selinux = sc.get("seLinuxOptions") or {}
        check(selinux.get("type", "") in SELINUX_TYPES, f"{scope}: seLinuxOptions.type")
        check(not selinux.get("user") and not selinux.get("role"), f"{scope}: seLinuxOptions user/role")
        check((sc.get("seccompProfile") or {}).get("type") != "Unconfined", f"{scope}: seccomp Unconfined")
        apparmor = (sc.get("appArmorProfile") or {}).get("type")
        check(apparmor in (None, "RuntimeDefault", "Localhost"), f"{scope}: appArmorProfile")
        check(sc.get("runAsUser") != 0, f"{scope}: runAsUser 0")
    for key in ("hostNetwork", "hostPID", "hostIPC"):
        check(spec.get(key) in (None, False), key)
    for key, value in annotations.items():
        if key.startswith("container.apparmor.security.beta.kubernetes.io/"):
            check(value == "runtime/default" or value.startswith("localhost/"), f"annotation {key}")
    for sysctl in psc.get("sysctls") or ():
        check(sysctl["name"] in SAFE_SYSCTLS, f"sysctl {sysctl['name']}")
    for volume in spec.get("volumes") or ():
        kinds = set(volume) - {"name"}
        check(kinds <= RESTRICTED_VOLUMES and len(kinds) == 1, f"volume {volume['name']}: {sorted(kinds)}")
    for c in containers:
        sc, name = c.get("securityContext") or {}, c["name"]
        check(sc.get("privileged") in (None, False), f"{name}: privileged")
        check(sc.get("procMount") in (None, "Default"), f"{name}: procMount")
        for port in c.get("ports") or ():
            check(port.get("hostPort") in (None, 0), f"{name}: hostPort")
        caps = sc.get("capabilities") or {}
        check(set(caps.get("add") or ()) <= BASELINE_CAPABILITIES, f"{name}: capabilities.add (baseline)")
        # Restricted
        check(sc.get("allowPrivilegeEscalation") is False, f"{name}: allowPrivilegeEscalation must be false")
        non_root = sc.get("runAsNonRoot", psc.get("runAsNonRoot"))
        check(non_root is True, f"{name}: runAsNonRoot must be true (here or on the pod)")
        seccomp = (sc.get("seccompProfile") or psc.get("seccompProfile") or {}).get("type")
        check(
            seccomp in ("RuntimeDefault", "Localhost"),
            f"{name}: seccompProfile must be RuntimeDefault or Localhost",
        )
        check("ALL" in (caps.get("drop") or ()), f"{name}: capabilities.drop must include ALL")
        check(set(caps.get("add") or ()) <= {"NET_BIND_SERVICE"}, f"{name}: capabilities.add")
    return bad


@pytest.mark.parametrize(
    "run", [_run(), _run(trace_claim="traces", results_claim="shared")], ids=["made", "claims"]
)
def test_every_pod_is_admitted_under_the_restricted_pod_security_standard(run: ShardedRun) -> None:
    for which, pod in _pods(manifests(run)).items():
        assert restricted_violations(pod) == [], which
        assert pod["spec"]["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}


@pytest.mark.parametrize(
    ("change", "problem"),
    [
        (lambda p: p["spec"]["securityContext"].pop("seccompProfile"), "seccompProfile"),
        (lambda p: p["spec"]["securityContext"].update(runAsNonRoot=None), "runAsNonRoot"),
        (
            lambda p: p["spec"]["containers"][0]["securityContext"].pop("allowPrivilegeEscalation"),
            "allowPriv",
        ),
        (lambda p: p["spec"]["containers"][0]["securityContext"]["capabilities"].update(drop=[]), "drop"),
        (lambda p: p["spec"].update(hostNetwork=True), "hostNetwork"),
        (lambda p: p["spec"]["volumes"].append({"name": "h", "hostPath": {"path": "/"}}), "volume h"),
    ],
)
def test_the_standards_check_finds_what_the_standard_refuses(change, problem: str) -> None:
    pod = copy.deepcopy(_pods(manifests(_run()))["job"])
    change(pod)
    assert any(problem in line for line in restricted_violations(pod))


# --- storage, lifetime, cleanup -----------------------------------------------------------------


def test_the_results_claim_takes_a_storage_class_and_without_one_render_warns() -> None:
    claim = next(
        o for o in manifests(_run(storage_class="nfs-client")) if o["kind"] == "PersistentVolumeClaim"
    )
    assert claim["spec"]["storageClassName"] == "nfs-client"
    assert claim["spec"]["accessModes"] == ["ReadWriteMany"]
    said = k8s.warnings(_run(shards=2))
    assert any("--storage-class" in line for line in said)
    assert not any(
        "--storage-class" in line for line in k8s.warnings(_run(shards=2, storage_class="nfs-client"))
    )
    assert not any("--storage-class" in line for line in k8s.warnings(_run(shards=2, results_claim="shared")))
    with pytest.raises(UsageError, match="--storage-class"):
        manifests(_run(storage_class="NFS Fast"))


def test_more_shards_than_sessions_is_a_warning_naming_how_many_pods_idle() -> None:
    sessions = {
        json_line["session"]
        for json_line in map(orjson.loads, SAMPLE.read_bytes().splitlines())
        if json_line["kind"] == "request"
    }
    assert len(sessions) == 2
    (idle,) = [line for line in k8s.warnings(_run(shards=4)) if "shards for" in line]
    assert "4 shards for 2 session(s)" in idle and "2 pod(s) will start and replay nothing" in idle
    assert not [line for line in k8s.warnings(_run(shards=2)) if "shards for" in line]


def test_the_job_goes_a_day_after_it_ends_and_one_command_removes_every_object(tmp_path: Path) -> None:
    objects = manifests(_run(namespace="bench"))
    assert _job(objects)["spec"]["ttlSecondsAfterFinished"] == k8s.KEEP_S == 24 * 3600
    cleanup = k8s.collect_commands(_run(namespace="bench"))[-1]
    match = re.fullmatch(r"kubectl delete -n bench (\S+) -l (\S+)", cleanup)
    assert match, cleanup
    kinds = {kind.lower() for kind in match.group(1).split(",")}
    wanted = dict(pair.split("=") for pair in match.group(2).split(","))
    for obj in [*objects, _job(objects)["spec"]["template"]]:  # the Job's pods carry its template's labels
        assert obj.get("kind", "Pod").lower().replace("persistentvolumeclaim", "pvc") in kinds
        assert wanted.items() <= obj["metadata"]["labels"].items(), obj.get("kind")


def test_the_collector_waits_for_the_shards_and_a_day_not_seven_days() -> None:
    collector = _pods(manifests(_run()))["collector"]
    (container,) = collector["spec"]["containers"]
    command = container["command"]
    assert command[:3] == ["python", "-m", "replay.runs.k8s_collect"]
    assert "sleep" not in " ".join(command)
    assert command[command.index("--shards") + 1] == "4"
    assert command[command.index("--wait-until") + 1] == "2026-12-03T16:30:00Z"  # start + 48 h
    assert command[command.index("--keep") + 1] == str(24 * 3600)
    assert collector["spec"]["restartPolicy"] == "Never"


# --- the wait the README and render print --------------------------------------------------------


@pytest.mark.parametrize(
    ("target", "ends"), [("SuccessCriteriaMet", "Complete"), ("FailureTarget", "Failed")]
)
def test_the_printed_wait_returns_when_the_job_completes_or_fails(
    tmp_path: Path, target: str, ends: str
) -> None:
    """Run against a stand-in kubectl whose Job is running, then has its interim condition (1.31+),
    then ends Complete or Failed, as `get -o jsonpath` and `wait --for=condition` show it. The old
    wait (for complete only) sat out its 24 h timeout on a failed Job."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    looks, pids = tmp_path / "looks", tmp_path / "pids"
    script = f"""#!/bin/sh
echo $$ >> {pids}
n=$(($(cat {looks} 2>/dev/null || echo 0) + 1)); echo $n > {looks}
case "$1 $n" in
  "get 1") echo ;;
  "get 2") echo "{target}" ;;
  get*) echo "{target} {ends}" ;;
  wait*) case "$(echo "$*" | tr A-Z a-z)" in *"--for=condition={ends.lower()}"*) echo "condition met"; exit 0 ;; esac
    exec /bin/sleep 60 ;;
esac
"""
    for name, text in [("kubectl", script), ("sleep", "#!/bin/sh\n")]:  # 30 s between looks, at once
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)
    wait = next(c for c in k8s.collect_commands(_run()) if "wait" in c or "until" in c)
    done = subprocess.run(
        ["sh", "-c", wait],
        env={**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}"},
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == [target, ends]  # the wait's last step shows how the Job ended
    assert looks.read_text().strip() == "4"  # three looks until it ended, then the one shown
    assert not [pid for pid in map(int, pids.read_text().split()) if _running(pid)]


def _running(pid: int) -> bool:
    """Whether `pid` still runs (a zombie that nobody reaped has ended)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except FileNotFoundError:
        return False
    return "\nState:\tZ" not in status


# --- the pods, started as the kubelet starts them -----------------------------------------------


def _four_sessions(path: Path) -> Path:
    """The sample trace and a copy of its two sessions under other names and request ids."""
    path.parent.mkdir(parents=True)
    lines = [orjson.loads(x) for x in SAMPLE.read_bytes().splitlines()]
    copies = []
    for line in lines:
        if line["kind"] == "session":
            copies.append({**line, "id": line["id"] + "-2"})
        elif line["kind"] == "request":
            text = re.sub(
                r'"\$reply":(\d+)', lambda m: f'"$reply":{int(m.group(1)) + 100}', orjson.dumps(line).decode()
            )
            copy = orjson.loads(text)
            copy.update(id=line["id"] + 100, session=line["session"] + "-2")
            if "parent" in line:
                copy["parent"] = line["parent"] + 100
            copies.append(copy)
    path.write_bytes(b"".join(orjson.dumps(x) + b"\n" for x in [*lines, *copies]))
    return path


def _as_kubelet(argv: list[str], env: dict[str, str], paths: dict[str, Path]) -> list[str]:
    """A container's command line as the kubelet runs it: `$(VAR)` from the container's env, and
    the volumes' mount paths where this test keeps them."""
    out = []
    for arg in argv:
        arg = re.sub(r"\$\((\w+)\)", lambda m: env[m.group(1)], arg)
        for mount, here in paths.items():
            if arg == mount or arg.startswith(mount + "/"):
                arg = str(here) + arg[len(mount) :]
        out.append(arg)
    return out


@pytest.mark.e2e
def test_the_pods_run_as_the_kubelet_starts_them_and_the_collector_sees_every_shard_end(
    scripted_server, tmp_path: Path
) -> None:
    """Two shards of two workers each (four sessions: a worker owns whole sessions), one request
    refused by the server: both pods exit 0 (the refusal is in the results), each writes its own
    file, the collector sees both end, and the printed `replay report` merges the two files and
    no worker part."""
    from tests.support.scripted_server import Script

    scripted_server.by_trace_id[3] = Script(fault="http_error", http_status=503)
    trace = _four_sessions(tmp_path / "trace" / "four.jsonl")
    start = (dt.datetime.now(dt.UTC) + dt.timedelta(seconds=4)).replace(microsecond=0)
    run = _run(
        trace=trace,
        shards=2,
        workers=2,
        target=scripted_server.url,
        start_at=start.isoformat(),
        name="morning",
    )
    objects = manifests(run)
    results = tmp_path / "results"
    results.mkdir()
    paths = {k8s.TRACE_DIR: trace.parent, k8s.RESULTS_DIR: results}
    (container,) = _job(objects)["spec"]["template"]["spec"]["containers"]
    pods, logs = [], []
    for index in range(2):
        env = {"JOB_COMPLETION_INDEX": str(index), "POD_NAME": f"morning-{index}-x7k9q"}
        argv = [sys.executable, "-m", "replay", *_as_kubelet(container["args"], env, paths)]
        logs.append(tmp_path / f"pod-{index}.log")
        with logs[-1].open("w") as log:
            pods.append(
                subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env={**os.environ, **env})
            )
    codes = [pod.wait(timeout=120) for pod in pods]
    assert codes == [0, 0], [log.read_text()[-2000:] for log in logs]
    assert any("(1 failed)" in log.read_text() for log in logs)  # said in the pod's log
    files = sorted(p.name for p in results.glob(k8s.RESULTS_GLOB))
    assert files == ["shard-0.morning-0-x7k9q.results.jsonl", "shard-1.morning-1-x7k9q.results.jsonl"]
    assert len(list(results.glob("*.part*of2.jsonl"))) == 4  # the workers' parts, beside them

    collector = _pods(objects)["collector"]["spec"]["containers"][0]["command"]
    collector = _as_kubelet(collector, {}, paths)
    collector[collector.index("--keep") + 1] = "0"  # not a day, here
    done = subprocess.run([sys.executable, *collector[1:]], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and "all 2 shard(s) ended" in done.stdout, done.stdout + done.stderr

    report = subprocess.run(
        [
            sys.executable,
            "-m",
            "replay",
            "report",
            "--json",
            "--merge",
            *map(str, sorted(results.glob(k8s.RESULTS_GLOB))),
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    merged = orjson.loads(report.stdout)
    sent = [r for r in map(orjson.loads, trace.read_bytes().splitlines()) if r["kind"] == "request"]
    assert merged["classes"]["all"]["count"] == len(sent)  # every request once, none twice
    assert merged["classes"]["all"]["errors"] == 1
