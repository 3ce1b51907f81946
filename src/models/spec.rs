//! The plain settings of the vision models' structure (the Transformer itself is a `TransformerSpec`), and
//! their analytic cost. No libtorch here: the recipe layer converts into these without it.
use serde::{Deserialize, Serialize};

use crate::transformer::spec::{PositionEncoding, TransformerSpec};

/// How a ViT turns its tokens into one vector for the head.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, schemars::JsonSchema, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum Pool {
    /// A learned `<cls>` token prepended to the patches; the head reads its final state.
    Cls,
    /// The mean of the patch tokens' final states.
    Mean,
}

/// DaViT's two kinds of block.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, schemars::JsonSchema, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum BlockKind {
    /// Window attention over tokens.
    Spatial,
    /// Channel group attention: tokens attend over channels.
    Channel,
}

/// The images a model reads and the patches it cuts them into.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Image {
    pub size: i64,
    pub channels: i64,
    pub classes: i64,
    pub patch: i64,
}

#[derive(Debug, Clone, PartialEq)]
pub struct VitSpec {
    pub image: Image,
    pub pool: Pool,
    pub transformer: TransformerSpec,
    /// Register tokens (Darcet et al. 2024), already counted in the transformer's global tokens.
    pub registers: i64,
}

/// The convolutional baseline: stages of k×k convolutions, 2×2 max-pooling between them.
#[derive(Debug, Clone, PartialEq)]
pub struct CnnSpec {
    pub image: Image,
    /// Output channels of each stage.
    pub channels: Vec<i64>,
    pub kernel: i64,
}

impl CnnSpec {
    /// Side of the feature map stage `i` works on (each pooling floors half the side).
    pub fn side(&self, i: usize) -> i64 {
        (0..i).fold(self.image.size, |s, _| s / 2)
    }

    /// Multiply-accumulates of one forward pass on one image: the convolutions and the classifier.
    pub fn forward_macs(&self) -> f64 {
        let k2 = (self.kernel * self.kernel) as f64;
        let mut inputs = self.image.channels;
        let mut macs = 0.0;
        for (i, &c) in self.channels.iter().enumerate() {
            macs += (self.side(i) * self.side(i)) as f64 * (inputs * c) as f64 * k2;
            inputs = c;
        }
        macs + (inputs * self.image.classes) as f64
    }
}

/// Swin or DaViT: stages of blocks over a token grid that halves (and a width that doubles) per stage.
#[derive(Debug, Clone, PartialEq)]
pub struct StagedSpec {
    pub image: Image,
    /// Blocks per stage.
    pub depths: Vec<i64>,
    /// Side of the attention windows (shrunk to the grid where the grid is smaller).
    pub window: i64,
    /// Swin: shift the windows by half a window on every second block.
    pub shift: bool,
    /// DaViT: the block kinds, cycled through each stage's blocks.
    pub blocks: Vec<BlockKind>,
    /// The first stage's Transformer; stage i is `transformer.widened(2^i)`.
    pub transformer: TransformerSpec,
    /// DaViT's overlapping stem rounds the grid up; Swin's patches tile the image.
    pub round_grid_up: bool,
}

impl StagedSpec {
    pub fn stages(&self) -> usize {
        self.depths.len()
    }

    /// Side of the token grid at stage `i`.
    pub fn grid(&self, i: usize) -> i64 {
        let p = self.image.patch;
        let first = if self.round_grid_up { (self.image.size + p - 1) / p } else { self.image.size / p };
        (0..i).fold(first, |g, _| (g + 1) / 2)
    }

    /// The window used at stage `i`: a window larger than the grid shrinks to the grid, as in timm.
    pub fn window(&self, i: usize) -> i64 {
        self.window.min(self.grid(i))
    }

    /// Swin's shift at stage `i` (of its odd blocks): half a window, and none when one window covers the
    /// grid (timm's rule: there is nothing to connect) or the shift is off.
    pub fn shift_at(&self, i: usize) -> i64 {
        let (grid, window) = (self.grid(i), self.window(i));
        if self.shift && window < grid {
            window / 2
        } else {
            0
        }
    }

    /// The Transformer of stage `i`: width, FFN and heads doubled per stage, heads keeping their size.
    pub fn stage(&self, i: usize) -> TransformerSpec {
        self.transformer.widened(1 << i)
    }
}

/// ImageGPT: a decoder over the pixels of a downsampled, quantised image.
#[derive(Debug, Clone, PartialEq)]
pub struct ImageGptSpec {
    pub image: Image,
    /// Palette colours: the pixel vocabulary (plus one start-of-image token).
    pub palette: i64,
    pub transformer: TransformerSpec,
}

