//! One self-contained HTML report for `stoker bench --report` and `stoker monitor --out`: a
//! title, key facts, verdict cards, line charts over time and tables, in a single file with
//! inline CSS and inline SVG.
//!
//! Nothing is fetched when the file is opened (no scripts, fonts, images or style sheets from
//! elsewhere), so a report can be mailed, attached to an issue or opened on an air-gapped
//! machine. The charts are drawn here rather than by a plotting library: axes with ticks and
//! units, a time axis in seconds, a legend, a fixed palette; series longer than the plot is wide
//! are reduced to the minimum and maximum of each pixel column, so a one-sample spike still
//! shows. All text is HTML-escaped (paths and command lines may hold `<`, `&` or `"`).

use std::fmt::Write as _;

/// A whole report: what [`render`] turns into one HTML page.
#[derive(Debug, Clone, Default)]
pub(crate) struct HtmlReport {
    /// The page's heading and `<title>`.
    pub title: String,
    /// One line under the heading (the command, the dataset).
    pub subtitle: String,
    /// Key facts shown as a grid of name/value pairs under the heading.
    pub meta: Vec<(String, String)>,
    /// Findings, shown as cards coloured by severity, before the charts.
    pub verdicts: Vec<HtmlVerdict>,
    /// Line charts over time.
    pub charts: Vec<Chart>,
    /// Tables, after the charts.
    pub tables: Vec<Table>,
}

/// One finding: what the numbers say and what to change.
#[derive(Debug, Clone, Default)]
pub(crate) struct HtmlVerdict {
    /// `"ok"`, `"warning"` or `"problem"` (anything else is shown as a warning).
    pub severity: String,
    /// One line: the finding.
    pub title: String,
    /// The numbers behind it.
    pub evidence: String,
    /// What to change (may be empty).
    pub fix: String,
}

/// A line chart over time.
#[derive(Debug, Clone, Default)]
pub(crate) struct Chart {
    /// Heading of the chart.
    pub title: String,
    /// Unit of the values (shown on the y axis and in the legend), e.g. `images/s`, `MiB`.
    pub unit: String,
    /// Top of the y axis (e.g. 100 for a percentage); raised when a value exceeds it. `None`:
    /// from the data.
    pub y_max: Option<f64>,
    /// The lines.
    pub series: Vec<Series>,
    /// Moments to mark with a dashed vertical line and a label: `(seconds since start, label)`,
    /// e.g. the start of each epoch.
    pub markers: Vec<(f64, String)>,
}

/// One line of a chart.
#[derive(Debug, Clone, Default)]
pub(crate) struct Series {
    /// Legend text.
    pub name: String,
    /// `(seconds since start, value)`; non-finite times or values are skipped.
    pub points: Vec<(f64, f64)>,
    /// Palette index of the line's colour ([`PALETTE`], taken modulo its length). `None`: the
    /// series' position in its chart. Give the same index to the same thing in every chart
    /// (one process, one GPU) to keep its colour across charts.
    pub color: Option<usize>,
}

impl Series {
    /// A series coloured by its position in its chart.
    pub fn new(name: impl Into<String>, points: Vec<(f64, f64)>) -> Self {
        Series { name: name.into(), points, color: None }
    }

    /// The same series drawn in palette colour `index`.
    pub fn color(mut self, index: usize) -> Self {
        self.color = Some(index);
        self
    }
}

/// A table with a header row.
#[derive(Debug, Clone, Default)]
pub(crate) struct Table {
    /// Heading of the table.
    pub title: String,
    /// Column names.
    pub header: Vec<String>,
    /// Cells, row by row (a cell that reads as a number is right-aligned).
    pub rows: Vec<Vec<String>>,
}

/// The line colours, in order: distinct hues, none of them grey (so that they cannot be
/// confused with text or axes, in a screenshot either).
pub(crate) const PALETTE: [&str; 10] =
    ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#17becf", "#bcbd22", "#393b79"];

/// The colour of series `k` of a chart.
pub(crate) fn series_color(s: &Series, k: usize) -> &'static str {
    PALETTE[s.color.unwrap_or(k) % PALETTE.len()]
}

