//! The attention core: multi-head scaled dot-product attention (the seed's 12.2–12.3), the only place in the
//! toolkit where attention is computed. Every model composes `MultiHeadAttention`.
//!
//! In the seed's column convention `Sa_h[X] = V_h · Softmax[K_hᵀ Q_h · s]`; here rows are tokens, so
//! `Sa_h = softmax(Q_h K_hᵀ · s + B) V_h` with `s` the scale knob and `B` an additive bias that carries every
//! mask (causal, padding) and, later, every score-level variant (relative position biases, sparse patterns).
//! Variants that change q and k themselves (rotary embeddings) transform them between the projection and the
//! score computation; both paths below share that step.
//!
//! Two implementations of the same maths:
//! - `Fused`: libtorch's `scaled_dot_product_attention` (one kernel, no N×N weights kept for backward on the
//!   flash/memory-efficient paths);
//! - `Explicit`: scores, additive bias, softmax, weighted sum — readable, works for every variant, and can hand
//!   back the attention weights for inspection.
use tch::nn::{self, Module};
use tch::{Kind, Tensor};

use crate::config::{AttentionConfig, Implementation};

/// What restricts which keys a query may attend to. Every part becomes an additive bias on the scores.
#[derive(Default)]
pub struct Mask<'a> {
    /// Query i may attend to key j only if j <= i (queries and keys index the same sequence).
    pub causal: bool,
    /// (B, N_k) boolean, true where the key is a real token and false where it is padding.
    pub key_padding: Option<&'a Tensor>,
}

impl Mask<'_> {
    pub fn causal() -> Self {
        Mask { causal: true, key_padding: None }
    }

    /// The additive bias (0 where allowed, -inf where not), broadcastable to (B, H, N_q, N_k); `None` when
    /// nothing is masked.
    pub fn additive_bias(&self, n_q: i64, n_k: i64, device: tch::Device, kind: Kind) -> Option<Tensor> {
        let mut allowed: Option<Tensor> = None;
        if self.causal {
            allowed = Some(causal_allowed(n_q, n_k, device));
        }
        if let Some(pad) = self.key_padding {
            let pad = pad.to_kind(Kind::Bool).view([pad.size()[0], 1, 1, n_k]);
            allowed = Some(match allowed {
                Some(a) => a.logical_and(&pad),
                None => pad,
            });
        }
        allowed.map(|a| Tensor::zeros(a.size(), (kind, device)).masked_fill(&a.logical_not(), f64::NEG_INFINITY))
    }
}

/// (N_q, N_k) boolean, true where query i may see key j under a causal mask. When there are fewer queries
/// than keys, the queries are the last N_q positions (as when decoding with earlier keys cached).
pub fn causal_allowed(n_q: i64, n_k: i64, device: tch::Device) -> Tensor {
    let q_pos = Tensor::arange(n_q, (Kind::Int64, device)).view([n_q, 1]) + (n_k - n_q);
    let k_pos = Tensor::arange(n_k, (Kind::Int64, device)).view([1, n_k]);
    k_pos.le_tensor(&q_pos)
}

/// Multi-head attention with Q/K/V projections (with biases), per-head size D/H and an output projection.
#[derive(Debug)]
pub struct MultiHeadAttention {
    /// Q, K and V projections stacked into one (3D, D) matrix: one matmul for self-attention; cross-attention
    /// applies the Q rows to the queries' sequence and the K/V rows to the other sequence.
    qkv: nn::Linear,
    out: nn::Linear,
    heads: i64,
    head_dim: i64,
    scale: f64,
    implementation: Implementation,
    dropout: f64,
}

/// The output of one attention call; `weights` is (B, H, N_q, N_k) when they were asked for.
pub struct Attended {
    pub output: Tensor,
    pub weights: Option<Tensor>,
}

impl MultiHeadAttention {
    /// `out_init_std` lets a model shrink the output projection's initialisation (GPT-2 scales it by depth).
    pub fn new(vs: nn::Path, d_model: i64, heads: i64, cfg: &AttentionConfig, out_init_std: f64) -> Self {
        assert!(heads > 0 && d_model % heads == 0, "heads ({heads}) must divide d_model ({d_model})");
        let head_dim = d_model / heads;
        let lin = |std: f64| nn::LinearConfig {
            ws_init: nn::Init::Randn { mean: 0.0, stdev: std },
            bs_init: Some(nn::Init::Const(0.0)),
            bias: cfg.bias,
        };
        Self {
            qkv: nn::linear(&vs / "qkv", d_model, 3 * d_model, lin(0.02)),
            out: nn::linear(&vs / "out", d_model, d_model, lin(out_init_std)),
            heads,
            head_dim,
            scale: cfg.scale.factor(head_dim),
            implementation: cfg.implementation,
            dropout: cfg.dropout,
        }
    }

