"""What a measurement's numbers mean (its record is `harness.rounds.Rounds`): the checks on a
timer's account of itself (wall time, first use, too few samples, host wall gap, roofline
floor, implausible and uneven speedups), the bound calls made alone set on a batch's calls and
a call's floor, the failures a busy machine may have caused, and the paired speedup and its
interval. The timing job (`harness/timing_session.py`) takes the measurements; nothing here
runs code under test or holds a process."""

from __future__ import annotations

import math
from collections.abc import Sequence
from statistics import fmean, median
from typing import TYPE_CHECKING

from magpie.compare.stats import bootstrap_speedup, speedup_verdict

if TYPE_CHECKING:  # rounds.py reads this module's rules
    from magpie.harness.rounds import Rounds

# Samples a role keeps per measurement (`Rounds.kept`): evenly thinned beyond this.
KEPT_SAMPLES = 2000
# What one timing request costs outside the timer: the pipe round trip, reading the input file
# on first use, encoding the samples.
REQUEST_OVERHEAD_MS = 5.0
# A first-use median over FIRST_USE_FACTOR times the measured mean (what a call costs on
# average, uneven work included) and FIRST_USE_MARGIN_US more fails the timing. Honest calls on
# new tensors cost about what calls on rotated ones do, but for the first touch of each new
# tensor: up to ~40 µs more on the CPU for a 6 µs kernel; a lookup of kept results saves the
# whole computation.
FIRST_USE_FACTOR = 2.0
FIRST_USE_MARGIN_US = 100.0
# Fewer samples than this in a round: the kernel is slow for its budget (a note, not a failure).
FEW_SAMPLES_PER_ROUND = 5
# The wall time an honest timer leaves unexplained per call: the timer's own measured cost per
# call (times UNEXPLAINED_ALLOWANCE) for what the candidate's host work adds between calls
# that its events do not see, plus UNEXPLAINED_FRACTION of the median for the device idling
# while the host is held up (in the H200 sweeps, tests/fixtures/h200/timer_sweep*.json, honest
# kernels of 0.3-100 ms left up to 11% of the median beyond the first when their host thread
# shared the CPU with the build's other jobs; graph replays and kernels under 0.3 ms stayed
# within the first). A timer in the implementation's process that under-reports by less goes
# unseen: what this check can promise (docs/security.md).
UNEXPLAINED_ALLOWANCE = 1.0
UNEXPLAINED_FRACTION = 0.25


def request_account(samples_ns: list[int], calls_per_sample: int, costs: dict, mode: str | None) -> dict:
    """What one timing request's wall time should hold, from its samples and what the
    evaluator asked for, priced by the timer's calibrated costs (`timing.calibrate`): the
    calls its samples stand for (a graph-mode sample is one call of a replay of
    `calls_per_sample`) and the timer's own cost per sample and per request.
    `allowance_ns`: what may stay unexplained."""
    cost = costs[mode or next(k for k in costs if k != "host_check_ns")]
    n = len(samples_ns)
    calls = n * calls_per_sample
    explained = (
        sum(samples_ns) * calls_per_sample
        + n * cost["per_sample_ns"]
        + cost["per_request_ns"]
        + REQUEST_OVERHEAD_MS * 1e6
    )
    return {
        "calls": calls,
        "explained_ns": explained,
        "timed_ns": sum(samples_ns) * calls_per_sample,
        "allowance_ns": UNEXPLAINED_ALLOWANCE * n * cost["per_sample_ns"],
    }


def wall_check(wall_s: float, account: dict, median_us: float) -> dict:
    """The summary's cross-check figures: the share of the wall time the samples cover, and
    the time per call that neither they nor the timer's own costs explain, with its limit."""
    calls = max(account["calls"], 1)
    unexplained_us = max(0.0, wall_s * 1e9 - account["explained_ns"]) / calls / 1000
    return {
        "wall_coverage": account["timed_ns"] / 1e9 / wall_s if wall_s > 0 else 0.0,
        "unexplained_us_per_call": unexplained_us,
        "unexplained_limit_us": account["allowance_ns"] / calls / 1000 + UNEXPLAINED_FRACTION * median_us,
    }