/// Width of a chart's SVG, in CSS pixels (the page is laid out for 1200 px).
const WIDTH: f64 = 1100.0;
/// Height of a chart's SVG.
const HEIGHT: f64 = 260.0;
/// Plot area margins: left (y labels), right, top, bottom (x labels).
const MARGIN: (f64, f64, f64, f64) = (72.0, 16.0, 12.0, 40.0);

const STYLE: &str = "\
body{font-family:system-ui,-apple-system,'Segoe UI',Roboto,'DejaVu Sans',sans-serif;color:#222;\
background:#fff;margin:0 auto;max-width:1140px;padding:16px 20px 40px}\
h1{font-size:24px;margin:4px 0}h2{font-size:18px;margin:28px 0 8px}h3{font-size:15px;margin:0 0 4px}\
.sub{color:#555;margin:0 0 12px;word-break:break-all}\
dl.meta{display:grid;grid-template-columns:max-content 1fr max-content 1fr;gap:4px 14px;margin:8px 0;font-size:14px}\
dl.meta dt{color:#555}dl.meta dd{margin:0;word-break:break-all}\
.verdict{border-left:6px solid;border-radius:4px;padding:8px 12px;margin:8px 0;font-size:14px}\
.verdict p{margin:2px 0}.verdict .fix{font-weight:600}\
.ok{border-color:#3a8a3f;background:#eef7ee}.warning{border-color:#d49a00;background:#fff7e0}\
.problem{border-color:#b3261e;background:#fdecea}\
.chart{margin:10px 0 18px}.chart svg{display:block;max-width:100%;height:auto}\
.legend{font-size:13px;margin:2px 0 0 72px}.key{display:inline-block;margin-right:18px}\
.key i{display:inline-block;width:14px;height:3px;vertical-align:middle;margin-right:6px}\
.nodata{color:#b3261e}\
table{border-collapse:collapse;font-size:14px;margin:4px 0}\
th,td{border-bottom:1px solid #ddd;padding:4px 12px;text-align:left}th{background:#f4f4f4}\
td.num{text-align:right;font-variant-numeric:tabular-nums}\
footer{margin-top:30px;color:#777;font-size:12px}";

/// The page: heading, facts, verdicts, charts, tables, in one self-contained HTML document.
pub(crate) fn render(r: &HtmlReport) -> String {
    let mut h = String::with_capacity(64 * 1024);
    let _ = write!(
        h,
        "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n\
         <meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n\
         <title>{}</title>\n<style>{STYLE}</style>\n</head>\n<body>\n<h1>{}</h1>\n",
        esc(&r.title),
        esc(&r.title)
    );
    if !r.subtitle.is_empty() {
        let _ = writeln!(h, "<p class=\"sub\">{}</p>", esc(&r.subtitle));
    }
    if !r.meta.is_empty() {
        h.push_str("<dl class=\"meta\">\n");
        for (k, v) in &r.meta {
            let _ = writeln!(h, "<dt>{}</dt><dd>{}</dd>", esc(k), esc(v));
        }
        h.push_str("</dl>\n");
    }
    if !r.verdicts.is_empty() {
        h.push_str("<h2>Verdicts</h2>\n");
        for v in &r.verdicts {
            let class = match v.severity.as_str() {
                "ok" => "ok",
                "problem" => "problem",
                _ => "warning",
            };
            let _ = write!(h, "<div class=\"verdict {class}\"><h3>{}</h3>", esc(&v.title));
            if !v.evidence.is_empty() {
                let _ = write!(h, "<p>{}</p>", esc(&v.evidence));
            }
            if !v.fix.is_empty() {
                let _ = write!(h, "<p class=\"fix\">&rarr; {}</p>", esc(&v.fix));
            }
            h.push_str("</div>\n");
        }
    }
    if !r.charts.is_empty() {
        h.push_str("<h2>Over time</h2>\n");
        for (k, c) in r.charts.iter().enumerate() {
            chart(&mut h, c, k);
        }
    }
    for t in &r.tables {
        table(&mut h, t);
    }
    let _ = write!(h, "<footer>stoker {}</footer>\n</body>\n</html>\n", env!("CARGO_PKG_VERSION"));
    h
}

