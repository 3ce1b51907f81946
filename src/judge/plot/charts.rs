//! Charts: lines against steps with bands (or each seed), points with error bars against categories,
//! log-log cost curves with their analytic references, and heatmaps (head importance, attention weights).
//! Each takes its data and axes and writes one PNG through the canvas.
use anyhow::{anyhow, Result};
use plotters::coord::ranged1d::ValueFormatter;
use plotters::prelude::*;
use std::path::Path;

use super::canvas::*;
use crate::stats::Estimate;

/// Mean of a sample and the half-width of its confidence interval (0 for a single value: no band).
pub(super) fn mean_interval(values: &[f64]) -> (f64, f64) {
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
pub(super) const SEED_CURVES_UP_TO: usize = 2;

pub struct Axes<'a> {
    pub title: &'a str,
    pub x_label: &'a str,
    pub y_label: &'a str,
    /// Category names for the x positions 0, 1, 2, … (`None`: numeric x axis). Categories are drawn as
    /// points with error bars, never joined by lines.
    pub x_categories: Option<&'a [String]>,
}

/// Whether the y axis should be logarithmic: every value positive, and the whole range more than five
/// times the range past the first tenth of the x axis (an initial transient, such as the loss at step 0,
/// that a linear axis would either clip or let flatten everything after it).
pub(super) fn wants_log_y(series: &[Series], categorical: bool) -> bool {
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
    write_png(path, (1280, 640), |root| {
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
        Ok(())
    })
}

/// Smallest and largest x of the points.
pub(super) fn x_extent(series: &[Series]) -> (f64, f64) {
    series.iter().flat_map(|s| s.points.iter()).fold((f64::MAX, f64::MIN), |(a, b), p| (a.min(p.0), b.max(p.0)))
}

/// Lowest and highest y of the data at x ≥ `from`: the means and the single runs. Bands and error bars do
/// not set the range (with two seeds a 95% interval is 12.7 standard errors wide and would squeeze the data
/// into a sliver); they are clipped at the axes instead.
pub(super) fn y_extent(series: &[Series], from: f64) -> (f64, f64) {
    let means = series.iter().flat_map(|s| s.points.iter()).filter(|p| p.0 >= from).map(|p| p.1);
    let runs = series.iter().flat_map(|s| s.runs.iter()).filter(|p| p.0 >= from).map(|p| p.1);
    let seeds = series.iter().flat_map(|s| s.seed_curves.iter().flatten()).filter(|p| p.0 >= from).map(|p| p.1);
    means.chain(runs).chain(seeds).fold((f64::MAX, f64::MIN), |(lo, hi), y| (lo.min(y), hi.max(y)))
}

/// The font size of a centred caption: 18 points, smaller where that would not fit `width` pixels (a
/// centred caption wider than its panel is cut at both ends), at least 11.
pub(super) fn caption_size(caption: &str, width: u32) -> f64 {
    // About 0.55 of the font size per character of this sans-serif, plus a margin.
    let fitting = (width as f64 - 24.0) / (0.55 * caption.chars().count().max(1) as f64);
    fitting.clamp(11.0, 18.0)
}

/// The axis range for data spanning `data`: widened to show the bands, but by at most half the data's span
/// on each side (and never below zero for non-negative data), so that a band far wider than the data (two
/// seeds, an early evaluation) is clipped instead of squeezing the data into a sliver.
pub(super) fn with_bands(series: &[Series], (d0, d1): (f64, f64), non_negative: bool) -> (f64, f64) {
    let span = if d1 > d0 { d1 - d0 } else { (d1.abs() * 0.1).max(1e-6) };
    let (b0, b1) = series
        .iter()
        .flat_map(|s| s.points.iter().filter(|&&p| band_drawn(s, p)))
        .fold((d0, d1), |(lo, hi), p| (lo.min(p.1 - p.2), hi.max(p.1 + p.2)));
    let y0 = b0.max(d0 - 0.5 * span);
    let y0 = if non_negative { y0.max(0.0) } else { y0 };
    (y0, b1.min(d1 + 0.5 * span))
}

