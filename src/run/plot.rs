//! PNG plots of a recipe's results: a metric against step (one line per variant, mean ± std band across
//! seeds) and the final metric against the swept value. Files are drawn to a temporary name and renamed.
use anyhow::{anyhow, Result};
use plotters::coord::ranged1d::ValueFormatter;
use plotters::prelude::*;
use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Once;

use super::results::{read_curves, read_runs, variants_of, Curves};
use crate::metrics::Metric;
use crate::recipe::Recipe;
use crate::stats::{Estimate, CONFIDENCE};
use crate::tasks::task;

static FONT: Once = Once::new();

pub(crate) fn register_font() {
    FONT.call_once(|| {
        // Embedded so plots render identically on machines without system fonts.
        let bytes: &'static [u8] = include_bytes!("../../assets/DejaVuSans.ttf");
        let _ = plotters::style::register_font("sans-serif", FontStyle::Normal, bytes);
    });
}

/// Twelve colours (Tableau's eight without the grey and olive that wash out, then black, wine, dark olive
/// and indigo), so that up to twelve series each have a colour of their own; past twelve, each round of the
/// palette has its own dash and marker shape: 36 series that no two look alike.
const PALETTE: [RGBColor; 12] = [
    RGBColor(31, 119, 180),
    RGBColor(255, 127, 14),
    RGBColor(44, 160, 44),
    RGBColor(214, 39, 40),
    RGBColor(148, 103, 189),
    RGBColor(140, 86, 75),
    RGBColor(227, 119, 194),
    RGBColor(23, 190, 207),
    RGBColor(0, 0, 0),
    RGBColor(136, 34, 85),
    RGBColor(128, 128, 0),
    RGBColor(51, 34, 136),
];

/// Dash length and gap in pixels of series `i`'s line: solid, dashed, dotted, by the round of the palette.
fn dash(i: usize) -> Option<(u32, u32)> {
    match (i / PALETTE.len()) % 3 {
        0 => None,
        1 => Some((10, 6)),
        _ => Some((3, 4)),
    }
}

fn colour(i: usize) -> RGBColor {
    PALETTE[i % PALETTE.len()]
}

/// The marker shape of series `i`, by the round of the palette: a disc, a triangle, a square.
#[derive(Clone, Copy, PartialEq, Debug)]
enum Marker {
    Disc,
    Triangle,
    Square,
}

fn marker(i: usize) -> Marker {
    match (i / PALETTE.len()) % 3 {
        0 => Marker::Disc,
        1 => Marker::Triangle,
        _ => Marker::Square,
    }
}

/// Filled markers of `shape` at `points` of a chart, `size` pixels from centre to edge.
fn draw_markers<X: Ranged<ValueType = f64>, Y: Ranged<ValueType = f64>>(
    chart: &mut ChartContext<'_, BitMapBackend<'_>, Cartesian2d<X, Y>>,
    points: &[(f64, f64)],
    shape: Marker,
    size: i32,
    colour: RGBColor,
) -> Result<()> {
    let style = colour.filled();
    match shape {
        Marker::Disc => chart.draw_series(points.iter().map(|&p| Circle::new(p, size, style)))?,
        Marker::Triangle => chart.draw_series(points.iter().map(|&p| TriangleMarker::new(p, size + 1, style)))?,
        Marker::Square => chart.draw_series(
            points.iter().map(|&p| EmptyElement::at(p) + Rectangle::new([(-size, -size), (size, size)], style)),
        )?,
    };
    Ok(())
}

/// One filled marker of `shape` at pixel `at` of a drawing area (the legend's).
fn draw_marker_at<DB: DrawingBackend>(
    area: &DrawingArea<DB, plotters::coord::Shift>,
    at: (i32, i32),
    shape: Marker,
    colour: RGBColor,
) -> Result<()>
where
    DB::ErrorType: 'static,
{
    let style = colour.filled();
    match shape {
        Marker::Disc => area.draw(&Circle::new(at, 4, style))?,
        Marker::Triangle => area.draw(&TriangleMarker::new(at, 5, style))?,
        Marker::Square => area.draw(&Rectangle::new([(at.0 - 4, at.1 - 4), (at.0 + 4, at.1 + 4)], style))?,
    }
    Ok(())
}

/// Mean of a sample and the half-width of its confidence interval (0 for a single value: no band).
fn mean_interval(values: &[f64]) -> (f64, f64) {
    let e = Estimate::of(values);
    (e.mean, e.half_width.unwrap_or(0.0))
}

/// One line of a chart: label and points (x, mean, half-width of the band or error bar), and where the
/// points summarise several runs, each run's own value (x, value), drawn beside its mean.
#[derive(Default)]
pub struct Series {
    pub label: String,
    pub points: Vec<(f64, f64, f64)>,
    pub runs: Vec<(f64, f64)>,
    /// Each run's own curve, where a line averages at most `SEED_CURVES_UP_TO` runs: drawn instead of a
    /// band, since the 95% interval of two values is 12.7 standard errors wide and says little.
    pub seed_curves: Vec<Vec<(f64, f64)>>,
}

/// Lines that average this many runs or fewer show each run instead of an interval band.
const SEED_CURVES_UP_TO: usize = 2;

/// Averages a metric's curve over the runs of each variant, step by step (steps every seed recorded).
pub fn variant_curves(curves: &Curves, variants: &[(String, Vec<String>)], metric: &str) -> Vec<Series> {
    let mut out = Vec::new();
    for (label, run_ids) in variants {
        let mut by_step: BTreeMap<i64, Vec<f64>> = BTreeMap::new();
        let mut runs_with_metric = 0;
        let mut seed_curves = Vec::new();
        for id in run_ids {
            if let Some(points) = curves.get(id).and_then(|m| m.get(metric)) {
                runs_with_metric += 1;
                for &(s, v) in points {
                    by_step.entry(s).or_default().push(v);
                }
                let finite = points.iter().filter(|p| p.1.is_finite()).map(|&(s, v)| (s as f64, v));
                seed_curves.push(finite.collect::<Vec<_>>());
            }
        }
        if !(2..=SEED_CURVES_UP_TO).contains(&seed_curves.len()) {
            seed_curves.clear();
        }
        let points: Vec<(f64, f64, f64)> = by_step
            .into_iter()
            .filter(|(_, vs)| vs.len() == runs_with_metric)
            .filter_map(|(s, vs)| {
                let finite: Vec<f64> = vs.into_iter().filter(|v| v.is_finite()).collect();
                (!finite.is_empty()).then(|| {
                    let (m, half) = mean_interval(&finite);
                    (s as f64, m, half)
                })
            })
            .collect();
        if !points.is_empty() {
            out.push(Series { label: label.clone(), points, runs: Vec::new(), seed_curves });
        }
    }
    out
}

pub struct Axes<'a> {
    pub title: &'a str,
    pub x_label: &'a str,
    pub y_label: &'a str,
    /// Category names for the x positions 0, 1, 2, … (`None`: numeric x axis). Categories are drawn as
    /// points with error bars, never joined by lines.
    pub x_categories: Option<&'a [String]>,
}

/// The widest a chart's legend panel gets (to the right of the data, never over it).
const LEGEND_WIDTH: u32 = 400;

/// The legend panel's width for `labels`: as wide as the longest line of a label needs (about 8 pixels a
/// character after the 48-pixel key), between 160 and `LEGEND_WIDTH` pixels.
fn legend_width<'a>(labels: impl IntoIterator<Item = &'a str>) -> u32 {
    let longest = labels.into_iter().flat_map(wrap_label).map(|l| l.chars().count()).max().unwrap_or(0);
    (56 + 8 * longest as u32).clamp(160, LEGEND_WIDTH)
}

/// Characters of legend text that fit one line of its panel.
const LEGEND_LINE: usize = 50;

