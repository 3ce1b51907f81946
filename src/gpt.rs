//! A GPT decoder (the seed's 12.7): token embedding + position encoding, N Transformer layers with masked
//! (causal) self-attention, a final LayerNorm and a linear LM head over the vocabulary; trained with
//! next-token cross-entropy.
use tch::nn::{self, Module};
use tch::{Kind, Tensor};

use crate::attention::Mask;
use crate::config::{AbsoluteAt, ModelConfig};
use crate::layers::{LayerConfig, TransformerLayer};
use crate::pe::AbsolutePositions;

pub struct Gpt {
    token_embedding: nn::Embedding,
    positions: AbsolutePositions,
    positions_at: AbsoluteAt,
    /// Extra learned tokens prepended to every sequence (global tokens of a sparse pattern), (G, D).
    global_tokens: Option<Tensor>,
    layers: Vec<TransformerLayer>,
    final_norm: Option<nn::LayerNorm>,
    /// `None` when the head shares the token embedding matrix.
    lm_head: Option<nn::Linear>,
    dropout: f64,
    pub block_size: i64,
    pub vocab_size: i64,
    device: tch::Device,
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
            pe: cfg.pe,
            position: &cfg.position,
            cross_attention: false,
            residual_init_std,
            norm_eps: 1e-5,
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
            positions_at: cfg.position.at,
            global_tokens: (cfg.attention.pattern.global_tokens > 0).then(|| {
                let g = cfg.attention.pattern.global_tokens;
                vs.var("global_tokens", &[g, cfg.d_model], nn::Init::Randn { mean: 0.0, stdev: 0.02 })
            }),
            layers,
            final_norm: cfg
                .final_norm
                .then(|| nn::layer_norm(vs / "final_norm", vec![cfg.d_model], Default::default())),
            lm_head,
            dropout: cfg.dropout,
            block_size: cfg.block_size,
            vocab_size,
            device: vs.device(),
        }
    }

    /// Logits (B, N, V) for token ids (B, N), and the per-layer attention weights when asked for (over the
    /// global tokens too, if the pattern has any: they come first).
    pub fn forward_with_weights(&self, idx: &Tensor, train: bool, want_weights: bool) -> (Tensor, Vec<Tensor>) {
        let (x, weights) = self.hidden_with_weights(idx, train, want_weights);
        (self.head(&x), weights)
    }

    /// The LM head applied to final hidden states.
    pub fn head(&self, x: &Tensor) -> Tensor {
        match &self.lm_head {
            Some(head) => head.forward(x),
            None => x.matmul(&self.token_embedding.ws.tr()),
        }
    }

    /// The final hidden states (B, N, D) (after the final norm, if any): the features a probe reads.
    pub fn hidden_with_weights(&self, idx: &Tensor, train: bool, want_weights: bool) -> (Tensor, Vec<Tensor>) {
        let (b, n) = idx.size2().unwrap();
        let mut x = self.token_embedding.forward(idx);
        let table = self.positions.table(n);
        if let (Some(t), AbsoluteAt::Input) = (&table, self.positions_at) {
            x = &x + t;
        }
        let g = self.global_tokens.as_ref().map_or(0, |t| t.size()[0]);
        // Global tokens carry no position: the encodings added inside the layers are zero for them.
        let table = table.map(|t| if g > 0 { t.constant_pad_nd([0, 0, g, 0]) } else { t });
        if let Some(tokens) = &self.global_tokens {
            x = Tensor::cat(&[tokens.unsqueeze(0).expand([b, g, -1], false), x], 1);
        }
        x = x.dropout(self.dropout, train);
        let mut weights = Vec::new();
        let mask = Mask::causal();
        for layer in &self.layers {
            let qk_add = match self.positions_at {
                AbsoluteAt::EveryLayer => {
                    x = &x + table.as_ref().expect("absolute encoding");
                    None
                }
                AbsoluteAt::Qk => table.as_ref(),
                AbsoluteAt::Input => None,
            };
            let out = layer.forward(&x, &mask, qk_add, None, train, want_weights);
            x = out.output;
            weights.extend(out.self_weights);
        }
        if g > 0 {
            x = x.narrow(1, g, n);
        }
        if let Some(norm) = &self.final_norm {
            x = norm.forward(&x);
        }
        (x, weights)
    }

    /// Whether the model can read sequences of `n` tokens (a learned position table has a fixed length).
    pub fn covers(&self, n: i64) -> bool {
        self.positions.covers(n)
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
        // Decoding loops keep their token lists on the CPU whatever device the model is on.
        let logits = self.forward(&ctx.to_device(self.device), false);
        logits.select(1, -1).to_kind(Kind::Float).to_device(tch::Device::Cpu)
    }
}
