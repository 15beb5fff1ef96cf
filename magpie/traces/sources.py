"""Map kernels to their source: Triton `@triton.jit` functions and CUDA/HIP `__global__`
functions found in the given repositories, or a named closed-source library.

Every answer says how sure it is: `resolved` (one definition of that symbol), `ambiguous`
(several; all listed), `library` (a known library's kernel, named), or `unresolved` with the
reason. Paths come only from files that were read; nothing is made up.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from dataclasses import dataclass
from pathlib import Path

from magpie.store import atomic_write

SOURCE_SUFFIXES = {
    ".py": "triton",
    ".cu": "cuda",
    ".cuh": "cuda",
    ".hip": "hip",
    ".cpp": "cuda",
    ".cc": "cuda",
    ".h": "cuda",
    ".hpp": "cuda",
}
SKIP_DIRS = {".git", "node_modules", "__pycache__", "build", "dist", ".venv", "venv"}
_TRITON_JIT = re.compile(r"^\s*@triton\.(?:jit|autotune|heuristics)\b")
_DEF = re.compile(r"^\s*def\s+(\w+)\s*\(")
_GLOBAL = re.compile(
    r"__global__\s+(?:__launch_bounds__\s*\([^)]*\)\s*)?(?:static\s+)?(?:inline\s+)?void\s+"
    r"(?:__launch_bounds__\s*\([^)]*\)\s*)?(\w+)\s*\("
)

LIBRARIES = [
    (re.compile(r"^nvjet|cublas|gemv2?T?_kernel|gemmSN|gemmk1", re.I), "cuBLAS"),
    (re.compile(r"cudnn", re.I), "cuDNN"),
    (re.compile(r"cutlass", re.I), "CUTLASS"),
    (re.compile(r"flash_fwd|flash_bwd|flashattn|fmha_", re.I), "FlashAttention"),
    (re.compile(r"^Cijk_"), "Tensile (rocBLAS / hipBLASLt)"),
    (re.compile(r"\bck::|^ck_|kernel_gemm_xdl", re.I), "Composable Kernel"),
    (re.compile(r"nccl|rccl", re.I), "NCCL / RCCL"),
    (re.compile(r"^triton_(?:poi|red|per|tem)_"), "TorchInductor (generated Triton)"),
    (re.compile(r"\b(?:at::native|at::cuda|c10::cuda)::|^(?:void )?at::"), "ATen (PyTorch)"),
]


@dataclass
class Definition:
    symbol: str
    kind: str
    file: str
    line: int


def _scan(path: Path, kind: str) -> list[Definition]:
    try:
        lines = path.read_text(errors="replace").splitlines()
    except OSError:
        return []
    found = []
    if kind == "triton":
        pending = False
        for number, line in enumerate(lines, 1):
            if _TRITON_JIT.match(line):
                pending = True
            elif pending:
                match = _DEF.match(line)
                if match:
                    found.append(Definition(match.group(1), "triton", str(path), number))
                    pending = False
                elif line.strip() and not line.lstrip().startswith(("@", "#", ")", "configs", "key")):
                    pending = pending and line.startswith((" ", "\t"))  # decorator arguments spanning lines
    else:
        for number, line in enumerate(lines, 1):
            if "__global__" in line:
                window = " ".join(lines[number - 1 : number + 2])
                match = _GLOBAL.search(window)
                if match:
                    found.append(Definition(match.group(1), kind, str(path), number))
    return found


def _files(repo: Path):
    for directory, subdirs, names in os.walk(repo):
        subdirs[:] = [d for d in subdirs if d not in SKIP_DIRS]
        for name in names:
            suffix = Path(name).suffix
            if suffix in SOURCE_SUFFIXES:
                yield Path(directory) / name, SOURCE_SUFFIXES[suffix]


def _cache_dir() -> Path:
    return Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "magpie" / "sources"


class SourceIndex:
    """Definitions by symbol across repositories; each file's entries are cached by its content hash."""

    def __init__(self, repos: list[Path]):
        self.repos = [Path(r).resolve() for r in repos]
        self.by_symbol: dict[str, list[Definition]] = {}
        self.files_read = 0
        cache_path = _cache_dir() / "index.json"
        try:
            cache = json.loads(cache_path.read_text())
        except (OSError, ValueError):
            cache = {}
        fresh = {}
        for repo in self.repos:
            for path, kind in _files(repo):
                try:
                    digest = hashlib.sha256(path.read_bytes()).hexdigest()
                except OSError:
                    continue
                key = f"{digest}:{kind}"
                entries = cache.get(key)
                if entries is None:
                    entries = [(d.symbol, d.line) for d in _scan(path, kind)]
                    self.files_read += 1
                fresh[key] = entries
                for symbol, line in entries:
                    self.by_symbol.setdefault(symbol, []).append(Definition(symbol, kind, str(path), line))
        if fresh != cache:
            atomic_write(cache_path, json.dumps({**cache, **fresh}))
        self._tests: dict[str, list[str]] = {}

    def tests_mentioning(self, symbol: str) -> list[str]:
        if symbol not in self._tests:
            hits = []
            for repo in self.repos:
                for path in repo.rglob("test*.py"):
                    if any(part in SKIP_DIRS for part in path.parts):
                        continue
                    try:
                        if re.search(rf"\b{re.escape(symbol)}\b", path.read_text(errors="replace")):
                            hits.append(str(path))
                    except OSError:
                        continue
            self._tests[symbol] = sorted(hits)
        return self._tests[symbol]


def symbol_of(kernel_name: str) -> str:
    """The bare function name: no return type, namespace, template arguments or parameters."""
    from magpie.traces.kernels import normalize

    text = normalize(kernel_name)
    return text.split("::")[-1].strip() or kernel_name


def resolve(kernel_name: str, index: SourceIndex) -> dict:
    symbol = symbol_of(kernel_name)
    definitions = index.by_symbol.get(symbol, [])
    if len(definitions) == 1:
        d = definitions[0]
        tests = index.tests_mentioning(symbol)
        return {
            "state": "resolved",
            "symbol": symbol,
            "file": d.file,
            "line": d.line,
            "kind": d.kind,
            "confidence": 0.9,
            "suggested_testcase": f"python -m pytest {tests[0]} -k {symbol}" if tests else None,
        }
    if len(definitions) > 1:
        return {
            "state": "ambiguous",
            "symbol": symbol,
            "confidence": round(1 / len(definitions), 3),
            "candidates": [{"file": d.file, "line": d.line, "kind": d.kind} for d in definitions],
        }
    for pattern, library in LIBRARIES:
        if pattern.search(kernel_name):
            return {"state": "library", "symbol": symbol, "library": library, "confidence": 0.8}
    return {
        "state": "unresolved",
        "symbol": symbol,
        "confidence": 0.0,
        "reason": f"no @triton.jit or __global__ function named {symbol!r} in the given repositories, "
        "and no known library's naming",
    }
