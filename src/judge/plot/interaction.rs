//! Interaction matrices (UDL §12.9, the figure of sparse attention patterns): for each variant of a recipe,
//! which keys each query may attend to in the first layer, or in every layer where `layer_patterns` gives
//! each its own (first stage for Swin), computed with the functions
//! the models themselves use, so the figure shows what was trained rather than a drawing of the idea.
use std::path::Path;

use anyhow::{anyhow, Result};
use plotters::prelude::*;
use tch::{Device, Kind as DType, Tensor};

use crate::models::swin::{shifted_window_mask, window_partition};
use crate::recipe::{Config, Kind, Recipe};
use crate::transformer::attention::pattern::allowed;

/// One panel: what it shows and the (N, N) matrix, `allowed[i][j]` when query i may attend to key j.
#[derive(Debug, Clone, PartialEq)]
pub struct Interaction {
    pub label: String,
    pub allowed: Vec<Vec<bool>>,
}

impl Interaction {
    /// Allowed (query, key) pairs.
    pub fn pairs(&self) -> usize {
        self.allowed.iter().map(|row| row.iter().filter(|&&a| a).count()).sum()
    }
}

fn to_rows(t: &Tensor) -> Vec<Vec<bool>> {
    let n = t.size()[0];
    (0..n).map(|i| Vec::<bool>::try_from(t.get(i)).unwrap_or_default()).collect()
}

/// The self-attention interaction matrices of one run: one for a sequence model's layers (all layers share
/// the pattern), two for Swin with shifted windows (plain and shifted blocks alternate). Empty for kinds
/// whose attention is not one pattern over one sequence (translate reads two sequences; DaViT alternates
/// spatial windows with channel attention).
pub fn run_interactions(label: &str, config: &Config) -> Vec<Interaction> {
    let spec = config.transformer_spec();
    let sequence = |n: i64, causal: bool| {
        // One matrix for a stack whose layers share the pattern, else one per layer (up to the depth).
        let per_layer = !spec.layer_patterns.is_empty();
        let layers = if per_layer { spec.layers.min(spec.layer_patterns.len() as i64).max(1) } else { 1 };
        (0..layers)
            .map(|i| {
                let pattern = spec.for_layer(i).attention.pattern;
                let n = n + pattern.global_tokens;
                let matrix = allowed(&pattern, n, causal, Device::Cpu)
                    .unwrap_or_else(|| Tensor::ones([n, n], (DType::Bool, Device::Cpu)));
                let label = if per_layer { format!("{label} (layer {i})") } else { label.to_string() };
                Interaction { label, allowed: to_rows(&matrix) }
            })
            .collect::<Vec<_>>()
    };
    match config.kind {
        Kind::Lm => sequence(config.transformer.block_size, true),
        Kind::Bert => sequence(config.transformer.block_size, false),
        // The vision models' block size is their token sequence without the global tokens, as for text.
        Kind::Vit => sequence(config.vit_spec().transformer.block_size, false),
        Kind::ImageGpt => sequence(config.image_gpt_spec().transformer.block_size, true),
        Kind::SeqClassify => sequence(config.seq_classify().positions(), false),
        Kind::Swin => {
            let spec = config.staged_spec();
            let (grid, window, shift) = (spec.grid(0), spec.window(0), spec.shift_at(0));
            let mut out = vec![Interaction {
                label: if shift > 0 { format!("{label} (even blocks)") } else { label.to_string() },
                allowed: swin_allowed(grid, window, 0),
            }];
            if shift > 0 {
                out.push(Interaction {
                    label: format!("{label} (odd blocks)"),
                    allowed: swin_allowed(grid, window, shift),
                });
            }
            out
        }
        // A convolution has no attention pattern to draw.
        Kind::Translate | Kind::Davit | Kind::Cnn => Vec::new(),
    }
}

