"""Read `magpie.toml` (or a Magpie YAML kernel config) into validated models.

Any problem becomes a single `UserError` line: `<file>: <field path>: <problem>`.
"""

from __future__ import annotations

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
        line = err.object[:err.start].count(b"\n") + 1
        raise UserError(f"{path}:{line}: byte 0x{err.object[err.start]:02x} is not UTF-8: save the file as UTF-8") \
            from None
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
        raise UserError(f"{path}: declares nothing to build: add a [[kernel]] with a baseline or candidates, "
                        f"a [[traces]] folder or a [[benchmark]] (see the manifest in README.md)")
    root = path.resolve().parent
    check_files(manifest, root, path)
    return manifest, root


def check_files(manifest: Manifest, root: Path, path) -> None:
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
