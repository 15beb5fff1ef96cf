"""The worker processes of one evaluation job: a loaded worker for an implementation (one a
job parked, a spare started like it, or a new process), the sandbox policy and compiler caches
it gets, the spare started for the next job, where each new worker's load went; and `Turns`,
which lets one worker run at a time while measuring."""

from __future__ import annotations

import base64
import functools
import hashlib
import os
import shutil
import time
from pathlib import Path
from typing import Any, Literal, overload

import msgspec

from magpie import sandbox
from magpie.harness import spares, triton_warmup
from magpie.harness.compiler_caches import compiler_caches, implementation_caches, seed_triton_cache
from magpie.harness.context import EvaluationContext
from magpie.harness.declared import readable, undeclared_read
from magpie.harness.keys import code_reads, worker_key
from magpie.harness.wire import Implementation
from magpie.supervision import device_lock, zygote
from magpie.supervision import scratch as scratch_folders
from magpie.supervision.session import NothingParked, Worker, WorkerFailure


class WorkerPool:
    def __init__(self, context: EvaluationContext):
        self.context = context
        self._loading: set[Worker] = set()  # started with a load whose answer is still due
        self._asked: dict[Worker, float] = {}  # when each new worker was asked for (`_load_record`)
        self._spare_of: dict[str, tuple] = {}  # implementation -> how a spare for its workers starts
        self.worker_loads: list[dict] = []
        self.isolation: str | None = None  # of the workers that ran code under test

    @overload
    def start(
        self,
        impl: Implementation,
        init_file: str | None,
        init_from_module: bool = False,
        fork: Literal[True] = True,
        wait: bool = True,
    ) -> Worker: ...
    @overload
    def start(
        self,
        impl: Implementation,
        init_file: str | None,
        init_from_module: bool = False,
        *,
        fork: bool,
        wait: bool = True,
    ) -> Worker | None: ...
    def start(
        self,
        impl: Implementation,
        init_file: str | None,
        init_from_module: bool = False,
        fork: bool = True,
        wait: bool = True,
    ) -> Worker | None:
        """A loaded worker for impl: one a job parked if there is one, else a new process
        (with fork=False, None). With wait=False the load is under way when it returns, and
        `loaded` waits for it: a new process's CUDA context is made while the evaluator makes
        the inputs (and its own)."""
        cwd = self.context.root / (impl.working_dir or ".")
        # CUDA reserves far more address space than it uses, so the address-space limit that
        # catches memory hogs on the CPU would stop every GPU process at start-up; a sandbox
        # holds a GPU worker to it as a memory cgroup alone (`sandbox.memory`), where one can be had.
        limit_mb = self.context.correctness_settings.memory_mb or sandbox.default_memory_mb()
        memory_mb = limit_mb if self.context.device == "cpu" else 0
        env = self.context.env(impl)
        policy = None if sandbox.trusted() else self._policy(impl, cwd, limit_mb)
        # a sandbox that opens one GPU's node shows CUDA that GPU alone, as its device 0
        device = "cuda:0" if policy is not None and policy.gpu_minors else self.context.device
        load: dict[str, Any] = {  # a wire.Load, as the worker's key hashes it
            "op": "load",
            "id": impl.id,
            "source": str(self.context.root / impl.source),
            "library": impl.library,
            "entry": impl.entry,
            "device": device,
            "seed": self.context.init_seed,
            "init_inputs_file": init_file,
            "init_from_module": init_from_module,
            "threads": self.context.timing_settings.threads,
        }
        if policy is not None:
            load["readable"] = readable(self.context.root, impl)
        code = None if impl.library else self.context.code(impl.source)
        if code is not None:  # what the task was keyed by, not the file as it may be now
            load["code"] = base64.b64encode(code).decode()
        log_path = self.context.work / f"worker-{impl.id}.log"
        process = {"cwd": str(cwd), "env": env, "memory_mb": memory_mb, "sandbox": policy.to_json() if policy else None}
        key = worker_key(load, impl, self.context.root, build=self.build_of_workers, **process)
        base = implementation_caches(key)
        spare = spares.key(load, build=self.build_of_workers, **process) if policy is not None and fork else None
        self.isolation = sandbox.describe(policy)
        asked = time.time()
        # a spare, where no worker ever loaded this content (its caches would exist)
        worker = (
            self._adopt_spare(spare, impl, base, log_path, **process)
            if spare is not None and not base.exists()
            else None
        )
        if worker is not None:
            load = {**load, "log": str(worker.live_log), "caches": compiler_caches(base)}
        else:
            caches = self._new_caches(impl, base)
            if policy is not None:
                policy.write += list(caches.values())
            try:
                worker = Worker(
                    label=impl.id,
                    cwd=str(cwd),
                    env={**env, **caches},
                    memory_mb=memory_mb,
                    log_path=log_path,
                    key=key,
                    fork=fork,
                    sandbox=policy.to_json() if policy else None,
                )
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
            self._spare_of[impl.id] = (spare, impl, device, process)
        self._loading.add(worker)
        return self.loaded(worker) if wait else worker

    def _adopt_spare(self, spare: str, impl: Implementation, base: Path, log_path: Path, **process) -> Worker | None:
        """A spare started like impl's worker, its caches made impl's (`harness.spares`); None if
        none is parked or its caches could not be taken."""
        try:
            worker = Worker(label=impl.id, log_path=log_path, key=spare, fork=False, **process)
        except NothingParked:
            return None
        if not spares.take_caches(worker.scratch, base):
            worker.close()
            return None
        worker.adopted = False  # a new process to its job: it loads the code, makes the first calls
        return worker

    def start_spare(self, impl: Implementation, worker: Worker) -> None:
        """Start the spare that the next new worker started like impl's takes, if none is
        parked or on its way, and park it while it makes its context, under a share of the
        device lock it holds until then, and then, for Triton on a GPU, starts the compiler
        and builds the launchers of the kernels impl's `worker` compiled (`triton_warmup`).
        Called after a measurement: started beside the first calls of a candidate's new
        worker, it made them 0.17 s slower on the H200 (a new module's load waits behind the
        driver's making of another context)."""
        if impl.id not in self._spare_of:
            return
        spare, impl, device, process = self._spare_of[impl.id]
        if not zygote.reserve(spare, process["env"]):
            return
        prepare = {"op": "prepare", "device": device}
        if impl.type == "triton" and self.context.device != "cpu":
            try:  # the worker's word, checked: launchers of no kernel of its are wasted, nothing more
                answer = worker.request({"op": "triton_signatures"}, self.context.timeout)
            except WorkerFailure:  # its failure is the recheck's to report
                answer = {}
            prepare["triton_signatures"] = triton_warmup.signatures(answer.get("signatures"))
        held = device_lock.share_held(self.context.device)
        if held is None:
            return
        spares.sweep_caches()
        scratch = scratch_folders.make("w-")
        caches = self._new_caches(impl, spares.caches_folder(scratch))
        policy = {**process["sandbox"], "write": [*process["sandbox"]["write"], *caches.values()]}
        try:
            worker = Worker(
                label="spare",
                cwd=process["cwd"],
                env={**process["env"], **caches},
                memory_mb=process["memory_mb"],
                log_path=self.context.work / "worker-spare.log",
                sandbox=policy,
                scratch=scratch,
                held_fd=held,
            )
        finally:
            os.close(held)
        try:
            worker.send(prepare)
        except WorkerFailure:
            worker.close()
            return
        worker.park_spare(spare)

    def _new_caches(self, impl: Implementation, base: Path) -> dict[str, str]:
        """Compiler caches under base for a new process of impl's, a Triton cache seeded with
        the driver utilities this evaluator compiled (`seed_triton_cache`)."""
        caches = compiler_caches(base)
        if impl.type == "triton" and self.context.device != "cpu":
            seed_triton_cache(Path(caches["TRITON_CACHE_DIR"]))
        return caches

    @functools.cached_property
    def build_of_workers(self) -> str | None:
        """The build a worker serves, where only its own build may adopt it: on a GPU timed by
        the worker's own timer (`timing.vouched = false`), where workers kept from an earlier
        build timed memory-bound kernels 30-120% slow in a third of the rows of repeated
        compares on the H200 (docs/performance.md; cause not established). Elsewhere none: the
        evaluator vouches for the measurement, and workers serve later builds alike."""
        context = self.context
        vouched = context.timing_settings.vouched
        if context.device == "cpu" or vouched or not context.input_secret:
            return None
        return hashlib.sha256(context.input_secret.encode()).hexdigest()[:12]

    def _policy(self, impl: Implementation, cwd: Path, memory_mb: int) -> sandbox.Policy:
        """What a worker of impl may touch: it reads the project, its own sources and its compiled
        library, and, once told at its load, of the project its declared files alone (`readable`);
        it writes only its scratch folder (added by the Worker) and its compiler cache. The same
        for every implementation in one folder, so that a spare serves any of them."""
        context = self.context
        return sandbox.Policy(
            write=[],
            read=code_reads(context.root, msgspec.structs.asdict(impl), cwd),
            project=str(context.root),
            hide=context.hide,
            gpu=context.device != "cpu",
            gpu_minors=self.gpu_minors,
            memory_mb=memory_mb,
        )

    @functools.cached_property
    def gpu_minors(self) -> list[int] | None:
        """The node of the one GPU this evaluator times on, which is all its workers may open:
        with every GPU of the host open, a worker could split a batch's work over two. None
        (every GPU's node) on a host of one GPU (asking which it is would make this process's
        CUDA context before the worker starts, where the two are made together), off NVIDIA, or
        where the driver does not say which node it is."""
        device = self.context.device
        if device == "cpu" or len(sandbox.nvidia_gpu_nodes()) < 2:
            return None
        torch = self.context.torch
        uuid = getattr(torch.cuda.get_device_properties(torch.device(device)), "uuid", None)
        minor = sandbox.nvidia_minor(str(uuid)) if uuid else None
        return None if minor is None else [minor]

    def sandboxed_gpu_minors(self) -> list[int] | None:
        """The GPU nodes this job's sandboxes open where they open one alone; else None."""
        return self.gpu_minors if self.context.device != "cpu" and not sandbox.trusted() else None

    def loaded(self, worker: Worker) -> Worker:
        if worker in self._loading:
            self._loading.discard(worker)
            answer = worker.receive(self.context.timeout)
            if not answer["ok"]:
                worker.close()
                raise WorkerFailure(f"error while loading: {self.undeclared(worker, answer['error'])}")
            self._load_record(worker, answer)
        return worker

    def undeclared(self, worker: Worker, error: str) -> str:
        """A worker's error, or where it came from reading a project file its implementation
        does not declare, the one line that says where to declare it (`harness.declared`)."""
        impl = next((i for i in (self.context.impl, self.context.baseline) if i and i.id == worker.label), None)
        return (undeclared_read(error, self.context.root, impl) if impl else None) or error

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
            self.worker_loads.append(
                {
                    "label": worker.label,
                    "spare": True,
                    **steps,
                    "until_read": round(now - asked - sum(steps.values()), 4),
                }
            )
            return
        began = answer["started_unix"] - asked
        self.worker_loads.append(
            {
                "label": worker.label,
                "start": round(began, 4),
                **steps,
                "until_read": round(now - asked - began - sum(steps.values()), 4),
            }
        )


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
        if self.workers[role].stopped:  # stopped by its turn's batch too (`BatchMeasurement.batch`)
            self.workers[role].resume()
        return self.workers[role]

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        for worker in self.workers.values():
            if worker.stopped:
                worker.resume()
        self.current = None
