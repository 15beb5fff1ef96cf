"""Steps and stages of a serving trace (analysis mode `inference`).

A step is one engine iteration; its stage is prefill, decode or prefilldecode (a mixed batch).
Steps come from the engine's own step annotations where it writes them, a format per engine
in STEP_FORMATS; where there are none, from the repeating structure of the call tree: the
top-level CPU ops of the launching thread repeat once per model forward, and a step's token
count (the rows of its largest GEMM) tells prefill (many tokens per sequence) from decode.
Each kernel is assigned to the step that launched it, so each stage can be analysed alone.
"""

from __future__ import annotations

import bisect
import dataclasses
import math
import re
from collections import Counter
from dataclasses import dataclass, field

from magpie.traces.ingest import Trace
from magpie.traces.steady import MIN_STEPS

STAGES = ("prefill", "decode", "prefilldecode")


@dataclass
class Step:
    name: str
    stage: str
    start: float  # µs; GPU-side where the trace has GPU annotations
    end: float
    detail: dict = field(default_factory=dict)


def _vllm(match: re.Match) -> tuple[str | None, dict]:
    context_reqs, context_tokens, generation_reqs, generation_tokens = (int(g) for g in match.groups())
    detail = {
        "context_requests": context_reqs,
        "context_tokens": context_tokens,
        "generation_requests": generation_reqs,
        "generation_tokens": generation_tokens,
    }
    if context_reqs and generation_reqs:
        return "prefilldecode", detail
    if context_reqs:
        return "prefill", detail
    return ("decode" if generation_reqs else None), detail


def _keyword(match: re.Match) -> tuple[str | None, dict]:
    word = match.group(1).lower()
    stage = {"prefill": "prefill", "extend": "prefill", "decode": "decode", "mixed": "prefilldecode"}.get(word)
    return ("prefilldecode" if "decode" in word and "prefill" in word else stage), {}


# name -> (pattern over an annotation's name, its stage). vLLM's model runner writes
# execute_context_<requests>(<tokens>)_generation_<requests>(<tokens>) around each step.
# Other engines (SGLang's EXTEND/DECODE/MIXED forward modes, ATOM, hand-written profiling)
# are read from a stage word beside a step number; not checked against their own traces.
STEP_FORMATS = {
    "vllm": (re.compile(r"^execute_context_(\d+)\((\d+)\)_generation_(\d+)\((\d+)\)$"), _vllm),
    "stage word": (
        re.compile(r"(?i)^(?=.*\d)(?:.*[^a-z])?(prefill_?decode|prefill|extend|decode|mixed)(?:[^a-z]|$)"),
        _keyword,
    ),
}


def split_steps(trace: Trace) -> tuple[list[Step], dict]:
    """The trace's steps in time order, and how they were found."""
    spans = trace.gpu_annotations or trace.annotations
    side = "gpu annotations" if trace.gpu_annotations else "cpu annotations"
    for format_name, (pattern, classify) in STEP_FORMATS.items():
        steps = []
        for name, ts, dur in spans:
            match = pattern.search(name)
            if match:
                stage, detail = classify(match)
                if stage:
                    steps.append(Step(name, stage, ts, ts + dur, detail))
        if steps:
            steps.sort(key=lambda s: s.start)
            return steps, {
                "method": "annotations",
                "format": format_name,
                "source": side,
                "reason": f"{len(steps)} step annotations in {format_name} format from the {side}",
            }
    return repeated_steps(trace)


def repeated_steps(trace: Trace) -> tuple[list[Step], dict]:
    """Steps from the call tree: the launching thread's top-level ops split at the op that
    starts each repetition; a step's stage from its token count."""
    launching = Counter(
        (trace.launches[k.launch].pid, trace.launches[k.launch].tid) for k in trace.kernels if k.launch is not None
    )
    if not launching:
        return [], {"method": "call tree", "reason": "no kernel is linked to a launching thread"}
    thread = launching.most_common(1)[0][0]
    top = _top_level([op for op in trace.cpu_ops if (op.pid, op.tid) == thread])
    names = [op.name for op in top]
    anchor, starts = _anchor(names)
    if anchor is None:
        return [], {
            "method": "call tree",
            "reason": f"no top-level op repeats at least {MIN_STEPS} times in a "
            "regular pattern on the launching thread",
        }
    bounds = [top[i].ts for i in starts] + [math.inf]
    members: list[list] = [[] for _ in starts]
    for kernel in trace.kernels:
        if kernel.launch is None or (trace.launches[kernel.launch].pid, trace.launches[kernel.launch].tid) != thread:
            continue
        at = bisect.bisect_right(bounds, trace.launches[kernel.launch].ts) - 1
        if 0 <= at < len(members):
            members[at].append(kernel)
    tokens = [_gemm_rows(trace, kernels) for kernels in members]
    fewest = min((t for t in tokens if t), default=0)
    warnings = []
    if len({t for t in tokens if t}) <= 1:
        warnings.append(
            f"every step has the same token count ({fewest} GEMM rows): prefill cannot be told from "
            "decode; all taken as decode"
        )
    steps = []
    for i, kernels in enumerate(members):
        if not kernels:
            continue
        stage = "prefill" if tokens[i] > fewest else "decode"
        steps.append(
            Step(
                f"{anchor} #{i}",
                stage,
                min(k.ts for k in kernels),
                max(k.ts + k.dur for k in kernels),
                {"gemm_rows": tokens[i]},
            )
        )
    return steps, {
        "method": "call tree",
        "anchor": anchor,
        "source": "top-level cpu ops of the launching thread",
        "reason": f"{len(steps)} repetitions of the top-level op sequence starting at {anchor!r}; steps "
        f"whose largest GEMM has {fewest} rows (the fewest) taken as decode, the others as "
        "prefill (a mixed batch cannot be told from a prefill without annotations)",
        "warnings": warnings,
    }


