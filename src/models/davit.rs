//! DaViT (Ding et al. 2022): each stage alternates a *spatial* block (window attention over tokens) with a
//! *channel* block (group attention over channels, where every token takes part in C_g × C_g weights, so
//! each output channel sees the whole image), each preceded by a convolutional position encoding (a
//! depthwise 3×3 convolution added to the tokens: `pe: conv`, the paper's) and built on the shared residual
//! pattern with an FFN. Stages halve the resolution with a normalised 2×2 stride-2 convolution. Channel
//! attention scales k by head_dim^-0.5 as timm does (see `MultiHeadAttention::channel_attend`); the run's
//! scale knob replaces that factor like any other.
use tch::nn::{self, Module};
use tch::{Kind, Tensor};

use super::spec::{BlockKind, StagedSpec};
use super::swin::{window_partition, window_reverse};
use super::ImageClassifier;
use crate::transformer::attention::{Grid, Mask};
use crate::transformer::layers::{self, AttentionBlock};
use crate::transformer::positions::{AbsolutePositions, ConvPosEnc};
use crate::transformer::spec::{PositionEncoding, TransformerSpec};

struct Block {
    kind: BlockKind,
    cpe: Option<[ConvPosEnc; 2]>,
    block: AttentionBlock,
    grid: i64,
    window: i64,
}

impl Block {
    fn new(vs: nn::Path, kind: BlockKind, t: &TransformerSpec, grid: i64, window: i64) -> Self {
        let d = t.d_model;
        let cpe = (t.position.encoding == PositionEncoding::Conv)
            .then(|| [ConvPosEnc::new(&vs / "cpe" / 0, d), ConvPosEnc::new(&vs / "cpe" / 1, d)]);
        // Channel attention swaps the roles of q, k and v, so its unit keeps the plain multi-head shape.
        let plain;
        let t = if kind == BlockKind::Channel {
            plain = TransformerSpec { attention: t.attention.plain_shape(), ..t.clone() };
            &plain
        } else {
            t
        };
        Self { kind, cpe, block: AttentionBlock::new(&vs, t, Some(Grid { side: window, lead: 0 })), grid, window }
    }

    fn positions(&self, x: &Tensor, which: usize) -> Tensor {
        match &self.cpe {
            Some(cpe) => cpe[which].forward(x, self.grid, 0),
            None => x.shallow_clone(),
        }
    }

    /// x: (B, grid², C). Weights when asked: (B·windows, H, w², w²) spatial, (B, H, C_g, C_g) channel.
    fn forward(&self, x: &Tensor, train: bool, want_weights: bool) -> (Tensor, Option<Tensor>) {
        let x = self.positions(x, 0);
        let mut weights = None;
        let x = self.block.attend(&x, train, |attn, h| match self.kind {
            BlockKind::Spatial => {
                let (b, n, c) = h.size3().unwrap();
                let (g, w) = (self.grid, self.window);
                // Pad the grid to a multiple of the window (the padding takes part as keys, as in timm).
                let padded = (g + w - 1) / w * w;
                let grid = h.view([b, g, g, c]).constant_pad_nd([0, 0, 0, padded - g, 0, padded - g]);
                let a = attn.self_attend(&window_partition(&grid, w), &Mask::default(), None, train, want_weights);
                weights = a.weights;
                let out = window_reverse(&a.output, w, padded, padded).slice(1, 0, g, 1).slice(2, 0, g, 1);
                out.contiguous().view([b, n, c])
            }
            BlockKind::Channel => {
                let a = attn.channel_attend(h, train, want_weights);
                weights = a.weights;
                a.output
            }
        });
        let x = self.positions(&x, 1);
        (self.block.feed_forward(&x, train), weights)
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
    /// An absolute encoding, added once after the stem (DaViT itself uses the convolutional one).
    positions: AbsolutePositions,
    stages: Vec<(Option<Downsample>, Vec<Block>)>,
    grids: Vec<i64>,
    norm: Option<layers::NormLayer>,
    head: nn::Linear,
    dropout: f64,
    /// `transformer.logit_softcap`.
    logit_softcap: Option<f64>,
}

impl Davit {
    pub fn new(vs: &nn::Path, spec: &StagedSpec) -> Self {
        // Overlapping patch embedding: kernel 2p−1, stride p, padding p−1 (7/4/3 for p = 4, as DaViT).
        let (im, p) = (&spec.image, spec.image.patch);
        let stem_cfg = nn::ConvConfig { stride: p, padding: p - 1, ..Default::default() };
        let stages = (0..spec.stages())
            .map(|i| {
                let (t, grid, window) = (spec.stage(i), spec.grid(i), spec.window(i));
                let dim = t.d_model;
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
                let blocks = (0..spec.depths[i])
                    .map(|j| {
                        let kind = spec.blocks[j as usize % spec.blocks.len()];
                        Block::new(&stage / "blocks" / j, kind, &t, grid, window)
                    })
                    .collect();
                (down, blocks)
            })
            .collect();
        let (t, d) = (&spec.transformer, spec.transformer.d_model);
        let last = spec.stage(spec.stages() - 1).d_model;
        let grid = spec.grid(0);
        Self {
            stem: nn::conv2d(vs / "stem", im.channels, d, 2 * p - 1, stem_cfg),
            stem_norm: nn::layer_norm(vs / "stem_norm", vec![d], Default::default()),
            positions: AbsolutePositions::new(vs / "pos_embed", t.position.encoding, grid * grid, d),
            stages,
            grids: (0..spec.stages()).map(|i| spec.grid(i)).collect(),
            norm: layers::final_norm(vs / "norm", last, t, 1e-5),
            head: nn::linear(vs / "head", last, im.classes, Default::default()),
            dropout: t.dropout,
            logit_softcap: t.logit_softcap,
        }
    }

    /// Final token states (B, N, C) and, when asked, every block's attention weights.
    pub fn features(&self, images: &Tensor, train: bool, want_weights: bool) -> (Tensor, Vec<Tensor>) {
        let mut x = self.stem_norm.forward(&self.stem.forward(images).flatten(2, -1).transpose(1, 2));
        if let Some(table) = self.positions.table(x.size()[1]) {
            x += table;
        }
        if self.dropout > 0.0 {
            x = x.dropout(self.dropout, train);
        }
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
        let x = match &self.norm {
            Some(norm) => norm.forward(&x, train),
            None => x,
        };
        (x, weights)
    }
}

impl ImageClassifier for Davit {
    fn classify(&self, images: &Tensor, train: bool, want_weights: bool) -> (Tensor, Vec<Tensor>) {
        let (x, weights) = self.features(images, train, want_weights);
        (layers::softcap(self.head.forward(&x.mean_dim(1, false, Kind::Float)), self.logit_softcap), weights)
    }

    fn head(&self) -> &nn::Linear {
        &self.head
    }
}
