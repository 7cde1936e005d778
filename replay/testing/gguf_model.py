"""A tiny random-weight GGUF model so a real llama.cpp server can run in tests and CI.

No package registry ships a small GGUF, so we write one with the `gguf` package. The weights are
random, but three properties are engineered so measurements are predictable:

- Output is printable and never stops early: hidden dimension 0 is a constant that no layer
  writes to (row 0 of every `attn_output` and `ffn_down` is zero), and the output matrix's
  column 0 turns it into a per-token logit bias that pushes control, special and byte tokens far
  down. Every request runs to `max_tokens` with finish reason "length".
  llama: `token_embd[:, 0] = 1` and `output.weight[:, 0]` is the bias (0 or -1000).
  gemma2 ties the output to `token_embd`, so there column 0 is 2 for printable tokens and 1 for
  the others (positive for every token, since any token may end a prompt), and a large
  `output_norm` weight on dimension 0 turns that gap into a logit gap of hundreds.
- Common English words are single tokens: every prefix of every word (ours plus
  `replay.trace.synth.WORDS`) is in the vocabulary, with and without the SentencePiece space
  marker, so llama.cpp's SPM merge always reaches the whole word. N synthetic words are about
  N prompt tokens, as with a real BPE model.
- Same arguments give the same bytes (a seeded generator, fixed write order), so a cached model
  file can be compared and re-used. The vocabulary follows `synth.WORDS`, so a change there
  changes the bytes.

Matrices are F16 and norms F32: an all-F32 model aborts in the CPU backend's `get_rows`.
The `gemma2` variant has a sliding window on every other layer; llama-server then creates context
checkpoints, the nearest CPU stand-in for hybrid (SSM + attention) models.

Sizes (vocabulary ~6K tokens): the default 2 layers x 64 dims (~0.9M parameters, 1.9 MB, written
in ~0.5 s) is for fast tests; `SLOW` (8 layers x 512 dims, ~33M parameters, 67 MB, ~1.3 s) gives a
server where a cache miss on a 4K-token prompt costs seconds and a hit tens of milliseconds.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import numpy as np

from replay.errors import UsageError
from replay.outputs import replacing

Arch = Literal["llama", "gemma2"]

SPACE = "\u2581"  # SentencePiece's word-start marker; llama.cpp turns spaces into it

CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' }}"
    "{% if message['content'] is string %}{{ message['content'] }}{% endif %}"
    "{{ '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)

# Logit bias (times the normalised constant dimension, ~0.5-1) for tokens that must never be sampled.
_FORBIDDEN_BIAS = -1000.0
# gemma2 (tied output): output_norm weight on the constant dimension; the allowed/forbidden gap in
# token_embd[:, 0] is 1.0, so the logit gap is about this times the normalised constant (~1-2).
_TIED_BIAS_SCALE = 100.0
_TIED_EMBED_SCALE = 0.05

_COMMON_WORDS_TEXT = """
    the of and to a in is it you that he was for on are with as i his they be at one have this
    from or had by hot word but what some we can out other were all there when up use your how
    said an each she which do their time if will way about many then them write would like so
    these her long make thing see him two has look more day could go come did number sound no
    most people my over know water than call first who may down side been now find any new work
    part take get place made live where after back little only round man year came show every
    good me give our under name very through just form sentence great think say help low line
    differ turn cause much mean before move right boy old too same tell does set three want air
    well also play small end put home read hand port large spell add even land here must big
    high such follow act why ask men change went light kind off need house picture try us again
    animal point mother world near build self earth father head stand own page should country
    found answer school grow study still learn plant cover food sun four between state keep eye
    never last let thought city tree cross farm hard start might story saw far sea draw left
    late run while press close night real life few north open seem together next white children
    begin got walk example ease paper group always music those both mark often letter until mile
    river car feet care second book carry took science eat room friend began idea fish mountain
    stop once base hear horse cut sure watch color face wood main enough plain girl usual young
    ready above ever red list though feel talk bird soon body dog family direct pose leave song
    measure door product black short numeral class wind question happen complete ship area half
    rock order fire south problem piece told knew pass since top whole king space heard best hour
    better true during hundred five remember step early hold west ground interest reach fast verb
    sing listen six table travel less morning ten simple several vowel toward war lay against
    pattern slow center love person money serve appear road map rain rule govern pull cold notice
    voice unit power town fine certain fly fall lead cry dark machine note wait plan figure star
    box noun field rest correct able pound done beauty drive stood contain front teach week final
    gave green oh quick develop ocean warm free minute strong special mind behind clear tail
    produce fact street inch multiply nothing course stay wheel full force blue object decide
    surface deep moon island foot system busy test record boat common gold possible plane stead
    dry wonder laugh thousand ago ran check game shape equate miss brought heat snow tire bring
    yes distant fill east paint language among file code data server cache token model request
    response function value error result string list type class method return build run test
