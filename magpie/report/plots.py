"""Small inline SVG plots for the HTML report (no plotting library needed)."""

from __future__ import annotations

import math
from html import escape

ROW = 26
LEFT = 170
WIDTH = 640
RIGHT = 70


class Scale:
    """Maps values to x; logarithmic when the values span more than 20x, so that a
    40 µs kernel and a 100 ms one both stay readable."""

    def __init__(self, values: list[float], floor_at_zero: bool):
        positive = [v for v in values if v > 0] or [1.0]
        self.lo, self.hi = min(positive), max(positive)
        self.log = self.hi / self.lo > 20
        if self.log:
            self.lo, self.hi = math.log10(self.lo) - 0.15, math.log10(self.hi) + 0.15
        else:
            self.lo, self.hi = (0.0 if floor_at_zero else self.lo * 0.9), self.hi * 1.1
        self.span = (self.hi - self.lo) or 1.0

    def x(self, value: float) -> float:
        v = math.log10(max(value, 1e-12)) if self.log else value
        return LEFT + (WIDTH - LEFT - RIGHT) * (v - self.lo) / self.span

    def axis(self, height: int, unit: str) -> str:
        parts = []
        for i in range(5):
            v = self.lo + self.span * i / 4
            value = 10**v if self.log else v
            x = LEFT + (WIDTH - LEFT - RIGHT) * i / 4
            parts.append(
                f'<line x1="{x:.1f}" y1="4" x2="{x:.1f}" y2="{height - 18}" stroke="#ddd"/>'
                f'<text x="{x:.1f}" y="{height - 4}" font-size="10" text-anchor="middle">'
                f"{value:.3g}{unit}</text>"
            )
        if self.log:
            parts.append(f'<text x="{WIDTH - 4}" y="{height - 4}" font-size="10" text-anchor="end">log</text>')
        return "".join(parts)


def timing_boxes(rows: list[dict]) -> str:
    """One row per implementation: p20-p80 box, median tick, min dot (microseconds)."""
    rows = [r for r in rows if r.get("performance_result")]
    if not rows:
        return ""
    perf = [r["performance_result"] for r in rows]
    scale = Scale([p["min_us"] for p in perf] + [p["p80_us"] for p in perf], floor_at_zero=True)
    height = ROW * len(rows) + 24
    out = [
        f'<svg class="plot" role="img" aria-label="timing distribution" width="{WIDTH}" height="{height}" '
        f'xmlns="http://www.w3.org/2000/svg">',
        scale.axis(height, " µs"),
    ]
    for i, row in enumerate(rows):
        p = row["performance_result"]
        y = 6 + i * ROW
        out.append(
            f'<text x="{LEFT - 6}" y="{y + 13}" font-size="12" text-anchor="end">{escape(row["implementation"])}</text>'
        )
        x20, x80 = scale.x(p["p20_us"]), scale.x(p["p80_us"])
        out.append(
            f'<rect x="{x20:.1f}" y="{y + 3}" width="{max(x80 - x20, 1):.1f}" height="14" '
            f'fill="{"#9bb" if row.get("is_baseline") else "#7ad"}"/>'
        )
        xm = scale.x(p["median_us"])
        out.append(f'<line x1="{xm:.1f}" y1="{y}" x2="{xm:.1f}" y2="{y + 20}" stroke="#123" stroke-width="2"/>')
        out.append(f'<circle cx="{scale.x(p["min_us"]):.1f}" cy="{y + 10}" r="2.5" fill="#123"/>')
        out.append(f'<text x="{WIDTH - RIGHT + 4}" y="{y + 13}" font-size="11">{p["median_us"]:.3g} µs</text>')
    out.append("</svg>")
    return "".join(out)


def speedup_bars(rows: list[dict]) -> str:
    """Speedup point and confidence interval per candidate, with the 1.0 line marked."""
    rows = [r for r in rows if r.get("speedup") and not r.get("is_baseline")]
    if not rows:
        return ""
    values = [v for r in rows for v in (r["speedup"]["ci_low"], r["speedup"]["ci_high"])] + [0.8, 1.25]
    scale = Scale(values, floor_at_zero=True)
    height = ROW * len(rows) + 24
    colour = {"faster": "#2a2", "slower": "#c33", "within noise": "#999"}
    out = [
        f'<svg class="plot" role="img" aria-label="speedup" width="{WIDTH}" height="{height}" '
        f'xmlns="http://www.w3.org/2000/svg">',
        scale.axis(height, "×"),
    ]
    one = scale.x(1.0)
    out.append(f'<line x1="{one:.1f}" y1="0" x2="{one:.1f}" y2="{height - 18}" stroke="#000" stroke-dasharray="4 3"/>')
    for i, row in enumerate(rows):
        s = row["speedup"]
        y = 6 + i * ROW
        c = colour.get(s["verdict"], "#999")
        out.append(
            f'<text x="{LEFT - 6}" y="{y + 13}" font-size="12" text-anchor="end">{escape(row["implementation"])}</text>'
        )
        start, end = sorted((one, scale.x(s["value"])))
        out.append(
            f'<rect x="{start:.1f}" y="{y + 4}" width="{max(end - start, 1):.1f}" height="12" '
            f'fill="{c}" opacity="0.55"/>'
        )
        out.append(
            f'<line x1="{scale.x(s["ci_low"]):.1f}" y1="{y + 10}" x2="{scale.x(s["ci_high"]):.1f}" '
            f'y2="{y + 10}" stroke="#000" stroke-width="2"/>'
        )
        out.append(f'<text x="{WIDTH - RIGHT + 4}" y="{y + 13}" font-size="11">{s["value"]:.3g}×</text>')
    out.append("</svg>")
    return "".join(out)


