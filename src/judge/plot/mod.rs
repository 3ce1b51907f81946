//! PNG plots: the canvas (font, palette, legend, the file), charts over it (lines, points, log-log curves,
//! heatmaps), and the figures of a recipe's results made from those charts, among them the interaction
//! matrices of attention patterns. Imports run canvas → charts → figures, never back.
pub mod canvas;
pub mod charts;
pub mod figures;
pub mod interaction;

pub use charts::{attention_heatmaps, importance_heatmap, line_chart, loglog_chart, Axes, Series};
pub use figures::{chart_file, plot_results, variant_curves};

#[cfg(test)]
mod tests {
    use super::canvas::*;
    use super::charts::*;
    use super::figures::*;
    use std::collections::BTreeMap;

    fn row(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
    }

    fn series(points: &[(f64, f64)]) -> Series {
        Series { label: "s".into(), points: points.iter().map(|&(x, y)| (x, y, 0.0)).collect(), ..Default::default() }
    }

    #[test]
    fn a_log_axis_over_a_narrow_range_gets_several_round_ticks() {
        // A loss from 2.3 to 2.8 has no 1, 2 or 5 × 10^k inside but 5 nearby: round steps of 0.1 instead.
        let narrow = log_axis_ticks(2.3, 2.8);
        assert_eq!(narrow.len(), 6, "{narrow:?}");
        assert!(narrow.iter().all(|t| (2.3 - 1e-9..=2.8 + 1e-9).contains(t)));
        assert_eq!(
            narrow.iter().map(|t| tick_label(*t)).collect::<Vec<_>>(),
            ["2.3", "2.4", "2.5", "2.6", "2.7", "2.8"]
        );
        // Two decades keep the 1–2–5 ticks.
        assert_eq!(log_axis_ticks(0.5, 60.0), [0.5, 1.0, 2.0, 5.0, 10.0, 20.0, 50.0]);
        assert_eq!(tick_label(1000.0), "1000");
        assert_eq!(tick_label(0.125), "0.125");
        assert_eq!(tick_label(1.5e-5), "1.5e-5");
    }

