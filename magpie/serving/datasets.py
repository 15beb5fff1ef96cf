"""What the load client asks: `random`, ShareGPT-format JSON and custom JSONL prompts.

Lengths are counted in tokens of a given tokenizer (anything with `encode(text,
add_special_tokens=False)`, `decode(ids)` and `vocab_size`, e.g. a Hugging Face tokenizer;
`load_tokenizer` gives the model's own, offline), or, with none, in words of a built-in
vocabulary: 10,000 two-syllable lowercase words ("bako", "tesu", ...) joined by single spaces.
Such a word is one to three tokens for common BPE vocabularies. The server's
`usage.prompt_tokens`, when it sends one, replaces the count in the results.

The random dataset with a tokenizer is built as vLLM's: random token ids, a shared prefix of
`prefix_len` ids before each prompt's own, decoded to text and re-encoded until the count holds (a
decoded text may re-encode to other ids); the prompt's length is its re-encoded count. Unlike vLLM,
only ids that decode to clean text and back to themselves are drawn (`_round_trip_ids`), so the
count settles.
"""

from __future__ import annotations

import functools
import json
import math
import random
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

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


@functools.lru_cache(maxsize=4)
def load_tokenizer(name: str):
    """The Hugging Face tokenizer of a model folder, or of a hub id already in the local cache: nothing is
    downloaded. Raises ValueError with one line where there is none."""
    try:
        from transformers import AutoTokenizer
    except ImportError:
        raise ValueError(
            f"tokenizer {name}: counting tokens needs transformers (pip install transformers), "
            f"or give no --tokenizer for a model without one"
        ) from None
    try:
        return AutoTokenizer.from_pretrained(name, local_files_only=True)
    except Exception as exc:  # transformers words a missing or broken tokenizer in many exception types
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ValueError(
            f"tokenizer {name}: none found in that folder or in the local Hugging Face cache "
            f"({first[:200]}); give --tokenizer a folder holding tokenizer.json"
        ) from None


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


_ROUND_TRIP: dict[int, list[int]] = {}


def _round_trip_ids(tokenizer: Tokenizer) -> list[int]:
    """The ids that decode to clean text (no replacement character) re-encoding to themselves alone, special ids
    left out: a byte-level vocabulary's lone bytes decode to invalid UTF-8 and re-encode to more tokens, so prompts
    of them never settle on a count. Worked out once per tokenizer (batched where the tokenizer batches)."""
    key = id(tokenizer)
    if key not in _ROUND_TRIP:
        specials = set(getattr(tokenizer, "all_special_ids", []) or [])
        candidates = [i for i in range(tokenizer.vocab_size) if i not in specials]
        if hasattr(tokenizer, "batch_decode"):
            texts = tokenizer.batch_decode([[i] for i in candidates])
            again = tokenizer(texts, add_special_tokens=False)["input_ids"]
        else:
            texts = [tokenizer.decode([i]) for i in candidates]
            again = [tokenizer.encode(t, add_special_tokens=False) for t in texts]
        _ROUND_TRIP[key] = [i for i, t, ids in zip(candidates, texts, again) if ids == [i] and "\ufffd" not in t]
    return _ROUND_TRIP[key]


def _token_ids(rng: random.Random, tokenizer: Tokenizer, n: int) -> list[int]:
    return rng.choices(_round_trip_ids(tokenizer), k=n)


def _token_text(rng: random.Random, tokenizer: Tokenizer, ids: list[int]) -> tuple[str, int]:
    """Text of (close to) len(ids) tokens: the ids decoded, re-encoded and trimmed or topped up until the count
    holds; the text and its re-encoded count."""
    n = len(ids)
    text = tokenizer.decode(ids)
    for _ in range(8):
        ids = tokenizer.encode(text, add_special_tokens=False)
        if len(ids) == n:
            break
        ids = ids[:n] if len(ids) > n else ids + _token_ids(rng, tokenizer, n - len(ids))
        text = tokenizer.decode(ids)
    return text, len(tokenizer.encode(text, add_special_tokens=False))


def random_dataset(
    num_prompts: int,
    input_len: int,
    output_len: int,
    *,
    range_ratio: float = 0.0,
    prefix_len: int = 0,
    seed: int = 0,
    tokenizer: Tokenizer | None = None,
) -> list[SampleRequest]:
    """vLLM's `random`: input and output lengths uniform over [len·(1−r), len·(1+r)], a shared prefix of
    `prefix_len` before each prompt's own `input_len` (tokens with a tokenizer, else words)."""
    rng = random.Random(seed)
    in_lo, in_hi = length_range(input_len, range_ratio)
    out_lo, out_hi = length_range(output_len, range_ratio)
    samples = []
    if tokenizer is None:
        vocab = vocabulary()
        prefix = _words(rng, vocab, prefix_len) + " " if prefix_len else ""
        for _ in range(num_prompts):
            n_in, n_out = rng.randint(in_lo, in_hi), rng.randint(out_lo, out_hi)
            samples.append(SampleRequest(prefix + _words(rng, vocab, n_in), prefix_len + n_in, n_out))
        return samples
    prefix_ids = _token_ids(rng, tokenizer, prefix_len)
    for _ in range(num_prompts):
        n_in, n_out = rng.randint(in_lo, in_hi), rng.randint(out_lo, out_hi)
        prompt, real = _token_text(rng, tokenizer, prefix_ids + _token_ids(rng, tokenizer, n_in))
        samples.append(SampleRequest(prompt, real, n_out))
    return samples


def _fill(samples: list[SampleRequest], num_prompts: int, what: str) -> list[SampleRequest]:
    if not samples:
        raise ValueError(f"{what}: no usable prompt")
    if len(samples) >= num_prompts:
        return samples[:num_prompts]
    return [samples[i % len(samples)] for i in range(num_prompts)]  # oversampled, in order


def sharegpt_dataset(
    path: str | Path,
    num_prompts: int,
    *,
    output_len: int | None = None,
    seed: int = 0,
    tokenizer: Tokenizer | None = None,
) -> list[SampleRequest]:
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


def custom_dataset(
    path: str | Path,
    num_prompts: int,
    *,
    output_len: int | None = None,
    seed: int = 0,
    shuffle: bool = False,
    tokenizer: Tokenizer | None = None,
) -> list[SampleRequest]:
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
            raise ValueError(f'{path}:{number}: each line needs a string "prompt"')
        o_len = output_len if output_len is not None else int(row.get("output_tokens") or 256)
        samples.append(SampleRequest(row["prompt"], count_tokens(row["prompt"], tokenizer), o_len))
    if shuffle:
        random.Random(seed).shuffle(samples)
    return _fill(samples, num_prompts, str(path))
