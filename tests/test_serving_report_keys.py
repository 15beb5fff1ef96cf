"""benchmark_report.json and bench_serve_result.json read by their consumers' own rules (issue 40.2).

The key paths below are data, written down from the consumers' public source:
- Magpie (AMD-AGI/Magpie, `Magpie/modes/benchmark/result.py`): `BenchmarkResult.to_dict()` writes the report's
  keys; `ResultParser.parse_inferencex_result` reads a vLLM `--save-result` file into it (`completed` becomes
  `throughput.completed_requests`, `duration` `throughput.duration_seconds`, `mean_ttft_ms`
  `latency.ttft.mean_ms`, ...) and keeps the file as `raw_result`; `Magpie/mcp/server.py`
  (`list_benchmark_results`, `get_benchmark_result`) reads `success`, `model`, `execution_time`, `throughput`,
  `latency`, `top_bottlenecks[:5]`, `errors`, `kernel_summary` from benchmark_report.json.
- InferenceX (SemiAnalysisAI/InferenceX, `utils/process_result.py`): `int(max_concurrency)`, `model_id`,
  `float(total_token_throughput)`, `float(output_throughput)`, every key ending in `ms` as `float(v) / 1000`,
  every key holding `tpot` as `1000 / (float(v) + 1e-8)`.
- vLLM (vllm-project/vllm, `vllm/benchmarks/serve.py`): the keys `vllm bench serve --save-result` writes for a
  generation backend with its default `--percentile-metrics ttft,tpot,itl` and `--metric-percentiles 99`, and the
  per-request lists `--save-detailed` keeps (without it `latencies` and `queue_times` stay, the others go).
"""

import itertools
import json
import math

import pytest

from magpie.serving.load import benchmark
from magpie.serving.models import DatasetConfig, LoadConfig
from magpie.serving.report import BenchmarkConfig, BenchmarkReport
from magpie.serving.runner import CONFIG, REPORT, RESULT, run_benchmark
from magpie.serving.stub_server import Reply, ThreadedStubServer

METRICS = ("ttft", "tpot", "itl", "e2el")
MAGPIE_STATS = ("mean", "median", "p99", "std")

MAGPIE_REPORT_KEYS = (
    "success",
    "framework",
    "model",
    "throughput",
    "latency",
    "kernel_summary",
    "top_bottlenecks",
    "tracelens_analysis",
    "gap_analysis",
    "gpu_monitor",
    "workspace_dir",
    "execution_time",
    "profiling_enabled",
    "errors",
    "raw_result",
)
MAGPIE_THROUGHPUT_KEYS = (
    "request_throughput",
    "output_throughput",
    "total_token_throughput",
    "completed_requests",
    "total_input_tokens",
    "total_output_tokens",
    "duration_seconds",
)
MAGPIE_KERNEL_KEYS = ("name", "time_ms", "percent", "calls")  # each row of kernel_summary
MAGPIE_LATENCY_PATHS = tuple(("latency", m, f"{s}_ms") for m in METRICS for s in MAGPIE_STATS)
# Magpie's parse_inferencex_result: report path <- key of the vLLM result file
MAGPIE_FROM_VLLM = {
    ("throughput", "request_throughput"): "request_throughput",
    ("throughput", "output_throughput"): "output_throughput",
    ("throughput", "total_token_throughput"): "total_token_throughput",
    ("throughput", "completed_requests"): "completed",
    ("throughput", "total_input_tokens"): "total_input_tokens",
    ("throughput", "total_output_tokens"): "total_output_tokens",
    ("throughput", "duration_seconds"): "duration",
    **{("latency", m, f"{s}_ms"): f"{s}_{m}_ms" for m in METRICS for s in MAGPIE_STATS},
}

VLLM_DEFAULT_KEYS = (
    "date",
    "endpoint_type",
    "backend",
    "label",
    "model_id",
    "tokenizer_id",
    "num_prompts",
    "request_rate",
    "burstiness",
    "max_concurrency",
    "duration",
    "completed",
    "failed",
    "total_input_tokens",
    "total_output_tokens",
    "request_throughput",
    "request_goodput",
    "output_throughput",
    "total_token_throughput",
    "latencies",
    "queue_times",
    "max_output_tokens_per_s",
    "max_concurrent_requests",
    "rtfx",
    *(f"{s}_{m}_ms" for m in ("ttft", "tpot", "itl") for s in ("mean", "median", "std", "p99")),
)
VLLM_DETAILED_KEYS = ("input_lens", "output_lens", "ttfts", "itls", "start_times", "generated_texts", "errors")
# with --max-concurrency and --percentile-metrics naming them
VLLM_QUEUE_KEYS = tuple(f"{s}_client_queue_time_ms" for s in ("mean", "median", "std", "p99"))


def strict_json(text: str):
    """json.loads refusing NaN and Infinity, which are not JSON."""

    def refuse(word):
        raise ValueError(f"not JSON: {word}")

    return json.loads(text, parse_constant=refuse)


def at(data: dict, path: tuple[str, ...]):
    for key in path:
        data = data[key]
    return data