/// Escapes text for HTML content and quoted attribute values.
pub(crate) fn esc(s: &str) -> String {
    let mut o = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => o.push_str("&amp;"),
            '<' => o.push_str("&lt;"),
            '>' => o.push_str("&gt;"),
            '"' => o.push_str("&quot;"),
            '\'' => o.push_str("&#39;"),
            c => o.push(c),
        }
    }
    o
}

fn table(h: &mut String, t: &Table) {
    let _ = writeln!(h, "<h2>{}</h2>\n<table>", esc(&t.title));
    if !t.header.is_empty() {
        h.push_str("<tr>");
        for c in &t.header {
            let _ = write!(h, "<th>{}</th>", esc(c));
        }
        h.push_str("</tr>\n");
    }
    // A column whose cells all read as numbers (`12`, `0.25`, `83%`) is right-aligned.
    let is_number = |c: &str| c.trim_end_matches('%').trim().parse::<f64>().is_ok();
    let width = t.rows.iter().map(Vec::len).max().unwrap_or(0);
    let numeric: Vec<bool> = (0..width)
        .map(|k| {
            let mut cells = t.rows.iter().filter_map(|r| r.get(k)).filter(|c| !c.is_empty()).peekable();
            cells.peek().is_some() && cells.all(|c| is_number(c))
        })
        .collect();
    for row in &t.rows {
        h.push_str("<tr>");
        for (k, c) in row.iter().enumerate() {
            let class = if numeric[k] { " class=\"num\"" } else { "" };
            let _ = write!(h, "<td{class}>{}</td>", esc(c));
        }
        h.push_str("</tr>\n");
    }
    h.push_str("</table>\n");
}

/// A series' finite points, in time order.
fn finite(points: &[(f64, f64)]) -> Vec<(f64, f64)> {
    let mut p: Vec<(f64, f64)> = points.iter().copied().filter(|(t, v)| t.is_finite() && v.is_finite()).collect();
    p.sort_by(|a, b| a.0.total_cmp(&b.0));
    p
}

/// Reduces time-ordered `points` spread over `[x0, x1]` to at most two per pixel column of a
/// plot `width` pixels wide: the minimum and the maximum of each column, in the order they
/// occurred, so that the line still reaches every extreme. Short series are returned as they
/// are.
pub(crate) fn downsample(points: &[(f64, f64)], x0: f64, x1: f64, width: usize) -> Vec<(f64, f64)> {
    if points.len() <= 2 * width || width == 0 || x1 <= x0 {
        return points.to_vec();
    }
    let column = |t: f64| (((t - x0) / (x1 - x0) * width as f64) as usize).min(width - 1);
    let mut out = Vec::with_capacity(2 * width);
    let mut i = 0;
    while i < points.len() {
        let c = column(points[i].0);
        let (mut lo, mut hi) = (i, i);
        let mut j = i + 1;
        while j < points.len() && column(points[j].0) == c {
            if points[j].1 < points[lo].1 {
                lo = j;
            }
            if points[j].1 > points[hi].1 {
                hi = j;
            }
            j += 1;
        }
        out.push(points[lo.min(hi)]);
        if lo != hi {
            out.push(points[lo.max(hi)]);
        }
        i = j;
    }
    out
}

/// Tick positions over `[lo, hi]`: multiples of 1, 2 or 5 × 10^k, about `n` of them.
fn ticks(lo: f64, hi: f64, n: usize) -> (f64, Vec<f64>) {
    let span = (hi - lo).max(1e-12);
    let raw = span / n.max(1) as f64;
    let mag = 10f64.powf(raw.log10().floor());
    let step = [1.0, 2.0, 5.0, 10.0].iter().map(|m| m * mag).find(|s| *s >= raw).unwrap_or(10.0 * mag);
    let mut v = vec![];
    let mut k = (lo / step).ceil();
    while k * step <= hi + step * 1e-9 {
        v.push(k * step);
        k += 1.0;
    }
    (step, v)
}

/// The smallest tick multiple at or above `x` (a "nice" axis end).
fn nice_ceil(x: f64) -> f64 {
    if x <= 0.0 {
        return 1.0;
    }
    let (step, _) = ticks(0.0, x, 5);
    (x / step).ceil() * step
}

