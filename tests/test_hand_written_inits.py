"""The dataclasses compiled with mypyc write `__init__` by hand (`init=False`, so a default is
not a class attribute the compiled class refuses). A field added to the class and not to its
`__init__`, or a default that differs, would go unnoticed until a caller relied on it: each
hand-written `__init__` takes exactly its fields, in order, and any default a field declares."""

from __future__ import annotations

import dataclasses
import importlib
import inspect
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
_DECL = re.compile(r"^@dataclass\(init=False[^)]*\)\s*\nclass (\w+)", re.M)


def _hand_written() -> list[tuple[str, str]]:
    found = []
    for path in sorted([*ROOT.joinpath("replay").rglob("*.py"), *ROOT.joinpath("drivers").rglob("*.py")]):
        module = ".".join(path.relative_to(ROOT).with_suffix("").parts)
        found += [(module, name) for name in _DECL.findall(path.read_text())]
    return found


CLASSES = _hand_written()


def test_the_compiled_modules_have_hand_written_inits() -> None:
    assert len(CLASSES) >= 20  # the scan finds them (a decorator written otherwise would hide one)


@pytest.mark.parametrize(("module", "name"), CLASSES, ids=[f"{m}.{n}" for m, n in CLASSES])
def test_init_takes_the_fields_in_order_with_their_defaults(module: str, name: str) -> None:
    cls = getattr(importlib.import_module(module), name)
    fields = [f for f in dataclasses.fields(cls) if f.init]  # init=False: derived in __init__
    params = list(inspect.signature(cls.__init__).parameters.values())[1:]
    assert [p.name for p in params] == [f.name for f in fields]  # what dataclasses.replace passes
    for p, f in zip(params, fields, strict=True):
        if f.default is not dataclasses.MISSING:
            assert p.default == f.default, f"{name}.{f.name}"