/// Text cut to `LEGEND_LINE` characters, with an ellipsis when cut.
fn fit_label(label: &str) -> String {
    if label.chars().count() <= LEGEND_LINE {
        label.to_string()
    } else {
        label.chars().take(LEGEND_LINE - 1).chain(std::iter::once('…')).collect()
    }
}

/// A legend label on at most two lines: broken at the last space that fits, the rest cut if still too long.
fn wrap_label(label: &str) -> Vec<String> {
    let chars: Vec<char> = label.chars().collect();
    if chars.len() <= LEGEND_LINE {
        return vec![label.to_string()];
    }
    let head: String = chars[..LEGEND_LINE].iter().collect();
    let cut = head.rfind(' ').filter(|&i| i > 0).unwrap_or(head.len());
    let first = head[..cut].to_string();
    let rest = label[first.len()..].trim_start();
    vec![first, fit_label(rest)]
}

/// One legend row: label, colour, dash (`None`: solid) and whether the series has point markers.
struct LegendEntry {
    label: String,
    colour: RGBColor,
    dash: Option<(u32, u32)>,
    marker: Option<Marker>,
}

/// The legend entries of `labels` drawn as line charts draw series i: its colour and dash, with a marker.
fn series_entries(labels: &[String]) -> Vec<LegendEntry> {
    labels
        .iter()
        .enumerate()
        .map(|(i, label)| LegendEntry {
            label: label.clone(),
            colour: colour(i),
            dash: dash(i),
            marker: Some(marker(i)),
        })
        .collect()
}

/// Draws the legend `entries` into `area` (the panel beside the data).
fn legend<DB: DrawingBackend>(area: &DrawingArea<DB, plotters::coord::Shift>, entries: &[LegendEntry]) -> Result<()>
where
    DB::ErrorType: 'static,
{
    let row = 22;
    let mut y = 60 - row;
    for entry in entries {
        y += row;
        let lines = wrap_label(&entry.label);
        let c = entry.colour;
        match entry.dash {
            None => area.draw(&PathElement::new(vec![(8, y), (40, y)], c.stroke_width(3)))?,
            Some((on, off)) => {
                let mut x = 8;
                while x < 40 {
                    let end = (x + on as i32).min(40);
                    area.draw(&PathElement::new(vec![(x, y), (end, y)], c.stroke_width(3)))?;
                    x = end + off as i32;
                }
            }
        }
        if let Some(shape) = entry.marker {
            draw_marker_at(area, (24, y), shape, c)?;
        }
        for (k, line) in lines.iter().enumerate() {
            let indent = if k == 0 { 48 } else { 60 };
            area.draw(&Text::new(line.clone(), (indent, y - 8 + 17 * k as i32), ("sans-serif", 14)))?;
        }
        y += 17 * (lines.len() as i32 - 1);
    }
    Ok(())
}

/// Re-encodes the PNG at `path` losslessly at the best compression with per-row adaptive filters: about
/// 2.5 times smaller than plotters' fast encoding, which matters for the committed results and the
/// self-contained report that embeds every plot.
pub(crate) fn recompress_png(path: &Path) -> Result<()> {
    let decoder = png::Decoder::new(std::io::BufReader::new(std::fs::File::open(path)?));
    let mut reader = decoder.read_info()?;
    let mut pixels = vec![0; reader.output_buffer_size()];
    let info = reader.next_frame(&mut pixels)?;
    pixels.truncate(info.buffer_size());
    let mut out = Vec::new();
    {
        let mut encoder = png::Encoder::new(&mut out, info.width, info.height);
        encoder.set_color(info.color_type);
        encoder.set_depth(info.bit_depth);
        encoder.set_compression(png::Compression::Best);
        encoder.set_adaptive_filter(png::AdaptiveFilterType::Adaptive);
        encoder.write_header()?.write_image_data(&pixels)?;
    }
    std::fs::write(path, out)?;
    Ok(())
}

/// An axis number short enough not to run into its neighbours: `1.5M`, `250k`, `1400`, `0.25`.
fn short_number(x: f64) -> String {
    let trim = |s: String| if s.contains('.') { s.trim_end_matches('0').trim_end_matches('.').to_string() } else { s };
    if x.abs() >= 1e6 {
        format!("{}M", trim(format!("{:.2}", x / 1e6)))
    } else if x.abs() >= 1e4 {
        format!("{}k", trim(format!("{:.1}", x / 1e3)))
    } else if x.fract() == 0.0 {
        format!("{x:.0}")
    } else {
        trim(format!("{x:.4}"))
    }
}

/// Whether the y axis should be logarithmic: every value positive, and the whole range more than five
/// times the range past the first tenth of the x axis (an initial transient, such as the loss at step 0,
/// that a linear axis would either clip or let flatten everything after it).
fn wants_log_y(series: &[Series], categorical: bool) -> bool {
    if categorical {
        return false;
    }
    let pts = || series.iter().flat_map(|s| s.points.iter());
    let (x0, x1) = pts().fold((f64::MAX, f64::MIN), |(a, b), p| (a.min(p.0), b.max(p.0)));
    let from = x0 + 0.1 * (x1 - x0);
    let range = |late: bool| {
        let (lo, hi) = pts()
            .filter(|p| !late || p.0 >= from)
            .fold((f64::MAX, f64::MIN), |(lo, hi), p| (lo.min(p.1 - p.2), hi.max(p.1 + p.2)));
        (lo, hi)
    };
    let (all_lo, all_hi) = range(false);
    let (late_lo, late_hi) = range(true);
    all_lo > 0.0 && late_hi > late_lo && (all_hi - all_lo) > 5.0 * (late_hi - late_lo)
}

/// Draws `series` into `path`: against a numeric x axis, lines with a shaded ± band (the points' third
/// value); against categories, each series' points with error bars, side by side. Every point lies inside
/// the axes; the legend sits in its own panel on the right.
pub fn line_chart(path: &Path, series: &[Series], axes: &Axes) -> Result<()> {
    register_font();
    if series.is_empty() {
        return Err(anyhow!("nothing to plot for {}", path.display()));
    }
    let categorical = axes.x_categories.is_some();
    // Categories: series k is shifted so that error bars at one category do not overlap.
    let dodge = |k: usize| {
        if categorical && series.len() > 1 {
            (k as f64 - (series.len() - 1) as f64 / 2.0) * (0.6 / series.len() as f64)
        } else {
            0.0
        }
    };
    let placed: Vec<Series> = series
        .iter()
        .enumerate()
        .map(|(k, s)| Series {
            label: s.label.clone(),
            points: s.points.iter().map(|&(x, m, sd)| (x + dodge(k), m, sd)).collect(),
            runs: s.runs.iter().map(|&(x, v)| (x + dodge(k), v)).collect(),
            seed_curves: s.seed_curves.iter().map(|c| c.iter().map(|&(x, v)| (x + dodge(k), v)).collect()).collect(),
        })
        .collect();
    let (mut x0, mut x1) = x_extent(&placed);
    if let Some(c) = axes.x_categories {
        x0 = -0.5;
        x1 = c.len() as f64 - 0.5;
    }
    if x1 <= x0 {
        x1 = x0 + 1.0;
    }
    // Where an early transient dwarfs everything after it, a second panel shows the rest of the run at its
    // own scale; the first still shows every point.
    let zoom_from = (!categorical).then_some(x0 + 0.25 * (x1 - x0)).filter(|&from| {
        let (lo, hi) = y_extent(&placed, f64::MIN);
        let (late_lo, late_hi) = y_extent(&placed, from);
        late_hi > late_lo && (hi - lo) > 3.0 * (late_hi - late_lo)
    });
    let labels: Vec<String> = series.iter().map(|s| s.label.clone()).collect();
    crate::files::write_atomically_with(path, |tmp| {
        let root = BitMapBackend::new(tmp, (1280, 640)).into_drawing_area();
        root.fill(&WHITE)?;
        let legend_w = legend_width(labels.iter().map(String::as_str));
        let (plot_area, legend_area) = root.split_horizontally(1280 - legend_w);
        legend(&legend_area, &series_entries(&labels))?;
        match zoom_from {
            None => panel(&plot_area, &placed, axes, axes.title, (x0, x1), categorical)?,
            Some(from) => {
                let (title_area, panels) = plot_area.split_vertically(34);
                title_area.draw(&Text::new(axes.title.to_string(), (12, 8), ("sans-serif", 20)))?;
                let (full, zoomed) = panels.split_horizontally((1280 - legend_w) / 2);
                panel(&full, &placed, axes, "whole run", (x0, x1), true)?;
                let late: Vec<Series> = placed
                    .iter()
                    .map(|s| Series {
                        label: s.label.clone(),
                        points: s.points.iter().filter(|p| p.0 >= from).copied().collect(),
                        runs: s.runs.iter().filter(|p| p.0 >= from).copied().collect(),
                        seed_curves: s
                            .seed_curves
                            .iter()
                            .map(|c| c.iter().filter(|p| p.0 >= from).copied().collect())
                            .collect(),
                    })
                    .collect();
                let (lx0, lx1) = x_extent(&late);
                let from_label = format!("from {} {lx0} on (zoomed)", axes.x_label);
                panel(&zoomed, &late, axes, &from_label, (lx0, lx1.max(lx0 + 1.0)), true)?;
            }
        }
        root.present()?;
        drop(root);
        recompress_png(tmp)
    })
}