/// A tick label with as many decimals as the step needs; with `si`, thousands as `k` and
/// millions as `M`.
fn label(v: f64, step: f64, si: bool) -> String {
    let (v, step, suffix) = if !si {
        (v, step, "")
    } else if step >= 1e6 {
        (v / 1e6, step / 1e6, "M")
    } else if step >= 1e3 {
        (v / 1e3, step / 1e3, "k")
    } else {
        (v, step, "")
    };
    let decimals = if step >= 1.0 { 0 } else { (-step.log10().floor()) as usize };
    // A tick at zero computed as -0.0 or 1e-17 is shown as 0.
    let v = if v.abs() < step * 1e-6 { 0.0 } else { v };
    format!("{v:.decimals$}{suffix}")
}

/// A value for the legend (3 significant digits or an integer).
fn short(v: f64) -> String {
    let a = v.abs();
    if a >= 100.0 {
        format!("{v:.0}")
    } else if a >= 10.0 {
        format!("{v:.1}")
    } else {
        format!("{v:.2}")
    }
}

/// Chart number `k` of the page (`k` makes its clip path's id unique).
fn chart(h: &mut String, c: &Chart, k: usize) {
    let series: Vec<Vec<(f64, f64)>> = c.series.iter().map(|s| finite(&s.points)).collect();
    let all = || series.iter().flatten();
    let _ = writeln!(h, "<div class=\"chart\"><h3>{} ({})</h3>", esc(&c.title), esc(&c.unit));
    let (l, r, t, b) = MARGIN;
    let (pw, ph) = (WIDTH - l - r, HEIGHT - t - b);
    let _ = writeln!(
        h,
        "<svg width=\"{WIDTH}\" height=\"{HEIGHT}\" viewBox=\"0 0 {WIDTH} {HEIGHT}\" role=\"img\" \
         aria-label=\"{}\" font-size=\"12\" font-family=\"inherit\">",
        esc(&c.title)
    );
    let _ = writeln!(h, "<rect x=\"{l}\" y=\"{t}\" width=\"{pw}\" height=\"{ph}\" fill=\"#fcfcfc\" stroke=\"#bbb\"/>");
    if all().next().is_none() {
        let _ = writeln!(
            h,
            "<text class=\"nodata\" x=\"{}\" y=\"{}\" text-anchor=\"middle\" fill=\"#b3261e\" font-size=\"16\">no data</text>\n</svg>",
            l + pw / 2.0,
            t + ph / 2.0
        );
        h.push_str("<p class=\"legend nodata\">no data recorded for this chart</p>\n</div>\n");
        return;
    }
    let x0 = all().map(|p| p.0).fold(f64::INFINITY, f64::min).min(0.0);
    let mut x1 = all().map(|p| p.0).fold(f64::NEG_INFINITY, f64::max);
    if x1 <= x0 {
        x1 = x0 + 1.0;
    }
    let vmin = all().map(|p| p.1).fold(f64::INFINITY, f64::min);
    let vmax = all().map(|p| p.1).fold(f64::NEG_INFINITY, f64::max);
    let y0 = if vmin < 0.0 { -nice_ceil(-vmin) } else { 0.0 };
    let mut y1 = match c.y_max {
        Some(m) if m.is_finite() && m > y0 && vmax <= m => m,
        _ => nice_ceil(vmax),
    };
    if y1 <= y0 {
        y1 = y0 + 1.0;
    }
    let px = |x: f64| l + (x - x0) / (x1 - x0) * pw;
    let py = |y: f64| t + ph - (y - y0) / (y1 - y0) * ph;
    // Grid and y labels.
    let (ystep, yt) = ticks(y0, y1, 5);
    for v in yt {
        let y = py(v);
        let _ = writeln!(
            h,
            "<line x1=\"{l}\" x2=\"{:.1}\" y1=\"{y:.1}\" y2=\"{y:.1}\" stroke=\"#e3e3e3\"/>\
             <text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"end\" fill=\"#444\">{}</text>",
            l + pw,
            l - 6.0,
            y + 4.0,
            esc(&label(v, ystep, true))
        );
    }
    let (xstep, xt) = ticks(x0, x1, 10);
    for v in xt {
        let x = px(v);
        let _ = writeln!(
            h,
            "<line x1=\"{x:.1}\" x2=\"{x:.1}\" y1=\"{:.1}\" y2=\"{:.1}\" stroke=\"#888\"/>\
             <text x=\"{x:.1}\" y=\"{:.1}\" text-anchor=\"middle\" fill=\"#444\">{}</text>",
            t + ph,
            t + ph + 5.0,
            t + ph + 18.0,
            esc(&label(v, xstep, false))
        );
    }
    let _ = writeln!(
        h,
        "<text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"middle\" fill=\"#444\">time (s)</text>\
         <text transform=\"translate(14 {:.1}) rotate(-90)\" text-anchor=\"middle\" fill=\"#444\">{}</text>",
        l + pw / 2.0,
        HEIGHT - 4.0,
        t + ph / 2.0,
        esc(&c.unit)
    );
    // Markers: a dashed line each; a label where it does not run into the previous one.
    let mut labelled = f64::NEG_INFINITY;
    for (mt, text) in &c.markers {
        if !mt.is_finite() || *mt < x0 || *mt > x1 {
            continue;
        }
        let x = px(*mt);
        let _ = writeln!(
            h,
            "<line class=\"marker\" x1=\"{x:.1}\" x2=\"{x:.1}\" y1=\"{t}\" y2=\"{:.1}\" stroke=\"#999\" stroke-dasharray=\"4 3\"/>",
            t + ph
        );
        if x - labelled >= 70.0 {
            labelled = x;
            let _ = writeln!(
                h,
                "<text x=\"{:.1}\" y=\"{:.1}\" font-size=\"11\" fill=\"#666\">{}</text>",
                x + 3.0,
                t + 11.0,
                esc(text)
            );
        }
    }
    // The lines, clipped to the plot area.
    let _ = writeln!(
        h,
        "<clipPath id=\"clip{k}\"><rect x=\"{l}\" y=\"{:.1}\" width=\"{pw}\" height=\"{:.1}\"/></clipPath>",
        t - 2.0,
        ph + 4.0
    );
    for (i, (s, pts)) in c.series.iter().zip(&series).enumerate() {
        if pts.is_empty() {
            continue;
        }
        let color = series_color(s, i);
        let pts = downsample(pts, x0, x1, pw as usize);
        if pts.len() == 1 {
            let _ = writeln!(
                h,
                "<circle class=\"series\" cx=\"{:.1}\" cy=\"{:.1}\" r=\"4\" fill=\"{color}\"><title>{}</title></circle>",
                px(pts[0].0),
                py(pts[0].1),
                esc(&s.name)
            );
            continue;
        }
        let mut d = String::with_capacity(pts.len() * 14);
        for (i, (x, y)) in pts.iter().enumerate() {
            let _ = write!(d, "{}{:.1} {:.1}", if i == 0 { "M" } else { "L" }, px(*x), py(*y));
        }
        let _ = writeln!(
            h,
            "<path class=\"series\" data-series=\"{}\" d=\"{d}\" fill=\"none\" stroke=\"{color}\" stroke-width=\"2\" \
             stroke-linejoin=\"round\" stroke-linecap=\"round\" clip-path=\"url(#clip{k})\"><title>{}</title></path>",
            esc(&s.name),
            esc(&s.name)
        );
    }
    h.push_str("</svg>\n<div class=\"legend\">");
    for (i, (s, pts)) in c.series.iter().zip(&series).enumerate() {
        let stats = if pts.is_empty() {
            " <span class=\"nodata\">(no data)</span>".to_string()
        } else {
            let max = pts.iter().map(|p| p.1).fold(f64::NEG_INFINITY, f64::max);
            let mean = pts.iter().map(|p| p.1).sum::<f64>() / pts.len() as f64;
            format!(" &mdash; mean {}, max {} {}", short(mean), short(max), esc(&c.unit))
        };
        let _ = write!(
            h,
            "<span class=\"key\"><i style=\"background:{}\"></i>{}{stats}</span>",
            series_color(s, i),
            esc(&s.name)
        );
    }
    h.push_str("</div>\n</div>\n");
}

