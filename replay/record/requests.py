"""A recorded request body as neutral messages, whichever API sent it: one parser per API.

Chat completions and Anthropic messages share their conversions (`record.wire`); the Responses
API builds on them (`record.responses`). This dispatch sits above both, so neither imports the
other's caller.
"""

from __future__ import annotations

from replay.record.responses import parse_responses
from replay.record.wire import Parsed, WireError, _checked, parse_chat_request
from replay.serving.fields import NotJson, load_body


@_checked
def parse_request(api: str, body: bytes) -> Parsed:
    """The request as the trace keeps it; raises WireError naming the field at fault."""
    if api != "openai-responses":
        return parse_chat_request(api, body)
    try:
        f = load_body(body)
    except NotJson as exc:
        raise WireError(str(exc)) from None
    parsed, previous = parse_responses(f.raw)
    parsed.previous_response_id = previous
    return parsed
