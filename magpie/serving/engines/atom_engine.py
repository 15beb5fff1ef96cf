"""ATOM (ROCm's inference engine): `python -m atom.entrypoints.openai_server`, port 8000, `/health`.

Flags as ATOM's launch examples give them: `--model`, `-tp`, `--host`, `--server-port`, and
`--max-model-len` (named as vLLM names it; not confirmed for ATOM). Unverified: ATOM is not installed on our machines and its flags
have changed between releases; pass anything else through `extra_args`.
"""

from __future__ import annotations

from magpie.serving.engines.base import Engine, ServerSpec, UnsupportedOption


class Atom(Engine):
    name = "atom"
    default_port = 8000
    package = "atom"
    image_program = ("python3", "-m", "atom.entrypoints.openai_server")

    def program(self) -> list[str]:
        return [self.python(), "-m", "atom.entrypoints.openai_server"]

    def _flags(self, spec: ServerSpec) -> list[str]:
        flags = ["--model", spec.model, "--host", spec.host, "--server-port", str(self.port(spec)), "-tp", str(spec.tp)]
        if self.dtype(spec) is None:
            raise UnsupportedOption(
                f"atom: precision {spec.precision!r} comes from the checkpoint; "
                "give a quantised model and precision auto"
            )
        if spec.max_model_len:
            flags += ["--max-model-len", str(spec.max_model_len)]
        return flags


ENGINE = Atom()
