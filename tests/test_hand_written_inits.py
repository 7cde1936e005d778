"""The dataclasses compiled with mypyc write `__init__` by hand (`init=False`, so a default is
not a class attribute the compiled class refuses). A field added to the class and not to its
`__init__`, or a default that differs, would go unnoticed until a caller relied on it: each
hand-written `__init__` takes exactly its fields, in order, and any default a field declares.
Read from the source, which is what runs uncompiled and what mypyc compiles (a compiled
`__init__` shows only `*args, **kwargs`)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _is_dataclass_without_init(node: ast.ClassDef) -> bool:
    for deco in node.decorator_list:
        if isinstance(deco, ast.Call) and getattr(deco.func, "id", None) == "dataclass":
            return any(k.arg == "init" and getattr(k.value, "value", True) is False for k in deco.keywords)
    return False


def _hand_written() -> list[tuple[str, ast.ClassDef]]:
    found = []
    for path in sorted([*ROOT.joinpath("replay").rglob("*.py"), *ROOT.joinpath("drivers").rglob("*.py")]):
        tree = ast.parse(path.read_text(), filename=str(path))
        rel = path.relative_to(ROOT).as_posix()
        found += [
            (f"{rel}:{node.name}", node)
            for node in ast.walk(tree)
            if isinstance(node, ast.ClassDef) and _is_dataclass_without_init(node)
        ]
    return found


CLASSES = _hand_written()


def _fields(cls: ast.ClassDef) -> list[tuple[str, ast.expr | None]]:
    """(name, default) of each field `__init__` takes: `field(init=False)` ones are derived there."""
    out = []
    for stmt in cls.body:
        if not (isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name)):
            continue
        value = stmt.value
        if isinstance(value, ast.Call) and getattr(value.func, "id", None) == "field":
            if any(k.arg == "init" and getattr(k.value, "value", True) is False for k in value.keywords):
                continue
            value = next((k.value for k in value.keywords if k.arg == "default"), None)
        out.append((stmt.target.id, value))
    return out


def _params(cls: ast.ClassDef) -> list[tuple[str, ast.expr | None]]:
    init = next(s for s in cls.body if isinstance(s, ast.FunctionDef) and s.name == "__init__")
    args = [*init.args.posonlyargs, *init.args.args][1:]
    defaults: list[ast.expr | None] = [None] * (len(args) - len(init.args.defaults)) + list(
        init.args.defaults
    )
    kw = list(zip(init.args.kwonlyargs, init.args.kw_defaults, strict=True))
    return [(a.arg, d) for a, d in [*zip(args, defaults, strict=True), *kw]]


def test_the_compiled_modules_have_hand_written_inits() -> None:
    assert len(CLASSES) >= 20  # the scan finds them (a decorator written otherwise would hide one)


@pytest.mark.parametrize("cls", [c for _, c in CLASSES], ids=[name for name, _ in CLASSES])
def test_init_takes_the_fields_in_order_with_their_defaults(cls: ast.ClassDef) -> None:
    fields, params = _fields(cls), _params(cls)
    assert [n for n, _ in params] == [n for n, _ in fields]  # what dataclasses.replace passes
    for (name, want), (_, got) in zip(fields, params, strict=True):
        if want is not None:
            assert got is not None and ast.dump(got) == ast.dump(want), f"{cls.name}.{name}"
