//! The canvas every chart is drawn on: the embedded font, the palette (colours, dashes, marker shapes by
//! series), the legend panel beside the data, number labels, and the PNG file itself (written to a
//! temporary name, recompressed, renamed: [`write_png`]).
use anyhow::Result;
use plotters::coord::Shift;
use plotters::prelude::*;
use std::path::Path;
use std::sync::Once;

/// A whole image being drawn.
pub type Canvas<'a> = DrawingArea<BitMapBackend<'a>, Shift>;

/// Draws a `size` PNG at `path` with `draw` on a white canvas: written to a temporary file beside it,
/// recompressed, then renamed, so a reader never sees half a plot.
pub fn write_png(path: &Path, size: (u32, u32), draw: impl FnOnce(&Canvas) -> Result<()>) -> Result<()> {
    register_font();
    crate::files::write_atomically_with(path, |tmp| {
        let root = BitMapBackend::new(tmp, size).into_drawing_area();
        root.fill(&WHITE)?;
        draw(&root)?;
        root.present()?;
        drop(root);
        recompress_png(tmp)
    })
}

pub(super) static FONT: Once = Once::new();

pub(crate) fn register_font() {
    FONT.call_once(|| {
        // Embedded so plots render identically on machines without system fonts.
        let bytes: &'static [u8] = include_bytes!("../../../assets/DejaVuSans.ttf");
        let _ = plotters::style::register_font("sans-serif", FontStyle::Normal, bytes);
    });
}

