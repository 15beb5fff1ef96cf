"""Reference specs: where inputs come from and what the right answer is.

Two styles are accepted:
- function style: `make_inputs(shape, dtype, generator)` returns the argument tuple and
  `reference(*args)` the expected output(s); shapes and dtypes come from the manifest;
- KernelBench style: `Model`, `get_inputs()` and `get_init_inputs()`; candidates define
  `ModelNew`, built from the same init inputs under the same seed.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import inspect
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from magpie.harness.wire import Testcase


class SpecError(Exception):
    """The reference spec itself is wrong; str() says what to fix."""


@dataclass
class Case:
    label: str
    shape: list | None
    dtype: str | None
    trial: int
    seed: int
    # a shape drawn per build besides the declared ones (`harness/held_out.py`); for a KernelBench
    # problem, the values its get_inputs() reads in place of the module's size constants
    held_out: bool = False
    sizes: dict | None = None


# A build's secret, mixed into every input seed: code under test that reads magpie.toml and
# re-derives the seeds cannot compute its outputs ahead. It reaches the evaluator in its job's
# request, never a child's environment; each result records it afterwards (set the variable
# to reproduce a build's inputs: magpie.environment.INPUT_SECRET), and results are hidden from
# code under test.


def derive_seed(*parts) -> int:
    return int.from_bytes(hashlib.sha256(repr(parts).encode()).digest()[:7], "little")


def weights_seed(manifest_seed: int, kernel: str) -> int:
    """What a KernelBench model's weights are drawn with, in the worker and in the reference
    alike. It holds no build secret: code under test reads its model's weights once built
    anyway, and a worker's key holds its load request, so a worker parked by one build can
    serve the next (`harness/keys.py`)."""
    return derive_seed(manifest_seed, kernel, "init")


def rotation(case: Case, salt: str, count: int) -> list[Case]:
    """The input sets a measurement rotates through, of seeds derived from the case's and `salt`."""
    return [Case(case.label, case.shape, case.dtype, k, derive_seed(case.seed, salt, k)) for k in range(count)]


def load_module(path: Path, name: str, code: bytes | None = None):
    """A module run from its source, never from a cached .pyc (whose stamp, the source's mtime
    and size, anyone who can write the folder can match): `code`, the bytes its task was keyed
    by, where given, else the file's. Its folder goes on the module path for what it imports."""
    sys.path.insert(0, str(path.parent))
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None  # a path to a file: always a spec
    module = importlib.util.module_from_spec(spec)
    exec(compile(path.read_bytes() if code is None else code, str(path), "exec", dont_inherit=True), module.__dict__)
    return module