def inferencex_process(result: dict, tp: int = 1) -> dict:
    """InferenceX's utils/process_result.py on a result file, as it reads it."""
    data = {
        "conc": int(result["max_concurrency"]),
        "model": result["model_id"],
        "tput_per_gpu": float(result["total_token_throughput"]) / tp,
        "output_tput_per_gpu": float(result["output_throughput"]) / tp,
        "input_tput_per_gpu": (float(result["total_token_throughput"]) - float(result["output_throughput"])) / tp,
    }
    for key, value in result.items():
        if key.endswith("ms"):
            data[key.replace("_ms", "")] = float(value) / 1000.0
        if "tpot" in key:
            data[key.replace("_ms", "").replace("tpot", "intvty")] = 1000.0 / (float(value) + 1e-8)
    return data


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """One run against the stub server at an infinite rate (written "inf") with a concurrency limit; one request in
    six is answered with a single token, so it has no TPOT, the others four tokens with 2 ms between them."""
    out = tmp_path_factory.mktemp("keys")

    calls = itertools.count()

    def script(path, body):
        return Reply(tokens=1) if next(calls) == 3 else Reply(delays=[0.002] * 8)

    with ThreadedStubServer(script=script) as srv:
        report = run_benchmark(
            BenchmarkConfig(
                framework="vllm",
                model="tiny",
                base_url=srv.base_url,
                num_prompts=6,
                input_len=4,
                output_len=4,
                concurrency=2,
                output_dir=str(out),
            )
        )
    texts = {name: (out / name).read_text() for name in (REPORT, RESULT, CONFIG)}
    return report, texts


def test_every_file_is_strict_json_with_inf_as_vllm_writes_it(run):
    report, texts = run
    assert report.success, report.errors
    files = {name: strict_json(text) for name, text in texts.items()}
    assert files[CONFIG]["request_rate"] == "inf" and files[REPORT]["config"]["request_rate"] == "inf"
    assert files[RESULT]["request_rate"] == "inf"
    assert BenchmarkConfig.model_validate(files[CONFIG]).request_rate == math.inf


def test_the_report_has_every_key_of_magpies_benchmark_result(run):
    data = strict_json(run[1][REPORT])
    assert all(key in data for key in MAGPIE_REPORT_KEYS)
    assert all(key in data["throughput"] for key in MAGPIE_THROUGHPUT_KEYS)
    for path in MAGPIE_LATENCY_PATHS:
        assert isinstance(at(data, path), float), path
    assert data["throughput"]["completed_requests"] == 6 and data["throughput"]["duration_seconds"] > 0
    assert isinstance(data["top_bottlenecks"], list) and data["raw_result"] == strict_json(run[1][RESULT])
    assert data["kernel_summary"] == []  # Magpie's list; a run without a profile has none
    assert BenchmarkReport.model_validate(data).latency.ttft.mean == data["latency"]["ttft"]["mean_ms"]


def test_magpies_parser_on_the_result_file_gives_the_reports_figures(run):
    report, result = strict_json(run[1][REPORT]), strict_json(run[1][RESULT])
    for path, key in MAGPIE_FROM_VLLM.items():
        assert at(report, path) == pytest.approx(result[key]), (path, key)
    assert result["model_id"] == report["model"]


def test_the_result_file_has_vllms_default_keys_and_inferencex_reads_it(run):
    result = strict_json(run[1][RESULT])
    assert [key for key in VLLM_DEFAULT_KEYS if key not in result] == []
    assert not set(VLLM_DETAILED_KEYS) & set(result)
    assert all(key in result for key in VLLM_QUEUE_KEYS)
    assert len(result["latencies"]) == len(result["queue_times"]) == 6 and result["rtfx"] == 0.0
    processed = inferencex_process(result)
    assert processed["conc"] == 2 and processed["model"] == "tiny" and processed["output_tput_per_gpu"] > 0
    assert processed["p99_ttft"] == result["p99_ttft_ms"] / 1000 and processed["mean_intvty"] > 0


def test_save_detailed_keys():
    with ThreadedStubServer() as srv:
        cfg = LoadConfig(
            base_url=srv.base_url,
            model="m",
            num_prompts=3,
            max_concurrency=1,
            dataset=DatasetConfig(input_len=4, output_len=3),
        )
        _, result, _ = benchmark(cfg, detailed=True)
    assert [key for key in (*VLLM_DEFAULT_KEYS, *VLLM_DETAILED_KEYS) if key not in result] == []
    assert all(len(result[key]) == 3 for key in VLLM_DETAILED_KEYS)
    strict_json(json.dumps(result))


def test_an_empty_distribution_is_null_in_the_report_and_zero_in_vllms_file(tmp_path):
    with ThreadedStubServer(script=lambda path, body: Reply(tokens=1)) as srv:
        report = run_benchmark(
            BenchmarkConfig(
                framework="vllm",
                model="tiny",
                base_url=srv.base_url,
                num_prompts=3,
                input_len=4,
                output_len=1,
                output_dir=str(tmp_path),
            )
        )
    data, result = strict_json((tmp_path / REPORT).read_text()), strict_json((tmp_path / RESULT).read_text())
    assert report.success and data["latency"]["tpot"] == {
        f"{s}_ms": None for s in ("mean", "median", "p99", "std", "p50", "p90", "p95")
    }
    assert data["latency"]["itl"]["mean_ms"] is None and data["latency"]["ttft"]["mean_ms"] > 0
    assert result["mean_tpot_ms"] == 0.0 and result["p99_itl_ms"] == 0.0  # vLLM's numpy over [0]


def test_a_profiled_reports_kernel_summary_is_magpies_list():
    """The H200's profiled run (tests/fixtures/serving/h200/), read as Magpie reads `kernel_summary`."""
    from pathlib import Path

    data = strict_json((Path(__file__).parent / "fixtures" / "serving" / "h200" / "profiled" / REPORT).read_text())
    rows = data["kernel_summary"]
    assert rows and all(tuple(row) == MAGPIE_KERNEL_KEYS for row in rows)
    assert [row["time_ms"] for row in rows] == sorted((row["time_ms"] for row in rows), reverse=True)
    assert sum(row["percent"] for row in rows) <= 100.0 + 1e-6
