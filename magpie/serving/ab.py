"""The A/B that proves a kernel inside the workload: the `benchmark_ab` rule's action (rules/serving_ab.toml).

A `[[benchmark]]` with `use = { KERNEL = "best" | IMPL }` is run without (A) and with (B) the implementation put
into the served model (`replacement`): two local servers of one engine and model, A on the benchmark's port and B
on the next, each started once and kept (serving.lifecycle) while `ab.pairs` interleaved pairs of whole runs
(A, B, A, B, ...) under the same load go through them, so drift of the machine reaches both sides alike. Then:

- the change per metric (throughput, TTFT, TPOT, E2E latency: each run's value, medians of its requests for the
  latencies): the ratio B/A with a paired interval, the block bootstrap over the pairs that magpie's timing uses
  for its rounds (`compare.stats.bootstrap_speedup`, few-rounds t correction), "within noise" where it holds 1;
- the Amdahl prediction from the kernel's micro-benchmark speedup (its comparison's paired speedup) and its share
  of the workload's time, where a trace analysis of this benchmark gives that share ("no trace" otherwise);
- the output-equivalence gate: greedy generations (temperature 0, `ab.gate_max_tokens`) of `ab.gate_prompts`
  fixed prompts from both servers must be the same text, A's own asked twice so an engine that is not repeatable
  is told apart from a replacement that changes the outputs; otherwise the claim is refused with the reason.

The claim (`claim`): "win", "within noise", "regression" or "refused: ...". Files: `ab_report.json`, each run's
folder under `runs/` (`01_A`, `01_B`, ...), the hook under `hook/`. A replacement that cannot be put in
("best" with no winner, an incorrect implementation, a target that does not exist) fails the task in one line.
"""

from __future__ import annotations

import hashlib
import json
import math
import urllib.request
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict

from magpie.serving.replacement import Replacement, ReplacementError

REPORT = "ab_report.json"
# metric -> (where in a run's report, whether higher is better)
METRICS = {
    "output_throughput": (("throughput", "output_throughput"), True),
    "request_throughput": (("throughput", "request_throughput"), True),
    "ttft_median_ms": (("latency", "ttft", "median"), False),
    "tpot_median_ms": (("latency", "tpot", "median"), False),
    "e2el_median_ms": (("latency", "e2el", "median"), False),
}


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class MetricChange(_Strict):
    a: list[float | None]
    b: list[float | None]
    ratio: float | None  # median(B) / median(A)
    ci_low: float | None
    ci_high: float | None
    change_percent: float | None
    verdict: Literal["better", "worse", "within noise", "unmeasured"]
    higher_is_better: bool


class Gate(_Strict):
    criterion: str
    prompts: int
    max_tokens: int
    matched: int
    passed: bool
    reference_repeatable: bool
    mismatches: list[dict[str, Any]]


class Amdahl(_Strict):
    kernel_speedup: float | None
    kernel_share: float | None
    predicted_speedup: float | None
    reason: str


class ABReport(_Strict):
    benchmark: str
    pairs: int
    order: list[str]
    replacements: list[dict[str, Any]]
    metrics: dict[str, MetricChange]
    amdahl: dict[str, Amdahl]
    gate: Gate
    claim: str
    runs: list[str]


class ABFailed(RuntimeError):
    """The A/B could not run; the message is one line."""