"""
COMMON_WORDS: tuple[str, ...] = tuple(_COMMON_WORDS_TEXT.split())

SLOW = {"layers": 8, "dim": 512}


@dataclass(frozen=True)
class ModelSpec:
    """The knobs of a generated model; equal specs give byte-identical files."""

    arch: Arch = "llama"
    layers: int = 2
    dim: int = 64
    ctx: int = 16384
    swa: int = 256
    seed: int = 0

    @property
    def head_dim(self) -> int:
        """64 like real models once the width allows it, else four heads (dim is a multiple of 16)."""
        return 64 if self.dim >= 256 and self.dim % 64 == 0 else self.dim // 4

    @property
    def heads(self) -> int:
        return self.dim // self.head_dim

    @property
    def ffn(self) -> int:
        return 3 * self.dim

    def check(self) -> None:
        """Reject shapes llama.cpp cannot load, with a one-line reason."""
        if self.arch not in ("llama", "gemma2"):
            raise UsageError(f"unknown architecture {self.arch!r}: use llama or gemma2")
        if self.layers < 1 or self.layers > 256:
            raise UsageError(f"--layers must be 1..256, got {self.layers}")
        if self.dim < 16 or self.dim % 16 != 0 or self.dim > 8192:
            raise UsageError(f"--dim must be a multiple of 16 in 16..8192, got {self.dim}")
        if self.ctx < 256:
            raise UsageError(f"--ctx must be at least 256, got {self.ctx}")
        if self.arch == "gemma2" and not 1 <= self.swa < self.ctx:
            raise UsageError(f"--swa must be 1..ctx-1 for gemma2, got {self.swa}")


@dataclass(frozen=True)
class Vocab:
    """Token texts with SentencePiece scores and GGUF token types, plus the special ids."""

    tokens: list[str]
    scores: list[float]
    types: list[int]
    allowed: np.ndarray  # bool per token: may be sampled (printable, not special)
    bos: int
    eos: int
    unk: int
    im_start: int
    im_end: int


def _word_list() -> list[str]:
    """Our words plus the synthetic-text generator's, so synthetic prompts are one token per word."""
    try:
        from replay.trace.synth import WORDS as synth_words
    except ImportError:  # the generator is optional for this module; our own list stands alone
        synth_words = ()
    words = [w.lower() for w in (*COMMON_WORDS, *synth_words) if w.isascii() and w.isalpha()]
    return list(dict.fromkeys(words))


def build_vocab() -> Vocab:
    """SentencePiece-style vocabulary: specials, 256 byte tokens, ASCII, words and their prefixes."""
    from gguf import TokenType

    tokens: list[str] = []
    scores: list[float] = []
    types: list[int] = []
    allowed: list[bool] = []
    index: dict[str, int] = {}

    def add(text: str, score: float, kind: TokenType, ok: bool) -> int:
        if text in index:
            return index[text]
        index[text] = len(tokens)
        tokens.append(text)
        scores.append(score)
        types.append(int(kind))
        allowed.append(ok)
        return index[text]

    unk = add("<unk>", 0.0, TokenType.UNKNOWN, False)
    bos = add("<s>", 0.0, TokenType.CONTROL, False)
    eos = add("</s>", 0.0, TokenType.CONTROL, False)
    im_start = add("<|im_start|>", 0.0, TokenType.CONTROL, False)
    im_end = add("<|im_end|>", 0.0, TokenType.CONTROL, False)
    for b in range(256):
        add(f"<0x{b:02X}>", 0.0, TokenType.BYTE, False)
    # Single characters score lowest so merges prefer longer pieces; a longer piece scores higher.
    add(SPACE, -1.0, TokenType.NORMAL, True)
    for c in range(0x21, 0x7F):
        add(chr(c), -1.0, TokenType.NORMAL, True)
    for word in _word_list():
        for marker in (SPACE, ""):
            piece = marker + word
            for end in range(2, len(piece) + 1):
                add(piece[:end], float(end), TokenType.NORMAL, True)
    return Vocab(tokens, scores, types, np.array(allowed), bos, eos, unk, im_start, im_end)