/// Smallest and largest x of the points.
fn x_extent(series: &[Series]) -> (f64, f64) {
    series.iter().flat_map(|s| s.points.iter()).fold((f64::MAX, f64::MIN), |(a, b), p| (a.min(p.0), b.max(p.0)))
}

/// Lowest and highest y of the data at x ≥ `from`: the means and the single runs. Bands and error bars do
/// not set the range (with two seeds a 95% interval is 12.7 standard errors wide and would squeeze the data
/// into a sliver); they are clipped at the axes instead.
fn y_extent(series: &[Series], from: f64) -> (f64, f64) {
    let means = series.iter().flat_map(|s| s.points.iter()).filter(|p| p.0 >= from).map(|p| p.1);
    let runs = series.iter().flat_map(|s| s.runs.iter()).filter(|p| p.0 >= from).map(|p| p.1);
    let seeds = series.iter().flat_map(|s| s.seed_curves.iter().flatten()).filter(|p| p.0 >= from).map(|p| p.1);
    means.chain(runs).chain(seeds).fold((f64::MAX, f64::MIN), |(lo, hi), y| (lo.min(y), hi.max(y)))
}

/// The band (or error bar) of a point cut to the axis range `(y0, y1)`, and never below zero where every
/// value of the chart is non-negative (a loss, an accuracy): (lower, upper).
fn clipped_band((_, m, half): (f64, f64, f64), (y0, y1): (f64, f64), non_negative: bool) -> (f64, f64) {
    let floor = if non_negative { y0.max(0.0) } else { y0 };
    ((m - half).max(floor), (m + half).min(y1))
}

/// Whether point `p` of `s` is drawn with its band (or error bar): not where the runs themselves are drawn
/// instead (a line over at most `SEED_CURVES_UP_TO` runs, a category of as few runs).
fn band_drawn(s: &Series, p: (f64, f64, f64)) -> bool {
    let runs_at = s.runs.iter().filter(|r| (r.0 - p.0).abs() < 1e-9).count();
    p.2 > 0.0 && s.seed_curves.is_empty() && (s.runs.is_empty() || runs_at > SEED_CURVES_UP_TO)
}

/// Whether some band of `series` reaches past the axis range (and is drawn clipped).
fn bands_clipped(series: &[Series], range: (f64, f64), non_negative: bool) -> bool {
    series.iter().flat_map(|s| s.points.iter().filter(|&&p| band_drawn(s, p))).any(|&p| {
        let (lo, hi) = clipped_band(p, range, non_negative);
        lo > p.1 - p.2 + 1e-12 || hi < p.1 + p.2 - 1e-12
    })
}

/// One chart of `series` in `area`: every point inside its axes, on a logarithmic y axis (said on the axis)
/// where an initial transient of positive values calls for it.
fn panel(
    area: &DrawingArea<BitMapBackend, plotters::coord::Shift>,
    series: &[Series],
    axes: &Axes,
    title: &str,
    (x0, x1): (f64, f64),
    linear: bool,
) -> Result<()> {
    let categorical = axes.x_categories.is_some();
    let (mut y0, mut y1) = y_extent(series, f64::MIN);
    if series.iter().all(|s| s.points.is_empty()) {
        return Ok(());
    }
    let non_negative = y0 >= 0.0;
    let log = !linear && wants_log_y(series, categorical);
    if log {
        let (lo, hi) = (y0.ln(), y1.ln());
        let pad = ((hi - lo) * 0.04).max(1e-6);
        y0 = (lo - pad).exp();
        y1 = (hi + pad).exp();
    } else {
        // A flat series (one point, or equal values) still gets a readable range around its value.
        let pad = ((y1 - y0).abs() * 0.05).max(y1.abs().max(y0.abs()) * 0.01).max(1e-6);
        y0 -= pad;
        y1 += pad;
    }
    let y_label = if log { format!("{} (log scale)", axes.y_label) } else { axes.y_label.to_string() };
    let rotate = rotated_categories(axes.x_categories, area.dim_in_pixel().0);
    let x_area = match rotate {
        Some(chars) => (chars as u32 * 7 + 40).min(260),
        None => 45,
    };
    let clipped = bands_clipped(series, (y0, y1), non_negative);
    let title = if clipped { format!("{title} (bands clipped at the axes)") } else { title.to_string() };
    let mut builder = ChartBuilder::on(area);
    builder.caption(&title, ("sans-serif", 18)).margin(12).x_label_area_size(x_area).y_label_area_size(80);
    let n_cats = if rotate.is_some() { axes.x_categories.map_or(0, |c| c.len()) } else { 0 };
    let frame = Frame {
        axes,
        y_label: &y_label,
        rotate: rotate.is_some(),
        series,
        categorical,
        n_cats,
        y_range: (y0, y1),
        non_negative,
    };
    let below_axis = if log {
        frame.draw(builder.build_cartesian_2d(x0..x1, (y0..y1).log_scale())?)?
    } else {
        frame.draw(builder.build_cartesian_2d(x0..x1, y0..y1)?)?
    };
    if let (Some(_), Some(cats)) = (rotate, axes.x_categories) {
        category_labels(area, cats, &below_axis)?;
    }
    Ok(())
}

/// What a panel draws on its chart, whichever kind of y axis the chart has.
struct Frame<'a> {
    axes: &'a Axes<'a>,
    y_label: &'a str,
    rotate: bool,
    series: &'a [Series],
    categorical: bool,
    n_cats: usize,
    /// The axis range, which bands are clipped to.
    y_range: (f64, f64),
    /// Every value is at least zero, so no band goes below it.
    non_negative: bool,
}

impl Frame<'_> {
    /// Mesh and series on `chart`; returns the pixel of each category's tick on the x axis.
    fn draw<Y: Ranged<ValueType = f64> + ValueFormatter<f64>>(
        &self,
        mut chart: Chart<'_, Y>,
    ) -> Result<Vec<(i32, i32)>> {
        mesh(&mut chart, self.axes, self.y_label, self.rotate)?;
        draw_series(&mut chart, self.series, self.categorical, |p| clipped_band(p, self.y_range, self.non_negative))?;
        Ok((0..self.n_cats).map(|i| chart.backend_coord(&(i as f64, self.y_range.0))).collect())
    }
}

