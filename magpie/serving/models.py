"""Pydantic v2 models of a load run's configuration and of its results.

`LoadConfig` is what `bench serve` takes (dataset, rate, burstiness, concurrency, warm-ups, SLOs).
`ServingMetrics` carries Magpie's report blocks, `latency{ttft,tpot,itl,e2el}` each with
mean/median/std/p50/p90/p95/p99 in milliseconds and `throughput{...}`; `vllm_result()` lays the
same numbers out under the keys of vLLM's `--save-result` JSON.
"""

from __future__ import annotations

import math
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

SLO_NAMES = ("ttft", "tpot", "e2el")
PERCENTILES = (50.0, 90.0, 95.0, 99.0)


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class DatasetConfig(_Strict):
    name: Literal["random", "sharegpt", "custom"] = "random"
    path: str | None = Field(None, description="the JSON (sharegpt) or JSONL (custom) file")
    input_len: int = Field(1024, ge=1, description="random: mean prompt length")
    output_len: int | None = Field(None, ge=1, description="fixed output length (random: its mean, 128 if unset)")
    range_ratio: float = Field(0.0, ge=0.0, lt=1.0)
    prefix_len: int = Field(0, ge=0)

    @model_validator(mode="after")
    def _path(self):
        if self.name == "random" and self.path is not None:
            raise ValueError("the random dataset takes no path")
        if self.name != "random" and self.path is None:
            raise ValueError(f"the {self.name} dataset needs a path")
        return self


class LoadConfig(_Strict):
    base_url: str = "http://127.0.0.1:8000"
    endpoint: Literal["completions", "chat"] = "completions"
    model: str
    dataset: DatasetConfig = DatasetConfig()
    num_prompts: int = Field(1000, ge=1)
    request_rate: float = Field(math.inf, gt=0, description="requests/s; inf sends all at once")
    burstiness: float = Field(1.0, gt=0, description="gamma shape of the gaps: 1 Poisson, <1 burstier, inf even")
    max_concurrency: int | None = Field(None, ge=1)
    num_warmups: int = Field(0, ge=0)
    ready_check: bool = Field(
        True, description="one request of the first prompt before the run; its failure stops the run"
    )
    seed: int = 0
    goodput: dict[Literal["ttft", "tpot", "e2el"], float] = Field({}, description="SLOs in ms")
    ignore_eos: bool | None = Field(None, description="None: on for the random dataset, as vLLM does")
    force_len: Literal["ignore_eos", "generation_config"] = Field(
        "ignore_eos", description="how a fixed output length is asked for (endpoints.FORCE_LEN)"
    )
    extra_body: dict = {}
    headers: dict[str, str] = {}
    timeout_s: float | None = Field(6 * 3600, gt=0, description="per request")
    label: str | None = None
    tokenizer_id: str | None = Field(
        None,
        description="the tokenizer lengths are counted in (a folder or cached "
        "hub id); None: words of the built-in vocabulary",
    )

    @field_validator("goodput")
    @classmethod
    def _slos(cls, value):
        for name, ms in value.items():
            if ms < 0:
                raise ValueError(f"the {name} SLO must be non-negative, got {ms}")
        return value


def parse_goodput(pairs: list[str]) -> dict[str, float]:
    """`["ttft:100", "tpot:20"]` → {"ttft": 100.0, "tpot": 20.0}, as `--goodput` takes it."""
    out = {}
    for pair in pairs:
        name, sep, value = pair.partition(":")
        if not sep or name not in SLO_NAMES:
            raise ValueError(f"goodput takes NAME:MS with NAME one of {', '.join(SLO_NAMES)}, got {pair!r}")
        try:
            out[name] = float(value)
        except ValueError:
            raise ValueError(f"goodput {pair!r}: {value!r} is not a number of milliseconds") from None
    return out


class LatencyStats(_Strict):
    mean: float
    median: float
    std: float
    p50: float
    p90: float
    p95: float
    p99: float


class Latency(_Strict):
    ttft: LatencyStats
    tpot: LatencyStats
    itl: LatencyStats
    e2el: LatencyStats


class Throughput(_Strict):
    request_throughput: float = Field(description="completed requests/s over the run's duration")
    request_goodput: float | None = Field(description="requests/s meeting every SLO; None without SLOs")
    output_throughput: float = Field(description="output tokens/s")
    total_token_throughput: float = Field(description="input + output tokens/s")
    max_output_tokens_per_s: float = Field(description="the busiest one-second bucket's output tokens")


class ServingMetrics(_Strict):
    duration: float = Field(description="seconds from the first dispatch to the last completion")
    completed: int
    failed: int
    empty: int = Field(0, description="completed requests whose stream carried no output text")
    total_input_tokens: int
    total_output_tokens: int
    max_concurrent_requests: int
    latency: Latency
    throughput: Throughput
