"""The process that runs one implementation's code, and nothing else.

It is started by the evaluator with two pipe descriptors: commands arrive on the first
as JSON lines, answers leave on the second. Its own stdout is pointed at stderr so that
what the candidate prints never mixes with the protocol. Uninitialised tensors are
filled with NaN (or the dtype's max) so an output element the kernel never wrote shows.
"""

from __future__ import annotations

import importlib.util
import json
import os
import sys
import traceback

from magpie.harness.timing import timer_for


class Implementation:
    def __init__(self, request: dict):
        import torch

        self.torch = torch
        self.device = request["device"]
        torch.set_num_threads(int(request.get("threads", 1)))
        torch.use_deterministic_algorithms(True, warn_only=True)
        torch.utils.deterministic.fill_uninitialized_memory = True
        source = request["source"]
        sys.path.insert(0, os.path.dirname(source))
        spec = importlib.util.spec_from_file_location(f"magpie_impl_{request['id']}", source)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        self.module = module
        self._input_cache: dict[str, list] = {}
        self.fn = self._entry(module, request)

    def _entry(self, module, request):
        entry = request.get("entry")
        if entry:
            if not hasattr(module, entry):
                raise LookupError(f"{request['source']} has no attribute {entry!r} (the declared entry)")
            target = getattr(module, entry)
        else:
            target = next((getattr(module, n) for n in ("ModelNew", "Model") if hasattr(module, n)), None)
            if target is None:
                raise LookupError(
                    f"{request['source']}: no entry declared and no ModelNew/Model class; set entry = \"fn\""
                )
        if isinstance(target, type):  # KernelBench convention: a module built from init inputs
            self.torch.manual_seed(int(request["seed"]))
            if request.get("init_from_module"):
                init = list(getattr(module, "get_init_inputs", list)())
            else:
                init = self._load(request["init_inputs_file"])[0] if request.get("init_inputs_file") else []
            model = target(*init)
            if hasattr(model, "to"):
                model = model.to(self.device)
            return model
        if not callable(target):
            raise TypeError(f"entry {entry!r} is not callable")
        return target

    def _load(self, path: str) -> list:
        cached = self._input_cache.get(path)
        if cached is None:
            loaded = self.torch.load(path, weights_only=True)
            cached = [tuple(_to_device(x, self.device) for x in args) for args in loaded]
            self._input_cache[path] = cached
        return cached

    def run(self, request: dict) -> dict:
        torch = self.torch
        input_sets = self._load(request["inputs_file"])
        outputs, after = [], []
        for args in input_sets:
            working = tuple(x.clone() if torch.is_tensor(x) else x for x in args)
            result = self.fn(*working)
            if self.device.startswith("cuda"):
                torch.cuda.synchronize()
            outputs.append(_to_cpu(result))
            after.append(tuple(_to_cpu(x) for x in working))
        torch.save({"outputs": outputs, "inputs_after": after}, request["outputs_file"])
        return {}

    def run_own_inputs(self, request: dict) -> dict:
        """For a kernel with no testcase: call it on its own get_inputs(), for a finite-only check."""
        self.torch.manual_seed(int(request["seed"]))
        args = tuple(_to_device(x, self.device) for x in self.module.get_inputs())
        result = self.fn(*args)
        self.torch.save({"outputs": [_to_cpu(result)], "inputs_after": []}, request["outputs_file"])
        return {}

    def time(self, request: dict) -> dict:
        timer = timer_for(self.device)
        input_sets = self._load(request["inputs_file"])
        if request.get("warmup_ms"):
            timer.warmup(self.fn, input_sets, request["warmup_ms"])
        samples = timer.measure(self.fn, input_sets, request["budget_ms"], request["max_reps"],
                                request.get("offset", 0))
        return {"samples_ns": samples}


def _to_device(x, device):
    return x.to(device) if hasattr(x, "to") and device != "cpu" else x


def _to_cpu(x):
    if hasattr(x, "detach"):
        return x.detach().to("cpu")
    if isinstance(x, (tuple, list)):
        return type(x)(_to_cpu(v) for v in x)
    return x


def _describe(err: BaseException) -> str:
    text = f"{type(err).__name__}: {err}".strip()
    return text.splitlines()[0][:500] if text else type(err).__name__


def serve(commands, answers) -> None:
    impl = None
    for line in commands:
        request = json.loads(line)
        op = request.pop("op")
        if op == "exit":
            break
        try:
            if op == "load":
                impl = Implementation(request)
                reply = {}
            elif impl is None:
                raise RuntimeError("load must come first")
            else:
                reply = getattr(impl, op)(request)
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


def main(argv: list[str]) -> int:
    command_fd, answer_fd = int(argv[0]), int(argv[1])
    os.dup2(2, 1)
    with os.fdopen(command_fd, "r") as commands, os.fdopen(answer_fd, "w") as answers:
        serve(commands, answers)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
