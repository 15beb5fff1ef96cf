"""Gap analysis: which kernels take the GPU time in a window, by total contribution.

Columns follow Magpie's (Name, Calls, Self CUDA total (us), Avg time (us), % Total,
Input Shapes); ours add the normalized name, category, the launching CPU op and rank.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from operator import add, attrgetter

from magpie.traces.ingest import Trace
from magpie.traces.kernels import category, normalize

COLUMNS = [
    "Name",
    "Calls",
    "Self CUDA total (us)",
    "Avg time (us)",
    "% Total",
    "Input Shapes",
    "Normalized Name",
    "Category",
    "CPU Op",
    "Rank",
]

_START, _DURATION = attrgetter("ts"), attrgetter("dur")


@dataclass
class Window:
    start_pct: float = 0.0
    end_pct: float = 100.0
    absolute: tuple[float, float] | None = None  # microseconds, when picked from the trace itself

    def bounds(self, trace: Trace) -> tuple[float, float]:
        if self.absolute is not None:
            return self.absolute
        kernels = trace.kernels
        if not kernels:
            return 0.0, 0.0
        first = min(map(_START, kernels))
        last = max(map(add, map(_START, kernels), map(_DURATION, kernels)))
        span = last - first
        return first + span * self.start_pct / 100, first + span * self.end_pct / 100


def gap_rows(
    trace: Trace,
    window: Window,
    *,
    top_k: int | None = None,
    include: set[str] | None = None,
    exclude: set[str] | None = None,
    min_duration_us: float = 0.0,
    rank_label: str = "",
) -> list[dict]:
    lo, hi = window.bounds(trace)
    groups: dict[str, dict] = {}
    filtered = include or exclude
    total = 0.0
    cpu_ops = trace.cpu_ops
    for kernel in trace.kernels:
        if not (lo <= kernel.ts <= hi):
            continue
        total += kernel.dur
        op = cpu_ops[kernel.op] if kernel.op is not None else None
        if filtered:
            label = category(kernel.name, kernel.kind, op.name if op else None)
            if (include and label not in include) or (exclude and label in exclude):
                continue
        group = groups.get(kernel.name)
        if group is None:
            if not filtered:  # a kernel name's category is its first kernel's: no need to ask the others'
                label = category(kernel.name, kernel.kind, op.name if op else None)
            group = groups[kernel.name] = {"calls": 0, "total": 0.0, "dims": [], "ops": [], "category": label}
        group["calls"] += 1
        group["total"] += kernel.dur
        # counted once the window is walked, by Counter in C: the launching ops' names and input dims
        if op is not None:
            group["ops"].append(op.name)
            if op.input_dims is not None:
                group["dims"].append(op.input_dims)
        elif kernel.python is not None:
            group["ops"].append(f"python: {trace.python_calls[kernel.python].name}")
        elif kernel.launch is not None:  # outside any op and any Python function: the launch and the kernel
            group["ops"].append(f"{trace.launches[kernel.launch].name}->{normalize(kernel.name)}")
    rows = []
    for name, g in groups.items():
        avg = g["total"] / g["calls"]
        if avg < min_duration_us:
            continue
        rows.append(
            {
                "Name": name,
                "Calls": g["calls"],
                "Self CUDA total (us)": round(g["total"], 3),
                "Avg time (us)": round(avg, 3),
                "% Total": round(100 * g["total"] / total, 3) if total else 0.0,
                "Input Shapes": _most_common_text(g["dims"]),
                "Normalized Name": normalize(name),
                "Category": g["category"],
                "CPU Op": Counter(g["ops"]).most_common(1)[0][0] if g["ops"] else "",
                "Rank": rank_label,
            }
        )
    rows.sort(key=lambda r: -r["Self CUDA total (us)"])
    return rows[:top_k] if top_k else rows


def _most_common_text(dims: list[list]) -> str:
    """The most frequent str() of the input dims, ties to the first seen; each distinct list
    (ops share them) made text once."""
    if not dims:
        return ""
    lists = dict(zip(map(id, dims), dims))
    texts: Counter = Counter()
    for shared, count in Counter(map(id, dims)).items():
        texts[str(lists[shared])] += count
    return texts.most_common(1)[0][0]


def window_total_us(trace: Trace, window: Window) -> float:
    lo, hi = window.bounds(trace)
    return sum(k.dur for k in trace.kernels if lo <= k.ts <= hi)
