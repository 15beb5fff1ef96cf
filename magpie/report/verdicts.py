"""What a build's results say, per implementation, in the words a person or a CI job acts on:
the `done` line of each task, the outcome of each implementation (`magpie build --json`), and
what `magpie build --check` fails on.

Plain dicts in, plain dicts out (no pydantic here): the `done` lines are written while a
build runs; the summary is checked against `models.BuildSummary` where it is printed.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

# An implementation's outcome, worst first where several apply: its spec or reference failed
# (not judged), it ran out of time, the machine disturbed its measurement beyond correction,
# it failed (compile, correctness, timing), it was skipped (e.g. a CUDA source on a CPU
# project), or it passed (correct, and timed where it could be).
OUTCOMES = ("not_judged", "timed_out", "inconclusive", "failed", "skipped", "passed")
# The outcomes `--check` fails on (a skipped implementation was never meant to run here).
CHECK_FAILS = ("not_judged", "timed_out", "inconclusive", "failed")
STATES = ("SUCCESS", "FAILED", "SKIPPED")
NOT_JUDGED = "not judged"


def _kinds(result: dict) -> list[str]:
    return [f.get("kind", "") for f in result.get("failures") or []]


def spec_error(result: dict) -> dict | None:
    """The spec error (`{spec, detail}`) a correctness or timing result or a comparison row
    carries, if its spec or reference failed."""
    return result.get("spec_error")


def _inconclusive(result: dict) -> bool:
    """A measurement the machine disturbed beyond correction: a performance state outside
    SUCCESS/FAILED/SKIPPED, or a failure kind that says so."""
    state = result.get("performance_state")
    return (state is not None and state not in STATES) or any("inconclusive" in k for k in _kinds(result))


def outcome(row: dict) -> str:
    """One of OUTCOMES for a comparison row (compare_report.json's `results`)."""
    if spec_error(row) is not None:
        return "not_judged"
    if "timeout" in _kinds(row):
        return "timed_out"
    if _inconclusive(row):
        return "inconclusive"
    if "FAILED" in (row.get("compiling_state"), row.get("correctness_state"), row.get("performance_state")):
        return "failed"
    if row.get("correctness_state") != "SUCCESS":
        return "skipped"
    return "passed"


def speedup_text(speedup: dict | None) -> str:
    """`1.43× faster [1.31, 1.58]`, `baseline`, or "" where there is none."""
    if not speedup:
        return ""
    if speedup.get("verdict") == "baseline":
        return "baseline"
    return f"{speedup['value']:.3g}× {speedup['verdict']} [{speedup['ci_low']:.3g}, {speedup['ci_high']:.3g}]"


def _labelled(label: str, line: str) -> str:
    """`label: line` (`timed out: timeout after 10 s`), unless the line starts with the label
    already (`inconclusive: machine busy: ...` is not prefixed again)."""
    return line if line.startswith(label) else f"{label}: {line}"


def _first_kind(result: dict, otherwise: str) -> str:
    kinds = _kinds(result)
    return kinds[0] if kinds else otherwise


# -- the `done` line of each task -----------------------------------------------------------


def task_line(rule: str, result: dict) -> str:
    """What a finished task found, for its `done` line: e.g. `correct · 1.43× faster [1.31,
    1.58]`, `FAILED allclose`, `not judged: spec error in spec.py`; "" for a task whose result
    carries no verdict (a report, a custom rule's)."""
    if rule == "compile":
        state = result.get("compiling_state")
        return "compiled" if state == "SUCCESS" else f"FAILED {_first_kind(result, 'compile')}" if state else ""
    if rule == "correctness":
        return _correctness_line(result)
    if rule == "timing":
        return _timing_line(result)
    if rule == "comparison":
        return comparison_line(result)
    return ""


def _correctness_line(result: dict) -> str:
    error = spec_error(result)
    if error is not None:
        return f"{NOT_JUDGED}: spec error in {error['spec']}"
    state = result.get("correctness_state")
    if state == "SUCCESS":
        return "correct" if result.get("numerics") == "verified" else f"correct ({result.get('numerics')})"
    if state == "FAILED":
        return f"FAILED {_first_kind(result, 'error')}"
    reason = result.get("verdict", "").removeprefix("skipped: ")
    return f"SKIPPED ({reason})" if reason else "SKIPPED"


def _timing_line(result: dict) -> str:
    error = spec_error(result)
    if error is not None:
        return f"{NOT_JUDGED}: spec error in {error['spec']}"
    if _inconclusive(result):
        return _labelled("inconclusive", next(iter(result.get("errors") or []), "machine busy"))
    state = result.get("performance_state")
    if state == "FAILED":
        return f"FAILED {_first_kind(result, 'error')}"
    if state != "SUCCESS":
        return "not timed"
    perf = result.get("performance_result") or {}
    said = speedup_text(result.get("speedup"))
    median = f"{perf['median_us']:,.2f} µs" if perf.get("median_us") is not None else ""
    if len(result.get("shapes") or []) > 1:  # the speedup their geometric mean, the median the first shape's
        said += f" (geometric mean of {len(result['shapes'])} shapes)" if said else ""
        median += f" on {perf['shape']}" if median and perf.get("shape") else ""
    return " · ".join(part for part in ("correct", said, median) if part)


def comparison_line(report: dict) -> str:
    """A kernel's comparison in a line: how many implementations passed, the best, what failed."""
    rows = report.get("results") or []
    counts: dict[str, list[str]] = {}
    for row in rows:
        counts.setdefault(outcome(row), []).append(row["implementation"])
    parts = [f"{len(counts.get('passed', []))} of {len(rows)} passed"]
    best = next((r for r in rows if r["implementation"] == report.get("best")), None)
    if best is not None:
        parts.append(f"best {best['implementation']} {speedup_text(best.get('speedup'))}")
    for name in OUTCOMES[:-1]:
        if counts.get(name):
            parts.append(f"{name.replace('_', ' ')}: {', '.join(counts[name])}")
    for error in report.get("spec_errors") or []:
        parts.append(f"spec error in {error['spec']}")
    return "; ".join(parts)


# -- the build's summary (--json) and its check (--check) ---------------------------------


def implementation_summary(row: dict, expect_faster: bool) -> dict:
    perf = row.get("performance_result")
    speedup = row.get("speedup")
    said = outcome(row)
    check = None
    if said in CHECK_FAILS:
        # the cause: the first error (what it kept from running follows from it)
        reason = (
            f"spec error in {row['spec_error']['spec']}"
            if said == "not_judged"
            else next(iter(row.get("errors") or []), "") or row.get("verdict") or said
        )
        check = _labelled(said.replace("_", " "), reason)
    elif expect_faster and said == "passed" and (speedup or {}).get("verdict") != "faster":
        check = (
            f"expected faster, measured {speedup_text(speedup)}"
            if speedup
            else "expected faster, but no speedup was measured"
        )
    elif expect_faster and said == "skipped":
        check = f"expected faster, but skipped: {row.get('verdict', '')}"
    return {
        "implementation": row["implementation"],
        "is_baseline": bool(row.get("is_baseline")),
        "outcome": said,
        "compiling_state": row.get("compiling_state", "SKIPPED"),
        "correctness_state": row.get("correctness_state", "SKIPPED"),
        "performance_state": row.get("performance_state", "SKIPPED"),
        "numerics": row.get("numerics", "unverified"),
        "verdict": row.get("verdict", ""),
        "failures": [
            {"kind": f.get("kind"), "stage": f.get("stage"), "detail": f.get("detail")}
            for f in row.get("failures") or []
        ],
        "performance_result": {key: perf.get(key) for key in ("median_us", "p20_us", "p80_us", "n", "shape")}
        if perf
        else None,
        "speedup": {key: speedup.get(key) for key in ("value", "ci_low", "ci_high", "verdict", "baseline_median_us")}
        if speedup
        else None,
        "expect_faster": expect_faster,
        "check": check,
    }


def kernel_summary(report: dict, report_path: str | None, expected_faster: set[str]) -> dict:
    rows = [implementation_summary(row, row["implementation"] in expected_faster) for row in report["results"]]
    return {
        "kernel": report["kernel"],
        "baseline": report.get("baseline"),
        "best": report.get("best"),
        "ranking": list(report.get("ranking") or []),
        "compare_report": report_path,
        "spec_errors": list(report.get("spec_errors") or []),
        "implementations": rows,
    }


def summary(
    *,
    executed: list[str],
    failed: list[tuple[str, str]],
    up_to_date: int,
    comparisons: list[dict],
    reports: dict[str, str] | None,
) -> dict:
    """The build's summary (models.BuildSummary): `comparisons` are kernel_summary()s; the check
    fails on a failed task, a spec error, and an implementation whose `check` says why."""
    problems = [f"task {name} failed: {why}" for name, why in failed]
    for kernel in comparisons:
        problems += [f"{kernel['kernel']}: spec error in {e['spec']}: {e['detail']}" for e in kernel["spec_errors"]]
        problems += [
            f"{kernel['kernel']}/{row['implementation']}: {row['check']}"
            for row in kernel["implementations"]
            if row["check"] and row["outcome"] != "not_judged"
        ]
    return {
        "executed": executed,
        "failed": [name for name, _ in failed],
        "failures": {name: why for name, why in failed},
        "up_to_date": up_to_date,
        "kernels": comparisons,
        "reports": reports,
        "check": {"passed": not problems, "problems": problems},
    }


def relative(path: Path, root: Path) -> str:
    """A path as the project names it: relative to the manifest's folder (no machine's
    absolute paths in what a build prints)."""
    return os.path.relpath(path, root)


def build_summary(
    root: Path,
    store,
    tasks: list[tuple[str, str, str | None, str]],
    expected_faster: set[tuple[str, str]],
    *,
    executed: list[str],
    failed: list[tuple[str, str]],
    up_to_date: int,
    uncompared: Sequence[dict] = (),
) -> dict:
    """The summary of a build over `tasks` ((name, rule, kernel, key) each): the verdicts of
    the kernels whose comparison is stored (read from the store, as a no-op build reads
    nothing else) and of those in `uncompared` (comparisons made here of the results of a
    build that covered some of a kernel's tasks but not its comparison: no report path), the
    published reports' paths, the check. `expected_faster`: the (kernel, implementation) pairs
    declared `expect_faster`."""
    out = store.workspace / "reports"
    kernels, reports = [], None
    for _name, rule, kernel, key in tasks:
        if rule == "comparison" and store.has(key):
            wanted = {impl for k, impl in expected_faster if k == kernel}
            kernels.append(
                kernel_summary(store.read(key), relative(out / kernel / "compare_report.json", root), wanted)
            )
        elif rule == "report" and store.has(key):
            reports = {"html": relative(out / "report.html", root), "summary": relative(out / "summary.md", root)}
    for report in uncompared:
        kernels.append(kernel_summary(report, None, {impl for k, impl in expected_faster if k == report["kernel"]}))
    kernels.sort(key=lambda k: k["kernel"])
    return summary(executed=executed, failed=failed, up_to_date=up_to_date, comparisons=kernels, reports=reports)


def expected_faster_in(manifest: dict) -> set[tuple[str, str]]:
    """(kernel, implementation) of each implementation declared `expect_faster = true`, from
    magpie.toml as parsed (the no-op build reads it so, unvalidated: the snapshot it trusts
    was made from the same file, validated)."""
    pairs = set()
    for kernel in manifest.get("kernel") or []:
        for impl in [kernel.get("baseline") or {}, *(kernel.get("candidates") or [])]:
            if impl.get("expect_faster") is True:
                pairs.add((kernel.get("id"), impl.get("id")))
    return pairs
