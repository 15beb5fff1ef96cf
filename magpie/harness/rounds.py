"""One measurement's record (`Rounds`): per role its samples in time order, the rounds'
sizes, the wall time around its requests, its batches and calls made alone, and what it says
(kept samples, the speedup's inputs, its statistic, whether a busy machine left it in doubt);
a batch's input sets with their references (`Batch`), what a GPU batch costs besides its calls
(`fixed_cost`), where batches' time went (`batch_phases`), and the lines that say how a
vouched measurement was taken. What its numbers mean is `harness.measurement`'s."""

from __future__ import annotations

from collections.abc import Sequence
from statistics import fmean, median
from typing import cast

from magpie.compare.stats import thin_rounds
from magpie.harness.checks import as_tuple
from magpie.harness.laps import Laps
from magpie.harness.measurement import (
    BUSY_DOUBT_ALONE,
    BUSY_WAIT_SHARE,
    KEPT_SAMPLES,
    alone_bound,
    harness_taken_off,
    request_account,
    uneven_calls,
)
from magpie.harness.regions import CHECKED_PER_BATCH
from magpie.harness.spec import ReferenceSpec
from magpie.harness.timing import CudaTimer
from magpie.harness.wire import TimingSettings


class Rounds:
    """One interleaved measurement, per role: its samples in time order (ns), how many each
    round took (the bootstrap's blocks), the wall time the evaluator measured around its
    requests, the rounds that came back early, the timer's info per round and its method. A
    vouched one (the CPU's batches) has a sample per batch and no timer of the worker's."""

    def __init__(self, roles: list[str], vouched: bool = False):
        # vouched: samples are the evaluator's own clock over batches (`BatchMeasurement`), one
        # per batch, per call; `calls` per round, outputs `checked`, the first failed check
        self.vouched = vouched
        self.calls: dict[str, list[int]] = {role: [] for role in roles}
        self.checked: dict[str, int] = {}
        self.failed: dict[str, dict] = {}
        self.harness_ns = 0.0  # what the harness costs a call (`batches.HarnessPrice`, `copy_ns_per_call`)
        self.harness_runs_ns: list[float] = []  # on the CPU, every run that priced it, before and in the rounds
        # per role, each vouched batch's time a call before the harness is taken off (`add_batch`)
        self.raw: dict[str, list[float]] = {role: [] for role in roles}
        self.subtracted_ns: dict[str, float] = {}  # per role, what was taken off (`settle_samples`)
        self.cpu_wait_share: float | None = None  # how busy the machine kept it (`cputime.MachineShare`)
        self.fixed_ns = 0.0  # on a GPU, what a batch costs besides its calls (`fixed_cost`)
        self.calibration_ns: dict[str, float] = {}  # on a GPU, its calibration per role (`BatchMeasurement._calibrate`)
        # on a GPU, every batch of a role: (round or None for a sizing one, ns, calls, wall s)
        self.device_batches: dict[str, list[tuple]] = {role: [] for role in roles}
        # per role, what a call cost in each batch of calls made alone in the rounds (`alone_bound`), and the bound
        self.alone: dict[str, list[float]] = {role: [] for role in roles}
        self.alone_calls = 0  # the calls of each batch handed over
        # on a GPU in graph mode, calls handed over launched one by one: the driver cannot capture
        # their words in a graph (`stream_words.capturable`)
        self.alone_launched_apart = False
        self.alone_disturbed = 0  # pairs left out (`BatchMeasurement._alone`)
        # of those, per role, the ones its own threads held its calling thread up in
        self.alone_held_by_own_threads: dict[str, int] = dict.fromkeys(roles, 0)
        self.alone_bound: dict | None = None
        self.graph = False  # on a GPU, each batch a replay of a CUDA graph of its calls
        self.phases: dict[str, list[dict]] = {role: [] for role in roles}  # on a GPU, per batch (`batch_phases`)
        self.calibration_phases: dict | None = None  # the same for the batches that measured it
        self.per_call_ns: dict[str, float] = {}  # ns a call per role, from its sizing batches
        # per role, what was taken from its own timing job, not measured here (`TimingSession.known_of_baseline`)
        self.reused: dict[str, list[str]] = {}
        # where a vouched measurement's wall time went: mapping the regions, pricing the copies,
        # calibrating, sizing the batches, the rounds (`BatchMeasurement`)
        self.steps_s: dict[str, float] = {}
        self.round_laps: Laps | None = None  # the rounds' parts, while they run (`lap`)
        self.round_parts_s: dict[str, float] = {}
        self.by_cpu_time = False  # samples from CPU time, not wall time (`BatchMeasurement._batch`)
        self.set_ns = 0.0  # how long the evaluator took to make one input set, lately
        self.last_wall_ns = 0.0  # the last batch's wall time
        self.samples: dict[str, list[int]] = {role: [] for role in roles}
        self.sizes: dict[str, list[int]] = {role: [] for role in roles}
        self.wall: dict[str, float] = {role: 0.0 for role in roles}
        self.early: dict[str, list[float]] = {role: [] for role in roles}
        self.infos: dict[str, list[dict]] = {role: [] for role in roles}
        self.methods: dict[str, str] = {}
        self.host_wall: dict[str, float | None] = {}  # µs, of the host-synchronised calls after the rounds
        self.account: dict[str, dict] = {
            role: {"calls": 0, "explained_ns": 0.0, "timed_ns": 0, "allowance_ns": 0.0} for role in roles
        }

    def lap(self, part: str) -> None:
        """The time since the last part of a round went to `part` (drawing input sets, writing
        them, the requests, the checks, the probes): where the rounds' wall time goes beyond
        the budget."""
        if self.round_laps is not None:
            self.round_laps.mark(part)

    def add(self, role: str, answer: dict, mode: str | None, costs: dict) -> None:
        """One timing request's answer. Its samples stand for GRAPH_CALLS calls each only where
        the evaluator asked for graph mode and the timer says it used it."""
        samples, info = answer["samples_ns"], answer["info"]
        self.samples[role].extend(samples)
        self.sizes[role].append(len(samples))
        self.wall[role] += answer["wall_s"]
        self.infos[role].append({**info, "request_wall_ms": round(answer["wall_s"] * 1000, 3)})
        self.methods[role] = answer["method"]
        used = "graph" if mode == "graph" and info.get("mode") == "graph" else ("events" if mode else None)
        per_sample = CudaTimer.GRAPH_CALLS if used == "graph" else 1
        account = request_account(samples, per_sample, costs, used)
        for key, value in account.items():
            self.account[role][key] += value

    def add_batch(self, role: str, round_index: int, taken_ns: float, calls: int, wall_s: float) -> None:
        """One vouched batch that took `taken_ns`: less what a batch costs besides its calls (the
        GPU's; none on the CPU), its time a call, which becomes a sample of round `round_index`
        once the harness's cost is known (`settle_samples`)."""
        while len(self.sizes[role]) <= round_index:
            self.sizes[role].append(0)
            self.calls[role].append(0)
        self.raw[role].append((taken_ns - self.fixed_ns) / calls)
        self.sizes[role][round_index] += 1
        self.calls[role][round_index] += calls
        self.wall[role] += wall_s

    def settle_device_batches(self) -> None:
        """On a GPU, once every batch is in: what a batch costs besides its calls
        (`fixed_cost`), then each round's batch a sample (`add_batch`, `settle_samples`)."""
        self.fixed_ns = fixed_cost(self.device_batches, self.calibration_ns)
        for role, records in self.device_batches.items():
            for round_index, taken_ns, calls, wall_s in records:
                if round_index is not None:
                    self.add_batch(role, round_index, taken_ns, calls, wall_s)
        self.settle_samples(capped=False)

    def settle_samples(self, capped: bool) -> None:
        """Once every batch and the harness's price (`harness_ns`) are in: each batch's time a
        call less what is taken off for the harness, one sample. `capped` (the CPU's): no more
        than HARNESS_CAP of the role's median time a call (`harness_taken_off`)."""
        for role, raw in self.raw.items():
            self.subtracted_ns[role] = harness_taken_off(self.harness_ns, median(raw) if raw else 0.0, capped)
            self.samples[role] = [max(1, round(ns - self.subtracted_ns[role])) for ns in raw]

    def raw_median_ns(self, role: str) -> float | None:
        """A role's median time a call in its batches, the harness's cost still in."""
        return median(self.raw[role]) if self.raw.get(role) else None

    def busy(self) -> bool:
        """Whether the machine kept this measurement's threads waiting for a CPU past BUSY_WAIT_SHARE."""
        return self.cpu_wait_share is not None and self.cpu_wait_share > BUSY_WAIT_SHARE

    def in_doubt(self) -> list[str]:
        """On a busy machine, the failures a busy machine may have caused: each role's launch
        floor failed by a call that still read more than its copy (`floor_in_doubt`), the
        candidate's calls-alone bound at no more than BUSY_DOUBT_ALONE; [] where any failure
        is beyond doubt (or another check failed), or the machine was not busy. A bound that
        fails only with the baseline's batches for its cost, its calls alone reading under half
        of them (`reference_disturbed`), is in doubt at any ratio, the machine read busy or not:
        the baseline's readings disagree, which the machine did."""
        bound = self.alone_bound
        disturbed = bool(bound and bound["failed"] and bound.get("reference_disturbed"))
        if self.cpu_wait_share is None or not (self.busy() or disturbed):
            return []
        doubts = []
        for role, record in self.failed.items():
            if not record.get("floor_in_doubt") or not self.busy():
                return []
            doubts.append(f"{role}: {record['detail']}")
        if bound and bound["failed"]:
            if disturbed:
                doubts.append(
                    f"candidate: its calls made alone bound its batches at {bound['ratio']:.2g}x against the "
                    f"baseline's batches, {bound['ratio_alone_reference']:.2g}x against the baseline's calls made "
                    f"alone ({bound['baseline_alone_us']:.3g} µs a call against {bound['baseline_batched_us']:.3g})"
                )
            elif bound["ratio"] > BUSY_DOUBT_ALONE or bound.get("launched_apart"):
                return []
            else:
                doubts.append(f"candidate: its calls made alone bound its batches at {bound['ratio']:.2g}x")
        return doubts

    def judge_calls_alone(self) -> None:
        """The candidate's calls made alone against its batches (`alone_bound`)."""
        if self.samples.get("candidate") and self.samples.get("baseline"):
            self.alone_bound = alone_bound(
                self.alone, {role: median(self.samples[role]) for role in self.samples}, self.alone_launched_apart
            )
            if self.alone_bound is not None:
                self.alone_bound["left_out"] = self.alone_disturbed
                self.alone_bound["calls_a_batch"] = self.alone_calls

    def speedup(self, statistic: str = "median") -> float:
        """The point estimate, median(baseline) / median(candidate), or the means' ratio."""
        centre = fmean if statistic == "mean" else median
        return centre(self.samples["baseline"]) / max(centre(self.samples["candidate"]), 1)

    def uneven(self) -> dict[str, tuple[float, float]]:
        """The roles whose per-call times are uneven (`uneven_calls`), with their mean and median (µs)."""
        out = {}
        for role, samples in self.samples.items():
            mean_us, median_us = fmean(samples) / 1000, median(samples) / 1000
            if uneven_calls(mean_us, median_us):
                out[role] = (mean_us, median_us)
        return out

    def statistic(self) -> str:
        """What this measurement's speedup is the ratio of: means where a role's calls are uneven."""
        return "mean" if self.uneven() else "median"

    def alone_pairs_made(self) -> int:
        """The pairs of calls made alone, kept or left out."""
        return self.alone_disturbed + len(self.alone.get("candidate", []))

    def alone_left_out(self) -> bool:
        """Whether enough pairs of calls made alone were made for a bound (`alone_bound`), none
        was drawn, and most of them were left out (not a few that left a size short by chance)."""
        made = self.alone_pairs_made()
        return self.alone_bound is None and made >= 3 and 2 * self.alone_disturbed > made

    def kept(self) -> dict[str, tuple[Sequence[float], list[int]]]:
        """Thinned in time order: the kept samples of a round stay together, counted per round."""
        # ns as ints, which thin_rounds reads as the floats they stand for
        return {
            role: thin_rounds(cast(list[float], self.samples[role]), self.sizes[role], KEPT_SAMPLES)
            for role in self.samples
        }

    def for_speedup(self, statistic: str) -> dict[str, tuple[Sequence[float], list[int]]]:
        """What `paired_speedup` takes: the kept samples for the median (what the result
        shows), every sample for the mean (every-k-th thinning could fall in step with a
        pattern of slow calls and leave them out)."""
        if statistic == "mean":
            return {role: (self.samples[role], self.sizes[role]) for role in self.samples}
        return self.kept()


