"""vLLM's OpenAI server (``vllm serve MODEL``).

vLLM leaves ``usage.prompt_tokens_details.cached_tokens`` out unless started with
``--enable-prompt-tokens-details``, so it is added: without it every request would look uncached.
``/health`` answers 200 once the engine is up (connections are refused while it loads).
"""

from __future__ import annotations

from pathlib import Path

from drivers.build import resolve_binary
from drivers.servers.base import Launch, base_url, has_flag, refuse_flags
from drivers.target import Target
from replay.errors import UsageError

CACHE_FLAG = "--enable-prompt-tokens-details"


def executable(target: Target) -> str:
    return resolve_binary(target, "vllm")


def plan(target: Target, *, port: int, workdir: Path, build_key: str) -> Launch:
    refuse_flags(target, "--host", use="host =")
    refuse_flags(target, "--port", use="port =")
    if not target.model:
        raise UsageError(f"{target.where}: kind 'vllm' needs model = 'path or hub id'")
    binary = executable(target)
    argv = [binary, "serve", target.model, "--host", target.host, "--port", str(port)]
    notes = {}
    if not has_flag(target.flags, CACHE_FLAG):
        argv.append(CACHE_FLAG)
        notes["cached_tokens"] = f"{CACHE_FLAG} added"
    argv += target.flags
    url = base_url(target.host, port)
    return Launch(
        argv=argv,
        url=url,
        env=dict(target.env),
        cwd=target.checkout,
        ready_http=url + (target.health or "/health"),
        version_argv=[binary, "--version"],
        metrics_path="/metrics",
        notes=notes,
    )
