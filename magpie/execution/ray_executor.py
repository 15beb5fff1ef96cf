"""The Ray executor (`magpie build --executor ray [--ray-address auto|ray://...]`): each job one
Ray task, placed by Ray on the resources it asks for.

The driver (the `magpie build` process) keeps what decides and stores: doit, staleness, the
store's writes; a worker gets a pickled `Job` and returns its `JobOutput` pickled, the same
shape the local executors hand back. A job runs in the worker exactly as in a local pool
process (`run_job`): code under test in the same sandboxed evaluator subprocesses.

Resources (`job_options`): a measurement on a GPU (timing, profile) asks for one whole GPU,
so Ray never puts another job on it; a check on a GPU a share of one (checks share a device,
never with a measurement); everything else no GPU. Every task has `max_retries=0`: a job that
judges code and crashes its worker is that verdict's failure, never run again. Inside the
worker a GPU job sees every GPU of its node in PCI order and is told the one Ray gave it
(`cuda:N`), so its device locks (`device_lock`) are named for the physical GPU like a local
build's and two workers' locks on different GPUs never collide.

`ray` is imported only here, and this module only when `--executor ray` is asked for.
"""

from __future__ import annotations

import logging
import os
import pickle
import signal
import threading
from concurrent.futures import CancelledError, Future

from magpie.errors import UserError
from magpie.execution.devices import CPU, MEASURING_RULES, SHARING_RULES, Device, device_of, placed_on
from magpie.execution.job import Job

# A check's share of a GPU: up to this many checks on one GPU at once (none beside a measurement).
CHECK_GPU_SHARE = 0.25


def job_options(spec) -> dict:
    """The Ray task options of a job: its GPUs by what it does, and no retries."""
    device = device_of(spec) or "cpu"
    gpus = 0.0
    if device.startswith("cuda"):
        if spec.rule in MEASURING_RULES:
            gpus = 1.0
        elif spec.rule in SHARING_RULES:
            gpus = CHECK_GPU_SHARE
    return {"num_gpus": gpus, "num_cpus": 1, "max_retries": 0, "retry_exceptions": False}


def run_on_worker(payload: bytes, environment: dict[str, str], gpu_ids: list[str] | None = None) -> bytes:
    """A job in a Ray worker: the driver's environment taken for its length, on the GPU Ray
    gave it where it asked for one; its JobOutput pickled. Interrupted, it kills the
    processes it started before it ends. `gpu_ids`: Ray's, given by the test of this
    function alone (ray.get_gpu_ids() otherwise)."""
    from magpie.execution.executors import stop_descendants
    from magpie.execution.job import run_job

    job: Job = pickle.loads(payload)
    saved = dict(os.environ)
    os.environ.update(environment)
    device = CPU
    try:
        if gpu_ids is None:
            import ray

            gpu_ids = [str(i) for i in ray.get_gpu_ids()]
        if gpu_ids and (device_of(job.spec) or "cpu").startswith("cuda"):
            device = _node_gpu(int(float(gpu_ids[0])))
            job = Job(placed_on(job.spec, device), job.dep_results, job.dep_dirs, job.input_secret)
        output = run_job(job)
    except BaseException:
        stop_descendants(os.getpid())
        raise
    finally:
        os.environ.clear()
        os.environ.update(saved)
    if job.spec.rule in MEASURING_RULES | SHARING_RULES:
        output.result["device"] = device.record()
    return pickle.dumps(output)


def _node_gpu(index: int) -> Device:
    """The node's GPU of Ray's id `index`, every GPU of the node visible in PCI order (as nvidia-smi numbers them)."""
    from magpie.execution.devices import visible_gpus

    os.environ.pop("CUDA_VISIBLE_DEVICES", None)
    os.environ["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"
    for gpu in visible_gpus():
        if gpu.index == index:
            return gpu
    return Device(index, "unknown GPU")


def _handlers() -> dict:
    if threading.current_thread() is not threading.main_thread():
        return {}
    return {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT)}


def _restore(handlers: dict) -> None:
    for sig, handler in handlers.items():
        if handler is not None:
            signal.signal(sig, handler)


class RayExecutor:
    """Jobs as Ray tasks. Without an address, Ray is started here, embedded (and stopped at
    shutdown); `auto` or `ray://host:port` joins a running cluster (its authentication as Ray
    is configured: RAY_AUTH_MODE and its token, docs/architecture/build.md)."""

    def __init__(self, workers: int, address: str | None = None):
        import ray

        self.workers = workers
        self._ray = ray
        self._started_here = not ray.is_initialized()
        if self._started_here:
            # ray.init installs handlers of its own for SIGTERM and SIGINT (logging a stack and ending
            # the process): the build's are put back, so that SIGTERM stops it as it stops any build
            handlers = _handlers()
            try:
                ray.init(address=address, include_dashboard=False, logging_level=logging.ERROR, log_to_driver=False)
            except (ConnectionError, ValueError, RuntimeError) as err:
                where = address or "a local Ray"
                raise UserError(f"--executor ray: could not start or join {where}: {err}") from None
            finally:
                _restore(handlers)
        # The embedded Ray's workers are this machine's: they take the build's whole environment,
        # as a local pool's processes do; a cluster's nodes keep theirs but for magpie's own.
        self._whole_environment = address is None
        self._remote = ray.remote(run_on_worker)
        self._running: dict[object, Future] = {}
        self._cancelled: set[object] = set()

    def _environment(self) -> dict[str, str]:
        if self._whole_environment:
            return dict(os.environ)
        return {name: value for name, value in os.environ.items() if name.startswith("MAGPIE_")}

    def submit(self, job: Job) -> Future:
        ref = self._remote.options(**job_options(job.spec)).remote(pickle.dumps(job), self._environment())
        outer: Future = Future()
        self._running[ref] = outer

        def finish(done: Future) -> None:
            self._running.pop(ref, None)
            if ref in self._cancelled:  # what a killed job returned (Ray may end its processes first) is no verdict
                outer.set_exception(CancelledError(f"{job.spec.name}: cancelled"))
                return
            try:
                outer.set_result(pickle.loads(done.result()))
            except BaseException as err:
                outer.set_exception(err)

        ref.future().add_done_callback(finish)
        return outer

    def cancel(self) -> None:
        """Every job still running killed (`force`: Ray ends the task's processes and its worker
        at once); its future raises CancelledError, whatever the job had returned."""
        for ref in list(self._running):
            self._cancelled.add(ref)
            self._ray.cancel(ref, force=True)

    def shutdown(self) -> None:
        self.cancel()
        if self._started_here:
            self._ray.shutdown()
