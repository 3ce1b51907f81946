//! BERT (UDL §12.6; Devlin et al. 2019): an encoder whose input is the sum of token, segment and position
//! embeddings, normalised, then N post-LN Transformer layers of bidirectional self-attention with padding
//! masks. The layers are the shared `TransformerLayer` on the attention core, built from the run's
//! Transformer settings.
//!
//! `BertSpec::from_hf` reads a Hugging Face `config.json`; `tasks::pretrained` loads such a checkpoint's
//! weights into it (Q, K and V stacked into the core's one projection, every other weight one to one) with
//! its tokenizer. `mean_pool` is mean pooling over the real tokens, as sentence-transformers computes it.
use anyhow::{bail, Context, Result};
use serde::Deserialize;
use std::path::Path;
use tch::nn::{self, Module};
use tch::{Kind, Tensor};

use crate::transformer::attention::Mask;
use crate::transformer::layers::{self, GlobalTokens, LayerInit, Pass, Stack, ValueEmbeddings};
use crate::transformer::positions::AbsolutePositions;
use crate::transformer::spec::{Activation, AttentionSpec, Norm, PositionEncoding, PositionSpec, TransformerSpec};

/// A BERT encoder: the Transformer, its vocabulary, and BERT's conventions.
#[derive(Debug, Clone, PartialEq)]
pub struct BertSpec {
    pub vocab_size: i64,
    /// Segment (token type) vocabulary: 2 for sentence A / sentence B.
    pub type_vocab_size: i64,
    pub norm_eps: f64,
    /// `block_size` is the longest input (the rows of a learned position table).
    pub transformer: TransformerSpec,
}

impl BertSpec {
    /// A BERT over `vocab_size` tokens with the given Transformer.
    pub fn new(transformer: TransformerSpec, vocab_size: i64) -> Self {
        Self { vocab_size, type_vocab_size: 2, norm_eps: 1e-12, transformer }
    }

    /// BERT-base (uncased): the size whose parameter count a test checks (109,482,240 with the pooler).
    pub fn base() -> Self {
        Self::new(Self::hf_transformer(768, 12, 12, 3072, 512, Activation::Gelu, 0.1), 30522)
    }

    /// BERT's Transformer: post-LN, learned absolute positions, dense attention, no final norm.
    fn hf_transformer(
        hidden: i64,
        layers: i64,
        heads: i64,
        intermediate: i64,
        max_positions: i64,
        activation: Activation,
        dropout: f64,
    ) -> TransformerSpec {
        TransformerSpec {
            d_model: hidden,
            layers,
            ffn_hidden: intermediate,
            activation,
            pre_ln: false,
            norm: Norm::LayerNorm,
            residual: true,
            final_norm: false,
            dropout,
            attention: AttentionSpec::standard(hidden, heads),
            position: PositionSpec::of(PositionEncoding::Learned),
            block_size: max_positions,
            tie_embeddings: true,
            ..TransformerSpec::small(hidden, layers, heads, max_positions)
        }
    }

    /// A Hugging Face `config.json` of a BERT model.
    pub fn from_hf(path: &Path) -> Result<Self> {
        #[derive(Deserialize)]
        struct Hf {
            vocab_size: i64,
            hidden_size: i64,
            num_hidden_layers: i64,
            num_attention_heads: i64,
            intermediate_size: i64,
            max_position_embeddings: i64,
            #[serde(default = "two")]
            type_vocab_size: i64,
            #[serde(default = "eps")]
            layer_norm_eps: f64,
            #[serde(default = "gelu")]
            hidden_act: String,
            #[serde(default = "absolute")]
            position_embedding_type: String,
        }
        fn two() -> i64 {
            2
        }
        fn eps() -> f64 {
            1e-12
        }
        fn gelu() -> String {
            "gelu".into()
        }
        fn absolute() -> String {
            "absolute".into()
        }
        let text = std::fs::read_to_string(path).with_context(|| format!("cannot read {}", path.display()))?;
        let hf: Hf =
            serde_json::from_str(&text).with_context(|| format!("{} is not a BERT config.json", path.display()))?;
        let activation = match hf.hidden_act.as_str() {
            "gelu" => Activation::Gelu,
            "relu" => Activation::Relu,
            other => bail!("{}: hidden_act {other:?} is not supported (gelu, relu)", path.display()),
        };
        if hf.position_embedding_type != "absolute" {
            bail!(
                "{}: position_embedding_type {:?} is not supported (absolute)",
                path.display(),
                hf.position_embedding_type
            );
        }
        if hf.num_attention_heads < 1 || hf.hidden_size % hf.num_attention_heads != 0 {
            bail!("{}: {} heads do not divide hidden_size {}", path.display(), hf.num_attention_heads, hf.hidden_size);
        }
        let transformer = Self::hf_transformer(
            hf.hidden_size,
            hf.num_hidden_layers,
            hf.num_attention_heads,
            hf.intermediate_size,
            hf.max_position_embeddings,
            activation,
            0.0,
        );
        Ok(Self {
            vocab_size: hf.vocab_size,
            type_vocab_size: hf.type_vocab_size,
            norm_eps: hf.layer_norm_eps,
            transformer,
        })
    }
}

