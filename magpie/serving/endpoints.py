"""Request functions per OpenAI endpoint: the body each sends and how each reads a stream chunk.

`completions` (`/v1/completions`: a choice's `text`) and `chat` (`/v1/chat/completions`: a choice's
`delta.content`, or its reasoning text). Both stream with `stream_options.include_usage` so the
final usage chunk gives `completion_tokens`. A fixed output length is asked for in one of the
`FORCE_LEN` ways: vLLM's and SGLang's `ignore_eos: true`, or, for servers that refuse fields
outside OpenAI's schema (`transformers serve`), a `generation_config` JSON string with
`min_new_tokens` = `max_new_tokens` = the length, which keeps the end-of-sequence token from
being chosen before it. Chunks are decoded with typed msgspec structs:
unknown fields are skipped without building Python objects for them.
"""

from __future__ import annotations

from typing import Any, Literal

import msgspec

FORCE_LEN = ("ignore_eos", "generation_config")
ForceLen = Literal["ignore_eos", "generation_config"]


class Usage(msgspec.Struct):
    completion_tokens: int | None = None
    prompt_tokens: int | None = None


class _Delta(msgspec.Struct):
    content: str | None = None
    reasoning_content: str | None = None
    reasoning: str | None = None


class _ChatChoice(msgspec.Struct):
    delta: _Delta | None = None


class _ChatChunk(msgspec.Struct):
    choices: list[_ChatChoice] | None = None
    usage: Usage | None = None
    error: Any = None


class _CompletionChoice(msgspec.Struct):
    text: str | None = None


class _CompletionChunk(msgspec.Struct):
    choices: list[_CompletionChoice] | None = None
    usage: Usage | None = None
    error: Any = None


def _error_text(error: Any) -> str:
    if isinstance(error, dict):
        return str(error.get("message") or error)
    return str(error)


class Endpoint:
    """What differs between endpoints: the body's prompt and length fields, the chunk type and where its text is."""

    name = ""
    path = ""
    _decoder: msgspec.json.Decoder

    def _prompt_fields(self, prompt: str, output_len: int) -> dict:
        raise NotImplementedError

    def _text(self, choice) -> str:
        raise NotImplementedError

    def body(
        self,
        *,
        model: str,
        prompt: str,
        output_len: int,
        ignore_eos: bool,
        extra_body: dict | None,
        force_len: ForceLen = "ignore_eos",
    ) -> dict:
        body = {
            "model": model,
            **self._prompt_fields(prompt, output_len),
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        if ignore_eos:
            if force_len == "generation_config":
                body["generation_config"] = msgspec.json.encode(
                    {"min_new_tokens": output_len, "max_new_tokens": output_len}
                ).decode()
            else:
                body["ignore_eos"] = True
        if extra_body:
            body.update(extra_body)
        return body

    def parse_chunk(self, payload: bytes) -> tuple[str, Usage | None, str]:
        """(output text or "", usage or None, error or "") of one `data:` payload."""
        try:
            chunk = self._decoder.decode(payload)
        except msgspec.DecodeError as exc:
            return "", None, f"undecodable stream chunk: {exc}: {payload[:200]!r}"
        if chunk.error is not None:
            return "", None, _error_text(chunk.error)
        return (self._text(chunk.choices[0]) if chunk.choices else ""), chunk.usage, ""


class Completions(Endpoint):
    name = "openai"
    path = "/v1/completions"
    _decoder = msgspec.json.Decoder(_CompletionChunk)

    def _prompt_fields(self, prompt, output_len):
        return {"prompt": prompt, "max_tokens": output_len}

    def _text(self, choice):
        return choice.text or ""


class ChatCompletions(Endpoint):
    name = "openai-chat"
    path = "/v1/chat/completions"
    _decoder = msgspec.json.Decoder(_ChatChunk)

    def _prompt_fields(self, prompt, output_len):
        return {"messages": [{"role": "user", "content": prompt}], "max_completion_tokens": output_len}

    def _text(self, choice):
        delta = choice.delta
        if delta is None:
            return ""
        return delta.content or delta.reasoning_content or delta.reasoning or ""


ENDPOINTS: dict[str, type[Endpoint]] = {"completions": Completions, "chat": ChatCompletions}


def endpoint(name: str) -> Endpoint:
    try:
        return ENDPOINTS[name]()
    except KeyError:
        raise ValueError(f"unknown endpoint {name!r}; known: {', '.join(ENDPOINTS)}") from None
