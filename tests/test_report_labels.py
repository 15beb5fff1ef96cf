"""What a reader of the reports could not tell apart (issue 37.9): roofline labels drawn over one
another, a % that did not say of what, and trace-table rows that repeat a kernel name with
nothing to tell them apart."""

import os
import re
import shutil
import subprocess
from html.parser import HTMLParser

import pytest
from conftest import FIXTURES

from magpie.report.plots import roofline_chart

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")

# Text boxes as the browser lays them out, pairs of them that overlap, and the points' tooltips.
MEASURE = """<script>
window.onload = () => {
  const boxes = [...document.querySelectorAll("svg.roofline text")].map(t => [t.textContent, t.getBBox()]);
  const overlapping = [];
  boxes.forEach(([a, p], i) => boxes.slice(i + 1).forEach(([b, q]) => {
    if (p.x < q.x + q.width && q.x < p.x + p.width && p.y < q.y + q.height && q.y < p.y + p.height)
      overlapping.push(a + " / " + b);
  }));
  const out = document.createElement("pre");
  out.id = "measured";
  out.textContent = JSON.stringify({overlapping, tooltips: [...document.querySelectorAll("svg.roofline title")].length});
  document.body.appendChild(out);
};
</script>"""


def crowded_points(n: int) -> list[tuple[str, dict]]:
    """n ops close together on an H200's roofline, as a decode step's small GEMMs and elementwise ops sit."""
    points = []
    for i in range(n):
        intensity, tflops = 3.0 + 0.2 * i, 1.5 + 0.1 * (i % 3)
        points.append(
            (
                f"aten::linear_projection_{i}",
                {
                    "arithmetic_intensity": intensity,
                    "achieved_tflops": tflops,
                    "peak_tflops": 989.4,
                    "peak_tbps": 4.8,
                    "precision": "bf16_tensor",
                    "arch": "H200",
                    "peaks_measured": False,
                    "bound": "memory",
                    "pct_of_roofline": 100 * tflops / (intensity * 4.8),
                    "shapes": f"[[4, {512 * (i + 1)}], [512, 512]]",
                },
            )
        )
    return points


def in_chromium(html: str, tmp_path) -> str:
    if CHROMIUM is None:
        if os.environ.get("CI"):
            pytest.fail("chromium is not installed; .ci/run installs it")
        pytest.skip("chromium not installed (apt-get install chromium)")
    page = tmp_path / "page.html"
    page.write_text(f"<!doctype html><html><body>{html}{MEASURE}</body></html>")
    flags = [
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        f"--user-data-dir={tmp_path / 'profile'}",
    ]
    return subprocess.run(
        [CHROMIUM, *flags, "--dump-dom", page.as_uri()], capture_output=True, text=True, timeout=120
    ).stdout


@pytest.mark.browser
def test_roofline_labels_do_not_overlap_and_every_point_has_its_figures(tmp_path):
    import json

    points = crowded_points(10)
    chart = roofline_chart(points)
    dom = in_chromium(chart, tmp_path)
    measured = json.loads(re.search(r'<pre id="measured">(.*?)</pre>', dom, re.S).group(1))
    assert measured["overlapping"] == []
    assert len(re.findall(r"linear_projection_\d+ \d+%</text>", chart)) >= 3  # names kept where there is room
    assert measured["tooltips"] == len(points)
    # every point listed with what its % means: its share of the roof at its intensity
    assert "% beside a point: its achieved TFLOP/s as a share of the roof at its arithmetic intensity" in chart
    for name, r in points:
        assert f"{name} {r['shapes']}: {r['pct_of_roofline']:.0f}% of the roof at its intensity" in chart


def test_a_point_below_five_decades_of_the_peak_is_still_inside_the_plot():
    points = crowded_points(1) + [
        ("aten::rsqrt", {**crowded_points(1)[0][1], "achieved_tflops": 4e-6, "arithmetic_intensity": 0.125})
    ]
    chart = roofline_chart(points)
    ys = [float(y) for y in re.findall(r'<circle cx="[\d.]+" cy="(-?[\d.]+)"', chart)]
    assert len(ys) == 2 and all(10 <= y <= 300 - 30 for y in ys)


class KernelRows(HTMLParser):
    """The cells of the trace page's table of top kernels."""

    def __init__(self):
        super().__init__()
        self.header, self.rows, self._table, self._cell = [], [], False, None

    def handle_starttag(self, tag, attrs):
        if tag == "table" and ("class", "kernels") in attrs:
            self._table = True
        elif self._table and tag == "tr":
            self.rows.append([])
        elif self._table and tag in ("td", "th"):
            self._cell = ""

    def handle_endtag(self, tag):
        if tag == "table":
            self._table = False
        elif self._table and tag in ("td", "th") and self._cell is not None:
            self.rows[-1].append(self._cell.strip())
            self._cell = None

    def handle_data(self, data):
        if self._cell is not None:
            self._cell += data


def test_trace_table_rows_that_share_a_kernel_name_are_told_apart(tmp_path):
    from magpie.traces.report import analyze_traces

    analyze_traces(FIXTURES / "traces" / "h200", tmp_path, top_k=20, analysis_mode="inference")
    table = KernelRows()
    table.feed((tmp_path / "trace_report.html").read_text())
    header, *rows = table.rows
    assert header == [
        "rank",
        "kernel",
        "category",
        "CPU op",
        "input shapes",
        "calls",
        "total µs",
        "%",
        "trace",
        "source",
    ]
    names = [row[1] for row in rows]
    assert len(set(names)) < len(names)  # the case: one kernel name heads several rows
    told_apart = [(row[0], row[1], row[3], row[4]) for row in rows]
    assert len(set(told_apart)) == len(rows)
    assert all(re.fullmatch(r"\S+\.json\.gz", row[8]) for row in rows)  # its trace's file beside its rank
