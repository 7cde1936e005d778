"""Trace format v1: model, streaming reader/validator, delta-encoding writer, synthetic text."""

from replay.trace.materialize import materialize, recorded_reply, text_of
from replay.trace.model import FORMAT, Request, Session, Trace, TraceHeader
from replay.trace.reader import (
    iter_records,
    iter_requests,
    last_references,
    read_trace,
    validate,
)
from replay.trace.synth import synth_text
from replay.trace.writer import TraceWriter

__all__ = [
    "FORMAT",
    "Request",
    "Session",
    "Trace",
    "TraceHeader",
    "TraceWriter",
    "iter_records",
    "iter_requests",
    "last_references",
    "materialize",
    "read_trace",
    "recorded_reply",
    "synth_text",
    "text_of",
    "validate",
]
