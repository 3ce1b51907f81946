//! Swin Transformer (Liu et al. 2021; the seed's 12.10.3): attention inside non-overlapping w×w windows,
//! so cost grows with the number of tokens rather than its square; every second block shifts the windows
//! by ⌊w/2⌋ (a cyclic roll of the token grid) so information crosses window borders, with a mask that keeps
//! the regions the roll glued together apart; a learned relative position bias per window offset; and
//! patch merging (2×2 neighbours concatenated, normalised, projected from 4C to 2C) between stages.
use tch::nn::{self, Module};
use tch::{Device, Kind, Tensor};

use super::VisionConfig;
use crate::attention::relative::WindowBias;
use crate::attention::{Mask, MultiHeadAttention};
use crate::config::{Activation, AttentionConfig};
use crate::layers::FeedForward;

/// (B, H, W, C) -> (B·H/w·W/w, w², C): windows in row-major order of the grid, tokens row-major inside.
pub fn window_partition(x: &Tensor, window: i64) -> Tensor {
    let (b, h, w, c) = x.size4().unwrap();
    x.view([b, h / window, window, w / window, window, c]).permute([0, 1, 3, 2, 4, 5]).contiguous().view([
        -1,
        window * window,
        c,
    ])
}

/// The inverse of `window_partition` for an H×W grid.
pub fn window_reverse(windows: &Tensor, window: i64, h: i64, w: i64) -> Tensor {
    let c = windows.size()[2];
    windows
        .view([-1, h / window, w / window, window, window, c])
        .permute([0, 1, 3, 2, 4, 5])
        .contiguous()
        .view([-1, h, w, c])
}

/// The additive mask of shifted-window attention on an H×W grid rolled by `shift`: (windows, w², w²), 0
/// where query and key come from the same region of the unrolled image and −∞ where the roll put them
/// side by side but they are not neighbours.
pub fn shifted_window_mask(h: i64, w: i64, window: i64, shift: i64, device: Device) -> Tensor {
    let region = |len: i64, i: i64| -> i64 {
        if i < len - window {
            0
        } else if i < len - shift {
            1
        } else {
            2
        }
    };
    let labels: Vec<f32> = (0..h).flat_map(|i| (0..w).map(move |j| (region(h, i) * 3 + region(w, j)) as f32)).collect();
    let grid = Tensor::from_slice(&labels).view([1, h, w, 1]);
    let per_window = window_partition(&grid, window).squeeze_dim(-1); // (windows, w²)
    let same = per_window.unsqueeze(2).eq_tensor(&per_window.unsqueeze(1));
    Tensor::zeros(same.size(), (Kind::Float, Device::Cpu))
        .masked_fill(&same.logical_not(), f64::NEG_INFINITY)
        .to(device)
}

struct SwinBlock {
    norm1: nn::LayerNorm,
    attn: MultiHeadAttention,
    relative: WindowBias,
    norm2: nn::LayerNorm,
    mlp: FeedForward,
    grid: i64,
    window: i64,
    shift: i64,
    shift_mask: Option<Tensor>,
}

impl SwinBlock {
    fn new(vs: nn::Path, dim: i64, heads: i64, grid: i64, window: i64, shift: i64, mlp_hidden: i64) -> Self {
        let ln = |name: &str| nn::layer_norm(&vs / name, vec![dim], Default::default());
        Self {
            norm1: ln("norm1"),
            attn: MultiHeadAttention::plain(&vs / "attn", dim, heads, &AttentionConfig::default(), 0.02),
            relative: WindowBias::new(&(&vs / "attn"), window, heads),
            norm2: ln("norm2"),
            mlp: FeedForward::new(&vs / "mlp", dim, mlp_hidden, Activation::Gelu, 0.02),
            grid,
            window,
            shift,
            shift_mask: (shift > 0).then(|| shifted_window_mask(grid, grid, window, shift, vs.device())),
        }
    }

    /// x: (B, grid², C). Returns the output and, when asked, the attention weights (B·windows, H, w², w²).
    fn forward(&self, x: &Tensor, train: bool, want_weights: bool) -> (Tensor, Option<Tensor>) {
        let (b, n, c) = x.size3().unwrap();
        let mut h = self.norm1.forward(x).view([b, self.grid, self.grid, c]);
        if self.shift > 0 {
            h = h.roll([-self.shift, -self.shift], [1, 2]);
        }
        let windows = window_partition(&h, self.window);
        // Relative position bias (1, H, w², w²), plus the shift mask per window, repeated over the batch
        // (windows of image k are rows k·W .. (k+1)·W of `windows`).
        let relative = self.relative.bias().unsqueeze(0);
        let bias = match &self.shift_mask {
            Some(mask) => (relative + mask.unsqueeze(1)).repeat([b, 1, 1, 1]),
            None => relative,
        };
        let mask = Mask { bias: Some(&bias), ..Mask::default() };
        let attended = self.attn.self_attend(&windows, &mask, None, train, want_weights);
        let mut h = window_reverse(&attended.output, self.window, self.grid, self.grid);
        if self.shift > 0 {
            h = h.roll([self.shift, self.shift], [1, 2]);
        }
        let x = x + h.view([b, n, c]);
        let x = &x + self.mlp.forward(&self.norm2.forward(&x));
        (x, attended.weights)
    }
}

