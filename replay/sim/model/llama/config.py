"""The simulated llama-server's settings: its own flags with its defaults, the build whose rules
apply, the model's memory layout (`arch.py`) and its speeds.

Field names follow llama-server's flags (`--ctx-checkpoints` -> `ctx_checkpoints`); defaults are
common/common.h's at b11549 (`n_parallel` is llama-server's: -1, "auto", which tools/server/server.cpp
turns into 4 slots over a unified KV cache). A preset is a model: its layout and speeds, every figure
with its source.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from replay.sim.model.llama.arch import Arch
from replay.sim.model.llama.build import Rules, rules_for

KiB = 1024
MiB = 1024 * KiB
GiB = 1024 * MiB

AUTO_PARALLEL = 4  # server.cpp: "n_parallel is set to auto, using n_parallel = 4 and kv_unified = true"


@dataclass(frozen=True, slots=True)
class Speeds:
    """Modelled seconds. A prompt token at depth d costs `prefill_s + prefill_depth_s * d` (attention
    reads every token before it); a decode step `1 / decode_tps`; copies to and from the host prompt
    cache and slot files go at the given bytes per second."""

    prefill_s: float
    prefill_depth_s: float
    decode_tps: float
    host_bps: float
    file_write_bps: float
    file_read_bps: float


@dataclass(frozen=True, slots=True)
class Preset:
    arch: Arch
    speeds: Speeds
    model_id: str
    build: int | None
    note: str


def _tiny_speeds() -> Speeds:
    # reference/llama-server.md, "Speed on a 2-core CPU": the 2-layer x 64 model prefills at
    # 22-23K tok/s on xllamacpp and generates "hundreds of tok/s". Depth cost, host and file
    # bandwidths: assumed (a tiny model's state is a few MB).
    return Speeds(
        prefill_s=1 / 22_000,
        prefill_depth_s=0.0,
        decode_tps=400.0,
        host_bps=1e9,
        file_write_bps=1e9,
        file_read_bps=1e9,
    )


# replay/testing/gguf_model.py's default model: 2 layers x 64 dims, 4 KV heads of 16 dims, F16 cache
# (K and V: 2 x 64 x 2 bytes per layer and token), trained context 16384, BOS added.
TINY_LLAMA = Arch(name="llama", ctx_train=16384, kv_layers=2, kv_bytes_per_token=2 * 2 * 64 * 2)
# Its gemma2 variant: one full-attention and one sliding-window layer, window 256 (llama.cpp's
# log: "creating non-SWA KV cache ... 1 layers", "creating SWA KV cache, size = 768 cells ... 1 layers").
TINY_GEMMA2 = Arch(
    name="gemma2",
    ctx_train=16384,
    kv_layers=1,
    kv_bytes_per_token=2 * 64 * 2,
    swa_layers=1,
    swa_bytes_per_token=2 * 64 * 2,
    n_swa=256,
)

# Field report 002 (llama-server, a 35B hybrid SSM + attention model). Its -lv 4 log: "created
# context checkpoint 1 of 32 (n_tokens = 31466, size = 124.990 MiB)", "... 2 of 32 (n_tokens =
# 31978, size = 126.002 MiB)": a checkpoint costs a fixed part plus (126.002 - 124.990) MiB / 512
# per token. "保存（0.68 GiB、3.6 秒）も復元（0.3 秒）": the slot file of the 32,155-token document
# is 0.68 GiB, written in 3.6 s and read in 0.3 s. Assumed: the recurrent state is the checkpoint's
# fixed part, and the file's tokens are the document's (its reply's are not given).
_R002_CKPT_PER_TOKEN = round((126.002 - 124.990) * MiB / 512)
_R002_CKPT_FIXED = round(124.990 * MiB) - 31466 * _R002_CKPT_PER_TOKEN
_R002_FILE = round(0.68 * GiB)
_R002_DOC = 32155
# Per token the file also holds the token id (4 bytes) and the cell's metadata (12).
_R002_KV_PER_TOKEN = round((_R002_FILE - _R002_CKPT_FIXED) / _R002_DOC) - 4 - 12
REPORT002_HYBRID = Arch(
    name="hybrid-35b",
    ctx_train=262144,  # assumed: the report runs 128K ("コンテキストを 128K まで伸ばした")
    kv_layers=1,  # the figures are per token for all attention layers together
    kv_bytes_per_token=_R002_KV_PER_TOKEN,
    recurrent_layers=1,
    recurrent_bytes=_R002_CKPT_FIXED,
    add_bos=False,  # assumed (Qwen-style templates add none)
    checkpoint_fixed=_R002_CKPT_FIXED,
    checkpoint_per_token=_R002_CKPT_PER_TOKEN,
)


def _report002_speeds() -> Speeds:
    # First reads: 32,155 tokens in 159.4 s and 130,179 in 1,053.5 s ("初回 ... 159.4 秒",
    # "1,053.5 秒（17.6 分）"). Prompt time grows with depth, so the per-token cost is a + b * d;
    # the two reads fix a and b (sum over d = 0..N-1: N a + b N (N - 1) / 2).
    n1, s1, n2, s2 = 32155, 159.4, 130179, 1053.5
    q1, q2 = n1 * (n1 - 1) / 2, n2 * (n2 - 1) / 2
    b = (s2 - s1 * n2 / n1) / (q2 - q1 * n2 / n1)
    a = (s1 - b * q1) / n1
    return Speeds(
        prefill_s=a,
        prefill_depth_s=b,
        decode_tps=20.0,  # assumed: the report measures no generation
        host_bps=10e9,  # assumed: a RAM copy
        file_write_bps=_R002_FILE / 3.6,
        file_read_bps=_R002_FILE / 0.3,
    )


PRESETS: dict[str, Preset] = {
    "tiny-llama": Preset(TINY_LLAMA, _tiny_speeds(), "tiny-llama", None, "replay's 2 x 64 test model"),
    "tiny-gemma2": Preset(
        TINY_GEMMA2, _tiny_speeds(), "tiny-gemma2", None, "replay's sliding-window test model"
    ),
    # The build: assumed b11063, the last one read before slot files carried checkpoints (the
    # report's restore re-read everything: "保存ファイルに入るのは KV だけで、チェックポイントは入りません").
    "report002-hybrid": Preset(
        REPORT002_HYBRID, _report002_speeds(), "hybrid-35b", 11063, "field report 002's 35B hybrid model"
    ),
}
DEFAULT_PRESET = "tiny-llama"


@dataclass(frozen=True, slots=True)
class LlamaConfig:
    """llama-server's cache settings as the model uses them (its flags' names, its defaults)."""

    arch: Arch
    speeds: Speeds
    preset: str = DEFAULT_PRESET
    model_id: str = "tiny-llama"
    build: int | None = None
    n_ctx: int = 0  # -c: 0 = the model's trained context
    n_parallel: int = -1  # -np: -1 = auto (4 slots, unified KV)
    kv_unified: bool | None = None  # -kvu / -no-kvu (None: the auto setting's, else off)
    n_batch: int = 2048
    n_ubatch: int = 512
    cache_prompt: bool = True
    cache_ram_mib: int = 8192  # -1 = no limit, 0 = off
    ctx_checkpoints: int = 32
    checkpoint_min_step: int = 8192  # builds with user-message checkpoints
    checkpoint_every_nt: int = 8192  # builds before them (b8929, b9294)
    slot_prompt_similarity: float = 0.1
    cache_reuse: int = 0
    cache_idle_slots: bool = True
    swa_full: bool = False
    n_predict: int = -1
    # A request without max_tokens on a server with -n -1 generates until EOS; the simulated model
    # has no EOS, so it stops here (assumed).
    default_reply_tokens: int = 256

    @property
    def rules(self) -> Rules:
        return rules_for(self.build)

    @property
    def n_slots(self) -> int:
        return AUTO_PARALLEL if self.n_parallel < 0 else max(1, self.n_parallel)

    @property
    def unified(self) -> bool:
        if self.kv_unified is not None:
            return self.kv_unified
        return self.n_parallel < 0

    @property
    def ctx_total(self) -> int:
        return self.n_ctx if self.n_ctx > 0 else self.arch.ctx_train

    @property
    def n_ctx_slot(self) -> int:
        """`n_ctx_slot()`: the sequence's context (the whole pool when unified, else a share),
        capped at the trained context."""
        seq = self.ctx_total if self.unified else self.ctx_total // self.n_slots
        return min(seq, self.arch.ctx_train)

    @property
    def streams(self) -> int:
        """KV streams: one shared by every slot when unified, one per slot otherwise."""
        return 1 if self.unified else self.n_slots

    @property
    def n_swa(self) -> int:
        """`load_model`: `n_swa = swa_full ? 0 : llama_model_n_swa(model)`."""
        return 0 if self.swa_full else self.arch.n_swa

    @property
    def swa_cells(self) -> int:
        """`llama_kv_cache_iswa`: a stream's SWA cache holds
        PAD(min(size_base, n_swa * (unified ? n_seq_max : 1) + n_ubatch), 256) cells (all of them
        with `--swa-full`)."""
        base = self.ctx_total if self.unified else self.ctx_total // self.n_slots
        if self.swa_full or self.arch.n_swa <= 0:
            return base
        want = min(base, self.arch.n_swa * (self.n_slots if self.unified else 1) + self.n_ubatch)
        return (want + 255) // 256 * 256

    @property
    def checkpoints_on(self) -> bool:
        return self.ctx_checkpoints > 0 and self.arch.needs_checkpoints(self.swa_full)

    @property
    def cache_reuse_on(self) -> int:
        """`--cache-reuse` in effect: `load_model` sets it to 0 when the memory cannot shift."""
        return self.cache_reuse if self.arch.can_shift else 0

    @property
    def prompt_cache_on(self) -> bool:
        return self.cache_ram_mib != 0

    @property
    def idle_slots_cached(self) -> bool:
        """`init`: `--cache-idle-slots requires --cache-ram, disabling`."""
        return self.cache_idle_slots and self.prompt_cache_on

    def __reduce__(self) -> tuple[object, tuple[object, ...]]:
        """Pickled as its fields: compiled, a frozen dataclass cannot be rebuilt attribute by attribute."""
        return (LlamaConfig, tuple(getattr(self, name) for name in self.__dataclass_fields__))

    def with_(self, **changes: object) -> LlamaConfig:
        return replace(self, **changes)  # type: ignore[arg-type]


def llama_config(preset: str = DEFAULT_PRESET, **overrides: object) -> LlamaConfig:
    """A config with a preset's model, then `overrides` (None values are ignored)."""
    if preset not in PRESETS:
        raise KeyError(preset)
    p = PRESETS[preset]
    base = LlamaConfig(arch=p.arch, speeds=p.speeds, preset=preset, model_id=p.model_id, build=p.build)
    return replace(base, **{k: v for k, v in overrides.items() if v is not None})  # type: ignore[arg-type]


