"""`transformers serve` (Hugging Face transformers >= 5): OpenAI-compatible, `/health`, port 8000.

It takes one model to preload (`FORCE_MODEL`), `--host`, `--port`, `--device`, `--dtype` and
`--quantization` (bnb-4bit / bnb-8bit); it has no tensor parallelism and no maximum model
length flag. It answers 422 to request fields outside OpenAI's schema (`ignore_eos`), so a
fixed output length is asked for with its `generation_config` request field
(min_new_tokens = max_new_tokens).
"""

from __future__ import annotations

import os
import shutil

from magpie.serving.engines.base import Engine, ServerSpec, UnsupportedOption

QUANT = {"int8": "bnb-8bit", "int4": "bnb-4bit"}


class Transformers(Engine):
    name = "transformers"
    default_port = 8000
    package = "transformers"
    force_len = "generation_config"
    image_program = ("transformers",)

    def program(self) -> list[str]:
        exe = shutil.which(
            "transformers", path=os.path.dirname(self.python()) + os.pathsep + os.environ.get("PATH", "")
        )
        return [exe] if exe else [self.python(), "-m", "transformers.cli.transformers"]

    def _flags(self, spec: ServerSpec) -> list[str]:
        if spec.tp != 1:
            raise UnsupportedOption("transformers serve has no tensor parallelism; use --tp 1")
        flags = ["serve", spec.model, "--host", spec.host, "--port", str(self.port(spec))]
        if spec.precision in QUANT:
            flags += ["--quantization", QUANT[spec.precision]]
        elif self.dtype(spec) is None:
            raise UnsupportedOption(
                f"transformers serve takes no precision {spec.precision!r} (dtypes, or int8/int4 through bitsandbytes)"
            )
        elif spec.precision != "auto":
            flags += ["--dtype", self.dtype(spec)]
        return flags

    def environment(self, spec: ServerSpec) -> dict[str, str]:
        env = {"TRANSFORMERS_NO_ADVISORY_WARNINGS": "1"}
        if os.path.isdir(spec.model):
            env["HF_HUB_OFFLINE"] = "1"  # a local folder needs no hub; never reach for one
        env.update(spec.env)
        return env


ENGINE = Transformers()
