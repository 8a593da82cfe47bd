"""Charts of benchmark results as standalone SVG files, without dependencies.

Every benchmark script that reports numbers draws them with these helpers:

- `bars(title, unit, rows)`: horizontal bars, one per (label, value);
- `grouped_bars(title, unit, groups, series)`: vertical bars, one group per
  label of `groups`, one bar per series in each group;
- `lines(title, unit, xs, series, log_y=False)`: one polyline per series over
  the categories `xs`;
- `write(path, charts, title=None, columns=1)`: the charts as one SVG file.

A missing value (`None`) draws nothing. Each bar is a `rect` of class `bar`
and each point a `circle` of class `point`, both carrying `data-value`, so
tests and readers can check the drawing against the numbers.

From the command line, a bar chart of a table's column (for a docs section
whose numbers come from a run):

    python benchmarks/chart.py --out docs/img/x.svg --title T --unit "µs" "label a=1.5" "label b=3"
"""

from __future__ import annotations

import argparse
import math
from dataclasses import dataclass, field
from pathlib import Path
from xml.sax.saxutils import escape

PALETTE = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f",
           "#bcbd22", "#17becf"]
FONT = 'font-family="sans-serif"'
CHAR_W = 6.6  # average glyph width at 11 px, for laying out labels


@dataclass
class Chart:
    """One panel: SVG elements in its own coordinates, `width` x `height`."""

    width: float
    height: float
    elements: list[str] = field(default_factory=list)


def fmt(v: float) -> str:
    """A value as a label: 3 significant digits, no exponent for usual ranges."""
    if v == int(v) and abs(v) < 1e15:
        return f"{int(v):,}" if abs(v) >= 10000 else str(int(v))
    a = abs(v)
    if a >= 1000:
        return f"{v:,.0f}"
    if a >= 100:
        return f"{v:.0f}"
    if a >= 10:
        return f"{v:.1f}"
    if a >= 0.01:
        return f"{v:.2f}"
    return f"{v:.2g}"


def _text(x: float, y: float, s: str, size: int = 11, anchor: str = "start", extra: str = "") -> str:
    return (f'<text x="{x:.1f}" y="{y:.1f}" font-size="{size}" {FONT} text-anchor="{anchor}"{extra}>'
            f"{escape(str(s))}</text>")


def _title(c: Chart, title: str) -> None:
    c.elements.append(_text(c.width / 2, 18, title, 13, "middle", ' font-weight="bold" class="title"'))


def nice_max(v: float) -> float:
    """The smallest 1/2/5 x 10^k at or above `v` (the top of an axis)."""
    if v <= 0:
        return 1.0
    e = 10 ** math.floor(math.log10(v))
    for m in (1, 2, 5, 10):
        if m * e >= v * (1 - 1e-12):
            return m * e
    return 10 * e


def bars(title: str, unit: str, rows: list[tuple[str, float | None]], width: float = 640) -> Chart:
    """Horizontal bars, lengths proportional to the values (from zero)."""
    label_w = max((len(r[0]) for r in rows), default=0) * CHAR_W + 12
    bar_h, gap, top = 18, 6, 30
    height = top + len(rows) * (bar_h + gap) + 24
    c = Chart(width, height)
    _title(c, f"{title} ({unit})" if unit else title)
    values = [v for _, v in rows if v is not None]
    vmax = max(values, default=0.0)
    plot_w = width - label_w - 70
    scale = plot_w / vmax if vmax > 0 else 0.0
    for i, (label, v) in enumerate(rows):
        y = top + i * (bar_h + gap)
        c.elements.append(_text(label_w - 6, y + bar_h * 0.72, label, anchor="end", extra=' class="label"'))
        if v is None:
            c.elements.append(_text(label_w + 4, y + bar_h * 0.72, "n/a", extra=' fill="#888"'))
            continue
        w = max(0.0, v) * scale
        c.elements.append(f'<rect class="bar" x="{label_w:.1f}" y="{y:.1f}" width="{w:.3f}" height="{bar_h}" '
                          f'fill="{PALETTE[0]}" data-label="{escape(label)}" data-value="{v!r}"/>')
        c.elements.append(_text(label_w + w + 4, y + bar_h * 0.72, fmt(v), extra=' class="value"'))
    c.elements.append(f'<line x1="{label_w:.1f}" y1="{top - 2}" x2="{label_w:.1f}" '
                      f'y2="{height - 22}" stroke="#333"/>')
    return c


