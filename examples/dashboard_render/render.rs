//! Draws the panels of a Grafana dashboard (deploy/grafana/nodelet-dashboard.json) from scrapes of
//! nodelet's metrics into an SVG, in the dashboard's grid layout. It is not Grafana: it evaluates the
//! subset of PromQL the dashboard uses over the scrapes it is given.
//!
//! - Selectors with `=`, `!=`, `=~`, `!~` matchers (template variables replaced: `$instance` → `.*`).
//! - `rate()` and `increase()` over the scrapes inside the range: (last − first) / elapsed, and last −
//!   first, without Prometheus's extrapolation to the range's edges; a counter reset counts from 0.
//! - `sum`, `max`, `min`, `avg`, `count` with `by (…)` / `without (…)`.
//! - `histogram_quantile()` with Prometheus's linear interpolation inside the bucket.
//! - Comparisons with a number as filters (`… > 0`).
//!
//! Anything else (arithmetic, vector-to-vector operators, other functions) draws the panel with a note instead of data.
//! Shared by `examples/dashboard_render/main.rs` and `tests/daemon/deploy.rs`.

use std::collections::BTreeMap;
use std::path::Path;

use plotters::prelude::*;
use promql_parser::parser::{Expr, LabelModifier, VectorSelector};
use serde_json::Value;

/// A label set (without `__name__`).
pub(crate) type Labels = BTreeMap<String, String>;

/// One scrape of every endpoint at time `t` (seconds).
#[derive(Debug, Clone, Default)]
pub(crate) struct Scrape {
    /// Seconds since the first scrape.
    pub(crate) t: f64,
    /// Samples: (metric name, labels, value).
    pub(crate) samples: Vec<(String, Labels, f64)>,
}

impl Scrape {
    /// Adds the samples of a Prometheus text exposition with the labels Prometheus would attach to the
    /// target (`job`, `instance`, …; see [`target_labels`]).
    pub(crate) fn add_exposition(&mut self, text: &str, target: &Labels) {
        for line in text.lines().filter(|l| !l.starts_with('#') && !l.trim().is_empty()) {
            if let Some((name, mut labels, value)) = parse_sample(line) {
                for (k, v) in target {
                    labels.entry(k.clone()).or_insert_with(|| v.clone());
                }
                self.samples.push((name, labels, value));
            }
        }
    }
}

/// The labels deploy/prometheus/prometheus.yml gives a target: `job="nodelet"`, `instance` (host:port) and
/// `metrics_path`.
pub(crate) fn target_labels(instance: &str, metrics_path: &str) -> Labels {
    [("job", "nodelet"), ("instance", instance), ("metrics_path", metrics_path)]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect()
}

/// `name{a="x",b="y"} value [timestamp]`.
fn parse_sample(line: &str) -> Option<(String, Labels, f64)> {
    let (series, rest) = match line.find('{') {
        Some(_) => {
            let close = line.rfind('}')?;
            (&line[..close + 1], &line[close + 1..])
        }
        None => line.split_once(' ')?,
    };
    let value: f64 = match rest.split_whitespace().next()? {
        "+Inf" => f64::INFINITY,
        "-Inf" => f64::NEG_INFINITY,
        v => v.parse().ok()?,
    };
    let (name, labels) = match series.find('{') {
        Some(open) => (&series[..open], parse_labels(&series[open + 1..series.len() - 1])?),
        None => (series, Labels::new()),
    };
    Some((name.to_owned(), labels, value))
}

fn parse_labels(mut s: &str) -> Option<Labels> {
    let mut out = Labels::new();
    loop {
        s = s.trim_start_matches([',', ' ']);
        if s.is_empty() {
            return Some(out);
        }
        let (name, rest) = s.split_once("=\"")?;
        let mut value = String::new();
        let mut chars = rest.char_indices();
        let end = loop {
            match chars.next()? {
                (_, '\\') => match chars.next()? {
                    (_, 'n') => value.push('\n'),
                    (_, c) => value.push(c),
                },
                (i, '"') => break i,
                (_, c) => value.push(c),
            }
        };
        out.insert(name.trim().to_owned(), value);
        s = &rest[end + 1..];
    }
}

/// The value of an expression at one scrape.
#[derive(Debug, Clone)]
enum Val {
    Scalar(f64),
    Vector(Vec<(Labels, f64)>),
}