class Batch:
    """One batch's input sets, and the references of the calls the checks pick."""

    def __init__(self, sets: list, spec: ReferenceSpec, init_seed: int):
        self.sets = sets
        self.spec = spec
        self.init_seed = init_seed
        self._references: dict[int, object] = {}

    def reference(self, call: int):
        if call not in self._references:
            self._references[call] = self.spec.reference(self.sets[call], self.init_seed)
        return self._references[call]


def fixed_cost(device_batches: dict[str, list[tuple]], calibration_ns: dict[str, float]) -> float:
    """What a GPU batch costs besides its calls, the same for every role: per role, the
    intercept of a line through its rounds' batches' times against their calls (batches of two
    sizes in turn; the sizing batches left out: a worker's first calls run slower, which tilts a
    line through them); the least of the roles', no less than 0 and no more than the least
    role's calibration (`BatchMeasurement._calibrate`); that calibration where no role's batches vary
    in size (calls so slow that a round holds one). A worker that pads its short batches raises
    only its own intercept, which the least leaves out; the ceiling bounds what any line can
    take off. The line is Theil-Sen's (`robust_line`), which one slow batch does not tilt: on
    the H200 a launch-bound relu's first batch beside a candidate read up to 2.4x its others, a
    least-squares line through its batches met zero calls 40-60 µs low, and its per-call median
    read 7-15% over its own timing job's (a `disturbed_measurement` for 13 of 16 rows), 1-5%
    along Theil-Sen's (tests/fixtures/h200/calls_alone_batches.json). Not taken off batches of
    one call of a 1 GiB scale-add, the 0.28 ms made them read 1.08 ms where the worker's timer
    read 0.80."""
    intercepts = []
    for records in device_batches.values():
        points = [(calls, taken_ns) for round_index, taken_ns, calls, _ in records if calls and round_index is not None]
        line = robust_line(points)
        if line is not None and line[0] > 0:
            intercepts.append(max(0.0, line[1]))
    ceiling = min(calibration_ns.values(), default=0.0)
    return min(min(intercepts), ceiling) if intercepts else ceiling


