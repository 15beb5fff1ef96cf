"""The process that runs one implementation's code, and nothing else.

It is started by the evaluator with two pipe descriptors: commands arrive on the first
as JSON lines, answers leave on the second. Its own stdout is pointed at stderr so that
what the candidate prints never mixes with the protocol. Uninitialised tensors are
filled with NaN (or the dtype's max) so an output element the kernel never wrote shows.
"""

from __future__ import annotations

import base64
import json
import os
import sys
import threading
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

from magpie import sandbox
from magpie.harness import triton_warmup, wire
from magpie.harness.batches import WorkerViews, run_batch, run_handed_over, run_handed_over_on_gpu
from magpie.harness.exchange import deliver, receive_inputs
from magpie.harness.laps import Laps
from magpie.harness.spec import load_module, to_cpu, to_device
from magpie.harness.timing import collector_paused, timer_for
from magpie.supervision.process import log_to, release_memory, serve_pipes


class Implementation:
    def __init__(self, request: wire.Load, laps: Laps | None = None):
        import torch

        laps = laps or Laps()
        self.torch = torch
        self.device = request.device
        torch.set_num_threads(request.threads)
        make_context(torch, self.device)  # now, while the evaluator makes the inputs
        laps.mark("context")
        source = request.source
        module = None
        if not request.library:
            code = base64.b64decode(request.code) if request.code else None
            module = load_module(Path(source), f"magpie_impl_{request.id}", code)
        self.module = module
        self._input_cache: dict[str, list] = {}
        self._batch_views: WorkerViews | None = None
        self._batch_graphs: dict = {}  # calls: the CUDA graph of a batch of that many (`batch_graph`)
        self._handover_graphs: dict = {}  # calls: the CUDA graph of a batch handed over (`handover_graph`)
        self._timer = prepared_timer(self.device)
        self._build: Callable[[], Any] | None = None  # how a KernelBench model was built: a parked worker rebuilds it
        self.fn: Any  # what a call calls: the entry, a KernelBench model, or a compiled library's
        if request.library:
            self.fn = NativeEntry(torch, request.library, request.entry or request.id, self.device)
        else:
            self.fn = self._entry(module, request)
        laps.mark("module")

    def _entry(self, module, request: wire.Load):
        entry = request.entry
        if entry:
            if not hasattr(module, entry):
                raise LookupError(f"{request.source} has no attribute {entry!r} (the declared entry)")
            target = getattr(module, entry)
        else:
            target = next((getattr(module, n) for n in ("ModelNew", "Model") if hasattr(module, n)), None)
            if target is None:
                raise LookupError(f'{request.source}: no entry declared and no ModelNew/Model class; set entry = "fn"')
        if isinstance(target, type):  # KernelBench convention: a module built from init inputs
            init, state = [], None
            if request.init_from_module:
                init = list(getattr(module, "get_init_inputs", list)())
            elif request.init_inputs_file:
                saved = self.torch.load(request.init_inputs_file, weights_only=True)
                init, state = list(saved[0]), (saved[1] if len(saved) > 1 else None)
            self._build = build = lambda: self._model(target, init, request.seed, state)
            return build()
        if not callable(target):
            raise TypeError(f"entry {entry!r} is not callable")
        return target

    def _model(self, cls, init: list, seed: int, state: dict | None = None):
        """Built under the weights' seed, as the reference Model was; then given the Model's state
        where its parameters and buffers have the same names, shapes and dtypes (else it keeps
        the seeded ones, as KernelBench leaves them)."""
        self.torch.manual_seed(seed)
        model = cls(*init)
        if state is not None and hasattr(model, "state_dict"):
            own = model.state_dict()
            alike = own.keys() == state.keys() and all(
                getattr(own[k], "shape", None) == getattr(state[k], "shape", None)
                and getattr(own[k], "dtype", None) == getattr(state[k], "dtype", None)
                for k in own
            )
            if alike:
                model.load_state_dict(state)
        return model.to(self.device) if hasattr(model, "to") else model

    def _load(self, offer: dict) -> list:
        cached = self._input_cache.get(offer["key"])
        if cached is None:
            cached = self._input_cache[offer["key"]] = receive_inputs(self.torch, offer, self.device)
        return cached

    def _poison(self, on: bool) -> None:
        """While checking, uninitialised tensors are filled with NaN (the dtype's max for integers) so an
        unwritten output element shows. While timing, not: the fill is a kernel of its own per output
        allocation, and deterministic algorithms may be slower than the ones production runs."""
        torch = self.torch
        # torch.use_deterministic_algorithms also imports the compiler's configuration (about 900
        # modules, seconds per process); the switch it makes is this one.
        switch = getattr(torch._C, "_set_deterministic_algorithms", None)
        if switch is not None:
            switch(on, warn_only=True)
        else:
            torch.use_deterministic_algorithms(on, warn_only=True)
        torch.utils.deterministic.fill_uninitialized_memory = on

    def _outputs_like(self, request: wire.Run | wire.Time | wire.Kernels, index: int) -> None:
        specs = request.out_specs
        if specs and isinstance(self.fn, NativeEntry):
            self.fn.out_specs = specs[index % len(specs)]

    def reset(self, request: wire.Reset) -> dict:
        """Between jobs (the worker is parked for the next one): inputs and outputs held go, a
        KernelBench model is built again from its init inputs and seed (calls may have changed
        its state). The threads still running are counted: a worker whose implementation left
        one is not parked."""
        import threading

        self._input_cache.clear()
        self._batch_views = None
        if self._timer is not None:
            self._timer.forget()
        if self._build is not None:
            self.fn = None  # freed before the next job's model, the one a fresh process would build, is made
        release_memory()
        if self._build is not None:
            self.fn = self._build()
        return {"threads": threading.active_count()}

    def run(self, request: wire.Run) -> dict:
        torch = self.torch
        steps = Laps()
        input_sets = self._load(request.inputs)
        steps.mark("inputs")
        self._poison(True)
        outputs, after = [], []
        for index, args in enumerate(input_sets):
            working = tuple(x.clone() if torch.is_tensor(x) else x for x in args)
            self._outputs_like(request, index)
            outputs.append(self.fn(*working))
            if self.device.startswith("cuda"):
                torch.cuda.synchronize()
            after.append(working)
            if index == 0:
                steps.mark("first_call")
        steps.mark("calls")
        reply = deliver(torch, request.outputs, outputs, after)
        steps.mark("deliver")
        return {**reply, "steps_s": steps.seconds}

    def timed_output(self, request: wire.TimedOutput) -> dict:
        """The output of the last timed call, with the input set it was given as it is now: the
        evaluator checks both."""
        last = self.timer().last_call
        if last is None:
            return {"index": None}
        index, output = last
        input_sets = self._load(request.inputs)
        if self.device.startswith("cuda"):
            self.torch.cuda.synchronize()
        return {**deliver(self.torch, request.outputs, [output], [input_sets[index]]), "index": index}

    def run_own_inputs(self, request: wire.RunOwnInputs) -> dict:
        """For a kernel with no testcase: call it on its own get_inputs(), for a finite-only check."""
        self.torch.manual_seed(request.seed)
        self._poison(True)
        assert self.module is not None  # a Python implementation's (`correctness._unverified`)
        args = tuple(to_device(x, self.device) for x in self.module.get_inputs())
        result = self.fn(*args)
        self.torch.save({"outputs": [to_cpu(result)], "inputs_after": []}, request.outputs_file)
        return {}

    def timer(self):
        if self._timer is None:
            self._timer = timer_for(self.device)
        return self._timer

    def time(self, request: wire.Time) -> dict:
        steps = Laps()
        timer = self.timer()
        steps.mark("timer")
        input_sets = self._load(request.inputs)
        steps.mark("inputs")
        self._outputs_like(request, 0)
        self._poison(False)
        reply: dict[str, Any] = {"steps_s": steps.seconds}
        if request.first_call:
            timer.warmup(self.fn, input_sets, 0)  # one call: JIT, autotuning, lazy loading
            steps.mark("first_call")
        if request.warmup_ms:
            timer.warmup(self.fn, input_sets, request.warmup_ms)
            steps.mark("warmup")
            if request.mode:  # a graph captured here, not in the first timed request
                timer.prepare(self.fn, input_sets, request.mode)
                steps.mark("prepare")
        if request.probe:
            reply["probe_us"] = timer.probe(self.fn, input_sets)
            reply["launch_us"] = timer.launch_probe(self.fn, input_sets)
            steps.mark("probe")
        if request.budget_ms:
            reply["samples_ns"] = timer.measure(
                self.fn, input_sets, request.budget_ms, request.max_reps, request.offset, mode=request.mode
            )
            reply["info"] = timer.info
            reply["method"] = timer.describe(request.settings or wire.TimingSettings(), timer.info.get("mode"))
        if request.host_checks:  # a request of its own: its wall time is no sample's
            reply["host_wall_median_us"] = timer.host_check(self.fn, input_sets, 0, request.host_checks)
        return reply

    @property
    def views(self) -> WorkerViews:
        """The region's views (`batch_map` makes them)."""
        if self._batch_views is None:
            raise RuntimeError("batch_map must come first")
        return self._batch_views

    def batch_map(self, request: wire.BatchMap) -> dict:
        """Map the region each batch's input sets are written into (harness/batches.py)."""
        self._batch_views = WorkerViews(self.torch, request.region)
        self._batch_graphs.clear()
        self._handover_graphs.clear()
        return {"pid": os.getpid()}  # the evaluator reads this process's scheduler statistics

    def batch(self, request: wire.Batch) -> dict:
        """One call on each of the region's first `calls` input sets; the evaluator times the
        request from outside (harness/batches.py)."""
        views = self.views
        calls = request.calls
        self._poison(False)
        started = time.perf_counter_ns()
        if views.gate is not None:  # the calls run once the evaluator's gate opens (harness/batches.py)
            self.torch.cuda.current_stream().wait_event(views.gate)
        if request.graph:
            if calls:
                self._batch_graphs[calls].replay()
        elif request.own_kernel:
            # a batch of no calls that still has the GPU switch to this process and back: what
            # a batch costs besides its calls (`BatchMeasurement._calibrate`)
            views.mark.add_(1)
        else:
            with collector_paused():
                run_batch(self.torch, self.fn, views.inputs[:calls], views.outputs[:calls])
        if views.done is not None:
            # the evaluator's clock stops behind it; answering before the GPU is done lets the
            # evaluator's stream wait there, so the host's round trip stays out of the time
            views.done.record()
        # the worker's own account of where a batch's time went: a diagnostic, never a sample
        return {"loop_ns": time.perf_counter_ns() - started}

    def batch_handover(self, request: wire.BatchHandover) -> dict:
        """One call on each of the region's input sets as the evaluator releases it: on the CPU
        until it ends the batch (`run_handed_over`), on a GPU `calls` calls queued, each behind its
        release (`run_handed_over_on_gpu`), in graph mode as one replay of their graph
        (`handover_graph`). The evaluator's bound on what a batch's calls may be credited
        (`measurement.alone_bound`)."""
        views = self.views
        self._poison(False)
        with collector_paused():
            calls = request.calls
            if calls in self._handover_graphs:
                self._handover_graphs[calls].replay()
            elif views.words is not None:  # on a GPU: queued, each call behind its set's release
                run_handed_over_on_gpu(self.torch, self.fn, views.inputs, views.outputs, views.words, calls)
            else:
                run_handed_over(self.torch, self.fn, views.inputs, views.outputs, views.control)
        return {}

    def batch_unmap(self, request: wire.BatchUnmap) -> dict:
        """Let go of the region (and the graphs that read it): on a GPU the evaluator's memory."""
        self._batch_views = None
        self._batch_graphs.clear()
        self._handover_graphs.clear()
        return {}

    def batch_graph(self, request: wire.BatchGraph) -> dict:
        """Graph mode: the first `calls` calls of a batch and the copies of their outputs into
        their slots, captured once as one CUDA graph that each such batch replays. Captured on
        the region as the last batch left it: the graph reads each batch's new input sets from
        the same places."""
        torch = self.torch
        calls = request.calls
        if calls in self._batch_graphs:
            return {}
        views = self.views
        self._poison(False)
        side = torch.cuda.Stream(self.device)
        side.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(side):  # the first calls outside a capture: lazy initialisation, autotuning
            run_batch(torch, self.fn, views.inputs[:calls], views.outputs[:calls])
        torch.cuda.current_stream(self.device).wait_stream(side)
        self._batch_graphs[calls] = self._captured(
            lambda: run_batch(torch, self.fn, views.inputs[:calls], views.outputs[:calls])
        )
        return {}

    def handover_graph(self, request: wire.HandoverGraph) -> dict:
        """Graph mode: a batch of `calls` handed over one call at a time on the GPU
        (`run_handed_over_on_gpu`: each call behind its set's release, its word behind it)
        captured once as one CUDA graph that each such batch replays. A graph's kernels cost
        less than the same launched one by one (on the H200 ten small operations 8.8 µs a call
        more than one in such a graph, 18 launched alone, 11.6 in the graph of a batch): calls
        made alone then cost what the batches' calls do."""
        calls = request.calls
        if calls not in self._handover_graphs:
            views = self.views
            self._poison(False)
            self._handover_graphs[calls] = self._captured(
                lambda: run_handed_over_on_gpu(self.torch, self.fn, views.inputs, views.outputs, views.words, calls)
            )
        return {}

    def _captured(self, calls):
        """`calls()` captured as one CUDA graph, the device idle before and after."""
        torch = self.torch
        torch.cuda.synchronize(self.device)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            calls()
        torch.cuda.synchronize(self.device)
        return graph

    def triton_signatures(self, request: wire.TritonSignatures) -> dict:
        """The signatures of the Triton kernels compiled in this process (for a spare's launchers)."""
        return {"signatures": SIGNATURES.signatures}

    def kernels(self, request: wire.Kernels) -> dict:
        """Device kernels of one call, from the profiler: names and summed device time. The
        autograd profiler is torch.profiler's engine without its set-up, which imports torch's
        compiler (about 900 modules, seconds with the device held alone)."""
        from torch.autograd.profiler import profile

        torch = self.torch
        input_sets = self._load(request.inputs)
        self._outputs_like(request, 0)
        reps = request.reps
        self._poison(False)
        torch.cuda.synchronize()
        with profile(use_device="cuda", use_kineto=True, use_cpu=False) as prof:
            for k in range(reps):
                self.fn(*input_sets[k % len(input_sets)])
            torch.cuda.synchronize()
        names: dict[str, float] = {}
        for event in prof.function_events:
            if str(event.device_type).endswith("CUDA") and event.device_time_total > 0 and not event.cpu_parent:
                names[event.name] = names.get(event.name, 0.0) + event.device_time_total
        total = sum(names.values())
        return {"kernel_us": total / reps, "kernels": {n: t / reps for n, t in names.items()}}