    #[test]
    fn every_run_of_a_final_metric_is_kept_and_inside_the_axes() {
        let runs: Vec<BTreeMap<String, String>> =
            [("a", "0", "2.0"), ("a", "1", "3.0"), ("a", "2", "2.1"), ("b", "0", "1.0")]
                .iter()
                .map(|&(v, seed, loss)| {
                    row(&[("run_id", &format!("{v}{seed}")), ("variant", v), ("seed", seed), ("test_loss", loss)])
                })
                .collect();
        let ids: Vec<String> = runs.iter().map(|r| r["run_id"].clone()).collect();
        let s = final_metric_series(&runs, &ids, "variant", &[], "test_loss", "all");
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
    fn the_axis_shows_modest_bands_whole_and_stops_half_a_span_past_the_data() {
        let modest = Series { label: "a".into(), points: vec![(0.0, 1.0, 0.1), (1.0, 2.0, 0.1)], ..Default::default() };
        let close = |(a, b): (f64, f64), (c, d): (f64, f64)| (a - c).abs() < 1e-12 && (b - d).abs() < 1e-12;
        assert!(close(with_bands(std::slice::from_ref(&modest), (1.0, 2.0), true), (0.9, 2.1)), "shown whole");
        let wide = Series { label: "b".into(), points: vec![(0.0, 1.0, 5.0), (1.0, 2.0, 0.1)], ..Default::default() };
        assert!(close(with_bands(std::slice::from_ref(&wide), (1.0, 2.0), false), (0.5, 2.5)), "half a span");
        assert!(close(with_bands(std::slice::from_ref(&wide), (0.2, 2.0), true), (0.0, 2.9)), "not below zero");
    }

    #[test]
    fn a_long_caption_shrinks_to_its_panel_and_a_short_one_keeps_its_size() {
        assert_eq!(caption_size("heads: held-out loss", 880), 18.0);
        let long = "vit_transfer: final test accuracy on the pre-training images, before fine-tuning against variant (mean, 95% CI over n = 3 seeds)";
        let size = caption_size(long, 880);
        assert!(
            (11.0..18.0).contains(&size) && 0.55 * size * long.chars().count() as f64 <= 880.0 - 24.0 + 1e-9,
            "{size}"
        );
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
    fn blank_columns_neither_hide_a_category_nor_fill_a_legend() {
        // runs.csv leaves a default recorded nowhere blank (vision.registers: 0): the label says it.
        let runs = vec![
            row(&[("run_id", "1"), ("label", "registers=0 lr=0.1"), ("vision.registers", ""), ("acc", "0.5")]),
            row(&[("run_id", "2"), ("label", "registers=4 lr=0.1"), ("vision.registers", "4"), ("acc", "0.6")]),
        ];
        assert_eq!(x_categories(&runs, "vision.registers"), ["0", "4"]);
        // A swept section: the keys a task leaves blank are not part of its name.
        let runs = vec![
            row(&[
                ("run_id", "1"),
                ("label", "a"),
                ("s.task", "listops"),
                ("s.image_size", ""),
                ("s.max_length", "500"),
            ]),
            row(&[
                ("run_id", "2"),
                ("label", "b"),
                ("s.task", "pathfinder"),
                ("s.image_size", "32"),
                ("s.max_length", ""),
            ]),
        ];
        assert_eq!(x_categories(&runs, "s"), ["max_length=500 task=listops", "image_size=32 task=pathfinder"]);
    }

    /// Decodes a PNG into 8-bit RGB pixels (expanding a palette).
    fn rgb_pixels(path: &std::path::Path) -> (png::ColorType, Vec<u8>) {
        let mut decoder = png::Decoder::new(std::io::BufReader::new(std::fs::File::open(path).unwrap()));
        decoder.set_transformations(png::Transformations::EXPAND);
        let mut reader = decoder.read_info().unwrap();
        let stored = reader.info().color_type;
        let mut pixels = vec![0; reader.output_buffer_size()];
        let info = reader.next_frame(&mut pixels).unwrap();
        pixels.truncate(info.buffer_size());
        (stored, pixels)
    }

    fn write_rgb(path: &std::path::Path, width: u32, pixels: &[u8]) {
        let mut out = Vec::new();
        let mut encoder = png::Encoder::new(&mut out, width, (pixels.len() / 3) as u32 / width);
        encoder.set_color(png::ColorType::Rgb);
        encoder.write_header().unwrap().write_image_data(pixels).unwrap();
        std::fs::write(path, out).unwrap();
    }

    #[test]
    fn a_chart_of_at_most_256_colours_is_reencoded_exactly() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("p.png");
        // 256 colours, each on a 4-pixel run: nothing to approximate.
        let pixels: Vec<u8> = (0..1024u32).flat_map(|i| [(i / 4) as u8, 255 - (i / 4) as u8, 7]).collect();
        write_rgb(&path, 64, &pixels);
        recompress_png(&path).unwrap();
        let (stored, decoded) = rgb_pixels(&path);
        assert_eq!(stored, png::ColorType::Indexed);
        assert_eq!(decoded, pixels);
    }

    #[test]
    fn past_256_colours_the_most_frequent_stay_exact_and_the_rest_take_the_nearest() {
        // 256 frequent colours (grey levels 0, 1, …, 255, ten pixels each) and 44 rare ones (one pixel each)
        // a little off a grey level: each rare one must come back as the grey it is nearest to.
        let mut pixels = Vec::new();
        for g in 0..=255u8 {
            for _ in 0..10 {
                pixels.extend([g, g, g]);
            }
        }
        let rare: Vec<[u8; 3]> = (0..44u8).map(|k| [5 * k + 1, 5 * k, 5 * k + 2]).collect();
        for c in &rare {
            pixels.extend(c);
        }
        let (palette, indices) = popularity_palette(&pixels);
        assert_eq!(palette.len(), 256);
        let drawn: Vec<[u8; 3]> = indices.iter().map(|&i| palette[i as usize]).collect();
        for (k, pixel) in drawn.iter().enumerate().take(2560) {
            let g = (k / 10) as u8;
            assert_eq!(*pixel, [g, g, g], "a frequent colour changed");
        }
        for (c, pixel) in rare.iter().zip(&drawn[2560..]) {
            // The nearest grey to (5k+1, 5k, 5k+2) is 5k+1 (squared distance 2 against 5 for its neighbours).
            assert_eq!(*pixel, [c[0], c[0], c[0]], "{c:?} was drawn as {pixel:?}");
        }
        // Ties between equally frequent colours go to the smaller colour, whatever the input order.
        let (a, _) = popularity_palette(&[9, 9, 9, 1, 1, 1]);
        let (b, _) = popularity_palette(&[1, 1, 1, 9, 9, 9]);
        assert_eq!(a, b);
        assert_eq!(a, [[1, 1, 1], [9, 9, 9]]);
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
            // Colour type 3: indexed, the compact encoding of tests/tree_size.rs.
            assert_eq!(bytes[25], 3, "a chart is written as an RGB PNG");
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
