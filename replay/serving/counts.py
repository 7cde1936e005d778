"""The one rule for a count in JSON (tokens, a request's `max_tokens`, an id), on every side: the
engine reading a server's reply (`engine.decode.ReplyFields`, `check_counts`), our servers reading
a client's request (`serving.fields.RequestFields`) and the trace reader.

A count is a non-negative integer no larger than 2^53 - 1: from 2^53 on, a JSON number is no
longer exact in every reader (JavaScript, orjson's doubles), so 2^53 + 1 would silently read as
2^53. An integral float (`3.0`) is the same number and is taken as the integer: JSON does not tell
them apart, many writers print counts that way, and servers read them as integers (vLLM's
pydantic models in lax mode, llama.cpp's nlohmann `get<int>`). A bool is not a count.

Compiled with mypyc (`replay/_compiled.py`): the engine calls it on every usage object a reply
carries, which some servers send with every chunk.
"""

from __future__ import annotations

from typing import Any

COUNT_MAX = (1 << 53) - 1  # the largest count read exactly by every JSON reader
COUNT_RULE = "an integer from 0 to 2^53 - 1"  # how error messages state the rule


def as_count(value: Any, most: int = COUNT_MAX) -> int | None:
    """`value` as a count of at most `most` (<= COUNT_MAX), or None when it is not one."""
    if type(value) is int:
        return value if 0 <= value <= most else None
    if type(value) is float and value.is_integer() and 0 <= value <= most:
        return int(value)
    return None