def resolve(bench: dict, replacing: dict, comparisons: dict[str, dict], inputs: dict, root: Path) -> list[Replacement]:
    """The implementations `use` puts in, each from its kernel's comparison: the winner for "best", else the one
    named; never one whose correctness verdict is not SUCCESS."""
    out = []
    for kernel, chosen in bench["use"].items():
        comparison = comparisons.get(f"comparison:{kernel}")
        if comparison is None:
            raise ReplacementError(f"use = {{ {kernel} = {chosen!r} }}: kernel {kernel!r} has no comparison")
        rows = {row["implementation"]: row for row in comparison["results"]}
        impl = comparison.get("best") if chosen == "best" else chosen
        if impl is None:
            raise ReplacementError(
                f'use = {{ {kernel} = "best" }}: the comparison of {kernel!r} has no winner (no correct '
                f"implementation faster than its baseline beyond noise), so nothing is put in; name an "
                f"implementation to measure it anyway"
            )
        row = rows.get(impl)
        state = row["correctness_state"] if row else "SKIPPED"
        if state != "SUCCESS":
            why = (row or {}).get("verdict") or "not judged"
            raise ReplacementError(
                f"use = {{ {kernel} = {chosen!r} }}: {kernel}/{impl} is not correct ({state}: {why}); "
                f"an implementation that fails its correctness check is never put in"
            )
        source = replacing[kernel]["sources"][impl]
        digest = inputs.get(source) or hashlib.sha256((root / source).read_bytes()).hexdigest()
        speedup = None if row["is_baseline"] else row.get("speedup")
        out.append(
            Replacement(
                kernel=kernel,
                implementation=impl,
                chosen_by="best" if chosen == "best" else "named",
                target=replacing[kernel]["target"],
                function=replacing[kernel]["function"],
                source_name=source,
                source_digest=digest,
                correctness_state=state,
                speedup=speedup,
            )
        )
    return out


def _value(report, path: tuple[str, ...]) -> float | None:
    node: Any = report
    for part in path:
        node = getattr(node, part, None) if node is not None else None
    return float(node) if isinstance(node, (int, float)) and math.isfinite(node) else None


def metric_change(a: list[float | None], b: list[float | None], higher_is_better: bool) -> MetricChange:
    """B against A over the pairs: the ratio of their medians with the paired block bootstrap's interval."""
    from magpie.compare.stats import bootstrap_speedup

    pairs = [(x, y) for x, y in zip(a, b) if x is not None and y is not None and x > 0 and y > 0]
    if len(pairs) < 2:
        return MetricChange(
            a=a,
            b=b,
            ratio=None,
            ci_low=None,
            ci_high=None,
            change_percent=None,
            verdict="unmeasured",
            higher_is_better=higher_is_better,
        )
    # each pair one round of one sample per side: the bootstrap resamples pairs, as timing's resamples rounds
    ratio = bootstrap_speedup(
        [y for _, y in pairs],
        [x for x, _ in pairs],
        baseline_rounds=[1] * len(pairs),
        candidate_rounds=[1] * len(pairs),
    )
    low, high = ratio["ci_low"], ratio["ci_high"]
    if low <= 1.0 <= high:
        verdict = "within noise"
    else:
        verdict = "better" if (low > 1.0) == higher_is_better else "worse"
    return MetricChange(
        a=a,
        b=b,
        ratio=ratio["value"],
        ci_low=low,
        ci_high=high,
        change_percent=(ratio["value"] - 1.0) * 100.0,
        verdict=verdict,
        higher_is_better=higher_is_better,
    )


def amdahl(replacement: Replacement, share: float | None, share_reason: str) -> Amdahl:
    """The end-to-end speedup the kernel's micro-benchmark speedup `s` predicts where it takes the share `f` of
    the workload's time: 1 / ((1 - f) + f / s)."""
    speed = (replacement.speedup or {}).get("value") if replacement.speedup else None
    if speed is None:
        return Amdahl(
            kernel_speedup=None,
            kernel_share=share,
            predicted_speedup=None,
            reason="the implementation is its kernel's baseline: no micro-benchmark speedup",
        )
    if share is None:
        return Amdahl(kernel_speedup=speed, kernel_share=None, predicted_speedup=None, reason=share_reason)
    return Amdahl(
        kernel_speedup=speed,
        kernel_share=share,
        predicted_speedup=1.0 / ((1.0 - share) + share / speed),
        reason="from the kernel's micro-benchmark speedup and its share of the profiled run's kernel time",
    )