def first_use_verdict(samples_ns: list[int], measured_mean_us: float) -> dict:
    """The first-use record: its median against the measurement's mean, and the failing line
    where calls on unseen inputs were far slower than the measured ones."""
    first_us = median(samples_ns) / 1000
    ratio = first_us / measured_mean_us if measured_mean_us > 0 else float("inf")
    line = None
    if first_us > FIRST_USE_FACTOR * measured_mean_us + FIRST_USE_MARGIN_US:
        line = (
            f"calls on {len(samples_ns)} input sets it had not seen took {first_us:.3g} µs (median), {ratio:.2g}x "
            f"its measured mean of {measured_mean_us:.3g} µs: results kept from earlier calls?"
        )
    return {"sets": len(samples_ns), "median_us": first_us, "ratio": ratio, "line": line}


def few_samples(summary: dict, round_sizes: list[int], budget_ms: float) -> str | None:
    """A kernel too slow for its budget is measured on what the budget allows, and says so."""
    if min(round_sizes) >= FEW_SAMPLES_PER_ROUND:
        return None
    return (
        f"{summary['n']} samples of {summary['median_us'] / 1000:.3g} ms in {len(round_sizes)} rounds "
        f"(timing.budget_ms = {budget_ms:g}): the interval is wide; raise budget_ms for a tighter one"
    )


def timer_inconsistency(summary: dict, device: str = "cpu") -> str | None:
    """The in-process timer is checked against the evaluator's own wall clock."""
    if summary.get("early_rounds_ms"):
        return (
            f"timer returned after {summary['early_rounds_ms'][0]:g} ms with fewer samples than its cap, before "
            "its budget had passed: the timer in the implementation's process was replaced"
        )
    if summary["wall_coverage"] > 1.05:
        return (
            f"timer reported {summary['wall_coverage']:.0%} of the wall time the evaluator measured: "
            "the in-process clock was tampered with"
        )
    limit = summary["unexplained_limit_us"]
    if summary["unexplained_us_per_call"] > limit:
        return (
            f"timer inconsistent with the evaluator's wall clock: {summary['unexplained_us_per_call']:.1f} µs "
            f"per call unaccounted for (limit {limit:.1f} µs); samples cover "
            f"{summary['wall_coverage']:.0%} of the wall time"
        )
    return None


def host_wall_gap(summary: dict, host_check_us: float = 0.0) -> str | None:
    """Event time far under host-synchronised wall time: work the events did not see (side
    streams). What a host-synchronised call costs beside its device time (a launch, two
    synchronisations: `host_check_us`, calibrated) is not counted as a gap; a launch-bound
    call (host time over device time) may leave some more, so the gap must also be half the
    event time and 30 µs. Events mode only: a graph replay holds every stream its calls used
    (work left on a stream the capture did not join fails the capture, and the timing falls
    back to events), and what a sub-10 µs call's host wall adds is its launch, not hidden work
    (Triton's launcher alone: 40-90 µs against 1-5 µs replays in the H200 sweep)."""
    wall = (summary.get("timer_info") or {}).get("host_wall_median_us")
    if wall is None or summary["timer_info"].get("mode") != "events":
        return None
    gap = wall - host_check_us - summary["median_us"]
    if gap >= 0.5 * summary["median_us"] and gap > 30:
        return (
            f"host-synchronised wall time {wall:.1f} µs is {wall / summary['median_us']:.1f}x the event time "
            f"{summary['median_us']:.1f} µs: work outside the timed stream?"
        )
    return None


# The roofline floor's tolerance. The floor is the time moving the bytes once at peak
# bandwidth takes: the datasheet's peak, which kernels reach 85-93% of, so an honest time lies
# well above that floor; or the peak `magpie calibrate` measured (roofline/specs.py puts it in
# the datasheet's place), what one copy kernel reached, which another access pattern may beat
# by a few percent. 10% under either, and a CUDA event's resolution (about 0.5 µs) under that,
# is no honest measurement.
FLOOR_TOLERANCE = 0.9
EVENT_RESOLUTION_US = 0.5