class ReferenceSpec:
    def __init__(self, path: Path, testcase: Testcase, device: str, code: bytes | None = None):
        import torch

        self.torch = torch
        self.path = path
        self.device = device
        try:
            self.module = load_module(path, f"magpie_spec_{path.stem}", code)
        except Exception as err:
            raise SpecError(f"{path.name}: importing failed: {type(err).__name__}: {err}") from None
        self.kernelbench = hasattr(self.module, "Model") and hasattr(self.module, "get_inputs")
        if not self.kernelbench:
            for attr in (testcase.inputs, testcase.reference):
                if not callable(getattr(self.module, attr, None)):
                    raise SpecError(f"{path.name}: defines no callable {attr!r} (needed by the testcase)")
        self.testcase = testcase
        self._factory = self.module.get_inputs if self.kernelbench else getattr(self.module, testcase.inputs)
        # asked once: every timed call draws an input set, and a signature costs more than a small one
        self._takes_generator = not self.kernelbench and _takes_generator(self._factory)

    def cases(self, base_seed: int, kernel_id: str, index: int, trials: int, salt: str = "") -> list[Case]:
        tc = self.testcase
        shapes: list = [None] if self.kernelbench else tc.shapes
        dtypes: list = [None] if self.kernelbench else tc.dtypes
        out = []
        for shape in shapes:
            for dtype in dtypes:
                for trial in range(trials):
                    seed = derive_seed(base_seed, kernel_id, index, shape, dtype, trial, salt)
                    label = "kernelbench" if self.kernelbench else f"{list(shape)} {dtype}"
                    out.append(Case(label, shape, dtype, trial, seed))
        return out

    def init_inputs(self) -> list:
        if not self.kernelbench or not hasattr(self.module, "get_init_inputs"):
            return []
        return list(self.module.get_init_inputs())

    def make_inputs(self, case: Case, checked: bool = True) -> tuple:
        """The argument tuple of one case, made on the project's device: factories that name no
        device make their tensors there, and a `generator` parameter gets one on that device.
        `checked`: refuse an input of zeros (a spec's mistake); the sets a timing draws by the
        thousand, from a factory the correctness cases have checked, skip it (on a GPU it
        waits for the device once a set)."""
        torch = self.torch
        # torch.manual_seed's seeding of the CPU's and the GPUs' generators, without its stack
        # walk where CUDA is not initialised (0.1 ms; every timed call draws a set) and its
        # other device kinds'
        torch.default_generator.manual_seed(case.seed)
        if self.device != "cpu":
            torch.cuda.manual_seed_all(case.seed)
        factory = self._factory
        try:
            # the CPU is the default device already: its context would only sit in every call
            with contextlib.nullcontext() if self.device == "cpu" else torch.device(self.device):
                if self.kernelbench:
                    with self._sizes(case.sizes):
                        args = tuple(factory())
                else:
                    kwargs = (
                        {"generator": torch.Generator(device=self.device).manual_seed(case.seed)}
                        if self._takes_generator
                        else {}
                    )
                    assert case.shape is not None and case.dtype is not None  # a function-style spec's case
                    args = factory(tuple(case.shape), getattr(torch, case.dtype), **kwargs)
                    if not isinstance(args, (tuple, list)):
                        args = (args,)
            args = tuple(to_device(a, self.device) for a in args)
        except Exception as err:
            raise SpecError(
                f"{self.path.name}: {factory.__name__}() failed for {case.label}: {type(err).__name__}: "
                f"{str(err).splitlines()[0] if str(err) else ''} (inputs are made on {self.device}, "
                "with the generator passed on that device)"
            ) from None
        for i, arg in enumerate(args if checked else ()):
            if torch.is_tensor(arg) and arg.numel() > 0 and arg.is_floating_point() and not arg.any():
                raise SpecError(
                    f"{self.path.name}: input {i} for {case.label} is all zeros; "
                    "magpie checks and times only on random data"
                )
        return args

    def reference(self, args: tuple, init_seed: int):
        """The expected output(s), computed on the project's device from pristine copies."""
        torch = self.torch
        pristine = tuple(a.clone() if torch.is_tensor(a) else a for a in args)
        name = "Model" if self.kernelbench else self.testcase.reference
        try:
            if self.kernelbench:
                model = self.model(init_seed)
                if hasattr(model, "to"):
                    model = model.to(self.device)
                result = model(*pristine)
            else:
                result = getattr(self.module, name)(*pristine)
            return to_device(result, self.device)
        except Exception as err:
            raise SpecError(
                f"{self.path.name}: {name}() failed: {type(err).__name__}: "
                f"{str(err).splitlines()[0] if str(err) else ''}"
            ) from None

    def model(self, init_seed: int):
        """A KernelBench problem's Model, built on the CPU under the weights' seed: its state is what
        the worker loads into ModelNew (`context.init_file`), so both hold the same weights."""
        self.torch.manual_seed(init_seed)
        return self.module.Model(*self.init_inputs())

    @contextlib.contextmanager
    def _sizes(self, sizes: dict | None):
        """The problem module's size constants set to a held-out case's values while its inputs are
        made, then put back."""
        if not sizes:
            yield
            return
        kept = {name: getattr(self.module, name) for name in sizes}
        vars(self.module).update(sizes)
        try:
            yield
        finally:
            vars(self.module).update(kept)

    def min_bytes(self, args: tuple, expected) -> int:
        """Fewest bytes a kernel must move: each input read once, each output written once, unless the
        spec says otherwise with min_bytes(*args)."""
        custom = getattr(self.module, "min_bytes", None)
        if callable(custom):
            return int(custom(*args))
        from magpie.harness.checks import as_tuple

        tensors = [a for a in (*args, *as_tuple(expected)) if self.torch.is_tensor(a)]
        return sum(t.numel() * t.element_size() for t in tensors)


def _takes_generator(factory) -> bool:
    """Whether an inputs factory has a `generator` parameter (one without a signature, a
    builtin say, is called without it)."""
    try:
        return "generator" in inspect.signature(factory).parameters
    except (TypeError, ValueError):
        return False


def to_device(x, device: str):
    if hasattr(x, "detach"):
        return x.detach().to(device)
    if isinstance(x, (tuple, list)):
        return type(x)(to_device(v, device) for v in x)
    return x


def to_cpu(x):
    return to_device(x, "cpu")


def output_specs(expected) -> list:
    """[shape, dtype name] of each expected output: what a native entry must allocate."""
    from magpie.harness.checks import as_tuple

    return [[list(t.shape), str(t.dtype).replace("torch.", "")] for t in as_tuple(expected)]
