"""The process Nsight Compute profiles: one implementation called once on spec inputs inside an
NVTX range named `magpie_profile`, so that ncu counts its kernels and not the reference's, nor
those of the warm-up call before it. With `profiler_start` in the request the range also lies
between cudaProfilerStart and cudaProfilerStop (ncu runs with --profile-from-start off): ncu
sees no launch before it, so its per-kernel invocation count starts at the range.
Usage: python -m magpie.harness.profile REQUEST.json
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

RANGE = "magpie_profile"


def main(argv: list[str]) -> int:
    import torch

    from magpie.harness import wire
    from magpie.harness.spec import ReferenceSpec, output_specs, weights_seed
    from magpie.harness.worker import Implementation

    request: wire.ProfileRequest = wire.decode(Path(argv[0]).read_bytes(), wire.ProfileRequest, argv[0])
    root, impl, settings = Path(request.root), request.impl, request.settings
    device = request.device or settings.project.device
    testcase = next(tc for tc in settings.correctness.testcases if tc.spec)
    spec = ReferenceSpec(root / str(testcase.spec), testcase, device)
    seed = settings.correctness.seed
    case = max(spec.cases(seed, request.kernel, 0, 1, salt="profile"), key=lambda c: math.prod(c.shape or [0]))
    args = spec.make_inputs(case)
    init_seed = weights_seed(seed, request.kernel)
    expected = spec.reference(args, init_seed)  # shapes of what a native entry allocates
    runner = Implementation(
        wire.Load(
            id=impl.id,
            source=str(root / impl.source),
            entry=impl.entry,
            library=impl.library,
            device=device,
            seed=init_seed,
        )
    )
    if hasattr(runner.fn, "out_specs"):
        runner.fn.out_specs = output_specs(expected)
    on_device = tuple(a.to(device) if torch.is_tensor(a) else a for a in args)
    runner.fn(*on_device)  # compile / autotune outside the profiled range
    torch.cuda.synchronize()
    started = request.profiler_start
    if started:
        torch.cuda.profiler.start()
    torch.cuda.nvtx.range_push(RANGE)
    for _ in range(request.reps):
        runner.fn(*on_device)
    torch.cuda.synchronize()
    torch.cuda.nvtx.range_pop()
    if started:
        torch.cuda.profiler.stop()
    print(json.dumps({"case": case.label}), file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
