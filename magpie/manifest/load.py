"""Read `magpie.toml` (or a Magpie YAML kernel config) into validated models.

Any problem becomes a single `UserError` line: `<file>: <field path>: <problem>`.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from pydantic import ValidationError

from magpie.errors import UserError, located
from magpie.manifest.models import Manifest

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib


def field_path(loc) -> str:
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += ("." if out else "") + str(part)
    return out


def describe_validation_error(path, err: ValidationError, document: dict | None = None) -> UserError:
    """One line for pydantic's first error; given the validated document, a problem inside
    a kernel also names the kernel's id (an index alone is hard to find in a long manifest)."""
    first = err.errors()[0]
    loc = [p for p in first["loc"] if not (isinstance(p, str) and p.startswith("function-"))]
    kind = first["type"]
    if kind == "extra_forbidden":
        problem = "unknown field (check its spelling against the manifest reference in README.md)"
    elif kind == "missing":
        problem = "required field is missing"
    else:
        problem = first["msg"].removeprefix("Value error, ")
        if "input" in first and kind not in ("value_error",) and not isinstance(first["input"], dict):
            problem += f" (got {first['input']!r})"
    kernel_id = _kernel_id_at(loc, document)
    if kernel_id is not None:
        problem = f"kernel {kernel_id!r}: {problem}"
    return located(path, field_path(loc), problem)


def _kernel_id_at(loc: list, document: dict | None):
    if document is None or len(loc) < 2 or loc[0] != "kernel" or not isinstance(loc[1], int):
        return None
    kernel = document["kernel"][loc[1]]  # pydantic found the error there, so it exists
    return kernel.get("id") if isinstance(kernel, dict) else None


def read_text(path: Path, missing_hint: str = "") -> str:
    """A user's file as text, or one line saying why it cannot be read."""
    try:
        return path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise UserError(f"{path}: file not found{missing_hint}") from None
    except IsADirectoryError:
        inside = path / "magpie.toml"
        example = f" (e.g. {inside})" if inside.is_file() else ""
        raise UserError(f"{path}: is a folder, not a file: name the file itself{example}") from None
    except UnicodeDecodeError as err:
        line = err.object[: err.start].count(b"\n") + 1
        raise UserError(
            f"{path}:{line}: byte 0x{err.object[err.start]:02x} is not UTF-8: save the file as UTF-8"
        ) from None
    except OSError as err:
        raise UserError(f"{path}: cannot be read: {err.strerror}") from None


def parse_toml(path: Path) -> dict:
    text = read_text(path, " (run magpie in a folder with a magpie.toml, or pass --manifest)")
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as err:
        raise UserError(f"{path}: invalid TOML: {err}") from None


def load_manifest(path: str | Path) -> tuple[Manifest, Path]:
    """Return the manifest and the project root (the manifest's folder)."""
    path = Path(path)
    data = parse_toml(path)
    try:
        manifest = Manifest.model_validate(data)
    except ValidationError as err:
        raise describe_validation_error(path, err, data) from None
    if not manifest.kernel and not manifest.traces and not manifest.benchmark:
        # Otherwise the build "succeeds" with an empty report, which reads as all is well.
        raise UserError(
            f"{path}: declares nothing to build: add a [[kernel]] with a baseline or candidates, "
            f"a [[traces]] folder or a [[benchmark]] (see the manifest in README.md)"
        )
    root = path.resolve().parent
    check_files(manifest, root, path)
    return manifest, root


def outside(root: Path, name: str) -> Path | None:
    """Where `name` (relative to `root`, or absolute) really is, every symlink followed, when
    that is outside `root`; None when it is inside (whether or not it exists)."""
    real_root = Path(os.path.realpath(root))
    real = Path(os.path.realpath(real_root / name))
    return None if real.is_relative_to(real_root) else real


def keep_inside(root: Path, name: str, path, where: str, field: str, kept: str, shown: str | None = None) -> None:
    """One line naming the file and field when `name` (written as `shown`) resolves outside the
    project: nothing outside it may be read into the store or copied into its snapshots, which
    a CI cache uploads."""
    real = outside(root, name)
    if real is not None:
        raise located(
            path,
            where,
            f"{field} {_quoted(shown or name)} resolves outside the project ({real}); "
            f"keep {kept} inside {os.path.realpath(root)}",
        )


def _quoted(name: str) -> str:
    return '"' + name.replace('"', '\\"') + '"'


def _keep_folder_inside(
    root: Path, name: str, path, where: str, field: str, kept: str, folder: Path | None = None
) -> None:
    """The folder (`name` as written, read from `folder` where that is not beside the manifest)
    and every file in it as a build lists them (rglob) inside the project: a link in a trace or
    model folder would otherwise bring in a file from elsewhere."""
    folder = folder or Path(os.path.realpath(root)) / name
    keep_inside(root, str(folder), path, where, field, kept, shown=name)
    if not folder.is_dir():
        return
    for found in folder.rglob("*"):
        real = outside(root, str(found))
        if real is not None:
            raise located(
                path,
                where,
                f"{field} {_quoted(name)} holds {found.relative_to(folder).as_posix()}, "
                f"which resolves outside the project ({real}); keep {kept} inside "
                f"{os.path.realpath(root)}",
            )


