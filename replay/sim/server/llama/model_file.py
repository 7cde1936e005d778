"""What the simulator reads from a GGUF model file (`-m`): the memory layout (bytes per token, the
window, recurrent state) and the tokenizer, so its token counts and state sizes are the server's.

Only the metadata is read (the `gguf` package's reader maps the file; tensors are never loaded).
The simulator renders prompts as ChatML (`replay.sim.model.llama.prompt`): a model whose template
is something else still runs, with a line in the log saying its prompts are counted as ChatML.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from replay.errors import UsageError
from replay.sim.model.llama.arch import Arch, arch_from_metadata
from replay.sim.model.llama.prompt import ChatTokenizer
from replay.sim.model.llama.spm import SpmVocab

CHATML_MARKERS = ("<|im_start|>", "<|im_end|>")


@dataclass(frozen=True, slots=True)
class ModelFile:
    path: str
    arch: Arch
    tokenizer: ChatTokenizer
    chat_template: str
    chatml: bool  # the template is ChatML, as the simulator renders it
    bos: str
    eos: str
    ftype: str


def read_model(path: str, type_k: str = "f16", type_v: str = "f16") -> ModelFile:
    """The layout and tokenizer of the GGUF file at `path`; a one-line UsageError otherwise."""
    file = Path(path)
    if not file.is_file():
        raise UsageError(f"model file not found: {path}")
    try:
        import gguf
    except ImportError as exc:
        raise UsageError(
            f"reading {path} needs the gguf package ({exc}): pip install 'agent-replay[llama]'"
        ) from None
    try:
        reader = gguf.GGUFReader(str(file))
    except (ValueError, OSError) as exc:
        raise UsageError(f"{path}: not a GGUF model file ({exc})") from None
    big = (
        "tokenizer.ggml.tokens",
        "tokenizer.ggml.scores",
        "tokenizer.ggml.token_type",
        "tokenizer.ggml.merges",
    )
    meta: dict[str, object] = {}
    for key, field in reader.fields.items():
        if key in big or key.startswith("GGUF."):
            continue
        try:
            meta[key] = field.contents()
        except (ValueError, IndexError):
            continue
    model = str(meta.get("tokenizer.ggml.model") or "")
    if model != "llama":
        raise UsageError(
            f"{path}: tokenizer {model or 'none'!r} is not modelled (the simulator tokenizes SentencePiece "
            "'llama' vocabularies; without -m it counts with its own word tokenizer)"
        )
    tokens = list(reader.fields["tokenizer.ggml.tokens"].contents())
    scores = (
        list(reader.fields["tokenizer.ggml.scores"].contents())
        if "tokenizer.ggml.scores" in reader.fields
        else [0.0] * len(tokens)
    )
    arch = arch_from_metadata(meta, type_k, type_v)
    bos_id = meta.get("tokenizer.ggml.bos_token_id")
    eos_id = meta.get("tokenizer.ggml.eos_token_id")
    bos = tokens[bos_id] if isinstance(bos_id, int) and 0 <= bos_id < len(tokens) else ""
    eos = tokens[eos_id] if isinstance(eos_id, int) and 0 <= eos_id < len(tokens) else ""
    prefix = meta.get("tokenizer.ggml.add_space_prefix")
    vocab = SpmVocab(
        tokens, [float(s) for s in scores], add_space_prefix=prefix if isinstance(prefix, bool) else True
    )
    template = str(meta.get("tokenizer.chat_template") or "")
    ftype = {0: "F32", 1: "F16", 7: "Q8_0", 2: "Q4_0"}.get(meta.get("general.file_type"), "unknown")  # type: ignore[arg-type]
    return ModelFile(
        path=path,
        arch=arch,
        tokenizer=ChatTokenizer(vocab, bos if arch.add_bos else None),
        chat_template=template,
        chatml=all(m in template for m in CHATML_MARKERS),
        bos=bos,
        eos=eos,
        ftype=ftype,
    )