#[cfg(test)]
mod tests {
    use super::*;

    fn report(charts: Vec<Chart>) -> HtmlReport {
        HtmlReport {
            title: "stoker bench".into(),
            subtitle: "stoker bench /data".into(),
            meta: vec![("images/s".into(), "123.4".into())],
            verdicts: vec![HtmlVerdict {
                severity: "problem".into(),
                title: "decode-bound".into(),
                evidence: "threads 100% busy".into(),
                fix: "raise threads".into(),
            }],
            charts,
            tables: vec![Table {
                title: "Stages".into(),
                header: vec!["stage".into(), "items".into()],
                rows: vec![vec!["decode".into(), "17".into()]],
            }],
        }
    }

    fn ramp(n: usize) -> Vec<(f64, f64)> {
        (0..n).map(|i| (i as f64 * 0.1, i as f64)).collect()
    }

    #[test]
    fn text_is_escaped_everywhere() {
        let nasty = "<script>alert(\"x\")</script> & 'q'";
        let mut r = report(vec![Chart {
            title: nasty.into(),
            unit: nasty.into(),
            y_max: None,
            series: vec![Series::new(nasty, ramp(5))],
            markers: vec![],
        }]);
        r.title = nasty.into();
        r.subtitle = nasty.into();
        r.meta.push((nasty.into(), nasty.into()));
        r.verdicts[0].fix = nasty.into();
        r.tables[0].rows.push(vec![nasty.into(), nasty.into()]);
        let h = render(&r);
        assert!(!h.contains("<script"), "unescaped tag in output");
        assert!(!h.contains("\"x\""));
        assert!(h.contains("&lt;script&gt;alert(&quot;x&quot;)&lt;/script&gt; &amp; &#39;q&#39;"));
        assert_eq!(esc("a<b>&\"c'"), "a&lt;b&gt;&amp;&quot;c&#39;");
    }

