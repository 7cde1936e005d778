"""Capture real llama-server logs (xllamacpp via our launcher) for the log parser's tests.

    python -m tests.llama.capture_logs [--out tests/data/llama]

Each scenario starts the launcher on a freshly generated model in a temporary directory, with the
model and slot directory given as *relative* paths (cwd = that directory), so no temporary path
ever reaches the log. It writes `<name>.log` (the server's stderr, verbatim) and `<name>.steps.json`
(what was sent at each step and the server's usage/timings or slot-action answer), so a parser's
numbers can be checked against the server's own. Ports, pointers and timings differ per capture.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import threading
from collections.abc import Callable
from importlib import metadata
from pathlib import Path
from typing import Any

import httpx
import orjson

from drivers.build import version_line
from replay.testing.gguf_model import make_model
from replay.trace.synth import synth_text
from tests.support.llamakit import Server, launched, second_build

Step = Callable[[Server], dict[str, Any]]


def chat(
    name: str, words: int, seed: int, max_tokens: int = 8, prefix: tuple[int, int] | None = None, **extra: Any
) -> Step:
    """A chat step; `prefix=(n, seed)` puts n words of another text first (a branch point)."""

    def run(s: Server) -> dict[str, Any]:
        text = synth_text(words, seed)
        if prefix:
            text = synth_text(*prefix) + " " + text
        req = {"words": words, "seed": seed, "prefix": prefix, "max_tokens": max_tokens, **extra}
        body = {"messages": [{"role": "user", "content": text}], "max_tokens": max_tokens, **extra}
        r = httpx.post(f"{s.url}/v1/chat/completions", json=body, timeout=300.0)
        out: dict[str, Any] = {"step": name, "request": req, "status": r.status_code}
        j = r.json()
        if r.status_code == 200:
            out |= {
                "usage": j["usage"],
                "timings": j["timings"],
                "finish_reason": j["choices"][0]["finish_reason"],
            }
        else:
            out["error"] = j.get("error")
        return out

    return run


def stream(name: str, words: int, seed: int, max_tokens: int = 8) -> Step:
    def run(s: Server) -> dict[str, Any]:
        events = s.chat_stream(synth_text(words, seed), max_tokens=max_tokens)
        final = events[-2]
        req = {"words": words, "seed": seed, "max_tokens": max_tokens, "stream": True}
        return {
            "step": name,
            "request": req,
            "status": 200,
            "usage": final["usage"],
            "timings": final["timings"],
        }

    return run


def slot(name: str, action: str, filename: str, slot_id: int = 0) -> Step:
    def run(s: Server) -> dict[str, Any]:
        r = s.slot_action(action, filename, slot_id)
        req = {"action": action, "filename": filename, "slot": slot_id}
        return {"step": name, "request": req, "status": r.status_code, "response": r.json()}

    return run


def together(name: str, *steps: Step) -> Step:
    """Steps sent at the same time (for slot selection with several slots)."""

    def run(s: Server) -> dict[str, Any]:
        results: list[dict[str, Any]] = [{} for _ in steps]

        def one(i: int, step: Step) -> None:
            results[i] = step(s)

        threads = [threading.Thread(target=one, args=(i, st)) for i, st in enumerate(steps)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        return {"step": name, "concurrent": results}

    return run


SCENARIOS: dict[str, tuple[str, list[str], list[Step]]] = {
    "llama_server_basic": (
        "llama",
        ["-c", "16384", "-np", "1", "-t", "2", "--metrics", "--slot-save-path", "slots", "-lv", "4"],
        [
            chat("A cold", 1500, 1),
            chat("A again (cache hit)", 1500, 1),
            chat("A + 60 words", 1560, 1),
            chat("B (cache miss, A saved to host cache)", 1500, 2),
            chat("A back (host cache load)", 1560, 1),
            slot("save slot 0", "save", "a.bin"),
            chat("C", 1000, 3),
            slot("restore slot 0", "restore", "a.bin"),
            chat("A after restore", 1560, 1),
            slot("erase slot 0", "erase", "a.bin"),
            slot("save with bad name", "save", "../a.bin"),
            chat("D with cache_prompt false", 500, 4, cache_prompt=False),
            chat("D with cache_prompt false again", 500, 4, cache_prompt=False),
            stream("E streamed", 300, 5),
            chat("over the context", 17000, 6),
        ],
    ),
    "llama_server_default_verbosity": (
        "llama",
        ["-c", "16384", "-t", "2"],
        [chat("A cold", 1000, 1), chat("A again", 1000, 1), chat("B", 1000, 2), chat("A back", 1000, 1)],
    ),
    "llama_server_np2": (
        "llama",
        ["-c", "16384", "-np", "2", "-t", "2", "--cache-ram", "0", "-lv", "4"],
        [
            together("A and B at once", chat("A", 1500, 1), chat("B", 1500, 2)),
            chat("A again (back to its slot)", 1500, 1),
            chat("B again (back to its slot)", 1500, 2),
            chat("C (new: LRU slot)", 1500, 3),
            chat("A again after C", 1500, 1),
            chat("B pinned with id_slot 1", 1500, 2, id_slot=1),
        ],
    ),
    "llama_server_swa": (
        "gemma2",
        ["-c", "16384", "-t", "2", "--slot-save-path", "slots", "--cache-reuse", "256", "-lv", "4"],
        [
            chat("A cold", 1500, 1),
            chat("A again", 1500, 1),
            chat("A + 60 words", 1560, 1),
            chat("branch at 500 words", 1000, 7, prefix=(500, 1)),
            chat("A back", 1560, 1),
            slot("save slot 0", "save", "a.bin"),
            chat("B", 1500, 2),
            slot("restore slot 0", "restore", "a.bin"),
            chat("A after restore", 1560, 1),
        ],
    ),
    "llama_server_swa_forcing": (
        "gemma2",
        ["-c", "16384", "-t", "2", "-ctxcp", "2", "-lv", "4"],
        [chat("A cold", 1500, 1), chat("branch at 500 words", 1000, 7, prefix=(500, 1))],
    ),
    "llama_server_swa_full": (
        "gemma2",
        ["-c", "16384", "-t", "2", "--swa-full", "-lv", "4"],
        [chat("A cold", 1500, 1), chat("branch at 500 words", 1000, 7, prefix=(500, 1))],
    ),
}

# The host cache's paths, on each build: two slots whose idle prompts are saved on every new task
# (`prompt is already in the cache`), and a 1 MiB limit on a sliding-window model that keeps at
# most 4 checkpoints (room made, a save over the limit skipped, checkpoints erased as too close to
# an earlier one).
CACHE_PATHS: dict[str, tuple[str, list[str], list[Step]]] = {
    "two_slots_cache": (
        "llama",
        ["-c", "16384", "-np", "2", "-t", "2", "-lv", "4"],
        [
            chat("A", 1000, 1),
            chat("B (A idle: saved)", 1000, 2),
            chat("A + 100 words (B idle: saved)", 100, 11, prefix=(1000, 1)),
            chat("B again (A + 100 idle: saved)", 1000, 2),
            chat("C (A + 100 idle: already cached; B idle: saved)", 1000, 3),
        ],
    ),
    "cache_limits": (
        "gemma2",
        ["-c", "16384", "-np", "1", "-t", "2", "--cache-ram", "1", "-ctxcp", "4", "-lv", "4"],
        [
            chat("A", 1500, 1),
            chat("A + 100 words", 100, 11, prefix=(1500, 1)),
            chat("A + 200 words", 200, 11, prefix=(1500, 1)),
            chat("B (A saved)", 1500, 2),
            chat("C (B saved, room made)", 1500, 3),
            chat("D, long (C saved, room made)", 3500, 4),
            chat("E (D over the limit: skipped)", 500, 5),
        ],
    ),
}
# The builds: xllamacpp's (the [llama] extra) and the second llama-server ([llama-ab], `_b_`).
for _name, _scenario in CACHE_PATHS.items():
    SCENARIOS[f"llama_server_{_name}"] = _scenario
    SCENARIOS[f"llama_server_b_{_name}"] = _scenario
SECOND_BUILD_SCENARIOS = frozenset(f"llama_server_b_{n}" for n in CACHE_PATHS)


def capture(name: str, out_dir: Path) -> None:
    arch, flags, steps = SCENARIOS[name]
    binary = second_build() if name in SECOND_BUILD_SCENARIOS else None
    work = Path(tempfile.mkdtemp(prefix="llama-capture-"))
    try:
        model = f"tiny-{arch}.gguf"
        make_model(work / model, arch=arch)  # type: ignore[arg-type]
        (work / "slots").mkdir()
        log_path = work / "server.log"
        results = []
        with launched(model, *flags, log_path=log_path, cwd=work, binary=binary) as s:
            for step in steps:
                results.append(step(s))
        text = log_path.read_text()
        if str(work) in text or "/tmp/" in text:
            raise SystemExit(f"{name}: a temporary path reached the log; refusing to write it")
        (out_dir / f"{name}.log").write_text(text)
        build = (
            {"llama-server": version_line([str(binary), "--version"])}
            if binary is not None
            else {"xllamacpp": metadata.version("xllamacpp")}
        )
        header = {"scenario": name, "arch": arch, "flags": flags, **build}
        steps_json = orjson.dumps({**header, "steps": results}, option=orjson.OPT_INDENT_2)
        (out_dir / f"{name}.steps.json").write_bytes(steps_json + b"\n")
        print(f"{name}: {len(text.splitlines())} lines, {len(results)} steps", file=sys.stderr)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path(__file__).resolve().parents[1] / "data" / "llama")
    parser.add_argument("names", nargs="*", choices=[*SCENARIOS, []], help="scenarios (default: all)")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    for name in args.names or SCENARIOS:
        capture(name, args.out)


if __name__ == "__main__":
    main()
