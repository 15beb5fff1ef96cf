"""Hermetic inputs: a worker reads, of the project, only the files its implementation declares
(`source`, `source_files`), the files its task's key is computed from. A helper module imported
from beside the source but not declared was read and judged, and after it changed the build
said "up to date" and kept the old verdict; a candidate could read its competitors' sources.
Now a worker, before its implementation's code loads, adds a Landlock layer that lets it read
files everywhere but in the project, and there only those (`sandbox.narrow`); folders stay
listable (the import system lists a folder to find a module in it), so importing an undeclared
module fails on the file it would have read, which `undeclared_read` names in one line with the
field to add it to. The sandbox's own policy reads the project as a whole, the same for every
implementation of a folder, so a spare started before it knows its implementation serves any.

The spec runs in the evaluator, which is trusted and not sandboxed: while it is loaded, a
module it imports from the project that it does not declare (`spec_files`) is refused, in one
line (`SpecImports`)."""

from __future__ import annotations

import contextlib
import functools
import importlib.machinery
import os
import re
import sys
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from magpie.harness.wire import Implementation, Testcase


def declared_files(root: Path, impl: Implementation) -> list[Path]:
    """The files an implementation declares, where they are now."""
    return [root / impl.source, *(root / name for name in impl.source_files)]


def readable(root: Path, impl: Implementation) -> list[str]:
    """What a worker of impl reads of the project once its load narrowed its sandbox
    (`sandbox.narrow`): its declared files, and its compiled library's folder (in the store)."""
    read = [str(f) for f in declared_files(root, impl)]
    if impl.library:
        read.append(str(Path(impl.library).parent))
    return read


# How Python names a file it could not open: `[Errno 13] Permission denied: '/path'`.
DENIED = re.compile(r"Permission denied: '([^']+)'")


def undeclared_read(error: str, root: Path, impl: Implementation) -> str | None:
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
    role = "baseline" if impl.is_baseline else "candidate"
    name = path.relative_to(project).as_posix()
    return (
        f"{role} {impl.id} read {name}, which is not declared: add it to source_files of implementation "
        f"{impl.id} in magpie.toml"
    )


def spec_inputs(root: Path, kernel) -> list[str]:
    """The specs of a kernel's testcases and the files each declares (`spec_files`): what its
    tasks are keyed by, so read into the store's snapshots; a declared file that is no file of
    the project is one line naming the field (UserError)."""
    from magpie.errors import UserError

    project = os.path.realpath(root)
    names = []
    for t, testcase in enumerate(kernel.testcases):
        if not testcase.spec:
            continue
        names.append(testcase.spec)
        for j, name in enumerate(testcase.spec_files or []):
            where = f"magpie.toml: kernel {kernel.id}: testcases[{t}].spec_files[{j}]"
            real = os.path.realpath(os.path.join(root, name))
            if not real.startswith(project + os.sep):
                raise UserError(
                    f"{where}: {name!r} resolves outside the project ({real}); keep spec files inside {project}"
                )
            if not os.path.isfile(real):
                raise UserError(f"{where}: file not found: {name}")
            names.append(name)
    return names


class SpecImports:
    """A finder put first on the module path while a spec loads: a module found in the project,
    outside the installed libraries (`libraries`: where magpie itself lies too, a checkout the
    example project shares), that the testcase does not declare is an ImportError naming it and
    the field to add it to."""

    def __init__(self, root: Path, testcase: Testcase, where: str, libraries: tuple[str, ...]):
        self.project = os.path.realpath(root) + os.sep
        self.declared = {os.path.realpath(root / name) for name in (str(testcase.spec), *(testcase.spec_files or []))}
        self.spec, self.where, self.libraries = testcase.spec, where, libraries

    def find_spec(self, fullname, path=None, target=None):
        found = importlib.machinery.PathFinder.find_spec(fullname, path)
        origin = found.origin if found is not None else None
        if not origin or not os.path.isfile(origin):
            return None
        origin = os.path.realpath(origin)
        if not origin.startswith(self.project) or origin.startswith(self.libraries) or origin in self.declared:
            return None
        name = origin.removeprefix(self.project)
        raise ImportError(
            f"spec {self.spec} imported {name}, which is not declared: add it to spec_files of "
            f"{self.where} in magpie.toml"
        )

    @contextlib.contextmanager
    def guarding(self):
        sys.meta_path.insert(0, self)
        try:
            yield
        finally:
            sys.meta_path.remove(self)


@contextlib.contextmanager
def fresh_imports():
    """Each job sees the modules its spec imports as a fresh process would: the Python
    modules a job imported from outside the installed libraries and magpie are forgotten after
    it, and sys.path is restored; two kernels' specs may each import a `common` of their own.
    Libraries and compiled extensions stay: importing them twice can break them."""
    path, before = list(sys.path), set(sys.modules)
    try:
        yield
    finally:
        sys.path[:] = path
        libraries = library_roots()
        for name in set(sys.modules) - before:
            file = getattr(sys.modules[name], "__file__", None)
            if not file or file.endswith(tuple(importlib.machinery.EXTENSION_SUFFIXES)):
                continue
            if not os.path.realpath(file).startswith(libraries):
                del sys.modules[name]


@functools.lru_cache(maxsize=1)
def library_roots() -> tuple[str, ...]:
    """Where installed code lives: the interpreter's trees, site-packages (the user's too),
    PYTHONPATH, and magpie itself."""
    import site

    magpie = Path(__file__).resolve().parent.parent
    # magpie puts its own parent on PYTHONPATH (a source checkout, where projects may live too)
    pythonpath = {p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p} - {str(magpie.parent)}
    places = {
        sys.prefix,
        sys.base_prefix,
        sys.exec_prefix,
        *site.getsitepackages(),
        site.getusersitepackages(),
        *pythonpath,
        str(magpie),
    }
    return tuple(os.path.realpath(p).rstrip(os.sep) + os.sep for p in places)
