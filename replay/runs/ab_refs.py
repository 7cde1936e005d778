"""`--a-ref/--b-ref`: arms that are git refs of one checkout, each built in its own worktree."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from drivers.refs import prepare_ref
from drivers.target import Target
from replay.errors import UsageError


def resolve_refs(
    targets: dict[str, Target], refs: dict[str, str], say: Callable[[str], None] = print
) -> dict[str, Target]:
    """Each arm with a ref (from the command line, else its TOML) built and moved to its worktree."""
    out = {}
    for arm, target in targets.items():
        ref = refs.get(arm) or target.ref
        if ref is None:
            out[arm] = target
            continue
        if target.checkout is None:
            raise UsageError(f"{target.where}: --{arm.lower()}-ref needs checkout = '...' in the target file")
        say(f"arm {arm}: building ref {ref} of {target.checkout} in its own worktree (cached by commit)")
        out[arm] = prepare_ref(replace(target, ref=ref))
    return out