    pub fn heads(&self) -> i64 {
        self.heads
    }

    /// Self-attention: queries, keys and values all come from `x` (B, N, D).
    pub fn self_attend(&self, x: &Tensor, mask: &Mask, train: bool, want_weights: bool) -> Attended {
        let qkv = self.qkv.forward(x);
        let parts = qkv.chunk(3, -1);
        self.attend_projected(&parts[0], &parts[1], &parts[2], mask, train, want_weights)
    }

    /// Cross-attention: queries from `x` (B, N_q, D), keys and values from `memory` (B, N_k, D).
    pub fn cross_attend(&self, x: &Tensor, memory: &Tensor, mask: &Mask, train: bool, want_weights: bool) -> Attended {
        let d = self.heads * self.head_dim;
        let w = &self.qkv.ws;
        let b = self.qkv.bs.as_ref();
        let q = x.linear(&w.narrow(0, 0, d), b.map(|b| b.narrow(0, 0, d)));
        let kv = memory.linear(&w.narrow(0, d, 2 * d), b.map(|b| b.narrow(0, d, 2 * d)));
        let parts = kv.chunk(2, -1);
        self.attend_projected(&q, &parts[0], &parts[1], mask, train, want_weights)
    }

    fn split_heads(&self, t: &Tensor) -> Tensor {
        let (b, n, _) = t.size3().unwrap();
        t.view([b, n, self.heads, self.head_dim]).transpose(1, 2)
    }

    fn attend_projected(
        &self,
        q: &Tensor,
        k: &Tensor,
        v: &Tensor,
        mask: &Mask,
        train: bool,
        want_weights: bool,
    ) -> Attended {
        let (b, n_q, _) = q.size3().unwrap();
        let (q, k, v) = (self.split_heads(q), self.split_heads(k), self.split_heads(v));
        let dropout = if train { self.dropout } else { 0.0 };
        let use_explicit = want_weights || self.implementation == Implementation::Explicit;
        let (heads_out, weights) = if use_explicit {
            let (o, w) = explicit_attention(&q, &k, &v, mask, self.scale, dropout, train);
            (o, Some(w))
        } else {
            (fused_attention(&q, &k, &v, mask, self.scale, dropout), None)
        };
        // Concatenate the heads and mix them with Ω_c (the seed's MhSa).
        let merged = heads_out.transpose(1, 2).contiguous().view([b, n_q, self.heads * self.head_dim]);
        Attended { output: self.out.forward(&merged), weights: if want_weights { weights } else { None } }
    }
}

/// softmax(q kᵀ · scale + bias) v, written out. q: (B, H, N_q, d), k and v: (B, H, N_k, d).
/// Returns the output (B, H, N_q, d) and the weights (B, H, N_q, N_k) (before dropout).
pub fn explicit_attention(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    mask: &Mask,
    scale: f64,
    dropout: f64,
    train: bool,
) -> (Tensor, Tensor) {
    let n_q = q.size()[2];
    let n_k = k.size()[2];
    let mut scores = q.matmul(&k.transpose(-2, -1)) * scale;
    if let Some(bias) = mask.additive_bias(n_q, n_k, q.device(), scores.kind()) {
        scores += bias;
    }
    let weights = scores.softmax(-1, scores.kind());
    let dropped = if dropout > 0.0 { weights.dropout(dropout, train) } else { weights.shallow_clone() };
    (dropped.matmul(v), weights)
}

/// The same maths through libtorch's fused kernel.
pub fn fused_attention(q: &Tensor, k: &Tensor, v: &Tensor, mask: &Mask, scale: f64, dropout: f64) -> Tensor {
    let n_q = q.size()[2];
    let n_k = k.size()[2];
    // A plain causal mask over a square score matrix is the kernel's own `is_causal` fast path; anything else
    // goes in as an additive bias.
    let square_causal_only = mask.causal && mask.key_padding.is_none() && n_q == n_k;
    let bias = if square_causal_only { None } else { mask.additive_bias(n_q, n_k, q.device(), q.kind()) };
    Tensor::scaled_dot_product_attention(q, k, v, bias.as_ref(), dropout, square_causal_only, Some(scale), false)
}

/// Mean entropy (nats) of the attention rows and mean of each row's largest weight: how peaked the softmax is.
/// Rows are over the allowed keys only (masked weights are exactly 0 and contribute nothing).
pub fn weight_statistics(weights: &Tensor) -> (f64, f64) {
    let w = weights.to_kind(Kind::Float);
    let plogp = &w * w.clamp_min(1e-30).log();
    let entropy = -plogp.sum_dim_intlist(-1, false, Kind::Float).mean(Kind::Float);
    let max_weight = w.amax(-1, false).mean(Kind::Float);
    (entropy.double_value(&[]), max_weight.double_value(&[]))
}