/// Evaluates `expr` at scrape `i` of `scrapes`.
fn eval(e: &Expr, scrapes: &[Scrape], i: usize) -> Result<Val, String> {
    match e {
        Expr::NumberLiteral(n) => Ok(Val::Scalar(n.val)),
        Expr::Paren(p) => eval(&p.expr, scrapes, i),
        Expr::VectorSelector(v) => Ok(Val::Vector(select(v, &scrapes[i]))),
        Expr::Call(c) => match c.func.name {
            "rate" | "increase" => {
                let Some(Expr::MatrixSelector(m)) = c.args.args.first().map(|a| a.as_ref()) else {
                    return Err(format!("{}() of something else than a range selector", c.func.name));
                };
                let range = m.range.as_secs_f64();
                let now = scrapes[i].t;
                let mut points: BTreeMap<Labels, Vec<(f64, f64)>> = BTreeMap::new();
                for s in scrapes[..=i].iter().filter(|s| s.t > now - range) {
                    for (labels, v) in select(&m.vs, s) {
                        points.entry(labels).or_default().push((s.t, v));
                    }
                }
                let out = points
                    .into_iter()
                    .filter_map(|(labels, p)| {
                        let elapsed = p.last()?.0 - p.first()?.0;
                        if elapsed <= 0.0 {
                            return None;
                        }
                        // a value lower than the one before: the counter restarted from 0
                        let increase: f64 = p
                            .windows(2)
                            .map(|w| if w[1].1 >= w[0].1 { w[1].1 - w[0].1 } else { w[1].1 })
                            .sum();
                        let v = if c.func.name == "rate" { increase / elapsed } else { increase };
                        Some((labels, v))
                    })
                    .collect();
                Ok(Val::Vector(out))
            }
            "histogram_quantile" => {
                let (Some(q), Some(v)) = (c.args.args.first(), c.args.args.get(1)) else {
                    return Err("histogram_quantile() needs two arguments".into());
                };
                let Val::Scalar(q) = eval(q, scrapes, i)? else {
                    return Err("quantile is not a number".into());
                };
                let Val::Vector(buckets) = eval(v, scrapes, i)? else { return Err("no buckets".into()) };
                let mut groups: BTreeMap<Labels, Vec<(f64, f64)>> = BTreeMap::new();
                for (mut labels, count) in buckets {
                    let Some(le) = labels.remove("le") else { continue };
                    let le = if le == "+Inf" { f64::INFINITY } else { le.parse().unwrap_or(f64::NAN) };
                    groups.entry(labels).or_default().push((le, count));
                }
                let out = groups
                    .into_iter()
                    .map(|(labels, b)| (labels, bucket_quantile(q, b)))
                    .filter(|(_, v)| v.is_finite())
                    .collect();
                Ok(Val::Vector(out))
            }
            other => Err(format!("function {other}() is not supported by the renderer")),
        },
        Expr::Aggregate(a) => {
            let Val::Vector(input) = eval(&a.expr, scrapes, i)? else {
                return Err("aggregate of a number".into());
            };
            let mut groups: BTreeMap<Labels, Vec<f64>> = BTreeMap::new();
            for (labels, v) in input {
                let key: Labels = match &a.modifier {
                    Some(LabelModifier::Include(keep)) => {
                        labels.into_iter().filter(|(k, _)| keep.labels.contains(k)).collect()
                    }
                    Some(LabelModifier::Exclude(drop)) => {
                        labels.into_iter().filter(|(k, _)| !drop.labels.contains(k)).collect()
                    }
                    None => Labels::new(),
                };
                groups.entry(key).or_default().push(v);
            }
            let op = a.op.to_string();
            let out = groups
                .into_iter()
                .map(|(k, vs)| {
                    let n = vs.len() as f64;
                    let v = match op.as_str() {
                        "sum" => Ok(vs.iter().sum()),
                        "max" => Ok(vs.iter().copied().fold(f64::NEG_INFINITY, f64::max)),
                        "min" => Ok(vs.iter().copied().fold(f64::INFINITY, f64::min)),
                        "avg" => Ok(vs.iter().sum::<f64>() / n),
                        "count" => Ok(n),
                        other => Err(format!("aggregation {other} is not supported by the renderer")),
                    }?;
                    Ok((k, v))
                })
                .collect::<Result<Vec<_>, String>>()?;
            Ok(Val::Vector(out))
        }
        Expr::Binary(b) => {
            // a filter: <vector> <comparison> <number>
            let (Val::Vector(lhs), Val::Scalar(rhs)) = (eval(&b.lhs, scrapes, i)?, eval(&b.rhs, scrapes, i)?)
            else {
                return Err(format!("{e} is not supported by the renderer (only vector <op> number)"));
            };
            let op = b.op.to_string();
            let keep = |v: f64| match op.as_str() {
                ">" => Ok(v > rhs),
                "<" => Ok(v < rhs),
                ">=" => Ok(v >= rhs),
                "<=" => Ok(v <= rhs),
                "==" => Ok(v == rhs),
                "!=" => Ok(v != rhs),
                other => Err(format!("operator {other} is not supported by the renderer")),
            };
            let mut out = Vec::new();
            for (labels, v) in lhs {
                if keep(v)? {
                    out.push((labels, v));
                }
            }
            Ok(Val::Vector(out))
        }
        other => Err(format!("{other} is not supported by the renderer")),
    }
}

