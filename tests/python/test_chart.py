"""The benchmarks' SVG chart writer (`benchmarks/chart.py`): the files parse
as SVG, bars and points stand in proportion to the values, and every label
and value is written."""

from __future__ import annotations

import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "benchmarks"))
import chart  # noqa: E402

NS = "{http://www.w3.org/2000/svg}"


def parse(path: Path) -> ET.Element:
    root = ET.parse(path).getroot()
    assert root.tag == f"{NS}svg"
    assert float(root.get("width")) > 0 and float(root.get("height")) > 0
    return root


def texts(root: ET.Element) -> list[str]:
    return [t.text or "" for t in root.iter(f"{NS}text")]


def by_class(root: ET.Element, tag: str, cls: str) -> list[ET.Element]:
    return [e for e in root.iter(f"{NS}{tag}") if e.get("class") == cls]


def test_bar_lengths_are_proportional_and_labelled(tmp_path):
    rows = [("put 4 KiB", 2.5), ("get <4 KiB> & co", 1.25), ("zero", 0.0), ("missing", None)]
    root = parse(chart.write(tmp_path / "b.svg", [chart.bars("Throughput", "GB/s", rows)]))
    rects = by_class(root, "rect", "bar")
    assert [r.get("data-label") for r in rects] == ["put 4 KiB", "get <4 KiB> & co", "zero"]
    w = [float(r.get("width")) for r in rects]
    assert w[0] > 0
    assert w[1] == pytest.approx(w[0] / 2, rel=1e-3)
    assert w[2] == 0
    shown = texts(root)
    assert "Throughput (GB/s)" in shown
    for label, _ in rows:
        assert label in shown
    assert "2.50" in shown and "1.25" in shown and "0" in shown and "n/a" in shown


def test_grouped_bar_heights_are_proportional(tmp_path):
    series = {"reference": [1.0, 4.0], "ours": [3.0, None]}
    c = chart.grouped_bars("Fill", "GB/s", ["first", "warm"], series)
    root = parse(chart.write(tmp_path / "g.svg", [c], title="A figure"))
    rects = by_class(root, "rect", "bar")
    got = {(r.get("data-series"), r.get("data-label")): float(r.get("height")) for r in rects}
    assert set(got) == {("reference", "first"), ("reference", "warm"), ("ours", "first")}
    unit = got[("reference", "first")]
    assert got[("reference", "warm")] == pytest.approx(4 * unit, rel=1e-3)
    assert got[("ours", "first")] == pytest.approx(3 * unit, rel=1e-3)
    # Every bar stands on the same baseline.
    bottoms = {round(float(r.get("y")) + float(r.get("height")), 1) for r in rects}
    assert len(bottoms) == 1
    shown = texts(root)
    for s in ["A figure", "Fill", "first", "warm", "reference", "ours"]:
        assert s in shown


def test_line_points_are_proportional_on_linear_and_log_axes(tmp_path):
    xs = ["4 KiB", "64 KiB", "1 MiB"]
    lin = chart.lines("linear", "GB/s", xs, {"get": [1.0, 2.0, 4.0]})
    log = chart.lines("log", "GB/s", xs, {"get": [1.0, 10.0, 100.0], "put": [None, 0.0, 5.0]}, log_y=True)
    root = parse(chart.write(tmp_path / "l.svg", [lin, log], columns=2))
    groups = list(root.iter(f"{NS}g"))
    assert len(groups) == 2

    def heights(g: ET.Element, series: str) -> list[float]:
        pts = [p for p in by_class(g, "circle", "point") if p.get("data-series") == series]
        base = max(float(ln.get("y1")) for ln in g.iter(f"{NS}line"))
        return [base - float(p.get("cy")) for p in pts]

    h = heights(groups[0], "get")
    assert h[1] == pytest.approx(2 * h[0], rel=1e-3) and h[2] == pytest.approx(4 * h[0], rel=1e-3)
    # Log axis: equal ratios, equal steps; a zero or missing value draws no point.
    h = heights(groups[1], "get")
    assert h[1] - h[0] == pytest.approx(h[2] - h[1], rel=1e-3)
    assert len(heights(groups[1], "put")) == 1
    assert len(list(groups[1].iter(f"{NS}polyline"))) == 1
    for x in xs:
        assert x in texts(groups[0])


def test_the_command_line_draws_a_table_column(tmp_path):
    out = tmp_path / "sub" / "t.svg"
    assert chart.main(["--out", str(out), "--title", "RSS", "--unit", "bytes", "a=b=1", "c=3"]) == 0
    root = parse(out)
    rects = by_class(root, "rect", "bar")
    assert [r.get("data-label") for r in rects] == ["a=b", "c"]
    assert float(rects[1].get("width")) == pytest.approx(3 * float(rects[0].get("width")), rel=1e-3)


def test_chart_path_follows_the_json_output():
    assert chart.path_for(None, "out/run.json") == Path("out/run.svg")
    assert chart.path_for("x.svg", "out/run.json") == Path("x.svg")
    assert chart.path_for(None, None) is None