def roofline_floor(
    median_us: float,
    min_bytes: int,
    peak_tbps: float,
    device_name: str,
    *,
    cached_bytes: int = 0,
    measured: bool = False,
) -> tuple[str, str] | None:
    """A median under the time moving `min_bytes` once at `peak_tbps` takes: ("impossible",
    line) where it is under that floor less what the L2 may have held (`cached_bytes`) and
    the tolerance above; ("flag", line) where only those allowances explain it; else None."""
    if not min_bytes or peak_tbps <= 0:
        return None
    floor_us = min_bytes / (peak_tbps * 1e12) * 1e6
    if median_us >= floor_us:
        return None
    must_move = max(0, min_bytes - cached_bytes)
    hbm_us = must_move / (peak_tbps * 1e12) * 1e6
    peak = f"{peak_tbps:g} TB/s ({device_name}{', measured by magpie calibrate' if measured else ''})"
    if median_us < FLOOR_TOLERANCE * hbm_us - EVENT_RESOLUTION_US:
        moved = f"its {min_bytes / 1e6:.1f} MB of inputs and outputs"
        if must_move < min_bytes:
            moved = f"{must_move / 1e6:.1f} MB of {moved} (the L2 may hold the rest)"
        return "impossible", f"{median_us:.2f} µs is below the {hbm_us:.2f} µs it takes to move {moved} once at {peak}"
    return "flag", (
        f"faster than the memory roofline floor: {median_us:.2f} µs < {floor_us:.2f} µs to move "
        f"{min_bytes / 1e6:.1f} MB at {peak}; the L2 may hold up to {cached_bytes / 1e6:.1f} MB of it, "
        "check the measurement"
    )


def implausible_speedup(first: dict, second: dict, threshold: float) -> tuple[dict, str]:
    """A speedup above `threshold` (`first`) and its re-timing on fresh inputs (`second`):
    the label for `speedup["implausible"]` and the line that says it. Confirmed when the
    second is above the threshold too, or its interval meets the first's (the same speedup
    within the noise of the two); otherwise not reproducible. Meeting intervals, not the first
    estimate inside the second's interval: two honest measurements' estimates each fall
    outside the other's 95% interval about one time in six, their intervals miss each other
    about one time in 180."""
    meet = second["ci_low"] <= first["ci_high"] and first["ci_low"] <= second["ci_high"]
    confirmed = second["value"] > threshold or meet
    label = {
        "threshold": threshold,
        "retimed": second["value"],
        "retimed_ci_low": second["ci_low"],
        "retimed_ci_high": second["ci_high"],
        "confirmed": confirmed,
    }
    if confirmed:
        line = (
            f"speedup {_times(first['value'])} is above the implausible_speedup threshold of {threshold:g}x; "
            f"re-timed on fresh inputs: {_times(second['value'])} "
            f"[{second['ci_low']:.3g}, {second['ci_high']:.3g}], confirmed: check the baseline"
        )
    else:
        line = (
            f"speedup not reproducible: {_times(first['value'])} then {_times(second['value'])} "
            f"(re-timed on fresh inputs, being above the implausible_speedup threshold of {threshold:g}x; "
            f"intervals [{first['ci_low']:.3g}, {first['ci_high']:.3g}] and "
            f"[{second['ci_low']:.3g}, {second['ci_high']:.3g}] do not meet)"
        )
    return label, line


def _times(value: float) -> str:
    return f"{value:.3g}x"


# Per-call times whose mean is more than this many times their median are uneven: the median
# then says little of what the calls cost (a candidate that does all its work in one call of
# every four, computing ahead for the input sets to come or sleeping on some calls only, keeps
# its total honest and its median tiny), and the comparison uses means, whose sum the
# evaluator's wall clock vouches for (`timer_inconsistency`). Honest kernels stay well under
# it: their tails (clock changes, interrupts, an allocator call, a preempted host thread) put
# the mean at 1.0-1.3x the median; the H200 softmax comparison (tests/fixtures/h200/
# compare_report_softmax.json, 2000 samples per role, events with the L2 flushed) shows
# 1.0004-1.0085 (the other H200 fixtures keep medians only). Under the factor a median is at
# least half the mean: uneven calls gain at most that factor over a ranking by means.
UNEVEN_CALLS_FACTOR = 2.0