/// Category labels written downwards from the axis, each starting just below its tick (`ticks[i]`: the
/// backend pixel of category i on the x axis).
fn category_labels(
    area: &DrawingArea<BitMapBackend, plotters::coord::Shift>,
    categories: &[String],
    ticks: &[(i32, i32)],
) -> Result<()> {
    use plotters::style::text_anchor::{HPos, Pos, VPos};
    let style = TextStyle::from(("sans-serif", 14).into_font().transform(FontTransform::Rotate90))
        .pos(Pos::new(HPos::Left, VPos::Center));
    let (bx, by) = area.get_base_pixel();
    for (label, &(x, y)) in categories.iter().zip(ticks) {
        area.draw(&Text::new(fit_label(label), (x - bx, y - by + 8), style.clone()))?;
    }
    Ok(())
}

/// Width of one character of a category label, in pixels (14-point sans-serif).
const CATEGORY_CHAR_PX: u32 = 8;

/// The longest category label's length when the labels, written across, would not fit beside each other
/// in `width` pixels (they are then written upwards); `None` when they fit.
fn rotated_categories(categories: Option<&[String]>, width: u32) -> Option<usize> {
    let cats = categories?;
    let longest = cats.iter().map(|c| fit_label(c).chars().count()).max().unwrap_or(0);
    let room = width.saturating_sub(100) / (cats.len().max(1) as u32);
    (longest as u32 * CATEGORY_CHAR_PX > room).then_some(longest)
}

type Chart<'a, Y> = ChartContext<'a, BitMapBackend<'a>, Cartesian2d<plotters::coord::types::RangedCoordf64, Y>>;

fn mesh<Y: Ranged<ValueType = f64> + ValueFormatter<f64>>(
    chart: &mut Chart<'_, Y>,
    axes: &Axes,
    y_label: &str,
    rotate: bool,
) -> Result<()> {
    let category_label = |x: &f64| {
        let cats = axes.x_categories.unwrap_or(&[]);
        let i = x.round();
        if (x - i).abs() < 1e-6 && i >= 0.0 && (i as usize) < cats.len() {
            fit_label(&cats[i as usize])
        } else {
            String::new()
        }
    };
    let y_number = |y: &f64| short_number(*y);
    let mut mesh = chart.configure_mesh();
    mesh.x_desc(axes.x_label).y_desc(y_label).label_style(("sans-serif", 14)).y_label_formatter(&y_number);
    let number = |x: &f64| short_number(*x);
    let blank = |_: &f64| String::new();
    match axes.x_categories {
        // Labels too long to sit beside each other are written downwards by `category_labels` instead.
        Some(c) if rotate => mesh.x_labels(c.len().max(2) * 2 + 1).x_label_formatter(&blank),
        Some(c) => mesh.x_labels(c.len().max(2) * 2 + 1).x_label_formatter(&category_label),
        None => mesh.x_label_formatter(&number),
    };
    mesh.draw()?;
    Ok(())
}

/// The series on `chart`: against categories, each mean with its error bar and every run beside it;
/// against a numeric x, lines with a shaded band and markers at a few points. `band` gives a point's
/// (lower, upper) as drawn.
fn draw_series<Y: Ranged<ValueType = f64>>(
    chart: &mut Chart<'_, Y>,
    series: &[Series],
    categorical: bool,
    band: impl Fn((f64, f64, f64)) -> (f64, f64),
) -> Result<()> {
    for (i, s) in series.iter().enumerate() {
        let c = colour(i);
        let means: Vec<(f64, f64)> = s.points.iter().map(|&(x, m, _)| (x, m)).collect();
        if categorical {
            // At two runs an interval says little: the runs themselves are drawn, not an error bar.
            for &p in s.points.iter().filter(|&&p| band_drawn(s, p)) {
                let x = p.0;
                let (lo, hi) = band(p);
                chart.draw_series(std::iter::once(PathElement::new(vec![(x, lo), (x, hi)], c.stroke_width(2))))?;
                for y in [lo, hi] {
                    chart.draw_series(std::iter::once(PathElement::new(
                        vec![(x - 0.04, y), (x + 0.04, y)],
                        c.stroke_width(2),
                    )))?;
                }
            }
            draw_markers(chart, &means, marker(i), 5, c)?;
            // Every run beside its mean, so that a bimodal outcome (some seeds train, some do not) shows.
            chart.draw_series(s.runs.iter().map(|&(x, v)| Circle::new((x + 0.05, v), 3, c.stroke_width(1))))?;
            continue;
        }
        for curve in &s.seed_curves {
            chart.draw_series(LineSeries::new(curve.iter().copied(), c.mix(0.45).stroke_width(1)))?;
        }
        if s.points.iter().any(|&p| band_drawn(s, p)) {
            let edges: Vec<(f64, (f64, f64))> = s.points.iter().map(|&p| (p.0, band(p))).collect();
            let upper = edges.iter().map(|&(x, (_, hi))| (x, hi));
            let lower = edges.iter().rev().map(|&(x, (lo, _))| (x, lo));
            let polygon: Vec<(f64, f64)> = upper.chain(lower).collect();
            chart.draw_series(std::iter::once(Polygon::new(polygon, c.mix(0.15).filled())))?;
        }
        match dash(i) {
            None => {
                chart.draw_series(LineSeries::new(means.iter().copied(), c.stroke_width(2)))?;
            }
            Some((on, off)) => {
                chart.draw_series(DashedLineSeries::new(means.iter().copied(), on, off, c.stroke_width(2)))?;
            }
        }
        // Markers at about six points per line, staggered between series so that they do not coincide.
        let every = (means.len() / 6).max(1);
        let marked: Vec<(f64, f64)> = means.iter().skip((i * 2) % every).step_by(every).copied().collect();
        draw_markers(chart, &marked, marker(i), 4, c)?;
    }
    Ok(())
}

