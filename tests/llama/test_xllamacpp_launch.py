"""The launcher's flag mapping: llama-server spellings onto xllamacpp.CommonParams, refusals in one line."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from drivers.servers.xllamacpp_launch import LaunchError, make_params, parse_flags
from tests.support.llamakit import LAUNCHER, require_xllamacpp


@pytest.fixture
def model(tmp_path: Path) -> Path:
    """Flag mapping only checks that the file exists; it is never loaded here."""
    path = tmp_path / "m.gguf"
    path.write_bytes(b"GGUF")
    return path


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["-m", "x.gguf", "--mlock"], "unknown or unsupported llama-server flag: --mlock"),
        (
            ["-m", "x.gguf", "--cache"],
            "unknown or unsupported llama-server flag: --cache",
        ),  # no abbreviations
        (["--port", "1"], "missing -m/--model FILE"),
        (["-m", "x.gguf", "-c", "many"], "argument -c/--ctx-size: invalid int value: 'many'"),
        (["-m", "x.gguf", "-fa", "maybe"], "argument -fa/--flash-attn: invalid choice: 'maybe'"),
    ],
)
def test_bad_command_lines_exit_2(argv: list[str], message: str) -> None:
    with pytest.raises(LaunchError, match=message) as e:
        parse_flags(argv)
    assert e.value.exit_code == 2


def test_refusal_is_one_line_and_exit_2(tmp_path: Path) -> None:
    p = subprocess.run([*LAUNCHER, "-m", "x.gguf", "--mlock"], capture_output=True, text=True, timeout=30)
    assert p.returncode == 2
    assert p.stdout == ""
    assert p.stderr == "xllamacpp_launch: error: unknown or unsupported llama-server flag: --mlock\n"


@pytest.mark.llama
def test_missing_model_file_exit_2(tmp_path: Path) -> None:
    require_xllamacpp()
    p = subprocess.run(
        [*LAUNCHER, "-m", str(tmp_path / "none.gguf")], capture_output=True, text=True, timeout=30
    )
    assert p.returncode == 2
    assert p.stderr.strip().endswith("model file not found: " + str(tmp_path / "none.gguf"))


@pytest.mark.llama
def test_server_flags_map_onto_common_params(model: Path, tmp_path: Path) -> None:
    require_xllamacpp()
    argv = [
        "-m", str(model), "--host", "127.0.0.2", "--port", "0", "-c", "8192", "-np", "3",
        "-b", "1024", "-ub", "256", "-t", "1", "-cram", "0", "--slot-save-path", str(tmp_path),
        "--metrics", "--no-slots", "-kvu", "--swa-full", "-ctxcp", "4", "-cms", "64",
        "-sps", "0.5", "--cache-reuse", "128", "-a", "tiny,small", "-ctk", "q8_0", "-fa", "off",
        "--no-warmup", "-lv", "4",
    ]  # fmt: skip
    p = make_params(argv)
    assert p.model.path == str(model)
    assert (p.hostnames, p.port, p.n_ctx, p.n_parallel) == (["127.0.0.2"], 0, 8192, 3)
    assert (p.n_batch, p.n_ubatch, p.cpuparams.n_threads) == (1024, 256, 1)
    assert p.cpuparams_batch.n_threads == 1  # like llama-server, -tb follows -t unless given
    assert p.cache_ram_mib == 0
    assert p.slot_save_path == str(tmp_path) + "/"  # llama-server appends the separator too
    assert p.endpoint_metrics and not p.endpoint_slots and p.kv_unified and p.swa_full
    assert (p.n_ctx_checkpoints, p.checkpoint_min_step, p.n_cache_reuse) == (4, 64, 128)
    assert p.slot_prompt_similarity == pytest.approx(0.5)
    assert p.model_alias == {"tiny", "small"}
    assert p.cache_type_k.name == "GGML_TYPE_Q8_0"
    assert p.flash_attn_type.name == "LLAMA_FLASH_ATTN_TYPE_DISABLED"
    assert not p.warmup and p.verbosity == 4


@pytest.mark.llama
def test_defaults_follow_llama_server(model: Path) -> None:
    require_xllamacpp()
    p = make_params(["-m", str(model)])
    assert (p.hostnames, p.port) == (["127.0.0.1"], 8080)
    assert p.cache_prompt and p.endpoint_slots and not p.endpoint_metrics


@pytest.mark.llama
def test_later_flag_wins(model: Path) -> None:
    require_xllamacpp()
    assert make_params(["-m", str(model), "--no-cache-prompt", "--cache-prompt"]).cache_prompt
    assert not make_params(["-m", str(model), "--cache-prompt", "--no-cache-prompt"]).cache_prompt
    assert make_params(["-m", str(model), "-np", "2", "--parallel=4"]).n_parallel == 4


@pytest.mark.llama
def test_slot_save_path_must_exist(model: Path, tmp_path: Path) -> None:
    require_xllamacpp()
    with pytest.raises(LaunchError, match="--slot-save-path must be an existing directory") as e:
        make_params(["-m", str(model), "--slot-save-path", str(tmp_path / "nope")])
    assert e.value.exit_code == 2
