"""The package's floors hold: every import inside python/colibri goes to a lower floor, and
no file outgrows the size caps (docs/architecture.md, "Floors").

A unit is a top-level module or folder of the package. FLOORS lists them top to bottom;
a unit may import only units on floors below its own (never a sibling on its floor, never
upward), so the graph of units has no cycle by construction. Every import counts: at
module level, inside functions, and under ``TYPE_CHECKING``.
"""

from __future__ import annotations

import ast
import shutil
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "python" / "colibri"
CSRC = PACKAGE.parents[1] / "csrc"

FLOORS: list[set[str]] = [
    {"__init__", "__main__"},  # what users import: the public names
    {"cli"},  # the colibri command
    {"server"},  # OpenAI/Anthropic HTTP serving, Ray Serve
    {"model"},  # Model: the facade over the floors below
    {"chat", "generate"},  # chat templates; sessions and the generation loop
    {"engine", "speculative", "sampling", "tokenizers"},
    {"convert", "models", "gpu"},  # container writer; named models, hub, demos; GPU runtime
    {"sources", "settings"},  # model files -> manifests; typed settings
    {"display", "progress", "hardware"},
    {"sizes"},
    {"errors", "_version"},
    {"_core"},  # the C++ extension
]
MAX_PY_LINES, MAX_CPP_LINES = 600, 800


def floor_of(unit: str) -> int:
    for i, units in enumerate(FLOORS):
        if unit in units:
            return i
    raise AssertionError(f"{unit!r} is on no floor: add it to FLOORS in {Path(__file__).name}")


def imported_units(path: Path, root: Path) -> list[tuple[int, str]]:
    """(line, unit) of every colibri unit the file imports (``from colibri import x``
    names the unit x when x is a module or folder, else the package's __init__)."""

    def named(name: str) -> str:
        exists = (root / f"{name}.py").exists() or (root / name).is_dir()
        return name if exists else "__init__"

    here = list(path.relative_to(root).parts[:-1])  # the file's package, below colibri
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = here[: len(here) - node.level + 1]
                names = [*base, *(node.module.split(".") if node.module else [])]
                if not names:  # from . import x: x is the unit
                    found += [(node.lineno, named(a.name)) for a in node.names]
                    continue
                found.append((node.lineno, names[0]))
            elif node.module and node.module.split(".")[0] == "colibri":
                mod = node.module.split(".")
                found += ([(node.lineno, mod[1])] if len(mod) > 1
                          else [(node.lineno, named(a.name)) for a in node.names])
        elif isinstance(node, ast.Import):
            found += [(node.lineno, a.name.split(".")[1]) for a in node.names
                      if a.name.startswith("colibri.")]
    return found


def violations(root: Path) -> list[str]:
    bad = []
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root)
        unit = rel.parts[0] if len(rel.parts) > 1 else rel.stem
        for line, target in imported_units(path, root):
            if target != unit and floor_of(target) <= floor_of(unit):
                bad.append(f"{rel}:{line}: {unit} (floor {floor_of(unit)}) imports {target} "
                           f"(floor {floor_of(target)})")
    return bad


def test_imports_only_go_down() -> None:
    assert violations(PACKAGE) == []


def test_the_guard_catches_an_upward_import(tmp_path: Path) -> None:
    tree = tmp_path / "colibri"
    shutil.copytree(PACKAGE, tree, ignore=shutil.ignore_patterns("*.so", "__pycache__"))
    budget = tree / "engine" / "budget.py"
    budget.write_text(budget.read_text() + "\nfrom ..model import Model  # planted\n")
    sibling = tree / "sampling" / "filters.py"
    sibling.write_text(sibling.read_text() + "\nfrom colibri.tokenizers import Tokenizer\n")
    found = sorted(set(violations(tree)) - set(violations(PACKAGE)))
    assert len(found) == 2
    assert "engine/budget.py" in found[0] and "imports model" in found[0]
    assert "sampling/filters.py" in found[1] and "imports tokenizers" in found[1]


def test_files_stay_under_the_size_caps() -> None:
    over = [f"{p.relative_to(PACKAGE.parents[1])}: {n} lines"
            for p, cap in [*((p, MAX_PY_LINES) for p in PACKAGE.rglob("*.py")),
                           *((p, MAX_CPP_LINES) for p in CSRC.rglob("*.[ch]pp"))]
            if (n := len(p.read_text().splitlines())) > cap]
    assert over == []