/// Swin's windows over a grid of `grid`² tokens (row-major), rolled by `shift`: the block's own partition and
/// mask, read back as token-to-token pairs.
pub fn swin_allowed(grid: i64, window: i64, shift: i64) -> Vec<Vec<bool>> {
    let ids = Tensor::arange(grid * grid, (DType::Float, Device::Cpu)).view([1, grid, grid, 1]);
    let ids = if shift > 0 { ids.roll([-shift, -shift], [1, 2]) } else { ids };
    let windows = window_partition(&ids, window).squeeze_dim(-1); // (windows, w²): token ids per window
    let members = Vec::<f32>::try_from(windows.reshape([-1])).unwrap_or_default();
    let mask = (shift > 0).then(|| {
        Vec::<f32>::try_from(shifted_window_mask(grid, grid, window, shift, Device::Cpu).reshape([-1]))
            .unwrap_or_default()
    });
    let (n, per) = ((grid * grid) as usize, (window * window) as usize);
    let mut out = vec![vec![false; n]; n];
    for (w, tokens) in members.chunks(per).enumerate() {
        for (a, &q) in tokens.iter().enumerate() {
            for (b, &k) in tokens.iter().enumerate() {
                let open = mask.as_ref().is_none_or(|m| m[(w * per + a) * per + b] == 0.0);
                out[q as usize][k as usize] |= open;
            }
        }
    }
    out
}

/// Every variant's interaction matrices (its first seed's run), in the recipe's order.
pub fn recipe_interactions(recipe: &Recipe) -> Vec<Interaction> {
    let mut seen: Vec<&str> = Vec::new();
    let mut out = Vec::new();
    for run in &recipe.runs {
        if seen.contains(&run.label.as_str()) {
            continue;
        }
        seen.push(&run.label);
        out.extend(run_interactions(&run.label, &run.config));
    }
    out
}

/// Whether a recipe compares attention patterns, so that its interaction figure is worth drawing.
pub fn has_patterns(recipe: &Recipe) -> bool {
    recipe.runs.iter().any(|r| {
        let a = &r.config.transformer.attention;
        !a.pattern.spec().is_dense() || a.layer_patterns.iter().any(|l| !l.spec(0).is_dense())
    })
}

/// The panels side by side, allowed pairs dark; each caption gives the keys per query on average.
pub fn interaction_chart(path: &Path, panels: &[Interaction], title: &str) -> Result<()> {
    if panels.is_empty() {
        return Err(anyhow!("no interaction matrices to draw"));
    }
    let largest = panels.iter().map(|p| p.allowed.len()).max().unwrap_or(1).max(1);
    // Whole pixels per cell, so every cell shows; at least 1, and panels of about 300 px where that allows.
    let cell = (300 / largest).clamp(1, 8) as u32;
    let side = cell * largest as u32;
    let columns = panels.len().min(4);
    let rows = panels.len().div_ceil(columns);
    let (panel_w, panel_h) = (side + 60, side + 80);
    let size = ((panel_w * columns as u32).max(640) + 20, panel_h * rows as u32 + 50);
    super::canvas::write_png(path, size, |root| {
        root.draw(&Text::new(title.to_string(), (10, 12), ("sans-serif", 18)))?;
        for (k, p) in panels.iter().enumerate() {
            let n = p.allowed.len();
            let (x0, y0) = (10 + (k % columns) as i32 * panel_w as i32, 50 + (k / columns) as i32 * panel_h as i32);
            let keys = p.pairs() as f64 / n as f64;
            root.draw(&Text::new(p.label.clone(), (x0, y0), ("sans-serif", 14)))?;
            root.draw(&Text::new(
                format!("N = {n}: {keys:.1} keys per query ({:.1}% of N²)", 100.0 * keys / n as f64),
                (x0, y0 + 18),
                ("sans-serif", 12),
            ))?;
            let (left, top) = (x0 + 20, y0 + 40);
            let c = cell as i32;
            for (i, row) in p.allowed.iter().enumerate() {
                for (j, &open) in row.iter().enumerate() {
                    if open {
                        let (x, y) = (left + j as i32 * c, top + i as i32 * c);
                        root.draw(&Rectangle::new([(x, y), (x + c, y + c)], RGBColor(30, 60, 160).filled()))?;
                    }
                }
            }
            let extent = n as i32 * c;
            root.draw(&Rectangle::new([(left, top), (left + extent, top + extent)], BLACK.stroke_width(1)))?;
            root.draw(&Text::new("key →", (left + extent - 40, top + extent + 4), ("sans-serif", 11)))?;
            root.draw(&Text::new("query ↓", (x0 - 8, top + extent + 4), ("sans-serif", 11)))?;
        }
        Ok(())
    })
}