def from_settings(base: LlamaConfig, settings: dict[str, object]) -> LlamaConfig:
    """`base` as a real server's startup log shows it running (the names of
    `drivers.logs.effective.llamacpp_settings`: `n_parallel`, `kv_unified`, `n_ctx_slot`,
    `cache_ram_mib`, `ctx_checkpoints`, `checkpoint_min_step`, `cache_idle_slots`, `swa_full`,
    `cache_reuse`, `build`), so the model runs with the settings in force, not the ones asked for.
    A setting the log does not show keeps `base`'s value; build 0 (a build that does not know its
    number, as xllamacpp's) keeps `base`'s."""

    def num(key: str) -> int | None:
        v = settings.get(key)
        return v if isinstance(v, int) and not isinstance(v, bool) else None

    def flag(key: str) -> bool | None:
        v = settings.get(key)
        return v if isinstance(v, bool) else None

    cfg = base
    n_parallel = num("n_parallel")
    unified = flag("kv_unified")
    if n_parallel is not None:
        cfg = cfg.with_(n_parallel=n_parallel)
    if unified is not None:
        cfg = cfg.with_(kv_unified=unified)
    n_ctx_slot = num("n_ctx_slot")
    if n_ctx_slot is not None:
        cfg = cfg.with_(n_ctx=n_ctx_slot if cfg.unified else n_ctx_slot * cfg.n_slots)
    for key, name in (
        ("cache_ram_mib", "cache_ram_mib"),
        ("ctx_checkpoints", "ctx_checkpoints"),
        ("checkpoint_min_step", "checkpoint_min_step"),
        ("cache_reuse", "cache_reuse"),
    ):
        value = num(key)
        if value is not None:
            cfg = cfg.with_(**{name: value})
    for key in ("cache_idle_slots", "swa_full"):
        on = flag(key)
        if on is not None:
            cfg = cfg.with_(**{key: on})
    build = num("build")
    if build:
        cfg = cfg.with_(build=build)
    return cfg