fn select(v: &VectorSelector, scrape: &Scrape) -> Vec<(Labels, f64)> {
    scrape
        .samples
        .iter()
        .filter(|(name, labels, _)| {
            v.name.as_deref().is_none_or(|n| n == name)
                && v.matchers
                    .matchers
                    .iter()
                    .all(|m| m.is_match(labels.get(&m.name).map_or("", String::as_str)))
        })
        .map(|(_, labels, value)| (labels.clone(), *value))
        .collect()
}

/// Prometheus's `bucketQuantile`: the upper bound of the bucket holding rank q·count, interpolated
/// linearly inside it; NaN without observations or without a `+Inf` bucket.
fn bucket_quantile(q: f64, mut buckets: Vec<(f64, f64)>) -> f64 {
    buckets.sort_by(|a, b| a.0.total_cmp(&b.0));
    let Some(&(top, total)) = buckets.last() else { return f64::NAN };
    if top != f64::INFINITY || buckets.len() < 2 || total <= 0.0 || !(0.0..=1.0).contains(&q) {
        return f64::NAN;
    }
    let rank = q * total;
    let Some(b) = buckets.iter().position(|(_, c)| *c >= rank) else { return f64::NAN };
    if b == buckets.len() - 1 {
        return buckets[buckets.len() - 2].0;
    }
    let (end, count) = buckets[b];
    let (start, below) = if b == 0 { (0.0_f64.min(end), 0.0) } else { buckets[b - 1] };
    if count - below <= 0.0 {
        return end;
    }
    start + (end - start) * ((rank - below) / (count - below))
}

/// One drawn series: its legend and its (t, value) points.
#[derive(Debug, Clone)]
pub(crate) struct Series {
    /// The legend (`legendFormat` with the labels filled in).
    pub(crate) legend: String,
    /// (seconds, value).
    pub(crate) points: Vec<(f64, f64)>,
}

/// What a panel showed.
#[derive(Debug, Clone)]
pub(crate) struct PanelData {
    /// The panel's title.
    pub(crate) title: String,
    /// `row`, `stat`, `timeseries`, …
    pub(crate) kind: String,
    /// Its series (empty: no data).
    pub(crate) series: Vec<Series>,
    /// Why a query could not be drawn.
    pub(crate) notes: Vec<String>,
}

fn legend(format: &str, labels: &Labels) -> String {
    let mut out = format.to_owned();
    for (k, v) in labels {
        out = out.replace(&format!("{{{{{k}}}}}"), v);
    }
    if out.is_empty() {
        out = labels.iter().map(|(k, v)| format!("{k}={v}")).collect::<Vec<_>>().join(", ");
    }
    out
}

/// Evaluates every panel's queries at every scrape.
pub(crate) fn evaluate(dashboard: &Value, scrapes: &[Scrape]) -> Vec<PanelData> {
    let mut out = Vec::new();
    for panel in dashboard["panels"].as_array().into_iter().flatten() {
        let mut data = PanelData {
            title: panel["title"].as_str().unwrap_or_default().to_owned(),
            kind: panel["type"].as_str().unwrap_or_default().to_owned(),
            series: Vec::new(),
            notes: Vec::new(),
        };
        for target in panel["targets"].as_array().into_iter().flatten() {
            let expr = target["expr"].as_str().unwrap_or_default().replace("$instance", ".*");
            let expr = expr.replace("$__rate_interval", "5m");
            let format = target["legendFormat"].as_str().unwrap_or_default();
            let parsed = match promql_parser::parser::parse(&expr) {
                Ok(p) => p,
                Err(e) => {
                    data.notes.push(format!("not PromQL: {e}"));
                    continue;
                }
            };
            let mut by_legend: BTreeMap<String, Vec<(f64, f64)>> = BTreeMap::new();
            for (i, scrape) in scrapes.iter().enumerate() {
                match eval(&parsed, scrapes, i) {
                    Ok(Val::Vector(v)) => {
                        for (labels, value) in v {
                            by_legend.entry(legend(format, &labels)).or_default().push((scrape.t, value));
                        }
                    }
                    Ok(Val::Scalar(v)) => by_legend.entry(format.to_owned()).or_default().push((scrape.t, v)),
                    Err(e) => {
                        data.notes.push(e);
                        break;
                    }
                }
            }
            data.series.extend(by_legend.into_iter().map(|(legend, points)| Series { legend, points }));
        }
        out.push(data);
    }
    out
}

