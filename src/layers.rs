//! The Transformer layer (the seed's 12.4): a multi-head attention unit and a per-token FFN, each a residual
//! branch, with LayerNorm after each addition (post-LN, as in the seed and Vaswani et al.) or inside each
//! branch (pre-LN, as in GPT-2). An optional cross-attention unit sits between them for decoders that read an
//! encoder's output (12.8).
use tch::nn::{self, Module};
use tch::Tensor;

use crate::attention::{Mask, MultiHeadAttention};
use crate::config::{Activation, AttentionConfig, PositionConfig, PositionEncoding};

pub struct LayerConfig<'a> {
    pub d_model: i64,
    pub heads: i64,
    pub ffn_hidden: i64,
    pub activation: Activation,
    pub pre_ln: bool,
    pub dropout: f64,
    pub attention: &'a AttentionConfig,
    /// The model's position encoding: relative schemes live in the self-attention unit.
    pub pe: PositionEncoding,
    pub position: &'a PositionConfig,
    pub cross_attention: bool,
    /// Initial standard deviation of the projections that write into the residual stream.
    pub residual_init_std: f64,
    /// LayerNorm's ε (PyTorch's default 1e-5; BERT checkpoints use 1e-12).
    pub norm_eps: f64,
}

#[derive(Debug)]
pub struct FeedForward {
    up: nn::Linear,
    down: nn::Linear,
    activation: Activation,
}

impl FeedForward {
    pub fn new(vs: nn::Path, d_model: i64, hidden: i64, activation: Activation, down_init_std: f64) -> Self {
        let lin = |std: f64| nn::LinearConfig {
            ws_init: nn::Init::Randn { mean: 0.0, stdev: std },
            bs_init: Some(nn::Init::Const(0.0)),
            bias: true,
        };
        Self {
            up: nn::linear(&vs / "up", d_model, hidden, lin(0.02)),
            down: nn::linear(&vs / "down", hidden, d_model, lin(down_init_std)),
            activation,
        }
    }
}

impl Module for FeedForward {
    fn forward(&self, x: &Tensor) -> Tensor {
        let h = self.up.forward(x);
        let h = match self.activation {
            Activation::Relu => h.relu(),
            Activation::Gelu => h.gelu("none"),
        };
        self.down.forward(&h)
    }
}

pub struct TransformerLayer {
    self_attention: MultiHeadAttention,
    norm_attention: nn::LayerNorm,
    cross: Option<(MultiHeadAttention, nn::LayerNorm)>,
    ffn: FeedForward,
    norm_ffn: nn::LayerNorm,
    pre_ln: bool,
    dropout: f64,
}

/// What a layer hands back besides its output when asked: the self-attention weights (B, H, N, N).
pub struct LayerOutput {
    pub output: Tensor,
    pub self_weights: Option<Tensor>,
}

impl TransformerLayer {
    pub fn new(vs: nn::Path, cfg: &LayerConfig) -> Self {
        let norm = nn::LayerNormConfig { eps: cfg.norm_eps, ..Default::default() };
        let ln = |name: &str| nn::layer_norm(&vs / name, vec![cfg.d_model], norm);
        let self_attention = MultiHeadAttention::new(
            &vs / "attn",
            cfg.d_model,
            cfg.heads,
            cfg.attention,
            cfg.pe,
            cfg.position,
            cfg.residual_init_std,
        );
        let cross = cfg.cross_attention.then(|| {
            let mha =
                MultiHeadAttention::plain(&vs / "cross", cfg.d_model, cfg.heads, cfg.attention, cfg.residual_init_std);
            (mha, ln("norm_cross"))
        });
        Self {
            self_attention,
            norm_attention: ln("norm_attn"),
            cross,
            ffn: FeedForward::new(&vs / "ffn", cfg.d_model, cfg.ffn_hidden, cfg.activation, cfg.residual_init_std),
            norm_ffn: ln("norm_ffn"),
            pre_ln: cfg.pre_ln,
            dropout: cfg.dropout,
        }
    }

    /// Whether this layer cross-attends to an encoder's output.
    pub fn has_cross_attention(&self) -> bool {
        self.cross.is_some()
    }

    /// One residual unit: post-LN `norm(x + f(x))` or pre-LN `x + f(norm(x))`.
    fn residual(&self, x: &Tensor, norm: &nn::LayerNorm, train: bool, f: impl FnOnce(&Tensor) -> Tensor) -> Tensor {
        if self.pre_ln {
            x + f(&norm.forward(x)).dropout(self.dropout, train)
        } else {
            norm.forward(&(x + f(x).dropout(self.dropout, train)))
        }
    }

    /// `qk_add` (N, D) is an absolute position encoding for the query/key inputs only. `memory` and its mask
    /// are the encoder output and its padding, for layers built with cross-attention.
    pub fn forward(
        &self,
        x: &Tensor,
        mask: &Mask,
        qk_add: Option<&Tensor>,
        memory: Option<(&Tensor, &Mask)>,
        train: bool,
        want_weights: bool,
    ) -> LayerOutput {
        let mut self_weights = None;
        let x = self.residual(x, &self.norm_attention, train, |h| {
            let a = self.self_attention.self_attend(h, mask, qk_add, train, want_weights);
            self_weights = a.weights;
            a.output
        });
        let x = match (&self.cross, memory) {
            (Some((cross, norm)), Some((mem, mem_mask))) => {
                self.residual(&x, norm, train, |h| cross.cross_attend(h, mem, mem_mask, train, false).output)
            }
            (None, None) => x,
            (Some(_), None) => panic!("a layer built with cross-attention needs the encoder memory"),
            (None, Some(_)) => panic!("encoder memory passed to a layer built without cross-attention"),
        };
        let output = self.residual(&x, &self.norm_ffn, train, |h| self.ffn.forward(h));
        LayerOutput { output, self_weights }
    }
}
