//! The Long Range Arena's classifier (Tay et al. 2020): embed each token, run the Transformer over the
//! whole sequence without a causal mask (every sparse pattern and position scheme of the run's Transformer
//! acts), keep padding out of every attention, then classify one vector: the final state of a `<cls>`
//! token put first, or the mean of the real tokens' final states (LRA's default). A sequence shorter than
//! the longest is padded with a token of its own and the padding masked, so its class depends on its real
//! tokens only.
use tch::nn::{self, Module};
use tch::{Kind, Tensor};

use super::spec::Pool;
use crate::transformer::attention::Mask;
use crate::transformer::layers::{self, GlobalTokens, LayerInit, Pass, Stack, ValueEmbeddings};
use crate::transformer::positions::AbsolutePositions;
use crate::transformer::spec::TransformerSpec;

pub struct SeqClassifier {
    embedding: nn::Embedding,
    stack: Stack,
    head: nn::Linear,
    pool: Pool,
    /// The task's vocabulary; the pad token is `vocab`, the `<cls>` token `vocab + 1`.
    vocab: i64,
    /// `transformer.logit_softcap`.
    logit_softcap: Option<f64>,
}

impl SeqClassifier {
    /// A classifier of sequences over `vocab` tokens (0..vocab) into `classes`, `spec.block_size` positions
    /// long at most (the `<cls>` token included).
    pub fn new(vs: &nn::Path, spec: &TransformerSpec, vocab: i64, classes: i64, pool: Pool) -> Self {
        let d = spec.d_model;
        let emb_cfg = nn::EmbeddingConfig { ws_init: nn::Init::Randn { mean: 0.0, stdev: 0.02 }, ..Default::default() };
        let embedding = nn::embedding(vs / "token_embedding", vocab + 2, spec.token_width(), emb_cfg);
        let positions =
            AbsolutePositions::new(vs / "position", spec.position.encoding, spec.block_size, spec.position_width());
        let layers = layers::layers(&(vs / "layers"), spec, spec.layers, |_| false, LayerInit::default(), None);
        let global_tokens = GlobalTokens::new(vs, spec.attention.pattern.global_tokens, d);
        let final_norm = layers::final_norm(vs / "final_norm", d, spec, 1e-5);
        let stack = Stack::new(spec, positions, global_tokens, layers, final_norm);
        let head = nn::linear(vs / "head", d, classes, Default::default());
        // Value embeddings' tables come last, so that every other parameter draws as it did before them.
        let stack = stack.with_value_embeddings(ValueEmbeddings::new(&(vs / "value_embeddings"), spec, vocab + 2));
        Self { embedding, stack, head, pool, vocab, logit_softcap: spec.logit_softcap }
    }

    /// The id of the padding token.
    pub fn pad_id(&self) -> i64 {
        self.vocab
    }

    /// The model's input for token ids (B, N), `pad_id` after each sequence's real tokens: the ids with the
    /// `<cls>` token first when pooling reads it, and the (B, N′) real-token flags.
    fn input(&self, ids: &Tensor) -> (Tensor, Tensor) {
        let real = ids.ne(self.vocab);
        if self.pool == Pool::Mean {
            return (ids.shallow_clone(), real);
        }
        let b = ids.size()[0];
        let cls = Tensor::full([b, 1], self.vocab + 1, (Kind::Int64, ids.device()));
        (Tensor::cat(&[&cls, ids], 1), Tensor::cat(&[&cls.ones_like().to_kind(Kind::Bool), &real], 1))
    }

    /// Class logits (B, classes) of token ids (B, N), and every layer's attention weights when asked.
    pub fn classify(&self, ids: &Tensor, train: bool, want_weights: bool) -> (Tensor, Vec<Tensor>) {
        let (ids, real) = self.input(ids);
        let mask = Mask { causal: false, key_padding: Some(&real), offset: 0, bias: None };
        let x = self.embedding.forward(&ids);
        let pass = Pass::new(train).with_weights_if(want_weights).with_tokens(&ids);
        let (x, weights) = self.stack.forward(&x, &mask, None, pass);
        let pooled = match self.pool {
            Pool::Cls => x.select(1, 0),
            Pool::Mean => {
                let w = real.to_kind(x.kind()).unsqueeze(-1);
                (&x * &w).sum_dim_intlist(1, false, x.kind()) / w.sum_dim_intlist(1, false, x.kind()).clamp_min(1.0)
            }
        };
        (layers::softcap(self.head.forward(&pooled), self.logit_softcap), weights)
    }
}