/// Draws `interaction.png` for a recipe that compares attention patterns.
pub fn draw(dir: &Path, recipe: &Recipe) -> Result<()> {
    let panels = recipe_interactions(recipe);
    if panels.is_empty() {
        return Ok(());
    }
    let title = format!(
        "{}: which keys each query may attend to (every layer where they differ, else the first; first stage; UDL §12.9)",
        recipe.name
    );
    interaction_chart(&dir.join("interaction.png"), &panels, &title)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(yaml: &str) -> Config {
        crate::recipe::parse(yaml, "i.yaml", "i", false).unwrap().runs[0].config.clone()
    }

    #[test]
    fn a_causal_dilated_window_allows_exactly_its_closed_form() {
        let c = config("kind: lm\ntransformer: {d_model: 32, heads: 2, block_size: 20, attention: {implementation: sparse, pattern: {window: 3, dilation: 2}}}\n");
        let m = &run_interactions("w", &c)[0].allowed;
        for (i, row) in m.iter().enumerate() {
            for (j, &a) in row.iter().enumerate() {
                let d = i as i64 - j as i64;
                assert_eq!(a, (0..=6).contains(&d) && d % 2 == 0, "query {i}, key {j}");
            }
        }
    }

    #[test]
    fn a_vit_window_covers_the_cls_token_and_the_patches() {
        // 28/7 = 4 → 16 patches and a <cls> token; a window of 1, no causality.
        let c = config(
            "kind: vit\ntransformer: {d_model: 32, heads: 2, attention: {implementation: sparse, pattern: {window: 1}}}\nvision: {patch_size: 7}\n",
        );
        let p = &run_interactions("v", &c)[0];
        assert_eq!(p.allowed.len(), 17);
        assert_eq!(p.pairs(), 17 + 2 * 16);
        // A prepended global token lengthens the sequence by one, and sees and is seen by all 18 tokens.
        let c = config(
            "kind: vit\ntransformer: {d_model: 32, heads: 2, attention: {implementation: sparse, pattern: {window: 1, global_tokens: 1}}}\nvision: {patch_size: 7}\n",
        );
        let p = &run_interactions("v", &c)[0];
        assert_eq!(p.allowed.len(), 18);
        assert!(p.allowed[0].iter().all(|&a| a) && p.allowed.iter().all(|row| row[0]));
    }

    #[test]
    fn swin_windows_group_tokens_by_window_and_the_shift_only_joins_neighbours() {
        // A 4×4 grid in 2×2 windows: every token sees the 4 tokens of its window.
        let plain = swin_allowed(4, 2, 0);
        for (q, row) in plain.iter().enumerate() {
            for (k, &a) in row.iter().enumerate() {
                let same = (q / 4 / 2, q % 4 / 2) == (k / 4 / 2, k % 4 / 2);
                assert_eq!(a, same, "query {q}, key {k}");
            }
        }
        // Shifted by 1: windows start at rows/columns 1 and 3; the wrapped-around parts are masked, so a
        // token sees exactly those of its own (shifted) window that were neighbours in the image.
        let shifted = swin_allowed(4, 2, 1);
        let band = |x: usize| x.div_ceil(2); // 0 | 1 2 | 3 → bands 0, 1, 1, 2
        for (q, row) in shifted.iter().enumerate() {
            for (k, &a) in row.iter().enumerate() {
                let same = (band(q / 4), band(q % 4)) == (band(k / 4), band(k % 4));
                assert_eq!(a, same, "query {q}, key {k}");
            }
        }
        for row in plain.iter().chain(&shifted) {
            assert!(row.iter().any(|&a| a));
        }
    }

    #[test]
    fn a_recipe_gets_one_panel_per_variant_and_a_figure() {
        let recipe = crate::recipe::parse(
            "kind: lm\ntransformer: {d_model: 32, heads: 2, block_size: 16}\nvariants:\n  - {label: dense}\n  - {label: window 2, transformer.attention: {implementation: sparse, pattern: {window: 2}}}\nseeds: [0, 1]\n",
            "r.yaml",
            "r",
            false,
        )
        .unwrap();
        assert!(has_patterns(&recipe));
        let panels = recipe_interactions(&recipe);
        assert_eq!(panels.iter().map(|p| p.label.as_str()).collect::<Vec<_>>(), ["dense", "window 2"]);
        assert_eq!(panels[0].pairs(), 16 * 17 / 2, "causal dense: the lower triangle");
        assert_eq!(panels[1].pairs(), 16 + 15 + 14, "causal window 2: the diagonal and two below it");
        let dir = tempfile::tempdir().unwrap();
        draw(dir.path(), &recipe).unwrap();
        let bytes = std::fs::read(dir.path().join("interaction.png")).unwrap();
        assert_eq!(&bytes[1..4], b"PNG");
    }
}