def robust_line(points: list[tuple[float, float]]) -> tuple[float, float] | None:
    """Theil-Sen's line through (x, y) points: the median of the slopes between points of
    different x, and the median of what each point leaves at x = 0 along it; None where no two
    points differ in x."""
    slopes = [(y2 - y1) / (x2 - x1) for i, (x1, y1) in enumerate(points) for x2, y2 in points[i + 1 :] if x2 != x1]
    if not slopes:
        return None
    slope = median(slopes)
    return slope, median(y - slope * x for x, y in points)


def other_size(calls: int, limit: int) -> int:
    """The size of every other GPU batch: half, or two where a batch is one call (if two fit)."""
    return calls // 2 if calls > 1 else min(2, limit)


def batch_phases(records: list[dict]) -> dict:
    """Where GPU batches' time went, medians in µs: the evaluator's events (the sample's
    source), its host clock from the request until the answer and on until the worker had
    stopped; the worker's own account of its loop (it could say anything: a diagnostic of the
    method, never a sample); calls a batch."""
    out = {}
    for key in ("calls", "clock_ns", "answer_ns", "stop_ns", "worker_loop_ns"):
        values = [r[key] for r in records if isinstance(r.get(key), (int, float))]
        if values:
            out[key.replace("_ns", "_us")] = median(values) / (1 if key == "calls" else 1000)
    if records:
        out["opened_early"] = sum(1 for r in records if r.get("opened_early"))
        out["batches"] = len(records)
    return out


