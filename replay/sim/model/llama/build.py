"""Which of llama-server's cache rules a build has: the model takes the build number the server
printed at startup (`build: N (commit)`, `/props` `build_info`) and picks its rules here.

Each gate is the first build whose source was read with the rule in it; the build before the gap is
the last one read without it (tools/server/server-context.cpp of the llama.cpp tree in the
`xllamacpp` sdists 2026.4.8929, 2026.5.9294, 2026.7.10068, 2026.9.11063 and 2026.10.11549, whose
version names the llama.cpp build). A build inside a gap is modelled as the later rule set: the
merge could be anywhere in it.
"""

from __future__ import annotations

from dataclasses import dataclass

# The build `xllamacpp` 2026.10.11549 compiles (its version names llama.cpp's build; the server
# itself reports `b0-unknown`): the rules this package was written from.
XLLAMACPP_BUILD = 11549

# Checkpoints at the start of user messages (`common_chat_msg_spans`), spaced by
# `--checkpoint-min-step`, and the "too close" eviction in `create_checkpoint`: read in b10068,
# b11063, b11549; absent in b8929 and b9294, which instead checkpoint every
# `checkpoint_every_nt` (8192) prompt tokens and keep checkpoints >= 64 tokens apart.
USER_MESSAGE_CHECKPOINTS = 10068

# The resume threshold gives back one position only when the prompt brings no new token (PR 24110),
# and a checkpoint ending past the resume point is skipped: read in b10068 and later; b9294 always
# gives one back and checks no checkpoint's end. Idle slots are saved to the host cache without a
# unified KV cache too (b9294: "--cache-idle-slots requires --kv-unified").
RESUME_V2 = 10068

# `create_checkpoint` replaces a checkpoint at the same n_tokens instead of adding a second one:
# read in b11063 and b11549, absent in b10068.
SUPERSEDE_CHECKPOINTS = 11063

# Context checkpoints appended to the slot save file (`save_slot_checkpoints`, the "SCKP"
# appendix) and read back on restore (`load_slot_checkpoints`): read in b11549, absent in b11063
# (there a restored hybrid or SWA slot has no checkpoint and re-processes its whole prompt).
SLOT_FILE_CHECKPOINTS = 11549

# Checkpoint and prompt-cache lines moved from info/warning to trace level (`SLT_TRC`, shown at
# `-lv 4` and above): trace level in b10068 and later, info/warning in b9294.
TRACE_LEVEL_LOG = 10068


@dataclass(frozen=True, slots=True)
class Rules:
    """The rule set of one build (`None`: the build the wheel pins)."""

    build: int
    user_message_checkpoints: bool
    resume_v2: bool
    supersede_checkpoints: bool
    slot_file_checkpoints: bool
    trace_level_log: bool


def rules_for(build: int | None) -> Rules:
    b = XLLAMACPP_BUILD if build is None or build <= 0 else build
    return Rules(
        build=b,
        user_message_checkpoints=b >= USER_MESSAGE_CHECKPOINTS,
        resume_v2=b >= RESUME_V2,
        supersede_checkpoints=b >= SUPERSEDE_CHECKPOINTS,
        slot_file_checkpoints=b >= SLOT_FILE_CHECKPOINTS,
        trace_level_log=b >= TRACE_LEVEL_LOG,
    )
