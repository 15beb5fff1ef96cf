"""A server someone else runs, reached at `--base-url`: nothing is started or stopped, only asked.

The request style is vLLM's (`ignore_eos`); a server that refuses it takes the client's
`force_len = "generation_config"` or no forced length (`ignore_eos` off).
"""
from __future__ import annotations

from magpie.serving.engines.base import Engine


class External(Engine):
    name = "external"
    launches = False


ENGINE = External()
