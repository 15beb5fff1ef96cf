"""What every part of one evaluation job shares: its request (the kernel, the implementation
and its baseline, the settings, the seeds), the device, the job's work folder, and torch and
the input exchange, both made on first use (a job that fails before it needs them imports
neither)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from magpie.harness.declared import SpecImports, library_roots
from magpie.harness.exchange import exchange_for
from magpie.harness.spec import ReferenceSpec, SpecError, derive_seed, weights_seed
from magpie.harness.wire import EvaluationRequest, Implementation, Testcase
from magpie.paths import subprocess_env


class EvaluationContext:
    def __init__(self, request: EvaluationRequest):
        self.root = Path(request.root)
        self.kernel_id = request.kernel
        self.impl = request.impl
        self.baseline = request.baseline
        self.settings = request.settings
        self.correctness_settings = self.settings.correctness
        self.timing_settings = self.settings.timing
        self.device = self.settings.project.device
        self.work = Path(request.work_dir)
        self.timeout = self.correctness_settings.timeout_s
        self.input_secret = request.input_secret
        manifest_seed = self.correctness_settings.seed
        # the manifest's seed, made unpredictable to code under test by the build's secret
        self.seed = derive_seed(manifest_seed, self.input_secret) if self.input_secret else manifest_seed
        self.hide = list(request.hide)
        self.snapshots = request.snapshots
        self.set_method = request.timing_method  # chosen by the baseline's timing
        # the baseline's shape and median in its own timing job (`judging.disturbed`), and whether
        # that job ran in this build (its worker is then parked for the candidates, or in use)
        self.baseline_own_timing: dict = request.baseline_own_timing or {}
        self.baseline_timed_in_this_build = bool(self.baseline_own_timing.get("this_build", True))
        self.init_seed = weights_seed(manifest_seed, self.kernel_id)
        self._torch: Any = None
        self._exchange: Any = None

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

    def env(self, impl: Implementation) -> dict:
        """The environment of a process that runs impl's code."""
        env = subprocess_env({**os.environ, **impl.env})
        if impl.type == "triton" and self.device == "cpu":
            env["TRITON_INTERPRET"] = "1"
        return env

    def code(self, name: str) -> bytes | None:
        """The bytes of a task input (a spec, a source) as its key was computed from them, or None
        where none were kept (read the file)."""
        kept = self.snapshots.get(name)
        return Path(kept).read_bytes() if kept else None

    def spec(self, index: int, testcase: Testcase) -> ReferenceSpec:
        spec_file = testcase.spec
        assert spec_file is not None, "a command testcase has no spec"
        # what it imports from the project, it must declare (`harness.declared`)
        imports = SpecImports(self.root, testcase, f"testcase {index} of kernel {self.kernel_id}", library_roots())
        with imports.guarding():
            return ReferenceSpec(self.root / spec_file, testcase, self.device, self.code(spec_file))

    def init_file(self, spec: ReferenceSpec) -> str | None:
        """A KernelBench model's init inputs and the reference Model's state (which the worker
        loads into ModelNew where their parameters and buffers are alike, so a ModelNew that draws
        its weights in another order holds the same ones), in a file of one name for every job:
        torch.save writes the name into the file, and the file's bytes are part of the worker's
        key (a parked worker serves the next job only if its model was built from the same)."""
        if not spec.kernelbench:
            return None
        path = self.work / "init-inputs.pt"
        try:
            model = spec.model(self.init_seed)
        except Exception as err:
            raise SpecError(f"{spec.path.name}: Model() failed: {type(err).__name__}: {err}") from None
        state = model.state_dict() if hasattr(model, "state_dict") else {}
        self.torch.save([spec.init_inputs(), dict(state)], path)
        return str(path)

    def device_index(self) -> int:
        return int(self.device.split(":")[1]) if ":" in self.device else 0
