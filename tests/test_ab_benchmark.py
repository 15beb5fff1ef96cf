"""The A/B that proves a kernel inside the workload (issue 43, point 5), end to end on the CPU: the tiny offline model
under a real `transformers serve`, an RMSNorm kernel whose implementations are put in place of
LlamaRMSNorm.forward. One build makes both A/Bs: a correct candidate (installed, ABABAB against two servers, the
gate passing, the numbers with their intervals, "within noise" allowed) and one overfit to its declared rank (its
correctness check passes, the gate refuses it). The numbers on two loaded cores are noise: the mechanism and the
evidence are what is asserted."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from html.parser import HTMLParser

import pytest
from conftest import magpie
from loop_fixtures import FIXTURES, TARGET, loop_project

from magpie.project import Project

# One build of the kernel and two A/Bs (four server starts) in the module's fixture: about 4 minutes on two busy
# cores, over the suite's 300 s per test, which counts a fixture's setup.
pytestmark = pytest.mark.timeout(900)


@pytest.fixture(scope="module")
def ab_build(tmp_path_factory, tiny_model):
    root = loop_project(
        tmp_path_factory.mktemp("ab") / "proj",
        tiny_model,
        {"good": '{ rmsnorm = "fused" }', "overfit": '{ rmsnorm = "rank2_only" }'},
    )
    proc = magpie("build", "benchmark_ab:good", "benchmark_ab:overfit", cwd=root, check=None)
    project = Project.load(root / "magpie.toml")
    results, reports = {}, {}
    for name in ("benchmark_ab:good", "benchmark_ab:overfit", "correctness:rmsnorm/rank2_only"):
        artifact = project.store.path(project.tasks[name].key)
        results[name] = json.loads((artifact / "result.json").read_text())
        if name.startswith("benchmark_ab:"):
            reports[name.split(":")[1]] = (artifact, json.loads((artifact / "ab_report.json").read_text()))
    return root, proc, results, reports


def test_a_correct_candidate_is_put_in_and_measured_against_the_workload_without_it(ab_build):
    root, proc, results, reports = ab_build
    assert proc.returncode == 0, proc.stderr
    artifact, report = reports["good"]
    assert report["order"] == ["A", "B"] * 3 and report["pairs"] == 3
    # the kernel went in: which, from where, judged how, and the server's processes that installed and ran it
    (put_in,) = report["replacements"]
    assert put_in["kernel"] == "rmsnorm" and put_in["implementation"] == "fused" and put_in["target"] == TARGET
    assert put_in["source_digest"] == __import__("hashlib").sha256((root / "fused.py").read_bytes()).hexdigest()
    assert put_in["correctness_state"] == "SUCCESS" and put_in["called_pids"]
    # only the B runs were served with it; each run's own report says so
    for run in report["runs"]:
        provenance = json.loads((artifact / run / "benchmark_report.json").read_text())["provenance"]
        assert bool(provenance["replacements"]) == run.endswith("_B"), run
    # every figure with its paired interval and a verdict; within noise is an honest answer here
    for name in ("output_throughput", "request_throughput", "ttft_median_ms", "tpot_median_ms", "e2el_median_ms"):
        metric = report["metrics"][name]
        assert len(metric["a"]) == len(metric["b"]) == 3
        assert metric["ci_low"] <= metric["ratio"] <= metric["ci_high"], name
        assert metric["verdict"] in ("better", "worse", "within noise"), name
    gate = report["gate"]
    assert gate["passed"] and gate["matched"] == gate["prompts"] == 4 and gate["reference_repeatable"]
    assert report["claim"] in ("win", "within noise", "regression")
    # Amdahl: the comparison's paired micro-benchmark speedup beside it; no profiled run, so no share
    amdahl = report["amdahl"]["rmsnorm"]
    assert amdahl["kernel_speedup"] == put_in["speedup"]["value"]
    assert amdahl["predicted_speedup"] is None and amdahl["reason"].startswith("no trace")
    assert results["benchmark_ab:good"]["claim"] == report["claim"]


def test_a_candidate_right_only_on_its_declared_rank_is_refused_by_the_gate(ab_build):
    _, _, results, reports = ab_build
    assert results["correctness:rmsnorm/rank2_only"]["correctness_state"] == "SUCCESS"
    _, report = reports["overfit"]
    gate = report["gate"]
    assert gate["reference_repeatable"] and not gate["passed"]
    assert gate["mismatches"] and gate["matched"] < gate["prompts"]
    assert report["claim"].startswith("refused: the output-equivalence gate failed"), report["claim"]


def test_an_edited_candidate_re_keys_the_ab_and_not_the_workload_alone(ab_build):
    root = ab_build[0]

    def keys() -> dict[str, str]:
        return {name: spec.key for name, spec in Project.load(root / "magpie.toml").tasks.items()}

    before = keys()
    (root / "fused.py").write_text((root / "fused.py").read_text() + "\n# edited\n")
    try:
        after = keys()
        plan = magpie("build", "--dry-run", cwd=root, check=0).stdout
    finally:
        (root / "fused.py").write_text((FIXTURES / "fused.py").read_text())
    assert "would run  benchmark_ab:good" in plan and "would run  benchmark_ab:overfit" in plan, plan
    assert "timing:rmsnorm/fused" in plan and "timing:rmsnorm/torch" not in plan, plan
    # the benchmark without replacement has no `use` in its key: editing a candidate re-keys no run of it
    assert after["benchmark:good"] == before["benchmark:good"]
    assert after["benchmark_ab:good"] != before["benchmark_ab:good"]


class ABSections(HTMLParser):
    """Per A/B section of a rendered report: its metric rows and its evidence items (class present/missing)."""

    def __init__(self):
        super().__init__()
        self.sections: dict[str, dict] = {}
        self._current = None

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if tag == "section" and attrs.get("class") == "benchmark-ab":
            self._current = self.sections.setdefault(attrs["id"], {"metrics": [], "evidence": []})
        elif self._current is not None and tag == "tr" and "data-metric" in attrs:
            self._current["metrics"].append(attrs["data-metric"])
        elif self._current is not None and tag == "li" and attrs.get("class") in ("present", "missing"):
            self._current["evidence"].append(attrs["class"])

    def handle_endtag(self, tag):
        if tag == "section":
            self._current = None


@pytest.mark.browser
def test_the_html_report_shows_each_ab_with_its_interval_amdahl_gate_and_evidence(ab_build, tmp_path):
    from magpie.report.render import render

    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        if os.environ.get("CI"):
            pytest.fail("chromium is not installed; .ci/run installs it")
        pytest.skip("chromium not installed (apt-get install chromium)")
    root, _, _, reports = ab_build
    # the build's report reads every A/B of the project
    project = Project.load(root / "magpie.toml")
    assert {"benchmark_ab:good", "benchmark_ab:overfit"} <= set(project.tasks["report"].deps)
    good, overfit = reports["good"][1], reports["overfit"][1]
    page = tmp_path / "report.html"
    page.write_text(render([], "loop", ab_tests=[good, overfit])["report.html"])
    flags = ["--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", f"--user-data-dir={tmp_path / 'p'}"]
    dom = subprocess.run(
        [chromium, *flags, "--dump-dom", page.as_uri()], capture_output=True, text=True, timeout=120
    ).stdout
    parsed = ABSections()
    parsed.feed(dom)
    assert set(parsed.sections) == {"ab-good", "ab-overfit"}, dom[-2000:]
    for section in parsed.sections.values():
        assert section["metrics"] == list(good["metrics"])
    # correctness and micro-benchmark of the kernel put in, the E2E A/B, the gate: the last missing where it failed
    assert parsed.sections["ab-good"]["evidence"] == ["present"] * 4
    assert parsed.sections["ab-overfit"]["evidence"][-1] == "missing"
    metric = good["metrics"]["output_throughput"]
    assert f"[{metric['ci_low']:.3f}, {metric['ci_high']:.3f}]" in dom
    assert good["claim"] in dom and "output-equivalence gate: FAILED" in dom
    assert "Amdahl for rmsnorm" in dom and "no trace" in dom


def test_amdahl_takes_the_kernels_share_from_the_profiled_runs_top_kernels_or_says_there_is_none():
    from magpie.serving.ab import amdahl, kernel_share
    from magpie.serving.replacement import Replacement

    put_in = Replacement(
        kernel="rmsnorm",
        implementation="fused",
        chosen_by="best",
        target=TARGET,
        function="forward",
        source_name="fused.py",
        source_digest="0" * 64,
        correctness_state="SUCCESS",
        speedup={"value": 2.0},
    )
    trace = {
        "top_bottlenecks": [
            {"Name": "void rms_norm_kernel<float>", "CPU Op": "_C::rms_norm", "% Total": 10.0},
            {"Name": "ampere_sgemm_128x64_tn", "CPU Op": "aten::mm", "% Total": 60.0},
            {"Name": "triton_poi_fused_0", "CPU Op": "LlamaRMSNorm", "% Total": 10.0},
        ]
    }
    share, _ = kernel_share(trace, "rms_norm", TARGET)
    assert share == pytest.approx(0.2)
    prediction = amdahl(put_in, share, "")
    assert prediction.predicted_speedup == pytest.approx(1 / (0.8 + 0.2 / 2.0))
    unfused = {"top_bottlenecks": [{"Name": "vectorized_elementwise_kernel", "CPU Op": "aten::mul", "% Total": 5.0}]}
    assert kernel_share(unfused, "rmsnorm", TARGET)[0] is None
    share, reason = kernel_share(None, "rmsnorm", TARGET)
    missing = amdahl(put_in, share, reason)
    assert missing.predicted_speedup is None and missing.reason.startswith("no trace")
