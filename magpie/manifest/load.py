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


def describe_validation_error(path, err: ValidationError) -> UserError:
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
    return located(path, field_path(loc), problem)


def parse_toml(path: Path) -> dict:
    try:
        text = path.read_text()
    except FileNotFoundError:
        raise UserError(f"{path}: file not found (run magpie in a folder with a magpie.toml, or pass --manifest)") \
            from None
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
        raise describe_validation_error(path, err) from None
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
