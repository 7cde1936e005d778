"""What one sequence's state weighs in llama.cpp: bytes per token and per checkpoint, from the
model's architecture, so a tiny test model and a 35B hybrid model are each one set of figures.

A slot's memory has up to three parts (src/llama-memory*.cpp, src/llama-kv-cache*.cpp):
- full-attention layers: K and V rows for every token held;
- sliding-window layers (`n_swa` > 0, an `iswa` cache): the same, but their state holds only the
  tokens inside the window of the last position;
- recurrent layers (SSM, hybrid models): one state per sequence whatever its length.

The byte counts follow the state writers: `llama_kv_cache::state_write` (per stream a cell count;
per cell its position, seq count and seq id, plus a 12-byte extension for M-RoPE models; per
layer a K and a V header; then the rows of the cells not masked by the window) and
`llama_memory_recurrent::state_write`. A checkpoint (`LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY`) holds
only the part that cannot be rolled back: the window's cells of an `iswa` cache
(`llama_kv_cache_iswa::state_write`), the recurrent state of a hybrid one
(`llama_memory_hybrid::state_write`).
"""

from __future__ import annotations

from dataclasses import dataclass

CELL_META = 12  # llama_pos pos, uint32 n_seq_id, llama_seq_id seq_id
CELL_EXT = 12  # llama_kv_cell_ext (x, y, tok): written when the model needs 2D positions
LAYER_HEADER = 24  # K: int32 type + uint64 row size; V: the same (or type, element size, width)
DATA_HEADER = 16  # v_trans, n_layer, n_rot_k, n_rot_v
# `llama_context::state_seq_get_size`/`_get_data` (a state held in memory: the prompt cache, a
# checkpoint) start with a magic and the seq id; a slot file (`state_seq_save_file`) does not.
IN_MEMORY_HEADER = 8


@dataclass(frozen=True, slots=True)
class Arch:
    """A model's memory layout. Byte figures are per token for the attention caches (all their
    layers' K and V rows together) and per sequence for the recurrent state.

    `checkpoint_fixed` / `checkpoint_per_token`, when set, replace the computed checkpoint size (a
    preset from a field report gives a checkpoint's size measured, not its layers).
    """

    name: str
    ctx_train: int
    kv_layers: int
    kv_bytes_per_token: int
    swa_layers: int = 0
    swa_bytes_per_token: int = 0
    n_swa: int = 0
    recurrent_layers: int = 0
    recurrent_bytes: int = 0
    cell_ext: bool = False
    add_bos: bool = True
    checkpoint_fixed: int | None = None
    checkpoint_per_token: int | None = None

    @property
    def kind(self) -> str:
        """`kv` (plain attention), `iswa` (sliding window), `hybrid` (attention + recurrent),
        `recurrent`."""
        if self.recurrent_layers:
            return "hybrid" if self.kv_layers else "recurrent"
        return "iswa" if self.n_swa > 0 and self.swa_layers else "kv"

    @property
    def can_shift(self) -> bool:
        """`llama_memory_can_shift`: a plain KV cache can move cells; a windowed or recurrent one
        cannot, so llama-server turns `--cache-reuse` and context shift off (`load_model`)."""
        return self.kind == "kv"

    def needs_checkpoints(self, swa_full: bool) -> bool:
        """`pre_decode`'s `do_checkpoint`: the memory cannot be rolled back to any position when it
        is recurrent (seq_rm type FULL or RS) or windowed without `--swa-full`."""
        return self.recurrent_layers > 0 or (self.kind == "iswa" and not swa_full)

    def meta_per_cell(self) -> int:
        return CELL_META + (CELL_EXT if self.cell_ext else 0)


def kv_state_bytes(cells: int, layers: int, bytes_per_token: int, meta: int, streams: int) -> int:
    """`llama_kv_cache::state_write` for one sequence: stream count, a cell count per stream, and
    for the sequence's stream its cells' metadata, the data header, per-layer headers and rows."""
    head = 4 + 4 * streams
    if cells <= 0 or layers <= 0:
        return head if layers > 0 else 0
    return head + cells * meta + DATA_HEADER + layers * LAYER_HEADER + cells * bytes_per_token


def recurrent_state_bytes(arch: Arch) -> int:
    """`llama_memory_recurrent::state_write` for one sequence: a cell count, the cell's metadata,
    the data header, a header per layer for its conv (r) and ssm (s) states, and the states."""
    if arch.recurrent_layers <= 0:
        return 0
    return 4 + CELL_META + 8 + arch.recurrent_layers * LAYER_HEADER + arch.recurrent_bytes


def state_bytes(arch: Arch, full_cells: int, swa_cells: int, streams: int, in_memory: bool = True) -> int:
    """The whole sequence state (`llama_state_seq_get_size_ext`, no flags): what the host prompt
    cache stores for a slot (`in_memory`) and what a slot file holds after its token list."""
    meta = arch.meta_per_cell()
    total = IN_MEMORY_HEADER if in_memory else 0
    total += kv_state_bytes(full_cells, arch.kv_layers, arch.kv_bytes_per_token, meta, streams)
    if arch.kind == "iswa":
        total += kv_state_bytes(swa_cells, arch.swa_layers, arch.swa_bytes_per_token, meta, streams)
    if arch.recurrent_layers:
        total += recurrent_state_bytes(arch) if full_cells > 0 else 4
    return total