/// Log-log chart: measured `series` as solid lines with markers, `references` (e.g. analytic FLOPs turned
/// into time) as grey dashed lines; the legend in a panel beside the data.
pub fn loglog_chart(path: &Path, series: &[Series], references: &[Series], axes: &Axes) -> Result<()> {
    register_font();
    let all = series.iter().chain(references).flat_map(|s| s.points.iter());
    let (mut x0, mut x1, mut y0, mut y1) = (f64::MAX, f64::MIN, f64::MAX, f64::MIN);
    for &(x, y, _) in all {
        if x > 0.0 && y > 0.0 {
            x0 = x0.min(x);
            x1 = x1.max(x);
            y0 = y0.min(y);
            y1 = y1.max(y);
        }
    }
    if x0 >= x1 || y0 >= y1 {
        return Err(anyhow!("nothing to plot for {}", path.display()));
    }
    // Ticks at the measured x values (sequence lengths, image sides), which rarely fall on decades.
    let mut ticks: Vec<f64> = series.iter().flat_map(|s| s.points.iter().map(|p| p.0)).filter(|x| *x > 0.0).collect();
    ticks.sort_by(f64::total_cmp);
    ticks.dedup();
    // 1, 2, 5 times each power of ten in range: labels at every decade and between them.
    // A fifth of a decade of room above and below, so that no point sits on the frame.
    let (y_lo, y_hi) = (y0 / 1.6, y1 * 1.6);
    let y_ticks: Vec<f64> = (y_lo.log10().floor() as i32..=y_hi.log10().ceil() as i32)
        .flat_map(|d| [1.0, 2.0, 5.0].map(|k| k * 10f64.powi(d)))
        .filter(|y| (y_lo..=y_hi).contains(y))
        .collect();
    const GREYS: [RGBColor; 3] = [RGBColor(70, 70, 70), RGBColor(130, 130, 130), RGBColor(180, 180, 180)];
    let mut entries = series_entries(&series.iter().map(|s| s.label.clone()).collect::<Vec<_>>());
    for (i, s) in references.iter().enumerate() {
        entries.push(LegendEntry { label: s.label.clone(), colour: GREYS[i % 3], dash: Some((6, 4)), marker: None });
    }
    crate::files::write_atomically_with(path, |tmp| {
        let root = BitMapBackend::new(tmp, (1280, 700)).into_drawing_area();
        root.fill(&WHITE)?;
        let legend_w = legend_width(entries.iter().map(|e| e.label.as_str()));
        let (plot_area, legend_area) = root.split_horizontally(1280 - legend_w);
        legend(&legend_area, &entries)?;
        let mut chart = ChartBuilder::on(&plot_area)
            .caption(axes.title, ("sans-serif", 20))
            .margin(12)
            .x_label_area_size(45)
            .y_label_area_size(80)
            .build_cartesian_2d(
                (x0 * 0.9..x1 * 1.1).log_scale().with_key_points(ticks.clone()),
                (y_lo..y_hi).log_scale().with_key_points(y_ticks.clone()),
            )?;
        chart
            .configure_mesh()
            .x_desc(format!("{} (log scale)", axes.x_label))
            .y_desc(format!("{} (log scale)", axes.y_label))
            .label_style(("sans-serif", 14))
            .x_label_formatter(&|x: &f64| format!("{x:.0}"))
            .y_label_formatter(&|y: &f64| format!("{y}"))
            .draw()?;
        for (i, s) in series.iter().enumerate() {
            let c = colour(i);
            let line = s.points.iter().map(|&(x, y, _)| (x, y));
            match dash(i) {
                None => chart.draw_series(LineSeries::new(line, c.stroke_width(2)))?,
                Some((on, off)) => chart.draw_series(DashedLineSeries::new(line, on, off, c.stroke_width(2)))?,
            };
            let points: Vec<(f64, f64)> = s.points.iter().map(|&(x, y, _)| (x, y)).collect();
            draw_markers(&mut chart, &points, marker(i), 3, c)?;
        }
        for (i, s) in references.iter().enumerate() {
            let line = s.points.iter().map(|&(x, y, _)| (x, y));
            chart.draw_series(DashedLineSeries::new(line, 6, 4, GREYS[i % 3].stroke_width(2)))?;
        }
        root.present()?;
        drop(root);
        recompress_png(tmp)
    })
}

/// A layer × head grid of loss changes (`values[l][h]`), each cell shaded by its value — blue where removing
/// the head raises the loss, red where it lowers it, white at 0, relative to the largest magnitude — and
/// labelled with the number itself.
pub fn importance_heatmap(path: &Path, values: &[Vec<f64>], title: &str) -> Result<()> {
    register_font();
    let layers = values.len();
    let heads = values.iter().map(Vec::len).max().unwrap_or(0);
    if layers == 0 || heads == 0 {
        return Err(anyhow!("no heads to draw"));
    }
    let largest = values.iter().flatten().fold(1e-12f64, |m, v| m.max(v.abs()));
    let (cell_w, cell_h) = (90u32, 44u32);
    let (width, height) = ((cell_w * heads as u32 + 140).max(900), cell_h * layers as u32 + 130);
    crate::files::write_atomically_with(path, |tmp| {
        let root = BitMapBackend::new(tmp, (width, height)).into_drawing_area();
        root.fill(&WHITE)?;
        root.draw(&Text::new(title.to_string(), (10, 8), ("sans-serif", 16)))?;
        root.draw(&Text::new(
            format!("Δ held-out loss (nats/token): blue = removing the head hurts, red = it helps; shade relative to the largest |Δ| = {largest:.4}"),
            (10, 32),
            ("sans-serif", 13),
        ))?;
        let (x0, y0) = (80i32, 70i32);
        for (l, row) in values.iter().enumerate() {
            let y = y0 + (l as u32 * cell_h) as i32;
            root.draw(&Text::new(format!("layer {l}"), (10, y + cell_h as i32 / 2 - 7), ("sans-serif", 13)))?;
            for (h, &v) in row.iter().enumerate() {
                let x = x0 + (h as u32 * cell_w) as i32;
                let t = (v.abs() / largest).clamp(0.0, 1.0);
                let fade = (255.0 * (1.0 - t)) as u8;
                let colour = if v >= 0.0 { RGBColor(fade, fade, 255) } else { RGBColor(255, fade, fade) };
                root.draw(&Rectangle::new([(x, y), (x + cell_w as i32, y + cell_h as i32)], colour.filled()))?;
                root.draw(&Rectangle::new(
                    [(x, y), (x + cell_w as i32, y + cell_h as i32)],
                    BLACK.mix(0.3).stroke_width(1),
                ))?;
                let ink = if t > 0.6 { WHITE } else { BLACK };
                root.draw(&Text::new(
                    format!("{v:+.4}"),
                    (x + 12, y + cell_h as i32 / 2 - 7),
                    ("sans-serif", 13).into_font().color(&ink),
                ))?;
            }
        }
        for h in 0..heads {
            let x = x0 + (h as u32 * cell_w) as i32;
            root.draw(&Text::new(
                format!("head {h}"),
                (x + 18, y0 + (layers as u32 * cell_h) as i32 + 8),
                ("sans-serif", 13),
            ))?;
        }
        root.present()?;
        drop(root);
        recompress_png(tmp)
    })
}

/// Attention weights as heatmaps: one row of panels per layer, one panel per head; `maps[l]` is (H, N, N)
/// with queries as rows and keys as columns. Darker is more weight (each panel scaled to its own maximum).
pub fn attention_heatmaps(path: &Path, maps: &[tch::Tensor], title: &str) -> Result<()> {
    register_font();
    let layers = maps.len();
    let heads = maps.first().map_or(0, |m| m.size()[0] as usize);
    if layers == 0 || heads == 0 {
        return Err(anyhow!("no attention weights to draw"));
    }
    let cell = 260u32;
    crate::files::write_atomically_with(path, |tmp| {
        let width = cell * heads as u32 + 20;
        let root = BitMapBackend::new(tmp, (width, cell * layers as u32 + 80)).into_drawing_area();
        root.fill(&WHITE)?;
        let (top, body) = root.split_vertically(70);
        top.draw(&Text::new(title.to_string(), (10, 8), ("sans-serif", 18)))?;
        // The colour scale: each panel is shaded relative to its own largest weight, so a diffuse head and
        // a sharp one are both readable; the scale says so rather than implying one absolute range.
        let (bar_x, bar_y, bar_w, bar_h) = (10i32, 38i32, 200i32, 14i32);
        for k in 0..bar_w {
            let shade = (255.0 * (1.0 - k as f64 / (bar_w - 1) as f64)) as u8;
            top.draw(&Rectangle::new(
                [(bar_x + k, bar_y), (bar_x + k + 1, bar_y + bar_h)],
                RGBColor(shade, shade, 255).filled(),
            ))?;
        }
        top.draw(&Rectangle::new([(bar_x, bar_y), (bar_x + bar_w, bar_y + bar_h)], BLACK.stroke_width(1)))?;
        top.draw(&Text::new(
            "attention weight: 0 (white) to the panel's largest weight (blue); rows are queries, columns keys",
            (bar_x + bar_w + 10, bar_y),
            ("sans-serif", 13),
        ))?;
        let panels = body.split_evenly((layers, heads));
        for (l, map) in maps.iter().enumerate() {
            let map = map.to_kind(tch::Kind::Float).to_device(tch::Device::Cpu);
            for h in 0..heads {
                let w = map.get(h as i64);
                let n = w.size()[0] as usize;
                let values = Vec::<f32>::try_from(w.reshape([-1])).unwrap_or_default();
                let max = values.iter().cloned().fold(f32::MIN_POSITIVE, f32::max);
                let area = &panels[l * heads + h];
                let mut chart = ChartBuilder::on(area)
                    .caption(format!("layer {l}, head {h}"), ("sans-serif", 13))
                    .margin(4)
                    .x_label_area_size(28)
                    .y_label_area_size(34)
                    // Query 0 at the top, as a matrix is printed: y runs over −n..0 and is labelled −y.
                    .build_cartesian_2d(0..n as i64, -(n as i64)..0)?;
                let query = |y: &i64| format!("{}", -y);
                chart
                    .configure_mesh()
                    .disable_mesh()
                    .x_desc("key position")
                    .y_desc("query position")
                    .x_labels(5)
                    .y_labels(5)
                    .y_label_formatter(&query)
                    .label_style(("sans-serif", 11))
                    .axis_desc_style(("sans-serif", 11))
                    .draw()?;
                chart.draw_series((0..n).flat_map(|i| (0..n).map(move |j| (i, j))).map(|(i, j)| {
                    let v = (values[i * n + j] / max).clamp(0.0, 1.0) as f64;
                    let shade = (255.0 * (1.0 - v)) as u8;
                    let (x, y) = (j as i64, -(i as i64));
                    Rectangle::new([(x, y - 1), (x + 1, y)], RGBColor(shade, shade, 255).filled())
                }))?;
            }
        }
        root.present()?;
        drop(root);
        recompress_png(tmp)
    })
}

