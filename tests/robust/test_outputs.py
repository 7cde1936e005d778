"""`replay.outputs`, the one rule for a user's files: whole files appear whole or not at all, an
existing file needs `--force`, a folder output must be new or empty, each run gets its own folder."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from replay.errors import UsageError
from replay.outputs import check_file, check_folder, new_run_folder, output_folder, replacing, write_text

OLD = b"precious: a file the user has\n"


def temporaries(folder: Path) -> list[Path]:
    return list(folder.rglob(".*.tmp"))


def test_a_whole_file_is_renamed_into_place_only_when_complete(tmp_path: Path) -> None:
    out = tmp_path / "t.jsonl"
    out.write_bytes(OLD)
    with pytest.raises(RuntimeError), replacing(out) as tmp:
        tmp.write_bytes(b"half a fi")
        raise RuntimeError("the converter failed")
    assert out.read_bytes() == OLD and not temporaries(tmp_path)
    with replacing(out) as tmp:
        tmp.write_bytes(b"new\n")
        assert out.read_bytes() == OLD  # nobody sees the new file before it is whole
    assert out.read_bytes() == b"new\n" and not temporaries(tmp_path)
    umask = os.umask(0o022)
    os.umask(umask)
    assert stat.S_IMODE(out.stat().st_mode) == 0o666 & ~umask  # as `open` would have made it


def test_a_whole_file_goes_through_a_symbolic_link(tmp_path: Path) -> None:
    real = tmp_path / "real.md"
    real.write_bytes(OLD)
    link = tmp_path / "link.md"
    link.symlink_to(real)
    write_text(link, "new\n")
    assert link.is_symlink() and real.read_text() == "new\n"


def test_an_existing_file_needs_force_and_never_is_the_input(tmp_path: Path) -> None:
    out = tmp_path / "r.jsonl"
    check_file(out, option="--out")
    out.write_bytes(OLD)
    with pytest.raises(UsageError, match=r"^--out .*r\.jsonl exists; --force replaces it"):
        check_file(out, option="--out")
    check_file(out, option="--out", force=True)
    check_file(out, option="--log", append=True)
    with pytest.raises(UsageError, match="is the input"):
        check_file(out, option="OUT", force=True, inputs=[tmp_path / "." / "r.jsonl"])
    assert out.read_bytes() == OLD and not temporaries(tmp_path)


def test_a_folder_output_must_be_new_or_empty_unless_forced(tmp_path: Path) -> None:
    folder = tmp_path / "report"
    check_folder(folder, option="--html")
    folder.mkdir()
    check_folder(folder, option="--html")
    (folder / "index.html").write_bytes(OLD)
    with pytest.raises(UsageError, match="is not empty; --force writes into it"):
        check_folder(folder, option="--html")
    check_folder(folder, option="--html", force=True)
    with pytest.raises(UsageError, match="is a file; name a folder"):
        check_folder(folder / "index.html", option="--html")


def test_runs_get_a_new_folder_each_and_a_failed_one_leaves_none(tmp_path: Path) -> None:
    root = tmp_path / "replay-scenario" / "switching"
    assert new_run_folder(root) == root / "run-1"
    (root / "run-7").mkdir()
    assert new_run_folder(root) == root / "run-8"
    with pytest.raises(RuntimeError), output_folder(None, root) as made:
        raise RuntimeError("an unknown arm")
    assert made == root / "run-9" and not made.exists()
    with output_folder(None, root) as made:
        (made / "results.jsonl").write_bytes(b"")
    assert made == root / "run-9" and made.exists()
    (tmp_path / "taken").write_bytes(OLD)
    with pytest.raises(UsageError, match="taken is not a folder"):
        new_run_folder(tmp_path / "taken" / "switching")