class NativeEntry:
    """A compiled kernel behind magpie's C calling convention:

        int entry(<inputs: tensor -> pointer, int -> int64_t, float -> double>,
                  <outputs: pointer each>, <every input tensor's sizes as int64_t>, <stream>)

    Outputs are allocated here, shaped like the reference's (poisoned like any
    torch.empty), and the return value is a CUDA/HIP error code (0: success).
    """

    def __init__(self, torch, library: str, symbol: str, device: str):
        import ctypes

        self.ctypes = ctypes
        self.torch = torch
        self.device = device
        self.symbol = symbol
        self.lib = ctypes.CDLL(library)
        self.fn = getattr(self.lib, symbol)
        self.fn.restype = ctypes.c_int
        self.out_specs: list = []

    def __call__(self, *args):
        ct, torch = self.ctypes, self.torch
        if not self.out_specs:
            raise RuntimeError("no output shapes known for a native entry (declare a spec testcase)")
        outs = [torch.empty(shape, dtype=getattr(torch, dtype), device=self.device) for shape, dtype in self.out_specs]
        c_args, sizes = [], []
        for a in args:
            if torch.is_tensor(a):
                if not a.is_contiguous():
                    raise ValueError("native entries take contiguous tensors")
                c_args.append(ct.c_void_p(a.data_ptr()))
                sizes.extend(ct.c_int64(d) for d in a.shape)
            elif isinstance(a, bool):
                c_args.append(ct.c_bool(a))
            elif isinstance(a, int):
                c_args.append(ct.c_int64(a))
            else:
                c_args.append(ct.c_double(float(a)))
        c_args.extend(ct.c_void_p(o.data_ptr()) for o in outs)
        c_args.extend(sizes)
        c_args.append(ct.c_void_p(torch.cuda.current_stream().cuda_stream))
        code = self.fn(*c_args)
        if code != 0:
            raise RuntimeError(f"{self.symbol} returned error code {code}")
        return outs[0] if len(outs) == 1 else tuple(outs)


