"""Target TOML files, server kinds' argv and quirks, build identity, and start_target on fake servers."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import httpx
import psutil
import pytest

from drivers.launch import describe_plan, plan_target, start_target
from drivers.ports import free_port
from drivers.process import ChildProcess
from drivers.target import load_target, target_from_dict
from replay.errors import UsageError

FAKE = str(Path(__file__).with_name("fake_server.py"))


def write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


def fake_binary(path: Path, mode: str) -> Path:
    """An executable that execs the fake server, so its PID is the server's (as a real binary)."""
    path.write_text(f'#!/bin/sh\nexec "{sys.executable}" "{FAKE}" {mode} "$@"\n')
    path.chmod(0o755)
    return path


def git(repo: Path, *args: str) -> str:
    return subprocess.run(
        ["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t", *args],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("binary = 'x'\n", "missing key 'kind'"),
        ("kind = 'tgi'\n", "kind 'tgi' is not one of"),
        ("kind = 'ds4'\nbinray = 'x'\n", "unknown key 'binray'"),
        ("kind = 'ds4'\nport = '8000'\n", "port must be a number, not str"),
        ("kind = 'ds4'\nport = 70000\n", "port 70000 is out of range"),
        ("kind = 'ds4'\nflags = '-c 100'\n", "flags must be a list"),
        ("kind = 'ds4'\nflags = [true]\n", "flags must be a list of strings"),
        ("kind = 'ds4'\nenv = { A = true }\n", "env.A must be a string"),
        ("kind = 'ds4'\nbuild = 'make'\n", "build needs a checkout"),
        ("kind = 'ds4'\nkill_on_timeout = 1\n", "kill_on_timeout must be true/false"),
        ("kind = 'ds4'\nready_timeout = 0\n", "ready_timeout must be positive"),
        ("kind = 'external'\n", "needs url"),
        ("kind = 'external'\nurl = 'http://h:1'\nbinary = 'x'\n", "'binary' does not apply"),
        ("kind = 'ds4'\nurl = 'http://h:1'\n", "url is only for kind 'external'"),
        ("kind = 'llamacpp'\nkv_disk_dir = 'auto'\n", "kv_disk_dir applies to ds4 and sim"),
        ("kind = 'ds4'\nkv_disk_dir = 'auto'\nflags = ['--kv-disk-dir', 'x']\n", "both given"),
        ("kind = 'ds4'\ncheckout = 'nowhere'\n", "is not a directory"),
        ("kind = \n", "not valid TOML"),
    ],
)
def test_target_file_problems_name_the_file(tmp_path: Path, text: str, problem: str) -> None:
    path = write(tmp_path / "a.toml", text)
    with pytest.raises(UsageError, match=problem) as err:
        load_target(path)
    assert str(err.value).startswith(f"{path}: ")
    assert "\n" not in str(err.value)


def test_target_defaults_and_relative_paths(tmp_path: Path) -> None:
    (tmp_path / "models").mkdir()
    t = load_target(
        write(tmp_path / "pr-1058.toml", "kind = 'ds4'\nmodel = './models/m.gguf'\nflags = ['-c', 4096]\n")
    )
    assert t.name == "pr-1058"
    assert t.model == str(tmp_path / "models" / "m.gguf")
    assert t.flags == ("-c", "4096")
    assert t.host == "127.0.0.1" and t.port is None and t.kill_on_timeout
    hub = target_from_dict({"kind": "vllm", "model": "Qwen/Qwen3-0.6B"})
    assert hub.model == "Qwen/Qwen3-0.6B"  # a hub id is not a path


