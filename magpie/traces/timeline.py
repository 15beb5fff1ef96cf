"""GPU time per device split into computation (kernels and memsets), exposed communication,
exposed memcpy, busy and idle, with TraceLens's row names and columns (type, time ms, percent)."""

from __future__ import annotations

from magpie.traces.ingest import Trace
from magpie.traces.kernels import category

COLUMNS = ["type", "time ms", "percent"]


def union(intervals: list[tuple[float, float]]) -> list[tuple[float, float]]:
    merged: list[tuple[float, float]] = []
    if not intervals:
        return merged
    ordered = sorted(intervals)
    start, end = ordered[0]
    for s, e in ordered:
        if s <= end:
            if e > end:
                end = e
        else:
            merged.append((start, end))
            start, end = s, e
    merged.append((start, end))
    return merged


def length(intervals: list[tuple[float, float]]) -> float:
    return sum(e - s for s, e in intervals)


def subtract(a: list[tuple[float, float]], b: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """Parts of the (merged) intervals a not covered by the (merged) intervals b."""
    out, j = [], 0
    for start, end in a:
        cursor = start
        while j < len(b) and b[j][1] <= cursor:
            j += 1
        k = j
        while k < len(b) and b[k][0] < end:
            if b[k][0] > cursor:
                out.append((cursor, b[k][0]))
            cursor = max(cursor, b[k][1])
            k += 1
        if cursor < end:
            out.append((cursor, end))
    return out


def gpu_timeline(trace: Trace, spans: list[tuple[float, float]] | None = None) -> dict[int, list[dict]]:
    """Rows per device: type, time ms, percent (of the device's total span, or of the given
    spans, e.g. the steps of one stage, whose gaps are then neither busy nor idle)."""
    devices: dict[int, dict[str, list]] = {}
    # intervals from the timestamps as recorded (2**-10 µs resolution near 5e12 µs): the rounding TraceLens's
    # figures carry, so that both agree to the last digit
    base = 0.0
    for a in trace.gpu:
        kind = category(a.name, a.kind)
        # a memset writes device memory with the device's own engines: computation, as TraceLens counts it
        group = "comm" if kind == "communication" else "memcpy" if kind == "memcpy" else "compute"
        start = a.ts - base
        groups = devices.get(a.device)
        if groups is None:
            groups = devices[a.device] = {"compute": [], "comm": [], "memcpy": []}
        groups[group].append((start, start + a.dur))
    tables = {}
    for device, groups in sorted(devices.items()):
        compute, comm, memcpy = (union(groups[g]) for g in ("compute", "comm", "memcpy"))
        # a merged list is its own union: no second pass over every kernel where there is
        # nothing to add (most traces have no communication, many no memcpy)
        computing = union(compute + comm) if comm else compute
        busy = union(computing + memcpy) if memcpy else computing
        if spans is not None:
            total = length(union([(s - base, e - base) for s, e in spans]))
        else:
            total = busy[-1][1] - busy[0][0] if busy else 0.0
        busy_time = length(busy)
        times = {
            "computation_time": busy_time if busy is compute else length(compute),
            "exposed_comm_time": length(subtract(comm, compute)),
            "exposed_memcpy_time": length(subtract(memcpy, computing)),
            "busy_time": busy_time,
            "idle_time": total - busy_time,
            "total_time": total,
            "total_comm_time": length(comm),
            "total_memcpy_time": length(memcpy),
        }
        tables[device] = [
            {"type": name, "time ms": us / 1000, "percent": 100 * us / total if total else 0.0}
            for name, us in times.items()
        ]
    return tables