def _top_level(ops: list) -> list:
    ops = sorted(ops, key=lambda op: (op.ts, -op.dur))
    top, end = [], -math.inf
    for op in ops:
        if op.ts >= end:
            top.append(op)
            end = op.ts + op.dur
    return top


def _anchor(names: list[str]) -> tuple[str | None, list[int]]:
    """The op that starts each repetition. Ops that run once per model forward share one
    count (embedding, rotary tables, the last norm, argmax...): the count shared by the most
    op names whose occurrences cut the sequence into mostly identical chunks; of those ops,
    the one seen first. Per-layer ops repeat more often, one-off ops too rarely to share a count."""
    positions: dict[str, list[int]] = {}
    for i, name in enumerate(names):
        positions.setdefault(name, []).append(i)
    regular: dict[int, list[str]] = {}
    for name, where in positions.items():
        if len(where) < MIN_STEPS:
            continue
        chunks = Counter(tuple(names[a:b]) for a, b in zip(where, where[1:]))
        if chunks.most_common(1)[0][1] >= max(MIN_STEPS - 1, (len(where) - 1) / 2):
            regular.setdefault(len(where), []).append(name)
    shared = [(len(group), -count, count) for count, group in regular.items() if len(group) >= 2]
    if not shared:
        return None, []
    count = max(shared)[2]
    anchor = min(regular[count], key=lambda n: positions[n][0])
    return anchor, positions[anchor]


def _gemm_rows(trace: Trace, kernels: list) -> int:
    """Rows (tokens) of the largest GEMM the step's kernels were launched by."""
    rows = 0
    for kernel in kernels:
        op = trace.cpu_ops[kernel.op] if kernel.op is not None else None
        if op is None or not op.input_dims or op.name not in GEMM_ROWS:
            continue
        dims = op.input_dims[GEMM_ROWS[op.name]]
        if isinstance(dims, list) and len(dims) >= 2 and all(isinstance(d, int) for d in dims):
            rows = max(rows, math.prod(dims[:-1]))
    return rows


# Projections only: a batched matmul's rows are heads or rotary tables, not tokens.
GEMM_ROWS = {"aten::linear": 0, "aten::mm": 0, "aten::addmm": 1}


def stage_traces(trace: Trace, steps: list[Step]) -> dict[str, tuple[Trace, list[tuple[float, float]], dict]]:
    """Per stage: a view of the trace holding only the GPU work of its steady-state steps, the
    steps' spans, and the pick (with MIN_STEPS or more steps the first and the last are left
    out: warm-up, drain)."""
    views = {}
    for stage in STAGES:
        own = [s for s in steps if s.stage == stage]
        if not own:
            continue
        kept = own[1:-1] if len(own) >= MIN_STEPS else own
        reason = (
            f"{len(own)} {stage} steps; the first and the last left out (warm-up, drain)"
            if len(own) >= MIN_STEPS
            else f"{len(own)} {stage} steps, all kept (fewer than {MIN_STEPS})"
        )
        starts = [s.start for s in kept]
        work = []
        for activity in trace.gpu:
            at = bisect.bisect_right(starts, activity.ts) - 1
            if at >= 0 and activity.ts <= kept[at].end:
                work.append(activity)
        durations = [s.end - s.start for s in kept]
        kernels = [a for a in work if a.kind == "kernel"]
        views[stage] = (
            dataclasses.replace(trace, gpu=work),
            [(s.start, s.end) for s in kept],
            {
                "steps": len(own),
                "kept_steps": len(kept),
                "reason": reason,
                "step_mean_us": sum(durations) / len(durations),
                "kernels": len(kernels),
                "kernel_time_us": sum(k.dur for k in kernels),
            },
        )
    return views
