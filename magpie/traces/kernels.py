"""Kernel names: a normalized form for grouping, and a coarse category for filters."""

from __future__ import annotations

import re
from functools import lru_cache

_TILE = re.compile(r"\d+x\d+(?:x\d+)*")
_TRAILING_INDEX = re.compile(r"(_\d+)+$")

# Order matters: the first pattern that matches names the category.
CATEGORIES = [
    ("communication", re.compile(r"nccl|rccl|all_?reduce|all_?gather|reduce_?scatter|alltoall", re.I)),
    ("attention", re.compile(r"flash|fmha|attention|attn|sdpa", re.I)),
    ("gemm", re.compile(r"gemm|nvjet|cutlass|cublas|hipblas|tensile|matmul|_mm_|\bmm\b|wgmma|sm\d+_xmma", re.I)),
    ("norm", re.compile(r"norm", re.I)),
    ("softmax", re.compile(r"softmax", re.I)),
    ("reduction", re.compile(r"reduce|triton_red|triton_per|sum|argmax|max_kernel", re.I)),
    ("copy", re.compile(r"copy|cat|index|gather|scatter|embedding", re.I)),
    ("elementwise", re.compile(r"elementwise|triton_poi|vectorized|unrolled|pointwise|fill", re.I)),
]


def _strip_balanced(text: str, open_char: str, close_char: str) -> str:
    out, depth = [], 0
    for ch in text:
        if ch == open_char:
            depth += 1
        elif ch == close_char and depth:
            depth -= 1
        elif depth == 0:
            out.append(ch)
    return "".join(out)


@lru_cache(maxsize=65536)
def normalize(name: str) -> str:
    """'void at::native::vectorized_elementwise_kernel<4, Functor, Array>(int, ...)' ->
    'at::native::vectorized_elementwise_kernel'; tile shapes become NxM; trailing _N indices go."""
    text = _strip_balanced(_strip_balanced(name, "<", ">"), "(", ")").strip()
    text = re.sub(r":{3,}", "::", text.removeprefix("void ").strip())
    text = _TILE.sub("NxM", text)
    return _TRAILING_INDEX.sub("", text) or name


@lru_cache(maxsize=65536)  # kernel names repeat thousands of times and can be kilobytes long
def category(name: str, kind: str = "kernel", op_name: str | None = None) -> str:
    if kind in ("memcpy", "memset"):
        return kind
    for label, pattern in CATEGORIES:
        if pattern.search(name) or (op_name and label in ("gemm", "attention") and pattern.search(op_name)):
            return label
    return "other"


_TENSILE = re.compile(r"C[a-z]{3}_A([a-z]{3})_B([a-z]{3})")


@lru_cache(maxsize=4096)
def gemm_transposes(name: str) -> tuple | None:
    """Whether a GEMM kernel reads A and B transposed, where its name says so (TraceLens's
    `transpose` parameter): cuBLAS's nvjet kernels end in a letter each for A and B (T or N);
    Tensile's (ROCm) name each operand's index order (Alik: A transposed, Bjlk: B transposed;
    None where neither order is named). None for any other kernel."""
    if name.startswith("nvjet"):
        letters = name.rsplit("_", 1)[-1]
        return letters[0] == "T", letters[1:2] == "T"
    found = _TENSILE.search(name)
    if found is None:
        return None
    a, b = found.groups()
    return {"lik": True, "ilk": False}.get(a), {"jlk": True, "ljk": False}.get(b)