def _describe(err: BaseException) -> str:
    text = f"{type(err).__name__}: {err}".strip()
    return text.splitlines()[0][:500] if text else type(err).__name__


def make_context(torch, device: str) -> None:
    """The device's CUDA context, made (nothing on the CPU); a device named by its number is
    also the current one, for what names no device: streams, events, graphs."""
    if device.startswith("cuda:"):
        torch.cuda.set_device(torch.device(device))
    if device.startswith("cuda"):
        torch.cuda.synchronize(device)


def prepare(request: wire.Prepare) -> None:
    """A spare's start (no answer: a job that adopts it sends the load, answered once both are
    done): what a load and its first timing would make before the code, its CUDA context and
    timer, while no job waits for it, under the share of the device lock it was started
    with, which it then lets go. For Triton on a GPU, what a first call makes once per process
    or per cache (`triton_warmup`) is made meanwhile on a thread, which the load waits for: an
    edit that comes right after the verdict before found the spare still warming up, the load
    waiting up to 0.14 s on the H200 for compiles that had waited for the context."""
    global PREPARED, TIMER, WARMUP
    PREPARED = True
    if request.triton_signatures is not None:  # C and Triton compiles, on the host's CPU
        WARMUP = threading.Thread(
            target=triton_warmup.warm, args=(request.triton_signatures,), name="magpie-triton-warmup", daemon=True
        )
        WARMUP.start()
    try:
        import torch

        device = request.device
        make_context(torch, device)
        TIMER = (device, timer_for(device))  # its flush buffer allocated and filled: 0.06-0.1 s on the H200
    except Exception:  # the load makes it again, and answers for it
        traceback.print_exc()
    finally:
        if HELD_FD is not None:
            os.close(HELD_FD)


