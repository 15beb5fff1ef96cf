"""A measurement the evaluator vouches for: the rounds as batches of calls on input sets of
new seeds, timed by the evaluator's own clock (`harness.batches`): the regions mapped into the
workers, the harness's price or a GPU's copy price and calibration, batches sized to a share of
the budget, the rounds, each round's calls made alone (`alone_bound`), and every batch's
outputs checked. One `BatchMeasurement` per measurement owns what its steps share: the workers'
turns, the spec, case and testcase, the settings, the seeds' salt, the regions and the
`Rounds` it fills."""

from __future__ import annotations

import contextlib
import math
import time
from statistics import fmean, median
from typing import cast

from magpie.harness import batches, stream_words
from magpie.harness.checks import compare_inputs, compare_outputs, surely_close
from magpie.harness.context import EvaluationContext
from magpie.harness.device_region import DeviceRegion
from magpie.harness.laps import Laps
from magpie.harness.measurement import (
    ALONE_PAIRS,
    ALONE_SHARE,
    HANDOVER_CALLS,
    HANDOVER_MIN_CALLS,
    HANDOVER_TRIM,
    HANDOVER_WAIT_NS,
    HANDOVER_WAIT_SHARE,
    launch_floor,
)
from magpie.harness.pool import Turns
from magpie.harness.regions import Layout, Region, calls_that_fit, region_bytes
from magpie.harness.rounds import Batch, Rounds, batch_phases, other_size, vouched_method
from magpie.harness.spec import Case, ReferenceSpec, rotation
from magpie.harness.wire import Testcase, TimingSettings
from magpie.linux import cputime
from magpie.supervision.session import Worker, WorkerFailure

# A vouched round is BATCHES_PER_ROUND batches; the sizing ones aim at a round's budget over
# that, within these bounds.
BATCHES_PER_ROUND = 4
BATCH_MIN_MS = 1.0
# On a GPU a batch's fixed cost (the GPU switching between the two processes and back, about
# 0.3 ms on the H200) and its jitter would weigh on a batch of 1 ms.
DEVICE_BATCH_MIN_MS = 5.0
BATCH_MAX_MS = 20.0
SIZING_BATCHES = 6
# The input sets a vouched measurement draws take at most this many times its budget to make
# (at twice, an edit's CPU timing job took 2.0-2.4 s for 0.6 s of budget; at once, 1.2-1.4 s).
GENERATION_FACTOR = 1.0
# On a GPU, a probe after a batch's checks that takes this many times an idle one (and at
# least LATE_PROBE_MIN_NS) waited on work the worker left running.
LATE_PROBE_FACTOR = 20
LATE_PROBE_MIN_NS = 500_000
CALIBRATION_BATCHES = 7
COPY_CALIBRATION_CALLS = 16
WALL_SHARE = 4.0


