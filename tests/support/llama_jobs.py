"""Helpers for the llama model's tests: the test models' own tokenizer, prompts, jobs."""

from __future__ import annotations

from functools import cache
from typing import Any

from replay.sim.model.llama.prompt import ChatTokenizer, LlamaJob, make_reply, render
from replay.sim.model.llama.spm import SpmVocab
from replay.testing.gguf_model import build_vocab
from replay.trace.synth import synth_text


@cache
def tiny_tokenizer() -> ChatTokenizer:
    """The vocabulary replay/testing/gguf_model.py writes into every test model, with its BOS."""
    vocab = build_vocab()
    return ChatTokenizer(SpmVocab(vocab.tokens, vocab.scores), vocab.tokens[vocab.bos])


def chat_job(
    job_id: int,
    messages: list[dict[str, Any]] | str,
    max_tokens: int = 8,
    tok: ChatTokenizer | None = None,
    **params: Any,
) -> LlamaJob:
    if isinstance(messages, str):
        messages = [{"role": "user", "content": messages}]
    tok = tok or tiny_tokenizer()
    prompt = render(messages, None, tok)
    return LlamaJob(job_id, prompt, make_reply(prompt, max_tokens, tok), **params)


def words(n: int, seed: int, prefix: tuple[int, int] | None = None) -> str:
    """The test logs' prompts (tests/llama/capture_logs.py): synthetic words, maybe after a prefix."""
    text = synth_text(n, seed)
    return synth_text(*prefix) + " " + text if prefix else text
