"""magpie calibrate: measure this GPU's real ceilings for the roofline.

Memory bandwidth from a large device-to-device copy (bytes read plus written); matrix
rates from large GEMMs per precision on random data. Results are stored per device name
and replace the datasheet figures wherever rooflines are computed on this machine.
"""

from __future__ import annotations

import json

from magpie.errors import UserError

GEMM_SIZE = 8192
COPY_BYTES = 2 * 2**30


def add_parser(sub) -> None:
    p = sub.add_parser(
        "calibrate", help="measure this GPU's bandwidth and matrix peaks for rooflines", description=__doc__
    )
    p.add_argument("--json", action="store_true", help="print the measurements as JSON")
    p.add_argument("--dry-run", action="store_true", help="measure and print, store nothing")
    p.set_defaults(run=run)


def _median_ms(torch, fn, reps: int = 10) -> float:
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
    times.sort()
    return times[len(times) // 2]


def _copy_ms(torch) -> float:
    """A 4 GiB device-to-device copy's median; its buffers are freed on return, before the GEMMs."""
    src = torch.empty(COPY_BYTES // 4, dtype=torch.float32, device="cuda").uniform_()
    dst = torch.empty_like(src)
    return _median_ms(torch, lambda: dst.copy_(src))


def measure() -> dict:
    try:
        import torch
    except ImportError:
        raise UserError("calibrate needs torch with a GPU: pip install 'magpie[gpu]'") from None
    if not torch.cuda.is_available():
        raise UserError("calibrate: no GPU visible to torch; nothing to measure on a CPU machine")
    memory_tbps = 2 * COPY_BYTES / (_copy_ms(torch) / 1e3) / 1e12
    peaks = {}
    gemms = {
        "bf16_tensor": (torch.bfloat16, True),
        "fp16_tensor": (torch.float16, True),
        "tf32_tensor": (torch.float32, True),
        "fp32": (torch.float32, False),
        "fp64_tensor": (torch.float64, True),
    }
    previous = torch.backends.cuda.matmul.allow_tf32
    try:
        for name, (dtype, tf32) in gemms.items():
            torch.backends.cuda.matmul.allow_tf32 = tf32
            n = GEMM_SIZE if dtype != torch.float64 else GEMM_SIZE // 2
            a = torch.randn(n, n, device="cuda", dtype=dtype)
            b = torch.randn(n, n, device="cuda", dtype=dtype)
            ms = _median_ms(torch, lambda a=a, b=b: a @ b)
            peaks[name] = 2 * n**3 / (ms / 1e3) / 1e12
    finally:
        torch.backends.cuda.matmul.allow_tf32 = previous
    return {
        "device": torch.cuda.get_device_name(),
        "memory_tbps": memory_tbps,
        "peak_tflops": peaks,
        "method": f"median of 10 CUDA-event timings after 3 warm-ups; copy of {COPY_BYTES >> 20} MiB counted "
        f"as read+write; {GEMM_SIZE}^3 GEMMs on random data (fp64: {GEMM_SIZE // 2}^3)",
    }


def run(args) -> int:
    from magpie.roofline.specs import calibration_path
    from magpie.store import atomic_write

    result = measure()
    if not args.dry_run:
        path = calibration_path(result["device"])
        atomic_write(path, json.dumps(result, indent=1))
        result["stored"] = str(path)
    if args.json:
        print(json.dumps(result, indent=1))
        return 0
    print(f"{result['device']}: memory {result['memory_tbps']:.2f} TB/s")
    for name, value in result["peak_tflops"].items():
        print(f"  {name:12} {value:8.1f} TFLOP/s")
    if "stored" in result:
        print(f"stored in {result['stored']}")
    return 0
