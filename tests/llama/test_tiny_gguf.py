"""The generated GGUF: deterministic bytes, a vocabulary llama.cpp's SPM merge turns into one token
per word, and the weights that keep output printable (checked on the file, without a server)."""

from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np
import pytest

from replay.errors import UsageError
from replay.testing.gguf_model import SLOW, SPACE, build_vocab, make_model
from replay.trace.synth import WORDS


def read(path: Path) -> gguf.GGUFReader:
    return gguf.GGUFReader(str(path))


def field(reader: gguf.GGUFReader, key: str):
    return reader.fields[key].contents()


def tensors(reader: gguf.GGUFReader) -> dict[str, gguf.ReaderTensor]:
    return {t.name: t for t in reader.tensors}


def test_same_arguments_same_bytes(tmp_path: Path) -> None:
    a = make_model(tmp_path / "a.gguf")
    b = make_model(tmp_path / "b.gguf")
    c = make_model(tmp_path / "c.gguf", seed=1)
    assert a.read_bytes() == b.read_bytes()
    assert a.read_bytes() != c.read_bytes()
    assert not list(tmp_path.glob(".tiny-*"))  # the temporary file was renamed, not left behind


def test_llama_metadata_and_tensor_types(tiny_llama: Path) -> None:
    r = read(tiny_llama)
    assert field(r, "general.architecture") == "llama"
    assert field(r, "llama.context_length") >= 16384
    assert field(r, "llama.block_count") == 2 and field(r, "llama.embedding_length") == 64
    assert field(r, "tokenizer.ggml.model") == "llama"
    assert field(r, "tokenizer.ggml.add_bos_token") is True
    template = field(r, "tokenizer.chat_template")
    assert "<|im_start|>" in template and "add_generation_prompt" in template
    for name, t in tensors(r).items():
        want = (
            gguf.GGMLQuantizationType.F32 if name.endswith("norm.weight") else gguf.GGMLQuantizationType.F16
        )
        assert t.tensor_type == want, name


def test_constant_dimension_and_logit_bias(tiny_llama: Path) -> None:
    ts = tensors(read(tiny_llama))
    vocab = build_vocab()
    assert np.all(ts["token_embd.weight"].data[:, 0] == 1.0)
    for i in range(2):
        assert not ts[f"blk.{i}.attn_output.weight"].data[0].any()
        assert not ts[f"blk.{i}.ffn_down.weight"].data[0].any()
    bias = ts["output.weight"].data[:, 0]
    assert np.all(bias[vocab.allowed] == 0.0)
    assert np.all(bias[~vocab.allowed] <= -500.0)


def test_gemma2_ties_output_and_sets_the_window(tiny_gemma2: Path) -> None:
    r = read(tiny_gemma2)
    ts = tensors(r)
    assert field(r, "general.architecture") == "gemma2"
    assert field(r, "gemma2.attention.sliding_window") == 256
    assert "output.weight" not in ts  # llama.cpp's gemma2 refuses an untied output matrix
    assert {"blk.1.post_attention_norm.weight", "blk.1.post_ffw_norm.weight"} <= ts.keys()
    allowed = build_vocab().allowed
    col0 = ts["token_embd.weight"].data[:, 0]
    assert col0.min() > 0  # every token, including the prompt's last (a newline byte), keeps it positive
    assert col0[allowed].min() > col0[~allowed].max()


def test_vocabulary_shape() -> None:
    v = build_vocab()
    assert v.tokens[:5] == ["<unk>", "<s>", "</s>", "<|im_start|>", "<|im_end|>"]
    assert (v.unk, v.bos, v.eos) == (0, 1, 2)
    assert v.tokens[5:261] == [f"<0x{b:02X}>" for b in range(256)]
    assert len(v.tokens) == len(set(v.tokens))
    index = set(v.tokens)
    assert SPACE in index and all(chr(c) in index for c in range(0x21, 0x7F))
    forbidden = {t for t, ok in zip(v.tokens, v.allowed, strict=True) if not ok}
    assert forbidden == set(v.tokens[:261])


def test_every_word_prefix_is_a_token() -> None:
    """SPM merges adjacent pieces only into known tokens; with every prefix known, a word always
    merges left to right into one token, with or without its leading space marker."""
    index = set(build_vocab().tokens)
    for word in WORDS:
        for piece in (word, SPACE + word):
            assert all(piece[:n] in index for n in range(1, len(piece) + 1)), piece


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"arch": "mamba"}, "unknown architecture"),
        ({"dim": 100}, "--dim must be a multiple of 16"),
        ({"layers": 0}, "--layers must be"),
        ({"ctx": 100}, "--ctx must be at least"),
        ({"arch": "gemma2", "swa": 16384}, "--swa must be"),
    ],
)
def test_bad_arguments_are_usage_errors(tmp_path: Path, kwargs: dict, message: str) -> None:
    with pytest.raises(UsageError, match=message):
        make_model(tmp_path / "m.gguf", **kwargs)


def test_directory_target_is_a_usage_error(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="is a directory"):
        make_model(tmp_path)


def test_slow_preset_shape() -> None:
    assert SLOW == {"layers": 8, "dim": 512}
