"""The timing job: one `TimingSession` per job, which owns what its phases share (the spec,
the timed case and its input sets, the workers and their turns, the settings, the method, the
measurements) and runs them in order: workers and their first calls beside other jobs on the
device; warm-up, measurement, the checks on the timed calls, a measurement taken again where
it is in doubt, and the kernel profile with the device held alone; the re-check after; then
the result, judged by `harness.judging`."""

from __future__ import annotations

import time
from statistics import fmean
from typing import Any

from magpie.harness.batch_measurement import BatchMeasurement
from magpie.harness.checks import compare_inputs, compare_outputs
from magpie.harness.clocks import ClockSampler
from magpie.harness.context import EvaluationContext
from magpie.harness.correctness import run_cases
from magpie.harness.judging import (
    disturbed,
    fail,
    flag_uneven,
    inconclusive,
    judge_retiming,
    not_judged,
    not_timed,
    probe_waited,
    record,
    roofline,
    summaries,
)
from magpie.harness.kinds import failure, failure_kind
from magpie.harness.laps import Laps
from magpie.harness.measurement import (
    BUSY_BACKOFF_S,
    BUSY_RETRIES,
    DEFAULT_BETWEEN_RUNS,
    alone_line,
    credit_within_calls_alone,
    few_samples,
    first_use_verdict,
    for_device,
    host_wall_gap,
    paired_speedup,
    timer_inconsistency,
    unbounded_line,
    uneven_calls,
    unvouched_speedup_line,
)
from magpie.harness.method_choice import chosen_method, probed_method
from magpie.harness.pool import Turns, WorkerPool
from magpie.harness.rounds import Rounds, vouched_inputs
from magpie.harness.spec import ReferenceSpec, SpecError, derive_seed, output_specs, rotation
from magpie.harness.timed_shapes import baseline_for_case, combined, timed_cases
from magpie.harness.timing import calibrate, sample_cap, timer_for
from magpie.harness.wire import Implementation, Testcase
from magpie.supervision import device_lock
from magpie.supervision.session import Worker, WorkerFailure

TIMER_COSTS: dict[str, dict] = {}  # per device, measured once per evaluator process
# An honest timer stops at its sample cap or once its budget has passed, never well before.
EARLY_FRACTION = 0.9
# The first-use check (`_first_use`, judged by `measurement.first_use_verdict`): this many
# input sets never seen before, at most this many bytes of them, one timed call each within
# this budget.
FIRST_USE_SETS = 8
FIRST_USE_BYTES = 1 << 30
FIRST_USE_BUDGET_MS = 10_000.0
# Host-synchronised calls that cross-check the event time, after the rounds.
HOST_CHECK_CALLS = 5


def timing(context: EvaluationContext, pool: WorkerPool) -> dict:
    """Each timed shape (`timing.shapes`) measured in turn, a session each; one result of them
    (`timed_shapes.combined`). A shape whose timing failed ends the job: the rest are not timed."""
    testcases = context.correctness_settings.testcases
    selection = context.timing_settings.timed
    spec_index = next((i for i, tc in enumerate(testcases) if tc.spec), None)
    if spec_index is None:
        return not_timed("SKIPPED", "skipped", "no Python spec testcase to build timing inputs from")
    impl_type, device = context.impl.type, context.device
    if impl_type in ("cuda", "hip") and device == "cpu":
        return not_timed(
            "SKIPPED", "skipped", f"{impl_type} timing needs a GPU device; this project's device is {device}"
        )
    testcase = testcases[spec_index]
    measured: list[tuple[str, dict]] = []
    try:
        spec = context.spec(spec_index, testcase)
        for case in timed_cases(spec.cases(context.seed, context.kernel_id, spec_index, 1, salt="timing"), selection):
            measured.append((case.label, TimingSession(context, pool, spec_index, testcase, spec, case).run()))
            if measured[-1][1]["performance_state"] == "FAILED":
                break
    except SpecError as err:
        return not_judged("timing", str(testcase.spec), err, spec_index)
    except WorkerFailure as err:
        return not_timed("FAILED", failure_kind(str(err)), str(err), spec_index)
    if not measured:
        return not_timed("SKIPPED", "skipped", f"{testcase.spec} declares no shape to time", spec_index)
    return combined(measured)