/// Every metric the recipe's runs record, once each (the first run's declaration of a name wins).
pub fn recipe_metrics(recipe: &Recipe) -> Vec<Metric> {
    let mut out: Vec<Metric> = Vec::new();
    for run in &recipe.runs {
        for m in task(run.config.kind).metrics(&run.config) {
            if !out.iter().any(|o| o.column == m.column && o.curve == m.curve) {
                out.push(m);
            }
        }
    }
    out
}

/// Every metric of the recipe's runs once per meaning: where runs of different tasks record one column or
/// curve under different labels (F1 over punctuation marks, F1 of spans), each label is its own chart, of
/// the runs that mean it, its file named with a suffix from the label. Returns (metric, its runs' ids,
/// file suffix, empty where the name is unambiguous).
fn meanings(recipe: &Recipe) -> Vec<(Metric, Vec<String>, String)> {
    let mut out: Vec<(Metric, Vec<String>)> = Vec::new();
    for run in &recipe.runs {
        for m in task(run.config.kind).metrics(&run.config) {
            match out.iter_mut().find(|(o, _)| o.column == m.column && o.curve == m.curve && o.label == m.label) {
                Some((_, ids)) => ids.push(run.id.clone()),
                None => out.push((m, vec![run.id.clone()])),
            }
        }
    }
    let shared = |m: &Metric| out.iter().filter(|(o, _)| o.column == m.column && o.curve == m.curve).count() > 1;
    let suffixes: Vec<String> = out
        .iter()
        .map(|(m, _)| {
            if shared(m) {
                let slug: String = m
                    .label
                    .chars()
                    .map(|c| if c.is_ascii_alphanumeric() { c.to_ascii_lowercase() } else { '_' })
                    .collect();
                format!("__{}", slug.split('_').filter(|w| !w.is_empty()).collect::<Vec<_>>().join("_"))
            } else {
                String::new()
            }
        })
        .collect();
    out.into_iter().zip(suffixes).map(|((m, ids), suffix)| (m, ids, suffix)).collect()
}

/// The variants restricted to the runs in `ids` (variants left without runs dropped).
fn only(variants: &[(String, Vec<String>)], ids: &[String]) -> Vec<(String, Vec<String>)> {
    variants
        .iter()
        .map(|(label, runs)| (label.clone(), runs.iter().filter(|r| ids.contains(r)).cloned().collect::<Vec<_>>()))
        .filter(|(_, runs)| !runs.is_empty())
        .collect()
}

/// The chart file of a curve: `val_loss.png` for `val/loss`, `grad_norm.png` for `train/grad_norm`,
/// `pretrain_mlm_loss.png` for `pretrain_val/mlm_loss`: the metric's name, with its split where the name
/// alone is ambiguous (loss and accuracy, the pre-training phase).
pub fn chart_file(curve: &str) -> String {
    let (split, metric) = curve.split_once('/').unwrap_or(("val", curve));
    match (split, metric) {
        (_, "loss" | "accuracy") => format!("{split}_{metric}.png"),
        ("val" | "train", _) => format!("{metric}.png"),
        (phase, _) => format!("{}_{metric}.png", phase.trim_end_matches("_val").trim_end_matches("_train")),
    }
}

/// Draws every plot of a results directory from its CSV files, labelled by the recipe's metrics.
pub fn plot_results(dir: &Path, recipe: &Recipe) -> Result<()> {
    let runs = read_runs(&dir.join("runs.csv"))?;
    let curves = read_curves(&dir.join("curves.csv"))?;
    let variants = variants_of(&runs);
    let seeds = runs.iter().map(|r| r["seed"].clone()).collect::<std::collections::BTreeSet<_>>().len();
    let band = if seeds > SEED_CURVES_UP_TO {
        format!(" (mean, {:.0}% CI over n = {seeds} seeds)", 100.0 * CONFIDENCE)
    } else if seeds > 1 {
        format!(" (mean, and each of the n = {seeds} seeds in thin lines or circles)")
    } else {
        String::new()
    };
    let name = &recipe.name;
    let metrics = recipe_metrics(recipe);
    for (m, ids, suffix) in meanings(recipe).into_iter().filter(|(m, _, _)| m.chart) {
        let Some(curve) = m.curve else { continue };
        let series = variant_curves(&curves, &only(&variants, &ids), curve);
        if series.is_empty() {
            continue;
        }
        let y_label = m.axis();
        let title = format!("{name}: {}{band}", m.label);
        let file = chart_file(curve).replace(".png", &format!("{suffix}.png"));
        line_chart(
            &dir.join(file),
            &series,
            &Axes { title: &title, x_label: "step", y_label: &y_label, x_categories: None },
        )?;
    }
    // Data efficiency of pre-training objectives: held-out loss against the tokens read and against the
    // tokens that carried loss (the x values differ between variants, so steps cannot stand in).
    let losses = variant_curves(&curves, &variants, "val/loss");
    for (axis, file) in [
        ("val/tokens_seen", "val_loss_by_tokens_seen.png"),
        ("val/tokens_predicted", "val_loss_by_tokens_predicted.png"),
    ] {
        let Some(x_metric) = metrics.iter().find(|m| m.curve == Some(axis)) else { continue };
        let xs = variant_curves(&curves, &variants, axis);
        let series: Vec<Series> = losses
            .iter()
            .filter_map(|y| {
                let x = xs.iter().find(|x| x.label == y.label)?;
                let tokens: BTreeMap<i64, f64> = x.points.iter().map(|&(s, t, _)| (s as i64, t)).collect();
                let points = y.points.iter().filter_map(|&(s, m, sd)| Some((tokens.get(&(s as i64)).copied()?, m, sd)));
                Some(Series { label: y.label.clone(), points: points.collect(), ..Default::default() })
            })
            .collect();
        if series.is_empty() {
            continue;
        }
        let y_label = "held-out loss of the objective (nats/predicted token)";
        let title = format!("{name}: held-out loss against {}{band}", x_metric.label);
        line_chart(
            &dir.join(file),
            &series,
            &Axes { title: &title, x_label: x_metric.label, y_label, x_categories: None },
        )?;
    }
    length_generalisation_chart(dir, name, &runs, &variants, &band)?;
    if super::interaction::has_patterns(recipe) {
        super::interaction::draw(dir, recipe)?;
    }
    let Some(x_key) = recipe.sweep_keys.first() else { return Ok(()) };
    for (m, ids, suffix) in meanings(recipe).into_iter().filter(|(m, _, _)| m.final_chart) {
        let Some(column) = m.column_name() else { continue };
        if runs.first().is_none_or(|r| !r.contains_key(column)) {
            continue;
        }
        let series = final_metric_series(&runs, &ids, x_key, &recipe.sweep_keys[1..], column, m.label);
        if series.is_empty() {
            // No run has this metric (e.g. no BERT run of the recipe was pre-trained by masked-LM).
            continue;
        }
        let categories = x_categories(&runs, x_key);
        let y_label = format!("final {}", m.axis());
        let title = format!("{name}: final {} against {x_key}{band}", m.label);
        line_chart(
            &dir.join(format!("final_{column}{suffix}.png")),
            &series,
            &Axes { title: &title, x_label: x_key, y_label: &y_label, x_categories: Some(&categories) },
        )?;
    }
    Ok(())
}

