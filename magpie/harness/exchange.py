"""How inputs reach a worker and what it produced comes back.

On a CUDA device the evaluator makes inputs and references on the device and lends the
worker its tensors through CUDA IPC: a handle of a few hundred bytes in the request instead
of hundreds of megabytes written, read and uploaded. The worker copies what it is lent into
memory of its own before any candidate code sees it, and writes outputs and its inputs
after the call into buffers the evaluator allocated. Handles only ever travel from the
evaluator to the worker: the evaluator never unpickles what a worker sends, so candidate
code cannot run in the judge's process.

On the CPU, and for results that do not fit the buffers (a wrong count, shape or dtype is
a verdict the checks must see as it is), both travel as torch files in the scratch folder.

The request carries `inputs` ({"key", "file" or "ipc"}) and `outputs` ({"file", and "ipc"
where buffers were lent}).
"""

from __future__ import annotations

import base64
import io
import os
import pickle
from pathlib import Path

from magpie import environment
from magpie.harness.checks import as_tuple, check_output_forms
from magpie.harness.spec import to_device as _to
from magpie.supervision import scratch, shared_memory
from magpie.supervision.session import WorkerFailure


def dumps_shared(value) -> str:
    from multiprocessing.reduction import ForkingPickler

    import torch.multiprocessing  # noqa: F401  (registers the reducers that share CUDA tensors)

    payload = base64.b64encode(bytes(ForkingPickler.dumps(value))).decode()
    shared_memory.made()  # the files a sandboxed worker opens to map it: linked into its /dev/shm
    return payload


# Where CUDA IPC is not available (processes in different containers, say), inputs and
# outputs travel as files with environment.CUDA_IPC set to 0.


class LentMemoryError(RuntimeError):
    """The worker could not map what the evaluator lent: a property of the system, not of the
    implementation; str() says what to do."""


class _OnTheOneGpu(pickle.Unpickler):
    """Rebuilds what was lent on device 0, whatever index the lender gave its device: a worker
    whose sandbox opens one GPU's node sees that GPU alone, as device 0, where the evaluator
    may know it as another."""

    def find_class(self, module: str, name: str):
        found = super().find_class(module, name)
        at = {"rebuild_cuda_tensor": 6, "rebuild_event": 0}.get(name)
        if module != "torch.multiprocessing.reductions" or at is None:
            return found

        def on_device_zero(*args):
            return found(*args[:at], 0, *args[at + 1 :])

        return on_device_zero


def loads_shared(payload: str):
    """What the evaluator lent (`dumps_shared`), mapped into this process; where it sees one
    GPU, on that one."""
    import torch

    try:
        data = base64.b64decode(payload)
        if torch.cuda.device_count() == 1:
            return _OnTheOneGpu(io.BytesIO(data)).load()
        return pickle.loads(data)
    except RuntimeError as err:
        raise LentMemoryError(
            f"could not map memory lent through CUDA IPC ({str(err).splitlines()[0]}); "
            f"set {environment.CUDA_IPC}=0 to pass inputs and outputs as files"
        ) from None


# -- the evaluator's side ----------------------------------------------------------------
def load_left(torch, path: str) -> dict:
    """What a worker wrote into its scratch folder (`scratch.open_left`: not through a link):
    {"outputs": [...], "inputs_after": [...]}. A file that is not its own, or not that, is the
    worker's failure: the candidate's module can replace what writes it (torch.save)."""
    name = Path(path).name
    try:
        fd = scratch.open_left(Path(path))
    except OSError as err:
        raise WorkerFailure(
            f"error: its output file {name} is not a regular file of its own ({err.strerror})"
        ) from None
    with os.fdopen(fd, "rb") as handle:
        try:
            produced = torch.load(handle, weights_only=True)
        except Exception as err:  # noqa: BLE001 - whatever the file holds, it is the worker's
            raise WorkerFailure(
                f"error: its output file {name} holds no tensors magpie can read ({type(err).__name__})"
            ) from None
    if not (
        isinstance(produced, dict)
        and set(produced) == {"outputs", "inputs_after"}
        and all(isinstance(v, list) for v in produced.values())
    ):
        raise WorkerFailure(f"error: its output file {name} holds something other than its outputs")
    return produced


class FileExchange:
    def __init__(self, torch, device: str):
        self.torch = torch
        self.device = device

    def offer_inputs(self, tag: str, input_sets: list, folder: Path) -> dict:
        """Inputs for the worker whose scratch folder is `folder` (each worker reads, and can
        touch, only its own copy)."""
        path = folder / f"{tag}-inputs.pt"
        with os.fdopen(scratch.create(path), "wb") as out:
            self.torch.save([tuple(_to(x, "cpu") for x in args) for args in input_sets], out)
        return {"key": tag, "file": str(path)}

    def offer_outputs(self, tag: str, expected: list | None, input_sets: list, folder: Path) -> dict:
        return {"file": str(folder / f"{tag}-outputs.pt")}

    def collect(self, offer: dict, answer: dict) -> dict:
        """{"outputs": [...], "inputs_after": [...]}, one entry per input set, on the device."""
        produced = load_left(self.torch, offer["file"])
        return {key: [_to(v, self.device) for v in values] for key, values in produced.items()}

    def release(self) -> None:
        """Nothing is held between requests."""


