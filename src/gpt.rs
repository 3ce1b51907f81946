//! A GPT decoder (the seed's 12.7): token embedding + position encoding, N Transformer layers with masked
//! (causal) self-attention, a final LayerNorm and a linear LM head over the vocabulary; trained with
//! next-token cross-entropy.
use tch::nn::{self, Module};
use tch::{Kind, Tensor};

use crate::attention::Mask;
use crate::config::ModelConfig;
use crate::layers::{LayerConfig, TransformerLayer};
use crate::pe::AbsolutePositions;

pub struct Gpt {
    token_embedding: nn::Embedding,
    positions: AbsolutePositions,
    layers: Vec<TransformerLayer>,
    final_norm: Option<nn::LayerNorm>,
    /// `None` when the head shares the token embedding matrix.
    lm_head: Option<nn::Linear>,
    dropout: f64,
    pub block_size: i64,
    pub vocab_size: i64,
}

impl Gpt {
    pub fn new(vs: &nn::Path, cfg: &ModelConfig, vocab_size: i64) -> Self {
        let emb_cfg = nn::EmbeddingConfig { ws_init: nn::Init::Randn { mean: 0.0, stdev: 0.02 }, ..Default::default() };
        // GPT-2: projections that write into the residual stream start smaller, by 1/sqrt(2·layers).
        let residual_init_std = 0.02 / ((2 * cfg.layers) as f64).sqrt();
        let layer_cfg = LayerConfig {
            d_model: cfg.d_model,
            heads: cfg.heads,
            ffn_hidden: cfg.ffn_hidden(),
            activation: cfg.activation,
            pre_ln: cfg.pre_ln,
            dropout: cfg.dropout,
            attention: &cfg.attention,
            cross_attention: false,
            residual_init_std,
        };
        let layers = (0..cfg.layers).map(|i| TransformerLayer::new(vs / "layers" / i, &layer_cfg)).collect();
        let lm_head = (!cfg.tie_embeddings).then(|| {
            let c =
                nn::LinearConfig { ws_init: nn::Init::Randn { mean: 0.0, stdev: 0.02 }, bs_init: None, bias: false };
            nn::linear(vs / "lm_head", cfg.d_model, vocab_size, c)
        });
        Self {
            token_embedding: nn::embedding(vs / "token_embedding", vocab_size, cfg.d_model, emb_cfg),
            positions: AbsolutePositions::new(vs / "position", cfg.pe, cfg.block_size, cfg.d_model),
            layers,
            final_norm: cfg
                .final_norm
                .then(|| nn::layer_norm(vs / "final_norm", vec![cfg.d_model], Default::default())),
            lm_head,
            dropout: cfg.dropout,
            block_size: cfg.block_size,
            vocab_size,
        }
    }

    /// Logits (B, N, V) for token ids (B, N), and the per-layer attention weights when asked for.
    pub fn forward_with_weights(&self, idx: &Tensor, train: bool, want_weights: bool) -> (Tensor, Vec<Tensor>) {
        let mut x = self.positions.add_to(&self.token_embedding.forward(idx)).dropout(self.dropout, train);
        let mut weights = Vec::new();
        let mask = Mask::causal();
        for layer in &self.layers {
            let out = layer.forward(&x, &mask, None, train, want_weights);
            x = out.output;
            weights.extend(out.self_weights);
        }
        if let Some(norm) = &self.final_norm {
            x = norm.forward(&x);
        }
        let logits = match &self.lm_head {
            Some(head) => head.forward(&x),
            None => x.matmul(&self.token_embedding.ws.tr()),
        };
        (logits, weights)
    }

    pub fn forward(&self, idx: &Tensor, train: bool) -> Tensor {
        self.forward_with_weights(idx, train, false).0
    }

    /// Mean next-token cross-entropy of predicting `targets` (B, N) from `idx` (B, N).
    pub fn loss(&self, idx: &Tensor, targets: &Tensor, train: bool) -> (Tensor, Tensor) {
        let logits = self.forward(idx, train);
        let loss =
            logits.view([-1, self.vocab_size]).to_kind(Kind::Float).cross_entropy_for_logits(&targets.reshape([-1]));
        (logits, loss)
    }

    /// Logits of the next token after each sequence in `idx` (B, N), cropped to the context length.
    pub fn next_token_logits(&self, idx: &Tensor) -> Tensor {
        let n = idx.size()[1];
        let ctx =
            if n > self.block_size { idx.narrow(1, n - self.block_size, self.block_size) } else { idx.shallow_clone() };
        let logits = self.forward(&ctx, false);
        logits.select(1, -1).to_kind(Kind::Float)
    }
}
