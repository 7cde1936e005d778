"""One `Usage` from whatever token counts a server returned, whatever it called them.

Servers disagree on names (and on what `input_tokens` means), so every field is
read through an ordered table of rules. A rule is a tuple of paths into the
response object; it applies when its first path holds a number, and its value is
the sum of its paths (missing later paths count 0). The first rule that applies
wins. Adding a server is adding a row.

`reprocessed_tokens` is what the run is about: the prompt tokens the server had
to prefill. Where the server states it, that figure is used and the source is
"server"; otherwise it is prompt - cached ("derived"); with neither it is None,
never a guess.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

from replay.metrics.record import NO_USAGE, Usage  # the record's token counts; made here, from the rules

Path = tuple[str, ...]
Rule = tuple[Path, ...]

# Anthropic: `input_tokens` counts only the uncached, unwritten part (ds4 always sends 0),
# so the prompt is input + cache read + cache creation. Its rules come before the bare
# `input_tokens` rule, which is the Responses API meaning (the whole prompt).
PROMPT_RULES: tuple[Rule, ...] = (
    (
        ("usage", "cache_read_input_tokens"),
        ("usage", "input_tokens"),
        ("usage", "cache_creation_input_tokens"),
    ),
    (("usage", "cache_creation_input_tokens"), ("usage", "input_tokens")),
    (("usage", "prompt_tokens"),),
    (("usage", "input_tokens"),),
    (("meta_info", "prompt_tokens"),),  # SGLang native
    (("timings", "prompt_n"), ("timings", "cache_n")),  # llama.cpp
    (("usage", "prompt_cache_hit_tokens"), ("usage", "prompt_cache_miss_tokens")),  # DeepSeek
)

CACHED_RULES: tuple[Rule, ...] = (
    (("timings", "cache_n"),),  # llama.cpp; equals prompt_tokens_details.cached_tokens there
    (("usage", "prompt_tokens_details", "cached_tokens"),),  # OpenAI, vLLM, SGLang, ds4
    (("usage", "cache_read_input_tokens"),),  # Anthropic, ds4 /v1/messages
    (("usage", "input_tokens_details", "cached_tokens"),),  # Responses API
    (("usage", "prompt_cache_hit_tokens"),),  # DeepSeek
    (("meta_info", "cached_tokens"),),  # SGLang native
)

CACHE_WRITE_RULES: tuple[Rule, ...] = (
    (("usage", "prompt_tokens_details", "cache_write_tokens"),),  # ds4
    (("usage", "input_tokens_details", "cache_write_tokens"),),  # ds4 Responses
    (("usage", "cache_creation_input_tokens"),),  # Anthropic
)

# Only fields where the server itself says how many prompt tokens it computed.
REPROCESSED_RULES: tuple[Rule, ...] = (
    (("timings", "prompt_n"),),  # llama.cpp: tokens actually evaluated
    (("usage", "prompt_tokens_details", "cache_write_tokens"),),  # ds4: P - cached, prefilled
    (("usage", "input_tokens_details", "cache_write_tokens"),),  # ds4 Responses
    # Anthropic: everything not read from cache was computed (input is 0 on ds4).
    (("usage", "cache_creation_input_tokens"), ("usage", "input_tokens")),
    (("usage", "prompt_cache_miss_tokens"),),  # DeepSeek
)

OUTPUT_RULES: tuple[Rule, ...] = (
    (("usage", "completion_tokens"),),
    (("usage", "output_tokens"),),
    (("meta_info", "completion_tokens"),),
    (("timings", "predicted_n"),),
)

# Every path a rule reads: a reply's counts are checked along these (replay.engine.decode).
COUNT_PATHS: tuple[Path, ...] = tuple(
    dict.fromkeys(
        path
        for rules in (PROMPT_RULES, CACHED_RULES, CACHE_WRITE_RULES, REPROCESSED_RULES, OUTPUT_RULES)
        for rule in rules
        for path in rule
    )
)


def _number(obj: Mapping[str, Any], path: Path) -> int | None:
    cur: Any = obj
    for key in path:
        # A dict (what orjson makes) is checked by type, and an absent object (None: most paths
        # of most rules) before the ABC isinstance, which costs ten times more.
        if type(cur) is not dict and (cur is None or not isinstance(cur, Mapping)):
            return None
        cur = cur.get(key)
    if isinstance(cur, bool):
        return None
    if isinstance(cur, int):
        return cur
    if isinstance(cur, float) and cur.is_integer():
        return int(cur)
    return None


def first_rule(obj: Mapping[str, Any], rules: tuple[Rule, ...]) -> int | None:
    """Value of the first rule whose leading path holds a number."""
    for rule in rules:
        head = _number(obj, rule[0])
        if head is None:
            continue
        return head + sum(_number(obj, p) or 0 for p in rule[1:])
    return None


def parse_usage(obj: Mapping[str, Any] | None) -> Usage:
    """Normalise a response object holding any of `usage`, `timings`, `meta_info`.

    Pass the non-stream body as is; for streams pass `{"usage": ..., "timings": ...}`
    merged from the chunks that carried them.
    """
    if not obj:
        return NO_USAGE
    prompt = first_rule(obj, PROMPT_RULES)
    cached = first_rule(obj, CACHED_RULES)
    reprocessed = first_rule(obj, REPROCESSED_RULES)
    source: Literal["server", "derived"] | None = "server" if reprocessed is not None else None
    if reprocessed is None and prompt is not None and cached is not None:
        reprocessed, source = max(prompt - cached, 0), "derived"
    return Usage(
        prompt_tokens=prompt,
        cached_tokens=cached,
        cache_write_tokens=first_rule(obj, CACHE_WRITE_RULES),
        output_tokens=first_rule(obj, OUTPUT_RULES),
        reprocessed_tokens=reprocessed,
        reprocessed_source=source,
    )
