"""`python -m sglang.launch_server`: port 30000, `/health`, `ignore_eos` accepted.

Flags from SGLang's server arguments: `--model-path`, `--tp-size`, `--dtype`, `--quantization`,
`--context-length`, `--host`, `--port`. Unverified here: SGLang is not installed on our machines.
"""

from __future__ import annotations

from magpie.serving.engines.base import Engine, ServerSpec


class SGLang(Engine):
    name = "sglang"
    default_port = 30000
    package = "sglang"
    image_program = ("python3", "-m", "sglang.launch_server")

    def program(self) -> list[str]:
        return [self.python(), "-m", "sglang.launch_server"]

    def _flags(self, spec: ServerSpec) -> list[str]:
        flags = [
            "--model-path",
            spec.model,
            "--host",
            spec.host,
            "--port",
            str(self.port(spec)),
            "--tp-size",
            str(spec.tp),
        ]
        flags += self.precision_flags(spec)
        if spec.max_model_len:
            flags += ["--context-length", str(spec.max_model_len)]
        return flags


ENGINE = SGLang()