def await_warmup(laps: Laps) -> None:
    """The spare's Triton warm-up done before the code loads (Triton's compiles are not made to
    run side by side, and the warm-up's own kernel is not the code's to record)."""
    global WARMUP
    if WARMUP is not None:
        WARMUP.join()
        WARMUP = None
        laps.mark("triton_warmup_wait")


def prepared_timer(device: str):
    """The timer a spare made for this device, once (None for any other)."""
    global TIMER
    made, TIMER = TIMER, None
    return made[1] if made and made[0] == device else None


def use_caches(folders: dict[str, str]) -> None:
    """A spare's compiler caches, made its implementation's: where this process sees the
    folders by their new names (no sandbox, or one that does not cover them), it uses those;
    in a sandbox that binds them back under a covered folder, the old names still lead there."""
    for name, folder in folders.items():
        if os.path.isdir(folder):
            os.environ[name] = folder


def serve(commands, answers) -> None:
    impl = None
    for line in commands:
        reply: dict[str, Any]
        try:
            command = wire.decode(line, wire.WorkerCommand, "worker command")
            if isinstance(command, wire.Exit):
                break
            if isinstance(command, wire.Prepare):  # not answered: a job that adopts the spare sends the load
                prepare(command)
                continue
            if isinstance(command, wire.Load):
                laps = Laps()
                if command.log:  # a spare, adopted: its output goes to the adopting job's log
                    log_to(command.log)
                use_caches(command.caches)
                await_warmup(laps)
                SIGNATURES.install()  # after a spare's own warm-up compile, before the code's
                # of the project, only its implementation's declared files from now on (`harness.declared`)
                sandbox.narrow(command.readable)
                impl = Implementation(command, laps)
                reply = {"steps_s": laps.seconds, "started_unix": STARTED_UNIX, "prepared": PREPARED}
            elif isinstance(command, wire.Relog):  # adopted by a new job: what it prints goes to that job's log
                log_to(command.log)
                reply = {}
            elif impl is None:
                raise RuntimeError("load must come first")
            else:
                reply = getattr(impl, command.__struct_config__.tag)(command)
            reply["ok"] = True
        except MemoryError as err:
            reply = {"ok": False, "error": f"out of memory ({_describe(err)})"}
        except BaseException as err:  # the candidate's failure is a verdict, not ours
            message = _describe(err)
            if "can't allocate memory" in message or "out of memory" in message.lower():
                message = f"out of memory ({message})"
            reply = {"ok": False, "error": message, "traceback": traceback.format_exc()[-4000:]}
        answers.write(json.dumps(reply) + "\n")
        answers.flush()


# When this process began to serve (its sandbox entered): where a worker's load went.
STARTED_UNIX = 0.0
# A spare's share of the device lock (its third argument), closed once it has prepared.
HELD_FD: int | None = None
PREPARED = False  # a spare: told to prepare before its load
TIMER: tuple | None = None  # (device, the timer a spare made for it)
WARMUP: threading.Thread | None = None  # a spare's Triton warm-up, until the load has waited for it
SIGNATURES = triton_warmup.Recorder()  # the Triton kernels' signatures this process compiled


def main(argv: list[str]) -> int:
    global STARTED_UNIX, HELD_FD
    STARTED_UNIX = time.time()
    HELD_FD = int(argv[2]) if len(argv) > 2 else None
    return serve_pipes(argv, serve)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