def _f16(a: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(a, dtype=np.float16)


def _f32(a: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(a, dtype=np.float32)


def _tensors(spec: ModelSpec, vocab: Vocab) -> list[tuple[str, np.ndarray]]:
    """All tensors in write order; numpy shape is (out, in), the reverse of ggml's ne."""
    rng = np.random.default_rng(spec.seed)
    d, ff, n_vocab = spec.dim, spec.ffn, len(vocab.tokens)

    def normal(shape: tuple[int, int], fan_in: int) -> np.ndarray:
        return rng.standard_normal(shape, dtype=np.float32) / np.float32(np.sqrt(fan_in))

    ones = np.ones(d, dtype=np.float32)
    embd = rng.standard_normal((n_vocab, d), dtype=np.float32)
    out_norm = ones.copy()
    if spec.arch == "llama":
        embd[:, 0] = 1.0  # the constant dimension every position carries to the output
        out = normal((n_vocab, d), d)
        out[:, 0] = np.where(vocab.allowed, 0.0, _FORBIDDEN_BIAS)
    else:
        # gemma2 ties output to token_embd, so column 0 is both the input constant and the bias.
        # It stays positive for every token (any token can end a prompt) and is larger for
        # printable ones; a large output_norm weight turns that gap into a wide logit gap.
        # Tied weights score each token by its likeness to the current one, which makes a model
        # repeat its last token; small embeddings leave the final state to the layers' outputs.
        embd[:, 1:] *= _TIED_EMBED_SCALE
        embd[:, 0] = np.where(vocab.allowed, 2.0, 1.0)
        out_norm[0] = _TIED_BIAS_SCALE
        out = None

    # gemma2's layers must not see the constant (it would drown the tokens' own directions).
    in_norm = ones.copy()
    if spec.arch == "gemma2":
        in_norm[0] = 0.0

    tensors: list[tuple[str, np.ndarray]] = [("token_embd.weight", _f16(embd))]
    for i in range(spec.layers):
        p = f"blk.{i}."
        wo = normal((d, d), d)
        wo[0, :] = 0.0
        down = normal((d, ff), ff)
        down[0, :] = 0.0
        layer = [
            ("attn_norm.weight", _f32(in_norm)),
            ("attn_q.weight", _f16(normal((d, d), d))),
            ("attn_k.weight", _f16(normal((d, d), d))),
            ("attn_v.weight", _f16(normal((d, d), d))),
            ("attn_output.weight", _f16(wo)),
        ]
        if spec.arch == "gemma2":
            layer.append(("post_attention_norm.weight", _f32(ones)))
        layer += [
            ("ffn_norm.weight", _f32(in_norm)),
            ("ffn_gate.weight", _f16(normal((ff, d), d))),
            ("ffn_up.weight", _f16(normal((ff, d), d))),
            ("ffn_down.weight", _f16(down)),
        ]
        if spec.arch == "gemma2":
            layer.append(("post_ffw_norm.weight", _f32(ones)))
        tensors += [(p + name, t) for name, t in layer]
    tensors.append(("output_norm.weight", _f32(out_norm)))
    if out is not None:
        tensors.append(("output.weight", _f16(out)))
    return tensors


def _write(spec: ModelSpec, vocab: Vocab, path: Path) -> None:
    import gguf

    w = gguf.GGUFWriter(str(path), spec.arch)
    w.add_name(f"agent-replay tiny {spec.arch} {spec.layers}x{spec.dim} seed {spec.seed}")
    w.add_context_length(spec.ctx)
    w.add_embedding_length(spec.dim)
    w.add_block_count(spec.layers)
    w.add_feed_forward_length(spec.ffn)
    w.add_head_count(spec.heads)
    w.add_head_count_kv(spec.heads)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_file_type(gguf.LlamaFileType.MOSTLY_F16)
    if spec.arch == "llama":
        w.add_rope_dimension_count(spec.head_dim)
        w.add_rope_freq_base(10000.0)
    else:
        w.add_key_length(spec.head_dim)
        w.add_value_length(spec.head_dim)
        w.add_sliding_window(spec.swa)
        w.add_attn_logit_softcapping(50.0)
        w.add_final_logit_softcapping(10000.0)  # near-linear: gemma's 30 would flatten the bias gap
    w.add_vocab_size(len(vocab.tokens))
    w.add_tokenizer_model("llama")
    w.add_tokenizer_pre("default")
    w.add_token_list(vocab.tokens)
    w.add_token_scores(vocab.scores)
    w.add_token_types(vocab.types)
    w.add_bos_token_id(vocab.bos)
    w.add_eos_token_id(vocab.eos)
    w.add_unk_token_id(vocab.unk)
    w.add_add_bos_token(True)
    w.add_add_eos_token(False)
    w.add_chat_template(CHATML_TEMPLATE)
    for name, tensor in _tensors(spec, vocab):
        w.add_tensor(name, tensor)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def make_model(
    path: str | os.PathLike[str],
    *,
    layers: int = 2,
    dim: int = 64,
    arch: Arch = "llama",
    swa: int = 256,
    ctx: int = 16384,
    seed: int = 0,
) -> Path:
    """Write the model to `path` atomically (temp file + rename) and return the path."""
    spec = ModelSpec(arch=arch, layers=layers, dim=dim, ctx=ctx, swa=swa, seed=seed)
    spec.check()
    target = Path(path)
    if target.is_dir():
        raise UsageError(f"{target} is a directory: give a file name such as {target / 'tiny.gguf'}")
    target.parent.mkdir(parents=True, exist_ok=True)
    with replacing(target) as tmp:
        _write(spec, build_vocab(), tmp)
    return target
