"""A sweep's pages: the Pareto plot (inline SVG, no plotting library) and the HTML table around it.

The plot puts each point at its median interactivity (x, `median_intvty`: tokens/s a user sees, 1000 / TPOT) and
median output throughput per GPU (y, `output_tput_per_gpu`), with its repeats' 95% intervals as whiskers on both
axes; the frontier's points are filled and joined, the others hollow. Each point's figures are its tooltip.
"""

from __future__ import annotations

import math
from html import escape
from pathlib import Path

WIDTH, HEIGHT = 640, 420
LEFT, RIGHT, TOP, BOTTOM = 70, 20, 20, 50


def _ticks(hi: float) -> list[float]:
    """Five round ticks from 0 to just over `hi`."""
    if hi <= 0:
        return [0.0, 1.0]
    raw = hi / 4
    magnitude = 10 ** math.floor(math.log10(raw))
    step = next(m * magnitude for m in (1, 2, 2.5, 5, 10, 20) if m * magnitude >= raw)
    return [step * i for i in range(5) if step * (i - 1) < hi]


def pareto_svg(report) -> str:
    """The sweep's Pareto plot; empty where no point has both figures."""
    x_key, y_key = report.pareto_x, report.pareto_y
    frontier = set(report.pareto_frontier)
    placed = [
        p
        for p in report.points
        if p.success and p.inferencemax.get(x_key) is not None and p.inferencemax.get(y_key) is not None
    ]
    if not placed:
        return ""

    def whisker(p, key) -> tuple[float, float]:
        iv = p.intervals.get(key)
        value = p.inferencemax[key]
        if iv is None or iv.low is None or iv.high is None:
            return value, value
        return max(iv.low, 0.0), iv.high

    x_ticks = _ticks(max(max(whisker(p, x_key)[1], p.inferencemax[x_key]) for p in placed))
    y_ticks = _ticks(max(max(whisker(p, y_key)[1], p.inferencemax[y_key]) for p in placed))
    x_hi, y_hi = x_ticks[-1], y_ticks[-1]

    def sx(v: float) -> float:
        return LEFT + (WIDTH - LEFT - RIGHT) * v / x_hi

    def sy(v: float) -> float:
        return HEIGHT - BOTTOM - (HEIGHT - TOP - BOTTOM) * v / y_hi

    out = [
        f'<svg class="plot" role="img" aria-label="Pareto: output throughput per GPU against interactivity" '
        f'width="{WIDTH}" height="{HEIGHT}" xmlns="http://www.w3.org/2000/svg">'
    ]
    for t in x_ticks:
        out.append(
            f'<line x1="{sx(t):.1f}" y1="{TOP}" x2="{sx(t):.1f}" y2="{HEIGHT - BOTTOM}" stroke="#ddd"/>'
            f'<text x="{sx(t):.1f}" y="{HEIGHT - BOTTOM + 14}" font-size="10" text-anchor="middle">{t:g}</text>'
        )
    for t in y_ticks:
        out.append(
            f'<line x1="{LEFT}" y1="{sy(t):.1f}" x2="{WIDTH - RIGHT}" y2="{sy(t):.1f}" stroke="#ddd"/>'
            f'<text x="{LEFT - 6}" y="{sy(t) + 3:.1f}" font-size="10" text-anchor="end">{t:g}</text>'
        )
    out.append(
        f'<text x="{(LEFT + WIDTH - RIGHT) / 2:.0f}" y="{HEIGHT - 12}" font-size="12" text-anchor="middle">'
        f"interactivity ({escape(x_key)}): tokens/s per user = 1000 / TPOT ms</text>"
        f'<text x="14" y="{(TOP + HEIGHT - BOTTOM) / 2:.0f}" font-size="12" text-anchor="middle" '
        f'transform="rotate(-90 14 {(TOP + HEIGHT - BOTTOM) / 2:.0f})">'
        f"output tokens/s per GPU ({escape(y_key)})</text>"
    )
    line = sorted((p.inferencemax[x_key], p.inferencemax[y_key]) for p in placed if p.label in frontier)
    if len(line) > 1:
        path = " ".join(f"{sx(x):.1f},{sy(y):.1f}" for x, y in line)
        out.append(f'<polyline class="frontier" points="{path}" fill="none" stroke="#c60" stroke-width="2"/>')
    for p in placed:
        x, y = p.inferencemax[x_key], p.inferencemax[y_key]
        (x_lo, x_hi_), (y_lo, y_hi_) = whisker(p, x_key), whisker(p, y_key)
        on = p.label in frontier
        tip = (
            f"{p.label}: {y:.4g} output tok/s/GPU [{y_lo:.4g}, {y_hi_:.4g}], {x:.4g} tok/s/user "
            f"[{x_lo:.4g}, {x_hi_:.4g}] over {len(p.repeats)} repeats{'; on the Pareto frontier' if on else ''}"
        )
        out.append(
            f'<g class="point{" pareto" if on else ""}"><title>{escape(tip)}</title>'
            f'<line x1="{sx(x_lo):.1f}" y1="{sy(y):.1f}" x2="{sx(x_hi_):.1f}" y2="{sy(y):.1f}" stroke="#456"/>'
            f'<line x1="{sx(x):.1f}" y1="{sy(y_lo):.1f}" x2="{sx(x):.1f}" y2="{sy(y_hi_):.1f}" stroke="#456"/>'
            f'<circle cx="{sx(x):.1f}" cy="{sy(y):.1f}" r="4.5" stroke="#c60" stroke-width="1.5" '
            f'fill="{"#c60" if on else "#fff"}"/>'
            f'<text x="{sx(x) + 7:.1f}" y="{sy(y) - 6:.1f}" font-size="10">{escape(p.label)}</text></g>'
        )
    out.append("</svg>")
    return "".join(out)