def _legend(c: Chart, names: list[str], x: float, y: float, marker: str = "rect") -> None:
    for i, n in enumerate(names):
        yy = y + i * 15
        color = PALETTE[i % len(PALETTE)]
        if marker == "rect":
            c.elements.append(f'<rect x="{x:.1f}" y="{yy - 9:.1f}" width="10" height="10" fill="{color}"/>')
        else:
            c.elements.append(f'<line x1="{x:.1f}" y1="{yy - 4:.1f}" x2="{x + 12:.1f}" y2="{yy - 4:.1f}" '
                              f'stroke="{color}" stroke-width="2"/>')
        c.elements.append(_text(x + 16, yy, n, 10, extra=' class="legend"'))


def _y_axis(c: Chart, x0: float, x1: float, y0: float, h: float, ticks: list[tuple[float, str]]) -> None:
    """Ticks at fractions `t` (0 = bottom, 1 = top) of the plot height; the plot spans x0..x1."""
    for t, label in ticks:
        y = y0 - t * h
        c.elements.append(f'<line x1="{x0 - 4:.1f}" y1="{y:.1f}" x2="{x1:.1f}" y2="{y:.1f}" stroke="#ddd"/>')
        c.elements.append(_text(x0 - 6, y + 4, label, 10, "end", ' class="tick"'))
    c.elements.append(f'<line x1="{x0:.1f}" y1="{y0:.1f}" x2="{x0:.1f}" y2="{y0 - h:.1f}" stroke="#333"/>')
    c.elements.append(f'<line x1="{x0:.1f}" y1="{y0:.1f}" x2="{x1:.1f}" y2="{y0:.1f}" stroke="#333"/>')


def grouped_bars(title: str, unit: str, groups: list[str], series: dict[str, list[float | None]],
                 width: float = 640, height: float = 320) -> Chart:
    """Vertical bars from zero: one group per `groups` label, one bar per series."""
    c = Chart(width, height)
    _title(c, title)
    names = list(series)
    legend_w = max((len(n) for n in names), default=0) * 6 + 30
    x0, y0, top = 56, height - 40, 34
    plot_w, plot_h = width - x0 - legend_w - 10, height - 40 - top
    values = [v for vs in series.values() for v in vs if v is not None]
    vmax = nice_max(max(values, default=0.0))
    _y_axis(c, x0, x0 + plot_w, y0, plot_h, [(i / 4, fmt(vmax * i / 4)) for i in range(5)])
    c.elements.append(_text(14, top + plot_h / 2, unit, 10, "middle",
                            f' transform="rotate(-90 14 {top + plot_h / 2:.1f})"'))
    slot = plot_w / max(1, len(groups))
    bar_w = slot * 0.8 / max(1, len(names))
    for gi, g in enumerate(groups):
        gx = x0 + gi * slot + slot * 0.1
        c.elements.append(_text(x0 + (gi + 0.5) * slot, y0 + 16, g, 10, "middle", ' class="label"'))
        for si, n in enumerate(names):
            vs = series[n]
            v = vs[gi] if gi < len(vs) else None
            if v is None:
                continue
            h = max(0.0, v) / vmax * plot_h
            c.elements.append(f'<rect class="bar" x="{gx + si * bar_w:.1f}" y="{y0 - h:.3f}" '
                              f'width="{bar_w * 0.92:.1f}" height="{h:.3f}" fill="{PALETTE[si % len(PALETTE)]}" '
                              f'data-label="{escape(g)}" data-series="{escape(n)}" data-value="{v!r}">'
                              f"<title>{escape(f'{n} {g}: {fmt(v)} {unit}')}</title></rect>")
    _legend(c, names, width - legend_w, top + 10)
    return c