/// A value with the panel's unit, short.
fn format_value(v: f64, unit: &str) -> String {
    let scaled = |v: f64, steps: &[(f64, &str)]| {
        let (div, suffix) = steps.iter().rev().find(|(d, _)| v.abs() >= *d).copied().unwrap_or(steps[0]);
        format!("{:.3}{suffix}", v / div).replace(".000", "")
    };
    match unit {
        "bytes" => scaled(v, &[(1.0, " B"), (1024.0, " KiB"), (1048576.0, " MiB"), (1073741824.0, " GiB")]),
        "s" => scaled(v, &[(1e-6, " µs"), (1e-3, " ms"), (1.0, " s"), (3600.0, " h"), (86400.0, " d")]),
        "ops" => format!("{} ops/s", scaled(v, &[(1.0, ""), (1e3, "k"), (1e6, "M")])),
        _ => scaled(v, &[(1.0, ""), (1e3, "k"), (1e6, "M"), (1e9, "G")]),
    }
}

const PALETTE: [RGBColor; 8] = [
    RGBColor(115, 191, 105),
    RGBColor(242, 204, 12),
    RGBColor(87, 148, 242),
    RGBColor(255, 120, 10),
    RGBColor(242, 73, 92),
    RGBColor(184, 119, 217),
    RGBColor(112, 219, 237),
    RGBColor(250, 222, 42),
];
const BACKGROUND: RGBColor = RGBColor(17, 18, 23);
const PANEL: RGBColor = RGBColor(24, 27, 31);
const TEXT: RGBColor = RGBColor(204, 204, 220);
const GRID: RGBColor = RGBColor(44, 50, 53);
const CAPTION: RGBColor = RGBColor(142, 142, 160);

/// Pixels per grid column and per grid row.
const COLUMN: i32 = 64;
const ROW: i32 = 30;

/// Draws `panels` (from [`evaluate`]) into `out` as an SVG in the dashboard's grid layout.
pub(crate) fn render(
    dashboard: &Value,
    panels: &[PanelData],
    caption: &str,
    out: &Path,
) -> Result<(), String> {
    let defs: Vec<&Value> = dashboard["panels"].as_array().into_iter().flatten().collect();
    let bottom = defs
        .iter()
        .map(|p| p["gridPos"]["y"].as_i64().unwrap_or(0) + p["gridPos"]["h"].as_i64().unwrap_or(0))
        .max()
        .unwrap_or(0) as i32;
    let header = 50;
    let (width, height) = (24 * COLUMN, header + bottom * ROW + 10);
    let root = SVGBackend::new(out, (width as u32, height as u32)).into_drawing_area();
    let err = |e: &dyn std::fmt::Display| e.to_string();
    root.fill(&BACKGROUND).map_err(|e| err(&e))?;
    let title = dashboard["title"].as_str().unwrap_or("dashboard");
    root.draw(&Text::new(title.to_owned(), (10, 8), ("sans-serif", 22).into_font().color(&TEXT)))
        .map_err(|e| err(&e))?;
    root.draw(&Text::new(caption.to_owned(), (10, 32), ("sans-serif", 13).into_font().color(&CAPTION)))
        .map_err(|e| err(&e))?;
    for (def, data) in defs.iter().zip(panels) {
        let g = &def["gridPos"];
        let [x, y, w, h] = ["x", "y", "w", "h"].map(|k| g[k].as_i64().unwrap_or(0) as i32);
        let (x0, y0) = (x * COLUMN + 4, header + y * ROW + 4);
        let (x1, y1) = ((x + w) * COLUMN - 4, header + (y + h) * ROW - 4);
        let area = root.clone().shrink((x0, y0), ((x1 - x0).max(1) as u32, (y1 - y0).max(1) as u32));
        let unit = def["fieldConfig"]["defaults"]["unit"].as_str().unwrap_or("short");
        match data.kind.as_str() {
            "row" => {
                area.draw(&Text::new(
                    data.title.clone(),
                    (0, 6),
                    ("sans-serif", 17).into_font().color(&TEXT),
                ))
                .map_err(|e| err(&e))?;
            }
            "stat" => {
                area.fill(&PANEL).map_err(|e| err(&e))?;
                area.draw(&Text::new(
                    data.title.clone(),
                    (8, 6),
                    ("sans-serif", 14).into_font().color(&TEXT),
                ))
                .map_err(|e| err(&e))?;
                let n = data.series.len().max(1) as i32;
                let cell = (x1 - x0) / n;
                for (k, s) in data.series.iter().enumerate() {
                    let color = PALETTE[k % PALETTE.len()];
                    let value = s.points.last().map_or("–".to_owned(), |p| format_value(p.1, unit));
                    let cx = k as i32 * cell + 8;
                    area.draw(&Text::new(value, (cx, 34), ("sans-serif", 28).into_font().color(&color)))
                        .map_err(|e| err(&e))?;
                    area.draw(&Text::new(
                        s.legend.clone(),
                        (cx, 76),
                        ("sans-serif", 12).into_font().color(&TEXT),
                    ))
                    .map_err(|e| err(&e))?;
                }
                if data.series.is_empty() {
                    area.draw(&Text::new("No data", (8, 40), ("sans-serif", 16).into_font().color(&TEXT)))
                        .map_err(|e| err(&e))?;
                }
            }
            _ => draw_timeseries(&area, data, unit).map_err(|e| err(&e))?,
        }
    }
    root.present().map_err(|e| err(&e))
}

