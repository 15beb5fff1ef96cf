"""magpie's packages import one way: each layer only from the layers below it (or its peers in
its own layer). Read from the source with ast, nothing imported, so a lazy import inside a
function counts as much as one at the top of a module."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "magpie"

# Bottom to top. A name is a subpackage or a top-level module of magpie.
LAYERS = [
    {"errors", "environment", "linux", "paths", "private_folders"},  # the floor: knows nothing of the rest
    {"store", "compare", "roofline"},
    {"sandbox"},  # contains one process (or keeps trusted code's processes together)
    {"supervision"},  # starts and keeps processes, in a sandbox or not
    {"harness"},  # judges code under test in those processes
    {"manifest", "report"},
    {"traces"},
    {"serving"},
    {"graph", "workspace"},
    {"execution", "project"},
    {"cli", "__main__", "mcp"},  # the entry points: the command line and the MCP server
]


def _layer_of(name: str) -> int:
    for index, layer in enumerate(LAYERS):
        if name in layer:
            return index
    raise AssertionError(f"magpie.{name} is in no layer of {__file__}: place it")


def _is_part(name: str) -> bool:
    return (PACKAGE / name / "__init__.py").is_file() or (PACKAGE / f"{name}.py").is_file()


def _part_of(module: str) -> str | None:
    """The subpackage or top-level module of magpie a dotted module name lies in; None outside
    magpie, or for the package itself."""
    parts = module.split(".")
    return parts[1] if parts[0] == "magpie" and len(parts) > 1 else None


def _imported(tree: ast.AST, importer: str) -> list[tuple[str, int]]:
    """Every magpie module a module's source imports, with its line."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(alias.name, node.lineno) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative: resolved against the importer's package
                base = importer.split(".")[: -node.level]
                module = ".".join([*base, *([node.module] if node.module else [])])
            else:
                module = node.module or ""
            if module == "magpie":  # from magpie import sandbox: the names are the modules
                found += [(f"magpie.{alias.name}", node.lineno) for alias in node.names]
            else:
                found.append((module, node.lineno))
    return found


def upward_imports() -> list[str]:
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        relative = path.relative_to(PACKAGE.parent)
        importer = ".".join(relative.with_suffix("").parts)
        own = _part_of(importer if not importer.endswith(".__init__") else importer[: -len(".__init__")])
        if own is None:  # magpie/__init__.py
            continue
        for module, line in _imported(ast.parse(path.read_text(), str(path)), importer):
            target = _part_of(module)
            if target is None or target == own or not _is_part(target):  # magpie.__version__: a name
                continue
            if _layer_of(target) > _layer_of(own):
                found.append(f"{relative}:{line} imports {module} (magpie.{own} lies below magpie.{target})")
    return found


def test_no_package_imports_a_layer_above_its_own():
    upward = upward_imports()
    assert not upward, "imports that run upward:\n" + "\n".join(upward)


def test_every_part_of_magpie_has_a_layer():
    parts = {
        p.stem if p.is_file() else p.name
        for p in PACKAGE.iterdir()
        if (p.suffix == ".py" and p.stem != "__init__") or (p / "__init__.py").is_file()
    }
    for part in parts:
        _layer_of(part)


def test_an_upward_import_is_found(tmp_path, monkeypatch):
    """The check itself: a lazy import from a lower layer into a higher one, inside a function."""
    fake = tmp_path / "magpie"
    (fake / "linux").mkdir(parents=True)
    (fake / "cli").mkdir()
    for init in (fake / "__init__.py", fake / "linux" / "__init__.py", fake / "cli" / "__init__.py"):
        init.write_text("")
    (fake / "linux" / "procfs.py").write_text("def f():\n    from magpie.cli import main\n")
    monkeypatch.setattr(sys.modules[__name__], "PACKAGE", fake)
    assert upward_imports() == ["magpie/linux/procfs.py:2 imports magpie.cli (magpie.linux lies below magpie.cli)"]
