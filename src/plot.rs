//! PNG plots of a recipe's results: a metric against step (one line per variant, mean ± std band across
//! seeds) and the final metric against the swept value. Files are drawn to a temporary name and renamed.
use anyhow::{anyhow, Result};
use plotters::prelude::*;
use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Once;

use crate::results::Curves;

static FONT: Once = Once::new();

fn register_font() {
    FONT.call_once(|| {
        // Embedded so plots render identically on machines without system fonts.
        let bytes: &'static [u8] = include_bytes!("../assets/DejaVuSans.ttf");
        let _ = plotters::style::register_font("sans-serif", FontStyle::Normal, bytes);
    });
}

const PALETTE: [RGBColor; 10] = [
    RGBColor(31, 119, 180),
    RGBColor(255, 127, 14),
    RGBColor(44, 160, 44),
    RGBColor(214, 39, 40),
    RGBColor(148, 103, 189),
    RGBColor(140, 86, 75),
    RGBColor(227, 119, 194),
    RGBColor(127, 127, 127),
    RGBColor(188, 189, 34),
    RGBColor(23, 190, 207),
];

/// Mean and (population) standard deviation.
pub fn mean_std(values: &[f64]) -> (f64, f64) {
    let n = values.len() as f64;
    let mean = values.iter().sum::<f64>() / n;
    let var = values.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / n;
    (mean, var.sqrt())
}

/// One line of a chart: label and points (x, mean, std).
pub struct Series {
    pub label: String,
    pub points: Vec<(f64, f64, f64)>,
}

/// Averages a metric's curve over the runs of each variant, step by step (steps every seed recorded).
pub fn variant_curves(curves: &Curves, variants: &[(String, Vec<String>)], metric: &str) -> Vec<Series> {
    let mut out = Vec::new();
    for (label, run_ids) in variants {
        let mut by_step: BTreeMap<i64, Vec<f64>> = BTreeMap::new();
        let mut runs_with_metric = 0;
        for id in run_ids {
            if let Some(points) = curves.get(id).and_then(|m| m.get(metric)) {
                runs_with_metric += 1;
                for &(s, v) in points {
                    by_step.entry(s).or_default().push(v);
                }
            }
        }
        let points: Vec<(f64, f64, f64)> = by_step
            .into_iter()
            .filter(|(_, vs)| vs.len() == runs_with_metric)
            .filter_map(|(s, vs)| {
                let finite: Vec<f64> = vs.into_iter().filter(|v| v.is_finite()).collect();
                (!finite.is_empty()).then(|| {
                    let (m, sd) = mean_std(&finite);
                    (s as f64, m, sd)
                })
            })
            .collect();
        if !points.is_empty() {
            out.push(Series { label: label.clone(), points });
        }
    }
    out
}

pub struct Axes<'a> {
    pub title: &'a str,
    pub x_label: &'a str,
    pub y_label: &'a str,
    /// Category names for the x positions 0, 1, 2, … (`None`: numeric x axis).
    pub x_categories: Option<&'a [String]>,
    /// Fit the y range to the last 90% of the x range, so an initial transient (the loss at step 0) does not
    /// flatten the differences that matter; earlier points are still drawn, clipped.
    pub zoom_past_start: bool,
}

/// Draws `series` as lines with ±std bands (and markers for category charts) into `path`.
pub fn line_chart(path: &Path, series: &[Series], axes: &Axes) -> Result<()> {
    register_font();
    if series.is_empty() {
        return Err(anyhow!("nothing to plot for {}", path.display()));
    }
    let pts = || series.iter().flat_map(|s| s.points.iter());
    let (mut x0, mut x1, mut y0, mut y1) = (f64::MAX, f64::MIN, f64::MAX, f64::MIN);
    for &(x, _, _) in pts() {
        x0 = x0.min(x);
        x1 = x1.max(x);
    }
    let y_from = if axes.zoom_past_start { x0 + 0.1 * (x1 - x0) } else { f64::MIN };
    for &(x, m, sd) in pts() {
        if x >= y_from {
            y0 = y0.min(m - sd);
            y1 = y1.max(m + sd);
        }
    }
    if axes.x_categories.is_some() {
        x0 -= 0.5;
        x1 += 0.5;
    }
    if x1 <= x0 {
        x1 = x0 + 1.0;
    }
    let pad = ((y1 - y0).abs() * 0.05).max(1e-6);
    let (y0, y1) = (y0 - pad, y1 + pad);

    let tmp = path.with_extension("tmp.png");
    {
        let root = BitMapBackend::new(&tmp, (960, 600)).into_drawing_area();
        root.fill(&WHITE)?;
        let mut chart = ChartBuilder::on(&root)
            .caption(axes.title, ("sans-serif", 22))
            .margin(12)
            .x_label_area_size(45)
            .y_label_area_size(70)
            .build_cartesian_2d(x0..x1, y0..y1)?;
        let cats = axes.x_categories.map(|c| c.to_vec());
        chart
            .configure_mesh()
            .x_desc(axes.x_label)
            .y_desc(axes.y_label)
            .label_style(("sans-serif", 14))
            .x_label_formatter(&|x: &f64| match &cats {
                Some(c) => {
                    let i = x.round();
                    if (x - i).abs() < 1e-6 && i >= 0.0 && (i as usize) < c.len() {
                        c[i as usize].clone()
                    } else {
                        String::new()
                    }
                }
                None => format!("{x}"),
            })
            .draw()?;
        for (i, s) in series.iter().enumerate() {
            let color = PALETTE[i % PALETTE.len()];
            if s.points.iter().any(|p| p.2 > 0.0) {
                let upper = s.points.iter().map(|&(x, m, sd)| (x, m + sd));
                let lower = s.points.iter().rev().map(|&(x, m, sd)| (x, m - sd));
                let band: Vec<(f64, f64)> = upper.chain(lower).collect();
                chart.draw_series(std::iter::once(Polygon::new(band, color.mix(0.18).filled())))?;
            }
            chart
                .draw_series(LineSeries::new(s.points.iter().map(|&(x, m, _)| (x, m)), color.stroke_width(2)))?
                .label(s.label.clone())
                .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 18, y)], color.stroke_width(3)));
            if axes.x_categories.is_some() || s.points.len() == 1 {
                chart.draw_series(s.points.iter().map(|&(x, m, _)| Circle::new((x, m), 4, color.filled())))?;
            }
        }
        chart
            .configure_series_labels()
            .background_style(WHITE.mix(0.85))
            .border_style(BLACK.mix(0.4))
            .label_font(("sans-serif", 14))
            .position(SeriesLabelPosition::UpperRight)
            .draw()?;
        root.present()?;
    }
    std::fs::rename(&tmp, path)?;
    Ok(())
}

