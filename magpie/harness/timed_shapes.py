"""What a kernel's timings measure (`timing.shapes`) and one timing result from a measurement of
each timed shape.

A timing depends on the first spec testcase (its spec, reference, inputs and tolerances), the
seed, the entry point and the shapes it times; not on the testcase's other shapes, its trials or
the other testcases, which only correctness reads. `timed_selection` is that part of the
manifest: a timing task is keyed by it (`graph/expand.resolved_settings`) and times exactly
what it names (`timed_cases`), so adding a shape to be checked re-runs the correctness steps
and no timing.

Several shapes: each is measured as one shape is (its own warm-up, rounds, checks and verdict:
the correctness gate, the noise, a busy machine's inconclusive), one after the other in the
same job; the result is the first shape's in the keys it always had, each shape's in `shapes`,
and `shapes_summary`, their speedups' geometric mean. Light on imports: the build's own process
computes the selection.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from magpie.errors import UserError

if TYPE_CHECKING:
    from magpie.harness.wire import TimedSelection

# The testcase settings a timing does not read: only correctness checks every shape, trial and held-out shape.
NOT_TIMED = ("shapes", "dtypes", "trials", "held_out_shapes")
SUMMARY_METHOD = (
    "geometric mean of the per-shape speedups; its interval the geometric mean of their bounds (as wide as "
    "if every shape's error moved together, so at least as wide as their mean's own interval)"
)


def timed_selection(kernel_id: str, testcases: list[dict], shapes: list[list[int]] | None) -> dict:
    """The part of a kernel's manifest its timings depend on: the first spec testcase's index and
    settings, its first dtype and the shapes timed (`shapes`, else its first declared shape).
    A timed shape that testcase does not declare is one line (exit 2)."""
    index = next((i for i, tc in enumerate(testcases) if tc.get("spec")), None)
    if index is None:
        if shapes:
            raise UserError(
                f"magpie.toml: kernel {kernel_id}: timing.shapes needs a spec testcase to time on; "
                f"it has none (add one with those shapes, or leave timing.shapes out)"
            )
        return {"testcase": None}
    testcase = testcases[index]
    declared = [list(shape) for shape in testcase.get("shapes", [])]
    chosen: list[list[int]] = []
    for shape in [list(s) for s in shapes] if shapes else declared[:1]:
        if shape not in declared:
            raise UserError(
                f"magpie.toml: kernel {kernel_id}: timing.shapes {shape} is not a shape of its first spec "
                f"testcase ({testcase['spec']}: {declared}): add it to that testcase's shapes, or leave it out "
                f"of timing.shapes"
            )
        if shape not in chosen:
            chosen.append(shape)
    dtypes = testcase.get("dtypes") or []
    return {
        "testcase": index,
        "settings": {key: value for key, value in testcase.items() if key not in NOT_TIMED},
        "dtype": dtypes[0] if dtypes else None,
        "shapes": chosen,
    }


def timed_cases(cases: list, selection: TimedSelection | None) -> list:
    """The cases (one trial each) a timing measures, in the order `timing.shapes` names them: a
    KernelBench problem's one case; else each selected shape in the first dtype."""
    if not cases:
        return []
    if not selection or not selection.shapes or cases[0].shape is None:
        return cases[:1]
    by_shape = {
        tuple(case.shape): case for case in reversed(cases) if case.dtype == selection.dtype and case.trial == 0
    }
    chosen = [by_shape[tuple(shape)] for shape in selection.shapes if tuple(shape) in by_shape]
    return chosen or cases[:1]


def baseline_for_case(own: dict, label: str) -> dict:
    """What the baseline's own timing measured on this case (the first shape's at the top of `own`,
    the others' in `own["shapes"]`), for the checks and reuse that need the same case; {} if none."""
    if not own or own.get("shape") == label:
        return own
    measured = (own.get("shapes") or {}).get(label)
    return {**measured, "this_build": own.get("this_build")} if measured else {}


def shape_entry(label: str, result: dict) -> dict:
    """One timed shape's part of a timing result."""
    return {
        "shape": label,
        "performance_state": result.get("performance_state"),
        "performance_result": result.get("performance_result"),
        "baseline_result": result.get("baseline_result"),
        "speedup": result.get("speedup"),
        "timing_method": result.get("timing_method"),
        "errors": list(result.get("errors", [])),
    }


def combined(measured: list[tuple[str, dict]]) -> dict:
    """One timing result from a result per timed shape (label, result), in order: the first
    shape's keys as one shape's result has them; the state the worst of theirs (FAILED, then
    INCONCLUSIVE, then SKIPPED); errors, warnings, failures and flags of every shape (each line
    led by its shape where there are several); `shapes` and, for a candidate with several shapes,
    `shapes_summary`, whose numbers are `speedup` (what ranks it) where every shape has one."""
    label, first = measured[0]
    result = dict(first)
    result["shapes"] = [shape_entry(label, one) for label, one in measured]
    result["shapes_summary"] = None
    if len(measured) == 1:
        return result
    states = [one.get("performance_state") for _, one in measured]
    for state in ("FAILED", "INCONCLUSIVE", "SKIPPED"):
        if state in states:
            result["performance_state"] = state
            break
    for key in ("errors", "warnings"):
        result[key] = [f"{label}: {line}" for label, one in measured for line in one.get(key, [])]
    for key in ("failures", "flags"):
        result[key] = [record for _, one in measured for record in one.get(key, [])]
    summary = shapes_summary(result["shapes"])
    result["shapes_summary"] = summary
    if summary is not None and summary["value"] is not None:
        result["speedup"] = {key: summary[key] for key in ("value", "ci_low", "ci_high", "verdict", "method", "shapes")}
    return result


def shapes_summary(entries: list[dict]) -> dict | None:
    """Several shapes' speedups in one: their geometric mean and the geometric mean of their
    bounds; "inconclusive" (no numbers) where any shape's timing is; None where a shape has no
    speedup otherwise (a baseline's own timing, or a shape not timed or failed)."""
    if any(entry["performance_state"] == "INCONCLUSIVE" for entry in entries):
        return {
            "value": None,
            "ci_low": None,
            "ci_high": None,
            "verdict": "inconclusive",
            "method": SUMMARY_METHOD,
            "shapes": len(entries),
        }
    speedups = [entry["speedup"] for entry in entries]
    if any(not speedup or speedup.get("value") is None for speedup in speedups):
        return None
    from magpie.compare.stats import speedup_verdict

    value, low, high = (geometric_mean([s[key] for s in speedups]) for key in ("value", "ci_low", "ci_high"))
    return {
        "value": value,
        "ci_low": low,
        "ci_high": high,
        "verdict": speedup_verdict(low, high),
        "method": SUMMARY_METHOD,
        "shapes": len(entries),
    }


def geometric_mean(values: list[float]) -> float:
    return math.exp(sum(math.log(v) for v in values) / len(values))
