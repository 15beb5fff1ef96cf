"""Serving engines behind one small interface: how to start one, where it listens, how to ask it.

An `Engine` turns a `ServerSpec` (model, host, port, tensor parallelism, precision, maximum model
length, extra arguments, environment) into the command line and environment of its server,
names its health route and its default port, says how the load client forces a fixed output
length on it, and reports its installed version. One module per engine: `transformers`
(`transformers serve`), `vllm` (`vllm serve`), `sglang` (`python -m sglang.launch_server`),
`atom` (`python -m atom.entrypoints.openai_server`) and `external` (a server someone else runs:
client only, `--base-url`). The command lines follow each engine's documented flags; only
`transformers serve` is run by the tests (docs/compatibility.md).
"""

from __future__ import annotations

import importlib

from magpie.serving.engines.base import Engine, ServerSpec, UnsupportedOption

NAMES = ("transformers", "vllm", "sglang", "atom", "external")


def get(name: str) -> Engine:
    """The engine called `name`."""
    if name not in NAMES:
        raise ValueError(f"unknown engine {name!r}; known: {', '.join(NAMES)}")
    module = importlib.import_module(f"magpie.serving.engines.{name}_engine")
    return module.ENGINE


__all__ = ["Engine", "NAMES", "ServerSpec", "UnsupportedOption", "get"]