def uneven_calls(mean_us: float, median_us: float) -> bool:
    """Per-call times whose mean is over UNEVEN_CALLS_FACTOR times their median."""
    return mean_us > UNEVEN_CALLS_FACTOR * median_us


def uneven_line(mean_us: float, median_us: float, paired: bool) -> str:
    consequence = "ranked by means" if paired else "the median understates what a call costs"
    return f"per-call times uneven (mean {mean_us:.3g} µs, median {median_us:.3g} µs): {consequence}"


_INTERVAL = (
    "block bootstrap over the rounds (paired), few-rounds t correction, centred on the estimate, "
    "widened by the spread between runs (timing.between_runs)"
)
SPEEDUP_METHOD = f"median(baseline)/median(candidate) over all samples, timed in interleaved rounds; {_INTERVAL}"
SPEEDUP_METHOD_MEAN = (
    "mean(baseline)/mean(candidate) over all samples (per-call times uneven: mean over "
    f"{UNEVEN_CALLS_FACTOR:g}x the median), timed in interleaved rounds; {_INTERVAL}"
)


# How much a speedup varies between runs of one comparison (a relative standard deviation),
# where the manifest does not say (`timing.between_runs`): bench/interval_coverage.py, 10
# repeats of the 8-candidate Triton compare. On an H200 the log speedups spread 0.9% between
# runs, a run's own intervals 0.1-0.5%. On the 2-core CPU VM (a 10 µs baseline, interpreted
# Triton candidates) they spread 4.6-8.5% (6.5% pooled): with 1% the intervals held the other
# runs' median in 50 of 80 cases, with 6.5% in 78.
DEFAULT_BETWEEN_RUNS = {"gpu": 0.01, "cpu": 0.065}
# How far the baseline may read from its own timing job beside a candidate before that
# measurement is taken again (`timing.disturbed_fraction`): over 80 jobs of 10 H200 builds it
# read at most 3% apart (median 0.3%) where one disturbed job read 67% apart; over 240 jobs on
# the 2-core CPU machine a 10 µs baseline read up to 23.5% apart (95th percentile 14%), and 10%
# took the measurement again in 3-4 of 6 builds there.
DEFAULT_DISTURBED_FRACTION = {"gpu": 0.10, "cpu": 0.25}


def for_device(configured: float | None, defaults: dict[str, float], device: str) -> float:
    """A timing setting the manifest may give: its value, else the default of the device's kind."""
    return float(configured) if configured is not None else defaults["cpu" if device == "cpu" else "gpu"]


def paired_speedup(kept: dict, baseline_median_us: float, statistic: str = "median", between_runs: float = 0.0) -> dict:
    """The speedup of one measurement, from its samples (ns) and their rounds: the kept ones
    for the median, every one for the mean (`Rounds.for_speedup`)."""
    (base, base_rounds), (cand, cand_rounds) = kept["baseline"], kept["candidate"]
    return {
        **bootstrap_speedup(
            [s / 1000 for s in base],
            [s / 1000 for s in cand],
            baseline_rounds=base_rounds,
            candidate_rounds=cand_rounds,
            statistic=statistic,
            between_runs=between_runs,
        ),
        "baseline_median_us": baseline_median_us,
        "method": SPEEDUP_METHOD_MEAN if statistic == "mean" else SPEEDUP_METHOD,
    }