    #[test]
    fn downsampling_keeps_the_extremes_of_each_column() {
        // 100 000 points of a flat line with one spike up and one down.
        let mut p: Vec<(f64, f64)> = (0..100_000).map(|i| (i as f64 * 1e-3, 1.0)).collect();
        p[31_337].1 = 1000.0;
        p[77_777].1 = -50.0;
        let d = downsample(&p, 0.0, 100.0, 1000);
        assert!(d.len() <= 2000, "{} points", d.len());
        assert!(d.len() >= 1000, "{} points", d.len());
        assert!(d.contains(&(31.337, 1000.0)), "the spike up was lost");
        assert!(d.contains(&(77.777, -50.0)), "the spike down was lost");
        assert!(d.windows(2).all(|w| w[0].0 < w[1].0), "not in time order");
        // Short series are kept whole.
        assert_eq!(downsample(&p[..50], 0.0, 100.0, 1000), p[..50].to_vec());
    }

    #[test]
    fn non_finite_values_are_skipped() {
        let pts = vec![(0.0, 1.0), (1.0, f64::NAN), (2.0, f64::INFINITY), (f64::NAN, 3.0), (3.0, 2.0)];
        assert_eq!(finite(&pts), vec![(0.0, 1.0), (3.0, 2.0)]);
        let h = render(&report(vec![Chart {
            title: "t".into(),
            unit: "u".into(),
            y_max: None,
            series: vec![Series::new("s", pts)],
            markers: vec![],
        }]));
        assert!(!h.contains("NaN") && !h.contains("inf"), "a non-finite value reached the SVG");
        assert_eq!(h.matches("<path class=\"series\"").count(), 1);
        // Only non-finite points: that series has no data, the chart says so.
        let h = render(&report(vec![Chart {
            title: "t".into(),
            unit: "u".into(),
            y_max: None,
            series: vec![Series::new("s", vec![(0.0, f64::NAN), (1.0, f64::NEG_INFINITY)])],
            markers: vec![],
        }]));
        assert!(h.contains(">no data</text>"));
    }

    #[test]
    fn an_empty_chart_says_no_data() {
        let h = render(&report(vec![
            Chart { title: "nothing".into(), unit: "u".into(), y_max: None, series: vec![], markers: vec![] },
            Chart {
                title: "empty series".into(),
                unit: "u".into(),
                y_max: Some(100.0),
                series: vec![Series::new("a", vec![])],
                markers: vec![],
            },
        ]));
        assert_eq!(h.matches(">no data</text>").count(), 2);
        assert!(!h.contains("class=\"series\""));
        assert_eq!(h.matches("<svg").count(), h.matches("</svg>").count());
        // One empty series next to a full one: only the legend entry says so.
        let h = render(&report(vec![Chart {
            title: "half".into(),
            unit: "u".into(),
            y_max: None,
            series: vec![Series::new("full", ramp(10)), Series::new("empty", vec![])],
            markers: vec![],
        }]));
        assert!(!h.contains(">no data</text>"));
        assert!(h.contains("empty <span class=\"nodata\">(no data)</span>"));
        assert_eq!(h.matches("<path class=\"series\"").count(), 1);
    }