def roofline_plot(rows: list[dict]) -> str:
    """Each implementation's longest kernel (from the profile rule) on the device's roofline."""
    points = []
    for row in rows:
        kernels = [k for k in ((row.get("profile") or {}).get("kernels") or []) if k.get("roofline")]
        if kernels:
            points.append((row["implementation"], max(kernels, key=lambda k: k["duration_us"])["roofline"]))
    return roofline_chart(points)


def roofline_chart(points: list[tuple[str, dict]]) -> str:
    """Log-log roofline: memory and compute roofs of the device (for the first point's
    precision), each point placed by arithmetic intensity and achieved rate."""
    points = [(name, r) for name, r in points if r.get("arithmetic_intensity") and r.get("achieved_tflops")]
    if not points:
        return ""
    roof = points[0][1]
    peak, bandwidth = roof["peak_tflops"] or max(p["achieved_tflops"] for _, p in points), roof["peak_tbps"]
    # log10 FLOP/byte and TFLOP/s: five decades or more, as many as the points need
    x_lo = min(-2.0, math.floor(math.log10(min(p["arithmetic_intensity"] for _, p in points))))
    x_hi = max(3.0, math.ceil(math.log10(max(p["arithmetic_intensity"] for _, p in points))))
    y_hi = math.log10(peak * 2)
    y_lo = min(y_hi - 5, math.floor(math.log10(min(p["achieved_tflops"] for _, p in points))))
    width, height, left, bottom = WIDTH, 300, 60, 30

    def px(intensity: float) -> float:
        return left + (width - left - 20) * (math.log10(max(intensity, 1e-9)) - x_lo) / (x_hi - x_lo)

    def py(tflops: float) -> float:
        return 10 + (height - bottom - 10) * (1 - (math.log10(max(tflops, 1e-9)) - y_lo) / (y_hi - y_lo))

    out = [
        f'<svg class="plot roofline" role="img" aria-label="roofline" width="{width}" height="{height}" '
        'xmlns="http://www.w3.org/2000/svg">'
    ]
    for decade in range(int(x_lo), int(x_hi) + 1):
        x = px(10**decade)
        out.append(
            f'<line x1="{x:.1f}" y1="10" x2="{x:.1f}" y2="{height - bottom}" stroke="#eee"/>'
            f'<text x="{x:.1f}" y="{height - 14}" font-size="10" text-anchor="middle">{10.0**decade:g}</text>'
        )
    for decade in range(math.ceil(y_lo), math.floor(y_hi) + 1):
        y = py(10**decade)
        out.append(
            f'<line x1="{left}" y1="{y:.1f}" x2="{width - 20}" y2="{y:.1f}" stroke="#eee"/>'
            f'<text x="{left - 4}" y="{y + 3:.1f}" font-size="10" text-anchor="end">{10.0**decade:g}</text>'
        )
    ridge = peak / bandwidth
    out.append(
        f'<polyline fill="none" stroke="#123" stroke-width="2" points="{px(10**x_lo):.1f},'
        f'{py(bandwidth * 10**x_lo):.1f} {px(ridge):.1f},{py(peak):.1f} {px(10**x_hi):.1f},{py(peak):.1f}"/>'
    )
    roof_text = (
        f"{peak:.4g} TFLOP/s ({roof['precision']}), {bandwidth:.3g} TB/s, {roof['arch']}"
        f"{' measured' if roof.get('peaks_measured') else ' datasheet'}"
    )
    out.append(
        f'<text x="{width - 22}" y="{py(peak) - 4:.1f}" font-size="10" text-anchor="end">{escape(roof_text)}</text>'
    )
    where = [(px(r["arithmetic_intensity"]), py(r["achieved_tflops"])) for _, r in points]
    labels = Labels(
        bounds=(left, 0, width, height - bottom),
        taken=[(width - 22 - _text_width(roof_text, 10), py(peak) - 14, width - 22, py(peak) - 2)]
        + [(x - 4, y - 4, x + 4, y + 4) for x, y in where],
    )
    legend, hidden = [], 0
    for n, ((name, r), (x, y)) in enumerate(zip(points, where), start=1):
        pct = "" if r.get("pct_of_roofline") is None else f"{r['pct_of_roofline']:.0f}%"  # no peak for its precision
        label = labels.place(x, y, f"{n} {name} {pct}".strip())
        if not label:
            hidden += 1
            label = labels.place(x, y, str(n))
        tooltip = _point_tooltip(name, r)
        out.append(
            f'<g class="point"><title>{n}. {escape(tooltip)}</title>'
            f'<circle cx="{x:.1f}" cy="{y:.1f}" r="4" fill="#c60"/>{label}</g>'
        )
        legend.append(f"<li>{escape(tooltip)}</li>")
    out.append(f'<text x="{left}" y="{height - 2}" font-size="10">FLOP/byte (log) · TFLOP/s (log)</text></svg>')
    out.append(
        f'<p class="note">% beside a point: its achieved TFLOP/s as a share of the roof at its arithmetic '
        f"intensity (the lower of peak compute and bandwidth × intensity; of bandwidth alone for pure data "
        f"movement). Points are numbered as listed below; a name that would overlap another is left off "
        f"its point{f' ({hidden} here)' if hidden else ''}; hover a point for its figures.</p>"
        f'<ol class="roofline-legend">{"".join(legend)}</ol>'
    )
    return "".join(out)