def test_ds4_plan_lock_file_per_instance_kv_dir_per_build(tmp_path: Path) -> None:
    binary = fake_binary(tmp_path / "ds4-server", "ds4")
    a = target_from_dict(
        {"kind": "ds4", "binary": str(binary), "model": "/m/ds4.gguf", "kv_disk_dir": "auto", "port": 8123}
    )
    p1, p2 = plan_target(a, tmp_path / "run"), plan_target(a, tmp_path / "run")
    assert p1.launch.argv[:7] == [str(binary), "-m", "/m/ds4.gguf", "--host", "127.0.0.1", "--port", "8123"]
    assert p1.launch.env["DS4_LOCK_FILE"] != p2.launch.env["DS4_LOCK_FILE"]
    kv = p1.launch.argv[p1.launch.argv.index("--kv-disk-dir") + 1]
    assert kv.startswith(str(tmp_path / "run" / "kv" / "ds4-"))
    assert kv == p2.launch.argv[p2.launch.argv.index("--kv-disk-dir") + 1]  # same build, same dir
    binary_b = fake_binary(tmp_path / "ds4-server-b", "ds4 --other-build")
    b = target_from_dict({**{"kind": "ds4", "binary": str(binary_b), "kv_disk_dir": "auto"}, "name": "ds4"})
    kv_b = plan_target(b, tmp_path / "run").launch.argv
    assert kv_b[kv_b.index("--kv-disk-dir") + 1] != kv  # another binary hash, another directory
    assert not (tmp_path / "run").exists()  # planning creates nothing
    with pytest.raises(UsageError, match="set port = instead of the --port flag"):
        plan_target(target_from_dict({"kind": "ds4", "binary": str(binary), "flags": ["--port=1"]}), tmp_path)


def test_cache_report_flags_for_vllm_and_sglang(tmp_path: Path) -> None:
    exe = fake_binary(tmp_path / "vllm", "ds4")
    v = plan_target(target_from_dict({"kind": "vllm", "binary": str(exe), "model": "m", "port": 9}), tmp_path)
    assert v.launch.argv == [
        str(exe),
        "serve",
        "m",
        "--host",
        "127.0.0.1",
        "--port",
        "9",
        "--enable-prompt-tokens-details",
    ]
    assert v.launch.ready_http == "http://127.0.0.1:9/health"
    v2 = plan_target(
        target_from_dict(
            {"kind": "vllm", "binary": str(exe), "model": "m", "flags": ["--enable-prompt-tokens-details"]}
        ),
        tmp_path,
    )
    assert v2.launch.argv.count("--enable-prompt-tokens-details") == 1
    s = plan_target(target_from_dict({"kind": "sglang", "model": "m", "port": 9}), tmp_path)
    assert s.launch.argv[:3] == [sys.executable, "-m", "sglang.launch_server"]
    assert "--enable-cache-report" in s.launch.argv and "--enable-metrics" in s.launch.argv
    with pytest.raises(UsageError, match="needs model"):
        plan_target(target_from_dict({"kind": "vllm", "binary": str(exe)}), tmp_path)


def test_llamacpp_uses_the_xllamacpp_launcher_or_the_binary(tmp_path: Path) -> None:
    x = plan_target(
        target_from_dict({"kind": "llamacpp", "binary": "xllamacpp", "model": "/m.gguf", "port": 7}), tmp_path
    )
    assert x.launch.argv == [
        sys.executable, "-m", "drivers.servers.xllamacpp_launch",
        "-m", "/m.gguf", "--host", "127.0.0.1", "--port", "7", "--metrics",
    ]  # fmt: skip
    exe = fake_binary(tmp_path / "llama-server", "llama")
    b = plan_target(
        target_from_dict({"kind": "llamacpp", "binary": str(exe), "model": "/m.gguf", "port": 7}), tmp_path
    )
    assert b.launch.argv[0] == str(exe) and b.launch.argv[1:] == x.launch.argv[3:]  # same flags either way
    assert b.launch.version_argv == [str(exe), "--version"]


