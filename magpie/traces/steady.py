"""The steady-state window of a trace: the repeating steps, without the first and the last.

Steps are the annotations (GPU-side where the profiler recorded them, else CPU-side) whose
names differ only by numbers (`step_7_decode`, `iteration_3`, `decode 12`): the most
frequent such family, with at least MIN_STEPS members, is taken as the steady state, its
first member (warm-up, compilation, cache fills) and last (the drain) left out.
"""

from __future__ import annotations

import re
from collections import defaultdict

from magpie.traces.gap import Window
from magpie.traces.ingest import Trace

MIN_STEPS = 4
_NUMBER = re.compile(r"\d+")


def steady_state_window(trace: Trace) -> tuple[Window | None, dict]:
    source = "gpu annotations" if trace.gpu_annotations else "cpu annotations"
    spans = trace.gpu_annotations or trace.annotations
    families: dict[str, list[tuple[float, float]]] = defaultdict(list)
    for name, ts, dur in spans:
        if _NUMBER.search(name):
            families[_NUMBER.sub("N", name)].append((ts, ts + dur))
    if not families:
        return None, {"picked": False, "reason": f"no numbered step annotations among the {source}"}
    family, steps = max(families.items(), key=lambda item: (len(item[1]), sum(e - s for s, e in item[1])))
    if len(steps) < MIN_STEPS:
        return None, {
            "picked": False,
            "reason": f"the most frequent step family {family!r} has only {len(steps)} members (need {MIN_STEPS})",
        }
    steps.sort()
    kept = steps[1:-1]
    durations = [e - s for s, e in kept]
    mean = sum(durations) / len(durations)
    spread = (max(durations) - min(durations)) / mean if mean else 0.0
    return Window(absolute=(kept[0][0], kept[-1][1])), {
        "picked": True,
        "family": family,
        "steps": len(kept),
        "source": source,
        "start_us": kept[0][0],
        "end_us": kept[-1][1],
        "step_mean_us": mean,
        "step_spread": spread,
        "reason": f"{len(steps)} {family!r} steps from the {source}; the first and the last left out "
        f"(warm-up, drain); kept steps vary by {spread:.0%} of their mean",
    }