impl ImageGptSpec {
    /// Side of the pixel grid (each patch × patch block becomes one pixel).
    pub fn grid(&self) -> i64 {
        self.image.size / self.image.patch
    }
}

fn f(x: i64) -> f64 {
    x as f64
}

/// Multiply-accumulates of one Transformer block over `n` tokens whose queries see `keys` keys each: the
/// layer's matrices (Q/K/V and output projections, output gate, FFN) per token, QKᵀ and AV per pair (norms
/// and softmax left out, as fvcore and timm do). The core's own counts, so grouped K/V heads, a narrower
/// qk_dim, a gate or a gated FFN change it.
fn block(t: &TransformerSpec, n: i64, keys: i64) -> f64 {
    f(n) * f(t.layer_matrix_macs()) + f(n) * f(keys) * f(t.attention.pair_macs())
}

/// Multiply-accumulates of one forward pass of an encoder over `n` tokens (global tokens included) that
/// classifies them into `classes`: each layer's projections, scores over the keys its pattern lets a query
/// see (a window's 2w + 1 and the global positions; all `n` when dense), FFN, and the head.
pub fn encoder_macs(t: &TransformerSpec, n: i64, classes: i64) -> f64 {
    let layer = |i: i64| {
        let p = &t.for_layer(i).attention.pattern;
        let keys = match p.window {
            Some(w) => (2 * w + 1 + p.global_positions(n).len() as i64).min(n),
            None => n,
        };
        block(t, n, keys)
    };
    (0..t.layers).map(layer).sum::<f64>() + f(t.d_model * classes)
}

impl VitSpec {
    pub fn grid(&self) -> i64 {
        self.image.size / self.image.patch
    }

    /// Analytic multiply-accumulates of one forward pass on one image.
    pub fn forward_macs(&self) -> f64 {
        let t = &self.transformer;
        let (grid, im) = (self.grid(), &self.image);
        let n = grid * grid + i64::from(self.pool == Pool::Cls) + t.attention.pattern.global_tokens;
        f(grid * grid) * f(im.patch * im.patch * im.channels * t.d_model)
            + f(t.layers) * block(t, n, n)
            + f(t.d_model * im.classes)
    }
}

impl StagedSpec {
    /// Analytic multiply-accumulates of one forward pass on one image: Swin when `blocks` is empty, DaViT
    /// otherwise.
    pub fn forward_macs(&self) -> f64 {
        let im = &self.image;
        let d0 = self.transformer.d_model;
        let g0 = self.grid(0);
        let last = self.stage(self.stages() - 1).d_model;
        let mut macs = 0.0;
        if self.blocks.is_empty() {
            macs += f(g0 * g0) * f(im.patch * im.patch * im.channels * d0);
            for i in 0..self.stages() {
                let (g, t, w) = (self.grid(i), self.stage(i), self.window(i));
                macs += f(self.depths[i]) * block(&t, g * g, w * w);
                if i + 1 < self.stages() {
                    macs += f((g / 2) * (g / 2)) * f(4 * t.d_model * 2 * t.d_model);
                }
            }
        } else {
            let k = 2 * im.patch - 1;
            macs += f(g0 * g0) * f(k * k * im.channels * d0);
            let conv_positions = self.transformer.position.encoding == PositionEncoding::Conv;
            for i in 0..self.stages() {
                let (g, t, w) = (self.grid(i), self.stage(i), self.window(i));
                let (n, d) = (g * g, t.d_model);
                if i > 0 {
                    macs += f(n) * f(4 * (d / 2) * d);
                }
                for j in 0..self.depths[i] as usize {
                    let cpe = if conv_positions { 2.0 * f(n) * f(9 * d) } else { 0.0 };
                    macs += cpe
                        + match self.blocks[j % self.blocks.len()] {
                            BlockKind::Spatial => block(&t, n, w * w),
                            // Channel attention: C_g × C_g weights per head over N tokens, twice (kᵀv, then ·qᵀ).
                            BlockKind::Channel => block(&t, n, t.attention.head_dim),
                        };
                }
            }
        }
        macs + f(last * im.classes)
    }
}

impl ImageGptSpec {
    /// Analytic multiply-accumulates of one forward pass on one image's pixels.
    pub fn forward_macs(&self) -> f64 {
        let t = &self.transformer;
        let n = self.grid() * self.grid();
        f(t.layers) * block(t, n, n) + f(n) * f(t.d_model * (self.palette + 1))
    }
}