# A vouched round's calls made alone (`alone_bound`), beside its batches: each role's on the same
# input sets, back to back, up to ALONE_PAIRS pairs a round (at least one), in at most
# ALONE_SHARE of the round's budget; up to HANDOVER_CALLS calls a batch, handed over one at a
# time. Fewer pairs on a GPU: each call handed over also costs the switch between the processes
# both ways (about 0.28 ms on the H200).
ALONE_PAIRS = {"cpu": 4, "gpu": 2}
ALONE_SHARE = 0.2
HANDOVER_CALLS = 64
# What a call handed over costs on the CPU: the mean of a batch's calls, each timed on its own,
# its slowest HANDOVER_TRIM (one call at least) left out: an interrupt, or what is left of
# another process's time slice once the waits for a CPU are taken off
# (`batches.handed_over_call_ns`), costs 60 µs to milliseconds against a call's 8-40 µs. Not
# the median or a low quantile: they miss the costs that come now and then, the more the longer
# a call, and so read a slower baseline short against its batches (the tenth quantile failed
# an honest relu beside ten operations a call at 1.55-2.18 in `bench/calls_alone.py`, this mean
# read it 0.53-0.70). Calls that each make their outputs from a set they first see when it is
# released cannot be made faster.
HANDOVER_TRIM = 0.05
# A CPU batch handed over holds the calls that fit its share of the round, this many at least
# where the candidate's batches hold several calls (their first, cold, left out, the second
# timed): otherwise a slow baseline beside a fast candidate leaves too few calls for a bound,
# and a candidate that does its slow part once a batch would be credited it. Such calls are
# slow beside what a time slice or an interrupt adds to one, and the bound takes the median of
# the pairs; their pairs may take the round over its budget.
HANDOVER_MIN_CALLS = 2
# A pair of handed-over batches in which threads of a worker's own ran and kept its calling
# thread waiting for its CPU longer than HANDOVER_WAIT_NS and this share of the batch's CPU
# time is left out: an honest candidate's own threads, sharing the one CPU its calls alone are
# given, made a call read 77 times its batches' time. A busy machine's waits leave no pair
# out: another process's time slice is taken off the calls it lands in
# (`batches.handed_over_call_ns`); a worker's wake after it was stopped waits tens of µs.
HANDOVER_WAIT_SHARE = 0.05
HANDOVER_WAIT_NS = 200_000
# How the bound allows for noise: this many standard errors of the pairs' differences, plus
# ALONE_ALLOWANCE of what a call costs the baseline (two workers' hand-overs of the same code
# differed by up to 8% a call on the CPU machine).
ALONE_STANDARD_ERRORS = 2.5
ALONE_ALLOWANCE = 0.1
# And ALONE_SHORTFALL of what the candidate's calls alone save against the baseline's: calls
# made alone read a longer call's cost short against its batches (a third short for ten
# operations a call against one on 8x8 sets), so a candidate faster than the baseline would
# have its bound raised by what the baseline's calls lose alone. A candidate of the baseline's
# cost whose batches' calls are done together saves nothing alone: no allowance.
ALONE_SHORTFALL = 0.3
# A bound this many times the candidate's time a call in batches fails its timing (between 1
# and this, it is what the candidate is credited at: `credit_within_calls_alone`): honest
# candidates read at most about 1.3 (on the CPU and, where a batch handed over replays a graph
# of its calls, `Worker.handover_graph`, on the H200), calls done together 2.8 and over on the
# H200 and 1.2 and over on the CPU, where the credit at the bound takes what is left.
ALONE_FAIL = 1.5
# Where a driver cannot capture those words in a graph (`stream_words.capturable`), a graph-mode
# batch handed over is launched call by call beside batches that replay graphs, which reads
# honest small kernels up to 1.7 times their batches: this limit, and no credit at the bound
# (calls done together read 3.1 and over so on the H200).
ALONE_FAIL_LAUNCHED_APART = 2.5
# A hand-over costs something, so the baseline's calls made alone read at least its batches' time
# a call, less the shortfall of a longer call (a third, above). Read under this share of it, they
# were disturbed: with its waits for a CPU taken off (`batches.handed_over_call_ns`), a baseline
# that waits out wall time (2 ms of spin a call) read about 250 µs alone against 2,000 in its
# batches beside other builds at load 7-14, and the difference against it bound an honest 68 µs
# candidate at 18x (tests/test_implausible_timing.py failed twice so); beside three CPU hogs an
# honest relu's baseline read 70 µs alone against 299 in its batches, the batches inflated. Which
# reading is true cannot be told, so the bound is drawn from both (`reference_short`): where it
# fails taking the baseline's batches and not taking its calls alone (`reference_disturbed`), the
# failure is in doubt (`Rounds.in_doubt`: measured again, then inconclusive), never final; calls
# done together that fail both ways fail.
ALONE_REFERENCE_SHORT = 0.5


