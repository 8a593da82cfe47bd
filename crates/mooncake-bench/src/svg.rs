//! Charts of a subcommand's results: the same (label, value) rows drawn
//! as text bars on stdout ([`stats::bars`]) and as an SVG file next to
//! the output (`--chart`, or the `--json` path with `.svg`). Each bar is a
//! `rect` of class `bar` carrying `data-label` and `data-value`, as in the
//! Python scripts' `benchmarks/chart.py`.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use crate::stats;

/// One horizontal bar chart.
#[derive(Debug, Clone, PartialEq)]
pub struct Bars {
    pub title: String,
    pub unit: &'static str,
    pub rows: Vec<(String, f64)>,
}

impl Bars {
    pub fn new(title: impl Into<String>, unit: &'static str, rows: Vec<(String, f64)>) -> Bars {
        Bars {
            title: title.into(),
            unit,
            rows,
        }
    }

    /// The chart in text, for the terminal.
    pub fn text(&self) -> String {
        stats::bars(&self.title, self.unit, &self.rows)
    }
}

const WIDTH: f64 = 720.0;
const BAR_H: f64 = 18.0;
const GAP: f64 = 6.0;
/// Average glyph width at 11 px, to size the label column.
const CHAR_W: f64 = 6.6;

fn escape(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

/// A value as a label: about three significant digits.
fn fmt(v: f64) -> String {
    let a = v.abs();
    if a >= 100.0 || v.fract() == 0.0 {
        format!("{v:.0}")
    } else if a >= 10.0 {
        format!("{v:.1}")
    } else {
        format!("{v:.2}")
    }
}

/// The charts stacked in one SVG document.
pub fn render(charts: &[Bars]) -> String {
    let label_w = charts
        .iter()
        .flat_map(|c| c.rows.iter())
        .map(|(l, _)| l.chars().count())
        .max()
        .unwrap_or(0) as f64
        * CHAR_W
        + 12.0;
    let plot_w = (WIDTH - label_w - 80.0).max(40.0);
    let heights: Vec<f64> = charts
        .iter()
        .map(|c| 34.0 + c.rows.len() as f64 * (BAR_H + GAP) + 16.0)
        .collect();
    let total: f64 = heights.iter().sum();
    let mut out = format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{WIDTH:.0}\" height=\"{total:.0}\" \
         viewBox=\"0 0 {WIDTH:.0} {total:.0}\">\n<rect width=\"{WIDTH:.0}\" height=\"{total:.0}\" fill=\"white\"/>\n"
    );
    let mut y0 = 0.0;
    for (c, h) in charts.iter().zip(&heights) {
        let title = if c.unit.is_empty() {
            c.title.clone()
        } else {
            format!("{} ({})", c.title, c.unit)
        };
        let _ = writeln!(
            out,
            "<text x=\"{:.1}\" y=\"{:.1}\" font-size=\"13\" font-family=\"sans-serif\" \
             text-anchor=\"middle\" font-weight=\"bold\" class=\"title\">{}</text>",
            WIDTH / 2.0,
            y0 + 20.0,
            escape(&title)
        );
        let max = c.rows.iter().map(|r| r.1).fold(0.0, f64::max);
        let scale = if max > 0.0 { plot_w / max } else { 0.0 };
        for (i, (label, v)) in c.rows.iter().enumerate() {
            let y = y0 + 30.0 + i as f64 * (BAR_H + GAP);
            let w = v.max(0.0) * scale;
            let text_y = y + BAR_H * 0.72;
            let _ = writeln!(
                out,
                "<text x=\"{:.1}\" y=\"{text_y:.1}\" font-size=\"11\" font-family=\"sans-serif\" \
                 text-anchor=\"end\" class=\"label\">{}</text>\n\
                 <rect class=\"bar\" x=\"{label_w:.1}\" y=\"{y:.1}\" width=\"{w:.3}\" height=\"{BAR_H}\" \
                 fill=\"#1f77b4\" data-label=\"{}\" data-value=\"{v}\"/>\n\
                 <text x=\"{:.1}\" y=\"{text_y:.1}\" font-size=\"11\" font-family=\"sans-serif\" \
                 class=\"value\">{}</text>",
                label_w - 6.0,
                escape(label),
                escape(label),
                label_w + w + 4.0,
                fmt(*v)
            );
        }
        let _ = writeln!(
            out,
            "<line x1=\"{label_w:.1}\" y1=\"{:.1}\" x2=\"{label_w:.1}\" y2=\"{:.1}\" stroke=\"#333\"/>",
            y0 + 28.0,
            y0 + h - 14.0
        );
        y0 += h;
    }
    out.push_str("</svg>\n");
    out
}