def lines(title: str, unit: str, xs: list[str], series: dict[str, list[float | None]],
          log_y: bool = False, width: float = 640, height: float = 320) -> Chart:
    """One polyline per series over the categories `xs` (evenly spaced)."""
    c = Chart(width, height)
    _title(c, title)
    names = list(series)
    legend_w = max((len(n) for n in names), default=0) * 6 + 34
    x0, y0, top = 56, height - 40, 34
    plot_w, plot_h = width - x0 - legend_w - 10, height - 40 - top
    values = [v for vs in series.values() for v in vs if v is not None and (v > 0 or not log_y)]
    if log_y and values:
        lo = 10 ** math.floor(math.log10(min(values)))
        hi = 10 ** math.ceil(math.log10(max(values)))
        hi = hi if hi > lo else lo * 10
        span = math.log10(hi) - math.log10(lo)

        def frac(v: float) -> float:
            return (math.log10(v) - math.log10(lo)) / span

        ticks = [(frac(10 ** k), fmt(10 ** k)) for k in range(round(math.log10(lo)), round(math.log10(hi)) + 1)]
    else:
        vmax = nice_max(max(values, default=0.0))

        def frac(v: float) -> float:
            return max(0.0, v) / vmax

        ticks = [(i / 4, fmt(vmax * i / 4)) for i in range(5)]
    _y_axis(c, x0, x0 + plot_w, y0, plot_h, ticks)
    c.elements.append(_text(14, top + plot_h / 2, unit, 10, "middle",
                            f' transform="rotate(-90 14 {top + plot_h / 2:.1f})"'))
    step = plot_w / max(1, len(xs))
    px = [x0 + (i + 0.5) * step for i in range(len(xs))]
    for i, x in enumerate(xs):
        c.elements.append(_text(px[i], y0 + 16, x, 10, "middle", ' class="label"'))
    for si, n in enumerate(names):
        color = PALETTE[si % len(PALETTE)]
        pts = [(px[i], y0 - frac(v) * plot_h, v) for i, v in enumerate(series[n][:len(xs)])
               if v is not None and (v > 0 or not log_y)]
        if len(pts) > 1:
            path = " ".join(f"{x:.1f},{y:.3f}" for x, y, _ in pts)
            c.elements.append(f'<polyline points="{path}" fill="none" stroke="{color}" stroke-width="2"/>')
        for x, y, v in pts:
            c.elements.append(f'<circle class="point" cx="{x:.1f}" cy="{y:.3f}" r="3" fill="{color}" '
                              f'data-series="{escape(n)}" data-value="{v!r}">'
                              f"<title>{escape(f'{n}: {fmt(v)} {unit}')}</title></circle>")
    _legend(c, names, width - legend_w, top + 10, marker="line")
    return c


def render(charts: list[Chart], title: str | None = None, columns: int = 1) -> str:
    """The charts laid out in `columns`, as one SVG document."""
    columns = max(1, min(columns, len(charts) or 1))
    col_w = max((c.width for c in charts), default=320)
    rows = [charts[i:i + columns] for i in range(0, len(charts), columns)]
    head = 28 if title else 0
    row_h = [max(c.height for c in r) for r in rows]
    width, height = col_w * columns, head + sum(row_h)
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width:.0f}" height="{height:.0f}" '
           f'viewBox="0 0 {width:.0f} {height:.0f}">',
           f'<rect width="{width:.0f}" height="{height:.0f}" fill="white"/>']
    if title:
        out.append(_text(width / 2, 20, title, 15, "middle", ' font-weight="bold"'))
    y = head
    for r, h in zip(rows, row_h):
        for i, c in enumerate(r):
            out.append(f'<g transform="translate({i * col_w:.0f},{y:.0f})">')
            out.extend(c.elements)
            out.append("</g>")
        y += h
    out.append("</svg>")
    return "\n".join(out) + "\n"


def write(path: str | Path, charts: list[Chart], title: str | None = None, columns: int = 1) -> Path:
    """Writes the charts to `path` (its directory created) and returns it."""
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(render(charts, title, columns), encoding="utf-8")
    return p


def path_for(chart: str | None, json_path: str | None) -> Path | None:
    """Where a script draws its chart: `--chart`, else next to `--json` (same stem, `.svg`)."""
    if chart:
        return Path(chart)
    if json_path:
        return Path(json_path).with_suffix(".svg")
    return None


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="A bar chart of label=value pairs, as SVG.")
    ap.add_argument("--out", required=True)
    ap.add_argument("--title", required=True)
    ap.add_argument("--unit", default="")
    ap.add_argument("rows", nargs="+", help="label=value")
    args = ap.parse_args(argv)
    rows = []
    for r in args.rows:
        label, sep, value = r.rpartition("=")
        if not sep:
            ap.error(f"not label=value: {r!r}")
        rows.append((label, float(value)))
    write(args.out, [bars(args.title, args.unit, rows)])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
