"""Each room of the package keeps the import rule its ``__init__.py`` states.

Every ``import`` in every module (function-level ones included) is read from the source and
mapped to the room it names; a room may import itself and the rooms listed here.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import pytest_distperf

PACKAGE = Path(pytest_distperf.__file__).parent
FACE = "face"  # plugin, session and the package's __init__: they wire the rooms together

#: The rooms each room may import (besides itself).  ``records`` and ``config`` are the two
#: top-level modules of the core; the face may import anything.
ALLOWED: dict[str, set[str]] = {
    "common": set(),
    "config": set(),
    "records": {"common"},
    "rank": {"records", "common"},
    "pool": {"rank", "records", "common"},
    "results": {"records", "common"},
    "analysis": {"results", "records", "config", "common"},
    "verdict": {"results", "records", "config", "common"},
    "report": {"analysis", "results", "records", "config", "common"},
    "fixtures": {"pool", "rank", "analysis", "results", "records", "config", "common"},
    "suite": {"fixtures", "analysis", "config"},
    "doctor": {"fixtures", "results", "analysis", "verdict", "records", "config", "common"},
}
#: Rooms that import neither torch nor pytest, anywhere: they test fast and run anywhere.
PURE = {"common", "config", "records", "results", "analysis", "verdict", "report"}


def room_of(module: str) -> str:
    """The room of a dotted module name inside the package (``fixtures.results`` is a room of
    its own: the result types, pure data that the pure rooms read)."""
    parts = module.split(".")[1:]
    if not parts or parts[0] in ("plugin", "session", "__init__"):
        return FACE
    if parts[:2] == ["fixtures", "results"]:
        return "results"
    return parts[0]


def module_name(path: Path) -> str:
    rel = path.relative_to(PACKAGE.parent).with_suffix("")
    return ".".join(rel.parts)


def imports(path: Path) -> list[tuple[int, str]]:
    """(line, absolute module) of every import in ``path``; ``from pkg import mod`` counts as
    ``pkg.mod``, so that importing a room's module by name is seen."""
    tree = ast.parse(path.read_text(), str(path))
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            assert node.level == 0, f"{path}:{node.lineno}: relative import"
            base = node.module or ""
            out += [(node.lineno, f"{base}.{alias.name}") for alias in node.names]
    return out


MODULES = sorted(PACKAGE.rglob("*.py"))


def test_every_module_belongs_to_a_known_room() -> None:
    unknown = {room_of(module_name(p)) for p in MODULES} - set(ALLOWED) - {FACE}
    assert not unknown, f"modules outside the known rooms: {sorted(unknown)}"
    top = sorted(p.name for p in PACKAGE.glob("*.py"))
    assert top == ["__init__.py", "config.py", "plugin.py", "records.py", "session.py"]


@pytest.mark.parametrize("path", MODULES, ids=lambda p: str(p.relative_to(PACKAGE)))
def test_imports_keep_the_room_rule(path: Path) -> None:
    room = room_of(module_name(path))
    if room == FACE:
        return
    allowed = ALLOWED[room] | {room}
    broken = []
    for line, name in imports(path):
        top = name.split(".")[0]
        if top == "pytest_distperf":
            target = room_of(name)
            if target not in allowed:
                broken.append(f"line {line}: {name} (room {target})")
        elif room in PURE and top in ("torch", "pytest", "_pytest"):
            broken.append(f"line {line}: {name} (the room is pure)")
    assert not broken, f"{path.relative_to(PACKAGE)} ({room}) breaks its room's rule: {broken}"


@pytest.mark.parametrize("room", sorted(set(ALLOWED) - {"config", "records"}))
def test_each_room_states_its_rule(room: str) -> None:
    folder = PACKAGE / ("fixtures/results" if room == "results" else room)
    doc = ast.get_docstring(ast.parse((folder / "__init__.py").read_text())) or ""
    assert "The rule:" in doc, f"{room}/__init__.py states no rule"


def test_the_graph_check_catches_a_broken_rule(tmp_path: Path) -> None:
    """The check itself can fail: a rank module that imports the verdict room is caught."""
    bad = tmp_path / "bad.py"
    bad.write_text("def f():\n    from pytest_distperf.verdict import rule\n")
    names = [name for _, name in imports(bad)]
    assert names == ["pytest_distperf.verdict.rule"]
    assert room_of(names[0]) not in ALLOWED["rank"] | {"rank"}