/// Twelve colours (Tableau's eight without the grey and olive that wash out, then black, wine, dark olive
/// and indigo), so that up to twelve series each have a colour of their own; past twelve, each round of the
/// palette has its own dash and marker shape: 36 series that no two look alike.
pub(super) const PALETTE: [RGBColor; 12] = [
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
pub(super) fn dash(i: usize) -> Option<(u32, u32)> {
    match (i / PALETTE.len()) % 3 {
        0 => None,
        1 => Some((10, 6)),
        _ => Some((3, 4)),
    }
}

pub(super) fn colour(i: usize) -> RGBColor {
    PALETTE[i % PALETTE.len()]
}

/// The marker shape of series `i`, by the round of the palette: a disc, a triangle, a square.
#[derive(Clone, Copy, PartialEq, Debug)]
pub(super) enum Marker {
    Disc,
    Triangle,
    Square,
}

pub(super) fn marker(i: usize) -> Marker {
    match (i / PALETTE.len()) % 3 {
        0 => Marker::Disc,
        1 => Marker::Triangle,
        _ => Marker::Square,
    }
}

/// Filled markers of `shape` at `points` of a chart, `size` pixels from centre to edge.
pub(super) fn draw_markers<X: Ranged<ValueType = f64>, Y: Ranged<ValueType = f64>>(
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
pub(super) fn draw_marker_at<DB: DrawingBackend>(
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

/// The widest a chart's legend panel gets (to the right of the data, never over it).
pub(super) const LEGEND_WIDTH: u32 = 400;

/// The legend panel's width for `labels`: as wide as the longest line of a label needs (about 8 pixels a
/// character after the 48-pixel key), between 160 and `LEGEND_WIDTH` pixels.
pub(super) fn legend_width<'a>(labels: impl IntoIterator<Item = &'a str>) -> u32 {
    let longest = labels.into_iter().flat_map(wrap_label).map(|l| l.chars().count()).max().unwrap_or(0);
    (56 + 8 * longest as u32).clamp(160, LEGEND_WIDTH)
}

/// Characters of legend text that fit one line of its panel.
pub(super) const LEGEND_LINE: usize = 50;

/// Text cut to `LEGEND_LINE` characters, with an ellipsis when cut.
pub(super) fn fit_label(label: &str) -> String {
    if label.chars().count() <= LEGEND_LINE {
        label.to_string()
    } else {
        label.chars().take(LEGEND_LINE - 1).chain(std::iter::once('…')).collect()
    }
}

/// A legend label on at most two lines: broken at the last space that fits, the rest cut if still too long.
pub(super) fn wrap_label(label: &str) -> Vec<String> {
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
pub(super) struct LegendEntry {
    pub label: String,
    pub colour: RGBColor,
    pub dash: Option<(u32, u32)>,
    pub marker: Option<Marker>,
}

/// The legend entries of `labels` drawn as line charts draw series i: its colour and dash, with a marker.
pub(super) fn series_entries(labels: &[String]) -> Vec<LegendEntry> {
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
pub(super) fn legend<DB: DrawingBackend>(
    area: &DrawingArea<DB, plotters::coord::Shift>,
    entries: &[LegendEntry],
) -> Result<()>
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

/// Colours a chart keeps exactly: a PNG palette's size.
const PALETTE_SIZE: usize = 256;

/// Re-encodes the chart at `path` as an indexed PNG (at most 256 colours) at the best compression with
/// per-row adaptive filters: about 2.5 times smaller than an RGB PNG at the best compression and 6 times
/// smaller than plotters' fast encoding, which keeps the committed results small enough to travel (the tracked
/// tree's limit, tests/tree_size.rs). A chart of at most 256 colours is encoded exactly. One with more (the
/// blends of antialiased, translucent bands) keeps its 256 most frequent colours exactly (the background, every
/// series' colour, the text, the common blends) and draws each rarer blend in the nearest of them: a
/// popularity palette, unlike a clustering quantiser, never shifts a series' own colour.
pub fn recompress_png(path: &Path) -> Result<()> {
    let decoder = png::Decoder::new(std::io::BufReader::new(std::fs::File::open(path)?));
    let mut reader = decoder.read_info()?;
    let mut pixels = vec![0; reader.output_buffer_size()];
    let info = reader.next_frame(&mut pixels)?;
    pixels.truncate(info.buffer_size());
    let mut out = Vec::new();
    {
        let mut encoder = png::Encoder::new(&mut out, info.width, info.height);
        encoder.set_compression(png::Compression::Best);
        encoder.set_adaptive_filter(png::AdaptiveFilterType::Adaptive);
        if info.color_type == png::ColorType::Rgb && info.bit_depth == png::BitDepth::Eight {
            let (palette, indices) = popularity_palette(&pixels);
            encoder.set_color(png::ColorType::Indexed);
            encoder.set_depth(png::BitDepth::Eight);
            encoder.set_palette(palette.concat());
            encoder.write_header()?.write_image_data(&indices)?;
        } else {
            encoder.set_color(info.color_type);
            encoder.set_depth(info.bit_depth);
            encoder.write_header()?.write_image_data(&pixels)?;
        }
    }
    std::fs::write(path, out)?;
    Ok(())
}

/// The palette of an 8-bit RGB image (its [`PALETTE_SIZE`] most frequent colours, ties broken by the colour,
/// so the result does not depend on a hash order) and each pixel's index into it: its own colour's where the
/// palette has it, else the nearest palette colour's (squared RGB distance, the lower index on a tie).
pub fn popularity_palette(rgb: &[u8]) -> (Vec<[u8; 3]>, Vec<u8>) {
    let mut counts: std::collections::HashMap<[u8; 3], u64> = std::collections::HashMap::new();
    for pixel in rgb.chunks_exact(3) {
        *counts.entry([pixel[0], pixel[1], pixel[2]]).or_default() += 1;
    }
    let mut colours: Vec<([u8; 3], u64)> = counts.into_iter().collect();
    colours.sort_by(|(a, n), (b, m)| m.cmp(n).then(a.cmp(b)));
    let palette: Vec<[u8; 3]> = colours.iter().take(PALETTE_SIZE).map(|(c, _)| *c).collect();
    let distance =
        |a: &[u8; 3], b: &[u8; 3]| -> u32 { (0..3).map(|k| (a[k] as i32 - b[k] as i32).pow(2) as u32).sum() };
    let index: std::collections::HashMap<[u8; 3], u8> = colours
        .iter()
        .map(|(colour, _)| {
            let nearest = (0..palette.len()).min_by_key(|&i| (distance(colour, &palette[i]), i)).unwrap_or(0);
            (*colour, nearest as u8)
        })
        .collect();
    let indices = rgb.chunks_exact(3).map(|p| index[&[p[0], p[1], p[2]]]).collect();
    (palette, indices)
}

/// An axis number short enough not to run into its neighbours: `1.5M`, `250k`, `1400`, `0.25`.
pub(super) fn short_number(x: f64) -> String {
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

pub(super) type Chart<'a, Y> =
    ChartContext<'a, BitMapBackend<'a>, Cartesian2d<plotters::coord::types::RangedCoordf64, Y>>;
