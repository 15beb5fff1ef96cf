"""`magpie benchmark --compare A B`: refused (exit 2, one line naming the field) unless the workloads are
equivalent; the before/after table with ratios; "within noise" for repeats whose ranges overlap; --json."""

import json

import pytest

from magpie.cli import main
from magpie.serving.compare import CompareError, WorkloadMismatch, compare, format_table
from magpie.serving.report import BenchmarkConfig

STATS = ("mean", "median", "std", "p50", "p90", "p95", "p99")


def write_report(
    path,
    *,
    rps=10.0,
    ttft=50.0,
    framework="vllm",
    engine_version="0.11.0",
    model_hash="abc",
    success=True,
    folder=False,
    **config,
):
    cfg = dict(
        framework=framework, model="/models/llama", input_len=1024, output_len=128, num_prompts=100, concurrency=16
    )
    cfg.update(config)
    lat = {
        name: {f"{s}_ms": (ttft if name == "ttft" else 10.0) * (1.5 if s == "p99" else 1.0) for s in STATS}
        for name in ("ttft", "tpot", "itl", "e2el")
    }
    report = {
        "success": success,
        "framework": framework,
        "model": cfg["model"],
        "throughput": {
            "request_throughput": rps,
            "request_goodput": None,
            "output_throughput": rps * 128,
            "total_token_throughput": rps * 1152,
            "max_output_tokens_per_s": rps * 200,
        },
        "latency": lat,
        "config": BenchmarkConfig(**cfg).model_dump(mode="json"),
        "provenance": {"engine_version": engine_version, "model_hash": model_hash},
    }
    if folder:
        path.mkdir(parents=True)
        path = path / "benchmark_report.json"
    path.write_text(json.dumps(report))
    return str(path.parent if folder else path)


def row(summary, metric):
    return next(r for r in summary["rows"] if r["metric"].startswith(metric))


def test_single_runs_table_with_ratios(tmp_path):
    a = write_report(tmp_path / "a.json", rps=10.0, ttft=50.0)
    b = write_report(tmp_path / "b", rps=12.5, ttft=40.0, engine_version="0.12.0", folder=True)
    s = compare(a, b)
    r = row(s, "request_throughput")
    assert r["before"] == 10.0 and r["after"] == 12.5 and r["ratio"] == 1.25
    assert r["verdict"] == "single run: noise unknown"
    t = row(s, "ttft p99")
    assert t["before"] == 75.0 and t["after"] == 60.0 and t["ratio"] == pytest.approx(0.8)
    assert {r["metric"].split(" (")[0] for r in s["rows"]} >= {"ttft median", "tpot p99", "itl median", "e2el p99"}
    assert s["after"][0]["engine_version"] == "0.12.0"
    text = format_table(s)
    assert "request_throughput (req/s)" in text and "1.250" in text and "vllm 0.11.0 x1" in text


@pytest.mark.parametrize(
    "change, field",
    [
        (dict(model_hash="other"), "model content"),
        (dict(input_len=2048), "input_len"),
        (dict(output_len=64), "output_len"),
        (dict(range_ratio=0.5), "dataset"),
        (dict(concurrency=32), "concurrency"),
        (dict(request_rate=4.0), "request_rate"),
        (dict(num_prompts=200), "num_prompts"),
        (dict(endpoint="chat"), "endpoint"),
    ],
)
def test_different_workloads_are_refused_naming_the_field(tmp_path, change, field):
    a = write_report(tmp_path / "a.json")
    b = write_report(tmp_path / "b.json", **change)
    with pytest.raises(WorkloadMismatch, match=f"workloads differ in {field}:"):
        compare(a, b)


def test_another_engine_on_the_same_workload_compares(tmp_path):
    a = write_report(tmp_path / "a.json", framework="vllm")
    b = write_report(tmp_path / "b.json", framework="sglang", engine_version="0.5")
    assert compare(a, b)["after"][0]["framework"] == "sglang"


def test_repeats_within_noise_and_beyond(tmp_path):
    a = ",".join(
        write_report(tmp_path / f"a{i}.json", rps=v, ttft=t)
        for i, (v, t) in enumerate([(10.0, 50.0), (10.4, 52.0), (9.8, 51.0)])
    )
    b = ",".join(
        write_report(tmp_path / f"b{i}.json", rps=v, ttft=t) for i, (v, t) in enumerate([(10.2, 40.0), (10.6, 41.0)])
    )
    s = compare(a, b)
    thr = row(s, "request_throughput")
    assert thr["verdict"] == "within noise" and thr["before_range"] == [9.8, 10.4] and len(s["before"]) == 3
    assert thr["before"] == pytest.approx(10.066666, rel=1e-5)
    assert row(s, "ttft median")["verdict"] == "better"  # lower latency, ranges apart
    worse = compare(b, a)
    assert row(worse, "ttft median")["verdict"] == "worse"


def test_a_mismatch_inside_one_side_is_named(tmp_path):
    a = ",".join([write_report(tmp_path / "a1.json"), write_report(tmp_path / "a2.json", num_prompts=50)])
    b = write_report(tmp_path / "b.json")
    with pytest.raises(WorkloadMismatch, match=r"num_prompts: 100 \(A1\) vs 50 \(A2\)"):
        compare(a, b)


def test_unreadable_or_failed_sides(tmp_path):
    with pytest.raises(CompareError, match="no such report"):
        compare(str(tmp_path / "missing"), str(tmp_path / "missing"))
    failed = write_report(tmp_path / "f.json", success=False)
    good = write_report(tmp_path / "g.json")
    with pytest.raises(CompareError, match="the run failed"):
        compare(failed, good)
    (tmp_path / "junk.json").write_text("{")
    with pytest.raises(CompareError, match="not a readable report"):
        compare(str(tmp_path / "junk.json"), good)


def test_cli_table_json_and_exit_2(tmp_path, capsys):
    a = write_report(tmp_path / "a.json")
    b = write_report(tmp_path / "b.json", rps=11.0)
    assert main(["benchmark", "--compare", a, b]) == 0
    out = capsys.readouterr().out
    assert "ratio" in out and "1.100" in out
    assert main(["benchmark", "--compare", a, b, "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["workload"]["input_len"] == 1024 and row(data, "request_throughput")["ratio"] == pytest.approx(1.1)
    c = write_report(tmp_path / "c.json", output_len=256)
    assert main(["benchmark", "--compare", a, c]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "workloads differ in output_len: 128 (A) vs 256 (B)" in err
