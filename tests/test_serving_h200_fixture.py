"""The reports of a real `transformers serve` run on the H200 (tests/fixtures/serving/h200/: a 0.38B random
Llama-style model in bf16, a clean measurement run and a profiled diagnostic run, 2026-11-30) still read as the
reports magpie writes today: a drift of the report format from what the GPU produced fails here, on the CPU."""

import json
from pathlib import Path

import pytest

from magpie.report.models import TracelensAnalysis
from magpie.serving.load import RunRecord, vllm_result
from magpie.serving.models import DatasetConfig, LoadConfig, ServingMetrics, Throughput
from magpie.serving.report import BenchmarkReport

H200 = Path(__file__).resolve().parent / "fixtures" / "serving" / "h200"
RUNS = ("clean", "profiled")
# The keys the issue asks of benchmark_report.json, as Magpie names them.
MAGPIE_KEYS = {
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
    "run_kind",
    "reward_eligible",
    "errors",
}
# Where the H200 run wrote its workspaces; trace_files.txt lists the profiled one's files relative to it.
RUN_ROOT = "/tmp/h200_serving/"


def load(run: str, name: str) -> dict:
    return json.loads((H200 / run / name).read_text())


@pytest.mark.parametrize("run", RUNS)
def test_report_reads_and_writes_back_unchanged(run):
    data = load(run, "benchmark_report.json")
    assert MAGPIE_KEYS <= set(data)
    report = BenchmarkReport.model_validate(data)
    # As the runner writes it: a field added, dropped or renamed anywhere in the typed report changes this.
    assert json.loads(json.dumps(report.model_dump(mode="json"), default=str)) == data
    assert load(run, "benchmark_config.json") == data["config"]


def test_clean_run_is_a_reward_eligible_measurement():
    report = BenchmarkReport.model_validate(load("clean", "benchmark_report.json"))
    config = report.config
    assert report.success and not report.errors
    assert (report.run_kind, report.reward_eligible, report.profiling_enabled) == ("measurement", True, False)
    assert report.tracelens_analysis is None and report.kernel_summary == []
    assert (report.run.completed, report.run.failed) == (config.num_prompts, 0)
    assert report.run.total_output_tokens == config.num_prompts * config.output_len
    assert report.gpu_monitor["source"] == "nvml" and report.gpu_monitor["devices"] == [0]
    assert report.provenance.gpu_allocation["mode"] == "auto"
    assert report.provenance.engine_version == "5.17.0"


def test_profiled_run_is_a_diagnostic_with_its_trace_analysis():
    data = load("profiled", "benchmark_report.json")
    report = BenchmarkReport.model_validate(data)
    config = report.config
    assert report.success and not report.errors
    assert (report.run_kind, report.reward_eligible, report.profiling_enabled) == ("diagnostic", False, True)
    assert config.profiler and report.run.completed == config.num_prompts and report.run.failed == 0
    assert len(report.gap_analysis["traces"]) == 1 and report.gap_analysis["kernels"] == 25188
    busiest = report.kernel_summary[0]  # Magpie's list, from the gap analysis's top rows
    assert busiest.name == report.gap_analysis["top"][0]["Name"] and busiest.calls == 1920
    assert busiest.time_ms == pytest.approx(13.441051) and busiest.percent == pytest.approx(19.344)
    assert report.top_bottlenecks and report.gap_analysis["top"]

    analysis = TracelensAnalysis.model_validate(report.tracelens_analysis)
    assert analysis.analysis_mode == "inference" and not analysis.errors and not analysis.warnings
    written = {line.split("\t")[1] for line in (H200 / "trace_files.txt").read_text().splitlines()}
    assert analysis.outputs and {p.removeprefix(RUN_ROOT) for p in analysis.outputs} <= written

    # transformers serve without continuous batching generates one request at a time: a prefill and
    # output_len - 1 decodes per request, found from the call tree (the trace has no step annotations).
    (stages,) = analysis.per_stage.values()
    assert set(stages) == {"prefill", "decode"}
    assert stages["prefill"].steps == config.num_prompts
    assert stages["decode"].steps == config.num_prompts * (config.output_len - 1)
    (pick,) = analysis.picks
    assert pick["method"] == "call tree" and pick["anchor"] == "aten::embedding"


@pytest.mark.parametrize("run", RUNS)
def test_bench_serve_result_is_what_the_client_writes_from_the_report(run):
    """vLLM's `--save-result` keys, rebuilt from the report's numbers by today's client, match the file (the keys the
    H200 run wrote; today's client writes more: `latencies`, `queue_times`, `rtfx`, `empty`, queue statistics), and
    the report keeps that file as Magpie's `raw_result`."""
    report = BenchmarkReport.model_validate(load(run, "benchmark_report.json"))
    result = load(run, "bench_serve_result.json")
    assert report.raw_result == result
    config = report.config
    load_config = LoadConfig(
        model=config.model,
        endpoint=config.endpoint,
        num_prompts=config.num_prompts,
        dataset=DatasetConfig(input_len=config.input_len, output_len=config.output_len),
        request_rate=config.request_rate,
        burstiness=config.burstiness,
        max_concurrency=config.concurrency,
        label=config.framework,
    )
    run_counts = report.run.model_dump(exclude={"duration_s"})
    stats = report.latency.model_dump(by_alias=False)
    thr = report.throughput
    metrics = ServingMetrics(
        duration=report.run.duration_s,
        latency=stats,
        **run_counts,
        throughput=Throughput(
            request_throughput=thr.request_throughput,
            request_goodput=thr.request_goodput,
            output_throughput=thr.output_throughput,
            total_token_throughput=thr.total_token_throughput,
            max_output_tokens_per_s=thr.max_output_tokens_per_s,
        ),
    )
    flat = {f"{stat}_{name}_ms": value for name, block in stats.items() for stat, value in block.items()}
    rebuilt = vllm_result(load_config, RunRecord([], report.run.duration_s, []), metrics, flat, date=result["date"])
    assert {key: rebuilt[key] for key in result} == result