def timer_costs(device: str) -> dict:
    """What the timer costs beside its samples on this device (`timing.calibrate`),
    measured once per evaluator process with the device held alone."""
    if device not in TIMER_COSTS:
        TIMER_COSTS[device] = calibrate(timer_for(device))
    return TIMER_COSTS[device]


class TimingSession:
    """The baseline is timed beside every candidate, and those measurements take turns on
    the device: one baseline worker serves them all. A job takes it where it is parked;
    if it is not (another job has it), the job asks again once it holds the device, when
    the last measurement has parked it, and gives it back before letting the device go.
    Where no job of this build timed the baseline (an edit's rebuild), none is around:
    the job starts one beside its candidate's. A speedup above `implausible_speedup` is
    measured a second time, with the device still held: warm-up and interleaved rounds
    again, on input sets of new seeds."""

    def __init__(
        self,
        context: EvaluationContext,
        pool: WorkerPool,
        spec_index: int,
        testcase: Testcase,
        spec: ReferenceSpec,
        case,
    ):
        self.context, self.pool = context, pool
        self.spec_index, self.testcase = spec_index, testcase
        self.spec, self.case = spec, case
        # the baseline's own timing of this case, and the method it chose for it
        self.own = baseline_for_case(context.baseline_own_timing, case.label)
        self.set_method = self.own.get("timing_method") or context.set_method
        self.t = context.timing_settings
        self.impls = {"candidate": context.impl, "baseline": context.baseline}
        self.pair = context.baseline is not None and not context.impl.is_baseline
        self.threshold = self.t.implausible_speedup
        self.phases = Laps()
        self.workers: dict[str, Worker] = {}
        self.first_steps: dict[str, dict | None] = {}
        self.kernels: dict[str, dict] = {}
        self.adopted: dict[str, bool] = {}
        self.retimed: Rounds | None = None
        self.remeasured: dict | None = None
        self.busy_shares: list[float] = []  # how busy each measurement a busy machine left in doubt was
        # its timing an earlier build's, and its worker that build's too, kept warm since
        self.baseline_kept_warm = False
        self.timed_outputs: dict[str, dict] = {}
        self.first_use: list[int] | None = None
        # what the phases below make, in order
        self.init_file: str | None = None
        self.inputs: list = []
        self.expected = None
        self.out_specs: list = []
        self.offers: dict[str, dict] = {}
        self.method: dict = {}
        self.mode: str | None = None
        self.clocks: dict | None = None  # the clock regime over the measurements (`harness.clocks`)
        self.measured: Rounds | None = None
        self.recheck: dict = {}
        self.device_held_s = 0.0

    @property
    def baseline_impl(self) -> Implementation:
        """The baseline, where this job times a pair (`pair`)."""
        assert self.context.baseline is not None
        return self.context.baseline

    @property
    def measurement(self) -> Rounds:
        """The measurement, once `_held_alone` has made it (nothing reads it before)."""
        assert self.measured is not None
        return self.measured

    def run(self) -> dict:
        """Inputs, workers and their first calls beside other jobs on the device; warm-up,
        measurement and the kernel profile with the device held alone; the re-check after."""
        context, device = self.context, self.context.device
        try:
            with device_lock.shared(device):
                self.phases.mark("wait_shared")
                self._first_calls()
            with device_lock.exclusive(device):
                self.phases.mark("wait_exclusive")
                held_from = time.monotonic()
                self._held_alone()
                if self.pair:  # parked while the device is still held: the next measurement finds it
                    baseline_worker = self.workers.pop("baseline")
                    self.adopted["baseline"] = baseline_worker.adopted
                    baseline_worker.release()
                    self.phases.mark("park_baseline")
            self.device_held_s = time.monotonic() - held_from
            with device_lock.shared(device):
                self.phases.mark("wait_shared")
                self.pool.start_spare(context.impl, self.workers["candidate"])
                self.phases.mark("start_spare")
                self._recheck()
                self.phases.mark("recheck")
        finally:
            for worker in self.workers.values():
                worker.release()
            context.exchange.release()
        return self._result()

    # -- phases -------------------------------------------------------------------------------
    def _first_calls(self) -> None:
        """The workers started (the baseline's taken where it is parked), the input sets and
        reference made meanwhile, then the first calls (context creation, taking the inputs,
        JIT) in all workers at once."""
        context, pool, spec, workers = self.context, self.pool, self.spec, self.workers
        self.init_file = context.init_file(spec)
        workers["candidate"] = pool.start(context.impl, self.init_file, wait=False)
        baseline = pool.start(self.baseline_impl, self.init_file, fork=False, wait=False) if self.pair else None
        self.baseline_kept_warm = baseline is not None and not context.baseline_timed_in_this_build
        if self.pair and baseline is None and not context.baseline_timed_in_this_build:
            # no job of this build has one (an edit's rebuild): it starts and makes its
            # first calls now, beside the candidate's, not with the device held alone
            baseline = pool.start(self.baseline_impl, self.init_file, wait=False)
        if baseline is not None:
            workers["baseline"] = baseline
        self.phases.mark("start")
        self.inputs = [spec.make_inputs(c) for c in rotation(self.case, "set", self.t.input_sets)]
        self.expected = spec.reference(self.inputs[0], context.init_seed)
        self.out_specs = [output_specs(self.expected)]
        self.phases.mark("inputs")
        for worker in workers.values():
            pool.loaded(worker)
        self.phases.mark("loaded")
        self.offers = {
            role: context.exchange.offer_inputs("timing", self.inputs, worker.scratch or context.work)
            for role, worker in workers.items()
        }
        for role, worker in workers.items():
            self._send_time(worker, self.offers[role], first_call=True)
        for role, worker in workers.items():
            self.first_steps[role] = self._time_answer(worker).get("steps_s")
        context.exchange.release()
        self.phases.mark("first_calls")

    def _held_alone(self) -> None:
        """With the device held alone: the baseline's worker where it was not parked before,
        warm-up and the method's probe, the measurement (again while a busy machine leaves it
        in doubt), the checks on the timed calls, a measurement taken again where it is in
        doubt or its speedup implausible, the kernel profile."""
        context, t, workers = self.context, self.t, self.workers
        late = self.pair and "baseline" not in workers
        if late:
            workers["baseline"] = self.pool.start(self.baseline_impl, self.init_file)
            self.offers["baseline"] = context.exchange.offer_inputs(
                "timing", self.inputs, workers["baseline"].scratch or context.work
            )
            self.phases.mark("start_baseline")
        chosen = chosen_method(context.device, t.mode, self.set_method)
        with Turns(workers) as turns:
            warmed = {
                role: self._time_request(
                    turns.give(role),
                    self.offers[role],
                    first_call=late and role == "baseline",
                    warmup_ms=t.warmup_ms,
                    probe=chosen is None,
                    mode=(chosen or {}).get("mode"),
                )
                for role in workers
            }
            if late:
                self.first_steps["baseline"] = warmed["baseline"].get("steps_s")
                context.exchange.release()
            self.phases.mark("warmup_probe")
            self.method = chosen or probed_method(
                {role: a["probe_us"] for role, a in warmed.items()},
                {role: a.get("launch_us") for role, a in warmed.items()},
                is_baseline=context.impl.is_baseline,
            )
            self.mode = self.method["mode"]
            with self._clock_sampler() as sampler:
                self.measured = measured = self._measure(turns)
                # a failure a busy machine may have caused is measured again in place, after a
                # growing pause (`Rounds.in_doubt`: only where its CPU-wait share read busy)
                while measured.in_doubt() and len(self.busy_shares) < BUSY_RETRIES:
                    assert measured.cpu_wait_share is not None
                    self.busy_shares.append(measured.cpu_wait_share)
                    time.sleep(BUSY_BACKOFF_S * 2 ** (len(self.busy_shares) - 1))
                    self.measured = measured = self._retime(turns, f"busy {len(self.busy_shares)}")
                self.phases.mark("timed")
                self._check_timed_calls(turns)
                self._measure_again(turns)
            self.clocks = sampler.regime()
            if context.device != "cpu":
                self._profile_kernels(turns)
                self.phases.mark("kernel_profile")

    def _clock_sampler(self) -> ClockSampler:
        """The device's clocks read through the measurements (`harness.clocks`), NVML's device
        found by its CUDA UUID (CUDA_VISIBLE_DEVICES renumbers devices, NVML does not)."""
        context, uuid = self.context, None
        if context.device.startswith("cuda"):
            try:
                uuid = f"GPU-{context.torch.cuda.get_device_properties(context.device_index()).uuid}"
            except (AttributeError, RuntimeError):  # an older torch: NVML's own numbering
                uuid = None
        return ClockSampler.for_device(context.device, context.device_index(), uuid)

    def _check_timed_calls(self, turns: Turns) -> None:
        """A vouched measurement checked outputs of its calls on inputs each saw once; one by
        the worker's timer has each role's last timed call checked, and the candidate timed on
        input sets it never saw (`_first_use`)."""
        if not self.measurement.vouched:
            self.timed_outputs = {
                role: self._timed_output(turns.give(role), self.offers[role]) for role in self.workers
            }
        self.phases.mark("timed_outputs")
        if self.pair and self.mode != "graph" and not self.measurement.vouched:  # a graph replay runs no Python
            self.first_use = self._first_use(turns.give("candidate"))
            self.phases.mark("first_use")

    def _measure_again(self, turns: Turns) -> None:
        """A measurement that failed a check stands failed, but for a probe that waited: its
        wall time is the host's too. Either is measured again, on new input sets, the device
        still held; a failure then stands. An implausible speedup is measured a second time."""
        measured = self.measurement
        first = probe_waited(measured) or (self._disturbed(measured) if self.pair and not measured.failed else None)
        if first:
            self.measured = measured = self._retime(turns, "remeasure")
            self.remeasured = {
                "first": first,
                "again": self._disturbed(measured) if self.pair and not measured.failed else None,
            }
            self.phases.mark("remeasured")
        if self.pair and self.threshold and measured.speedup(measured.statistic()) > self.threshold:
            self.retimed = self._retime(turns)
            self.phases.mark("retimed")

    def _disturbed(self, measured: Rounds) -> str | None:
        return disturbed(measured, self.case, self.t.disturbed_fraction, self.own, self.context.device)

    def _profile_kernels(self, turns: Turns) -> None:
        for role in self.workers:
            known = self.known_of_baseline() if role == "baseline" else {}
            if "kernels" in known:  # the same code on the same inputs as in its own timing
                self.kernels[role] = {
                    "kernel_us": self.own.get("kernel_us"),
                    "kernels": known["kernels"],
                    "from_own_timing": True,
                }
                continue
            reply = turns.give(role).request(
                {"op": "kernels", "inputs": self.offers[role], "out_specs": self.out_specs}, self.context.timeout
            )
            self.kernels[role] = reply if reply["ok"] else {"error": reply["error"]}

    def _recheck(self) -> None:
        """The candidate's outputs checked once more, on a case of a new seed, after its timing."""
        case, testcase = self.case, self.testcase
        recheck_cases = [type(case)(case.label, case.shape, case.dtype, 0, derive_seed(case.seed, "recheck"))]
        self.recheck = run_cases(
            self.context,
            self.pool,
            self.workers["candidate"],
            self.spec,
            recheck_cases,
            "recheck",
            *testcase.tolerances,
        )[0]

    # -- measurements ---------------------------------------------------------------------------
    def _measure(self, turns: Turns) -> Rounds:
        """Batches timed from outside the worker (`batches`) wherever the input sets and outputs
        are plain tensors and values, on the CPU and, where `timing.vouched` says so, on a GPU;
        elsewhere the timer in the worker, checked against the evaluator's wall clock (`_rounds`)."""
        if self._vouching():
            return self._vouched(turns, "timing")
        return self._rounds(turns, self.offers)

    def _retime(self, turns: Turns, salt: str = "retime") -> Rounds:
        """The same measurement again (warm-up, then the rounds, in the mode the probe chose) on
        input sets of new seeds: what an implementation learnt from the first sets, or from
        counting its calls, does not carry over."""
        context = self.context
        if self._vouching():  # as `_measure` chose
            return self._vouched(turns, salt)
        inputs = [self.spec.make_inputs(c) for c in rotation(self.case, salt, self.t.input_sets)]
        offers = {
            role: context.exchange.offer_inputs("retiming", inputs, worker.scratch or context.work)
            for role, worker in turns.workers.items()
        }
        for role in turns.workers:  # each takes the new sets, warms up on them, prepares the mode
            self._time_request(turns.give(role), offers[role], warmup_ms=self.t.warmup_ms, mode=self.mode)
        context.exchange.release()
        return self._rounds(turns, offers)

    def _vouching(self) -> bool:
        """Whether a measurement is a vouched one: on a GPU where `timing.vouched` says so, in
        either mode (in graph mode each batch is one replay of a graph of its calls)."""
        device = self.context.device
        if not vouched_inputs(self.context.torch, self.inputs[0], self.expected, device):
            return False
        return device == "cpu" or (self.mode in ("events", "graph") and self.t.vouched)

    def _vouched(self, turns: Turns, salt: str) -> Rounds:
        known = self.known_of_baseline() if "baseline" in turns.workers else {}
        measurement = BatchMeasurement(
            self.context, turns, self.spec, self.case, self.testcase, self.t, salt, self.mode, known
        )
        return measurement.measure(self.inputs[0], self.expected)

    def known_of_baseline(self) -> dict:
        """What the baseline's own timing job measured in this build that no candidate beside it
        changes: the harness's copy price (the reference's outputs, a device's copy engine), its
        worker's calibration and time per call from its sizing batches (its code, its inputs),
        its kernels. Taken from there, a candidate's job spends its time held alone on the
        candidate (0.2 s of each 1 s job in the H200's 8-candidate compare). From an earlier
        build only where this job adopted the baseline's worker parked since (the zygote, the
        device and the process that build measured, kept warm: an edit's rebuild); never from
        another case or another method."""
        own = self.own
        if (
            not (own.get("this_build") or self.baseline_kept_warm)
            or own.get("shape") != self.case.label
            or own.get("mode") != self.mode
        ):
            return {}
        return {
            key: own[key]
            for key in ("harness_us_per_call", "calibration_us", "sizing_us_per_call", "kernels")
            if own.get(key) is not None
        }

    def _rounds(self, turns: Turns, offers: dict) -> Rounds:
        """One measurement by the timer in each worker: the workers take turns for `rounds`
        rounds (order flipped every round), each round a share of the budget and of the sample
        cap; then each makes HOST_CHECK_CALLS host-synchronised calls, in a request of their own
        (a launch-bound call's host time, 20 ms for 1,800 launches where its graph replay takes
        2.3 ms, is no part of what the rounds' wall time must explain)."""
        t, mode = self.t, self.mode
        roles = list(turns.workers)
        measured = Rounds(roles)
        rounds = t.rounds
        budget_ms, max_reps = t.budget_ms / rounds, max(1, t.max_reps // rounds)
        costs = timer_costs(self.context.device)
        for r in range(rounds):
            for role in roles if r % 2 == 0 else reversed(roles):
                answer = self._time_request(
                    turns.give(role),
                    offers[role],
                    budget_ms=budget_ms,
                    max_reps=max_reps,
                    offset=r,
                    mode=mode,
                    settings=t,
                )
                measured.add(role, answer, mode, costs)
                if (
                    len(answer["samples_ns"]) < sample_cap(mode, max_reps)
                    and answer["wall_s"] * 1000 < EARLY_FRACTION * budget_ms
                ):
                    measured.early[role].append(round(answer["wall_s"] * 1000, 3))
        if self.context.device != "cpu":  # on the CPU the clock around a call already is host time
            for role in roles:
                answer = self._time_request(turns.give(role), offers[role], host_checks=HOST_CHECK_CALLS)
                measured.host_wall[role] = answer.get("host_wall_median_us")
        return measured

    def _timed_output(self, worker: Worker, offer: dict) -> dict:
        """The output of the worker's last timed call, checked against the reference for the
        input set it was given, and that input set checked for changes: a candidate
        right when checked and wrong (or lazy) while timed fails here, not only after timing."""
        context, inputs, expected, testcase = self.context, self.inputs, self.expected, self.testcase
        exchange = context.exchange
        outputs = exchange.offer_outputs("timed", [expected], [inputs[0]], worker.scratch or context.work)
        answer = worker.request({"op": "timed_output", "inputs": offer, "outputs": outputs}, context.timeout)
        if not answer["ok"]:
            raise WorkerFailure(f"error while timing {worker.label}: {answer['error']}")
        index = answer.get("index")
        if index is None:
            exchange.release()
            return {
                "passed": False,
                "kind": "timer_integrity",
                "check": "kept output",
                "index": None,
                "detail": "the timer kept no output of a timed call: the timer in the implementation's "
                "process was replaced",
            }
        produced = exchange.collect(outputs, answer)
        exchange.release()
        if not 0 <= int(index) < len(inputs):
            return {
                "passed": False,
                "kind": "timer_integrity",
                "check": "kept output",
                "index": index,
                "detail": f"the timer named input set {index} of {len(inputs)}",
            }
        reference = expected if index == 0 else self.spec.reference(inputs[index], context.init_seed)
        checked = compare_inputs(inputs[index], produced["inputs_after"][0]) or compare_outputs(
            produced["outputs"][0], reference, *testcase.tolerances
        )
        return {**checked, "index": index}

    def _first_use(self, worker: Worker) -> list[int] | None:
        """The candidate timed once on each of a few input sets it has never seen (no warm-up
        on them): per-call times, or None where such sets would not fit FIRST_USE_BYTES. The
        measurement rotates through a handful of sets, so an implementation that keeps each
        set's result and hands it back when the same tensors come again (correct outputs,
        every check passed) is timed at a lookup; here it must compute."""
        context = self.context
        set_bytes = sum(x.numel() * x.element_size() for x in self.inputs[0] if context.torch.is_tensor(x))
        count = min(FIRST_USE_SETS, int(FIRST_USE_BYTES // max(set_bytes, 1)))
        if count < 2:
            return None
        sets = [self.spec.make_inputs(c) for c in rotation(self.case, "first use", count)]
        offer = context.exchange.offer_inputs("first_use", sets, worker.scratch or context.work)
        try:
            answer = self._time_request(
                worker, offer, budget_ms=FIRST_USE_BUDGET_MS, max_reps=count, offset=0, mode=self.mode, settings=self.t
            )
        finally:
            context.exchange.release()
        return answer["samples_ns"]

    def _time_request(self, worker: Worker, offer: dict, **params) -> dict:
        self._send_time(worker, offer, **params)
        return self._time_answer(worker, **params)

    def _send_time(self, worker: Worker, offer: dict, **params) -> None:
        worker.send({"op": "time", "inputs": offer, "out_specs": self.out_specs, **params})

    def _time_answer(self, worker: Worker, **params) -> dict:
        deadline = self.context.timeout + (params.get("budget_ms", 0) + params.get("warmup_ms", 0)) / 1000
        answer = worker.receive(deadline)
        if not answer["ok"]:
            raise WorkerFailure(f"error while timing {worker.label}: {answer['error']}")
        if params.get("budget_ms") and not answer.get("samples_ns"):
            raise WorkerFailure(f"the timer of {worker.label} returned no samples")
        return answer

    # -- the result ---------------------------------------------------------------------------
    def _result(self) -> dict:
        context, device, t = self.context, self.context.device, self.t
        case, spec_index, pair = self.case, self.spec_index, self.pair
        measured, recheck, timed_outputs = self.measurement, self.recheck, self.timed_outputs
        floor = self.spec.min_bytes(self.inputs[0], self.expected)
        kept = measured.kept()
        result: dict[str, Any] = {
            "performance_state": "SUCCESS",
            "errors": [],
            "warnings": [],
            "recheck": recheck,
            "samples_us": [s / 1000 for s in kept["candidate"][0]],
            "round_sizes": kept["candidate"][1],
            "baseline_samples_us": [s / 1000 for s in kept["baseline"][0]] if pair else None,
            "baseline_round_sizes": kept["baseline"][1] if pair else None,
            "min_bytes": floor,
            "baseline_result": None,
            "phases_s": self.phases.seconds,
            "device_held_s": round(self.device_held_s, 4),
            "first_call_steps_s": self.first_steps,
            "worker_loads_s": self.pool.worker_loads,
            "workers_adopted": {**self.adopted, **{role: worker.adopted for role, worker in self.workers.items()}},
            "timing_method": self.method,
            "measurement_steps_s": measured.steps_s or None,
            "round_parts_s": measured.round_parts_s or None,
            "timer_costs": None if measured.vouched else timer_costs(device),
            "clocks": self.clocks,
        }
        result["timed_output_check"] = {
            role: {k: checked.get(k) for k in ("passed", "check", "index")} for role, checked in timed_outputs.items()
        }
        for role, failed in measured.failed.items():
            fail(
                result,
                failed["kind"],
                f"{role}: {failed['where']}: {failed['check']}: {failed['detail']}",
                case,
                spec_index,
            )
        if self.first_use is not None:
            result["first_use"] = first_use_verdict(self.first_use, fmean(measured.samples["candidate"]) / 1000)
            if result["first_use"]["line"]:
                fail(result, "timer_integrity", f"candidate: {result['first_use']['line']}", case, spec_index)
        for role, checked in timed_outputs.items():
            if not checked["passed"]:
                fail(
                    result,
                    checked["kind"],
                    f"{role}: the last timed call: {checked['check']}: {checked['detail']}",
                    case,
                    spec_index,
                )
        by_role = summaries(measured, case, self.kernels, self.impls, device)
        for role, summary in by_role.items():  # the baseline's worker is parked by now, its samples kept
            summary["clocks"] = self.clocks  # both roles' rounds were interleaved under the same clocks
            result["performance_result" if role == "candidate" else "baseline_result"] = summary
            problem = None if measured.vouched else timer_inconsistency(summary, device)
            if problem:
                fail(result, "timer_integrity", f"{role}: {problem}", case, spec_index)
            flag = (
                None
                if measured.vouched
                else host_wall_gap(summary, timer_costs(device).get("host_check_ns", 0.0) / 1000)
            )
            if flag:
                summary.setdefault("flags", []).append(flag)
                result["warnings"].append(f"{role}: {flag}")
                record(result, "flags", "untimed_work", f"{role}: {flag}", case, spec_index)
            if uneven_calls(summary["mean_us"], summary["median_us"]):
                flag_uneven(result, summary, role, pair, case, spec_index)
            note = few_samples(summary, measured.calls[role] if measured.vouched else measured.sizes[role], t.budget_ms)
            if note:
                result["warnings"].append(f"{role}: {note}")
        if measured.alone_bound and measured.alone_bound["failed"]:
            fail(result, "calls_done_together", f"candidate: {alone_line(measured.alone_bound)}", case, spec_index)
        held = unbounded_line(measured)
        if held:
            by_role["candidate"].setdefault("flags", []).append(held)
            result["warnings"].append(f"candidate: {held}")
            record(result, "flags", "unbounded_calls", f"candidate: {held}", case, spec_index)
        for role, summary in by_role.items():
            verdict = roofline(context.torch, device, summary, floor, self.expected)
            if verdict is None:
                continue
            kind, line = verdict
            if kind == "impossible":
                consequence = (
                    "impossible, not ranked"
                    if role == "candidate"
                    else "impossible: a comparison with it cannot be trusted"
                )
                fail(result, "impossible_time", f"{role}: {line}: {consequence}", case, spec_index)
            else:
                summary.setdefault("flags", []).append(line)
                result["warnings"].append(f"{role}: {line}")
                record(result, "flags", "impossible_time", f"{role}: {line}", case, spec_index)
        if self.remeasured:
            result["remeasured"] = self.remeasured
            result["warnings"].append(f"measured again: {self.remeasured['first']}")
            if self.remeasured["again"]:
                result["warnings"].append(f"measured again, still: {self.remeasured['again']}")
                record(result, "flags", "disturbed_measurement", self.remeasured["again"], case, spec_index)
        if not recheck["passed"]:
            result["performance_state"] = "FAILED"
            result["errors"].append(f"incorrect after timing: {recheck['check']}: {recheck['detail']}")
            detail = f"after timing: {recheck['detail']}"
            result.setdefault("failures", []).append(
                failure(recheck["kind"], "timing", detail, {**recheck, "testcase": spec_index})
            )
        if self.busy_shares:
            result["busy_remeasured"] = {"cpu_wait_shares": [*self.busy_shares, measured.cpu_wait_share]}
        doubts = measured.in_doubt()
        if doubts and {f["kind"] for f in result.get("failures", [])} == {"calls_done_together"}:
            assert measured.cpu_wait_share is not None  # in doubt: its share read busy
            inconclusive(result, doubts, [*self.busy_shares, measured.cpu_wait_share], case, spec_index)
        if pair and result["performance_state"] == "SUCCESS":
            self._judge_speedup(result)
        return result

    def _judge_speedup(self, result: dict) -> None:
        """Here, in the timing job, not in the comparison: the timing jobs finish one by one
        while others measure, the comparison waits for the last of them. Means where a role's
        calls are uneven, in either measurement; the re-timing uses the same."""
        case, spec_index, measured, retimed = self.case, self.spec_index, self.measurement, self.retimed
        between_runs = for_device(self.t.between_runs, DEFAULT_BETWEEN_RUNS, self.context.device)
        uneven = measured.uneven() or (retimed.uneven() if retimed is not None else {})
        statistic = "mean" if uneven else "median"
        samples = measured.for_speedup(statistic)
        result["speedup"] = paired_speedup(samples, result["baseline_result"]["median_us"], statistic, between_runs)
        if retimed is not None:
            judge_retiming(
                result,
                retimed,
                float(self.threshold),
                case,
                spec_index,
                self.impls,
                self.context.device,
                statistic,
                between_runs,
            )
        unvouched = unvouched_speedup_line(result["speedup"], measured, retimed)
        if unvouched and result["performance_state"] == "SUCCESS":
            fail(result, "timer_integrity", f"candidate: {unvouched}", case, spec_index)
        bounded = credit_within_calls_alone(result["speedup"], measured.alone_bound, samples["candidate"][0], statistic)
        if bounded:
            result["warnings"].append(f"candidate: {bounded}")
            record(result, "flags", "bounded_by_calls_alone", f"candidate: {bounded}", case, spec_index)