/// 2×2 neighbouring tokens concatenated (4C), normalised and projected to 2C: half the resolution,
/// twice the width.
pub struct PatchMerging {
    norm: nn::LayerNorm,
    reduction: nn::Linear,
}

impl PatchMerging {
    pub fn new(vs: nn::Path, dim: i64) -> Self {
        Self {
            norm: nn::layer_norm(&vs / "norm", vec![4 * dim], Default::default()),
            reduction: nn::linear(
                &vs / "reduction",
                4 * dim,
                2 * dim,
                nn::LinearConfig { bias: false, ..Default::default() },
            ),
        }
    }

    /// x: (B, grid², C) -> (B, (grid/2)², 2C).
    pub fn forward(&self, x: &Tensor, grid: i64) -> Tensor {
        let (b, _, c) = x.size3().unwrap();
        let x = x.view([b, grid, grid, c]);
        let part = |r: i64, s: i64| x.slice(1, r, grid, 2).slice(2, s, grid, 2);
        let merged = Tensor::cat(&[part(0, 0), part(1, 0), part(0, 1), part(1, 1)], -1);
        self.reduction.forward(&self.norm.forward(&merged.view([b, -1, 4 * c])))
    }
}

pub struct Swin {
    patch_embed: nn::Conv2D,
    patch_norm: nn::LayerNorm,
    stages: Vec<(Vec<SwinBlock>, Option<PatchMerging>)>,
    norm: nn::LayerNorm,
    head: nn::Linear,
}

impl Swin {
    pub fn new(vs: &nn::Path, cfg: &VisionConfig) -> Self {
        let conv = nn::ConvConfig { stride: cfg.patch_size, ..Default::default() };
        let stages = (0..cfg.stages())
            .map(|i| {
                let (dim, grid, window) = (cfg.stage_dim(i), cfg.stage_grid(i), cfg.stage_window(i));
                // No shift when one window covers the grid (timm's rule): there is nothing to connect.
                let shift = if cfg.shift && window < grid { window / 2 } else { 0 };
                let stage = vs / "layers" / i;
                let blocks = (0..cfg.depths[i])
                    .map(|j| {
                        let s = if j % 2 == 1 { shift } else { 0 };
                        SwinBlock::new(&stage / "blocks" / j, dim, cfg.heads[i], grid, window, s, cfg.ffn_hidden(dim))
                    })
                    .collect();
                let merge = (i + 1 < cfg.stages()).then(|| PatchMerging::new(&stage / "downsample", dim));
                (blocks, merge)
            })
            .collect();
        let last = cfg.stage_dim(cfg.stages() - 1);
        Self {
            patch_embed: nn::conv2d(vs / "patch_embed", cfg.channels, cfg.dim, cfg.patch_size, conv),
            patch_norm: nn::layer_norm(vs / "patch_norm", vec![cfg.dim], Default::default()),
            stages,
            norm: nn::layer_norm(vs / "norm", vec![last], Default::default()),
            head: nn::linear(vs / "head", last, cfg.classes, Default::default()),
        }
    }

    /// Final token states (B, N, C) and, when asked, every block's attention weights.
    pub fn features(&self, images: &Tensor, train: bool, want_weights: bool) -> (Tensor, Vec<Tensor>) {
        let mut x = self.patch_norm.forward(&self.patch_embed.forward(images).flatten(2, -1).transpose(1, 2));
        let mut weights = Vec::new();
        for (blocks, merge) in &self.stages {
            for block in blocks {
                let (y, w) = block.forward(&x, train, want_weights);
                weights.extend(w);
                x = y;
            }
            if let Some(m) = merge {
                x = m.forward(&x, blocks[0].grid);
            }
        }
        (self.norm.forward(&x), weights)
    }

    pub fn forward(&self, images: &Tensor, train: bool) -> Tensor {
        let (x, _) = self.features(images, train, false);
        self.head.forward(&x.mean_dim(1, false, Kind::Float))
    }
}
