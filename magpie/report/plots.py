"""Small inline SVG plots for the HTML report (no plotting library needed)."""

from __future__ import annotations

from html import escape

ROW = 26
LEFT = 170
WIDTH = 640
RIGHT = 70


def _axis(lo: float, hi: float, height: int, fmt) -> str:
    parts = []
    for i in range(5):
        value = lo + (hi - lo) * i / 4
        x = LEFT + (WIDTH - LEFT - RIGHT) * i / 4
        parts.append(f'<line x1="{x:.1f}" y1="4" x2="{x:.1f}" y2="{height - 18}" stroke="#ddd"/>'
                     f'<text x="{x:.1f}" y="{height - 4}" font-size="10" text-anchor="middle">{fmt(value)}</text>')
    return "".join(parts)


def timing_boxes(rows: list[dict]) -> str:
    """One row per implementation: p20-p80 box, median tick, min dot (microseconds)."""
    rows = [r for r in rows if r.get("performance_result")]
    if not rows:
        return ""
    hi = max(r["performance_result"]["p80_us"] for r in rows) * 1.1
    height = ROW * len(rows) + 24
    scale = (WIDTH - LEFT - RIGHT) / hi
    out = [f'<svg class="plot" role="img" aria-label="timing distribution" width="{WIDTH}" height="{height}" '
           f'xmlns="http://www.w3.org/2000/svg">', _axis(0, hi, height, lambda v: f"{v:.3g} µs")]
    for i, row in enumerate(rows):
        p = row["performance_result"]
        y = 6 + i * ROW
        out.append(f'<text x="{LEFT - 6}" y="{y + 13}" font-size="12" text-anchor="end">'
                   f'{escape(row["implementation"])}</text>')
        x20, x80 = LEFT + p["p20_us"] * scale, LEFT + p["p80_us"] * scale
        out.append(f'<rect x="{x20:.1f}" y="{y + 3}" width="{max(x80 - x20, 1):.1f}" height="14" '
                   f'fill="{"#9bb" if row.get("is_baseline") else "#7ad"}"/>')
        xm = LEFT + p["median_us"] * scale
        out.append(f'<line x1="{xm:.1f}" y1="{y}" x2="{xm:.1f}" y2="{y + 20}" stroke="#123" stroke-width="2"/>')
        out.append(f'<circle cx="{LEFT + p["min_us"] * scale:.1f}" cy="{y + 10}" r="2.5" fill="#123"/>')
        out.append(f'<text x="{WIDTH - RIGHT + 4}" y="{y + 13}" font-size="11">{p["median_us"]:.3g} µs</text>')
    out.append("</svg>")
    return "".join(out)


def speedup_bars(rows: list[dict]) -> str:
    """Speedup point and confidence interval per candidate, with the 1.0 line marked."""
    rows = [r for r in rows if r.get("speedup") and not r.get("is_baseline")]
    if not rows:
        return ""
    hi = max(max(r["speedup"]["ci_high"], r["speedup"]["value"]) for r in rows)
    hi = max(hi * 1.15, 1.2)
    height = ROW * len(rows) + 24
    scale = (WIDTH - LEFT - RIGHT) / hi
    colour = {"faster": "#2a2", "slower": "#c33", "within noise": "#999"}
    out = [f'<svg class="plot" role="img" aria-label="speedup" width="{WIDTH}" height="{height}" '
           f'xmlns="http://www.w3.org/2000/svg">', _axis(0, hi, height, lambda v: f"{v:.2f}×")]
    one = LEFT + scale
    out.append(f'<line x1="{one:.1f}" y1="0" x2="{one:.1f}" y2="{height - 18}" stroke="#000" '
               'stroke-dasharray="4 3"/>')
    for i, row in enumerate(rows):
        s = row["speedup"]
        y = 6 + i * ROW
        c = colour.get(s["verdict"], "#999")
        out.append(f'<text x="{LEFT - 6}" y="{y + 13}" font-size="12" text-anchor="end">'
                   f'{escape(row["implementation"])}</text>')
        out.append(f'<rect x="{LEFT}" y="{y + 4}" width="{s["value"] * scale:.1f}" height="12" fill="{c}" '
                   'opacity="0.55"/>')
        out.append(f'<line x1="{LEFT + s["ci_low"] * scale:.1f}" y1="{y + 10}" x2="{LEFT + s["ci_high"] * scale:.1f}" '
                   f'y2="{y + 10}" stroke="#000" stroke-width="2"/>')
        out.append(f'<text x="{WIDTH - RIGHT + 4}" y="{y + 13}" font-size="11">{s["value"]:.2f}×</text>')
    out.append("</svg>")
    return "".join(out)