fn draw_timeseries<DB: DrawingBackend>(
    area: &DrawingArea<DB, plotters::coord::Shift>,
    data: &PanelData,
    unit: &str,
) -> Result<(), DrawingAreaErrorKind<DB::ErrorType>> {
    area.fill(&PANEL)?;
    let points = data.series.iter().flat_map(|s| s.points.iter());
    let (mut t0, mut t1, mut lo, mut hi) =
        (f64::INFINITY, f64::NEG_INFINITY, f64::INFINITY, f64::NEG_INFINITY);
    for (t, v) in points {
        t0 = t0.min(*t);
        t1 = t1.max(*t);
        lo = lo.min(*v);
        hi = hi.max(*v);
    }
    let note = if data.series.is_empty() {
        Some(data.notes.first().cloned().unwrap_or_else(|| "No data".to_owned()))
    } else {
        None
    };
    if let Some(note) = note {
        area.draw(&Text::new(data.title.clone(), (8, 6), ("sans-serif", 14).into_font().color(&TEXT)))?;
        area.draw(&Text::new(note, (8, 40), ("sans-serif", 13).into_font().color(&TEXT)))?;
        return Ok(());
    }
    if t1 <= t0 {
        t1 = t0 + 1.0;
    }
    let lo = lo.min(0.0);
    let hi = if hi <= lo { lo + 1.0 } else { hi + (hi - lo) * 0.05 };
    let mut chart = ChartBuilder::on(area)
        .caption(&data.title, ("sans-serif", 14).into_font().color(&TEXT))
        .margin(6)
        .x_label_area_size(18)
        .y_label_area_size(62)
        .build_cartesian_2d(t0..t1, lo..hi)?;
    chart
        .configure_mesh()
        .light_line_style(TRANSPARENT)
        .bold_line_style(GRID)
        .axis_style(GRID)
        .label_style(("sans-serif", 10).into_font().color(&TEXT))
        .x_labels(4)
        .y_labels(4)
        .x_label_formatter(&|t| format!("{:.0}s", t - t1))
        .y_label_formatter(&|v| format_value(*v, unit))
        .draw()?;
    for (k, s) in data.series.iter().enumerate() {
        let color = PALETTE[k % PALETTE.len()];
        chart
            .draw_series(LineSeries::new(s.points.iter().copied(), color.stroke_width(2)))?
            .label(s.legend.clone())
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 12, y)], color.stroke_width(2)));
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperLeft)
        .background_style(PANEL.mix(0.8))
        .border_style(GRID)
        .label_font(("sans-serif", 10).into_font().color(&TEXT))
        .draw()?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantile_interpolates_inside_the_bucket() {
        let b = vec![(0.1, 50.0), (1.0, 100.0), (f64::INFINITY, 100.0)];
        assert!((bucket_quantile(0.5, b.clone()) - 0.1).abs() < 1e-9);
        assert!((bucket_quantile(0.75, b) - 0.55).abs() < 1e-9);
    }
}
