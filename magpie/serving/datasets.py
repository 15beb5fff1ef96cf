"""What the load client asks: `random`, ShareGPT-format JSON and custom JSONL prompts.

Lengths are counted in tokens of a given tokenizer (anything with `encode(text,
add_special_tokens=False)`, `decode(ids)` and `vocab_size`, e.g. a Hugging Face tokenizer), or,
with none, in words of a built-in vocabulary: 10,000 two-syllable lowercase words ("bako",
"tesu", ...) joined by single spaces. Such a word is one to three tokens for common BPE
vocabularies, so a word count is a stable, tokenizer-free length; the server's
`usage.prompt_tokens`, when it sends one, replaces it in the results.
"""
from __future__ import annotations

import json
import math
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, Sequence

_CONSONANTS = "bdfgklmnprstvz" + "hjw" + "xyc"
_VOWELS = "aeiou"


@dataclass(frozen=True)
class SampleRequest:
    prompt: str
    prompt_len: int
    expected_output_len: int


class Tokenizer(Protocol):
    vocab_size: int

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]: ...

    def decode(self, ids: Sequence[int]) -> str: ...


def vocabulary() -> list[str]:
    """The built-in vocabulary: every consonant-vowel-consonant-vowel word over 20 consonants and 5 vowels."""
    syllables = [c + v for c in _CONSONANTS for v in _VOWELS]
    return [a + b for a in syllables for b in syllables]


def count_tokens(text: str, tokenizer: Tokenizer | None = None) -> int:
    if tokenizer is None:
        return len(text.split())
    return len(tokenizer.encode(text, add_special_tokens=False))


def length_range(length: int, range_ratio: float) -> tuple[int, int]:
    """Inclusive bounds of a length drawn around `length` with `range_ratio` in [0, 1)."""
    if not 0.0 <= range_ratio < 1.0:
        raise ValueError(f"range_ratio must be in [0, 1), got {range_ratio}")
    return max(1, math.floor(length * (1 - range_ratio))), max(1, math.ceil(length * (1 + range_ratio)))


def _words(rng: random.Random, vocab: list[str], n: int) -> str:
    return " ".join(rng.choices(vocab, k=n))


def _token_text(rng: random.Random, tokenizer: Tokenizer, n: int) -> tuple[str, int]:
    """Text of (close to) n tokens: random ids decoded, re-encoded and trimmed or topped up."""
    specials = set(getattr(tokenizer, "all_special_ids", []) or [])
    size = tokenizer.vocab_size

    def draw(k: int) -> list[int]:
        out = []
        while len(out) < k:
            i = rng.randrange(size)
            if i not in specials:
                out.append(i)
        return out

    ids = draw(n)
    text = tokenizer.decode(ids)
    for _ in range(8):
        ids = tokenizer.encode(text, add_special_tokens=False)
        if len(ids) == n:
            break
        ids = ids[:n] if len(ids) > n else ids + draw(n - len(ids))
        text = tokenizer.decode(ids)
    return text, len(tokenizer.encode(text, add_special_tokens=False))


def random_dataset(num_prompts: int, input_len: int, output_len: int, *, range_ratio: float = 0.0,
                   prefix_len: int = 0, seed: int = 0, tokenizer: Tokenizer | None = None) -> list[SampleRequest]:
    """vLLM's `random`: input and output lengths uniform over [len·(1−r), len·(1+r)], a shared prefix."""
    rng = random.Random(seed)
    in_lo, in_hi = length_range(input_len, range_ratio)
    out_lo, out_hi = length_range(output_len, range_ratio)
    vocab = vocabulary() if tokenizer is None else None
    prefix = ""
    if prefix_len:
        prefix = _words(rng, vocab, prefix_len) if vocab else _token_text(rng, tokenizer, prefix_len)[0]
    samples = []
    for _ in range(num_prompts):
        n_in = rng.randint(in_lo, in_hi)
        n_out = rng.randint(out_lo, out_hi)
        if vocab is not None:
            body, real = _words(rng, vocab, n_in), n_in
        else:
            body, real = _token_text(rng, tokenizer, n_in)
        prompt = f"{prefix} {body}" if prefix else body
        samples.append(SampleRequest(prompt, real + prefix_len, n_out))
    return samples


def _fill(samples: list[SampleRequest], num_prompts: int, what: str) -> list[SampleRequest]:
    if not samples:
        raise ValueError(f"{what}: no usable prompt")
    if len(samples) >= num_prompts:
        return samples[:num_prompts]
    return [samples[i % len(samples)] for i in range(num_prompts)]   # oversampled, in order


def sharegpt_dataset(path: str | Path, num_prompts: int, *, output_len: int | None = None, seed: int = 0,
                     tokenizer: Tokenizer | None = None) -> list[SampleRequest]:
    """ShareGPT-format JSON: a list of {"conversations": [{"from", "value"}, ...]}; the first turn is the
    prompt, the second's length the output length unless `output_len` fixes it. As vLLM filters:
    prompt and output of at least 4 tokens, prompt at most 1024 and both at most 2048."""
    data: list[dict[str, Any]] = json.loads(Path(path).read_text())
    if not isinstance(data, list):
        raise ValueError(f"{path}: a ShareGPT file is a JSON list of conversations")
    convs = [d.get("conversations") or d.get("conversation") for d in data if isinstance(d, dict)]
    convs = [c for c in convs if isinstance(c, list) and len(c) >= 2]
    random.Random(seed).shuffle(convs)
    samples = []
    for conv in convs:
        if len(samples) >= num_prompts:
            break
        prompt, completion = str(conv[0].get("value", "")), str(conv[1].get("value", ""))
        p_len = count_tokens(prompt, tokenizer)
        o_len = output_len if output_len is not None else count_tokens(completion, tokenizer)
        if p_len < 4 or (output_len is None and o_len < 4) or p_len > 1024 or p_len + o_len > 2048:
            continue
        samples.append(SampleRequest(prompt, p_len, o_len))
    return _fill(samples, num_prompts, str(path))


def custom_dataset(path: str | Path, num_prompts: int, *, output_len: int | None = None, seed: int = 0,
                   shuffle: bool = False, tokenizer: Tokenizer | None = None) -> list[SampleRequest]:
    """JSONL, one {"prompt": ..., optional "output_tokens"} per line; `output_len` overrides, else 256."""
    samples = []
    for number, line in enumerate(Path(path).read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as exc:
            raise ValueError(f"{path}:{number}: not JSON: {exc.msg}") from None
        if not isinstance(row, dict) or not isinstance(row.get("prompt"), str):
            raise ValueError(f"{path}:{number}: each line needs a string \"prompt\"")
        o_len = output_len if output_len is not None else int(row.get("output_tokens") or 256)
        samples.append(SampleRequest(row["prompt"], count_tokens(row["prompt"], tokenizer), o_len))
    if shuffle:
        random.Random(seed).shuffle(samples)
    return _fill(samples, num_prompts, str(path))
