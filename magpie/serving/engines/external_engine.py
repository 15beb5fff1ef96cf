"""A server someone else runs, reached at `--base-url`: nothing is started or stopped, only asked.

Any OpenAI-compatible server: requests carry OpenAI's standard fields alone (`model`, `prompt` or `messages`,
`max_tokens` or `max_completion_tokens`, `stream`, `stream_options`), no engine's extension such as vLLM's
`ignore_eos` (which `transformers serve` answers with 422), so output lengths are the server's, up to the asked
maximum, and the report counts the tokens it sent. To benchmark a known engine's running server with its way of
fixing the length, name that engine with `--base-url` (`magpie benchmark vllm --base-url URL`).
"""

from __future__ import annotations

from magpie.serving.engines.base import Engine


class External(Engine):
    name = "external"
    launches = False
    force_len = None


ENGINE = External()
