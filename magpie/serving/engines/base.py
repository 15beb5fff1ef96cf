"""The engine interface and the server spec every engine reads."""

from __future__ import annotations

import shlex
import sys
from importlib import metadata
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

# Precision names as Magpie's configs give them, and the dtype word most engines take for each.
DTYPES = {
    "auto": "auto",
    "bf16": "bfloat16",
    "bfloat16": "bfloat16",
    "fp16": "float16",
    "float16": "float16",
    "half": "float16",
    "fp32": "float32",
    "float32": "float32",
    "float": "float32",
}
# Precisions that are a quantisation of the weights rather than a compute dtype.
QUANTIZED = ("fp8", "fp4", "mxfp4", "int8", "int4", "awq", "gptq")


class UnsupportedOption(ValueError):
    """An option the engine has no flag for."""


class ServerSpec(BaseModel):
    """What a server is started with. `extra_args` are appended as they are (a string is split as a shell would)."""

    model_config = ConfigDict(extra="forbid")

    model: str
    host: str = "127.0.0.1"
    port: int | None = Field(None, ge=1, le=65535, description="None: the engine's default port")
    tp: int = Field(1, ge=1, description="tensor-parallel size")
    precision: str = Field("auto", description="auto, bf16, fp16, fp32, or a quantisation (fp8, ...)")
    max_model_len: int | None = Field(None, ge=1)
    extra_args: list[str] = []
    env: dict[str, str] = {}

    @field_validator("extra_args", mode="before")
    @classmethod
    def _split(cls, value):
        return shlex.split(value) if isinstance(value, str) else value

    @field_validator("precision")
    @classmethod
    def _precision(cls, value):
        value = value.lower()
        if value not in DTYPES and value not in QUANTIZED:
            raise ValueError(f"unknown precision {value!r}; known: {', '.join(list(DTYPES) + list(QUANTIZED))}")
        return value


class Engine:
    """One serving engine. Subclasses set the class attributes and `_flags`."""

    name: str = ""
    default_port: int = 8000
    health_path: str = "/health"
    package: str | None = None  # the distribution whose version is the engine's version
    # how the load client fixes a request's output length (endpoints.FORCE_LEN); None: it has no way, and requests
    # carry OpenAI's standard fields alone (the server decides the length, up to max_tokens)
    force_len: Literal["ignore_eos", "generation_config"] | None = "ignore_eos"
    launches: bool = True  # False: client only (external)
    image_program: tuple[str, ...] = ()  # the server's program inside the engine's docker image (on its PATH)

    def port(self, spec: ServerSpec) -> int:
        return spec.port or self.default_port

    def base_url(self, spec: ServerSpec) -> str:
        host = spec.host if spec.host not in ("0.0.0.0", "::") else "127.0.0.1"
        return f"http://{host}:{self.port(spec)}"

    def program(self) -> list[str]:
        raise NotImplementedError

    def _flags(self, spec: ServerSpec) -> list[str]:
        raise NotImplementedError

    def command(self, spec: ServerSpec, in_image: bool = False) -> list[str]:
        """The server's whole command line, here or (`in_image`) inside the engine's docker image."""
        if not self.launches:
            raise UnsupportedOption(f"the {self.name} engine starts no server; give --base-url")
        program = list(self.image_program) if in_image else self.program()
        return program + self._flags(spec) + list(spec.extra_args)

    def environment(self, spec: ServerSpec) -> dict[str, str]:
        """Variables set for the server on top of the caller's environment."""
        return dict(spec.env)

    def version(self) -> str | None:
        """The installed engine's version, None where it is not installed here."""
        if self.package is None:
            return None
        try:
            return metadata.version(self.package)
        except metadata.PackageNotFoundError:
            return None

    @staticmethod
    def python() -> str:
        return sys.executable

    def precision_flags(
        self, spec: ServerSpec, dtype_flag: str = "--dtype", quant_flag: str = "--quantization"
    ) -> list[str]:
        """`--dtype WORD` for a compute dtype other than auto, `--quantization NAME` for a quantisation."""
        dtype = self.dtype(spec)
        if dtype is None:
            return [quant_flag, spec.precision]
        return [dtype_flag, dtype] if dtype != "auto" else []

    @staticmethod
    def dtype(spec: ServerSpec) -> str | None:
        """The compute dtype word of the spec's precision; None for a quantisation."""
        return DTYPES.get(spec.precision)
