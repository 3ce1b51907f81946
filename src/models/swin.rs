//! Swin Transformer (Liu et al. 2021; UDL §12.10.3): attention inside non-overlapping w×w windows, so cost
//! grows with the number of tokens rather than its square; every second block shifts the windows by ⌊w/2⌋
//! (a cyclic roll of the token grid) so information crosses window borders, with a mask that keeps the
//! regions the roll glued together apart; a learned relative position bias per 2-D window offset (the
//! paper's; `pe: bias_2d`, or any other encoding of the run); and patch merging (2×2 neighbours
//! concatenated, normalised, projected from 4C to 2C) between stages. Every block is the shared residual
//! pattern, so norm placement, dropout, FFN and attention settings act as in every other model.
use tch::nn::{self, Module};
use tch::{Device, Kind, Tensor};

use super::spec::StagedSpec;
use super::ImageClassifier;
use crate::transformer::attention::{Grid, Mask};
use crate::transformer::layers::{self, AttentionBlock};
use crate::transformer::positions::{AbsolutePositions, ConvPosEnc};
use crate::transformer::spec::{PositionEncoding, TransformerSpec};

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
    cpe: Option<ConvPosEnc>,
    block: AttentionBlock,
    grid: i64,
    window: i64,
    shift: i64,
    shift_mask: Option<Tensor>,
}

impl SwinBlock {
    fn new(vs: nn::Path, t: &TransformerSpec, grid: i64, window: i64, shift: i64) -> Self {
        let cpe = (t.position.encoding == PositionEncoding::Conv).then(|| ConvPosEnc::new(&vs / "cpe", t.d_model));
        Self {
            cpe,
            block: AttentionBlock::new(&vs, t, Some(Grid { side: window, lead: 0 })),
            grid,
            window,
            shift,
            shift_mask: (shift > 0).then(|| shifted_window_mask(grid, grid, window, shift, vs.device())),
        }
    }

    /// x: (B, grid², C). Returns the output and, when asked, the attention weights (B·windows, H, w², w²).
    fn forward(&self, x: &Tensor, train: bool, want_weights: bool) -> (Tensor, Option<Tensor>) {
        let x = match &self.cpe {
            Some(cpe) => cpe.forward(x, self.grid, 0),
            None => x.shallow_clone(),
        };
        let (b, n, c) = x.size3().unwrap();
        let mut weights = None;
        let x = self.block.attend(&x, train, |attn, h| {
            let mut h = h.view([b, self.grid, self.grid, c]);
            if self.shift > 0 {
                h = h.roll([-self.shift, -self.shift], [1, 2]);
            }
            let windows = window_partition(&h, self.window);
            // The shift mask per window, repeated over the batch (windows of image k are rows k·W .. (k+1)·W
            // of `windows`); the relative position bias is the attention unit's own.
            let bias = self.shift_mask.as_ref().map(|m| m.unsqueeze(1).repeat([b, 1, 1, 1]));
            let mask = Mask { bias: bias.as_ref(), ..Mask::default() };
            let attended = attn.self_attend(&windows, &mask, None, train, want_weights);
            weights = attended.weights;
            let mut h = window_reverse(&attended.output, self.window, self.grid, self.grid);
            if self.shift > 0 {
                h = h.roll([self.shift, self.shift], [1, 2]);
            }
            h.view([b, n, c])
        });
        (self.block.feed_forward(&x, train), weights)
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
    /// An absolute encoding (Swin's optional `ape`), added once after the patch embedding.
    positions: AbsolutePositions,
    stages: Vec<(Vec<SwinBlock>, Option<PatchMerging>)>,
    norm: Option<layers::NormLayer>,
    head: nn::Linear,
    dropout: f64,
    /// `transformer.logit_softcap`.
    logit_softcap: Option<f64>,
}

impl Swin {
    pub fn new(vs: &nn::Path, spec: &StagedSpec) -> Self {
        let im = &spec.image;
        let conv = nn::ConvConfig { stride: im.patch, ..Default::default() };
        let stages = (0..spec.stages())
            .map(|i| {
                let (t, grid, window, shift) = (spec.stage(i), spec.grid(i), spec.window(i), spec.shift_at(i));
                let stage = vs / "layers" / i;
                let blocks = (0..spec.depths[i])
                    .map(|j| {
                        SwinBlock::new(&stage / "blocks" / j, &t, grid, window, if j % 2 == 1 { shift } else { 0 })
                    })
                    .collect();
                let merge = (i + 1 < spec.stages()).then(|| PatchMerging::new(&stage / "downsample", t.d_model));
                (blocks, merge)
            })
            .collect();
        let (t, d) = (&spec.transformer, spec.transformer.d_model);
        let last = spec.stage(spec.stages() - 1).d_model;
        let grid = spec.grid(0);
        Self {
            patch_embed: nn::conv2d(vs / "patch_embed", im.channels, d, im.patch, conv),
            patch_norm: nn::layer_norm(vs / "patch_norm", vec![d], Default::default()),
            positions: AbsolutePositions::new(vs / "pos_embed", t.position.encoding, grid * grid, d),
            stages,
            norm: layers::final_norm(vs / "norm", last, t, 1e-5),
            head: nn::linear(vs / "head", last, im.classes, Default::default()),
            dropout: t.dropout,
            logit_softcap: t.logit_softcap,
        }
    }

    /// Final token states (B, N, C) and, when asked, every block's attention weights.
    pub fn features(&self, images: &Tensor, train: bool, want_weights: bool) -> (Tensor, Vec<Tensor>) {
        let mut x = self.patch_norm.forward(&self.patch_embed.forward(images).flatten(2, -1).transpose(1, 2));
        if let Some(table) = self.positions.table(x.size()[1]) {
            x += table;
        }
        if self.dropout > 0.0 {
            x = x.dropout(self.dropout, train);
        }
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
        let x = match &self.norm {
            Some(norm) => norm.forward(&x, train),
            None => x,
        };
        (x, weights)
    }
}

impl ImageClassifier for Swin {
    fn classify(&self, images: &Tensor, train: bool, want_weights: bool) -> (Tensor, Vec<Tensor>) {
        let (x, weights) = self.features(images, train, want_weights);
        (layers::softcap(self.head.forward(&x.mean_dim(1, false, Kind::Float)), self.logit_softcap), weights)
    }

    fn head(&self) -> &nn::Linear {
        &self.head
    }
}
