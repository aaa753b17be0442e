"""The shape of ``src/``: small modules with one concern each, and no reaching
into another package's private names."""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parent.parent / "src"
MODULE_MOST = 400
CLASS_MOST = 300


def _modules() -> list[tuple[str, Path, ast.Module]]:
    found = []
    for path in sorted(SRC.rglob("*.py")):
        parts = path.relative_to(SRC).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        found.append((name, path, ast.parse(path.read_text(), str(path))))
    assert len(found) > 30, "the walk found tenure's modules"
    return found


def _package(module: str, path: Path) -> str:
    return module if path.name == "__init__.py" else module.rpartition(".")[0]


def _target(module: str, path: Path, node: ast.ImportFrom) -> str:
    if not node.level:
        return node.module or ""
    base = _package(module, path).split(".")
    if node.level > 1:
        base = base[: -(node.level - 1)]
    return ".".join([*base, *([node.module] if node.module else [])])


def _private_owner(target: str, name: str) -> str | None:
    """The package whose private name an import of ``name`` from ``target``
    uses: the package holding the first private component; None when public."""
    parts = [*target.split("."), name]
    for i, part in enumerate(parts):
        if part.startswith("_") and not part.startswith("__"):
            if i < len(parts) - 1:  # a private module: its package's own
                return ".".join(parts[:i])
            # A private name: of the package it is imported from, or of the
            # package of the module it is imported from.
            is_package = (SRC / target.replace(".", "/")).is_dir()
            return target if is_package else target.rpartition(".")[0]
    return None


def test_no_module_imports_a_private_name_of_another_package() -> None:
    reached = []
    for module, path, tree in _modules():
        mine = _package(module, path)
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom):
                target = _target(module, path, node)
                imported = [(target, alias.name) for alias in node.names]
            elif isinstance(node, ast.Import):
                imported = [
                    (alias.name.rpartition(".")[0], alias.name.rpartition(".")[2])
                    for alias in node.names
                ]
            else:
                continue
            for target, name in imported:
                if not target.startswith("tenure"):
                    continue
                owner = _private_owner(target, name)
                if owner is not None and not (mine == owner or mine.startswith(owner + ".")):
                    reached.append(f"{module} imports {target}.{name} (private to {owner})")
    assert reached == []


def test_the_check_finds_a_reach_into_another_package() -> None:
    """The rule itself: a private module of ``tenure.stores`` is the stores'
    own; a private name of the module ``tenure.lease`` is the ``tenure``
    package's; one of the package ``tenure.locks`` is that package's."""
    assert _private_owner("tenure.stores._waiters", "Wakeups") == "tenure.stores"
    assert _private_owner("tenure.lease", "_Waiter") == "tenure"
    assert _private_owner("tenure.locks", "_current") == "tenure.locks"
    assert _private_owner("tenure.locks.lock", "_current") == "tenure.locks"
    assert _private_owner("tenure", "_validate") == "tenure"
    assert _private_owner("tenure.stores.base", "Store") is None


def test_modules_and_classes_are_small_and_say_what_they_are_for() -> None:
    too_big = []
    for module, path, tree in _modules():
        lines = len(path.read_text().splitlines())
        if lines > MODULE_MOST:
            too_big.append(f"{module}: {lines} lines")
        if not ast.get_docstring(tree):
            too_big.append(f"{module}: no docstring naming its concern")
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef):
                size = (node.end_lineno or node.lineno) - node.lineno + 1
                if size > CLASS_MOST:
                    too_big.append(f"{module}.{node.name}: {size} lines")
    assert too_big == []