def kernel_share(trace_result: dict | None, kernel: str, target: str) -> tuple[float | None, str]:
    """The kernel's share of the workload's GPU kernel time from this benchmark's trace analysis: the `% Total` of
    its top rows (traces/gap.py's) whose kernel name or CPU op holds the kernel's id or the target's class name
    (case and `_` ignored). An unfused norm (pow, mean, rsqrt, mul) names neither: then no share."""
    if trace_result is None:
        return None, "no trace: declare profiler = true on the benchmark for the kernel's share of its time"
    parts = target.replace(":", ".").split(".")
    words = {kernel.lower().replace("_", ""), (parts[-2] if len(parts) > 1 else parts[-1]).lower().replace("_", "")}

    def names(row: dict) -> str:
        return f"{row.get('Name', '')} {row.get('CPU Op', '')}".lower().replace("_", "")

    found = [
        r
        for r in trace_result.get("top_bottlenecks") or []
        if any(w and w in names(r) for w in words) and isinstance(r.get("% Total"), (int, float))
    ]
    if not found:
        return None, f"no top kernel of the profiled run names {kernel!r} or its target's class"
    return sum(r["% Total"] for r in found) / 100.0, ""


def prompts(count: int) -> list[str]:
    """The gate's fixed prompts: words of the load client's built-in vocabulary, the same in every build."""
    from magpie.serving.datasets import vocabulary

    words = vocabulary()
    return [" ".join(words[(i * 37 + j * 11) % len(words)] for j in range(12)) for i in range(count)]


def generate(base_url: str, model: str, prompt: str, max_tokens: int, engine: str, timeout_s: float) -> str:
    """One greedy completion's text (temperature 0, not streamed)."""
    body: dict[str, Any] = {
        "model": model,
        "prompt": prompt,
        "max_tokens": max_tokens,
        "temperature": 0,
        "stream": False,
    }
    if engine == "transformers":  # its own field; it refuses fields outside OpenAI's schema
        body["generation_config"] = json.dumps({"do_sample": False, "max_new_tokens": max_tokens})
    request = urllib.request.Request(
        base_url + "/v1/completions",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=timeout_s) as answer:
        return json.loads(answer.read())["choices"][0]["text"]


def gate(base_a: str, base_b: str, model: str, engine: str, count: int, max_tokens: int, timeout_s: float) -> Gate:
    texts = prompts(count)
    a = [generate(base_a, model, p, max_tokens, engine, timeout_s) for p in texts]
    again = [generate(base_a, model, p, max_tokens, engine, timeout_s) for p in texts]
    b = [generate(base_b, model, p, max_tokens, engine, timeout_s) for p in texts]
    mismatches = []
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            first = next((k for k, (u, v) in enumerate(zip(x, y)) if u != v), min(len(x), len(y)))
            mismatches.append({"prompt": i, "first_difference_at": first, "without": x, "with": y})
    repeatable = a == again
    return Gate(
        criterion="exact text of greedy generations (temperature 0) with and without the replacement",
        prompts=count,
        max_tokens=max_tokens,
        matched=count - len(mismatches),
        passed=repeatable and not mismatches,
        reference_repeatable=repeatable,
        mismatches=mismatches,
    )


def claim(metrics: dict[str, MetricChange], gate_result: Gate) -> str:
    if not gate_result.reference_repeatable:
        return "refused: the engine's greedy outputs without the replacement differ between two asks"
    if not gate_result.passed:
        return (
            f"refused: the output-equivalence gate failed ({len(gate_result.mismatches)} of {gate_result.prompts} "
            f"greedy generations differ with the replacement)"
        )
    verdict = metrics["output_throughput"].verdict
    return {"better": "win", "worse": "regression"}.get(verdict, verdict)