/// The band (or error bar) of a point cut to the axis range `(y0, y1)`, and never below zero where every
/// value of the chart is non-negative (a loss, an accuracy): (lower, upper).
pub(super) fn clipped_band((_, m, half): (f64, f64, f64), (y0, y1): (f64, f64), non_negative: bool) -> (f64, f64) {
    let floor = if non_negative { y0.max(0.0) } else { y0 };
    ((m - half).max(floor), (m + half).min(y1))
}

/// Whether point `p` of `s` is drawn with its band (or error bar): not where the runs themselves are drawn
/// instead (a line over at most `SEED_CURVES_UP_TO` runs, a category of as few runs).
pub(super) fn band_drawn(s: &Series, p: (f64, f64, f64)) -> bool {
    let runs_at = s.runs.iter().filter(|r| (r.0 - p.0).abs() < 1e-9).count();
    p.2 > 0.0 && s.seed_curves.is_empty() && (s.runs.is_empty() || runs_at > SEED_CURVES_UP_TO)
}

/// Whether some band of `series` reaches past the axis range (and is drawn clipped).
pub(super) fn bands_clipped(series: &[Series], range: (f64, f64), non_negative: bool) -> bool {
    series.iter().flat_map(|s| s.points.iter().filter(|&&p| band_drawn(s, p))).any(|&p| {
        let (lo, hi) = clipped_band(p, range, non_negative);
        lo > p.1 - p.2 + 1e-12 || hi < p.1 + p.2 - 1e-12
    })
}

