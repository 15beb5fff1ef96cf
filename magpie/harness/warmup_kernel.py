"""A kernel of magpie's own that a spare compiles to start Triton's compiler in its process
(`harness.triton_warmup`); never launched. Imported only there: it imports Triton."""

import triton
import triton.language as tl


@triton.jit
def magpie_warmup(x, out, n, BLOCK: tl.constexpr):
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(out + offsets, tl.load(x + offsets, mask=offsets < n) * 2, mask=offsets < n)


def compile_it() -> None:
    from triton.compiler import ASTSource

    triton.compile(
        ASTSource(magpie_warmup, {"x": "*fp32", "out": "*fp32", "n": "i32", "BLOCK": "constexpr"}, {"BLOCK": 128})
    )
