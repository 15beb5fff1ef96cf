"""The HTML report, checked in a real headless Chromium; the Markdown summary beside it."""

import os
import shutil
import subprocess
from html.parser import HTMLParser

import pytest
from conftest import SPIN_SOURCE, build_json, magpie, relu2_project

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    root = tmp_path_factory.mktemp("report")
    (root / "slow.py").write_text(
        SPIN_SOURCE + "\n\ndef kernel(x):\n    spin(0.0004)\n    return torch.relu(x) * 2.0\n"
    )
    relu2_project(root, ["slow", "nan"], shapes="[[16, 64]]")
    build_json(root)
    return root


class Rows(HTMLParser):
    def __init__(self):
        super().__init__()
        self.rows, self.svgs, self.excluded = [], 0, 0
        self._in_list = False

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if tag == "tr" and "data-impl" in attrs:
            self.rows.append(attrs["data-impl"])
        if tag == "svg":
            self.svgs += 1
        if tag == "ul" and attrs.get("class") == "excluded":
            self._in_list = True
        if tag == "li" and self._in_list:
            self.excluded += 1


@pytest.mark.browser
def test_report_renders_in_headless_chromium(built, tmp_path):
    if CHROMIUM is None:
        if os.environ.get("CI"):
            pytest.fail("chromium is not installed; .ci/run installs it")
        pytest.skip("chromium not installed (apt-get install chromium)")
    report = built / "workspaces/reports/report.html"
    flags = [
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        f"--user-data-dir={tmp_path / 'profile'}",
    ]
    dom = subprocess.run(
        [CHROMIUM, *flags, "--dump-dom", report.as_uri()], capture_output=True, text=True, timeout=120
    ).stdout
    parsed = Rows()
    parsed.feed(dom)
    assert parsed.rows == ["good", "nan", "slow"]
    assert parsed.svgs == 2 and parsed.excluded == 1
    assert "slower" in dom and "incorrect: finite" in dom and "device held alone" in dom
    shot = tmp_path / "report.png"
    subprocess.run(
        [CHROMIUM, *flags, f"--screenshot={shot}", "--window-size=1200,900", report.as_uri()],
        capture_output=True,
        timeout=120,
    )
    assert shot.stat().st_size > 20_000  # a rendered page, not a blank one


def test_markdown_summary_and_rerender_only_on_change(built):
    summary = (built / "workspaces/reports/summary.md").read_text()
    assert "| implementation | compile | correctness |" in summary
    assert "**nan**: correctness FAILED" in summary
    assert "device held alone" in summary and "first calls in new workers" in summary
    assert build_json(built)["executed"] == []
    (built / "slow.py").write_text((built / "slow.py").read_text().replace("0.0004", "0.0006"))
    executed = build_json(built)["executed"]
    assert "report" in executed and "correctness:relu2/good" not in executed


def test_report_key_covers_its_templates(built):
    plan = magpie("build", "--dry-run", cwd=built, check=0)
    assert "0 to run" in plan.stdout
    from magpie.project import Project

    project = Project.load(built / "magpie.toml")
    inputs = project.tasks["report"].parts["inputs"]
    assert {"magpie-templates/report.html.j2", "magpie-templates/summary.md.j2"} <= set(inputs)


@pytest.mark.browser
def test_trace_report_renders_in_headless_chromium(tmp_path):
    if CHROMIUM is None:
        if os.environ.get("CI"):
            pytest.fail("chromium is not installed; .ci/run installs it")
        pytest.skip("chromium not installed (apt-get install chromium)")
    from conftest import FIXTURES

    traces = FIXTURES / "traces" / "h200"
    magpie(
        "benchmark",
        "--trace-dir",
        traces,
        "--analysis-mode",
        "inference",
        "-o",
        tmp_path / "out",
        cwd=tmp_path,
        check=0,
    )
    count = len(list(traces.glob("*.json.gz")))
    page = tmp_path / "out" / "trace_report.html"
    flags = [
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        f"--user-data-dir={tmp_path / 'profile'}",
    ]
    dom = subprocess.run(
        [CHROMIUM, *flags, "--dump-dom", page.as_uri()], capture_output=True, text=True, timeout=120
    ).stdout
    assert dom.count('<section class="trace"') == count
    assert dom.count('aria-label="gpu timeline"') == count and 'aria-label="roofline"' in dom
    # the serving, graph-replay, decode and unannotated captures, and the Triton capture's
    # repeated iterations (one token count throughout: taken as decode, with a warning)
    assert dom.count('<table class="stages">') == 5
    assert "prefilldecode" in dom and "the first and the last left out" in dom
    assert "aten::mm" in dom and "<td>triton</td>" in dom and "multi_tensor_apply" in dom


def test_reports_are_checked_against_their_models():
    """The H200 compare report (written before the models existed) matches CompareReport; a
    row that loses a Magpie key, or a speedup verdict outside the known ones, does not."""
    import copy
    import json

    from conftest import FIXTURES
    from pydantic import ValidationError

    from magpie.report.models import CompareReport

    report = json.loads((FIXTURES / "h200" / "compare_report_softmax.json").read_text())
    CompareReport.model_validate(report)
    broken = copy.deepcopy(report)
    del broken["results"][0]["correctness_state"]
    with pytest.raises(ValidationError, match="correctness_state"):
        CompareReport.model_validate(broken)
    broken = copy.deepcopy(report)
    broken["results"][1]["speedup"]["verdict"] = "probably faster"
    with pytest.raises(ValidationError, match="verdict"):
        CompareReport.model_validate(broken)


def test_templates_compiled_once_render_the_same_report(tmp_path, monkeypatch):
    """The report's templates are compiled into magpie's cache folder once and loaded from it
    after; the pages are the same, and where that folder cannot be made they are compiled
    where they are used."""
    import json
    import re

    from conftest import FIXTURES

    from magpie.report.render import render

    comparison = json.loads((FIXTURES / "h200" / "compare_report_softmax.json").read_text())
    comparison["results"][0]["implementation"] = "a<b>&c"  # escaped in the page, not in the Markdown

    def pages():
        rendered = render([comparison], "softmax")
        return {name: re.sub(r"\d{4}-\d\d-\d\d \d\d:\d\d UTC", "", text) for name, text in rendered.items()}

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    first = pages()
    compiled = sorted(p.parent.name for p in (tmp_path / "cache/magpie/templates").rglob("*.cache"))
    assert compiled and {name.rsplit("-", 1)[1] for name in compiled} == {"html", "markdown"}
    assert pages() == first
    assert "a<b>&c" in first["summary.md"] and "a&lt;b&gt;&amp;c" in first["report.html"]
    (tmp_path / "a-file").write_text("")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "a-file"))
    assert pages() == first