/// The value of swept `key` in run `r`. A swept section (e.g. `data.images`) has no column of its own: its
/// columns whose values differ between runs stand in (`dataset=mnist train_fraction=1`), and failing those
/// the run's variant label.
fn swept_value(runs: &[BTreeMap<String, String>], r: &BTreeMap<String, String>, key: &str) -> String {
    if let Some(v) = r.get(key) {
        return v.clone();
    }
    let prefix = format!("{key}.");
    let varying: Vec<String> = r
        .iter()
        .filter(|(column, _)| column.starts_with(&prefix))
        .filter(|(column, value)| runs.iter().any(|other| other.get(*column) != Some(*value)))
        .map(|(column, value)| format!("{}={value}", &column[prefix.len()..]))
        .collect();
    if varying.is_empty() {
        r.get("label").cloned().unwrap_or_default()
    } else {
        varying.join(" ")
    }
}

/// Distinct values of `key` in `runs.csv`, in first-seen order (the x positions of the final-metric plot).
fn x_categories(runs: &[BTreeMap<String, String>], key: &str) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for r in runs {
        let v = swept_value(runs, r, key);
        if !out.contains(&v) {
            out.push(v);
        }
    }
    out
}

/// One series per combination of the other swept keys: the final `column` against the first swept key.
fn final_metric_series(
    runs: &[BTreeMap<String, String>],
    ids: &[String],
    x_key: &str,
    other_keys: &[String],
    column: &str,
    label_alone: &str,
) -> Vec<Series> {
    let cats = x_categories(runs, x_key);
    let mut groups: Vec<(String, BTreeMap<usize, Vec<f64>>)> = Vec::new();
    for r in runs.iter().filter(|r| ids.contains(&r["run_id"])) {
        let label = if other_keys.is_empty() {
            label_alone.to_string()
        } else {
            other_keys
                .iter()
                .map(|k| match r.get(k) {
                    Some(v) => format!("{}={v}", k.rsplit('.').next().unwrap_or(k)),
                    None => swept_value(runs, r, k),
                })
                .collect::<Vec<_>>()
                .join(" ")
        };
        let Some(Ok(v)) = r.get(column).map(|v| v.parse::<f64>()) else { continue };
        let x = swept_value(runs, r, x_key);
        let Some(xi) = cats.iter().position(|c| *c == x) else { continue };
        let idx = match groups.iter().position(|g| g.0 == label) {
            Some(i) => i,
            None => {
                groups.push((label, BTreeMap::new()));
                groups.len() - 1
            }
        };
        groups[idx].1.entry(xi).or_default().push(v);
    }
    groups
        .into_iter()
        .map(|(label, by_x)| Series {
            label,
            points: by_x
                .iter()
                .map(|(&x, vs)| {
                    let (m, half) = mean_interval(vs);
                    (x as f64, m, half)
                })
                .collect(),
            runs: by_x
                .iter()
                .filter(|(_, vs)| vs.len() > 1)
                .flat_map(|(&x, vs)| vs.iter().map(move |&v| (x as f64, v)))
                .collect(),
            seed_curves: Vec::new(),
        })
        .collect()
}

