"""Magpie-style YAML kernel configs (`kernel:` or `kernels:`) loaded into our models.

Keys per kernel: id, type, source_files, working_dir, env, compile_command,
testcase_command; we also accept entry, spec, shapes, dtypes, rtol, atol.
"""

from __future__ import annotations

from pathlib import Path

import yaml
from pydantic import ValidationError

from magpie.errors import UserError, located
from magpie.manifest.load import describe_validation_error, keep_inside, read_text
from magpie.manifest.models import Implementation, Testcase

ALLOWED = {
    "id",
    "name",
    "type",
    "source_files",
    "source",
    "working_dir",
    "env",
    "compile_command",
    "testcase_command",
    "entry",
    "spec",
    "shapes",
    "dtypes",
    "rtol",
    "atol",
    "trials",
}


class YamlKernel:
    """One kernel of a YAML config: an implementation plus the testcases that judge it."""

    def __init__(self, impl: Implementation, kernel_type: str, testcases: list[Testcase]):
        self.impl = impl
        self.type = kernel_type
        self.testcases = testcases


def load_kernel_config(path: str | Path) -> tuple[list[YamlKernel], Path]:
    path = Path(path)
    try:
        data = yaml.safe_load(read_text(path))
    except yaml.YAMLError as err:
        raise UserError(_yaml_error(path, err)) from None
    if not isinstance(data, dict) or not ({"kernel", "kernels"} & data.keys()):
        raise UserError(f"{path}: expected a top-level 'kernel:' mapping or a 'kernels:' list")
    if "kernels" in data:
        entries, prefix = data["kernels"], "kernels"
        if not isinstance(entries, list) or not entries:
            raise located(path, "kernels", "expected a non-empty list of kernels")
    else:
        entries, prefix = [data["kernel"]], "kernel"
    root = path.resolve().parent
    kernels = [
        _one(path, root, entry, f"{prefix}[{i}]" if prefix == "kernels" else prefix) for i, entry in enumerate(entries)
    ]
    ids = [k.impl.id for k in kernels]
    if len(set(ids)) != len(ids):
        raise located(path, prefix, f"kernel ids must be unique, got {ids}")
    return kernels, root


def _yaml_error(path: Path, err: yaml.YAMLError) -> str:
    """`file:line:col: invalid YAML: problem (context)`, the place editors jump to."""
    mark = getattr(err, "problem_mark", None)
    problem = getattr(err, "problem", None)
    if mark is None or problem is None:
        return f"{path}: invalid YAML: {str(err).splitlines()[0]}"
    context = getattr(err, "context", None)
    return f"{path}:{mark.line + 1}:{mark.column + 1}: invalid YAML: {problem}" + (f" ({context})" if context else "")


def _one(path: Path, root: Path, entry, where: str) -> YamlKernel:
    if not isinstance(entry, dict):
        raise located(path, where, "expected a mapping with id, type, source_files, ...")
    unknown = sorted(set(entry) - ALLOWED)
    if unknown:
        raise located(path, f"{where}.{unknown[0]}", f"unknown field (allowed: {', '.join(sorted(ALLOWED))})")
    kernel_type = entry.get("type")
    if kernel_type not in ("pytorch", "triton", "cuda", "hip"):
        raise located(path, f"{where}.type", f"expected one of pytorch, triton, cuda, hip (got {kernel_type!r})")
    sources = entry.get("source_files") or ([entry["source"]] if entry.get("source") else [])
    if not sources:
        raise located(path, f"{where}.source_files", "list at least one source file")
    working_dir = entry.get("working_dir")
    if working_dir:
        keep_inside(root, str(working_dir), path, where, "working_dir", "working folders")
    base = (root / working_dir) if working_dir else root
    rel_sources = []
    for i, src in enumerate(sources):
        keep_inside(root, str(base / src), path, where, f"source_files[{i}]", "source files", shown=str(src))
        full = (base / src).resolve()
        if not full.is_file():
            raise located(path, f"{where}.source_files[{i}]", f"file not found: {src}")
        rel_sources.append(_relative(full, root))
    kernel_id = str(entry.get("id") or entry.get("name") or Path(sources[0]).stem)
    try:
        impl = Implementation(
            id=kernel_id,
            source=rel_sources[0],
            source_files=rel_sources[1:],
            entry=entry.get("entry"),
            working_dir=_relative(base.resolve(), root) if working_dir else None,
            env={str(k): str(v) for k, v in (entry.get("env") or {}).items()},
            compile_command=entry.get("compile_command"),
        )
        testcases = []
        if entry.get("testcase_command"):
            testcases.append(Testcase(command=entry["testcase_command"], working_dir=impl.working_dir, env=impl.env))
        if entry.get("spec"):
            keep_inside(root, str(base / entry["spec"]), path, where, "spec", "specs", shown=str(entry["spec"]))
            spec = (base / entry["spec"]).resolve()
            if not spec.is_file():
                raise located(path, f"{where}.spec", f"file not found: {entry['spec']}")
            testcases.append(
                Testcase(
                    spec=_relative(spec, root),
                    shapes=entry.get("shapes", []),
                    dtypes=entry.get("dtypes", ["float32"]),
                    rtol=entry.get("rtol"),
                    atol=entry.get("atol"),
                    trials=entry.get("trials"),
                )
            )
    except ValidationError as err:
        sub = describe_validation_error(path, err)
        raise UserError(str(sub).replace(f"{path}: ", f"{path}: {where}.", 1)) from None
    return YamlKernel(impl, kernel_type, testcases)


def _relative(full: Path, root: Path) -> str:
    """A path already kept inside the project (`keep_inside`), relative to it."""
    return full.relative_to(root).as_posix()