    #[test]
    fn nothing_is_fetched_from_elsewhere() {
        let mut series: Vec<Series> = (0..12).map(|k| Series::new(format!("s{k}"), ramp(100 + k))).collect();
        series.push(Series::new("one point", vec![(1.0, 2.0)]));
        let h =
            render(&report(vec![Chart { title: "c".into(), unit: "u".into(), y_max: None, series, markers: vec![] }]));
        for bad in ["http://", "https://", "src=", "href=", "@import", "<script", "<link", "<img"] {
            assert!(!h.contains(bad), "found {bad}");
        }
        assert!(h.starts_with("<!DOCTYPE html>") && h.ends_with("</html>\n"));
    }

    #[test]
    fn only_columns_of_numbers_are_right_aligned() {
        let mut r = report(vec![]);
        r.tables[0].rows =
            vec![vec!["decode".into(), "17".into(), "8".into()], vec!["ops".into(), "83%".into(), "auto".into()]];
        let h = render(&r);
        assert!(h.contains("<tr><td>decode</td><td class=\"num\">17</td><td>8</td></tr>"), "{h}");
        assert!(h.contains("<tr><td>ops</td><td class=\"num\">83%</td><td>auto</td></tr>"), "{h}");
    }

    #[test]
    fn charts_have_axes_units_legend_and_palette_colours() {
        let h = render(&report(vec![Chart {
            title: "throughput".into(),
            unit: "images/s".into(),
            y_max: None,
            series: vec![Series::new("a", ramp(30)), Series::new("b", ramp(30)).color(4)],
            markers: vec![],
        }]));
        assert!(h.contains("time (s)") && h.contains(">images/s</text>"));
        assert!(h.contains(&format!("stroke=\"{}\"", PALETTE[0])));
        assert!(h.contains(&format!("stroke=\"{}\"", PALETTE[4])));
        assert!(h.contains("<span class=\"key\">"));
        // The y axis of 0..29 ends at 30 with ticks every 10; the time axis spans 0..2.9 s.
        assert!(h.contains(">30</text>") && h.contains(">20</text>") && !h.contains(">25</text>"));
        assert!(h.contains(">2.5</text>"));
    }

    #[test]
    fn markers_draw_a_line_and_a_label_inside_the_time_axis() {
        let markers = vec![
            (0.0, "epoch 1".to_string()),
            (1.5, "epoch <2>".to_string()),
            (1.55, "too close to label".to_string()),
            (f64::NAN, "nan".to_string()),
            (99.0, "after the end".to_string()),
        ];
        let h = render(&report(vec![Chart {
            title: "c".into(),
            unit: "u".into(),
            y_max: None,
            series: vec![Series::new("a", ramp(30))],
            markers,
        }]));
        assert_eq!(h.matches("class=\"marker\"").count(), 3);
        assert!(h.contains(">epoch 1</text>") && h.contains(">epoch &lt;2&gt;</text>"));
        assert!(!h.contains("too close") && !h.contains(">nan<") && !h.contains("after the end"));
    }

    #[test]
    fn ticks_and_labels_are_round() {
        let (step, t) = ticks(0.0, 100.0, 5);
        assert_eq!(step, 20.0);
        assert_eq!(t, vec![0.0, 20.0, 40.0, 60.0, 80.0, 100.0]);
        assert_eq!(nice_ceil(2345.0), 2500.0);
        assert_eq!(label(2500.0, 500.0, true), "2500");
        assert_eq!(label(25_000.0, 5000.0, true), "25k");
        assert_eq!(label(25_000.0, 5000.0, false), "25000");
        assert_eq!(label(0.30000000000000004, 0.1, true), "0.3");
        assert_eq!(label(-0.0, 0.5, true), "0.0");
    }
}