def test_start_target_from_a_checkout_records_the_build(tmp_path: Path) -> None:
    repo = tmp_path / "ds4"
    repo.mkdir()
    git(repo, "init", "-q", "-b", "pr-1058")
    fake_binary(repo / "ds4-server.in", "ds4")
    git(repo, "add", ".")
    git(repo, "commit", "-q", "-m", "x")
    commit = git(repo, "rev-parse", "HEAD")
    record = tmp_path / "argv.json"
    toml = write(
        tmp_path / "a.toml",
        f"kind = 'ds4'\ncheckout = 'ds4'\nbuild = 'cp ds4-server.in ds4-server'\nmodel = '/m/ds4.gguf'\n"
        f"flags = ['-c', '8192']\nkv_disk_dir = 'auto'\nready_timeout = 10\nstop_timeout = 5\n"
        f"env = {{ FAKE_DS4_RECORD = '{record}', HF_TOKEN = 'secret' }}\n",
    )
    workdir = tmp_path / "run"
    with start_target(toml, workdir) as served:
        assert served.url.startswith("http://127.0.0.1:")
        assert psutil.Process(served.pid).cmdline()[1:3] == [FAKE, "ds4"]
        assert served.log_path is not None and "listening on" in served.log_path.read_text()
        build = served.build
        seen = json.loads(record.read_text())
    assert not psutil.pid_exists(served.pid) or psutil.Process(served.pid).status() == psutil.STATUS_ZOMBIE
    assert build["checkout"] == {
        "path": str(repo), "git": True, "commit": commit, "branch": "pr-1058",
        "describe": commit[:7], "dirty": False, "changed_files": 0, "changed": [],
    }  # fmt: skip
    assert build["binary"]["path"] == str(repo / "ds4-server") and len(build["binary"]["sha256"]) == 64
    assert build["build_key"] == f"a-{commit[:12]}"
    assert build["argv"][0] == str(repo / "ds4-server") and seen["argv"] == build["argv"][1:]
    assert build["argv"][-2:] == ["-c", "8192"]
    assert seen["lock"] == build["env"]["DS4_LOCK_FILE"] and seen["lock"].startswith(str(workdir))
    assert build["env"]["HF_TOKEN"] == "<redacted>"
    assert build["version"] is None  # ds4-server has no --version
    assert (workdir / "kv" / f"a-{commit[:12]}").is_dir()
    assert build["build_seconds"] is not None

    (repo / "ds4-server.in").write_text("changed\n")  # a tracked file changes: the build is dirty
    dirty = plan_target(load_target(toml), workdir).build
    assert dirty["checkout"]["dirty"] and dirty["checkout"]["changed_files"] == 1
    assert dirty["checkout"]["changed"] == ["ds4-server.in"]
    assert dirty["build_key"].endswith("-dirty")


def test_start_llamacpp_binary_probe_version_and_dry_run(tmp_path: Path) -> None:
    exe = fake_binary(tmp_path / "llama-server", "llama")
    toml = write(
        tmp_path / "l.toml", f"kind = 'llamacpp'\nbinary = '{exe}'\nmodel = '/m.gguf'\nready_timeout = 10\n"
    )
    lines = describe_plan(plan_target(toml, tmp_path / "run"))
    assert any(line.startswith("would start: ") and str(exe) in line for line in lines)
    assert any("GET http://127.0.0.1:" in line and "/health answers 200" in line for line in lines)
    with start_target(toml, tmp_path / "run") as served:
        assert served.build["version"] == "version: 4242 (abcdef0)"
        assert served.build["metrics_path"] == "/metrics"
        assert served.build["ready_seconds"] >= 0.25  # it waited through the 503s


def test_build_failure_and_external_server(tmp_path: Path) -> None:
    repo = tmp_path / "src"
    repo.mkdir()
    toml = write(tmp_path / "b.toml", "kind = 'ds4'\ncheckout = 'src'\nbuild = 'echo nope >&2; exit 7'\n")
    with pytest.raises(Exception, match="failed with exit code 7"), start_target(toml, tmp_path / "run"):
        pass
    assert "nope" in (tmp_path / "run" / "b.build.log").read_text()

    port = free_port()
    with ChildProcess([sys.executable, FAKE, "http", str(port), "0"], log_path=tmp_path / "ext.log") as daily:
        ext = write(
            tmp_path / "e.toml", f"kind = 'external'\nurl = 'http://127.0.0.1:{port}'\nhealth = '/health'\n"
        )
        with start_target(ext, tmp_path / "run") as served:
            assert served.pid == daily.pid and served.process is None
            assert served.url == f"http://127.0.0.1:{port}"
        assert daily.running()  # external: never stopped


