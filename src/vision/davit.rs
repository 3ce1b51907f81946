//! DaViT (Ding et al. 2022): each stage alternates a *spatial* block (window attention over tokens) with a
//! *channel* block (group attention over channels, where every token takes part in C_g × C_g weights, so
//! each output channel sees the whole image), both pre-LN with an FFN, each preceded by a convolutional
//! position encoding (a depthwise 3×3 convolution added to the tokens) instead of a position table.
//! Stages halve the resolution with a normalised 2×2 stride-2 convolution. Channel attention scales k by
//! head_dim^-0.5 as timm does (see `MultiHeadAttention::channel_attend`).
use tch::nn::{self, Module};
use tch::{Kind, Tensor};

use super::swin::{window_partition, window_reverse};
use super::{BlockKind, VisionConfig};
use crate::attention::{Mask, MultiHeadAttention};
use crate::config::{Activation, AttentionConfig};
use crate::layers::FeedForward;

/// Tokens plus a depthwise 3×3 convolution of the token grid (with bias).
struct ConvPosEnc {
    conv: nn::Conv2D,
}

impl ConvPosEnc {
    fn new(vs: nn::Path, dim: i64) -> Self {
        let cfg = nn::ConvConfig { padding: 1, groups: dim, ..Default::default() };
        Self { conv: nn::conv2d(vs / "proj", dim, dim, 3, cfg) }
    }

    fn forward(&self, x: &Tensor, grid: i64) -> Tensor {
        let (b, n, c) = x.size3().unwrap();
        let feat = x.transpose(1, 2).reshape([b, c, grid, grid]);
        x + self.conv.forward(&feat).flatten(2, -1).transpose(1, 2).view([b, n, c])
    }
}

struct Block {
    kind: BlockKind,
    cpe: [ConvPosEnc; 2],
    norm1: nn::LayerNorm,
    attn: MultiHeadAttention,
    norm2: nn::LayerNorm,
    mlp: FeedForward,
    grid: i64,
    window: i64,
}

impl Block {
    fn new(vs: nn::Path, kind: BlockKind, dim: i64, heads: i64, grid: i64, window: i64, mlp_hidden: i64) -> Self {
        let ln = |name: &str| nn::layer_norm(&vs / name, vec![dim], Default::default());
        Self {
            kind,
            cpe: [ConvPosEnc::new(&vs / "cpe" / 0, dim), ConvPosEnc::new(&vs / "cpe" / 1, dim)],
            norm1: ln("norm1"),
            attn: MultiHeadAttention::plain(&vs / "attn", dim, heads, &AttentionConfig::default(), 0.02),
            norm2: ln("norm2"),
            mlp: FeedForward::new(&vs / "mlp", dim, mlp_hidden, Activation::Gelu, 0.02),
            grid,
            window,
        }
    }

    /// x: (B, grid², C). Weights when asked: (B·windows, H, w², w²) spatial, (B, H, C_g, C_g) channel.
    fn forward(&self, x: &Tensor, train: bool, want_weights: bool) -> (Tensor, Option<Tensor>) {
        let x = self.cpe[0].forward(x, self.grid);
        let h = self.norm1.forward(&x);
        let (attended, weights) = match self.kind {
            BlockKind::Spatial => {
                let (b, n, c) = h.size3().unwrap();
                let (g, w) = (self.grid, self.window);
                // Pad the grid to a multiple of the window (the padding takes part as keys, as in timm).
                let padded = (g + w - 1) / w * w;
                let grid = h.view([b, g, g, c]).constant_pad_nd([0, 0, 0, padded - g, 0, padded - g]);
                let a = self.attn.self_attend(&window_partition(&grid, w), &Mask::default(), None, train, want_weights);
                let out = window_reverse(&a.output, w, padded, padded).slice(1, 0, g, 1).slice(2, 0, g, 1);
                (out.contiguous().view([b, n, c]), a.weights)
            }
            BlockKind::Channel => {
                let a = self.attn.channel_attend(&h, want_weights);
                (a.output, a.weights)
            }
        };
        let x = self.cpe[1].forward(&(x + attended), self.grid);
        let x = &x + self.mlp.forward(&self.norm2.forward(&x));
        (x, weights)
    }
}

