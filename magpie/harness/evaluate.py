"""The evaluator process: judges one implementation, in a process of its own.

It builds inputs and reference outputs from the testcase spec, hands inputs to worker
processes that run the implementation (and, for timing, the baseline), and checks what
comes back. Candidate code never runs here, so it cannot patch the checks or the clock
that judges it; which is also why one evaluator may judge job after job of a build.
Usage (started by an action, through session.Worker): python -m magpie.harness.evaluate COMMAND_FD ANSWER_FD
"""

from __future__ import annotations

import base64
import contextlib
import functools
import hashlib
import importlib.machinery
import json
import math
import os
import shutil
import subprocess
import sys
import time
import traceback
from pathlib import Path
from statistics import fmean, median

from magpie import sandbox
from magpie.compare.stats import summarize_ns
from magpie.harness import batches, spares, stream_words, triton_warmup
from magpie.harness.checks import all_finite, as_tuple, compare_inputs, compare_outputs, surely_close
from magpie.harness.compiler_caches import compiler_caches, implementation_caches, seed_triton_cache
from magpie.harness.exchange import exchange_for, load_left
from magpie.harness.declared import SpecImports, readable, undeclared_read
from magpie.harness.keys import code_reads, worker_key
from magpie.harness.kinds import command_kind, failure, failure_kind
from magpie.harness.laps import Laps
from magpie.harness.spec import ReferenceSpec, SpecError, derive_seed, output_specs, weights_seed
from magpie.harness.measurement import (ALONE_PAIRS, ALONE_SHARE, BUSY_BACKOFF_S, BUSY_RETRIES, DEFAULT_BETWEEN_RUNS,
                                        DEFAULT_DISTURBED_FRACTION, INCONCLUSIVE,
                                        HANDOVER_CALLS, HANDOVER_MIN_CALLS, HANDOVER_TRIM, HANDOVER_WAIT_NS,
                                        HANDOVER_WAIT_SHARE,
                                        Batch, Rounds, alone_line, batch_phases, credit_within_calls_alone,
                                        few_samples, first_use_verdict, for_device,
                                        host_wall_gap, implausible_speedup, launch_floor, other_size,
                                        paired_speedup, roofline_floor, timer_inconsistency, unbounded_line,
                                        unvouched_on_a_busy_machine,
                                        uneven_calls, uneven_line, unvouched_speedup_line, vouched_inputs,
                                        vouched_method, wall_check)
from magpie.harness.timing import GRAPH_THRESHOLD_US, calibrate, nvml_snapshot, sample_cap, timer_for
from magpie.paths import subprocess_env
from magpie.sandbox import namespaces
from magpie.supervision import device_lock, zygote
from magpie.supervision import scratch as scratch_folders
from magpie.supervision.process import log_to, release_memory, serve_pipes
from magpie.supervision.session import NothingParked, Worker, WorkerFailure, signal_verdict