class CudaIpcExchange(FileExchange):
    def __init__(self, torch, device: str):
        super().__init__(torch, device)
        self._lent: list[tuple] = []  # (pool, what was made in it), kept until released: a worker may be mapping it
        self._buffers: dict[str, tuple[list, list, list[bool]]] = {}

    def _in_own_memory(self, make):
        """What make() allocates comes from a memory pool of its own. CUDA IPC lends the whole
        allocator segment a tensor lies in, not the tensor alone: one shared with the references
        or another worker's inputs would be the borrowing worker's to write."""
        pool = self.torch.cuda.MemPool()
        with self.torch.cuda.use_mem_pool(pool):
            made = make()
        self._lent.append((pool, made))
        return made

    def offer_inputs(self, tag: str, input_sets: list, folder: Path) -> dict:
        # Each offer lends copies: what one worker does to lent memory reaches no other worker,
        # and not the evaluator's originals, which the checks compare against.
        copies = self._in_own_memory(
            lambda: [tuple(x.clone() if self.torch.is_tensor(x) else x for x in args) for args in input_sets]
        )
        return {"key": tag, "ipc": dumps_shared(copies)}

    def offer_outputs(self, tag: str, expected: list | None, input_sets: list, folder: Path) -> dict:
        offer = super().offer_outputs(tag, expected, input_sets, folder)
        if expected is None:
            return offer
        torch = self.torch
        if not all(torch.is_tensor(e) for exp in expected for e in as_tuple(exp)):
            return offer
        outputs, after = self._in_own_memory(
            lambda: (
                [
                    tuple(
                        torch.full_like(e, float("nan")) if e.is_floating_point() else torch.empty_like(e)
                        for e in as_tuple(exp)
                    )
                    for exp in expected
                ],
                [tuple(torch.empty_like(x) if torch.is_tensor(x) else x for x in args) for args in input_sets],
            )
        )
        self._buffers[tag] = (outputs, after, [isinstance(exp, (tuple, list)) for exp in expected])
        return {**offer, "ipc": dumps_shared({"outputs": outputs, "inputs_after": after}), "tag": tag}

    def collect(self, offer: dict, answer: dict) -> dict:
        if answer.get("outputs_in_file") or "ipc" not in offer:
            return super().collect(offer, answer)
        outputs, after, as_tuples = self._buffers[offer["tag"]]
        return {"outputs": [out if many else out[0] for out, many in zip(outputs, as_tuples)], "inputs_after": after}

    def release(self) -> None:
        """Drop what was lent so far: workers have taken their copies and written their outputs."""
        self._buffers.clear()
        while self._lent:
            pool, made = self._lent.pop()
            del made  # before its pool
            del pool


def exchange_for(torch, device: str) -> FileExchange:
    """Memory is lent only where it can be lent alone (torch's private memory pools)."""
    lend = (
        device.startswith("cuda")
        and os.environ.get(environment.CUDA_IPC, "1") != "0"
        and hasattr(torch.cuda, "MemPool")
    )
    return (CudaIpcExchange if lend else FileExchange)(torch, device)


# -- the worker's side -------------------------------------------------------------------
def receive_inputs(torch, offer: dict, device: str) -> list[tuple]:
    if "ipc" in offer:
        lent = loads_shared(offer["ipc"])
        own = [tuple(x.clone() if torch.is_tensor(x) else x for x in args) for args in lent]
        del lent  # unmapped once collected: the candidate never sees the evaluator's memory
        return own
    return [tuple(_to(x, device) for x in args) for args in torch.load(offer["file"], weights_only=True)]


def deliver(torch, offer: dict, outputs: list, inputs_after: list) -> dict:
    """Put what the calls produced where the evaluator reads it; the reply's fields."""
    check_output_forms(torch, outputs, inputs_after)
    if "ipc" in offer:
        buffers = loads_shared(offer["ipc"])
        if _fits(torch, outputs, buffers["outputs"]) and _fits(torch, inputs_after, buffers["inputs_after"]):
            for produced, lent in ((outputs, buffers["outputs"]), (inputs_after, buffers["inputs_after"])):
                for values, targets in zip(produced, lent):
                    for value, target in zip(as_tuple(values), targets):
                        if torch.is_tensor(target):
                            target.copy_(value)
            torch.cuda.synchronize()
            del buffers
            return {"outputs_in_file": False}
    torch.save(
        {"outputs": [_to(v, "cpu") for v in outputs], "inputs_after": [_to(v, "cpu") for v in inputs_after]},
        offer["file"],
    )
    return {"outputs_in_file": True}


def _fits(torch, produced: list, buffers: list) -> bool:
    if len(produced) != len(buffers):
        return False
    for values, targets in zip(produced, buffers):
        values = as_tuple(values)
        if len(values) != len(targets):
            return False
        for value, target in zip(values, targets):
            if not torch.is_tensor(target):
                continue
            if not (torch.is_tensor(value) and value.shape == target.shape and value.dtype == target.dtype):
                return False
    return True