def ab_rule(job, out_dir: Path) -> dict:
    """The `benchmark_ab` rule: the A/B of a benchmark with `use`, into `ab_report.json`."""
    from magpie.serving import engines
    from magpie.serving.build_rule import config_of
    from magpie.serving.lifecycle import stop_kept
    from magpie.serving.replacement import check_targets, hook_environment, write_hook
    from magpie.serving.runner import run_benchmark

    params = job.spec.params
    bench, root = params["benchmark"], Path(params["root"])
    where = f"benchmark {bench['id']!r} A/B"
    try:
        chosen = resolve(bench, params["replacing"], job.dep_results, job.spec.parts.get("inputs", {}), root)
        hook = write_hook(out_dir / "hook", chosen, root, params.get("snapshots"))
        engine = engines.get(bench["engine"])
        # before any run: a target that is not there fails the A/B before a request is sent
        check_targets(hook, engine.python(), hook_environment(hook, dict(bench["env"])), bench["timeout_s"])
    except ReplacementError as err:
        raise ABFailed(f"{where}: {err}") from None
    port_a = bench["port"] or engine.default_port
    sides = {"A": {"port": port_a}, "B": {"port": port_a + 1}}
    order: list[str] = []
    runs: dict[str, list] = {"A": [], "B": []}
    pids: dict[str, set[int]] = {"A": set(), "B": set()}
    folders = []
    try:
        for pair in range(1, bench["ab"]["pairs"] + 1):
            for side in ("A", "B"):
                folder = out_dir / "runs" / f"{pair:02d}_{side}"
                config = config_of(bench, root, folder).model_copy(
                    update={"port": sides[side]["port"], "server_lifecycle": "reuse"}
                )
                if side == "B":
                    config = config.model_copy(
                        update={
                            "env": hook_environment(hook, config.env),
                            "replacement_hook": str(hook),
                            "replacements": chosen,
                        }
                    )
                report = run_benchmark(config, analyse=False, project=str(root))
                if report.server is not None and report.server.pid is not None:
                    pids[side].add(report.server.pid)
                if not report.success:
                    first = report.errors[0] if report.errors else "no request completed"
                    raise ABFailed(
                        f"{where}: run {pair} {'with' if side == 'B' else 'without'} the replacement failed: {first}"
                    )
                order.append(side)
                runs[side].append(report)
                folders.append(folder.relative_to(out_dir).as_posix())
        model = runs["A"][0].config.model if runs["A"][0].config is not None else bench["model"]
        base = {s: f"http://{bench['host']}:{sides[s]['port']}" for s in sides}
        try:
            gate_result = gate(
                base["A"],
                base["B"],
                model,
                bench["engine"],
                bench["ab"]["gate_prompts"],
                bench["ab"]["gate_max_tokens"],
                bench["timeout_s"],
            )
        except (OSError, ValueError, KeyError) as err:
            raise ABFailed(f"{where}: the output-equivalence gate's requests failed: {err}") from None
    finally:
        for side in sides:
            stop_kept(bench["host"], sides[side]["port"], pids[side])
    metrics = {
        name: metric_change([_value(r, path) for r in runs["A"]], [_value(r, path) for r in runs["B"]], higher)
        for name, (path, higher) in METRICS.items()
    }
    trace = job.dep_results.get(f"benchmark_trace_analysis:{bench['id']}")
    predictions = {}
    for r in chosen:
        share, reason = kernel_share(trace, r.kernel, r.target)
        predictions[r.kernel] = amdahl(r, share, reason)
    provenance = runs["B"][-1].provenance
    report = ABReport(
        benchmark=bench["id"],
        pairs=bench["ab"]["pairs"],
        order=order,
        replacements=provenance.replacements if provenance is not None else [],
        metrics=metrics,
        amdahl=predictions,
        gate=gate_result,
        claim=claim(metrics, gate_result),
        runs=folders,
    )
    (out_dir / REPORT).write_text(report.model_dump_json(indent=1) + "\n")
    return {
        "state": "SUCCESS",
        "benchmark": bench["id"],
        "claim": report.claim,
        "replacements": [r.model_dump(mode="json") for r in chosen],
        "metrics": {
            name: {k: getattr(m, k) for k in ("ratio", "ci_low", "ci_high", "verdict")} for name, m in metrics.items()
        },
        "gate": {"passed": gate_result.passed, "matched": gate_result.matched, "prompts": gate_result.prompts},
        "amdahl": {k: v.model_dump() for k, v in predictions.items()},
        "files": [REPORT],
        "errors": [],
    }