class Evaluator:
    def __init__(self, request: dict):
        self.root = Path(request["root"])
        self.kernel_id = request["kernel"]
        self.impl = request["impl"]
        self.baseline = request.get("baseline")
        self.settings = request["settings"]
        self.correctness_settings = self.settings["correctness"]
        self.device = self.settings["project"]["device"]
        self.work = Path(request["work_dir"])
        self.timeout = float(self.correctness_settings["timeout_s"])
        self.input_secret = request.get("input_secret", "")
        # the manifest's seed, made unpredictable to code under test by the build's secret
        self.seed = derive_seed(int(self.correctness_settings["seed"]), self.input_secret) if self.input_secret \
            else int(self.correctness_settings["seed"])
        self.hide = list(request.get("hide") or [])
        self.snapshots: dict[str, str] = request.get("snapshots") or {}
        self.set_method: dict | None = request.get("timing_method")  # chosen by the baseline's timing
        # the baseline's shape and median in its own timing job (`_disturbed`), and whether that
        # job ran in this build (its worker is then parked for the candidates, or in use)
        self.baseline_own_timing: dict = request.get("baseline_own_timing") or {}
        self.baseline_timed_in_this_build = bool(self.baseline_own_timing.get("this_build", True))
        # its timing an earlier build's, and its worker that build's too, kept warm since
        self._baseline_kept_warm = False
        self.init_seed = weights_seed(int(self.correctness_settings["seed"]), self.kernel_id)
        self._torch = None
        self._exchange = None
        self.laps = Laps()
        self.worker_steps: list[dict | None] = []
        self._loading: set[Worker] = set()  # started with a load whose answer is still due
        self._asked: dict[Worker, float] = {}  # when each new worker was asked for (`_load_record`)
        self._spare_of: dict[str, tuple] = {}  # implementation -> how a spare for its workers starts
        self.worker_loads: list[dict] = []
        self.isolation: str | None = None  # of the workers that ran code under test

    @property
    def torch(self):
        if self._torch is None:
            import torch

            if self.device.startswith("cuda:"):
                # what names no device (a stream, an event, a graph) is on this one too
                torch.cuda.set_device(torch.device(self.device))
            self._torch = torch
        return self._torch

    @property
    def exchange(self):
        if self._exchange is None:
            self._exchange = exchange_for(self.torch, self.device)
        return self._exchange

    # -- workers --------------------------------------------------------------------------
    def _env(self, impl: dict) -> dict:
        env = subprocess_env({**os.environ, **(impl.get("env") or {})})
        if impl["type"] == "triton" and self.device == "cpu":
            env["TRITON_INTERPRET"] = "1"
        return env

    def start(self, impl: dict, init_file: str | None, init_from_module: bool = False,
              fork: bool = True, wait: bool = True) -> Worker | None:
        """A loaded worker for impl: one a job parked if there is one, else a new process
        (with fork=False, None). With wait=False the load is under way when it returns, and
        `loaded` waits for it: a new process's CUDA context is made while the evaluator makes
        the inputs (and its own)."""
        cwd = self.root / (impl.get("working_dir") or ".")
        # CUDA reserves far more address space than it uses, so the address-space limit that
        # catches memory hogs on the CPU would stop every GPU process at start-up.
        memory_mb = int(self.correctness_settings["memory_mb"]) if self.device == "cpu" else 0
        env = self._env(impl)
        policy = None if sandbox.trusted() else self._policy(impl, cwd, memory_mb)
        # a sandbox that opens one GPU's node shows CUDA that GPU alone, as its device 0
        device = "cuda:0" if policy is not None and policy.gpu_minors else self.device
        load = {
            "op": "load", "id": impl["id"], "source": str(self.root / impl["source"]),
            "library": impl.get("library"),
            "entry": impl.get("entry"), "device": device, "seed": self.init_seed,
            "init_inputs_file": init_file, "init_from_module": init_from_module,
            "threads": self.settings.get("timing", {}).get("threads", 1),
        }
        if policy is not None:
            load["readable"] = readable(self.root, impl)
        code = None if impl.get("library") else self.code(impl["source"])
        if code is not None:  # what the task was keyed by, not the file as it may be now
            load["code"] = base64.b64encode(code).decode()
        log_path = self.work / f"worker-{impl['id']}.log"
        process = {"cwd": str(cwd), "env": env, "memory_mb": memory_mb, "sandbox": policy.to_json() if policy else None}
        key = worker_key(load, impl, self.root, build=self._build_of_workers, **process)
        base = implementation_caches(key)
        spare = spares.key(load, build=self._build_of_workers, **process) if policy is not None and fork else None
        self.isolation = sandbox.describe(policy)
        asked = time.time()
        # a spare, where no worker ever loaded this content (its caches would exist)
        worker = self._adopt_spare(spare, impl, base, log_path, **process) \
            if spare is not None and not base.exists() else None
        if worker is not None:
            load = {**load, "log": str(worker.live_log), "caches": compiler_caches(base)}
        else:
            caches = self._new_caches(impl, base)
            if policy is not None:
                policy.write += list(caches.values())
            try:
                worker = Worker(label=impl["id"], cwd=str(cwd), env={**env, **caches}, memory_mb=memory_mb,
                                log_path=log_path, key=key, fork=fork, sandbox=policy.to_json() if policy else None)
            except NothingParked:
                return None
        worker.key = key
        if worker.adopted:
            worker.send({"op": "relog", "log": str(worker.live_log)})
        else:
            if init_file and worker.scratch:  # the worker reads nothing outside its own folder
                copy = worker.scratch / Path(init_file).name
                with open(init_file, "rb") as source, os.fdopen(scratch_folders.create(copy), "wb") as out:
                    shutil.copyfileobj(source, out)
                load["init_inputs_file"] = str(copy)
            worker.send(load)
            self._asked[worker] = asked
        if spare is not None:
            self._spare_of[impl["id"]] = (spare, impl, device, process)
        self._loading.add(worker)
        return self.loaded(worker) if wait else worker

    def _adopt_spare(self, spare: str, impl: dict, base: Path, log_path: Path, **process) -> Worker | None:
        """A spare started like impl's worker, its caches made impl's (`harness.spares`); None if
        none is parked or its caches could not be taken."""
        try:
            worker = Worker(label=impl["id"], log_path=log_path, key=spare, fork=False, **process)
        except NothingParked:
            return None
        if not spares.take_caches(worker.scratch, base):
            worker.close()
            return None
        worker.adopted = False  # a new process to its job: it loads the code, makes the first calls
        return worker

    def start_spare(self, impl: dict, worker: Worker) -> None:
        """Start the spare that the next new worker started like impl's takes, if none is
        parked or on its way, and park it while it makes its context, under a share of the
        device lock it holds until then, and then, for Triton on a GPU, starts the compiler
        and builds the launchers of the kernels impl's `worker` compiled (`triton_warmup`).
        Called after a measurement: started beside the first calls of a candidate's new
        worker, it made them 0.17 s slower on the H200 (a new module's load waits behind the
        driver's making of another context)."""
        if impl["id"] not in self._spare_of:
            return
        spare, impl, device, process = self._spare_of[impl["id"]]
        if not zygote.reserve(spare, process["env"]):
            return
        prepare = {"op": "prepare", "device": device}
        if impl["type"] == "triton" and self.device != "cpu":
            try:  # the worker's word, checked: launchers of no kernel of its are wasted, nothing more
                answer = worker.request({"op": "triton_signatures"}, self.timeout)
            except WorkerFailure:  # its failure is the recheck's to report
                answer = {}
            prepare["triton_signatures"] = triton_warmup.signatures(answer.get("signatures"))
        held = device_lock.share_held(self.device)
        if held is None:
            return
        spares.sweep_caches()
        scratch = scratch_folders.make("w-")
        caches = self._new_caches(impl, spares.caches_folder(scratch))
        policy = {**process["sandbox"], "write": [*process["sandbox"]["write"], *caches.values()]}
        try:
            worker = Worker(label="spare", cwd=process["cwd"], env={**process["env"], **caches},
                            memory_mb=process["memory_mb"], log_path=self.work / "worker-spare.log", sandbox=policy,
                            scratch=scratch, held_fd=held)
        finally:
            os.close(held)
        try:
            worker.send(prepare)
        except WorkerFailure:
            worker.close()
            return
        worker.park_spare(spare)

    def _new_caches(self, impl: dict, base: Path) -> dict[str, str]:
        """Compiler caches under base for a new process of impl's, a Triton cache seeded with
        the driver utilities this evaluator compiled (`seed_triton_cache`)."""
        caches = compiler_caches(base)
        if impl["type"] == "triton" and self.device != "cpu":
            seed_triton_cache(Path(caches["TRITON_CACHE_DIR"]))
        return caches

    @functools.cached_property
    def _build_of_workers(self) -> str | None:
        """The build a worker serves, where only its own build may adopt it: on a GPU timed by
        the worker's own timer (`timing.vouched = false`), where workers kept from an earlier
        build timed memory-bound kernels 30-120% slow in a third of the rows of repeated
        compares on the H200 (docs/performance.md; cause not established). Elsewhere none: the
        evaluator vouches for the measurement, and workers serve later builds alike."""
        if self.device == "cpu" or self.settings.get("timing", {}).get("vouched", True) or not self.input_secret:
            return None
        return hashlib.sha256(self.input_secret.encode()).hexdigest()[:12]

    def _policy(self, impl: dict, cwd: Path, memory_mb: int) -> sandbox.Policy:
        """What a worker of impl may touch: it reads the project, its own sources and its compiled
        library, and, once told at its load, of the project its declared files alone (`readable`);
        it writes only its scratch folder (added by the Worker) and its compiler cache. The same
        for every implementation in one folder, so that a spare serves any of them."""
        return sandbox.Policy(write=[], read=code_reads(self.root, impl, cwd), project=str(self.root), hide=self.hide,
                              gpu=self.device != "cpu", gpu_minors=self._gpu_minors, memory_mb=memory_mb)

    @functools.cached_property
    def _gpu_minors(self) -> list[int] | None:
        """The node of the one GPU this evaluator times on, which is all its workers may open:
        with every GPU of the host open, a worker could split a batch's work over two. None
        (every GPU's node) on a host of one GPU (asking which it is would make this process's
        CUDA context before the worker starts, where the two are made together), off NVIDIA, or
        where the driver does not say which node it is."""
        if self.device == "cpu" or len(sandbox.nvidia_gpu_nodes()) < 2:
            return None
        uuid = getattr(self.torch.cuda.get_device_properties(self.torch.device(self.device)), "uuid", None)
        minor = sandbox.nvidia_minor(str(uuid)) if uuid else None
        return None if minor is None else [minor]

    def sandboxed_gpu_minors(self) -> list[int] | None:
        """The GPU nodes this job's sandboxes open where they open one alone; else None."""
        return self._gpu_minors if self.device != "cpu" and not sandbox.trusted() else None

    def loaded(self, worker: Worker) -> Worker:
        if worker in self._loading:
            self._loading.discard(worker)
            answer = worker.receive(self.timeout)
            if not answer["ok"]:
                worker.close()
                raise WorkerFailure(f"error while loading: {self._undeclared(worker, answer['error'])}")
            self._load_record(worker, answer)
        return worker

    def _undeclared(self, worker: Worker, error: str) -> str:
        """A worker's error, or where it came from reading a project file its implementation
        does not declare, the one line that says where to declare it (`harness.declared`)."""
        impl = next((i for i in (self.impl, self.baseline) if i and i["id"] == worker.label), None)
        return (undeclared_read(error, self.root, impl) if impl else None) or error

    def _load_record(self, worker: Worker, answer: dict) -> None:
        """Where a new worker's load went: from the evaluator's asking to the worker's first
        line (fork, sandbox), its CUDA context, its module, then until its answer was read
        (the evaluator busy elsewhere meanwhile); for a spare (`spare`), started before it was
        asked for, its load alone; nothing for a parked worker adopted."""
        asked, now = self._asked.pop(worker, None), time.time()  # None: adopted, its answer a relog's
        steps = answer.get("steps_s") or {}
        if asked is None or not answer.get("started_unix"):
            return
        if answer.get("prepared"):
            self.worker_loads.append({"label": worker.label, "spare": True, **steps,
                                      "until_read": round(now - asked - sum(steps.values()), 4)})
            return
        began = answer["started_unix"] - asked
        self.worker_loads.append({"label": worker.label, "start": round(began, 4), **steps,
                                  "until_read": round(now - asked - began - sum(steps.values()), 4)})

    def _save(self, name: str, value) -> str:
        path = self.work / name
        self.torch.save(value, path)
        return str(path)

    def _init_file(self, spec: ReferenceSpec) -> str | None:
        """A KernelBench model's init inputs, in a file of one name for every job: torch.save
        writes the name into the file, and the file's bytes are part of the worker's key (a
        parked worker serves the next job only if its model was built from the same)."""
        return self._save("init-inputs.pt", [spec.init_inputs()]) if spec.kernelbench else None

    def code(self, name: str) -> bytes | None:
        """The bytes of a task input (a spec, a source) as its key was computed from them, or None
        where none were kept (read the file)."""
        kept = self.snapshots.get(name)
        return Path(kept).read_bytes() if kept else None

    def _spec(self, index: int, testcase: dict) -> ReferenceSpec:
        # what it imports from the project, it must declare (`harness.declared`)
        imports = SpecImports(self.root, testcase, f"testcase {index} of kernel {self.kernel_id}", _library_roots())
        with imports.guarding():
            return ReferenceSpec(self.root / testcase["spec"], testcase, self.device, self.code(testcase["spec"]))

    def _run_cases(self, worker: Worker, spec: ReferenceSpec, cases: list, tag: str, rtol, atol,
                   laps: Laps | None = None) -> list[dict]:
        laps = laps or Laps()
        inputs = [spec.make_inputs(c) for c in cases]
        laps.mark("inputs")
        expected = [spec.reference(a, self.init_seed) for a in inputs]
        laps.mark("reference")
        folder = worker.scratch or self.work
        outputs = self.exchange.offer_outputs(tag, expected, inputs, folder)
        self.loaded(worker)
        laps.mark("offer")
        answer = worker.request({"op": "run", "inputs": self.exchange.offer_inputs(tag, inputs, folder),
                                 "outputs": outputs,
                                 "out_specs": [output_specs(e) for e in expected]}, self.timeout)
        if not answer["ok"]:
            raise WorkerFailure(f"error: {self._undeclared(worker, answer['error'])}")
        laps.mark("run")
        self.worker_steps.append(answer.get("steps_s"))
        produced = self.exchange.collect(outputs, answer)
        self.exchange.release()
        laps.mark("collect")
        records = []
        for i, case in enumerate(cases):
            record = compare_inputs(inputs[i], produced["inputs_after"][i])
            if record is None:
                record = compare_outputs(produced["outputs"][i], expected[i], rtol, atol)
            records.append({"case": case.label, "shape": case.shape, "dtype": case.dtype, "trial": case.trial,
                            "seed": case.seed, **record})
        laps.mark("compare")
        return records

    # -- correctness ----------------------------------------------------------------------
    def correctness(self) -> dict:
        testcases = self.correctness_settings["testcases"]
        checks: list[dict] = []
        numerics = "verified"
        index = None  # the testcase a failure below happened in
        try:
            if not testcases:
                return self._unverified()
            for index, testcase in enumerate(testcases):
                if testcase.get("command"):
                    checks.append(self._command_check(index, testcase))
                    continue
                if self.impl["type"] in ("cuda", "hip") and self.device == "cpu":
                    return _skipped(f"{self.impl['type']} implementations are loaded on a GPU device only; "
                                    f"this project's device is {self.device}")
                spec = self._spec(index, testcase)
                cases = spec.cases(self.seed, self.kernel_id, index, int(testcase["trials"]))
                init_file = self._init_file(spec)
                with self.start(self.impl, init_file, wait=False) as worker:
                    self.laps.mark("start")
                    records = self._run_cases(worker, spec, cases, f"tc{index}", testcase["rtol"], testcase["atol"],
                                              self.laps)
                self.laps.mark("park")  # the worker reset and parked for the timing job (or ended)
                checks.extend({"testcase": index, **r} for r in records)
        except SpecError as err:
            return _not_judged("correctness", testcases[index]["spec"], err, index)
        except WorkerFailure as err:
            return {"correctness_state": "FAILED", "numerics": numerics, "verdict": str(err),
                    "checks": checks, "errors": [str(err)],
                    "failures": [failure(failure_kind(str(err)), "correctness", str(err), {"testcase": index})]}
        return {**_verdict(checks, numerics), "phases_s": self.laps.seconds, "worker_steps_s": self.worker_steps,
                "worker_loads_s": self.worker_loads}

    def _unverified(self) -> dict:
        """No testcase: the implementation runs on its own get_inputs() (inside its worker) and
        only finiteness is checked, recorded as numerics: unverified."""
        source = self.root / self.impl["source"]
        if self.impl["type"] not in ("pytorch", "triton") or "def get_inputs" not in source.read_text():
            return _skipped("no testcase declared: add a [[kernel.testcases]] with a spec or a command")
        with self.start(self.impl, None, init_from_module=True) as worker:
            outputs_file = str((worker.scratch or self.work) / "outputs.pt")
            answer = worker.request({"op": "run_own_inputs", "seed": self.seed, "outputs_file": outputs_file},
                                    self.timeout)
            if not answer["ok"]:
                raise WorkerFailure(f"error: {answer['error']}")
            produced = load_left(self.torch, outputs_file)
            if not produced["outputs"]:
                raise WorkerFailure("error: its output file holds no outputs")
        record = {"testcase": None, "case": "get_inputs()", "trial": 0, **all_finite(produced["outputs"][0])}
        return _verdict([record], "unverified")

    def _command_check(self, index: int, testcase: dict) -> dict:
        cwd = self.root / (testcase.get("working_dir") or ".")
        scratch = scratch_folders.make("testcase-", owner=os.getpid())
        env = {**self._env(self.impl), **(testcase.get("env") or {}), "TMPDIR": str(scratch),
               "MAGPIE_IMPL_ID": self.impl["id"], "MAGPIE_IMPL_SOURCE": str(self.root / self.impl["source"])}
        # The command runs the implementation: it reads the project, writes only its TMPDIR.
        policy = None if sandbox.trusted() else sandbox.Policy(
            write=[str(scratch)], read=[str(self.root), str(cwd)], hide=self.hide, gpu=self.device != "cpu",
            gpu_minors=self._gpu_minors)
        self.isolation = sandbox.describe(policy)
        started = time.monotonic()
        output = scratch / "output.log"  # read back by its end only: a command may print gigabytes
        # Forked from the zygote, which enters the sandbox and then executes the command: no
        # interpreter to start per command.
        argv = ["/bin/sh", "-c", testcase["command"]]
        proc = zygote.launch("magpie.sandbox.__main__", [json.dumps(policy.to_json() if policy else None), "--", *argv],
                             cwd=str(cwd), env=env, log_path=output)
        try:
            returncode = proc.wait(timeout=self.timeout)
            tail = scratch_folders.last_lines(output)
        except subprocess.TimeoutExpired:
            return {"testcase": index, "case": "command", "trial": 0, "passed": False, "check": "exit code",
                    "kind": "timeout", "detail": f"timeout after {self.timeout:g} s"}
        finally:
            proc.kill()  # its process group, whatever the command left
            proc.wait()
            shutil.rmtree(scratch, ignore_errors=True)
        passed = returncode == 0
        detail = "" if passed else f"{signal_verdict(returncode)}: {tail}"
        return {"testcase": index, "case": "command", "trial": 0, "passed": passed, "check": "exit code",
                "kind": None if passed else command_kind(detail, "testcase_command"), "detail": detail,
                "wall_s": time.monotonic() - started}

    # -- timing ---------------------------------------------------------------------------
    def timing(self) -> dict:
        t = self.settings["timing"]
        spec_index = next((i for i, tc in enumerate(self.correctness_settings["testcases"]) if tc.get("spec")), None)
        if spec_index is None:
            return _not_timed("SKIPPED", "skipped", "no Python spec testcase to build timing inputs from")
        if self.impl["type"] in ("cuda", "hip") and self.device == "cpu":
            return _not_timed("SKIPPED", "skipped", f"{self.impl['type']} timing needs a GPU device; this project's "
                                                    f"device is {self.device}")
        testcase = self.correctness_settings["testcases"][spec_index]
        try:
            return self._timed(spec_index, testcase, t)
        except SpecError as err:
            return _not_judged("timing", testcase["spec"], err, spec_index)
        except WorkerFailure as err:
            return _not_timed("FAILED", failure_kind(str(err)), str(err), spec_index)

    def _timed(self, spec_index: int, testcase: dict, t: dict) -> dict:
        """Inputs, workers and their first calls beside other jobs on the device; warm-up,
        measurement and the kernel profile with the device held alone; the re-check after.

        The baseline is timed beside every candidate, and those measurements take turns on
        the device: one baseline worker serves them all. A job takes it where it is parked;
        if it is not (another job has it), the job asks again once it holds the device, when
        the last measurement has parked it, and gives it back before letting the device go.
        Where no job of this build timed the baseline (an edit's rebuild), none is around:
        the job starts one beside its candidate's. A speedup above `implausible_speedup` is
        measured a second time, with the device still held: warm-up and interleaved rounds
        again, on input sets of new seeds."""
        phases = Laps()
        spec = self._spec(spec_index, testcase)
        cases = spec.cases(self.seed, self.kernel_id, spec_index, 1, salt="timing")
        case = max(cases, key=lambda c: math.prod(c.shape or [0]))
        pair = self.baseline is not None and not self.impl.get("is_baseline")
        threshold = t.get("implausible_speedup")
        workers: dict[str, Worker] = {}
        first_steps: dict[str, dict] = {}
        kernels = {}
        adopted: dict[str, bool] = {}
        retimed: Rounds | None = None
        remeasured: dict | None = None
        busy_shares: list[float] = []  # how busy each measurement a busy machine left in doubt was
        try:
            with device_lock.shared(self.device):
                phases.mark("wait_shared")
                init_file = self._init_file(spec)
                workers["candidate"] = self.start(self.impl, init_file, wait=False)
                baseline = self.start(self.baseline, init_file, fork=False, wait=False) if pair else None
                self._baseline_kept_warm = baseline is not None and not self.baseline_timed_in_this_build
                if pair and baseline is None and not self.baseline_timed_in_this_build:
                    # no job of this build has one (an edit's rebuild): it starts and makes its
                    # first calls now, beside the candidate's, not with the device held alone
                    baseline = self.start(self.baseline, init_file, wait=False)
                if baseline is not None:
                    workers["baseline"] = baseline
                phases.mark("start")
                inputs = [spec.make_inputs(c) for c in _rotation(case, "set", int(t["input_sets"]))]
                expected = spec.reference(inputs[0], self.init_seed)
                out_specs = [output_specs(expected)]
                phases.mark("inputs")
                for worker in workers.values():
                    self.loaded(worker)
                phases.mark("loaded")
                offers = {role: self.exchange.offer_inputs("timing", inputs, worker.scratch or self.work)
                          for role, worker in workers.items()}
                # First calls (context creation, taking the inputs, JIT) in all workers at once.
                for role, worker in workers.items():
                    self._send_time(worker, offers[role], out_specs, first_call=True)
                for role, worker in workers.items():
                    first_steps[role] = self._time_answer(worker).get("steps_s")
                self.exchange.release()
                phases.mark("first_calls")
            with device_lock.exclusive(self.device):
                phases.mark("wait_exclusive")
                held_from = time.monotonic()
                late = pair and "baseline" not in workers
                if late:
                    workers["baseline"] = self.start(self.baseline, init_file)
                    offers["baseline"] = self.exchange.offer_inputs("timing", inputs,
                                                                    workers["baseline"].scratch or self.work)
                    phases.mark("start_baseline")
                chosen = self._chosen_method(t)
                with Turns(workers) as turns:
                    warmed = {role: self._time_request(turns.give(role), offers[role], out_specs,
                                                       first_call=late and role == "baseline",
                                                       warmup_ms=t["warmup_ms"], probe=chosen is None,
                                                       mode=(chosen or {}).get("mode"))
                              for role in workers}
                    if late:
                        first_steps["baseline"] = warmed["baseline"].get("steps_s")
                        self.exchange.release()
                    phases.mark("warmup_probe")
                    method = chosen or self._probed_method({role: a["probe_us"] for role, a in warmed.items()},
                                                           {role: a.get("launch_us") for role, a in warmed.items()})
                    mode = method["mode"]
                    clocks = {"before": nvml_snapshot(self._device_index())}
                    measured = self._measure(turns, spec, case, inputs, expected, offers, out_specs, mode, t, testcase)
                    # a failure a busy machine may have caused is measured again in place, after a
                    # growing pause (`Rounds.in_doubt`)
                    while measured.in_doubt() and len(busy_shares) < BUSY_RETRIES:
                        busy_shares.append(measured.cpu_wait_share)
                        time.sleep(BUSY_BACKOFF_S * 2 ** (len(busy_shares) - 1))
                        measured = self._retime(turns, spec, case, inputs, expected, out_specs, mode, t, testcase,
                                                f"busy {len(busy_shares)}")
                    clocks["after"] = nvml_snapshot(self._device_index())
                    phases.mark("timed")
                    # a vouched measurement checked outputs of its calls on inputs each saw once
                    timed_outputs = {} if measured.vouched else {
                        role: self._timed_output(turns.give(role), spec, inputs, expected, offers[role], testcase)
                        for role in workers}
                    phases.mark("timed_outputs")
                    first_use = None
                    if pair and mode != "graph" and not measured.vouched:  # a graph replay runs no Python
                        first_use = self._first_use(turns.give("candidate"), spec, case, inputs, out_specs, mode, t)
                        phases.mark("first_use")
                    # A measurement that failed a check stands failed, but for a probe that waited:
                    # its wall time is the host's too. Either is measured again, on new input sets,
                    # the device still held; a failure then stands.
                    disturbed = _probe_waited(measured) or (
                        self._disturbed(measured, case, t) if pair and not measured.failed else None)
                    if disturbed:
                        measured = self._retime(turns, spec, case, inputs, expected, out_specs, mode, t, testcase,
                                                "remeasure")
                        remeasured = {"first": disturbed, "again": self._disturbed(measured, case, t)
                                      if pair and not measured.failed else None}
                        phases.mark("remeasured")
                    if pair and threshold and measured.speedup(measured.statistic()) > threshold:
                        retimed = self._retime(turns, spec, case, inputs, expected, out_specs, mode, t, testcase)
                        phases.mark("retimed")
                    if self.device != "cpu":
                        for role in workers:
                            known = self._known_of_baseline(case, mode) if role == "baseline" else {}
                            if "kernels" in known:  # the same code on the same inputs as in its own timing
                                kernels[role] = {"kernel_us": self.baseline_own_timing.get("kernel_us"),
                                                 "kernels": known["kernels"], "from_own_timing": True}
                                continue
                            reply = turns.give(role).request({"op": "kernels", "inputs": offers[role],
                                                              "out_specs": out_specs}, self.timeout)
                            kernels[role] = reply if reply["ok"] else {"error": reply["error"]}
                        phases.mark("kernel_profile")
                if pair:  # parked while the device is still held: the next measurement finds it
                    baseline_worker = workers.pop("baseline")
                    adopted["baseline"] = baseline_worker.adopted
                    baseline_worker.release()
                    phases.mark("park_baseline")
            device_held_s = time.monotonic() - held_from
            with device_lock.shared(self.device):
                phases.mark("wait_shared")
                self.start_spare(self.impl, workers["candidate"])
                phases.mark("start_spare")
                recheck_cases = [type(case)(case.label, case.shape, case.dtype, 0, derive_seed(case.seed, "recheck"))]
                recheck = self._run_cases(workers["candidate"], spec, recheck_cases, "recheck",
                                          testcase["rtol"], testcase["atol"])[0]
                phases.mark("recheck")
        finally:
            for worker in workers.values():
                worker.release()
            self.exchange.release()
        floor = spec.min_bytes(inputs[0], expected)
        kept = measured.kept()
        result = {
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
            "phases_s": phases.seconds,
            "device_held_s": round(device_held_s, 4),
            "first_call_steps_s": first_steps,
            "worker_loads_s": self.worker_loads,
            "workers_adopted": {**adopted, **{role: worker.adopted for role, worker in workers.items()}},
            "timing_method": method,
            "measurement_steps_s": measured.steps_s or None,
            "round_parts_s": measured.round_parts_s or None,
            "timer_costs": None if measured.vouched else self.timer_costs(),
            "nvml": clocks if self.device != "cpu" else None,
        }
        result["timed_output_check"] = {role: {k: record.get(k) for k in ("passed", "check", "index")}
                                        for role, record in timed_outputs.items()}
        for role, record in measured.failed.items():
            _fail(result, record["kind"], f"{role}: {record['where']}: {record['check']}: {record['detail']}",
                  case, spec_index)
        if first_use is not None:
            result["first_use"] = first_use_verdict(first_use, fmean(measured.samples["candidate"]) / 1000)
            if result["first_use"]["line"]:
                _fail(result, "timer_integrity", f"candidate: {result['first_use']['line']}", case, spec_index)
        for role, record in timed_outputs.items():
            if not record["passed"]:
                _fail(result, record["kind"], f"{role}: the last timed call: {record['check']}: {record['detail']}",
                      case, spec_index)
        summaries = self._summaries(measured, case, kernels)
        for role, summary in summaries.items():  # the baseline's worker is parked by now, its samples kept
            result["performance_result" if role == "candidate" else "baseline_result"] = summary
            problem = None if measured.vouched else timer_inconsistency(summary, self.device)
            if problem:
                _fail(result, "timer_integrity", f"{role}: {problem}", case, spec_index)
            flag = None if measured.vouched else host_wall_gap(summary,
                                                               self.timer_costs().get("host_check_ns", 0.0) / 1000)
            if flag:
                summary.setdefault("flags", []).append(flag)
                result["warnings"].append(f"{role}: {flag}")
                _record(result, "flags", "untimed_work", f"{role}: {flag}", case, spec_index)
            if uneven_calls(summary["mean_us"], summary["median_us"]):
                _flag_uneven(result, summary, role, pair, case, spec_index)
            note = few_samples(summary, measured.calls[role] if measured.vouched else measured.sizes[role],
                               t["budget_ms"])
            if note:
                result["warnings"].append(f"{role}: {note}")
        if measured.alone_bound and measured.alone_bound["failed"]:
            _fail(result, "calls_done_together", f"candidate: {alone_line(measured.alone_bound)}", case, spec_index)
        held = unbounded_line(measured)
        if held:
            summaries["candidate"].setdefault("flags", []).append(held)
            result["warnings"].append(f"candidate: {held}")
            _record(result, "flags", "unbounded_calls", f"candidate: {held}", case, spec_index)
        for role, summary in summaries.items():
            verdict = self._roofline(summary, floor, expected)
            if verdict is None:
                continue
            kind, line = verdict
            if kind == "impossible":
                consequence = "impossible, not ranked" if role == "candidate" else \
                    "impossible: a comparison with it cannot be trusted"
                _fail(result, "impossible_time", f"{role}: {line}: {consequence}", case, spec_index)
            else:
                summary.setdefault("flags", []).append(line)
                result["warnings"].append(f"{role}: {line}")
                _record(result, "flags", "impossible_time", f"{role}: {line}", case, spec_index)
        if remeasured:
            result["remeasured"] = remeasured
            result["warnings"].append(f"measured again: {remeasured['first']}")
            if remeasured["again"]:
                result["warnings"].append(f"measured again, still: {remeasured['again']}")
                _record(result, "flags", "disturbed_measurement", remeasured["again"], case, spec_index)
        if not recheck["passed"]:
            result["performance_state"] = "FAILED"
            result["errors"].append(f"incorrect after timing: {recheck['check']}: {recheck['detail']}")
            detail = f"after timing: {recheck['detail']}"
            result.setdefault("failures", []).append(failure(recheck["kind"], "timing", detail,
                                                             {**recheck, "testcase": spec_index}))
        if busy_shares:
            result["busy_remeasured"] = {"cpu_wait_shares": [*busy_shares, measured.cpu_wait_share]}
        doubts = measured.in_doubt()
        if doubts and {f["kind"] for f in result.get("failures", [])} == {"calls_done_together"}:
            _inconclusive(result, doubts, [*busy_shares, measured.cpu_wait_share], case, spec_index)
        between_runs = for_device(t.get("between_runs"), DEFAULT_BETWEEN_RUNS, self.device)
        if pair and result["performance_state"] == "SUCCESS":
            # Here, in the timing job, not in the comparison: the timing jobs finish one by one
            # while others measure, the comparison waits for the last of them. Means where a
            # role's calls are uneven, in either measurement; the re-timing uses the same.
            uneven = measured.uneven() or (retimed.uneven() if retimed is not None else {})
            statistic = "mean" if uneven else "median"
            samples = measured.for_speedup(statistic)
            result["speedup"] = paired_speedup(samples, result["baseline_result"]["median_us"], statistic,
                                               between_runs)
            if retimed is not None:
                self._judge_retiming(result, retimed, float(threshold), case, spec_index, statistic, between_runs)
            unvouched = unvouched_speedup_line(result["speedup"], measured, retimed)
            if unvouched and result["performance_state"] == "SUCCESS":
                _fail(result, "timer_integrity", f"candidate: {unvouched}", case, spec_index)
            bounded = credit_within_calls_alone(result["speedup"], measured.alone_bound, samples["candidate"][0],
                                                statistic)
            if bounded:
                result["warnings"].append(f"candidate: {bounded}")
                _record(result, "flags", "bounded_by_calls_alone", f"candidate: {bounded}", case, spec_index)
        return result

    def _rounds(self, turns: Turns, offers: dict, out_specs: list, mode: str | None, t: dict) -> Rounds:
        """One measurement: the workers take turns for `rounds` rounds (order flipped every
        round), each round a share of the budget and of the sample cap; then each makes
        HOST_CHECK_CALLS host-synchronised calls, in a request of their own (a launch-bound
        call's host time, 20 ms for 1,800 launches where its graph replay takes 2.3 ms, is no
        part of what the rounds' wall time must explain)."""
        roles = list(turns.workers)
        measured = Rounds(roles)
        rounds = int(t["rounds"])
        budget_ms, max_reps = t["budget_ms"] / rounds, max(1, int(t["max_reps"]) // rounds)
        costs = self.timer_costs()
        for r in range(rounds):
            for role in roles if r % 2 == 0 else reversed(roles):
                answer = self._time_request(turns.give(role), offers[role], out_specs, budget_ms=budget_ms,
                                            max_reps=max_reps, offset=r, mode=mode, settings=t)
                measured.add(role, answer, mode, costs)
                if (len(answer["samples_ns"]) < sample_cap(mode, max_reps)
                        and answer["wall_s"] * 1000 < EARLY_FRACTION * budget_ms):
                    measured.early[role].append(round(answer["wall_s"] * 1000, 3))
        if self.device != "cpu":  # on the CPU the clock around a call already is host time
            for role in roles:
                answer = self._time_request(turns.give(role), offers[role], out_specs, host_checks=HOST_CHECK_CALLS)
                measured.host_wall[role] = answer.get("host_wall_median_us")
        return measured

    def timer_costs(self) -> dict:
        """What the timer costs beside its samples on this device (`timing.calibrate`),
        measured once per evaluator process with the device held alone."""
        if self.device not in TIMER_COSTS:
            TIMER_COSTS[self.device] = calibrate(timer_for(self.device))
        return TIMER_COSTS[self.device]

    def _timed_output(self, worker: Worker, spec: ReferenceSpec, inputs: list, expected, offer: dict,
                      testcase: dict) -> dict:
        """The output of the worker's last timed call, checked against the reference for the
        input set it was given, and that input set checked for changes: a candidate
        right when checked and wrong (or lazy) while timed fails here, not only after timing."""
        outputs = self.exchange.offer_outputs("timed", [expected], [inputs[0]], worker.scratch or self.work)
        answer = worker.request({"op": "timed_output", "inputs": offer, "outputs": outputs}, self.timeout)
        if not answer["ok"]:
            raise WorkerFailure(f"error while timing {worker.label}: {answer['error']}")
        index = answer.get("index")
        if index is None:
            self.exchange.release()
            return {"passed": False, "kind": "timer_integrity", "check": "kept output", "index": None,
                    "detail": "the timer kept no output of a timed call: the timer in the implementation's "
                              "process was replaced"}
        produced = self.exchange.collect(outputs, answer)
        self.exchange.release()
        if not 0 <= int(index) < len(inputs):
            return {"passed": False, "kind": "timer_integrity", "check": "kept output", "index": index,
                    "detail": f"the timer named input set {index} of {len(inputs)}"}
        reference = expected if index == 0 else spec.reference(inputs[index], self.init_seed)
        record = compare_inputs(inputs[index], produced["inputs_after"][0]) or \
            compare_outputs(produced["outputs"][0], reference, testcase["rtol"], testcase["atol"])
        return {**record, "index": index}

    def _first_use(self, worker: Worker, spec: ReferenceSpec, case, inputs: list, out_specs: list,
                   mode: str | None, t: dict) -> list[int] | None:
        """The candidate timed once on each of a few input sets it has never seen (no warm-up
        on them): per-call times, or None where such sets would not fit FIRST_USE_BYTES. The
        measurement rotates through a handful of sets, so an implementation that keeps each
        set's result and hands it back when the same tensors come again (correct outputs,
        every check passed) is timed at a lookup; here it must compute."""
        set_bytes = sum(x.numel() * x.element_size() for x in inputs[0] if self.torch.is_tensor(x))
        count = min(FIRST_USE_SETS, int(FIRST_USE_BYTES // max(set_bytes, 1)))
        if count < 2:
            return None
        sets = [spec.make_inputs(c) for c in _rotation(case, "first use", count)]
        offer = self.exchange.offer_inputs("first_use", sets, worker.scratch or self.work)
        try:
            answer = self._time_request(worker, offer, out_specs, budget_ms=FIRST_USE_BUDGET_MS, max_reps=count,
                                        offset=0, mode=mode, settings=t)
        finally:
            self.exchange.release()
        return answer["samples_ns"]

    def _retime(self, turns: Turns, spec: ReferenceSpec, case, inputs: list, expected, out_specs: list,
                mode: str | None, t: dict, testcase: dict, salt: str = "retime") -> Rounds:
        """The same measurement again (warm-up, then the rounds, in the mode the probe chose) on
        input sets of new seeds: what an implementation learnt from the first sets, or from
        counting its calls, does not carry over."""
        if self._vouching(inputs[0], expected, mode, t):  # as `_measure` chose
            return self._vouched(turns, spec, case, inputs[0], expected, t, testcase, salt, mode)
        inputs = [spec.make_inputs(c) for c in _rotation(case, salt, int(t["input_sets"]))]
        offers = {role: self.exchange.offer_inputs("retiming", inputs, worker.scratch or self.work)
                  for role, worker in turns.workers.items()}
        for role in turns.workers:  # each takes the new sets, warms up on them, prepares the mode
            self._time_request(turns.give(role), offers[role], out_specs, warmup_ms=t["warmup_ms"], mode=mode)
        self.exchange.release()
        return self._rounds(turns, offers, out_specs, mode, t)

    def _measure(self, turns: Turns, spec: ReferenceSpec, case, inputs: list, expected, offers: dict,
                 out_specs: list, mode: str | None, t: dict, testcase: dict) -> Rounds:
        """Batches timed from outside the worker (`batches`) wherever the input sets and outputs
        are plain tensors and values, on the CPU and, where `timing.vouched` says so, on a GPU;
        elsewhere the timer in the worker, checked against the evaluator's wall clock (`_rounds`)."""
        if self._vouching(inputs[0], expected, mode, t):
            return self._vouched(turns, spec, case, inputs[0], expected, t, testcase, "timing", mode)
        return self._rounds(turns, offers, out_specs, mode, t)

    def _vouching(self, example: tuple, expected, mode: str | None, t: dict) -> bool:
        """Whether a measurement is a vouched one: on a GPU where `timing.vouched` says so, in
        either mode (in graph mode each batch is one replay of a graph of its calls)."""
        if not vouched_inputs(self.torch, example, expected, self.device):
            return False
        return self.device == "cpu" or (mode in ("events", "graph") and t.get("vouched", False))

    def _vouched(self, turns: Turns, spec: ReferenceSpec, case, example: tuple, expected, t: dict,
                 testcase: dict, salt: str, mode: str | None = None) -> Rounds:
        """The rounds as batches (`batches`): both workers are given the same input sets of new
        seeds per batch, in turn (the order flipped every batch), BATCHES_PER_ROUND batches a
        round. Each role's calls a round are its share of the budget at the time per call its
        sizing batches took, within its share of the sample cap and of the input sets the
        evaluator makes in GENERATION_FACTOR times the budget (fresh inputs for every call can
        cost more than the calls: a 66 µs softmax's inputs take 1-7 ms to draw)."""
        torch = self.torch
        roles = list(turns.workers)
        on_gpu = self.device.startswith("cuda")
        limit = batches.calls_that_fit(example, expected, batches.region_bytes(torch, self.device))
        layout = batches.Layout(example, expected, limit)
        regions: dict[str, batches.Region] = {}
        measured = Rounds(roles, vouched=True)
        measured.by_cpu_time = not on_gpu and int(t["threads"]) == 1 and batches.SCHEDSTAT
        measured.graph = on_gpu and mode == "graph"
        steps = Laps()
        rounds = int(t["rounds"])
        round_ns = t["budget_ms"] / rounds * 1e6
        try:
            for role in roles:
                regions[role] = batches.DeviceRegion(torch, layout, self.device, graph=measured.graph) if on_gpu \
                    else batches.Region(torch, turns.workers[role].scratch or self.work, layout)
                answer = turns.give(role).request({"op": "batch_map", "region": regions[role].offer()}, self.timeout)
                if not answer["ok"]:
                    raise WorkerFailure(f"error while timing {turns.workers[role].label}: {answer['error']}")
                # the process that says it runs the calls: a false one makes no batch count less
                # than its worker's CPU time (`busy_wall_ns`)
                regions[role].caller = batches.process_named(turns.workers[role].proc.pid, int(answer.get("pid", 0)))
            machine = None if on_gpu else batches.MachineShare([region.caller for region in regions.values()])
            steps.mark("regions")
            known = self._known_of_baseline(case, mode) if "baseline" in roles else {}
            # what this measurement takes (the kernel list is the timing job's): on the CPU only
            # the sizing, the harness's price and a calibration being a GPU's
            known = {key: value for key, value in known.items()
                     if key == "sizing_us_per_call" or (on_gpu and key != "kernels")}
            measured.reused = {"baseline": sorted(known)} if known else {}
            if on_gpu:
                if "harness_us_per_call" in known:
                    measured.harness_ns = known["harness_us_per_call"] * 1000
                else:
                    sets = self._fresh_sets(spec, case, f"{salt} copies", min(limit, COPY_CALIBRATION_CALLS),
                                            measured)
                    measured.harness_ns = batches.copy_ns_per_call(
                        torch, lambda args: spec.reference(args, self.init_seed), sets, expected, measured.graph)
                steps.mark("copy_price")
                calibrated = {role: region for role, region in regions.items()
                              if not (role == "baseline" and "calibration_us" in known)}
                measured.calibration_ns, measured.calibration_phases = self._calibrate(turns, calibrated)
                if "calibration_us" in known:
                    measured.calibration_ns["baseline"] = known["calibration_us"] * 1000
                steps.mark("calibration")
            else:
                harness = batches.HarnessPrice(torch, expected, min(limit, 64), int(t["threads"]))
                measured.harness_ns = harness.measure(3)
                steps.mark("harness_price")
            shortest_ms = DEVICE_BATCH_MIN_MS if on_gpu else BATCH_MIN_MS
            target_ns = min(BATCH_MAX_MS * 1e6, max(shortest_ms * 1e6, round_ns / BATCHES_PER_ROUND))
            per_call = {role: known["sizing_us_per_call"] * 1000
                        if role == "baseline" and "sizing_us_per_call" in known
                        else self._size_batches(turns, role, regions[role], spec, case, salt, limit, target_ns,
                                                testcase, measured) for role in roles}
            measured.per_call_ns = per_call
            steps.mark("sizing")
            sets_a_round = int(GENERATION_FACTOR * t["budget_ms"] * 1e6 / max(measured.set_ns, 1.0) / rounds)
            cap = min(max(1, int(t["max_reps"]) // rounds), max(BATCHES_PER_ROUND, sets_a_round))
            # batches of one call cannot be done together; on the CPU the bound is drawn from CPU
            # times (one torch thread)
            alone = len(roles) == 2 and limit > 1 and (on_gpu or measured.by_cpu_time)
            # the calls made alone take their share of each round out of the roles' batches: a
            # round keeps to its budget (the H200's compare of eight Triton candidates held the
            # device 0.65-0.76 s for each candidate's 0.6 s when they came on top)
            batches_ns = round_ns * (1 - ALONE_SHARE / len(roles)) if alone else round_ns
            a_round = {role: max(1, min(cap, int(batches_ns / max(per_call[role], 1.0)))) for role in roles}
            calls = {role: min(limit, -(-a_round[role] // BATCHES_PER_ROUND)) for role in roles}
            measured.round_laps = Laps()
            for r in range(rounds):
                if not on_gpu:  # priced again in each round (in its "draw" part): the least of all is taken off
                    measured.harness_ns = harness.measure(1)
                made = dict.fromkeys(roles, 0)
                b = 0
                # on a GPU, batches of two sizes in turn tell what a batch costs besides its calls
                # (`fixed_cost`)
                while due := {role: min(calls[role] if not on_gpu or b % 2 == 0 else other_size(calls[role], limit),
                                        a_round[role] - made[role]) for role in roles if made[role] < a_round[role]}:
                    batch = Batch(self._fresh_sets(spec, case, f"{salt} {r} {b}", max(due.values()), measured),
                                  spec, self.init_seed)
                    measured.lap("draw")
                    for role in roles if b % 2 == 0 else reversed(roles):
                        if role in due:
                            # 20x what the sizing said a call takes, and the timeout, before it is a hang
                            self._batch(turns, role, regions[role], batch, due[role], testcase, r, measured,
                                        20 * due[role] * per_call[role] / 1e9)
                            made[role] += due[role]
                    b += 1
                if alone:
                    self._alone(turns, regions, spec, case, testcase, salt, r, measured, per_call, limit, round_ns,
                                calls["candidate"])
            steps.mark("rounds")
            measured.round_parts_s = measured.round_laps.seconds
            measured.round_laps = None
        finally:
            for role, region in regions.items():
                if on_gpu and not turns.workers[role].failed:  # its mapping holds the region's memory
                    try:
                        turns.give(role).request({"op": "batch_unmap"}, self.timeout)
                    except WorkerFailure:  # a worker that dies here holds nothing; the timing's own error stands
                        turns.workers[role].failed = True
                region.close()
        steps.mark("unmap")
        measured.steps_s = steps.seconds
        if on_gpu:
            measured.settle_device_batches()
        else:
            measured.harness_runs_ns = harness.runs_ns
            measured.cpu_wait_share = machine.share()
            measured.settle_samples(capped=True)
        for role in roles:
            raw_ns = measured.raw_median_ns(role)
            # the copy's price whole, not what the cap left taken off: the floor is the copy's
            floor = launch_floor(max(1.0, raw_ns - measured.harness_ns), measured.harness_ns) \
                if raw_ns is not None else None
            if floor and role not in measured.failed:
                # a call that read more than its copy may have been read short by a busy machine
                measured.failed[role] = {"passed": False, "check": "launch_floor", "kind": "calls_done_together",
                                         "where": "its batches", "detail": floor,
                                         "floor_in_doubt": not on_gpu and raw_ns >= measured.harness_ns}
        measured.judge_calls_alone()
        measured.methods = {role: vouched_method(calls[role], measured, t, self.device) for role in roles}
        return measured

    def _alone(self, turns: Turns, regions: dict, spec: ReferenceSpec, case, testcase: dict, salt: str,
               round_index: int, measured: Rounds, per_call: dict[str, float], limit: int, round_ns: float,
               candidate_calls: int) -> None:
        """A round's calls made alone (`alone_bound`), not samples but checked like any batch:
        both roles on the same input sets of new seeds, back to back, the order flipped every
        two pairs. On the CPU (one torch thread, timed by CPU time), batches handed over one call
        at a time, each call timed on its own (`_handover_batch`), the evaluator and the workers
        on CPUs apart (none where one CPU is allowed), of two calls at least (HANDOVER_MIN_CALLS);
        on a GPU, batches handed over one call at a time on the GPU itself
        (`_device_handover_batch`), of one call where more would not fit. Where the candidate's
        batches hold more than one call, the least is made however long it takes: a slow
        baseline beside a fast candidate would otherwise leave its batches unbounded."""
        roles = list(turns.workers)
        on_gpu = self.device.startswith("cuda")
        share_ns = ALONE_SHARE * round_ns
        slowest = max(max(per_call.values()), 1.0)
        most = ALONE_PAIRS["gpu" if on_gpu else "cpu"]
        if on_gpu:
            # a call handed over costs the GPU's switch between the processes both ways too: about
            # a batch's fixed cost (`_calibrate`)
            step_ns = slowest + max(measured.calibration_ns.values(), default=0.0)
            calls = min(limit, HANDOVER_CALLS, int(share_ns / most / 2 / step_ns))
            if candidate_calls > 1:
                calls = max(1, calls)
            if calls < 1 or not stream_words.available():
                return
            measured.alone_launched_apart = measured.graph and not stream_words.capturable(
                regions[roles[0]].copy.device.index)
            pairs = max(1, min(most, int(share_ns / (2 * step_ns * calls))))
        else:
            calls = min(limit, HANDOVER_CALLS, int(share_ns / most / slowest))
            if candidate_calls > 1:
                calls = max(min(limit, HANDOVER_MIN_CALLS), calls)
            if calls < HANDOVER_MIN_CALLS:
                return  # its first call, cold after the worker was stopped, is left out: none would be left
            pairs = max(1, min(most, int(share_ns / (2 * slowest * calls))))
        measured.alone_calls = calls
        # a GPU's batches run with no host taking part, on no CPUs apart: -1 stands for "none pinned"
        with contextlib.nullcontext(-1) if on_gpu else \
                batches.apart([worker.proc.pid for worker in turns.workers.values()]) as workers_cpu:
            for k in range(pairs if workers_cpu is not None else 0):
                batch = Batch(self._fresh_sets(spec, case, f"{salt} {round_index} alone {k}", calls, measured),
                              spec, self.init_seed)
                taken, disturbed = {}, False
                for role in roles if k // 2 % 2 == 0 else reversed(roles):
                    allowed_s = 20 * calls * per_call[role] / 1e9 + 1.0
                    if on_gpu:
                        batch_ns, early = self._device_handover_batch(turns, role, regions[role], batch, calls,
                                                                      testcase, measured, allowed_s)
                        taken[role] = batch_ns / calls
                        disturbed |= early
                    else:
                        taken[role], batch_ns, waited_ns, own_threads = self._handover_batch(
                            turns, role, regions[role], batch, calls, testcase, measured, allowed_s, workers_cpu)
                        if own_threads and waited_ns > HANDOVER_WAIT_NS + HANDOVER_WAIT_SHARE * batch_ns:
                            measured.alone_held_by_own_threads[role] += 1
                            disturbed = True
                # threads of the worker's own that kept its calling thread waiting, or a GPU batch
                # that began before the worker had queued its calls: the pair is noise, not a
                # measurement
                if disturbed:
                    measured.alone_disturbed += 1
                else:
                    for role in roles:
                        measured.alone[role].append(taken[role])
                measured.lap("alone")

    def _handover_batch(self, turns: Turns, role: str, region: batches.Region, batch: Batch, calls: int,
                        testcase: dict, measured: Rounds, allowed_s: float,
                        workers_cpu: int) -> tuple[float, float, int, bool]:
        """A CPU batch whose input sets the worker sees one at a time (`batches.run_handed_over`):
        each written and released once the last call said it was done, that call's outputs
        taken as they were then. Returns what a call cost: the evaluator's clock from each
        release to the call's word that it is done, less what the worker's calling thread and
        the evaluator waited for a CPU meanwhile (`batches.handed_over_call_ns`), the mean of the
        batch's calls, its first (cold after the worker was stopped) and its slowest
        HANDOVER_TRIM (one at least) left out. The worker's CPU is its own (`batches.apart`) and
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
        left `workers_cpu` (`batches.apart`) could make the evaluator wait: its timing fails."""
        worker = turns.workers[role]
        if not worker.stopped:
            self._hold(worker)
        region.start_handover(batch.sets[:calls])
        turns.give(role)
        worker.send({"op": "batch_handover"})  # not how many: it cannot treat one size unlike the other
        limit_s = self.timeout + allowed_s
        deadline = time.monotonic() + limit_s
        before = after = None
        walls, call_ns = [], []
        if self._await_calls(worker, region, 0, deadline, limit_s):  # waiting for its first set
            self._hold(worker)
            before = batches.TreeTimes(region.caller, region.caller)
            worker.resume()
            with contextlib.closing(batches.CallWaits(region.caller)) as waits:
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
                after = batches.TreeTimes(region.caller, region.caller)
                worker.resume()
                region.end_handover()
        answer = worker.receive(max(0.0, deadline - time.monotonic()))
        self._hold(worker)
        if not answer["ok"]:
            raise WorkerFailure(f"error while timing {worker.label}: {answer['error']}")
        if before is None or after is None:
            raise WorkerFailure(f"error while timing {worker.label}: it answered a batch handed over one call at a "
                                "time before its calls were done")
        _note_processes(measured, role, calls, before, after)
        moved = batches.moved_threads(worker.proc.pid, workers_cpu)
        if moved and role not in measured.failed:
            measured.failed[role] = {
                "passed": False, "check": "affinity", "kind": "timer_integrity", "where": f"a batch of {calls} calls "
                "made alone", "detail": f"{len(moved)} thread(s) of the worker left the CPU its calls made alone were "
                "given: on the evaluator's it could hold the evaluator up and have those calls left out"}
        self._judge_batch(role, region, batch, calls, testcase, measured, taken=True)
        cpu_ns = after.cpu_since(before)
        others_ns = cpu_ns - (after.main_cpu - before.main_cpu)
        own_threads = others_ns > HANDOVER_WAIT_NS
        call_ns = batches.calls_handed_over_ns(walls, call_ns, others_ns)
        kept = sorted(call_ns[1:] or call_ns)
        kept = kept[:len(kept) - math.ceil(HANDOVER_TRIM * (len(kept) - 1))]
        return fmean(kept), cpu_ns, after.waiting - before.waiting, own_threads

    def _device_handover_batch(self, turns: Turns, role: str, region: batches.DeviceRegion, batch: Batch,
                               calls: int, testcase: dict, measured: Rounds, allowed_s: float) -> tuple[float, bool]:
        """A GPU batch handed over one call at a time (`DeviceRegion.start_handover`; in graph
        mode one replay of the worker's graph of such a batch, `_capture`), checked like any
        batch: its GPU time in ns, and whether its first set was released before the worker had
        queued its calls (its queueing timed too)."""
        if not measured.alone_launched_apart:
            self._capture(turns, role, region, calls, allowed_s, handed_over=True)
        worker = turns.workers[role]
        if not worker.stopped:
            self._hold(worker)
        region.write(batch.sets[:calls])
        started = time.perf_counter_ns()
        region.start_handover(calls)
        limit_s = self.timeout + allowed_s
        try:
            turns.give(role)
            worker.send({"op": "batch_handover", "calls": calls})
            answer = worker.receive(limit_s)
            early = region.handover_answered(time.perf_counter_ns() - started)
            if not answer["ok"]:
                raise WorkerFailure(f"error while timing {worker.label}: {answer['error']}")
            taken_ns = region.end_handover(time.monotonic() + limit_s)
        except TimeoutError:
            raise worker.overdue(f"timeout after {limit_s:g} s: a call handed over was never said to be done")
        except BaseException:
            region.release_handover()  # its stream would wait on the worker's word for good
            raise
        self._hold(worker)
        measured.lap("alone")
        self._judge_batch(role, region, batch, calls, testcase, measured, taken=True)
        self._late_work(role, region, f"after a batch of {calls} handed over one at a time", measured)
        return taken_ns, early

    @staticmethod
    def _await_calls(worker: Worker, region: batches.Region, count: int, deadline: float, limit_s: float) -> bool:
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

    def _size_batches(self, turns: Turns, role: str, region: batches.Region, spec: ReferenceSpec, case, salt: str,
                      limit: int, target_ns: float, testcase: dict, measured: Rounds) -> float:
        """ns per call for one role, from batches (not kept as samples, but checked) grown from
        one call until one after the first takes half a batch's target: the first touches of
        the region and the request's own handling weigh on the small ones. What plans the
        rounds is the larger of the time that ranks and, on the CPU, a WALL_SHARE-th of the wall
        time: a call that sleeps costs the build time too; a busy machine's waits, up to that
        share, do not shrink the batches. On a GPU, where drawing a call's inputs, copying them
        in and its outputs out and checking them can cost several times a memory-bound call
        (an H200 compare of eight 47 µs kernels took 45 s where the worker's timer took 9), the
        whole wall time of the batch, from drawing its inputs to the end of its checks."""
        on_gpu = isinstance(region, batches.DeviceRegion)
        calls, allowed_s = 1, self.timeout
        for attempt in range(SIZING_BATCHES):
            self._capture(turns, role, region, calls, allowed_s)  # once per size: not a call's cost
            started = time.perf_counter_ns()
            batch = Batch(self._fresh_sets(spec, case, f"{salt} sizing {role} {attempt}", calls, measured), spec,
                          self.init_seed)
            taken_ns = self._batch(turns, role, region, batch, calls, testcase, None, measured, allowed_s)
            if on_gpu:
                per_call = max(taken_ns, time.perf_counter_ns() - started) / calls
            else:
                taken_ns = max(taken_ns, measured.last_wall_ns / WALL_SHARE)
                per_call = taken_ns / calls
            if attempt and (taken_ns >= target_ns / 2 or calls == limit):  # never the first: it maps the region
                break
            calls = min(limit, max(2 * calls, int(calls * target_ns / max(taken_ns, 1.0))))
            allowed_s = 20 * calls * per_call / 1e9
        return per_call

    def _fresh_sets(self, spec: ReferenceSpec, case, salt: str, count: int, measured: Rounds) -> list:
        """`count` input sets of new seeds; how long one took to make goes to `measured.set_ns`:
        on the CPU the least seen, in this thread's CPU time. A pause in one draw of a few sets (a
        collection, a busy machine's wait) would cap a round's calls (`sets_a_round`), and in
        batches of a few calls a replaced batch loop's calls done together read above the floor
        (`launch_floor`)."""
        on_cpu = self.device == "cpu"
        clock = time.thread_time_ns if on_cpu else time.perf_counter_ns
        started = clock()
        sets = [spec.make_inputs(c, checked=False) for c in _rotation(case, salt, count)]
        took = (clock() - started) / count
        measured.set_ns = min(measured.set_ns, took) if on_cpu and measured.set_ns else took
        return sets

    def _batch(self, turns: Turns, role: str, region: batches.Region, batch: Batch, calls: int, testcase: dict,
               round_index: int | None, measured: Rounds, allowed_s: float) -> float:
        """The first `calls` sets of a batch, for one worker: the time it took in ns, the CPU time
        of all the worker's threads and processes (`measured.by_cpu_time`, one torch thread) or
        its wall time less the scheduler's waits (`busy_wall_ns`). The worker is stopped while
        its input sets are written and again as soon as it answers, before its outputs are read."""
        worker = turns.workers[role]
        self._capture(turns, role, region, calls, allowed_s)
        if not worker.stopped:
            self._hold(worker)
        region.write(batch.sets[:calls])
        measured.lap("write")
        if isinstance(region, batches.DeviceRegion):
            return self._device_batch(turns, role, region, batch, calls, testcase, round_index, measured, allowed_s)
        before = batches.TreeTimes(worker.proc.pid, region.caller)
        turns.give(role)
        waited = batches.own_wait()
        started = time.monotonic()
        worker.send({"op": "batch", "calls": calls})
        answer = worker.receive(self.timeout + allowed_s)
        # until it is stopped: what it computes after answering, before its outputs are read, counts
        self._hold(worker)
        wall_ns = (time.monotonic() - started) * 1e9
        waited = batches.own_wait() - waited
        if not answer["ok"]:
            raise WorkerFailure(f"error while timing {worker.label}: {answer['error']}")
        after = batches.TreeTimes(worker.proc.pid, region.caller)
        cpu_ns = after.cpu_since(before)
        taken_ns = cpu_ns if measured.by_cpu_time else \
            batches.busy_wall_ns(wall_ns, cpu_ns, after.waiting - before.waiting + waited)
        _note_processes(measured, role, calls, before, after)
        measured.last_wall_ns = wall_ns
        if round_index is not None:
            measured.add_batch(role, round_index, taken_ns, calls, wall_ns / 1e9)
        measured.lap("request")
        self._judge_batch(role, region, batch, calls, testcase, measured)
        measured.lap("check")
        return taken_ns

    def _capture(self, turns: Turns, role: str, region: batches.Region, calls: int, allowed_s: float,
                 handed_over: bool = False) -> None:
        """In graph mode, the worker's CUDA graph of a batch of `calls` calls (`handed_over`: of
        one handed over one call at a time, whose calls' kernels then cost what a batch's do),
        once per size: captured on the last batch's input sets, before the next one's are written."""
        if not (isinstance(region, batches.DeviceRegion) and region.graph):
            return
        captured = region.captured_handed_over if handed_over else region.captured
        if calls not in captured:
            op = "handover_graph" if handed_over else "batch_graph"
            answer = turns.give(role).request({"op": op, "calls": calls}, self.timeout + 2 * allowed_s)
            if not answer["ok"]:
                what = "a batch handed over one call at a time" if handed_over else "a batch"
                raise WorkerFailure(f"error while timing {turns.workers[role].label}: capturing the CUDA graph of "
                                    f"{what}: {answer['error']}")
            captured.add(calls)

    def _device_batch(self, turns: Turns, role: str, region: batches.DeviceRegion, batch: Batch, calls: int,
                      testcase: dict, round_index: int | None, measured: Rounds, allowed_s: float) -> float:
        """A batch on a GPU, its input sets written: the GPU time between the evaluator's own
        events around the worker's calls (`DeviceRegion`). Work the worker left running behind
        its event (on a stream of its own, say) has written the outputs the checks read by the
        time the evaluator's stream took them, or fails them; a probe after the checks that
        still waits on such work fails the batch."""
        taken_ns, measured.last_wall_ns = self._device_request(
            turns, role, region, calls, allowed_s, measured.phases[role] if round_index is not None else None)
        measured.device_batches[role].append((round_index, taken_ns, calls, measured.last_wall_ns / 1e9))
        measured.lap("request")
        self._judge_batch(role, region, batch, calls, testcase, measured)
        measured.lap("check")
        self._late_work(role, region, f"after a batch of {calls}", measured)
        return taken_ns

    @staticmethod
    def _late_work(role: str, region: batches.DeviceRegion, where: str, measured: Rounds) -> None:
        """A probe after a batch's checks that still waits on the worker's work fails the batch."""
        late_ns = region.probe_ns()
        measured.lap("probe")
        if late_ns > max(LATE_PROBE_FACTOR * region.idle_probe_ns, LATE_PROBE_MIN_NS) and role not in measured.failed:
            measured.failed[role] = {
                "passed": False, "check": "gpu_idle", "kind": "timer_integrity", "where": where,
                "detail": f"the GPU was still busy with the worker's work after it answered and its outputs were "
                          f"read (a probe took {late_ns / 1000:.0f} µs, {region.idle_probe_ns / 1000:.0f} µs idle): "
                          f"its time cannot be vouched for"}

    def _device_request(self, turns: Turns, role: str, region: batches.DeviceRegion, calls: int,
                        allowed_s: float, phases: list | None = None, own_kernel: bool = False) -> tuple[float, int]:
        """GPU ns between the evaluator's events around a batch request (`DeviceRegion.start`,
        `stop_clock`), and the host's wall ns from the request until the worker was stopped;
        where the time went goes to `phases` (`batch_phases`). `own_kernel`: a batch of no calls
        in which the worker runs one small kernel of the harness's."""
        worker = turns.give(role)
        started = time.perf_counter_ns()
        region.start()
        worker.send({"op": "batch", "calls": calls, "graph": region.graph and not own_kernel,
                     "own_kernel": own_kernel})
        answer = worker.receive(self.timeout + allowed_s + region.sleep_ns / 1e9)
        answered = time.perf_counter_ns()
        opened_early = region.answered(answered - started)
        region.stop_clock(calls)
        self._hold(worker)
        held = time.perf_counter_ns()
        taken_ns = region.taken_ns()
        if not answer["ok"]:
            raise WorkerFailure(f"error while timing {worker.label}: {answer['error']}")
        if phases is not None:
            phases.append({"calls": calls, "clock_ns": taken_ns, "answer_ns": answered - started,
                           "stop_ns": held - answered, "worker_loop_ns": answer.get("loop_ns"),
                           "opened_early": opened_early})
        return taken_ns, held - started

    def _calibrate(self, turns: Turns, regions: dict[str, batches.DeviceRegion]) -> tuple[dict[str, float], dict]:
        """The most `fixed_cost` may take off a batch, per worker: what a batch of no calls in
        which the worker runs one small kernel of the harness's costs on the evaluator's events
        (the gate's opening reaching its stream, the GPU switching to its process and back; a
        batch of nothing at all leaves the switch out), the median of a few; also where their
        time went (`batch_phases`)."""
        trips: list[dict] = []
        taken = {role: [] for role in regions}
        for _ in range(CALIBRATION_BATCHES):
            for role, region in regions.items():
                taken[role].append(self._device_request(turns, role, region, 0, 1.0, trips, own_kernel=True)[0])
        return {role: median(times) for role, times in taken.items()}, batch_phases(trips)

    def _judge_batch(self, role: str, region: batches.Region, batch: Batch, calls: int, testcase: dict,
                     measured: Rounds, taken: bool = False) -> None:
        """`taken`: the outputs are already in the evaluator's copy (a handed-over batch's)."""
        if role not in measured.failed:
            record = self._check_batch(region, batch, calls, testcase, taken)
            measured.checked[role] = measured.checked.get(role, 0) + record.pop("checked")
            if not record["passed"]:
                measured.failed[role] = record

    @staticmethod
    def _hold(worker: Worker) -> None:
        """Stop a worker whose timing is vouched for: a process of it that keeps running while it
        is stopped (one that left its process group) could read the next batch's inputs early."""
        if not worker.stop():
            raise WorkerFailure(f"error while timing {worker.label}: a process it started kept running while it "
                                "was stopped (it left its process group): its time cannot be vouched for")

    def _check_batch(self, region: batches.Region, batch: Batch, calls: int, testcase: dict,
                     taken: bool = False) -> dict:
        """Every output slot written, and a few calls, chosen after the answer, right with their
        inputs unchanged."""
        if not taken:
            region.read(calls)
        unwritten = region.unwritten(calls)
        if unwritten is not None:
            return {"passed": False, "check": "finite", "kind": "finite", "checked": calls,
                    "where": f"timed call {unwritten + 1} of a batch of {calls}",
                    "detail": "its output slot still held the NaN it was filled with: the call did not write it"}
        for call in region.picks(calls):
            record = compare_inputs(batch.sets[call], region.inputs(call))
            if record is None:
                outputs, reference = region.outputs(call), batch.reference(call)
                if surely_close(outputs, reference, testcase["rtol"], testcase["atol"]):
                    continue
                record = compare_outputs(outputs, reference, testcase["rtol"], testcase["atol"])
            if not record["passed"]:
                return {**record, "checked": calls, "where": f"timed call {call + 1} of a batch of {calls}"}
        return {"passed": True, "checked": calls}

    def _summaries(self, measured: Rounds, case, kernels: dict) -> dict[str, dict]:
        summaries = {}
        for role in measured.samples:
            impl = self.impl if role == "candidate" else self.baseline
            method = self._method(impl, measured.methods[role])
            if measured.vouched:
                calls = sum(measured.calls[role])
                summaries[role] = {**summarize_ns(measured.samples[role]), "method": method, "shape": case.label,
                                   "clock": "evaluator", "batches": len(measured.samples[role]), "calls": calls,
                                   "calls_per_round": measured.calls[role],
                                   "wall_per_call_us": measured.wall[role] * 1e6 / max(calls, 1),
                                   "harness_us_per_call": measured.harness_ns / 1000,
                                   # what was taken off its calls (`harness_taken_off`), and each run that priced it
                                   "harness_taken_off_us": measured.subtracted_ns.get(role, 0.0) / 1000,
                                   "harness_runs_us": [round(ns / 1000, 3) for ns in measured.harness_runs_ns]
                                   or None,
                                   "cpu_wait_share": measured.cpu_wait_share,
                                   "round_trip_us": measured.fixed_ns / 1000,
                                   "calibration_us": measured.calibration_ns[role] / 1000
                                   if role in measured.calibration_ns else None,
                                   "sizing_us_per_call": measured.per_call_ns[role] / 1000
                                   if role in measured.per_call_ns else None,
                                   "from_own_timing": measured.reused.get(role),
                                   "batch_phases": {"batches": batch_phases(measured.phases[role]),
                                                    "calibration_batches": measured.calibration_phases}
                                   if measured.phases.get(role) else None,
                                   # on a GPU, every batch (round, calls, µs on the events): what
                                   # `fixed_cost` drew its line through
                                   "device_batches": [[r, n, round(ns / 1000, 3)] for r, ns, n, _
                                                      in measured.device_batches[role]] or None,
                                   "outputs_checked": measured.checked.get(role, 0),
                                   "alone_bound": measured.alone_bound if role == "candidate" else None}
            else:
                infos = measured.infos[role]
                summaries[role] = self._summary(measured.samples[role], measured.wall[role], measured.account[role],
                                                method, case.label)
                summaries[role]["timer_info"] = {**infos[-1], "host_wall_median_us": measured.host_wall.get(role)}
                summaries[role]["early_rounds_ms"] = measured.early[role]
                summaries[role]["rounds_info"] = [{k: v for k, v in info.items() if k in ROUND_INFO}
                                                  for info in infos]
            summary = summaries[role]
            if role in kernels:
                summary["kernel_us"] = kernels[role].get("kernel_us")
                summary["kernels"] = kernels[role].get("kernels")
                if summary["kernel_us"]:
                    summary["dispatch_overhead_us"] = summary["median_us"] - summary["kernel_us"]
                if kernels[role].get("from_own_timing"):  # also where the worker's timer measured
                    summary["from_own_timing"] = sorted({*(summary.get("from_own_timing") or []), "kernels"})
        return summaries

    def _known_of_baseline(self, case, mode: str | None) -> dict:
        """What the baseline's own timing job measured in this build that no candidate beside it
        changes: the harness's copy price (the reference's outputs, a device's copy engine), its
        worker's calibration and time per call from its sizing batches (its code, its inputs),
        its kernels. Taken from there, a candidate's job spends its time held alone on the
        candidate (0.2 s of each 1 s job in the H200's 8-candidate compare). From an earlier
        build only where this job adopted the baseline's worker parked since (the zygote, the
        device and the process that build measured, kept warm: an edit's rebuild); never from
        another case or another method."""
        own = self.baseline_own_timing
        if not (own.get("this_build") or self._baseline_kept_warm) or own.get("shape") != case.label \
                or own.get("mode") != mode:
            return {}
        return {key: own[key] for key in ("harness_us_per_call", "calibration_us", "sizing_us_per_call", "kernels")
                if own.get(key) is not None}

    def _disturbed(self, measured: Rounds, case, t: dict) -> str | None:
        """Where the baseline's median beside this candidate is more than `disturbed_fraction`
        off its median in its own timing job (same case, same method), what was seen; else None.
        Jobs of one build read one baseline within 1.5% on the H200; one of 80 read it 67%
        slow (and its candidate 22%) and credited 2.32x where the other runs said 1.71x: the
        device was not the measurement's alone."""
        own = self.baseline_own_timing
        if own.get("shape") != case.label or not own.get("median_us") or not measured.samples.get("baseline"):
            return None
        here = summarize_ns(measured.samples["baseline"])["median_us"]
        ratio = here / own["median_us"]
        if abs(math.log(ratio)) <= math.log1p(for_device(t.get("disturbed_fraction"), DEFAULT_DISTURBED_FRACTION,
                                                         self.device)):
            return None
        return (f"the baseline read {here:.4g} µs beside this candidate and {own['median_us']:.4g} µs in its own "
                f"timing ({ratio:.2f}x): something else ran on the device")

    def _judge_retiming(self, result: dict, retimed: Rounds, threshold: float, case, spec_index: int,
                        statistic: str = "median", between_runs: float = 0.0) -> None:
        """The second measurement of an implausible speedup: checked like the first (its calls
        made alone too), then either a label on the first (`speedup["implausible"]`, a flag) or
        the timing's failure. Its speedup is the ratio of the same statistic as the first's."""
        again = self._summaries(retimed, case, {})
        result["retiming"] = {"performance_result": again["candidate"], "baseline_result": again["baseline"]}
        flagged = {f["detail"].split(":", 1)[0] for f in result.get("flags", []) if f["kind"] == "uneven_calls"}
        for role, record in retimed.failed.items():
            _fail(result, record["kind"], f"{role}, re-timed: {record['where']}: {record['check']}: {record['detail']}",
                  case, spec_index)
        for role, summary in again.items():
            problem = None if retimed.vouched else timer_inconsistency(summary, self.device)
            if problem:
                _fail(result, "timer_integrity", f"{role}, re-timed: {problem}", case, spec_index)
            if role not in flagged and uneven_calls(summary["mean_us"], summary["median_us"]):
                _flag_uneven(result, summary, f"{role}, re-timed", True, case, spec_index)
        if retimed.alone_bound and retimed.alone_bound["failed"]:
            _fail(result, "calls_done_together", f"candidate, re-timed: {alone_line(retimed.alone_bound)}", case,
                  spec_index)
        if result["performance_state"] != "SUCCESS":
            return
        second = paired_speedup(retimed.for_speedup(statistic), again["baseline"]["median_us"], statistic, between_runs)
        label, line = implausible_speedup(result["speedup"], second, threshold)
        result["speedup"]["implausible"] = label
        if unvouched_on_a_busy_machine(label["confirmed"], retimed.busy(), retimed.alone_bound):
            _inconclusive(result, [f"candidate: {line}; its calls made alone drew no bound"],
                          [retimed.cpu_wait_share], case, spec_index)
        elif label["confirmed"]:
            result["warnings"].append(f"candidate: {line}")
            _record(result, "flags", "implausible_speedup", f"candidate: {line}", case, spec_index)
        else:
            _fail(result, "timer_integrity", f"candidate: {line}", case, spec_index)

    def _roofline(self, summary: dict, min_bytes: int, expected) -> tuple[str, str] | None:
        """`roofline_floor` for one role's median, on this GPU (nothing on the CPU or an unknown
        device). What the L2 may hold is allowed for: in graph mode (warm L2, calls back to
        back) up to its size of inputs and outputs; with events (the L2 flushed with clean
        lines before each call) the outputs, which a call may leave in the L2 unwritten."""
        if self.device == "cpu" or not min_bytes:
            return None
        from magpie.roofline.specs import detect_current

        arch = detect_current()
        if arch is None:
            return None
        torch = self.torch
        l2 = int(getattr(torch.cuda.get_device_properties(torch.device(self.device)), "L2_cache_size", 0) or 0)
        warm = any(info.get("mode") != "events" for info in summary.get("rounds_info") or [])
        outputs = sum(x.numel() * x.element_size() for x in as_tuple(expected) if torch.is_tensor(x))
        return roofline_floor(summary["median_us"], min_bytes, arch.memory_tbps, arch.name,
                              cached_bytes=l2 if warm else min(outputs, l2), measured=bool(arch.measured))

    def _device_index(self) -> int:
        return int(self.device.split(":")[1]) if ":" in self.device else 0

    def _chosen_method(self, t: dict) -> dict | None:
        """The timing method where it is settled before any probe: on the CPU, by the manifest,
        or by the baseline's timing for the baseline and every candidate (`timing_method`)."""
        if self.device == "cpu":
            return {"mode": None, "why": "batches of calls on fresh inputs, timed from outside the worker (CPU device)"}
        if t.get("mode", "auto") != "auto":
            return {"mode": t["mode"], "why": f"timing.mode = \"{t['mode']}\" in the manifest"}
        if self.set_method is not None:
            return {**self.set_method, "why": f"{self.set_method['why']}; chosen by the baseline's timing"}
        return None

    def _probed_method(self, probes: dict[str, float], launches: dict[str, float | None] | None = None) -> dict:
        """From device time per call (a short graph replay, free of launch overhead) and the
        host's time to queue a call (`launch_probe`): graph mode under GRAPH_THRESHOLD_US, or
        where the host takes longer to queue a call than the device to run it (launch-bound:
        per-call events would time the host's launch path, which varies with the host's load:
        a 17.5 µs-kernel baseline read 66-178 µs across one build's jobs on the H200). The
        baseline's own timing decides for its kernel's set; a candidate whose baseline was not
        timed decides from the faster of its pair."""
        fastest = min(probes, key=probes.get)
        probe_us = probes[fastest]
        launch_us = (launches or {}).get(fastest)
        who = "the baseline" if self.impl.get("is_baseline") else f"the {fastest} (no timed baseline to follow)"
        launched = f", launched in {launch_us:.3g} µs" if launch_us is not None else ""
        if probe_us < GRAPH_THRESHOLD_US:
            mode, why = "graph", f"{who} probed {probe_us:.3g} µs per call, under {GRAPH_THRESHOLD_US:g} µs"
        elif launch_us is not None and launch_us > probe_us:
            mode, why = "graph", (f"{who} takes {launch_us:.3g} µs to launch a call that runs {probe_us:.3g} µs on "
                                  "the device: launch-bound")
        else:
            mode, why = "events", (f"{who} probed {probe_us:.3g} µs per call, at or over "
                                   f"{GRAPH_THRESHOLD_US:g} µs{launched}")
        return {"mode": mode, "probe_us": round(probe_us, 3),
                "launch_us": round(launch_us, 3) if launch_us is not None else None, "why": why}

    def _method(self, impl: dict, method: str) -> str:
        if impl["type"] == "triton" and self.device == "cpu":
            method += "; Triton ran in its CPU interpreter (TRITON_INTERPRET=1): not GPU performance"
        return method

    def _time_request(self, worker: Worker, offer: dict, out_specs: list, **params) -> dict:
        self._send_time(worker, offer, out_specs, **params)
        return self._time_answer(worker, **params)

    @staticmethod
    def _send_time(worker: Worker, offer: dict, out_specs: list, **params) -> None:
        worker.send({"op": "time", "inputs": offer, "out_specs": out_specs, **params})

    def _time_answer(self, worker: Worker, **params) -> dict:
        deadline = self.timeout + (params.get("budget_ms", 0) + params.get("warmup_ms", 0)) / 1000
        answer = worker.receive(deadline)
        if not answer["ok"]:
            raise WorkerFailure(f"error while timing {worker.label}: {answer['error']}")
        if params.get("budget_ms") and not answer.get("samples_ns"):
            raise WorkerFailure(f"the timer of {worker.label} returned no samples")
        return answer

    @staticmethod
    def _summary(samples_ns: list[int], wall_s: float, account: dict, method: str, case: str) -> dict:
        summary = summarize_ns(samples_ns)
        summary.update(method=method, shape=case, wall_per_call_us=wall_s * 1e6 / account["calls"],
                       wall_account={"wall_s": wall_s, **account}, **wall_check(wall_s, account, summary["median_us"]))
        return summary


TIMER_COSTS: dict[str, dict] = {}  # per device, measured once per evaluator process
# What the summary keeps of each round: the mode, the timer's own clock around its loop and the
# evaluator's around the request.
ROUND_INFO = ("mode", "loop_wall_ms", "request_wall_ms")
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


def _probe_waited(measured: Rounds) -> str | None:
    """What failed, where the only failures are probes after a batch that waited (`gpu_idle`):
    on the H200 one probe after an honest baseline's batch, in 90 measurements, took 1.2 ms
    against an idle 24 µs. Work a worker leaves behind its batches fails the one taken again."""
    failures = list(measured.failed.items())
    if not failures or any(failure["check"] != "gpu_idle" for _, failure in failures):
        return None
    return "; ".join(f"{role}: {failure['detail']}" for role, failure in failures)


def _rotation(case, salt: str, count: int) -> list:
    """The input sets a measurement rotates through, of seeds derived from the case's and `salt`."""
    return [type(case)(case.label, case.shape, case.dtype, k, derive_seed(case.seed, salt, k)) for k in range(count)]


class Turns:
    """One worker runs at a time while measuring; the others stay stopped, also across one
    worker's consecutive requests: a thread an implementation left running (on the GPU or the
    CPU) must not slow down what it is compared with."""

    def __init__(self, workers: dict[str, Worker]):
        self.workers = workers
        self.current: str | None = None

    def give(self, role: str) -> Worker:
        if role != self.current:
            for other, worker in self.workers.items():
                if other != role and not worker.stopped:
                    worker.stop()
            self.current = role
        if self.workers[role].stopped:  # stopped by its turn's batch too (`Evaluator._batch`)
            self.workers[role].resume()
        return self.workers[role]

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        for worker in self.workers.values():
            if worker.stopped:
                worker.resume()
        self.current = None


def _note_processes(measured: Rounds, role: str, calls: int, before: batches.TreeTimes,
                    after: batches.TreeTimes) -> None:
    """A batch in which a process of the worker started or ended fails the role's timing."""
    if after.processes_changed(before) and role not in measured.failed:
        measured.failed[role] = {
            "passed": False, "check": "processes", "kind": "timer_integrity", "where": f"a batch of {calls}",
            "detail": "a process of the worker started or ended during a timed batch: what an ended process "
                      "spent is known only in clock ticks, so its time cannot be vouched for"}


def _skipped(reason: str) -> dict:
    return {"correctness_state": "SKIPPED", "numerics": "unverified", "verdict": f"skipped: {reason}",
            "checks": [], "errors": [reason], "failures": [failure("skipped", "correctness", reason)]}


def _record(result: dict, key: str, kind: str, detail: str, case, testcase: int) -> None:
    """A timing failure ("failures") or flag ("flags") on the timed case, beside its line in errors or warnings."""
    where = {"testcase": testcase, "case": case.label, "shape": case.shape, "dtype": case.dtype}
    result.setdefault(key, []).append(failure(kind, "timing", detail, where))


def _flag_uneven(result: dict, summary: dict, who: str, paired: bool, case, testcase: int) -> None:
    """An `uneven_calls` flag: the summary's line, a warning, the record."""
    line = uneven_line(summary["mean_us"], summary["median_us"], paired)
    summary.setdefault("flags", []).append(line)
    result["warnings"].append(f"{who}: {line}")
    _record(result, "flags", "uneven_calls", f"{who}: {line}", case, testcase)


def _fail(result: dict, kind: str, detail: str, case, testcase: int) -> None:
    """The timing fails: its line in errors, its record in failures."""
    result["performance_state"] = "FAILED"
    result["errors"].append(detail)
    _record(result, "failures", kind, detail, case, testcase)


def _inconclusive(result: dict, doubts: list[str], shares: list[float], case, testcase: int) -> None:
    """The timing's only failures are ones a busy machine may have caused, in every measurement
    (`Rounds.in_doubt`): no verdict. What they read stays in the warnings; not stored as final
    (`INCONCLUSIVE`), the next build measures it again."""
    waits = ", ".join(f"{share:.0%}" for share in shares)
    line = (f"inconclusive: machine busy: its threads waited for a CPU {waits} of the time they could run in "
            f"{len(shares)} measurement(s), each read near a limit a busy machine can cross: {'; '.join(doubts)}")
    result["performance_state"] = INCONCLUSIVE
    result["warnings"].extend(f"in doubt: {error}" for error in result["errors"])
    result["errors"] = [line]
    result["failures"] = []
    _record(result, "failures", "inconclusive_machine_busy", line, case, testcase)


def _not_judged(stage: str, spec: str, err: SpecError, testcase: int | None) -> dict:
    """The spec (its import, inputs or reference) failed, not the implementation: the result
    names the spec file in `spec_error`, which the comparison reports once for the kernel, and
    the implementation is not judged (SKIPPED, not FAILED)."""
    detail = str(err).removeprefix(f"{Path(spec).name}: ")  # SpecError names the file: here by its path
    line = f"not judged: spec error in {spec}: {detail}"
    result = {"verdict": line, "errors": [line], "spec_error": {"spec": spec, "detail": detail},
              "failures": [failure("spec", stage, detail, {"testcase": testcase})]}
    if stage == "correctness":
        return {"correctness_state": "SKIPPED", "numerics": "unverified", "checks": [], **result}
    return {"performance_state": "SKIPPED", "performance_result": None, **result}


def _not_timed(state: str, kind: str, error: str, testcase: int | None = None) -> dict:
    return {"performance_state": state, "performance_result": None, "errors": [error],
            "failures": [failure(kind, "timing", error, {"testcase": testcase})]}


def _verdict(checks: list[dict], numerics: str) -> dict:
    if numerics == "verified" and checks and all(c.get("case") == "command" for c in checks):
        numerics = "checked by the testcase command"  # no Python reference: exit codes judged the outputs
    failed = next((c for c in checks if not c["passed"]), None)
    if failed is None:
        verdict = "runs, output finite (numerics unverified)" if numerics == "unverified" else "correct"
        return {"correctness_state": "SUCCESS", "numerics": numerics, "verdict": verdict,
                "checks": checks, "errors": [], "failures": [], "numerics_margin": numerics_margin(checks)}
    where = f" on {failed['case']} trial {failed['trial']}" if failed.get("case") != "command" else ""
    errs = ""
    if "max_abs_err" in failed:
        errs = f" (max abs err {failed['max_abs_err']:.3g}, max rel err {failed['max_rel_err']:.3g})"
    verdict = f"incorrect: {failed['check']}{where}: {failed['detail']}{errs}"
    # every failing case, the one the verdict names first
    failures = [failure(c.get("kind") or c["check"], "correctness", c["detail"], c) for c in checks if not c["passed"]]
    return {"correctness_state": "FAILED", "numerics": numerics, "verdict": verdict, "checks": checks,
            "errors": [verdict], "failures": failures}


def numerics_margin(checks: list[dict]) -> dict | None:
    """How close a correct implementation came to its tolerance: the error figures of the case
    that used most of it (tolerance_used 1 is the allclose bound), and how many cases were compared."""
    compared = [c for c in checks if "max_abs_err" in c]
    if not compared:
        return None
    worst = max(compared, key=lambda c: (c.get("tolerance_used", 0.0), c["max_rel_err"]))
    keys = ("max_abs_err", "max_rel_err", "rel_err_norm", "tolerance_used", "testcase", "case", "shape", "dtype",
            "trial")
    return {**{k: worst[k] for k in keys if k in worst}, "cases": len(compared)}


def evaluate(request_path: str) -> dict:
    request = json.loads(Path(request_path).read_text())
    evaluator = Evaluator(request)
    # its job's hard limit counts none of its waits for the device (`supervision.step_limit`)
    with device_lock.telling_waits(Path(request["work_dir"]) / device_lock.WAITS_FILE):
        if request["mode"] == "correctness":
            with device_lock.shared(evaluator.device):
                result = evaluator.correctness()
        else:
            result = evaluator.timing()
    result["isolation"] = evaluator.isolation
    result["input_secret"] = evaluator.input_secret
    # the one GPU node its sandboxed processes opened, for the profile of the same code
    result["gpu_minors"] = evaluator.sandboxed_gpu_minors()
    return result


@contextlib.contextmanager
def fresh_imports():
    """Each job sees the modules its spec imports as a fresh process would: the Python
    modules a job imported from outside the installed libraries and magpie are forgotten after
    it, and sys.path is restored; two kernels' specs may each import a `common` of their own.
    Libraries and compiled extensions stay: importing them twice can break them."""
    path, before = list(sys.path), set(sys.modules)
    try:
        yield
    finally:
        sys.path[:] = path
        libraries = _library_roots()
        for name in set(sys.modules) - before:
            file = getattr(sys.modules[name], "__file__", None)
            if not file or file.endswith(tuple(importlib.machinery.EXTENSION_SUFFIXES)):
                continue
            if not os.path.realpath(file).startswith(libraries):
                del sys.modules[name]


@functools.lru_cache(maxsize=1)
def _library_roots() -> tuple[str, ...]:
    """Where installed code lives: the interpreter's trees, site-packages (the user's too),
    PYTHONPATH, and magpie itself."""
    import site

    magpie = Path(__file__).resolve().parent.parent
    # magpie puts its own parent on PYTHONPATH (a source checkout, where projects may live too)
    pythonpath = {p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p} - {str(magpie.parent)}
    places = {sys.prefix, sys.base_prefix, sys.exec_prefix, *site.getsitepackages(), site.getusersitepackages(),
              *pythonpath, str(magpie)}
    return tuple(os.path.realpath(p).rstrip(os.sep) + os.sep for p in places)


def serve(commands, answers) -> None:
    """Jobs one after another: {"op": "evaluate", "request": PATH}, answered with the result
    (over this pipe, which no worker holds: code under test cannot write a verdict); between
    jobs the action that ran one may park this process for the next ("reset", "relog")."""
    # No process of the same user (a candidate's left-over child, say) reads or writes this one's memory.
    namespaces.prctl(namespaces.PR_SET_DUMPABLE, 0)
    for line in commands:
        message = json.loads(line)
        op = message["op"]
        if op == "exit":
            break
        reply = {"ok": True}
        try:
            if op == "evaluate":
                with fresh_imports():
                    reply["result"] = evaluate(message["request"])
            elif op == "relog":
                log_to(message["log"])
            elif op == "reset":
                release_memory()
        except device_lock.DeviceLockError as err:  # that job's failure, in the lock's own line
            reply = {"ok": False, "error": str(err)}
        except Exception as err:  # a bug here or in a spec: that job's failure, told in one line
            traceback.print_exc()
            reply = {"ok": False, "error": f"{type(err).__name__}: {err}".splitlines()[0][:500]}
        answers.write(json.dumps(reply) + "\n")
        answers.flush()


def main(argv: list[str]) -> int:
    return serve_pipes(argv, serve)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
