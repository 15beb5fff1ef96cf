"""bench/capture_traces.py's compare_repeats kernel, run on the CPU under Triton's interpreter: its
slower variant must do more real work (an eleventh slice of data read), not repeat a load that the
compiler may merge or L2 may serve, which left the H200's `slower_*` captures no slower."""

import os
import subprocess
import sys
import textwrap

from conftest import FIXTURES

ROOT = FIXTURES.parent.parent

CHECK = textwrap.dedent(
    """
    import sys
    import torch
    sys.path.insert(0, "bench")
    from capture_traces import PASSES_REPEATED, PASSES_SLOWER, run_passes

    block, slice_len = 64, 200  # a last block part-filled: the mask is exercised
    slices = torch.stack([torch.full((slice_len,), float(2**k)) for k in range(PASSES_SLOWER)])
    blocks = -(-slice_len // block)
    for passes in (PASSES_REPEATED, PASSES_SLOWER):
        sums = torch.full((blocks,), float("nan"))
        run_passes(slices, sums, passes, block=block)
        expected = [(2**passes - 1) * min(block, slice_len - b * block) for b in range(blocks)]
        print(passes, sums.tolist() == expected, sums.tolist(), expected)
    """
)


def test_the_slower_variant_reads_an_eleventh_slice_of_its_own():
    """Each pass reads a slice no other pass reads (slice k holds 2**k, so each block's sum says
    which slices were read, once each): eleven passes read ten slices' data and one more."""
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    proc = subprocess.run([sys.executable, "-c", CHECK], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    lines = proc.stdout.split("\n")
    assert lines[0].startswith("10 True") and lines[1].startswith("11 True"), proc.stdout
