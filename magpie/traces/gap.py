"""Gap analysis: which kernels take the GPU time in a window, by total contribution.

Columns follow Magpie's (Name, Calls, Self CUDA total (us), Avg time (us), % Total,
Input Shapes); ours add the normalized name, category, the launching CPU op and rank.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from magpie.traces.ingest import Trace
from magpie.traces.kernels import category, normalize

COLUMNS = ["Name", "Calls", "Self CUDA total (us)", "Avg time (us)", "% Total", "Input Shapes",
           "Normalized Name", "Category", "CPU Op", "Rank"]


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
        first = min(k.ts for k in kernels)
        last = max(k.ts + k.dur for k in kernels)
        span = last - first
        return first + span * self.start_pct / 100, first + span * self.end_pct / 100


def gap_rows(trace: Trace, window: Window, *, top_k: int | None = None, include: set[str] | None = None,
             exclude: set[str] | None = None, min_duration_us: float = 0.0, rank_label: str = "") -> list[dict]:
    lo, hi = window.bounds(trace)
    groups: dict[str, dict] = {}
    shape_texts: dict[int, str] = {}  # str() of each op's input dims, once per distinct list (ops share them)
    total = 0.0
    cpu_ops = trace.cpu_ops
    for kernel in trace.kernels:
        if not (lo <= kernel.ts <= hi):
            continue
        total += kernel.dur
        op = cpu_ops[kernel.op] if kernel.op is not None else None
        label = category(kernel.name, kernel.kind, op.name if op else None)
        if (include and label not in include) or (exclude and label in exclude):
            continue
        group = groups.get(kernel.name)
        if group is None:
            group = groups[kernel.name] = {"calls": 0, "total": 0.0, "shapes": Counter(), "ops": Counter(),
                                           "category": label}
        group["calls"] += 1
        group["total"] += kernel.dur
        if op is not None:
            group["ops"][op.name] += 1
            dims = op.input_dims
            if dims is not None:
                text = shape_texts.get(id(dims))
                if text is None:
                    text = shape_texts[id(dims)] = str(dims)
                group["shapes"][text] += 1
        elif kernel.python is not None:
            group["ops"][f"python: {trace.python_calls[kernel.python].name}"] += 1
        elif kernel.launch is not None:  # outside any op and any Python function: the launch and the kernel
            group["ops"][f"{trace.launches[kernel.launch].name}->{normalize(kernel.name)}"] += 1
    rows = []
    for name, g in groups.items():
        avg = g["total"] / g["calls"]
        if avg < min_duration_us:
            continue
        rows.append({
            "Name": name, "Calls": g["calls"], "Self CUDA total (us)": round(g["total"], 3),
            "Avg time (us)": round(avg, 3), "% Total": round(100 * g["total"] / total, 3) if total else 0.0,
            "Input Shapes": g["shapes"].most_common(1)[0][0] if g["shapes"] else "",
            "Normalized Name": normalize(name), "Category": g["category"],
            "CPU Op": g["ops"].most_common(1)[0][0] if g["ops"] else "", "Rank": rank_label,
        })
    rows.sort(key=lambda r: -r["Self CUDA total (us)"])
    return rows[:top_k] if top_k else rows


def window_total_us(trace: Trace, window: Window) -> float:
    lo, hi = window.bounds(trace)
    return sum(k.dur for k in trace.kernels if lo <= k.ts <= hi)