# The table's columns: (InferenceMAX key, heading, scale to the unit shown)
COLUMNS = (
    ("tput_per_gpu", "total tok/s/GPU", 1.0),
    ("output_tput_per_gpu", "output tok/s/GPU", 1.0),
    ("median_intvty", "interactivity tok/s/user (median)", 1.0),
    ("request_throughput", "req/s", 1.0),
    ("median_ttft", "TTFT median ms", 1000.0),
    ("p99_ttft", "TTFT p99 ms", 1000.0),
    ("median_tpot", "TPOT median ms", 1000.0),
    ("p99_tpot", "TPOT p99 ms", 1000.0),
    ("p99_itl", "ITL p99 ms", 1000.0),
    ("median_e2el", "E2E median ms", 1000.0),
    ("p99_e2el", "E2E p99 ms", 1000.0),
)


def cell(point, key: str, scale: float) -> str:
    """`median [low, high]` of one figure, in the column's unit; an em dash where there is none."""
    value = point.inferencemax.get(key)
    if value is None:
        return "—"
    iv = point.intervals.get(key)
    spread = f" [{iv.low * scale:.4g}, {iv.high * scale:.4g}]" if iv and iv.low is not None else ""
    return f"{value * scale:.4g}{spread}"


def table_rows(report) -> list[dict]:
    return [
        {
            "label": p.label,
            "success": p.success,
            "pareto": p.label in report.pareto_frontier,
            "repeats": sum(1 for r in p.repeats if r.success),
            "cells": [cell(p, key, scale) for key, _, scale in COLUMNS],
            "errors": p.errors,
        }
        for p in report.points
    ]


def markdown_table(report) -> str:
    """The sweep's table as Markdown (what `magpie benchmark --sweep` prints)."""
    head = ["point", "Pareto", "repeats"] + [h for _, h, _ in COLUMNS]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for row in table_rows(report):
        mark = "yes" if row["pareto"] else ("failed" if not row["success"] else "")
        lines.append("| " + " | ".join([row["label"], mark, str(row["repeats"])] + row["cells"]) + " |")
    return "\n".join(lines)


def write_pages(report, work: Path) -> None:
    """`sweep_pareto.svg` and `sweep_report.html` (templates/serving_sweep.html.j2) into `work`."""
    from jinja2 import Environment, FileSystemLoader

    from magpie.paths import templates_dir
    from magpie.serving.sweep import PARETO_SVG, SWEEP_HTML

    svg = pareto_svg(report)
    (work / PARETO_SVG).write_text(svg + "\n")
    env = Environment(loader=FileSystemLoader(str(templates_dir())), autoescape=True, trim_blocks=True)
    page = env.get_template("serving_sweep.html.j2").render(
        report=report, rows=table_rows(report), headings=[h for _, h, _ in COLUMNS], svg=svg
    )
    (work / SWEEP_HTML).write_text(page)