/// Held-out loss at the training length and at every `train.eval_lengths` multiple, one line per variant
/// (a variant whose position table cannot read a length has no point there).
fn length_generalisation_chart(
    dir: &Path,
    name: &str,
    runs: &[BTreeMap<String, String>],
    variants: &[(String, Vec<String>)],
    band: &str,
) -> Result<()> {
    let Some(first) = runs.first() else { return Ok(()) };
    let mut columns = vec![("1".to_string(), "val_loss".to_string())];
    columns.extend(
        first
            .keys()
            .filter_map(|k| k.strip_prefix("val_loss_x").map(|m| (m.to_string(), k.clone())))
            .collect::<Vec<_>>(),
    );
    if columns.len() == 1 {
        return Ok(());
    }
    columns.sort_by_key(|(m, _)| m.parse::<i64>().unwrap_or(0));
    let block = first.get("transformer.block_size").cloned().unwrap_or_default();
    let categories: Vec<String> = columns
        .iter()
        .map(|(m, _)| format!("{m}× ({} tokens)", m.parse::<i64>().unwrap_or(1) * block.parse::<i64>().unwrap_or(0)))
        .collect();
    let series: Vec<Series> = variants
        .iter()
        .filter_map(|(label, ids)| {
            let points: Vec<(f64, f64, f64)> = columns
                .iter()
                .enumerate()
                .filter_map(|(x, (_, col))| {
                    let values: Vec<f64> = runs
                        .iter()
                        .filter(|r| ids.contains(&r["run_id"]))
                        .filter_map(|r| r.get(col).and_then(|v| v.parse::<f64>().ok()))
                        .collect();
                    (!values.is_empty()).then(|| {
                        let (m, half) = mean_interval(&values);
                        (x as f64, m, half)
                    })
                })
                .collect();
            (!points.is_empty()).then(|| Series { label: label.clone(), points, ..Default::default() })
        })
        .collect();
    let title = format!("{name}: held-out loss at longer sequences than trained on{band}");
    line_chart(
        &dir.join("length_generalisation.png"),
        &series,
        &Axes {
            title: &title,
            x_label: "evaluation length (multiple of the training block)",
            y_label: "held-out loss",
            x_categories: Some(&categories),
        },
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
    }

    fn series(points: &[(f64, f64)]) -> Series {
        Series { label: "s".into(), points: points.iter().map(|&(x, y)| (x, y, 0.0)).collect(), ..Default::default() }
    }

    #[test]
    fn every_run_of_a_final_metric_is_kept_and_inside_the_axes() {
        let runs: Vec<BTreeMap<String, String>> =
            [("a", "0", "2.0"), ("a", "1", "3.0"), ("a", "2", "2.1"), ("b", "0", "1.0")]
                .iter()
                .map(|&(v, seed, loss)| {
                    row(&[("run_id", &format!("{v}{seed}")), ("variant", v), ("seed", seed), ("val_loss", loss)])
                })
                .collect();
        let ids: Vec<String> = runs.iter().map(|r| r["run_id"].clone()).collect();
        let s = final_metric_series(&runs, &ids, "variant", &[], "val_loss", "all");
        assert_eq!(s.len(), 1);
        let mut values: Vec<f64> = s[0].runs.iter().map(|p| p.1).collect();
        values.sort_by(f64::total_cmp);
        assert_eq!(values, vec![2.0, 2.1, 3.0], "a lone run is its own point; three seeds are three circles");
        let (lo, hi) = y_extent(&s, f64::MIN);
        assert!(lo <= 1.0 && hi >= 3.0);
    }

    #[test]
    fn bands_never_set_the_axis_range_and_a_loss_band_stays_above_zero() {
        // Two seeds: the first evaluation's 95% band is ±6 around a loss of 3, the rest ±0.01 around 0.5.
        let s = Series {
            label: "two seeds".into(),
            points: vec![(0.0, 3.0, 6.0), (100.0, 0.5, 0.01), (200.0, 0.45, 0.01)],
            ..Default::default()
        };
        let (lo, hi) = y_extent(std::slice::from_ref(&s), f64::MIN);
        assert_eq!((lo, hi), (0.45, 3.0), "the range is the data's, not the bands'");
        let range = (0.4, 3.1);
        assert_eq!(clipped_band(s.points[0], range, true), (0.4, 3.1), "cut at both axes");
        assert_eq!(clipped_band((0.0, 0.1, 0.5), (-1.0, 2.0), true), (0.0, 0.6), "a loss band never goes below 0");
        assert_eq!(clipped_band((0.0, -0.1, 0.5), (-1.0, 2.0), false), (-0.6, 0.4), "a signed metric keeps its band");
        assert!(bands_clipped(std::slice::from_ref(&s), range, true));
        assert!(!bands_clipped(&[series(&[(0.0, 1.0), (1.0, 2.0)])], range, true));
    }

    #[test]
    fn twelve_series_have_a_colour_each_and_every_series_a_look_of_its_own() {
        let colours: std::collections::BTreeSet<(u8, u8, u8)> =
            (0..12).map(|i| (colour(i).0, colour(i).1, colour(i).2)).collect();
        assert_eq!(colours.len(), 12);
        let looks: std::collections::BTreeSet<String> =
            (0..36).map(|i| format!("{:?} {:?} {:?}", colour(i), dash(i), marker(i))).collect();
        assert_eq!(looks.len(), 36);
        assert_ne!(marker(0), marker(12), "the second round of colours has another marker shape");
    }

    #[test]
    fn the_legend_panel_is_as_wide_as_its_labels_need() {
        let short = legend_width(["heads=1", "heads=16"]);
        assert!(short < 250, "{short}");
        let long = legend_width(["a label that is long enough to need every pixel of the panel it sits in"]);
        assert_eq!(long, LEGEND_WIDTH);
        assert!(legend_width(["pe=alibi, scale=sqrt_dk"]) > short);
    }

    #[test]
    fn category_labels_are_written_downwards_only_when_they_do_not_fit_across() {
        let short: Vec<String> = (0..4).map(|i| format!("h={i}")).collect();
        assert_eq!(rotated_categories(Some(&short), 1000), None);
        let long: Vec<String> = (0..9).map(|i| format!("post layer_norm + warm-up {i}")).collect();
        assert_eq!(rotated_categories(Some(&long), 1000), Some(27));
        assert_eq!(rotated_categories(None, 1000), None);
    }

    #[test]
    fn log_axis_only_for_an_initial_transient_of_positive_values() {
        // Loss 10 at step 0, then between 1 and 1.2: a linear axis would flatten everything after step 0.
        let transient: Vec<(f64, f64)> =
            (0..=100).map(|s| (s as f64, if s == 0 { 10.0 } else { 1.0 + 0.2 * (s % 2) as f64 })).collect();
        assert!(wants_log_y(&[series(&transient)], false));
        assert!(!wants_log_y(&[series(&transient)], true), "categories never get a log axis");
        let steady: Vec<(f64, f64)> = (0..=100).map(|s| (s as f64, 2.0 - s as f64 / 100.0)).collect();
        assert!(!wants_log_y(&[series(&steady)], false));
        let negative: Vec<(f64, f64)> = transient.iter().map(|&(x, y)| (x, y - 5.0)).collect();
        assert!(!wants_log_y(&[series(&negative)], false), "a log axis cannot show values <= 0");
    }

    #[test]
    fn a_swept_section_is_named_by_its_columns_that_vary() {
        let runs = vec![
            row(&[
                ("run_id", "1"),
                ("label", "a"),
                ("data.images.dataset", "mnist"),
                ("data.images.flip", "false"),
                ("acc", "0.9"),
            ]),
            row(&[
                ("run_id", "2"),
                ("label", "b"),
                ("data.images.dataset", "fashion"),
                ("data.images.flip", "false"),
                ("acc", "0.8"),
            ]),
            row(&[
                ("run_id", "3"),
                ("label", "c"),
                ("data.images.dataset", "fashion"),
                ("data.images.flip", "false"),
                ("acc", "0.7"),
            ]),
        ];
        assert_eq!(x_categories(&runs, "data.images"), ["dataset=mnist", "dataset=fashion"]);
        let ids: Vec<String> = vec!["1".into(), "2".into(), "3".into()];
        let s = final_metric_series(&runs, &ids, "data.images", &[], "acc", "accuracy");
        assert_eq!(s[0].label, "accuracy");
        // A metric only some runs have keeps every category's place on the axis.
        let only_c = final_metric_series(&runs, &["3".to_string()], "data.images", &[], "acc", "accuracy");
        assert_eq!(only_c[0].points, [(1.0, 0.7, 0.0)]);
        assert_eq!(s.len(), 1);
        let (x, mean, _) = s[0].points[1];
        assert_eq!(x, 1.0);
        assert!((mean - 0.75).abs() < 1e-12);
        // A key that is a column is read as is; one with no columns at all falls back to the label.
        assert_eq!(swept_value(&runs, &runs[0], "acc"), "0.9");
        assert_eq!(swept_value(&runs, &runs[2], "variant"), "c");
    }

    #[test]
    fn charts_are_drawn_with_the_legend_beside_the_data() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("c.png");
        let many: Vec<Series> = (0..12)
            .map(|i| Series {
                label: format!("variant {i} with a label long enough to be cut in the legend panel"),
                points: (0..5).map(|s| (s as f64, 1.0 + i as f64 + 1.0 / (1.0 + s as f64), 0.1)).collect(),
                ..Default::default()
            })
            .collect();
        line_chart(&path, &many, &Axes { title: "t", x_label: "step", y_label: "loss", x_categories: None }).unwrap();
        let cats: Vec<String> = (0..5).map(|i| format!("c{i}")).collect();
        let cat_path = dir.path().join("d.png");
        line_chart(&cat_path, &many, &Axes { title: "t", x_label: "k", y_label: "loss", x_categories: Some(&cats) })
            .unwrap();
        for p in [&path, &cat_path] {
            let bytes = std::fs::read(p).unwrap();
            assert_eq!(&bytes[1..4], b"PNG");
            // Width and height from the IHDR chunk.
            let w = u32::from_be_bytes(bytes[16..20].try_into().unwrap());
            let h = u32::from_be_bytes(bytes[20..24].try_into().unwrap());
            assert_eq!((w, h), (1280, 640));
        }
        // No temporary file is left beside the charts.
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 2);
        assert!(line_chart(&path, &[], &Axes { title: "t", x_label: "", y_label: "", x_categories: None }).is_err());
        assert_eq!(
            [short_number(1_500_000.0), short_number(250_000.0), short_number(1400.0), short_number(0.25)],
            ["1.5M", "250k", "1400", "0.25"]
        );
        assert_eq!(fit_label("short"), "short");
        assert_eq!(fit_label(&"x".repeat(60)).chars().count(), LEGEND_LINE);
        let long = "DaViT-T (windows of 7 + channel groups) (slope 2.11) and some more words to wrap";
        let lines = wrap_label(long);
        assert_eq!(lines.len(), 2);
        assert!(lines[0].len() <= LEGEND_LINE && long.starts_with(&lines[0]) && long.ends_with(&lines[1]));
        assert_eq!(wrap_label("short"), ["short"]);
    }
}