def checkpoint_bytes(arch: Arch, n_tokens: int, swa_cells: int, streams: int) -> int:
    """One context checkpoint (`common_prompt_checkpoint::size`, the partial state): the window's
    cells of an `iswa` cache, the recurrent state of a hybrid or recurrent one."""
    if arch.checkpoint_fixed is not None:
        return arch.checkpoint_fixed + (arch.checkpoint_per_token or 0) * n_tokens
    if arch.kind == "iswa":
        meta = arch.meta_per_cell()
        return IN_MEMORY_HEADER + kv_state_bytes(
            swa_cells, arch.swa_layers, arch.swa_bytes_per_token, meta, streams
        )
    return IN_MEMORY_HEADER + recurrent_state_bytes(arch)


def tokens_bytes(n_tokens: int) -> int:
    """`server_tokens::serialize` of a text prompt: a null marker, a version, the token vector
    (count + ids) and an empty media-key vector, as int32s."""
    return 4 * (n_tokens + 4)


SLOT_FILE_HEADER = 12  # LLAMA_STATE_SEQ_MAGIC, LLAMA_STATE_SEQ_VERSION, token count


def slot_file_bytes(state: int, n_tokens: int, checkpoints: list[int]) -> int:
    """`llama_state_seq_save_file` (header, packed tokens, state) plus, when the build appends them,
    `save_slot_checkpoints`: "SCKP", version and count, then per checkpoint its n_tokens (8), pos_min
    and pos_max (4 + 4) and three length-prefixed blobs (target, draft, speculative state)."""
    total = SLOT_FILE_HEADER + tokens_bytes(n_tokens) + state
    if checkpoints:
        total += 12 + sum(8 + 4 + 4 + 8 + size + 8 + 8 for size in checkpoints)
    return total


# ggml_row_size per element: block bytes / block elements (ggml's type traits).
CACHE_TYPES: dict[str, tuple[int, int]] = {
    "f32": (4, 1),
    "f16": (2, 1),
    "bf16": (2, 1),
    "q8_0": (34, 32),
    "q4_0": (18, 32),
    "q4_1": (20, 32),
    "iq4_nl": (18, 32),
    "q5_0": (22, 32),
    "q5_1": (24, 32),
}

# llama.cpp's `set_swa_pattern(n)` per architecture: of every n layers the last is full attention.
SWA_PATTERNS: dict[str, int] = {"gemma2": 2, "gemma3": 6, "cohere2": 4}


def row_bytes(cache_type: str, n: int) -> int:
    size, block = CACHE_TYPES[cache_type]
    return n * size // block


def _int(meta: dict[str, object], key: str, default: int = 0) -> int:
    v = meta.get(key)
    if isinstance(v, bool):
        return int(v)
    if isinstance(v, int):
        return v
    if isinstance(v, float):
        return int(v)
    if isinstance(v, list) and v and all(isinstance(x, int) for x in v):
        return max(x for x in v if isinstance(x, int))
    return default


def arch_from_metadata(meta: dict[str, object], type_k: str = "f16", type_v: str = "f16") -> Arch:
    """A model's layout from its GGUF metadata (`general.architecture`, `{arch}.block_count`,
    `.attention.head_count_kv`, `.attention.key_length`/`.value_length`, `.attention.sliding_window`,
    `.ssm.*`), with llama-server's KV cache types (`-ctk`, `-ctv`)."""
    name = str(meta.get("general.architecture") or "llama")
    a = name + "."
    layers = _int(meta, a + "block_count", 1)
    embd = _int(meta, a + "embedding_length", 0)
    heads = max(1, _int(meta, a + "attention.head_count", 1))
    kv_heads = _int(meta, a + "attention.head_count_kv", heads) or heads
    k_len = _int(meta, a + "attention.key_length", embd // heads)
    v_len = _int(meta, a + "attention.value_length", embd // heads)
    per_layer = row_bytes(type_k, kv_heads * k_len) + row_bytes(type_v, kv_heads * v_len)
    n_swa = _int(meta, a + "attention.sliding_window", 0)
    swa_layers = 0
    if n_swa > 0 and name in SWA_PATTERNS:
        pattern = SWA_PATTERNS[name]
        swa_layers = sum(1 for il in range(layers) if il % pattern < pattern - 1)
    conv = _int(meta, a + "ssm.conv_kernel", 0)
    inner = _int(meta, a + "ssm.inner_size", 0)
    state = _int(meta, a + "ssm.state_size", 0)
    groups = _int(meta, a + "ssm.group_count", 0)
    recurrent_layers = 0
    recurrent = 0
    if inner and state:
        interval = _int(meta, a + "full_attention_interval", 0)
        recurrent_layers = layers - (layers // interval if interval > 0 else 0)
        per_r = max(0, conv - 1) * (inner + 2 * groups * state) * 4  # f32 conv state (n_embd_r)
        per_s = state * inner * 4  # f32 ssm state (n_embd_s)
        recurrent = recurrent_layers * (per_r + per_s)
    kv_layers = layers - swa_layers - recurrent_layers
    add_bos = meta.get("tokenizer.ggml.add_bos_token")
    return Arch(
        name=name,
        ctx_train=_int(meta, a + "context_length", 4096),
        kv_layers=kv_layers,
        kv_bytes_per_token=kv_layers * per_layer,
        swa_layers=swa_layers,
        swa_bytes_per_token=swa_layers * per_layer,
        n_swa=n_swa if swa_layers else 0,
        recurrent_layers=recurrent_layers,
        recurrent_bytes=recurrent,
        add_bos=bool(add_bos) if isinstance(add_bos, bool) else name == "llama",
    )