class BatchMeasurement:
    def __init__(
        self,
        context: EvaluationContext,
        turns: Turns,
        spec: ReferenceSpec,
        case: Case,
        testcase: Testcase,
        t: TimingSettings,
        salt: str,
        mode: str | None,
        known: dict,
    ):
        """`t`: the timing settings; `salt`: what the seeds of its input sets are drawn with;
        `mode`: the GPU timing method; `known`: what the baseline's own timing job measured
        that this one may take (`TimingSession.known_of_baseline`)."""
        self.context = context
        self.turns = turns
        self.spec, self.case, self.testcase = spec, case, testcase
        self.t, self.salt, self.mode, self.known = t, salt, mode, known
        self.roles = list(turns.workers)
        self.on_gpu = context.device.startswith("cuda")
        self.regions: dict[str, Region] = {}
        self.measured = Rounds(self.roles, vouched=True)

    def measure(self, example: tuple, expected) -> Rounds:
        """The rounds as batches (`batches`): both workers are given the same input sets of new
        seeds per batch, in turn (the order flipped every batch), BATCHES_PER_ROUND batches a
        round. Each role's calls a round are its share of the budget at the time per call its
        sizing batches took, within its share of the sample cap and of the input sets the
        evaluator makes in GENERATION_FACTOR times the budget (fresh inputs for every call can
        cost more than the calls: a 66 µs softmax's inputs take 1-7 ms to draw)."""
        torch = self.context.torch
        roles, on_gpu, regions, measured = self.roles, self.on_gpu, self.regions, self.measured
        spec, t = self.spec, self.t
        limit = calls_that_fit(example, expected, region_bytes(torch, self.context.device))
        layout = Layout(example, expected, limit)
        measured.by_cpu_time = not on_gpu and t.threads == 1 and cputime.SCHEDSTAT
        measured.graph = on_gpu and self.mode == "graph"
        steps = Laps()
        rounds = t.rounds
        round_ns = t.budget_ms / rounds * 1e6
        try:
            for role in roles:
                regions[role] = (
                    DeviceRegion(torch, layout, self.context.device, graph=measured.graph)
                    if on_gpu
                    else Region(torch, self.turns.workers[role].scratch or self.context.work, layout)
                )
                answer = self.turns.give(role).request(
                    {"op": "batch_map", "region": regions[role].offer()}, self.context.timeout
                )
                if not answer["ok"]:
                    raise WorkerFailure(f"error while timing {self.turns.workers[role].label}: {answer['error']}")
                # the process that says it runs the calls: a false one makes no batch count less
                # than its worker's CPU time (`busy_wall_ns`)
                regions[role].caller = cputime.process_named(
                    self.turns.workers[role].proc.pid, int(answer.get("pid", 0))
                )
            machine = None if on_gpu else cputime.MachineShare([region.caller for region in regions.values()])
            steps.mark("regions")
            # what this measurement takes (the kernel list is the timing job's): on the CPU only
            # the sizing, the harness's price and a calibration being a GPU's
            known = {
                key: value
                for key, value in self.known.items()
                if key == "sizing_us_per_call" or (on_gpu and key != "kernels")
            }
            measured.reused = {"baseline": sorted(known)} if known else {}
            if on_gpu:
                if "harness_us_per_call" in known:
                    measured.harness_ns = known["harness_us_per_call"] * 1000
                else:
                    sets = self._fresh_sets(f"{self.salt} copies", min(limit, COPY_CALIBRATION_CALLS))
                    measured.harness_ns = batches.copy_ns_per_call(
                        torch, lambda args: spec.reference(args, self.context.init_seed), sets, expected, measured.graph
                    )
                steps.mark("copy_price")
                calibrated = {
                    role: region
                    for role, region in regions.items()
                    if not (role == "baseline" and "calibration_us" in known)
                }
                # on a GPU (where calibrating is done) every region is a DeviceRegion
                measured.calibration_ns, measured.calibration_phases = self._calibrate(
                    cast(dict[str, DeviceRegion], calibrated)
                )
                if "calibration_us" in known:
                    measured.calibration_ns["baseline"] = known["calibration_us"] * 1000
                steps.mark("calibration")
            else:
                harness = batches.HarnessPrice(torch, expected, min(limit, 64), t.threads)
                measured.harness_ns = harness.measure(3)
                steps.mark("harness_price")
            shortest_ms = DEVICE_BATCH_MIN_MS if on_gpu else BATCH_MIN_MS
            target_ns = min(BATCH_MAX_MS * 1e6, max(shortest_ms * 1e6, round_ns / BATCHES_PER_ROUND))
            per_call = {
                role: known["sizing_us_per_call"] * 1000
                if role == "baseline" and "sizing_us_per_call" in known
                else self._size_batches(role, regions[role], limit, target_ns)
                for role in roles
            }
            measured.per_call_ns = per_call
            steps.mark("sizing")
            sets_a_round = int(GENERATION_FACTOR * t.budget_ms * 1e6 / max(measured.set_ns, 1.0) / rounds)
            cap = min(max(1, t.max_reps // rounds), max(BATCHES_PER_ROUND, sets_a_round))
            # batches of one call cannot be done together; on the CPU the bound is drawn from CPU
            # times (one torch thread)
            alone = len(roles) == 2 and limit > 1 and (on_gpu or measured.by_cpu_time)
            # the calls made alone take their share of each round out of the roles' batches: a
            # round keeps to its budget (the H200's compare of eight Triton candidates held the
            # device 0.65-0.76 s for each candidate's 0.6 s when they came on top)
            batches_ns = round_ns * (1 - ALONE_SHARE / len(roles)) if alone else round_ns
            a_round = {role: max(1, min(cap, int(batches_ns / max(per_call[role], 1.0)))) for role in roles}
            calls = batch_sizes(a_round, limit, matched=not on_gpu)
            measured.round_laps = Laps()
            for r in range(rounds):
                if not on_gpu:  # priced again in each round (in its "draw" part): the least of all is taken off
                    measured.harness_ns = harness.measure(1)
                made = dict.fromkeys(roles, 0)
                b = 0
                # on a GPU, batches of two sizes in turn tell what a batch costs besides its calls
                # (`fixed_cost`)
                while due := {
                    role: min(
                        calls[role] if not on_gpu or b % 2 == 0 else other_size(calls[role], limit),
                        a_round[role] - made[role],
                    )
                    for role in roles
                    if made[role] < a_round[role]
                }:
                    batch = Batch(
                        self._fresh_sets(f"{self.salt} {r} {b}", max(due.values())), spec, self.context.init_seed
                    )
                    measured.lap("draw")
                    for role in roles if b % 2 == 0 else reversed(roles):
                        if role in due:
                            # 20x what the sizing said a call takes, and the timeout, before it is a hang
                            self._batch(role, regions[role], batch, due[role], r, 20 * due[role] * per_call[role] / 1e9)
                            made[role] += due[role]
                    b += 1
                if alone:
                    self._alone(r, per_call, limit, round_ns, calls["candidate"])
            steps.mark("rounds")
            measured.round_parts_s = measured.round_laps.seconds
            measured.round_laps = None
        finally:
            for role, region in regions.items():
                # its mapping holds the region's memory (on the CPU a removed file the sandbox charges the worker for)
                if not self.turns.workers[role].failed:
                    try:
                        self.turns.give(role).request({"op": "batch_unmap"}, self.context.timeout)
                    except WorkerFailure:  # a worker that dies here holds nothing; the timing's own error stands
                        self.turns.workers[role].failed = True
                region.close()
        steps.mark("unmap")
        measured.steps_s = steps.seconds
        if on_gpu:
            measured.settle_device_batches()
        else:
            assert machine is not None  # the CPU's
            measured.harness_runs_ns = harness.runs_ns
            measured.cpu_wait_share = machine.share()
            measured.settle_samples(capped=True)
        for role in roles:
            raw_ns = measured.raw_median_ns(role)
            # the copy's price whole, not what the cap left taken off: the floor is the copy's
            floor = (
                launch_floor(max(1.0, raw_ns - measured.harness_ns), measured.harness_ns)
                if raw_ns is not None
                else None
            )
            if floor and role not in measured.failed:
                # a call that read more than its copy may have been read short by a busy machine
                measured.failed[role] = {
                    "passed": False,
                    "check": "launch_floor",
                    "kind": "calls_done_together",
                    "where": "its batches",
                    "detail": floor,
                    "floor_in_doubt": not on_gpu and raw_ns is not None and raw_ns >= measured.harness_ns,
                }
        measured.judge_calls_alone()
        measured.methods = {role: vouched_method(calls[role], measured, t, self.context.device) for role in roles}
        return measured

    def _alone(
        self, round_index: int, per_call: dict[str, float], limit: int, round_ns: float, candidate_calls: int
    ) -> None:
        """A round's calls made alone (`alone_bound`), not samples but checked like any batch:
        both roles on the same input sets of new seeds, back to back, the order flipped every
        two pairs. On the CPU (one torch thread, timed by CPU time), batches handed over one call
        at a time, each call timed on its own (`_handover_batch`), the evaluator and the workers
        on CPUs apart (none where one CPU is allowed), of two calls at least (HANDOVER_MIN_CALLS);
        on a GPU, batches handed over one call at a time on the GPU itself
        (`_device_handover_batch`), of one call where more would not fit. Where the candidate's
        batches hold more than one call, the least is made however long it takes: a slow
        baseline beside a fast candidate would otherwise leave its batches unbounded."""
        roles = list(self.turns.workers)
        on_gpu = self.context.device.startswith("cuda")
        share_ns = ALONE_SHARE * round_ns
        slowest = max(max(per_call.values()), 1.0)
        most = ALONE_PAIRS["gpu" if on_gpu else "cpu"]
        if on_gpu:
            # a call handed over costs the GPU's switch between the processes both ways too: about
            # a batch's fixed cost (`_calibrate`)
            step_ns = slowest + max(self.measured.calibration_ns.values(), default=0.0)
            calls = min(limit, HANDOVER_CALLS, int(share_ns / most / 2 / step_ns))
            if candidate_calls > 1:
                calls = max(1, calls)
            if calls < 1 or not stream_words.available():
                return
            self.measured.alone_launched_apart = self.measured.graph and not stream_words.capturable(
                self.regions[roles[0]].copy.device.index
            )
            pairs = max(1, min(most, int(share_ns / (2 * step_ns * calls))))
        else:
            calls = min(limit, HANDOVER_CALLS, int(share_ns / most / slowest))
            if candidate_calls > 1:
                calls = max(min(limit, HANDOVER_MIN_CALLS), calls)
            if calls < HANDOVER_MIN_CALLS:
                return  # its first call, cold after the worker was stopped, is left out: none would be left
            pairs = max(1, min(most, int(share_ns / (2 * slowest * calls))))
        self.measured.alone_calls = calls
        # a GPU's batches run with no host taking part, on no CPUs apart: -1 stands for "none pinned"
        with (
            contextlib.nullcontext(-1)
            if on_gpu
            else cputime.apart([worker.proc.pid for worker in self.turns.workers.values()]) as workers_cpu
        ):
            for k in range(pairs if workers_cpu is not None else 0):
                batch = Batch(
                    self._fresh_sets(f"{self.salt} {round_index} alone {k}", calls), self.spec, self.context.init_seed
                )
                taken, disturbed = {}, False
                for role in roles if k // 2 % 2 == 0 else reversed(roles):
                    allowed_s = 20 * calls * per_call[role] / 1e9 + 1.0
                    if on_gpu:
                        region = cast(DeviceRegion, self.regions[role])  # on a GPU
                        batch_ns, early = self._device_handover_batch(role, region, batch, calls, allowed_s)
                        taken[role] = batch_ns / calls
                        disturbed |= early
                    else:
                        taken[role], batch_ns, waited_ns, own_threads = self._handover_batch(
                            role, self.regions[role], batch, calls, allowed_s, workers_cpu
                        )
                        if own_threads and waited_ns > HANDOVER_WAIT_NS + HANDOVER_WAIT_SHARE * batch_ns:
                            self.measured.alone_held_by_own_threads[role] += 1
                            disturbed = True
                # threads of the worker's own that kept its calling thread waiting, or a GPU batch
                # that began before the worker had queued its calls: the pair is noise, not a
                # measurement
                if disturbed:
                    self.measured.alone_disturbed += 1
                else:
                    for role in roles:
                        self.measured.alone[role].append(taken[role])
                self.measured.lap("alone")

    def _handover_batch(
        self, role: str, region: Region, batch: Batch, calls: int, allowed_s: float, workers_cpu: int
    ) -> tuple[float, float, int, bool]:
        """A CPU batch whose input sets the worker sees one at a time (`batches.run_handed_over`):
        each written and released once the last call said it was done, that call's outputs
        taken as they were then. Returns what a call cost: the evaluator's clock from each
        release to the call's word that it is done, less what the worker's calling thread and
        the evaluator waited for a CPU meanwhile (`batches.handed_over_call_ns`), the mean of the
        batch's calls, its first (cold after the worker was stopped) and its slowest
        HANDOVER_TRIM (one at least) left out. The worker's CPU is its own (`cputime.apart`) and
        its calls have nothing to wait for, so that is their CPU time, however the worker waits
        between them (the batch's CPU time holds the worker's waits for each set too, which a
        worker that sleeps for them spends less of); another process's time slice on either CPU
        is taken off the call it lands in, and what is left of it the trim leaves out.
        Also the CPU time of the worker's processes from its first set's release until it was
        stopped after its last call, taken as `_batch` takes it but for the sandbox's own waiter
        and init (whose look at the sandbox's folders every 0.1 s read as threads of the
        worker's own on a busy machine, which left its pairs out or kept its calls' wall
        times); how long the worker's calling thread waited for its CPU meanwhile; and whether
        other threads or processes of the worker ran meanwhile (which keep its calling thread
        waiting on the CPU it was given: `_alone` leaves such pairs out). A worker whose threads
        left `workers_cpu` (`cputime.apart`) could make the evaluator wait: its timing fails."""
        worker = self.turns.workers[role]
        if not worker.stopped:
            self._hold(worker)
        region.start_handover(batch.sets[:calls])
        self.turns.give(role)
        worker.send({"op": "batch_handover"})  # not how many: it cannot treat one size unlike the other
        limit_s = self.context.timeout + allowed_s
        deadline = time.monotonic() + limit_s
        before = after = None
        walls, call_ns = [], []
        if self._await_calls(worker, region, 0, deadline, limit_s):  # waiting for its first set
            self._hold(worker)
            before = cputime.TreeTimes(region.caller, region.caller)
            worker.resume()
            with contextlib.closing(cputime.CallWaits(region.caller)) as waits:
                for call in range(calls):
                    region.put(call)
                    waited = waits.read()
                    released = time.perf_counter_ns()
                    region.release(call)
                    if not self._await_calls(worker, region, call + 1, deadline, limit_s):
                        break
                    walls.append(time.perf_counter_ns() - released)
                    call_ns.append(batches.handed_over_call_ns(walls[-1], waits.read() - waited))
                    region.take_output(call)
            if len(call_ns) == calls:
                self._hold(worker)
                after = cputime.TreeTimes(region.caller, region.caller)
                worker.resume()
                region.end_handover()
        answer = worker.receive(max(0.0, deadline - time.monotonic()))
        self._hold(worker)
        if not answer["ok"]:
            raise WorkerFailure(f"error while timing {worker.label}: {answer['error']}")
        if before is None or after is None:
            raise WorkerFailure(
                f"error while timing {worker.label}: it answered a batch handed over one call at a "
                "time before its calls were done"
            )
        _note_processes(self.measured, role, calls, before, after)
        moved = cputime.moved_threads(worker.proc.pid, workers_cpu)
        if moved and role not in self.measured.failed:
            self.measured.failed[role] = {
                "passed": False,
                "check": "affinity",
                "kind": "timer_integrity",
                "where": f"a batch of {calls} calls made alone",
                "detail": f"{len(moved)} thread(s) of the worker left the CPU its calls made alone were "
                "given: on the evaluator's it could hold the evaluator up and have those calls left out",
            }
        self._judge_batch(role, region, batch, calls, taken=True)
        cpu_ns = after.cpu_since(before)
        others_ns = cpu_ns - (after.main_cpu - before.main_cpu)
        own_threads = others_ns > HANDOVER_WAIT_NS
        call_ns = batches.calls_handed_over_ns(walls, call_ns, others_ns)
        kept = sorted(call_ns[1:] or call_ns)
        kept = kept[: len(kept) - math.ceil(HANDOVER_TRIM * (len(kept) - 1))]
        return fmean(kept), cpu_ns, after.waiting - before.waiting, own_threads

    def _device_handover_batch(
        self, role: str, region: DeviceRegion, batch: Batch, calls: int, allowed_s: float
    ) -> tuple[float, bool]:
        """A GPU batch handed over one call at a time (`DeviceRegion.start_handover`; in graph
        mode one replay of the worker's graph of such a batch, `_capture`), checked like any
        batch: its GPU time in ns, and whether its first set was released before the worker had
        queued its calls (its queueing timed too)."""
        if not self.measured.alone_launched_apart:
            self._capture(role, region, calls, allowed_s, handed_over=True)
        worker = self.turns.workers[role]
        if not worker.stopped:
            self._hold(worker)
        region.write(batch.sets[:calls])
        started = time.perf_counter_ns()
        region.start_handover(calls)
        limit_s = self.context.timeout + allowed_s
        try:
            self.turns.give(role)
            worker.send({"op": "batch_handover", "calls": calls})
            answer = worker.receive(limit_s)
            early = region.handover_answered(time.perf_counter_ns() - started)
            if not answer["ok"]:
                raise WorkerFailure(f"error while timing {worker.label}: {answer['error']}")
            taken_ns = region.end_handover(time.monotonic() + limit_s)
        except TimeoutError:
            raise worker.overdue(f"timeout after {limit_s:g} s: a call handed over was never said to be done") from None
        except BaseException:
            region.release_handover()  # its stream would wait on the worker's word for good
            raise
        self._hold(worker)
        self.measured.lap("alone")
        self._judge_batch(role, region, batch, calls, taken=True)
        self._late_work(role, region, f"after a batch of {calls} handed over one at a time")
        return taken_ns, early

    @staticmethod
    def _await_calls(worker: Worker, region: Region, count: int, deadline: float, limit_s: float) -> bool:
        """Until the worker says `count` calls of a handed-over batch are done (0: it waits for
        its first set); False where it answered instead (an error, which its answer says)."""
        polls = 0
        while region.calls_done() < count:
            polls += 1
            if polls % 256 == 0:
                if worker.answering():  # done just now, or it gave up
                    return region.calls_done() >= count
                if time.monotonic() > deadline:
                    raise worker.overdue(f"timeout after {limit_s:g} s")
        return True

    def _size_batches(self, role: str, region: Region, limit: int, target_ns: float) -> float:
        """ns per call for one role, from batches (not kept as samples, but checked) grown from
        one call until one after the first takes half a batch's target: the first touches of
        the region and the request's own handling weigh on the small ones. What plans the
        rounds is the larger of the time that ranks and, on the CPU, a WALL_SHARE-th of the wall
        time: a call that sleeps costs the build time too; a busy machine's waits, up to that
        share, do not shrink the batches. On a GPU, where drawing a call's inputs, copying them
        in and its outputs out and checking them can cost several times a memory-bound call
        (an H200 compare of eight 47 µs kernels took 45 s where the worker's timer took 9), the
        whole wall time of the batch, from drawing its inputs to the end of its checks."""
        on_gpu = isinstance(region, DeviceRegion)
        calls, allowed_s = 1, self.context.timeout
        for attempt in range(SIZING_BATCHES):
            self._capture(role, region, calls, allowed_s)  # once per size: not a call's cost
            started = time.perf_counter_ns()
            batch = Batch(
                self._fresh_sets(f"{self.salt} sizing {role} {attempt}", calls), self.spec, self.context.init_seed
            )
            taken_ns = self._batch(role, region, batch, calls, None, allowed_s)
            if on_gpu:
                per_call = max(taken_ns, time.perf_counter_ns() - started) / calls
            else:
                taken_ns = max(taken_ns, self.measured.last_wall_ns / WALL_SHARE)
                per_call = taken_ns / calls
            if attempt and (taken_ns >= target_ns / 2 or calls == limit):  # never the first: it maps the region
                break
            calls = min(limit, max(2 * calls, int(calls * target_ns / max(taken_ns, 1.0))))
            allowed_s = 20 * calls * per_call / 1e9
        return per_call

    def _fresh_sets(self, salt: str, count: int) -> list:
        """`count` input sets of new seeds; how long one took to make goes to `measured.set_ns`:
        on the CPU the least seen, in this thread's CPU time. A pause in one draw of a few sets (a
        collection, a busy machine's wait) would cap a round's calls (`sets_a_round`), and in
        batches of a few calls a replaced batch loop's calls done together read above the floor
        (`launch_floor`)."""
        on_cpu = self.context.device == "cpu"
        clock = time.thread_time_ns if on_cpu else time.perf_counter_ns
        started = clock()
        sets = [self.spec.make_inputs(c, checked=False) for c in rotation(self.case, salt, count)]
        took = (clock() - started) / count
        self.measured.set_ns = min(self.measured.set_ns, took) if on_cpu and self.measured.set_ns else took
        return sets

    def _batch(
        self, role: str, region: Region, batch: Batch, calls: int, round_index: int | None, allowed_s: float
    ) -> float:
        """The first `calls` sets of a batch, for one worker: the time it took in ns, the CPU time
        of all the worker's threads and processes (`measured.by_cpu_time`, one torch thread) or
        its wall time less the scheduler's waits (`busy_wall_ns`). The worker is stopped while
        its input sets are written and again as soon as it answers, before its outputs are read."""
        worker = self.turns.workers[role]
        self._capture(role, region, calls, allowed_s)
        if not worker.stopped:
            self._hold(worker)
        region.write(batch.sets[:calls])
        self.measured.lap("write")
        if isinstance(region, DeviceRegion):
            return self._device_batch(role, region, batch, calls, round_index, allowed_s)
        before = cputime.TreeTimes(worker.proc.pid, region.caller)
        self.turns.give(role)
        waited = cputime.own_wait()
        started = time.monotonic()
        worker.send({"op": "batch", "calls": calls})
        answer = worker.receive(self.context.timeout + allowed_s)
        # until it is stopped: what it computes after answering, before its outputs are read, counts
        self._hold(worker)
        wall_ns = (time.monotonic() - started) * 1e9
        waited = cputime.own_wait() - waited
        if not answer["ok"]:
            raise WorkerFailure(f"error while timing {worker.label}: {answer['error']}")
        after = cputime.TreeTimes(worker.proc.pid, region.caller)
        cpu_ns = after.cpu_since(before)
        taken_ns = (
            cpu_ns
            if self.measured.by_cpu_time
            else batches.busy_wall_ns(wall_ns, cpu_ns, after.waiting - before.waiting + waited)
        )
        _note_processes(self.measured, role, calls, before, after)
        self.measured.last_wall_ns = wall_ns
        if round_index is not None:
            self.measured.add_batch(role, round_index, taken_ns, calls, wall_ns / 1e9)
        self.measured.lap("request")
        self._judge_batch(role, region, batch, calls)
        self.measured.lap("check")
        return taken_ns

    def _capture(self, role: str, region: Region, calls: int, allowed_s: float, handed_over: bool = False) -> None:
        """In graph mode, the worker's CUDA graph of a batch of `calls` calls (`handed_over`: of
        one handed over one call at a time, whose calls' kernels then cost what a batch's do),
        once per size: captured on the last batch's input sets, before the next one's are written."""
        if not (isinstance(region, DeviceRegion) and region.graph):
            return
        captured = region.captured_handed_over if handed_over else region.captured
        if calls not in captured:
            op = "handover_graph" if handed_over else "batch_graph"
            answer = self.turns.give(role).request({"op": op, "calls": calls}, self.context.timeout + 2 * allowed_s)
            if not answer["ok"]:
                what = "a batch handed over one call at a time" if handed_over else "a batch"
                raise WorkerFailure(
                    f"error while timing {self.turns.workers[role].label}: capturing the CUDA graph of "
                    f"{what}: {answer['error']}"
                )
            captured.add(calls)

    def _device_batch(
        self, role: str, region: DeviceRegion, batch: Batch, calls: int, round_index: int | None, allowed_s: float
    ) -> float:
        """A batch on a GPU, its input sets written: the GPU time between the evaluator's own
        events around the worker's calls (`DeviceRegion`). Work the worker left running behind
        its event (on a stream of its own, say) has written the outputs the checks read by the
        time the evaluator's stream took them, or fails them; a probe after the checks that
        still waits on such work fails the batch."""
        taken_ns, self.measured.last_wall_ns = self._device_request(
            role, region, calls, allowed_s, self.measured.phases[role] if round_index is not None else None
        )
        self.measured.device_batches[role].append((round_index, taken_ns, calls, self.measured.last_wall_ns / 1e9))
        self.measured.lap("request")
        self._judge_batch(role, region, batch, calls)
        self.measured.lap("check")
        self._late_work(role, region, f"after a batch of {calls}")
        return taken_ns

    def _late_work(self, role: str, region: DeviceRegion, where: str) -> None:
        """A probe after a batch's checks that still waits on the worker's work fails the batch."""
        late_ns = region.probe_ns()
        self.measured.lap("probe")
        late = late_ns > max(LATE_PROBE_FACTOR * region.idle_probe_ns, LATE_PROBE_MIN_NS)
        if late and role not in self.measured.failed:
            self.measured.failed[role] = {
                "passed": False,
                "check": "gpu_idle",
                "kind": "timer_integrity",
                "where": where,
                "detail": f"the GPU was still busy with the worker's work after it answered and its outputs were "
                f"read (a probe took {late_ns / 1000:.0f} µs, {region.idle_probe_ns / 1000:.0f} µs idle): "
                f"its time cannot be vouched for",
            }

    def _device_request(
        self,
        role: str,
        region: DeviceRegion,
        calls: int,
        allowed_s: float,
        phases: list | None = None,
        own_kernel: bool = False,
    ) -> tuple[float, int]:
        """GPU ns between the evaluator's events around a batch request (`DeviceRegion.start`,
        `stop_clock`), and the host's wall ns from the request until the worker was stopped;
        where the time went goes to `phases` (`batch_phases`). `own_kernel`: a batch of no calls
        in which the worker runs one small kernel of the harness's."""
        worker = self.turns.give(role)
        started = time.perf_counter_ns()
        region.start()
        worker.send(
            {"op": "batch", "calls": calls, "graph": bool(region.graph) and not own_kernel, "own_kernel": own_kernel}
        )
        answer = worker.receive(self.context.timeout + allowed_s + region.sleep_ns / 1e9)
        answered = time.perf_counter_ns()
        opened_early = region.answered(answered - started)
        region.stop_clock(calls)
        self._hold(worker)
        held = time.perf_counter_ns()
        taken_ns = region.taken_ns()
        if not answer["ok"]:
            raise WorkerFailure(f"error while timing {worker.label}: {answer['error']}")
        if phases is not None:
            phases.append(
                {
                    "calls": calls,
                    "clock_ns": taken_ns,
                    "answer_ns": answered - started,
                    "stop_ns": held - answered,
                    "worker_loop_ns": answer.get("loop_ns"),
                    "opened_early": opened_early,
                }
            )
        return taken_ns, held - started

    def _calibrate(self, calibrated: dict[str, DeviceRegion]) -> tuple[dict[str, float], dict]:
        """The most `fixed_cost` may take off a batch, per worker: what a batch of no calls in
        which the worker runs one small kernel of the harness's costs on the evaluator's events
        (the gate's opening reaching its stream, the GPU switching to its process and back; a
        batch of nothing at all leaves the switch out), the median of a few; also where their
        time went (`batch_phases`)."""
        trips: list[dict] = []
        taken: dict[str, list[float]] = {role: [] for role in calibrated}
        for _ in range(CALIBRATION_BATCHES):
            for role, region in calibrated.items():
                taken[role].append(self._device_request(role, region, 0, 1.0, trips, own_kernel=True)[0])
        return {role: median(times) for role, times in taken.items()}, batch_phases(trips)

    def _judge_batch(self, role: str, region: Region, batch: Batch, calls: int, taken: bool = False) -> None:
        """`taken`: the outputs are already in the evaluator's copy (a handed-over batch's)."""
        if role not in self.measured.failed:
            record = self._check_batch(region, batch, calls, taken)
            self.measured.checked[role] = self.measured.checked.get(role, 0) + record.pop("checked")
            if not record["passed"]:
                self.measured.failed[role] = record

    @staticmethod
    def _hold(worker: Worker) -> None:
        """Stop a worker whose timing is vouched for: a process of it that keeps running while it
        is stopped (one that left its process group) could read the next batch's inputs early."""
        if not worker.stop():
            raise WorkerFailure(
                f"error while timing {worker.label}: a process it started kept running while it "
                "was stopped (it left its process group): its time cannot be vouched for"
            )

    def _check_batch(self, region: Region, batch: Batch, calls: int, taken: bool = False) -> dict:
        """Every output slot written, and a few calls, chosen after the answer, right with their
        inputs unchanged."""
        if not taken:
            region.read(calls)
        unwritten = region.unwritten(calls)
        if unwritten is not None:
            return {
                "passed": False,
                "check": "finite",
                "kind": "finite",
                "checked": calls,
                "where": f"timed call {unwritten + 1} of a batch of {calls}",
                "detail": "its output slot still held the NaN it was filled with: the call did not write it",
            }
        for call in region.picks(calls):
            record = compare_inputs(batch.sets[call], region.inputs(call))
            if record is None:
                outputs, reference = region.outputs(call), batch.reference(call)
                if surely_close(outputs, reference, *self.testcase.tolerances):
                    continue
                record = compare_outputs(outputs, reference, *self.testcase.tolerances)
            if not record["passed"]:
                return {**record, "checked": calls, "where": f"timed call {call + 1} of a batch of {calls}"}
        return {"passed": True, "checked": calls}


def batch_sizes(a_round: dict[str, int], limit: int, matched: bool) -> dict[str, int]:
    """Each role's calls a batch: its calls a round (`a_round`) in BATCHES_PER_ROUND batches, within
    `limit`. `matched` (the CPU's): the other role's batches as large as the larger of them where
    its calls a round allow, never smaller, its round split evenly. What a CPU batch costs beside
    its calls (the worker woken, its request read and answered, a first call cold after the worker
    was stopped) is not taken off there, and weighs less the more calls share it (on the busy 2-core
    machine one worker's batches of one call read 186-203 µs a call where its batches of three read
    44-73): sized apart, a role whose sizing read it slower is timed in smaller batches and reads
    slower still, and an identical copy of the baseline reads faster than it. On a GPU that cost is
    measured and taken off (`rounds.fixed_cost`)."""
    calls = {role: min(limit, -(-a // BATCHES_PER_ROUND)) for role, a in a_round.items()}
    if not matched:
        return calls
    common = max(calls.values())
    return {
        role: n if n == common else min(limit, -(-a_round[role] // max(1, a_round[role] // common)))
        for role, n in calls.items()
    }


def _note_processes(
    measured: Rounds, role: str, calls: int, before: cputime.TreeTimes, after: cputime.TreeTimes
) -> None:
    """A batch in which a process of the worker started or ended fails the role's timing."""
    if after.processes_changed(before) and role not in measured.failed:
        measured.failed[role] = {
            "passed": False,
            "check": "processes",
            "kind": "timer_integrity",
            "where": f"a batch of {calls}",
            "detail": "a process of the worker started or ended during a timed batch: what an ended process "
            "spent is known only in clock ticks, so its time cannot be vouched for",
        }