def vouched_method(calls: int, measured: Rounds, t: TimingSettings, device: str = "cpu") -> str:
    if device.startswith("cuda"):
        clock = (
            "the evaluator's own CUDA events, one recorded as a gate the worker's calls wait on opens (their "
            "input sets copied in just before), one behind an event the worker records after its calls"
        )
        if measured.graph:
            clock += " (each batch one replay of a CUDA graph of its calls)"
        less = (
            f"what a batch costs besides its calls ({measured.fixed_ns / 1000:.3g} µs) and the copies of its "
            f"outputs into their slots ({measured.harness_ns / 1000:.2g} µs of GPU time a call)"
        )
    else:
        clock = (
            "the CPU time the kernel counted for all the worker's threads and processes"
            if measured.by_cpu_time
            else "the evaluator's clock less the scheduler's waits"
        )
        less = f"the harness loop's {measured.harness_ns / 1000:.2g} µs"
    return (
        f"batches of up to {calls} calls timed from outside the worker by {clock}, over its calls, less "
        f"{less}; each call on an input set of new seeds written "
        f"while the worker was stopped, every output slot checked for writes and {CHECKED_PER_BATCH} "
        f"calls a batch, chosen after the answer, against the reference; warm-up {t.warmup_ms:g} ms, torch "
        f"threads={t.threads}, {t.rounds} rounds interleaved with the baseline"
    )


def vouched_inputs(torch, args: tuple, expected, device: str = "cpu") -> bool:
    """Whether a measurement can be a vouched one (`batches`): tensors on `device` and plain
    values in, tensors on `device` out."""
    plain = (int, float, bool, str, type(None))
    kind = torch.device(device).type
    return all((torch.is_tensor(x) and x.device.type == kind) or type(x) in plain for x in args) and all(
        torch.is_tensor(e) and e.device.type == kind for e in as_tuple(expected)
    )
