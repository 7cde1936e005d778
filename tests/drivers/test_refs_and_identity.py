"""Git refs as targets (a worktree and one build per commit) and build identity with libraries.

The repository, its two refs and a small C program with a shared library are made by the test.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from drivers.identity import model_fingerprint, native_identity
from drivers.launch import plan_target
from drivers.refs import MARKER, prepare_ref
from drivers.target import Target, target_from_dict

pytestmark = pytest.mark.skipif(
    shutil.which("cc") is None or shutil.which("git") is None, reason="needs a C compiler and git"
)

MAIN_C = '#include <stdio.h>\nconst char *who(void);\nint main(void) {{ printf("{tag} %s\\n", who()); return 0; }}\n'
LIB_C = 'const char *who(void) {{ return "{lib}"; }}\n'
BUILD = "cc -shared -fPIC -o libwho.so who.c && cc -o hello main.c -L. -lwho -Wl,-rpath,'$ORIGIN'"


def git(repo: Path, *args: str) -> str:
    env = {
        "GIT_AUTHOR_NAME": "t",
        "GIT_AUTHOR_EMAIL": "t@x",
        "GIT_COMMITTER_NAME": "t",
        "GIT_COMMITTER_EMAIL": "t@x",
    }
    return subprocess.run(
        ["git", "-C", str(repo), *args],
        check=True,
        capture_output=True,
        text=True,
        env={**env, "PATH": "/usr/bin:/bin"},
    ).stdout.strip()


def make_repo(root: Path) -> Path:
    repo = root / "src"
    repo.mkdir()
    git(repo, "init", "-q", "-b", "main")
    (repo / "main.c").write_text(MAIN_C.format(tag="v1"))
    (repo / "who.c").write_text(LIB_C.format(lib="lib-1"))
    git(repo, "add", ".")
    git(repo, "commit", "-q", "-m", "v1")
    git(repo, "tag", "v1")
    (repo / "who.c").write_text(LIB_C.format(lib="lib-2"))  # only the library changes
    git(repo, "commit", "-q", "-am", "v2")
    git(repo, "branch", "pr-2")
    return repo


def test_two_refs_build_in_their_own_worktrees_once_per_commit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    repo = make_repo(tmp_path)
    monkeypatch.setenv("AGENT_REPLAY_WORKTREES", str(tmp_path / "cache"))
    base = {"kind": "llamacpp", "checkout": str(repo), "build": BUILD, "binary": "hello"}
    t1 = prepare_ref(target_from_dict({**base, "ref": "v1"}))
    t2 = prepare_ref(target_from_dict({**base, "ref": "pr-2"}))
    assert t1.checkout != t2.checkout and t1.build is None and t2.build is None
    assert not (repo / "hello").exists()  # the user's checkout is not built in

    def run(t: Target) -> str:
        return subprocess.run([str(t.checkout / "hello")], capture_output=True, text=True, check=True).stdout

    assert run(t1) == "v1 lib-1\n" and run(t2) == "v1 lib-2\n"

    # Identity: the executables are byte-identical, only the library differs; the combined hash
    # (executable + non-system libraries) tells the builds apart, the executable's alone cannot.
    id1, id2 = (plan_target(t, tmp_path / "w").build for t in (t1, t2))
    assert id1["binary"]["sha256"] == id2["binary"]["sha256"]
    assert id1["binary"]["combined_sha256"] != id2["binary"]["combined_sha256"]
    assert [lib["name"] for lib in id1["binary"]["libraries"]] == ["libwho.so"]
    assert id1["checkout"]["ref"] == "v1" and id2["checkout"]["ref"] == "pr-2"
    assert id1["checkout"]["commit"] == git(repo, "rev-parse", "v1")
    assert id2["checkout"]["commit"] == git(repo, "rev-parse", "pr-2")
    assert id1["build_key"] != id2["build_key"]

    # Cached by commit: a second prepare of the same ref does not build again.
    stamp = (t1.checkout / "hello").stat().st_mtime_ns
    again = prepare_ref(target_from_dict({**base, "ref": "v1"}))
    assert again.checkout == t1.checkout and (t1.checkout / MARKER).read_text() == BUILD
    assert (t1.checkout / "hello").stat().st_mtime_ns == stamp


def test_an_unknown_ref_is_a_usage_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from replay.errors import UsageError

    repo = make_repo(tmp_path)
    monkeypatch.setenv("AGENT_REPLAY_WORKTREES", str(tmp_path / "cache"))
    with pytest.raises(UsageError, match="names no commit"):
        prepare_ref(
            target_from_dict({"kind": "llamacpp", "checkout": str(repo), "ref": "nope", "binary": "x"})
        )


def test_a_ref_needs_a_checkout() -> None:
    from replay.errors import UsageError

    with pytest.raises(UsageError, match="ref needs a checkout"):
        target_from_dict({"kind": "llamacpp", "ref": "v1"})


def test_native_identity_of_a_system_binary_lists_no_system_libraries() -> None:
    got = native_identity("/bin/sh")
    assert got["sha256"] and all(
        not lib["path"].startswith(("/lib/", "/usr/lib/")) for lib in got["libraries"]
    )


def test_model_fingerprint_tells_two_files_of_one_size_apart(tmp_path: Path) -> None:
    a, b = tmp_path / "a.gguf", tmp_path / "b.gguf"
    a.write_bytes(b"\0" * (3 << 20))
    b.write_bytes(b"\0" * ((3 << 20) - 1) + b"\1")
    fa, fb = model_fingerprint(a), model_fingerprint(b)
    assert fa is not None and fb is not None and fa["size"] == fb["size"]
    assert fa["head_tail_sha256"] != fb["head_tail_sha256"]


def test_ab_arms_from_two_refs_list_every_difference_and_one_toml_with_one_ref_is_identical(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from replay.errors import UsageError
    from replay.runs.ab_arms import check_arms
    from replay.runs.ab_refs import resolve_refs

    repo = make_repo(tmp_path)
    monkeypatch.setenv("AGENT_REPLAY_WORKTREES", str(tmp_path / "cache"))
    one = target_from_dict({"kind": "llamacpp", "checkout": str(repo), "build": BUILD, "binary": "hello"})
    targets = resolve_refs({"A": one, "B": one}, {"A": "v1", "B": "pr-2"}, say=lambda _m: None)
    arms = check_arms(targets, tmp_path / "plan", allow_identical=False)
    fields = {d["field"] for d in arms["differences"]}
    assert {"checkout.ref", "checkout.commit", "library.libwho.so", "binary.combined_sha256"} <= fields
    assert "binary.sha256" not in fields and "flags" not in fields
    assert "ref v1 commit" in arms["identity"]["A"]["summary"]
    same = resolve_refs({"A": one, "B": one}, {"A": "v1", "B": "v1"}, say=lambda _m: None)
    with pytest.raises(UsageError, match="identical"):
        check_arms(same, tmp_path / "plan", allow_identical=False)


def test_a_library_copied_under_its_three_names_is_one_library(tmp_path: Path) -> None:
    """A wheel that flattens `libx.so -> libx.so.0 -> libx.so.0.20.0` into three copies (the second
    llama-server wheel of the A/B tests does) holds one library, not three."""
    from drivers.identity import native_identity

    exe = tmp_path / "llama-server"
    exe.write_text("#!/bin/sh\n")
    exe.chmod(0o755)
    for name in ("libx.so", "libx.so.0", "libx.so.0.20.0"):
        (tmp_path / name).write_bytes(b"x" * 100)
    (tmp_path / "liby.so.1").write_bytes(b"y" * 50)
    (tmp_path / "liby.so").symlink_to("liby.so.1")  # a symlink: the same real file
    (tmp_path / "libz.so").write_bytes(b"z1")
    (tmp_path / "libz.so.2").write_bytes(b"z2")  # same name, other bytes: two libraries
    got = native_identity(exe)["libraries"]
    assert [(lib["name"], lib.get("aliases")) for lib in got] == [
        ("libx.so", ["libx.so.0", "libx.so.0.20.0"]),
        ("liby.so", ["liby.so.1"]),
        ("libz.so", None),
        ("libz.so.2", None),
    ]
    assert got[0]["path"].endswith("libx.so.0.20.0") and got[0]["size"] == 100


def test_ab_arms_carry_the_version_a_binary_reports(tmp_path: Path) -> None:
    from replay.runs.ab_arms import check_arms

    def server(name: str, commit: str) -> Target:
        exe = tmp_path / name / "llama-server"
        exe.parent.mkdir()
        exe.write_text(
            f"#!/bin/sh\necho 'version: 1 (build 7, commit {commit})' >&2\necho 'built with cc' >&2\n"
        )
        exe.chmod(0o755)
        return target_from_dict({"kind": "llamacpp", "binary": str(exe)})

    arms = check_arms({"A": server("a", "aaaaaaa"), "B": server("b", "7e4c0a9")}, tmp_path / "plan", False)
    assert arms["identity"]["B"]["view"]["version"] == "version: 1 (build 7, commit 7e4c0a9)"
    assert "commit 7e4c0a9" in arms["identity"]["B"]["summary"]
    fields = {d["field"]: d for d in arms["differences"]}
    assert fields["version"]["a"] == "version: 1 (build 7, commit aaaaaaa)"