/// Between stages: LayerNorm, then a 2×2 stride-2 convolution to the next width.
struct Downsample {
    norm: nn::LayerNorm,
    conv: nn::Conv2D,
}

pub struct Davit {
    stem: nn::Conv2D,
    stem_norm: nn::LayerNorm,
    stages: Vec<(Option<Downsample>, Vec<Block>)>,
    grids: Vec<i64>,
    norm: nn::LayerNorm,
    head: nn::Linear,
}

impl Davit {
    pub fn new(vs: &nn::Path, cfg: &VisionConfig) -> Self {
        // Overlapping patch embedding: kernel 2p−1, stride p, padding p−1 (7/4/3 for p = 4, as DaViT).
        let p = cfg.patch_size;
        let stem_cfg = nn::ConvConfig { stride: p, padding: p - 1, ..Default::default() };
        let stages = (0..cfg.stages())
            .map(|i| {
                let (dim, grid, window) = (cfg.stage_dim(i), cfg.stage_grid(i), cfg.stage_window(i));
                let stage = vs / "stages" / i;
                let down = (i > 0).then(|| Downsample {
                    norm: nn::layer_norm(&stage / "downsample_norm", vec![dim / 2], Default::default()),
                    conv: nn::conv2d(
                        &stage / "downsample",
                        dim / 2,
                        dim,
                        2,
                        nn::ConvConfig { stride: 2, ..Default::default() },
                    ),
                });
                let blocks = (0..cfg.depths[i])
                    .map(|j| {
                        let kind = cfg.attention_types[j as usize % cfg.attention_types.len()];
                        Block::new(&stage / "blocks" / j, kind, dim, cfg.heads[i], grid, window, cfg.ffn_hidden(dim))
                    })
                    .collect();
                (down, blocks)
            })
            .collect();
        let last = cfg.stage_dim(cfg.stages() - 1);
        Self {
            stem: nn::conv2d(vs / "stem", cfg.channels, cfg.dim, 2 * p - 1, stem_cfg),
            stem_norm: nn::layer_norm(vs / "stem_norm", vec![cfg.dim], Default::default()),
            stages,
            grids: (0..cfg.stages()).map(|i| cfg.stage_grid(i)).collect(),
            norm: nn::layer_norm(vs / "norm", vec![last], Default::default()),
            head: nn::linear(vs / "head", last, cfg.classes, Default::default()),
        }
    }

    /// Final token states (B, N, C) and, when asked, every block's attention weights.
    pub fn features(&self, images: &Tensor, train: bool, want_weights: bool) -> (Tensor, Vec<Tensor>) {
        let mut x = self.stem_norm.forward(&self.stem.forward(images).flatten(2, -1).transpose(1, 2));
        let mut weights = Vec::new();
        for (i, (down, blocks)) in self.stages.iter().enumerate() {
            if let Some(d) = down {
                let (b, _, c) = x.size3().unwrap();
                let g = self.grids[i - 1];
                let grid = d.norm.forward(&x).transpose(1, 2).reshape([b, c, g, g]);
                // An odd grid is padded by one row and column, as timm does.
                let grid = grid.constant_pad_nd([0, g % 2, 0, g % 2]);
                x = d.conv.forward(&grid).flatten(2, -1).transpose(1, 2);
            }
            for block in blocks {
                let (y, w) = block.forward(&x, train, want_weights);
                weights.extend(w);
                x = y;
            }
        }
        (self.norm.forward(&x), weights)
    }

    pub fn forward(&self, images: &Tensor, train: bool) -> Tensor {
        let (x, _) = self.features(images, train, false);
        self.head.forward(&x.mean_dim(1, false, Kind::Float))
    }
}