/// What a BERT forward pass reads besides the token ids (B, N): segment ids (B, N) (all sentence A when
/// `None`) and the padding mask (B, N) true at real tokens (no padding when `None`).
#[derive(Clone, Copy, Default)]
pub struct BertInputs<'a> {
    pub segments: Option<&'a Tensor>,
    pub padding: Option<&'a Tensor>,
}

impl<'a> BertInputs<'a> {
    /// Sentence A only, padded where `padding` is false.
    pub fn padded(padding: &'a Tensor) -> Self {
        Self { padding: Some(padding), ..Self::default() }
    }
}

pub struct Bert {
    word: nn::Embedding,
    segment: nn::Embedding,
    stack: Stack,
    /// BERT's pooler (dense + tanh on the `<cls>` state), the input of its sequence-classification head.
    pooler: nn::Linear,
    pub spec: BertSpec,
    /// Left to right: in every pass each token sees itself and those before it (the next-token objective on
    /// the same encoder, and the fine-tuning after it); false for BERT's bidirectional attention.
    pub causal: bool,
}

impl Bert {
    pub fn new(vs: &nn::Path, spec: &BertSpec) -> Self {
        let t = &spec.transformer;
        let d = t.d_model;
        let emb = nn::EmbeddingConfig { ws_init: nn::Init::Randn { mean: 0.0, stdev: 0.02 }, ..Default::default() };
        let norm = nn::LayerNormConfig { eps: spec.norm_eps, ..Default::default() };
        let init = LayerInit { residual_std: 0.02, norm_eps: spec.norm_eps };
        let word = nn::embedding(vs / "word_embedding", spec.vocab_size, d, emb);
        let segment = nn::embedding(vs / "segment_embedding", spec.type_vocab_size, d, emb);
        let positions = AbsolutePositions::new(vs / "position", t.position.encoding, t.block_size, d);
        let embedding_norm = nn::layer_norm(vs / "embedding_norm", vec![d], norm);
        let layers = layers::layers(&(vs / "layers"), t, t.layers, |_| false, init, None);
        let pooler = nn::linear(vs / "pooler", d, d, Default::default());
        // Summed embeddings: the recipe refuses concatenated positions for this kind.
        let global_tokens = GlobalTokens::new(vs, t.attention.pattern.global_tokens, d);
        let final_norm = layers::final_norm(vs / "final_norm", d, t, spec.norm_eps);
        let value_embeddings = ValueEmbeddings::new(&(vs / "value_embeddings"), t, spec.vocab_size);
        let stack = Stack::new(t, positions, global_tokens, layers, final_norm)
            .with_embedding_norm(embedding_norm)
            .with_value_embeddings(value_embeddings);
        Self { word, segment, stack, pooler, spec: spec.clone(), causal: false }
    }

    /// Final hidden states (B, N, D) of token ids (B, N) with what else the pass reads (`inputs`), in
    /// training or evaluation mode.
    pub fn forward(&self, ids: &Tensor, inputs: BertInputs, train: bool) -> Tensor {
        self.forward_with(ids, inputs, Pass::new(train)).0
    }

    /// [`Bert::forward`] under `pass`: also every layer's attention weights when it asks for them.
    pub fn forward_with(&self, ids: &Tensor, inputs: BertInputs, pass: Pass) -> (Tensor, Vec<Tensor>) {
        let x = self.word.forward(ids);
        let x = match inputs.segments {
            Some(s) => x + self.segment.forward(s),
            None => x + self.segment.ws.get(0),
        };
        let mask = Mask { causal: self.causal, key_padding: inputs.padding, offset: 0, bias: None };
        self.stack.forward(&x, &mask, None, pass.with_tokens(ids))
    }

    /// The pooled `<cls>` representation: tanh(W h_cls + b).
    pub fn pooled(&self, hidden: &Tensor) -> Tensor {
        self.pooler.forward(&hidden.select(1, 0)).tanh()
    }

    /// The pooled state of each row's last real token (`padding` (B, N) true at real tokens): tanh(W h_last + b),
    /// the only state of a causal encoder that has seen the whole row.
    pub fn pooled_last(&self, hidden: &Tensor, padding: &Tensor) -> Tensor {
        let d = hidden.size()[2];
        let last = (padding.to_kind(Kind::Int64).sum_dim_intlist(1, false, Kind::Int64) - 1).clamp_min(0);
        let index = last.view([-1, 1, 1]).expand([-1, 1, d], false);
        self.pooler.forward(&hidden.gather(1, &index, false).squeeze_dim(1)).tanh()
    }

    /// The word embedding matrix (V, D), which a tied MLM head shares.
    pub fn word_embeddings(&self) -> &Tensor {
        &self.word.ws
    }
}

/// Mean of the hidden states (B, N, D) over the real tokens of `padding` (B, N).
pub fn mean_pool(hidden: &Tensor, padding: &Tensor) -> Tensor {
    let mask = padding.to_kind(hidden.kind()).unsqueeze(-1);
    (hidden * &mask).sum_dim_intlist(1, false, hidden.kind())
        / mask.sum_dim_intlist(1, false, hidden.kind()).clamp_min(1e-9)
}