def check_paths_inside(manifest: Manifest, root: Path, path) -> None:
    """Every path the manifest names resolves inside the project root (docs/security.md)."""
    for kernel in manifest.kernel:
        for impl in kernel.implementations():
            where = f"kernel {kernel.id}, implementation {impl.id}"
            keep_inside(root, impl.source, path, where, "source", "sources")
            for j, name in enumerate(impl.source_files):
                keep_inside(root, name, path, where, f"source_files[{j}]", "source files")
            if impl.working_dir:
                keep_inside(root, impl.working_dir, path, where, "working_dir", "working folders")
        if kernel.kernelbench:  # before its testcase, which would be named by an index not written
            keep_inside(root, kernel.kernelbench, path, f"kernel {kernel.id}", "kernelbench", "problem files")
        for t, testcase in enumerate(kernel.testcases):
            if testcase.spec:
                keep_inside(root, testcase.spec, path, f"kernel {kernel.id}", f"testcases[{t}].spec", "specs")
            for j, name in enumerate(testcase.spec_files or []):
                keep_inside(root, name, path, f"kernel {kernel.id}", f"testcases[{t}].spec_files[{j}]", "spec files")
            if testcase.working_dir:
                keep_inside(
                    root,
                    testcase.working_dir,
                    path,
                    f"kernel {kernel.id}",
                    f"testcases[{t}].working_dir",
                    "working folders",
                )
    for trace in manifest.traces:
        _keep_folder_inside(root, trace.dir, path, f"traces {trace.id}", "dir", "traces")
        for j, repo in enumerate(trace.kernel_source_repos):
            keep_inside(root, repo, path, f"traces {trace.id}", f"kernel_source_repos[{j}]", "source repositories")
    for bench in manifest.benchmark:
        folder = _model_folder(root, bench.model)
        if folder is not None:
            _keep_folder_inside(root, bench.model, path, f"benchmark {bench.id}", "model", "model folders", folder)
    for i, table in enumerate(manifest.rule):
        _check_rule_inputs(root, table, path, i)


def local_model_path(model: str) -> Path | None:
    """The model as a local path where it names one (exists, or is written as a path), else None (a hub id)."""
    expanded = os.path.expanduser(model)
    if os.path.exists(expanded) or model.startswith(("/", "./", "../", "~")) or model.count("/") > 1:
        return Path(expanded).resolve()
    return None


def _model_folder(root: Path, model: str) -> Path | None:
    """Where a build reads a benchmark's model from (graph/expand.py): beside the manifest, else
    as given; None for a hub id."""
    found = local_model_path(str(root / model)) if not Path(model).is_absolute() else None
    if found is None or not found.exists():
        found = local_model_path(model)
    return found


def _check_rule_inputs(root: Path, table, path, index: int) -> None:
    from magpie.paths import templates_dir

    if not isinstance(table, dict) or not isinstance(table.get("inputs"), list):
        return  # the rule's own validation names what is wrong
    where = f"rule {table.get('name', index)}"
    for j, name in enumerate(table["inputs"]):
        if not isinstance(name, str) or (name.startswith("{") and name.endswith("}")):
            continue
        if name.startswith("magpie-templates/"):  # read from magpie's own templates (graph/expand.py)
            real = outside(templates_dir(), name.split("/", 1)[1])
            if real is not None:
                raise located(
                    path,
                    where,
                    f"inputs[{j}] {_quoted(name)} resolves outside magpie's templates "
                    f"({real}); name a template, or a file inside the project",
                )
            continue
        keep_inside(root, name, path, where, f"inputs[{j}]", "rule inputs")


def check_files(manifest: Manifest, root: Path, path) -> None:
    check_paths_inside(manifest, root, path)
    for k, kernel in enumerate(manifest.kernel):
        impls = ([("baseline", kernel.baseline)] if kernel.baseline else []) + [
            (f"candidates[{i}]", impl) for i, impl in enumerate(kernel.candidates)
        ]
        for where, impl in impls:
            for f, rel in [("source", impl.source)] + [
                (f"source_files[{j}]", s) for j, s in enumerate(impl.source_files)
            ]:
                if not (root / rel).is_file():
                    raise located(path, f"kernel[{k}].{where}.{f}", f"file not found: {rel}")
        if kernel.kernelbench:
            problem = root / kernel.kernelbench
            if not problem.is_file():
                raise located(path, f"kernel[{k}].kernelbench", f"file not found: {kernel.kernelbench}")
            if not _declares_kernelbench(problem):
                raise located(
                    path,
                    f"kernel[{k}].kernelbench",
                    f"{kernel.kernelbench} is not a KernelBench problem: it must define class Model and "
                    "get_inputs() (and get_init_inputs() where Model takes arguments)",
                )
        for t, testcase in enumerate(kernel.testcases):
            if testcase.spec and not (root / testcase.spec).is_file():
                raise located(path, f"kernel[{k}].testcases[{t}].spec", f"file not found: {testcase.spec}")
            if testcase.spec and not testcase.shapes and not _declares_kernelbench(root / testcase.spec):
                raise located(
                    path,
                    f"kernel[{k}].testcases[{t}].shapes",
                    "declare at least one shape, e.g. shapes = [[128, 1000]] "
                    "(or give a KernelBench-style spec with Model and get_inputs())",
                )


def _declares_kernelbench(spec: Path) -> bool:
    text = spec.read_text(errors="replace")
    return "class Model" in text and "def get_inputs" in text