def alone_bound(
    alone: dict[str, list[float]], batched_ns: dict[str, float], launched_apart: bool = False
) -> dict | None:
    """What the candidate's calls made alone say its calls cost, against the baseline's.

    Each entry of `alone` is what a call cost in one batch whose calls could not be done
    together: on the CPU, input sets handed over one at a time, each call timed on its own by
    the evaluator's clock (the mean of a batch's calls, its first, cold after the worker was
    stopped, and its slowest HANDOVER_TRIM left out; `BatchMeasurement._handover_batch`); on a GPU,
    a batch of steps that each cost the same, over its calls (a batch is timed from its first
    release to its last call's outputs taken aside). A call so made costs what the call costs plus the hand-over (the
    evaluator writing the next set; the GPU's switch between the processes), the same for
    both roles, whose batches, on the same input sets back to back, differ by what their calls
    differ by. So the candidate's calls take at least the baseline's per-call time in batches
    (`batched_ns`) plus that difference, less the noise (ALONE_STANDARD_ERRORS of the
    difference, from a robust spread of the pairs, and ALONE_ALLOWANCE of what a call costs
    the baseline in batches: not made alone, whose hand-over, the same for both, would dwarf
    a small call: on the H200 a GPU's switch between the processes, 285 µs a step; on the CPU
    machine the evaluator's writes and looks, about 12 µs; and ALONE_SHORTFALL of what the
    candidate's calls alone save against the baseline's). `ratio`: that
    bound over the candidate's per-call time in batches; over ALONE_FAIL, its batches' calls
    were not made one by one but done together (which a worker's replaced batch loop can do
    over the input sets it is given all at once): `failed` (over ALONE_FAIL_LAUNCHED_APART where
    calls made alone were `launched_apart`, beside batches replaying graphs). Where the
    baseline's calls alone read under ALONE_REFERENCE_SHORT of its batches (`reference_short`),
    the bound is drawn again with them for its cost (`ratio_alone_reference`), and a failure that
    one does not confirm is `reference_disturbed`. None with fewer than three pairs."""
    pairs = list(zip(alone.get("candidate", []), alone.get("baseline", [])))
    if len(pairs) < 3:
        return None
    differences = [cand - base for cand, base in pairs]
    difference = median(differences)
    spread = 1.4826 * median(abs(d - difference) for d in differences) / math.sqrt(len(pairs))
    baseline_alone = median(base for _, base in pairs)
    limit = ALONE_FAIL_LAUNCHED_APART if launched_apart else ALONE_FAIL

    def bound_from(reference: float) -> tuple[float, float, float]:
        """The margin, the lower bound and its ratio to the candidate's batches, the baseline's
        cost a call taken as `reference`."""
        margin = ALONE_STANDARD_ERRORS * spread + ALONE_ALLOWANCE * reference + ALONE_SHORTFALL * max(0.0, -difference)
        lower = reference + difference - margin
        return margin, lower, lower / max(batched_ns["candidate"], 1.0)

    margin, lower, ratio = bound_from(batched_ns["baseline"])
    reference_short = baseline_alone < ALONE_REFERENCE_SHORT * batched_ns["baseline"]
    ratio_alone_reference = bound_from(baseline_alone)[2] if reference_short else None
    return {
        "pairs": len(pairs),
        "baseline_alone_us": baseline_alone / 1000,
        "baseline_batched_us": batched_ns["baseline"] / 1000,
        "difference_us": difference / 1000,
        "margin_us": margin / 1000,
        "lower_us": lower / 1000,
        "batched_us": batched_ns["candidate"] / 1000,
        "ratio": ratio,
        "launched_apart": launched_apart,
        "reference_short": reference_short,
        "ratio_alone_reference": ratio_alone_reference,
        "reference_disturbed": ratio > limit and ratio_alone_reference is not None and ratio_alone_reference <= limit,
        "failed": ratio > limit,
    }


def unvouched_on_a_busy_machine(confirmed: bool, busy: bool, bound: dict | None) -> bool:
    """Whether a confirmed implausible speedup stands on nothing: measured on a busy machine,
    where the calls made alone that vouch for a speedup this large drew no bound (none, or a
    lower bound at or under zero). Beside CPU hogs a slow call's calls made alone read short,
    and a candidate that did its slow part once a batch was credited 270x: such a speedup is
    inconclusive, not credited."""
    return confirmed and busy and (bound is None or bound["lower_us"] <= 0)