def _point_tooltip(name: str, r: dict) -> str:
    pct = r.get("pct_of_roofline")
    share = "no roof for its precision" if pct is None else f"{pct:.0f}% of the roof at its intensity"
    bound = f", {r['bound']}-bound" if r.get("bound") else ""
    shapes = f" {r['shapes']}" if r.get("shapes") else ""
    return (
        f"{name}{shapes}: {share}{bound}; {r['arithmetic_intensity']:.3g} FLOP/byte, {r['achieved_tflops']:.3g} TFLOP/s"
    )


def _text_width(text: str, size: float) -> float:
    """About how wide a line of the report's sans-serif font is (an average glyph is 0.58 em)."""
    return len(text) * size * 0.58


class Labels:
    """Labels placed beside their points where they overlap nothing placed before them (other
    labels, points, the roof's caption) and stay inside the plot: to the right, the left, above or
    below. The points come most important first, so a crowded plot keeps their names."""

    SIZE = 11

    def __init__(self, bounds: tuple[float, float, float, float], taken: list[tuple[float, float, float, float]]):
        self.bounds = bounds
        self.taken = list(taken)

    def place(self, x: float, y: float, text: str) -> str:
        """The SVG text of the label at the first free place, or "" where there is none."""
        w, h = _text_width(text, self.SIZE), self.SIZE
        spots = (("start", x + 6, y + 4), ("end", x - 6, y + 4), ("middle", x, y - 7), ("middle", x, y + 15))
        for anchor, tx, ty in spots:
            x0 = {"start": tx, "end": tx - w, "middle": tx - w / 2}[anchor]
            box = (x0, ty - h + 2, x0 + w, ty + 2)
            own = (x - 4, y - 4, x + 4, y + 4)
            if self._inside(box) and not any(_overlap(box, t) for t in self.taken if t != own):
                self.taken.append(box)
                return (
                    f'<text x="{tx:.1f}" y="{ty:.1f}" font-size="{self.SIZE}" text-anchor="{anchor}">'
                    f"{escape(text)}</text>"
                )
        return ""

    def _inside(self, box) -> bool:
        left, top, right, bottom = self.bounds
        return box[0] >= left and box[1] >= top and box[2] <= right and box[3] <= bottom


def _overlap(a, b) -> bool:
    return a[0] < b[2] and b[0] < a[2] and a[1] < b[3] and b[1] < a[3]


TIMELINE_COLOURS = {
    "computation_time": "#2a7",
    "exposed_comm_time": "#c60",
    "exposed_memcpy_time": "#36c",
    "idle_time": "#ccc",
}


def timeline_bar(rows: list[dict]) -> str:
    """One stacked bar of a device's time: computation, exposed communication, exposed memcpy, idle."""
    parts = [(r["type"], r["percent"]) for r in rows if r["type"] in TIMELINE_COLOURS]
    width, x = WIDTH - 20, 10.0
    out = [
        f'<svg class="plot timeline" role="img" aria-label="gpu timeline" width="{WIDTH}" height="44" '
        'xmlns="http://www.w3.org/2000/svg">'
    ]
    for name, pct in parts:
        w = width * pct / 100
        out.append(
            f'<rect x="{x:.1f}" y="4" width="{max(w, 0):.1f}" height="18" fill="{TIMELINE_COLOURS[name]}">'
            f"<title>{escape(name)} {pct:.1f}%</title></rect>"
        )
        x += w
    labels = ", ".join(f"{name.replace('_time', '').replace('_', ' ')} {pct:.1f}%" for name, pct in parts)
    out.append(f'<text x="10" y="38" font-size="11">{escape(labels)}</text></svg>')
    return "".join(out)