/// Writes the charts to `path` (creating its directory).
pub fn write(path: &Path, charts: &[Bars]) -> Result<(), String> {
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    }
    std::fs::write(path, render(charts)).map_err(|e| format!("{}: {e}", path.display()))
}

/// Where a subcommand draws: `--chart`, else next to `--json` (`.svg`).
pub fn path_for(chart: &Option<PathBuf>, json: &Option<PathBuf>) -> Option<PathBuf> {
    chart
        .clone()
        .or_else(|| json.as_ref().map(|j| j.with_extension("svg")))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// (label, value, width) of every bar, and every text, read by an
    /// XML parser that rejects a malformed document.
    fn parse(svg: &str) -> (Vec<(String, f64, f64)>, Vec<String>) {
        use quick_xml::escape::resolve_predefined_entity;
        use quick_xml::events::{BytesStart, Event};
        let attr = |e: &BytesStart<'_>, k: &str| {
            e.try_get_attribute(k)
                .unwrap()
                .map(|a| a.unescape_value().unwrap().into_owned())
        };
        let mut reader = quick_xml::Reader::from_str(svg);
        let (mut bars, mut texts, mut root) = (Vec::new(), Vec::new(), None);
        // The text element being read: its pieces and entities.
        let mut text: Option<String> = None;
        loop {
            match reader.read_event().expect("well-formed XML") {
                Event::Start(e) | Event::Empty(e) => {
                    let name = e.name().as_ref().to_vec();
                    root.get_or_insert(name.clone());
                    if name == b"text" {
                        text = Some(String::new());
                    }
                    if name == b"rect" && attr(&e, "class").as_deref() == Some("bar") {
                        bars.push((
                            attr(&e, "data-label").unwrap(),
                            attr(&e, "data-value").unwrap().parse().unwrap(),
                            attr(&e, "width").unwrap().parse().unwrap(),
                        ));
                    }
                }
                Event::Text(t) => {
                    if let Some(s) = &mut text {
                        s.push_str(&t.decode().unwrap());
                    }
                }
                Event::GeneralRef(r) => {
                    if let Some(s) = &mut text {
                        let name = r.decode().unwrap();
                        s.push_str(resolve_predefined_entity(&name).expect("a known entity"));
                    }
                }
                Event::End(_) => texts.extend(text.take()),
                Event::Eof => break,
                _ => {}
            }
        }
        assert_eq!(root.as_deref(), Some(&b"svg"[..]));
        (bars, texts)
    }

    #[test]
    fn bars_are_proportional_and_labelled() {
        let charts = [
            Bars::new(
                "Throughput",
                "GB/s",
                vec![
                    ("put <4 KiB> & co".into(), 2.5),
                    ("get".into(), 1.25),
                    ("none".into(), 0.0),
                ],
            ),
            Bars::new("Round trips", "", vec![("ping".into(), 30.0)]),
        ];
        let svg = render(&charts);
        assert!(svg.starts_with("<svg xmlns=\"http://www.w3.org/2000/svg\""));
        let (bars, texts) = parse(&svg);
        assert_eq!(bars.len(), 4);
        assert_eq!(bars[0].0, "put <4 KiB> & co");
        assert_eq!(bars[0].1, 2.5);
        assert!(bars[0].2 > 0.0);
        assert!((bars[1].2 - bars[0].2 / 2.0).abs() < 1e-2);
        assert_eq!(bars[2].2, 0.0);
        // Each chart scales to its own largest value.
        assert!((bars[3].2 - bars[0].2).abs() < 1e-2);
        for s in [
            "Throughput (GB/s)",
            "Round trips",
            "put <4 KiB> & co",
            "get",
            "2.50",
            "1.25",
            "30",
        ] {
            assert!(texts.iter().any(|t| t == s), "{s} missing from {texts:?}");
        }
    }

    #[test]
    fn the_chart_follows_the_json() {
        let j = Some(PathBuf::from("out/run.json"));
        assert_eq!(path_for(&None, &j), Some(PathBuf::from("out/run.svg")));
        let c = Some(PathBuf::from("c.svg"));
        assert_eq!(path_for(&c, &j), c);
        assert_eq!(path_for(&None, &None), None);
    }
}
