//! A GPT decoder (UDL §12.7): token embedding, N Transformer layers with masked (causal) self-attention
//! and the position encoding the spec names, a final LayerNorm and a linear LM head over the vocabulary;
//! trained with next-token cross-entropy.
use tch::nn::{self, Module};
use tch::{Kind, Tensor};

use crate::transformer::attention::{Grid, Mask};
use crate::transformer::layers::{self, GlobalTokens, LayerInit, Pass, Stack, StackCache, ValueEmbeddings};
use crate::transformer::positions::AbsolutePositions;
use crate::transformer::spec::TransformerSpec;

pub struct Gpt {
    token_embedding: nn::Embedding,
    stack: Stack,
    /// `None` when the head shares the token embedding matrix.
    lm_head: Option<nn::Linear>,
    pub block_size: i64,
    pub vocab_size: i64,
    device: tch::Device,
    /// `transformer.logit_softcap`.
    logit_softcap: Option<f64>,
    /// muP's readout multiplier (1 in the standard parametrisation).
    readout_factor: f64,
}

impl Gpt {
    pub fn new(vs: &nn::Path, spec: &TransformerSpec, vocab_size: i64) -> Self {
        Self::on_grid(vs, spec, vocab_size, None)
    }

    /// A decoder whose tokens after the first `grid.lead` form a 2-D grid (ImageGPT's pixels), for a 2-D
    /// position scheme.
    pub fn on_grid(vs: &nn::Path, spec: &TransformerSpec, vocab_size: i64, grid: Option<Grid>) -> Self {
        let d = spec.d_model;
        let emb_cfg = nn::EmbeddingConfig { ws_init: nn::Init::Randn { mean: 0.0, stdev: 0.02 }, ..Default::default() };
        // GPT-2: projections that write into the residual stream start smaller, by 1/sqrt(2·layers).
        let init = LayerInit { residual_std: 0.02 / ((2 * spec.layers.max(1)) as f64).sqrt(), norm_eps: 1e-5 };
        let layers = layers::layers(&(vs / "layers"), spec, spec.layers, |_| false, init, grid);
        let lm_head = (!spec.tie_embeddings).then(|| {
            let c =
                nn::LinearConfig { ws_init: nn::Init::Randn { mean: 0.0, stdev: 0.02 }, bs_init: None, bias: false };
            nn::linear(vs / "lm_head", d, vocab_size, c)
        });
        // With concatenated positions the tokens take D − P of the D dimensions and the table the rest.
        let token_embedding = nn::embedding(vs / "token_embedding", vocab_size, spec.token_width(), emb_cfg);
        let positions =
            AbsolutePositions::new(vs / "position", spec.position.encoding, spec.block_size, spec.position_width());
        let global_tokens = GlobalTokens::new(vs, spec.attention.pattern.global_tokens, d);
        let final_norm = layers::final_norm(vs / "final_norm", d, spec, 1e-5);
        let value_embeddings = ValueEmbeddings::new(&(vs / "value_embeddings"), spec, vocab_size);
        let stack =
            Stack::new(spec, positions, global_tokens, layers, final_norm).with_value_embeddings(value_embeddings);
        let (block_size, device, logit_softcap) = (spec.block_size, vs.device(), spec.logit_softcap);
        let readout_factor = spec.readout_factor();
        Self { token_embedding, stack, lm_head, block_size, vocab_size, device, logit_softcap, readout_factor }
    }

    /// Logits (B, N, V) for token ids (B, N), and the per-layer attention weights when asked for (over the
    /// global tokens too, if the pattern has any: they come first).
    pub fn forward_with_weights(&self, idx: &Tensor, pass: Pass) -> (Tensor, Vec<Tensor>) {
        let (x, weights) = self.hidden_with_weights(idx, pass);
        (self.head(&x), weights)
    }

    /// The LM head applied to final hidden states.
    pub fn head(&self, x: &Tensor) -> Tensor {
        let logits = match &self.lm_head {
            Some(head) => head.forward(x),
            None => x.matmul(&self.token_embedding.ws.tr()),
        };
        let logits = if self.readout_factor == 1.0 { logits } else { logits * self.readout_factor };
        layers::softcap(logits, self.logit_softcap)
    }

    /// The final hidden states (B, N, D) (after the final norm, if any): the features a probe reads.
    pub fn hidden_with_weights(&self, idx: &Tensor, pass: Pass) -> (Tensor, Vec<Tensor>) {
        self.stack.forward(&self.token_embedding.forward(idx), &Mask::causal(), None, pass.with_tokens(idx))
    }

    /// Whether the model can read sequences of `n` tokens (a learned position table has a fixed length).
    pub fn covers(&self, n: i64) -> bool {
        self.stack.positions.covers(n)
    }

    pub fn forward(&self, idx: &Tensor, train: bool) -> Tensor {
        self.forward_with_weights(idx, Pass::new(train)).0
    }

    /// Mean next-token cross-entropy of predicting `targets` (B, N) from `idx` (B, N).
    pub fn loss(&self, idx: &Tensor, targets: &Tensor, train: bool) -> (Tensor, Tensor) {
        let logits = self.forward(idx, train);
        let loss =
            logits.view([-1, self.vocab_size]).to_kind(Kind::Float).cross_entropy_for_logits(&targets.reshape([-1]));
        (logits, loss)
    }

    /// Logits (B, N_new, V) of the new tokens `idx` (B, N_new) after the positions `cache` holds, which then
    /// holds them too: a step of cached decoding (UDL §12.7.3), in evaluation mode.
    pub fn forward_cached(&self, idx: &Tensor, cache: &mut StackCache) -> Tensor {
        self.forward_with_weights(idx, Pass::cached(cache)).0
    }

    /// The decoder's layers (to inspect them, or to mask attention heads).
    pub fn layers(&self) -> &[crate::transformer::layers::TransformerLayer] {
        &self.stack.layers
    }

    pub fn device(&self) -> tch::Device {
        self.device
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