/// One chart of `series` in `area`: every point inside its axes, on a logarithmic y axis (said on the axis)
/// where an initial transient of positive values calls for it.
pub(super) fn panel(
    area: &DrawingArea<BitMapBackend, plotters::coord::Shift>,
    series: &[Series],
    axes: &Axes,
    title: &str,
    (x0, x1): (f64, f64),
    linear: bool,
) -> Result<()> {
    let categorical = axes.x_categories.is_some();
    if series.iter().all(|s| s.points.is_empty()) {
        return Ok(());
    }
    let data = y_extent(series, f64::MIN);
    let non_negative = data.0 >= 0.0;
    let log = !linear && wants_log_y(series, categorical);
    let (mut y0, mut y1) = if log { data } else { with_bands(series, data, non_negative) };
    if log {
        let (lo, hi) = (y0.ln(), y1.ln());
        let pad = ((hi - lo) * 0.04).max(1e-6);
        y0 = (lo - pad).exp();
        y1 = (hi + pad).exp();
    } else {
        // A flat series (one point, or equal values) still gets a readable range around its value; one flat
        // at zero (an exact-match rate that stayed 0) gets ±0.01 rather than a range of rounding errors.
        let pad = if y0 == 0.0 && y1 == 0.0 {
            0.01
        } else {
            ((y1 - y0).abs() * 0.05).max(y1.abs().max(y0.abs()) * 0.01).max(1e-6)
        };
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
    builder
        .caption(&title, ("sans-serif", caption_size(&title, area.dim_in_pixel().0)))
        .margin(12)
        .x_label_area_size(x_area)
        .y_label_area_size(80);
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
pub(super) struct Frame<'a> {
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
pub(super) fn category_labels(
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
pub(super) const CATEGORY_CHAR_PX: u32 = 8;

/// The longest category label's length when the labels, written across, would not fit beside each other
/// in `width` pixels (they are then written upwards); `None` when they fit.
pub(super) fn rotated_categories(categories: Option<&[String]>, width: u32) -> Option<usize> {
    let cats = categories?;
    let longest = cats.iter().map(|c| fit_label(c).chars().count()).max().unwrap_or(0);
    let room = width.saturating_sub(100) / (cats.len().max(1) as u32);
    (longest as u32 * CATEGORY_CHAR_PX > room).then_some(longest)
}

pub(super) fn mesh<Y: Ranged<ValueType = f64> + ValueFormatter<f64>>(
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
pub(super) fn draw_series<Y: Ranged<ValueType = f64>>(
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

/// Labelled ticks for a log axis over [lo, hi]: 1, 2 and 5 times each power of ten in range, or, where fewer
/// than three of those fall in it, round linear steps across it (at least three).
pub(super) fn log_axis_ticks(lo: f64, hi: f64) -> Vec<f64> {
    let decades: Vec<f64> = (lo.log10().floor() as i32..=hi.log10().ceil() as i32)
        .flat_map(|d| [1.0, 2.0, 5.0].map(|k| k * 10f64.powi(d)))
        .filter(|y| (lo..=hi).contains(y))
        .collect();
    if decades.len() >= 3 {
        return decades;
    }
    let raw = (hi - lo) / 5.0;
    let power = 10f64.powf(raw.log10().floor());
    let step = [1.0, 2.0, 2.5, 5.0, 10.0].iter().map(|k| k * power).find(|s| *s >= raw).unwrap_or(10.0 * power);
    let first = (lo / step - 1e-9).ceil() as i64;
    let last = (hi / step + 1e-9).floor() as i64;
    (first..=last).map(|i| i as f64 * step).collect()
}

/// A tick's label: up to four significant digits, without trailing zeros (0.25, 2.4, 1000, 1.5e-05).
pub(super) fn tick_label(v: f64) -> String {
    if v == 0.0 {
        return "0".into();
    }
    let magnitude = v.abs().log10().floor() as i32;
    if !(-3..6).contains(&magnitude) {
        return format!("{v:.3e}").replace(".000e", "e").replace("00e", "e").replace("0e", "e");
    }
    let decimals = (3 - magnitude).max(0) as usize;
    let text = format!("{v:.decimals$}");
    if text.contains('.') {
        text.trim_end_matches('0').trim_end_matches('.').to_string()
    } else {
        text
    }
}

type LogAxis = plotters::coord::combinators::WithKeyPoints<plotters::coord::combinators::LogCoord<f64>>;
type LogLogChart<'a, 'b> = ChartContext<'a, BitMapBackend<'b>, Cartesian2d<LogAxis, LogAxis>>;

/// A log-log chart's axes on `area`: both axes logarithmic over their ranges, labelled ticks at the given
/// points, each axis named with "(log scale)", under `caption` at its font size (the cost curves' and the
/// compute frontiers' charts share it).
fn loglog_axes<'a, 'b>(
    area: &'a DrawingArea<BitMapBackend<'b>, plotters::coord::Shift>,
    (caption, size): (&str, f64),
    ((x0, x1), x_ticks): ((f64, f64), Vec<f64>),
    ((y0, y1), y_ticks): ((f64, f64), Vec<f64>),
    (x_label, y_label): (&str, &str),
) -> Result<LogLogChart<'a, 'b>> {
    let mut chart = ChartBuilder::on(area)
        .caption(caption, ("sans-serif", size))
        .margin(12)
        .x_label_area_size(45)
        .y_label_area_size(80)
        .build_cartesian_2d(
            (x0..x1).log_scale().with_key_points(x_ticks),
            (y0..y1).log_scale().with_key_points(y_ticks),
        )?;
    chart
        .configure_mesh()
        .x_desc(format!("{x_label} (log scale)"))
        .y_desc(format!("{y_label} (log scale)"))
        .label_style(("sans-serif", 14))
        .x_label_formatter(&|x: &f64| tick_label(*x))
        .y_label_formatter(&|y: &f64| tick_label(*y))
        .draw()?;
    Ok(chart)
}

/// Log-log chart: measured `series` as solid lines with markers, `references` (e.g. analytic FLOPs turned
/// into time) as grey dashed lines; the legend in a panel beside the data.
pub fn loglog_chart(path: &Path, series: &[Series], references: &[Series], axes: &Axes) -> Result<()> {
    // A series' single runs (drawn as markers without a line) count for the range and the ticks too.
    let all = series
        .iter()
        .chain(references)
        .flat_map(|s| s.points.iter().map(|&(x, y, _)| (x, y)).chain(s.runs.iter().copied()));
    let (mut x0, mut x1, mut y0, mut y1) = (f64::MAX, f64::MIN, f64::MAX, f64::MIN);
    for (x, y) in all {
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
    let mut ticks: Vec<f64> = series
        .iter()
        .flat_map(|s| s.points.iter().map(|p| p.0).chain(s.runs.iter().map(|r| r.0)))
        .filter(|x| *x > 0.0)
        .collect();
    ticks.sort_by(f64::total_cmp);
    ticks.dedup();
    // The y range fitted to the data, with a twentieth of its span (on the log axis) of room above and below
    // so that no point sits on the frame; ticks at 1, 2 and 5 times each power of ten in range, or, where
    // fewer than three of those fall in it (a loss from 2.3 to 2.8), at round steps across it.
    let room = (y1 / y0).powf(0.05).max(1.01);
    let (y_lo, y_hi) = (y0 / room, y1 * room);
    let y_ticks = log_axis_ticks(y_lo, y_hi);
    const GREYS: [RGBColor; 3] = [RGBColor(70, 70, 70), RGBColor(130, 130, 130), RGBColor(180, 180, 180)];
    let mut entries = series_entries(&series.iter().map(|s| s.label.clone()).collect::<Vec<_>>());
    for (i, s) in references.iter().enumerate() {
        entries.push(LegendEntry { label: s.label.clone(), colour: GREYS[i % 3], dash: Some((6, 4)), marker: None });
    }
    write_png(path, (1280, 700), |root| {
        let legend_w = legend_width(entries.iter().map(|e| e.label.as_str()));
        let (plot_area, legend_area) = root.split_horizontally(1280 - legend_w);
        legend(&legend_area, &entries)?;
        let mut chart = loglog_axes(
            &plot_area,
            (axes.title, 20.0),
            ((x0 * 0.9, x1 * 1.1), ticks.clone()),
            ((y_lo, y_hi), y_ticks.clone()),
            (axes.x_label, axes.y_label),
        )?;
        for (i, s) in series.iter().enumerate() {
            let c = colour(i);
            let line = s.points.iter().map(|&(x, y, _)| (x, y));
            match dash(i) {
                None => chart.draw_series(LineSeries::new(line, c.stroke_width(2)))?,
                Some((on, off)) => chart.draw_series(DashedLineSeries::new(line, on, off, c.stroke_width(2)))?,
            };
            let points: Vec<(f64, f64)> = s.points.iter().map(|&(x, y, _)| (x, y)).collect();
            draw_markers(&mut chart, &points, marker(i), 3, c)?;
            draw_markers(&mut chart, &s.runs, marker(i), 3, c)?;
        }
        for (i, s) in references.iter().enumerate() {
            let line = s.points.iter().map(|&(x, y, _)| (x, y));
            chart.draw_series(DashedLineSeries::new(line, 6, 4, GREYS[i % 3].stroke_width(2)))?;
        }
        Ok(())
    })
}

/// A layer × head grid of loss changes (`values[l][h]`), each cell shaded by its value — blue where removing
/// the head raises the loss, red where it lowers it, white at 0, relative to the largest magnitude — and
/// labelled with the number itself.
pub fn importance_heatmap(path: &Path, values: &[Vec<f64>], title: &str) -> Result<()> {
    let layers = values.len();
    let heads = values.iter().map(Vec::len).max().unwrap_or(0);
    if layers == 0 || heads == 0 {
        return Err(anyhow!("no heads to draw"));
    }
    let largest = values.iter().flatten().fold(1e-12f64, |m, v| m.max(v.abs()));
    let (cell_w, cell_h) = (90u32, 44u32);
    let (width, height) = ((cell_w * heads as u32 + 140).max(900), cell_h * layers as u32 + 130);
    write_png(path, (width, height), |root| {
        root.draw(&Text::new(title.to_string(), (10, 8), ("sans-serif", 16)))?;
        root.draw(&Text::new(
            format!("Δ validation loss (nats/token): blue = removing the head hurts, red = it helps; shade relative to the largest |Δ| = {largest:.4}"),
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
        Ok(())
    })
}

/// Attention weights as heatmaps: one row of panels per layer, one panel per head; `maps[l]` is (H, N, N)
/// with queries as rows and keys as columns. Darker is more weight (each panel scaled to its own maximum).
pub fn attention_heatmaps(path: &Path, maps: &[tch::Tensor], title: &str) -> Result<()> {
    let layers = maps.len();
    let heads = maps.first().map_or(0, |m| m.size()[0] as usize);
    if layers == 0 || heads == 0 {
        return Err(anyhow!("no attention weights to draw"));
    }
    let cell = 260u32;
    let width = cell * heads as u32 + 20;
    write_png(path, (width, cell * layers as u32 + 80), |root| {
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
        Ok(())
    })
}

/// One arm of a compute chart: its runs (compute, value), and its fitted frontier at points along the ladder
/// (compute, centre, lower, upper), the band being the 95% interval over the seeds' own frontiers.
pub struct FrontierBand {
    pub label: String,
    pub runs: Vec<(f64, f64)>,
    pub frontier: Vec<(f64, f64, f64, f64)>,
}

/// One arm's gain over the baseline against the target value L*: (target, gain, lower, upper), the band its
/// 95% interval; `marked` are the stated targets, drawn as markers on the curve.
pub struct GainBand {
    pub label: String,
    /// The arm's index among the frontier chart's arms, so that both panels give it one colour.
    pub arm: usize,
    pub points: Vec<(f64, f64, f64, f64)>,
    pub marked: Vec<(f64, f64)>,
}

/// What the compute chart's two panels are called, and the lines the gain panel is read against.
pub struct ComputeAxes<'a> {
    pub title: &'a str,
    pub compute_label: &'a str,
    pub value_label: &'a str,
    /// A line drawn across the gain panel with its legend label (the prediction), beside the line at 1.
    pub predicted: Option<(f64, String)>,
    /// What the gain panel says where it has no curve (every arm's law misfits, or no gain is defined).
    pub no_gain: &'a str,
}

/// The two-panel compute chart: on the left each arm's runs and fitted frontier with its band against compute
/// (both axes logarithmic, ticks labelled), on the right each arm's gain against the target value with its
/// band, read against 1 (no gain) and the prediction; the legend beside both.
pub fn compute_chart(path: &Path, arms: &[FrontierBand], gains: &[GainBand], axes: &ComputeAxes) -> Result<()> {
    let xs = arms.iter().flat_map(|a| a.runs.iter().map(|r| r.0).chain(a.frontier.iter().map(|f| f.0)));
    let ys = arms.iter().flat_map(|a| a.runs.iter().map(|r| r.1).chain(a.frontier.iter().flat_map(|f| [f.2, f.3])));
    let extent = |it: &mut dyn Iterator<Item = f64>| {
        it.filter(|v| v.is_finite() && *v > 0.0).fold((f64::MAX, f64::MIN), |(lo, hi), v| (lo.min(v), hi.max(v)))
    };
    let (x0, x1) = extent(&mut xs.into_iter());
    let (y0, y1) = extent(&mut ys.into_iter());
    if !(x0 < x1 && y0 < y1) {
        return Err(anyhow!("nothing to plot for {}", path.display()));
    }
    let mut x_ticks: Vec<f64> = arms.iter().flat_map(|a| a.runs.iter().map(|r| r.0)).collect();
    x_ticks.sort_by(f64::total_cmp);
    x_ticks.dedup();
    let room = (y1 / y0).powf(0.05).max(1.01);
    let (y_lo, y_hi) = (y0 / room, y1 * room);
    let y_ticks = log_axis_ticks(y_lo, y_hi);
    let mut entries = series_entries(&arms.iter().map(|a| a.label.clone()).collect::<Vec<_>>());
    entries.push(LegendEntry {
        label: "no gain (1×)".into(),
        colour: RGBColor(110, 110, 110),
        dash: None,
        marker: None,
    });
    if let Some((_, label)) = &axes.predicted {
        entries.push(LegendEntry {
            label: label.clone(),
            colour: RGBColor(110, 110, 110),
            dash: Some((6, 4)),
            marker: None,
        });
    }
    let (width, height) = (1700, 720);
    write_png(path, (width, height), |root| {
        let legend_w = legend_width(entries.iter().map(|e| e.label.as_str()));
        let (body, legend_area) = root.split_horizontally(width - legend_w);
        legend(&legend_area, &entries)?;
        let body = body.titled(axes.title, ("sans-serif", caption_size(axes.title, width - legend_w)))?;
        let (left, right) = body.split_horizontally((width - legend_w) / 2);
        let mut chart = loglog_axes(
            &left,
            ("the frontiers: each run, and the fit with its 95% band over seeds", 15.0),
            ((x0 * 0.9, x1 * 1.1), x_ticks.clone()),
            ((y_lo, y_hi), y_ticks.clone()),
            (axes.compute_label, axes.value_label),
        )?;
        for (i, arm) in arms.iter().enumerate() {
            let c = colour(i);
            let upper = arm.frontier.iter().map(|f| (f.0, f.3.clamp(y_lo, y_hi)));
            let lower = arm.frontier.iter().rev().map(|f| (f.0, f.2.clamp(y_lo, y_hi)));
            chart.draw_series(std::iter::once(Polygon::new(
                upper.chain(lower).collect::<Vec<_>>(),
                c.mix(0.18).filled(),
            )))?;
            let centre = arm.frontier.iter().map(|f| (f.0, f.1));
            chart.draw_series(DashedLineSeries::new(centre, 8, 5, c.stroke_width(2)))?;
            draw_markers(&mut chart, &arm.runs, marker(i), 3, c)?;
        }
        gain_panel(&right, gains, axes)
    })
}

/// The right panel of [`compute_chart`]: gains against target values on a logarithmic gain axis.
fn gain_panel(area: &Canvas, gains: &[GainBand], axes: &ComputeAxes) -> Result<()> {
    let caption = "what each arm is worth: × the baseline's compute, with its 95% band";
    let finite = |v: &f64| v.is_finite() && *v > 0.0;
    let (mut x0, mut x1, mut y0, mut y1) = (f64::MAX, f64::MIN, 1.0f64, 1.0f64);
    for g in gains {
        for p in &g.points {
            x0 = x0.min(p.0);
            x1 = x1.max(p.0);
            for v in [p.1, p.2, p.3].into_iter().filter(finite) {
                y0 = y0.min(v);
                y1 = y1.max(v);
            }
        }
    }
    if let Some((p, _)) = axes.predicted {
        y0 = y0.min(p);
        y1 = y1.max(p);
    }
    if x0 >= x1 {
        let area = area.titled(caption, ("sans-serif", 15))?;
        let (w, h) = area.dim_in_pixel();
        let style = TextStyle::from(("sans-serif", 16).into_font()).pos(plotters::style::text_anchor::Pos::new(
            plotters::style::text_anchor::HPos::Center,
            plotters::style::text_anchor::VPos::Center,
        ));
        area.draw(&Text::new(axes.no_gain.to_string(), (w as i32 / 2, h as i32 / 2), style))?;
        return Ok(());
    }
    let room = (y1 / y0).powf(0.05).max(1.02);
    let (y_lo, y_hi) = (y0 / room, y1 * room);
    let pad = (x1 - x0) * 0.04;
    let mut chart = ChartBuilder::on(area)
        .caption(caption, ("sans-serif", 15))
        .margin(12)
        .x_label_area_size(45)
        .y_label_area_size(70)
        .build_cartesian_2d(x0 - pad..x1 + pad, (y_lo..y_hi).log_scale().with_key_points(log_axis_ticks(y_lo, y_hi)))?;
    chart
        .configure_mesh()
        .x_desc(format!("target {} L*", axes.value_label))
        .y_desc("worth (× the baseline's compute, log scale)")
        .max_light_lines(1)
        .label_style(("sans-serif", 14))
        .x_label_formatter(&|x: &f64| tick_label(*x))
        .y_label_formatter(&|y: &f64| tick_label(*y))
        .draw()?;
    let grey = RGBColor(110, 110, 110);
    chart.draw_series(LineSeries::new([(x0 - pad, 1.0), (x1 + pad, 1.0)], grey.stroke_width(2)))?;
    if let Some((p, _)) = axes.predicted {
        chart.draw_series(DashedLineSeries::new([(x0 - pad, p), (x1 + pad, p)], 6, 4, grey.stroke_width(2)))?;
    }
    for g in gains {
        let c = colour(g.arm);
        let upper = g.points.iter().map(|p| (p.0, p.3.clamp(y_lo, y_hi)));
        let lower = g.points.iter().rev().map(|p| (p.0, p.2.clamp(y_lo, y_hi)));
        chart
            .draw_series(std::iter::once(Polygon::new(upper.chain(lower).collect::<Vec<_>>(), c.mix(0.18).filled())))?;
        chart.draw_series(LineSeries::new(g.points.iter().map(|p| (p.0, p.1)), c.stroke_width(2)))?;
        draw_markers(&mut chart, &g.marked, marker(g.arm), 5, c)?;
    }
    Ok(())
}