def test_sim_target_starts_on_its_listening_line(tmp_path: Path) -> None:
    toml = write(
        tmp_path / "s.toml", "kind = 'sim'\nkv_disk_dir = 'auto'\nready_timeout = 30\nstop_timeout = 10\n"
    )
    with start_target(toml, tmp_path / "run") as served:
        assert httpx.get(f"{served.url}/v1/models", timeout=10).status_code == 200
        kv = Path(served.build["notes"]["kv_disk_dir"])
        assert kv.parent == tmp_path / "run" / "kv" and kv.name.startswith("s-")
        assert served.build["argv"][1:3] == ["-m", "replay.sim"]
    assert served.process is not None and served.process.stop().how == "terminated"


def test_replicas_are_servers_of_their_own_each_with_a_port_and_disk_directory(tmp_path):
    from drivers.servers.base import kv_disk_dir
    from drivers.target import replica_targets

    target = target_from_dict(
        {"kind": "sim", "name": "fleet", "replicas": 3, "port": 9100, "kv_disk_dir": "auto"}
    )
    replicas = replica_targets(target)
    assert [(t.name, t.port, t.replica, t.replicas) for t in replicas] == [
        ("fleet-0", 9100, 0, 1),
        ("fleet-1", 9101, 1, 1),
        ("fleet-2", 9102, 2, 1),
    ]
    dirs = {kv_disk_dir(t, tmp_path, "build") for t in replicas}
    assert dirs == {tmp_path / "kv" / "build" / f"replica-{i}" for i in range(3)}
    assert replica_targets(target_from_dict({"kind": "sim"})) == [target_from_dict({"kind": "sim"})]
    ext = target_from_dict({"kind": "external", "url": "http://a:1, http://b:2/", "routing": "least"})
    assert [(t.url, t.routing) for t in replica_targets(ext)] == [
        ("http://a:1", "least"),
        ("http://b:2", "least"),
    ]


@pytest.mark.parametrize(
    ("data", "said"),
    [
        ({"kind": "sim", "replicas": 0}, "replicas must be at least 1"),
        ({"kind": "external", "url": "http://a:1", "replicas": 2}, "already running"),
        ({"kind": "sim", "replicas": 2, "flags": ["--kv-disk-dir", "/x"]}, "a disk directory each"),
        ({"kind": "sim", "replicas": 3, "port": 65534}, "out of range"),
        ({"kind": "sglang-router"}, "needs backend"),
        ({"kind": "sglang-router", "backend": "/no/such.toml"}, "is not a file"),
        ({"kind": "sim", "policy": "cache_aware"}, "for kind 'sglang-router'"),
    ],
)
def test_a_fleet_that_cannot_be_started_is_refused_before_anything_starts(data, said):
    with pytest.raises(UsageError, match=said):
        target_from_dict(data)


def test_an_sglang_router_takes_its_policy_and_refuses_one_it_does_not_have(tmp_path):
    (tmp_path / "sims.toml").write_text('kind = "sim"\nreplicas = 2\n')
    router = tmp_path / "router.toml"
    router.write_text('kind = "sglang-router"\nbackend = "sims.toml"\npolicy = "cache_aware"\n')
    target = load_target(router)
    assert (target.policy, target.backend) == ("cache_aware", tmp_path / "sims.toml")
    router.write_text('kind = "sglang-router"\nbackend = "sims.toml"\npolicy = "sticky"\n')
    with pytest.raises(UsageError, match="policy must be one of"):
        load_target(router)
