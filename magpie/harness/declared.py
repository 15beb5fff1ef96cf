"""Hermetic inputs: a worker reads, of the project, only the files its implementation declares
(`source`, `source_files`), the files its task's key is computed from. A helper module imported
from beside the source but not declared was read and judged, and after it changed the build
said "up to date" and kept the old verdict; a candidate could read its competitors' sources.
Now the sandbox's Landlock rules name each declared file; the folders they lie in may be
listed (the import system lists a folder to find a module in it), not read, so importing an
undeclared module fails on the file it would have read, which `undeclared_read` names in one
line with the field to add it to.

The spec runs in the evaluator, which is trusted and not sandboxed: while it is loaded, a
module it imports from the project that it does not declare (`spec_files`) is refused, in one
line (`SpecImports`)."""

from __future__ import annotations

import contextlib
import importlib.machinery
import os
import re
import sys
from pathlib import Path


def declared_files(root: Path, impl: dict) -> list[Path]:
    """The files an implementation declares, where they are now."""
    return [root / impl["source"], *(root / name for name in impl.get("source_files") or [])]


def code_inputs(root: Path, impl: dict, cwd: Path) -> tuple[list[str], list[str]]:
    """What a worker of impl may read of the project (its declared files, and its compiled
    library's folder, in the otherwise hidden store) and what it may only list: its working
    folder and the folders of its declared files (a module's folder goes on the module path)."""
    files = declared_files(root, impl)
    read = [str(f) for f in files]
    if impl.get("library"):
        read.append(str(Path(impl["library"]).parent))
    listed = [str(cwd), *sorted({str(f.parent) for f in files})]
    return read, listed


# How Python names a file it could not open: `[Errno 13] Permission denied: '/path'`.
DENIED = re.compile(r"Permission denied: '([^']+)'")


def undeclared_read(error: str, root: Path, impl: dict) -> str | None:
    """The one line that says which undeclared file of the project a worker's failure came from
    reading, and where to declare it; None where the failure is another."""
    found = DENIED.search(error)
    if found is None:
        return None
    path = Path(os.path.realpath(found.group(1)))
    project = Path(os.path.realpath(root))
    if not path.is_relative_to(project) or not path.is_file():
        return None
    if path in {Path(os.path.realpath(f)) for f in declared_files(root, impl)}:
        return None
    role = "baseline" if impl.get("is_baseline") else "candidate"
    name = path.relative_to(project).as_posix()
    return (f"{role} {impl['id']} read {name}, which is not declared: add it to source_files of implementation "
            f"{impl['id']} in magpie.toml")


class SpecImports:
    """A finder put first on the module path while a spec loads: a module found in the project,
    outside the installed libraries (`libraries`: where magpie itself lies too, a checkout the
    example project shares), that the testcase does not declare is an ImportError naming it and
    the field to add it to."""

    def __init__(self, root: Path, testcase: dict, where: str, libraries: tuple[str, ...]):
        self.project = os.path.realpath(root) + os.sep
        self.declared = {os.path.realpath(root / name) for name in (testcase["spec"], *(testcase.get("spec_files")
                                                                                         or []))}
        self.spec, self.where, self.libraries = testcase["spec"], where, libraries

    def find_spec(self, fullname, path=None, target=None):
        found = importlib.machinery.PathFinder.find_spec(fullname, path)
        origin = found.origin if found is not None else None
        if not origin or not os.path.isfile(origin):
            return None
        origin = os.path.realpath(origin)
        if not origin.startswith(self.project) or origin.startswith(self.libraries) or origin in self.declared:
            return None
        name = origin.removeprefix(self.project)
        raise ImportError(f"spec {self.spec} imported {name}, which is not declared: add it to spec_files of "
                          f"{self.where} in magpie.toml")

    @contextlib.contextmanager
    def guarding(self):
        sys.meta_path.insert(0, self)
        try:
            yield
        finally:
            sys.meta_path.remove(self)
