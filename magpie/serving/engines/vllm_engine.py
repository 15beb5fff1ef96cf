"""`vllm serve MODEL` (vLLM's OpenAI-compatible server): port 8000, `/health`, `ignore_eos` accepted.

Flags from vLLM's engine arguments: `--tensor-parallel-size`, `--dtype` (auto, bfloat16, float16,
float32), `--quantization` (fp8, ...), `--max-model-len`, `--host`, `--port`. Unverified here:
vLLM is not installed on our machines (docs/compatibility.md).
"""

from __future__ import annotations

import os
import shutil

from magpie.serving.engines.base import Engine, ServerSpec


class VLLM(Engine):
    name = "vllm"
    default_port = 8000
    package = "vllm"
    image_program = ("vllm", "serve")

    def program(self) -> list[str]:
        return [
            shutil.which("vllm", path=os.path.dirname(self.python()) + os.pathsep + os.environ.get("PATH", ""))
            or "vllm",
            "serve",
        ]

    def _flags(self, spec: ServerSpec) -> list[str]:
        flags = [
            spec.model,
            "--host",
            spec.host,
            "--port",
            str(self.port(spec)),
            "--tensor-parallel-size",
            str(spec.tp),
        ]
        flags += self.precision_flags(spec)
        if spec.max_model_len:
            flags += ["--max-model-len", str(spec.max_model_len)]
        return flags


ENGINE = VLLM()