# A call that reads under this share of what the copy of its outputs into their slots costs
# (`Rounds.harness_ns`: on a GPU one kernel, on the CPU the batch loop's copy, each writing what
# the call must write at least once) was not made as a call of its own (`launch_floor`). On the
# CPU machine a new tensor of its outputs' shape, unwritten (less than any honest call makes),
# read 0.38-0.88 of that copy over two runs (8x8 to 512x512 floats), one operation over its
# input 0.65-1.5.
LAUNCH_FLOOR = 0.25


def launch_floor(per_call_ns: float, harness_ns: float) -> str | None:
    """Why a batch's per-call time (its copies taken off) cannot be calls each made on their
    own, or None: every call runs at least one operation that writes its outputs, which costs
    about what copying them does. Calls done together, one operation over all of a batch's
    input sets, read a thousandth of that (on the H200, and on the CPU machine, where the bound
    of calls made alone can miss them when its noise is as large as a call of a few µs)."""
    if harness_ns <= 0 or per_call_ns >= LAUNCH_FLOOR * harness_ns:
        return None
    return (
        f"a call read {per_call_ns / 1000:.3g} µs, under {LAUNCH_FLOOR:g} of what copying its outputs costs "
        f"({harness_ns / 1000:.3g} µs): its batches' calls did not each make their outputs, but were done "
        f"together"
    )


# On the CPU no more than this share of a role's median time a call in its batches is taken off
# for the harness (`harness_taken_off`): an honest call makes its outputs and then has them copied,
# at least as long again as the copy alone (one operation over its input read 0.65-1.5 times the
# copy beyond it on the CPU machine, `LAUNCH_FLOOR`), so an estimate over half the call is too
# high, whatever disturbed it. What is left of a call is then never under half what it took.
HARNESS_CAP = 0.5


def harness_taken_off(harness_ns: float, raw_median_ns: float, capped: bool) -> float:
    """What is taken off each of a role's calls for the harness: its price, on the CPU
    (`capped`) at most HARNESS_CAP of the role's median time a call. Only a call that reads
    under twice the copy meets the cap; its speedup then leans to 1 (the faster role keeps more
    of the copy's cost), never away from it."""
    return min(harness_ns, HARNESS_CAP * raw_median_ns) if capped else harness_ns


# A busy machine (`cputime.MachineShare`: the measurement's threads waited for a CPU for more than
# BUSY_WAIT_SHARE of the time they could run) may disturb the two checks that read calls done
# together from times, where their reading is near the limit (`Rounds.in_doubt`): a call that read
# more than its copy but under the launch floor, or calls made alone that bound it at no more than
# BUSY_DOUBT_ALONE times its batches (beside three CPU hogs an honest relu's baseline read 299 µs a
# call in its batches, 70 in its calls made alone, and its identical candidate 73 in batches: a
# bound 3.8 times those; with the waits for a CPU taken off a call handed over, a busy machine's
# calls alone read short too, so neither is a steadier reference than the other). Such a failure
# is measured again in place, after BUSY_BACKOFF_S, then twice that, BUSY_RETRIES times; still
# busy and still in doubt, the timing is inconclusive (`INCONCLUSIVE`, kind
# `inconclusive_machine_busy`): no verdict, not FAILED. A reading past either limit is a failure
# on any machine: no honest call reads under the copy of its own outputs (the copy's price is the
# least of several runs in CPU time on one thread, `batches.HarnessPrice`), and calls done together
# read bounds of 9.6 and over beside CPU hogs and quiet (bench/honest_under_load.py: one operation
# over the batch on 8x8 sets 9.6-12.5, ten operations 42-50, with sleeps 38-76; the ten on 33x65
# sets, which save least, 0.98-1.99: in doubt on a busy machine where over 1.5). Beside CPU hogs on
# the 2-core machine a measurement's threads waited 35-82% of the time they could run, in builds of
# other work alone 1-75% (median 29%).
BUSY_WAIT_SHARE = 0.25
BUSY_DOUBT_ALONE = 4 * ALONE_FAIL
BUSY_RETRIES = 2
BUSY_BACKOFF_S = 0.5
INCONCLUSIVE = "INCONCLUSIVE"


