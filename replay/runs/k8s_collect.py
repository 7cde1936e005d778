"""The collector pod of a sharded run (`replay k8s render`): it holds the results volume open for
`kubectl cp` while the shards run and for a while after they end, then exits, and its log says
what it is waiting for and why it stops.

It reads only the shared volume, never the Kubernetes API (no service account, no role to grant):
a shard has ended when one of its pods' results files ends with the run's summary line. A file
whose run was stopped by SIGTERM does not count: that is a pod lost to a drain or a preemption,
which the Job starts again. A pod killed without writing its summary (out of memory, say) is never
seen to end, so the waiting is bounded by `--wait-until`; what is on the volume is kept either way.

Run in the image as `python -m replay.runs.k8s_collect /results --shards N --wait-until TIME
--keep S`.
"""

from __future__ import annotations

import argparse
import re
import sys
import time
from collections.abc import Callable
from pathlib import Path

from replay.errors import ReplayError
from replay.metrics.results import read_summary_line
from replay.runs.barrier import parse_instant

POLL_S = 30.0
TAIL_BYTES = 4 << 20  # a finished shard's summary is within its file's last lines
INTERRUPTED = ("SIGTERM", "SIGINT")
LOST = "lost-attempts"  # beside the shards' files, out of the report's glob
_SHARD_FILE = re.compile(r"^shard-(\d+)\..+\.results\.jsonl$")  # runs.k8s.RESULTS_FILE


def ended_shards(folder: Path, shards: int) -> dict[int, str]:
    """Pod index -> how its run ended, for every shard whose results hold their summary."""
    return {index: outcome for index, (outcome, _) in _ended_files(folder, shards).items()}


def set_aside_lost_attempts(folder: Path, shards: int) -> list[Path]:
    """Move every results file of a shard that ended in another pod's file into `LOST/`.

    A pod lost to a drain is started again and replays its shard whole, so its first attempt's
    requests were sent twice: left beside the second, `replay report --merge *.results.jsonl`
    would count them twice. Moved aside (kept, never deleted) they stay out of that glob. A
    shard that never ended keeps whatever it wrote: it is all there is of it."""
    ended = _ended_files(folder, shards)
    moved: list[Path] = []
    for path, index in _shard_files(folder, shards):
        if index in ended and path != ended[index][1]:
            (folder / LOST).mkdir(exist_ok=True)
            moved.append(path.rename(folder / LOST / path.name))
    return moved


def _shard_files(folder: Path, shards: int) -> list[tuple[Path, int]]:
    """Each pod's own results file (not a worker's part, not another index) with its index."""
    found = []
    for path in sorted(folder.glob("shard-*.results.jsonl")):
        match = _SHARD_FILE.match(path.name)
        if match is not None and int(match.group(1)) < shards:
            found.append((path, int(match.group(1))))
    return found


def _ended_files(folder: Path, shards: int) -> dict[int, tuple[str, Path]]:
    """Pod index -> (outcome, the file whose summary says its run ended)."""
    ended: dict[int, tuple[str, Path]] = {}
    for path, index in _shard_files(folder, shards):
        try:
            line = read_summary_line(path, within=TAIL_BYTES)
        except ReplayError:  # gone between the listing and the read
            continue
        if line is not None and line.get("outcome") not in INTERRUPTED:
            ended[index] = (str(line.get("outcome")), path)
    return ended


def collect(
    folder: Path,
    shards: int,
    wait_until: float,
    keep_s: float,
    say: Callable[[str], None] = print,
    now: Callable[[], float] = time.time,
    sleep: Callable[[float], None] = time.sleep,
) -> None:
    """Wait for the shards (until the wall-clock instant `wait_until` at most), then keep the
    volume for `keep_s` seconds."""
    say(f"waiting for the results of {shards} shard(s) in {folder}, until {_iso(wait_until)} at most")
    seen: dict[int, str] = {}
    while True:
        ended = ended_shards(folder, shards)
        for index in sorted(ended.keys() - seen.keys()):
            say(f"shard {index + 1}/{shards} ended ({ended[index]}): {len(ended)} of {shards}")
        seen = ended
        if len(ended) == shards:
            why = f"all {shards} shard(s) ended"
            break
        if now() >= wait_until:
            missing = ", ".join(f"{i + 1}/{shards}" for i in range(shards) if i not in ended)
            why = (
                f"stopped waiting at {_iso(wait_until)}: shard(s) {missing} wrote no summary "
                "(a pod killed, or a run refused: see its log)"
            )
            break
        sleep(min(POLL_S, max(0.0, wait_until - now())))
    moved = set_aside_lost_attempts(folder, shards)
    if moved:
        say(
            f"moved {len(moved)} lost attempt(s) of shards that ended in a later pod into "
            f"{folder / LOST} (their requests were sent again): {', '.join(p.name for p in moved)}"
        )
    say(
        f"{why}; {folder} stays open for kubectl cp until {_iso(now() + keep_s)}, then this pod "
        "exits (the files stay on the volume claim)"
    )
    sleep(keep_s)
    say("kept the results as long as asked: exiting")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m replay.runs.k8s_collect", description=__doc__)
    parser.add_argument("folder", type=Path, help="where the shards write their results")
    parser.add_argument("--shards", type=int, required=True, help="the Job's completions")
    parser.add_argument("--wait-until", required=True, help="ISO 8601 instant: stop waiting then")
    parser.add_argument("--keep", type=float, required=True, help="seconds to stay after waiting")
    args = parser.parse_args(argv)
    try:
        wait_until = parse_instant(args.wait_until, "--wait-until")
    except ReplayError as exc:
        parser.error(str(exc))
    collect(args.folder, args.shards, wait_until, args.keep, say=lambda line: print(line, flush=True))
    return 0


def _iso(epoch: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(epoch))


if __name__ == "__main__":
    sys.exit(main())
