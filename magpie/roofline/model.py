"""Roofline arithmetic shared by the counter rules and the trace analysis."""

from __future__ import annotations

from magpie.roofline.specs import Arch


def roofline(flops: float, bytes_moved: float, seconds: float, arch: Arch, precision: str) -> dict:
    """Achieved rates, arithmetic intensity, the bound and percent of the roofline at that intensity."""
    peak_tflops = arch.peak(precision)
    intensity = flops / bytes_moved if bytes_moved else None
    achieved_tflops = flops / seconds / 1e12 if seconds else None
    achieved_tbps = bytes_moved / seconds / 1e12 if seconds else None
    out = {
        "flops": flops,
        "bytes": bytes_moved,
        "time_us": seconds * 1e6,
        "arithmetic_intensity": intensity,
        "achieved_tflops": achieved_tflops,
        "achieved_tbps": achieved_tbps,
        "precision": precision,
        "peak_tflops": peak_tflops,
        "peak_tbps": arch.memory_tbps,
        "arch": arch.name,
        "peaks_measured": bool(arch.measured),
    }
    if achieved_tflops is None or achieved_tbps is None or intensity is None:  # no time or no bytes
        out.update(bound=None, pct_of_roofline=None, roofline_time_us=None)
        return out
    if not flops:  # pure data movement: only the bandwidth roof applies
        out.update(
            bound="memory",
            pct_of_roofline=100 * achieved_tbps / arch.memory_tbps,
            roofline_time_us=bytes_moved / (arch.memory_tbps * 1e12) * 1e6,
        )
        return out
    if peak_tflops is None:
        out.update(bound=None, pct_of_roofline=None, roofline_time_us=None)
        return out
    ridge = peak_tflops * 1e12 / (arch.memory_tbps * 1e12)
    attainable_tflops = min(peak_tflops, intensity * arch.memory_tbps)
    floor_s = max(flops / (peak_tflops * 1e12), bytes_moved / (arch.memory_tbps * 1e12))
    out.update(
        bound="compute" if intensity >= ridge else "memory",
        ridge_flops_per_byte=ridge,
        pct_of_roofline=100 * achieved_tflops / attainable_tflops if attainable_tflops else None,
        roofline_time_us=floor_s * 1e6,
    )
    return out