def unbounded_line(measured: Rounds) -> str | None:
    """Where the candidate's calls made alone drew no bound because threads of its own kept its
    calling thread waiting in most pairs (an honest candidate that runs threads of its own, or
    one that hides a batch's calls done together so), what to say; else None."""
    held = measured.alone_held_by_own_threads.get("candidate", 0)
    if measured.alone_bound is not None or not held or 2 * held < measured.alone_disturbed:
        return None
    return (
        f"its calls made alone drew no bound on its batches: threads of its own kept its calling thread waiting "
        f"in {held} of {measured.alone_pairs_made()} pairs, so calls done together in its batches would go unseen"
    )


def unvouched_speedup_line(speedup: dict, first: Rounds, again: Rounds | None = None) -> str | None:
    """Where the candidate reads faster than the baseline beyond the noise (its interval above
    1) while its calls made alone were made and drew no bound on its batches (most pairs left
    out, `Rounds.alone_left_out`), in its measurement and in a re-timing's if there was one,
    what to say; else None. Unbounded, a batch's calls done together read as any speedup (the
    one-operation relu on 8x8 sets was credited 5.6x to 109x so beside other work on the
    2-core machine, its pairs left out by a busy machine)."""
    if speedup["ci_low"] <= 1 or not first.alone_left_out() or (again is not None and again.alone_bound is not None):
        return None
    return (
        f"its calls made alone drew no bound on its batches ({first.alone_disturbed} of {first.alone_pairs_made()} "
        f"pairs left out: threads of its own kept its calling thread waiting, or on a GPU its calls were queued "
        f"after their batch began), so its speedup cannot be vouched for"
    )


def alone_line(bound: dict) -> str:
    return (
        f"its calls made alone took {bound['difference_us']:+.3g} µs a call against the baseline's, so at least "
        f"{bound['lower_us']:.3g} µs a call, {bound['ratio']:.2g}x what its batches read "
        f"({bound['batched_us']:.3g} µs a call): their calls were not made one by one, so their time cannot be "
        f"vouched for"
    )


def credit_within_calls_alone(
    speedup: dict, bound: dict | None, candidate_ns: Sequence[float], statistic: str
) -> str | None:
    """Where a candidate's calls made alone bound its calls above what its batches read
    (`bound`, from `alone_bound`, over 1, not over ALONE_FAIL), its speedup is credited at that
    bound: the point and interval divided by the bound over its batches' time a call (the
    statistic's, of the samples the speedup took: `candidate_ns`), the verdict read again, what
    the batches read kept in `bounded_by_calls_alone`; the line that says so, or None where
    nothing changed. Honest candidates read about 1.0 at most (`bench/calls_alone.py`, quiet and
    beside CPU hogs, CPU and H200): calls done together that save less than ALONE_FAIL would
    otherwise be credited what their batches read."""
    if not bound or bound["failed"] or bound.get("launched_apart"):
        return None
    centre_us = (fmean(candidate_ns) if statistic == "mean" else median(candidate_ns)) / 1000 if candidate_ns else 0.0
    if centre_us <= 0 or bound["lower_us"] <= centre_us:
        return None
    factor = bound["lower_us"] / centre_us
    speedup["bounded_by_calls_alone"] = {
        "factor": factor,
        "lower_us": bound["lower_us"],
        "batches_us": centre_us,
        **{f"batches_{key}": speedup[key] for key in ("value", "ci_low", "ci_high", "verdict")},
    }
    for key in ("value", "ci_low", "ci_high"):
        speedup[key] /= factor
    if speedup.get("ci_within_run"):
        speedup["ci_within_run"] = [end / factor for end in speedup["ci_within_run"]]
    speedup["verdict"] = speedup_verdict(speedup["ci_low"], speedup["ci_high"])
    return (
        f"its calls made alone cost at least {bound['lower_us']:.3g} µs a call, {factor:.2f}x what its batches "
        f"read ({centre_us:.3g} µs): credited at that, {speedup['value']:.3g}x "
        f"[{speedup['ci_low']:.3g}, {speedup['ci_high']:.3g}] {speedup['verdict']} (its batches read "
        f"{speedup['bounded_by_calls_alone']['batches_value']:.3g}x)"
    )