/// Log-log chart: measured `series` as solid lines with markers, `references` (e.g. analytic FLOPs turned
/// into time) as dashed lines.
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
    let tmp = path.with_extension("tmp.png");
    {
        let root = BitMapBackend::new(&tmp, (1100, 700)).into_drawing_area();
        root.fill(&WHITE)?;
        let mut chart = ChartBuilder::on(&root)
            .caption(axes.title, ("sans-serif", 22))
            .margin(12)
            .x_label_area_size(45)
            .y_label_area_size(80)
            .build_cartesian_2d((x0 * 0.9..x1 * 1.1).log_scale(), (y0 * 0.8..y1 * 1.25).log_scale())?;
        chart
            .configure_mesh()
            .x_desc(axes.x_label)
            .y_desc(axes.y_label)
            .label_style(("sans-serif", 14))
            .x_label_formatter(&|x: &f64| format!("{x:.0}"))
            .y_label_formatter(&|y: &f64| format!("{y}"))
            .draw()?;
        for (i, s) in series.iter().enumerate() {
            let color = PALETTE[i % PALETTE.len()];
            chart
                .draw_series(LineSeries::new(s.points.iter().map(|&(x, y, _)| (x, y)), color.stroke_width(2)))?
                .label(s.label.clone())
                .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 18, y)], color.stroke_width(3)));
            chart.draw_series(s.points.iter().map(|&(x, y, _)| Circle::new((x, y), 3, color.filled())))?;
        }
        for (i, s) in references.iter().enumerate() {
            let color = BLACK.mix(0.35 + 0.3 * i as f64);
            chart
                .draw_series(DashedLineSeries::new(
                    s.points.iter().map(|&(x, y, _)| (x, y)),
                    6,
                    4,
                    color.stroke_width(2),
                ))?
                .label(s.label.clone())
                .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 18, y)], color.stroke_width(2)));
        }
        chart
            .configure_series_labels()
            .background_style(WHITE.mix(0.85))
            .border_style(BLACK.mix(0.4))
            .label_font(("sans-serif", 13))
            .position(SeriesLabelPosition::UpperLeft)
            .draw()?;
        root.present()?;
    }
    std::fs::rename(&tmp, path)?;
    Ok(())
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
    let cell = 240u32;
    let tmp = path.with_extension("tmp.png");
    {
        let root = BitMapBackend::new(&tmp, (cell * heads as u32 + 20, cell * layers as u32 + 60)).into_drawing_area();
        root.fill(&WHITE)?;
        let (top, body) = root.split_vertically(50);
        top.draw(&Text::new(title.to_string(), (10, 15), ("sans-serif", 20)))?;
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
                    .caption(format!("layer {l}, head {h}"), ("sans-serif", 14))
                    .margin(6)
                    .build_cartesian_2d(0..n, 0..n)?;
                chart.draw_series((0..n).flat_map(|i| (0..n).map(move |j| (i, j))).map(|(i, j)| {
                    let v = (values[i * n + j] / max).clamp(0.0, 1.0) as f64;
                    let shade = (255.0 * (1.0 - v)) as u8;
                    // Row i (query) drawn from the top.
                    Rectangle::new([(j, n - 1 - i), (j + 1, n - i)], RGBColor(shade, shade, 255).filled())
                }))?;
            }
        }
        root.present()?;
    }
    std::fs::rename(&tmp, path)?;
    Ok(())
}
