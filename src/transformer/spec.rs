//! The plain settings the Transformer core is built from. They know nothing of recipes: the recipe layer
//! resolves a run's `transformer:` section into them (kind defaults applied, nothing optional left), and
//! every model file takes them as they are. This module needs no libtorch, so the recipe loader can use the
//! enums without it.
use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Copy, Serialize, Deserialize, schemars::JsonSchema, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum Activation {
    Relu,
    Gelu,
    /// ReLU², max(0, x)² (So et al. 2021, "Primer"; modded-nanogpt's FFN).
    Relu2,
    /// A gated unit W2 (SiLU(W1 x) ⊙ W3 x) (Shazeer 2020; LLaMA's FFN).
    Swiglu,
    /// A gated unit W2 (GELU(W1 x) ⊙ W3 x) (Shazeer 2020).
    Geglu,
}

impl Activation {
    /// Gated units have a third matrix (the gate) beside the two of every FFN.
    pub fn is_gated(self) -> bool {
        matches!(self, Activation::Swiglu | Activation::Geglu)
    }
}

/// A normalisation of each head's queries and keys before their dot product (QK-norm: Dehghani et al.
/// 2023, OLMo 2, Gemma 3), so that the scores' scale cannot grow with the weights.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, schemars::JsonSchema, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum QkNorm {
    None,
    /// RMSNorm over each head's qk_dim features, one learned gain for queries and one for keys.
    RmsNorm,
    /// LayerNorm over each head's qk_dim features, learned gain and bias for queries and for keys.
    LayerNorm,
}

/// A gate on the heads' outputs before they are mixed (gated attention, Qiu et al. 2025): each head's output
/// times σ(X W_g + b_g), X the unit's query input, so a head can switch itself off per token.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, schemars::JsonSchema, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum OutputGate {
    None,
    /// One gate per head and token: W_g is D × H.
    Headwise,
    /// One gate per output feature and token: W_g is D × H·head_dim.
    Elementwise,
}

/// An extra logit in every query's softmax whose value is zero (attention sinks: Xiao et al. 2024's learned
/// sink, gpt-oss's per-head sinks): a head can put weight on "nothing" instead of on a real key.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, schemars::JsonSchema, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum Sink {
    None,
    /// One learned logit per head (starting at 0), joining the softmax of every query of that head.
    Learned,
}

/// How weights scale with the width (Yang et al., Tensor Programs V).
#[derive(Debug, Clone, Copy, Serialize, Deserialize, schemars::JsonSchema, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum Parametrisation {
    /// Every initialisation and learning rate as written, whatever the width.
    Standard,
    /// The maximal-update parametrisation, relative to a base width: hidden matrices start at std ∝
    /// 1/√fan_in and learn at lr × base/width, the readout is multiplied by base/width, attention scores
    /// scale as 1/d_head. At the base width it is the standard model.
    Mup,
}

/// How the projections that write into the residual stream (attention's output projection, the FFN's second
/// layer) start.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, schemars::JsonSchema, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum OutputInit {
    /// Each model's own convention: GPT-2's scaled init in the decoders (lm, image_gpt), N(0, 0.02) elsewhere.
    Model,
    /// N(0, 0.02) everywhere.
    Normal,
    /// GPT-2's N(0, 0.02 / √(2·layers)) everywhere: the residual stream's variance then grows by about 1
    /// over the whole stack instead of by 1 per layer.
    Scaled,
    /// Zeros (modded-nanogpt's): every block starts as the identity, and the residual stream is the
    /// embeddings until training moves them.
    Zero,
}

/// What normalises each residual branch (UDL §12.4 uses LayerNorm; the Annotated Transformer's notes ask
/// why not BatchNorm).
#[derive(Debug, Clone, Copy, Serialize, Deserialize, schemars::JsonSchema, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum Norm {
    /// Each token's D features to mean 0 and variance 1, then a learned gain and bias (Ba et al.).
    LayerNorm,
    /// Each token divided by the root mean square of its features, then a learned gain: no centring, no
    /// bias (Zhang & Sennrich; LLaMA's choice).
    RmsNorm,
    /// Each feature to mean 0 and variance 1 over every token of the batch (the batch's statistics while
    /// training, running averages at evaluation), then a learned gain and bias (Ioffe & Szegedy).
    BatchNorm,
    /// No normalisation at all.
    None,
}

/// Where positions come from (UDL §12.3.1 and the Annotated Transformer's notes).
#[derive(Debug, Clone, Copy, Serialize, Deserialize, schemars::JsonSchema, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum PositionEncoding {
    /// No positions: the model sees a bag of tokens.
    None,
    /// Vaswani et al.'s fixed sinusoids, added to the token embeddings.
    Sinusoidal,
    /// A learned table of position vectors, added to the token embeddings.
    Learned,
    /// Shaw et al.: a learned vector per clipped offset, dotted with the query.
    Shaw,
    /// T5: a learned scalar per head and log-spaced offset bucket, added to the scores.
    T5,
    /// ALiBi: a fixed per-head penalty proportional to the distance.
    Alibi,
    /// RoPE: queries and keys rotated by their position.
    Rope,
    /// A learned scalar per head for each 2-D offset (Δrow, Δcol) between two tokens of an image grid
    /// (Swin's relative position bias; over a ViT's whole patch grid, BEiT's).
    #[serde(rename = "bias_2d")]
    Bias2d,
    /// A depthwise 3×3 convolution of the token grid added before every block (DaViT's and CPVT's
    /// convolutional position encoding).
    Conv,
}

impl PositionEncoding {
    /// Encodings added to the token embeddings (as opposed to acting on attention scores or q/k).
    pub fn is_absolute(self) -> bool {
        matches!(self, PositionEncoding::Sinusoidal | PositionEncoding::Learned)
    }

    /// Encodings that need a 2-D token grid.
    pub fn is_2d(self) -> bool {
        matches!(self, PositionEncoding::Bias2d | PositionEncoding::Conv)
    }
}

/// Where an absolute encoding enters the stack.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, schemars::JsonSchema, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum AbsoluteAt {
    /// Added once to the embeddings.
    Input,
    /// Added to every layer's input.
    EveryLayer,
    /// Added to the inputs of the query and key projections in every layer, never to the values.
    Qk,
}

/// How an absolute encoding joins the token embeddings (UDL §12.3.1 adds Π to X; the Annotated
/// Transformer's notes ask why not concatenate).
#[derive(Debug, Clone, Copy, Serialize, Deserialize, schemars::JsonSchema, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum Combine {
    /// x + Π: positions and tokens share every dimension.
    Add,
    /// [x ; Π]: tokens take D − P dimensions and positions the other P, so neither can disturb the other
    /// at the input (the model width stays D).
    Concat,
}

/// What the raw scores q·k are multiplied by before the softmax.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Scale {
    /// 1/√D_q, UDL §12.3.2.
    SqrtDk,
    /// No scaling.
    None,
    Factor(f64),
}

impl Scale {
    /// The factor the raw scores are multiplied by, for heads of size `head_dim`.
    pub fn factor(self, head_dim: i64) -> f64 {
        match self {
            Scale::SqrtDk => 1.0 / (head_dim as f64).sqrt(),
            Scale::None => 1.0,
            Scale::Factor(f) => f,
        }
    }
}

impl Serialize for Scale {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            Scale::SqrtDk => s.serialize_str("sqrt_dk"),
            Scale::None => s.serialize_str("none"),
            Scale::Factor(f) => s.serialize_f64(*f),
        }
    }
}

// Written by hand like the serde impls above: a name or a positive number.
impl schemars::JsonSchema for Scale {
    fn schema_name() -> std::borrow::Cow<'static, str> {
        "Scale".into()
    }

    fn json_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
        schemars::json_schema!({
            "description": "What the raw scores q·k are multiplied by before the softmax.",
            "anyOf": [
                { "type": "string", "enum": ["sqrt_dk", "none"] },
                { "type": "number", "exclusiveMinimum": 0 }
            ]
        })
    }
}

impl<'de> Deserialize<'de> for Scale {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl serde::de::Visitor<'_> for V {
            type Value = Scale;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("sqrt_dk, none, or a positive number")
            }
            fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<Scale, E> {
                match v {
                    "sqrt_dk" => Ok(Scale::SqrtDk),
                    "none" => Ok(Scale::None),
                    _ => Err(E::custom(format!("unknown scale `{v}`; expected sqrt_dk, none, or a positive number"))),
                }
            }
            fn visit_f64<E: serde::de::Error>(self, v: f64) -> Result<Scale, E> {
                if v > 0.0 && v.is_finite() {
                    Ok(Scale::Factor(v))
                } else {
                    Err(E::custom(format!("scale must be sqrt_dk, none, or a positive number, got {v}")))
                }
            }
            fn visit_i64<E: serde::de::Error>(self, v: i64) -> Result<Scale, E> {
                self.visit_f64(v as f64)
            }
            fn visit_u64<E: serde::de::Error>(self, v: u64) -> Result<Scale, E> {
                self.visit_f64(v as f64)
            }
        }
        d.deserialize_any(V)
    }
}

/// Which computation of the same maths runs.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, schemars::JsonSchema, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum Implementation {
    /// Fused unless attention weights are asked for.
    Auto,
    /// libtorch's fused `scaled_dot_product_attention`, masks as its bias.
    Fused,
    /// Scores, bias, softmax and weighted sum written out.
    Explicit,
    /// The blocked window kernel: cost grows with N·window instead of N².
    Sparse,
}

/// A sparse attention pattern (UDL §12.9): the union of a (dilated) window and global positions.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Pattern {
    /// Each token attends to `window` neighbours on each side (only earlier ones in a causal model).
    pub window: Option<i64>,
    /// Neighbours are `dilation` positions apart (1: contiguous).
    pub dilation: i64,
    /// Every `global_every`-th position after the global tokens attends to all and is attended by all.
    pub global_every: Option<i64>,
    /// Extra learned tokens the model prepends, global likewise.
    pub global_tokens: i64,
    /// Window warm-up: `(until, window)` pairs, increasing in `until`: while training, steps before `until`
    /// use `window`; from the last `until` on (and after training) `window` above.
    pub window_schedule: Vec<(i64, i64)>,
}

impl Pattern {
    pub fn dense() -> Self {
        Self { window: None, dilation: 1, global_every: None, global_tokens: 0, window_schedule: Vec::new() }
    }

    /// The pattern in force at training step `step` (`None`: not training, the final pattern).
    pub fn at_step(&self, step: Option<i64>) -> Pattern {
        let mut p = self.clone();
        if let Some(s) = step {
            if let Some(&(_, w)) = self.window_schedule.iter().find(|&&(until, _)| s < until) {
                p.window = Some(w);
            }
        }
        p
    }

    /// Nothing restricts which keys a query may see (beyond causality).
    pub fn is_dense(&self) -> bool {
        self.window.is_none() && self.global_every.is_none()
    }

    /// Sorted positions (< n) that attend globally.
    pub fn global_positions(&self, n: i64) -> Vec<i64> {
        let g = self.global_tokens.min(n);
        let mut out: Vec<i64> = (0..g).collect();
        if let Some(every) = self.global_every {
            out.extend((g..n).filter(|p| (p - g) % every == 0));
        }
        out
    }
}

/// Position encoding and its parameters.
#[derive(Debug, Clone, PartialEq)]
pub struct PositionSpec {
    pub encoding: PositionEncoding,
    pub at: AbsoluteAt,
    pub combine: Combine,
    /// Width P of the position part when concatenated.
    pub concat_dim: i64,
    pub rope_theta: f64,
    pub rope_fraction: f64,
    pub shaw_max_distance: i64,
    pub t5_buckets: i64,
    pub t5_max_distance: i64,
}

impl PositionSpec {
    /// Every parameter at its usual value.
    pub fn of(encoding: PositionEncoding) -> Self {
        Self {
            encoding,
            at: AbsoluteAt::Input,
            combine: Combine::Add,
            concat_dim: 0,
            rope_theta: 10000.0,
            rope_fraction: 1.0,
            shaw_max_distance: 16,
            t5_buckets: 32,
            t5_max_distance: 128,
        }
    }
}

/// How a query and a key make a score.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, schemars::JsonSchema, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum Scoring {
    /// The dot product q·k (UDL §12.2, Vaswani et al.).
    Dot,
    /// Bahdanau's additive score wᵀ tanh(q + k), with a learned w per head.
    Additive,
}

/// One multi-head attention unit: `heads` query heads; keys and values in `kv_heads` heads, each shared
/// by `heads / kv_heads` query heads (multi-query attention at 1, grouped-query between, ordinary
/// multi-head attention at `heads`); queries and keys `qk_dim` wide, values `head_dim` wide. The values'
/// concatenation need not be the model width: the output projection maps it back.
#[derive(Debug, Clone, PartialEq)]
pub struct AttentionSpec {
    pub heads: i64,
    /// Width of each head's values (and of its output).
    pub head_dim: i64,
    /// Key/value heads; divides `heads`.
    pub kv_heads: i64,
    /// Width of each head's queries and keys (UDL §12.2: it need not equal the values').
    pub qk_dim: i64,
    pub scoring: Scoring,
    pub scale: Scale,
    pub implementation: Implementation,
    pub dropout: f64,
    /// Biases β_q, β_k, β_v and on the output projection.
    pub bias: bool,
    pub pattern: Pattern,
    /// A normalisation of each head's queries and keys (before RoPE rotates them).
    pub qk_norm: QkNorm,
    /// Scores capped smoothly at ±cap, `cap · tanh(s / cap)` (Gemma 2), after the scale and before any bias.
    pub softcap: Option<f64>,
    /// A sigmoid gate on the heads' outputs, computed from the unit's query input.
    pub output_gate: OutputGate,
    /// Differential attention (Ye et al. 2024): each head's queries and keys split into two halves that make
    /// two softmax maps over the same values, `(softmax₁ − λ·softmax₂) V`, λ learned, the difference
    /// RMS-normalised per head and scaled by 1 − λ_init. `None`: off; `Some(depth)`: on, in the layer at
    /// `depth` (0-based, set by [`TransformerSpec::for_layer`]), where λ_init = 0.8 − 0.6·exp(−0.3·depth).
    pub differential: Option<i64>,
    /// Attention sinks: an extra per-head logit in each softmax, with a zero value.
    pub sink: Sink,
    /// The Q/K/V projection's initial std (0.02; smaller under muP at widths above the base).
    pub init_std: f64,
}

impl AttentionSpec {
    /// Dense attention with biases, √d_k scaling and no dropout; heads of `d_model / heads` dimensions.
    pub fn standard(d_model: i64, heads: i64) -> Self {
        Self {
            heads,
            head_dim: d_model / heads,
            kv_heads: heads,
            qk_dim: d_model / heads,
            scoring: Scoring::Dot,
            scale: Scale::SqrtDk,
            implementation: Implementation::Auto,
            dropout: 0.0,
            bias: true,
            pattern: Pattern::dense(),
            qk_norm: QkNorm::None,
            softcap: None,
            output_gate: OutputGate::None,
            differential: None,
            sink: Sink::None,
            init_std: 0.02,
        }
    }

    /// Width of the concatenated heads' values.
    pub fn inner(&self) -> i64 {
        self.heads * self.head_dim
    }

    /// The rows of the stacked Q/K/V projection: queries, keys, values.
    pub fn projection_widths(&self) -> [i64; 3] {
        [self.heads * self.qk_dim, self.kv_heads * self.qk_dim, self.kv_heads * self.head_dim]
    }

    /// Width of the output gate σ(X W_g + b_g): H headwise, H·head_dim elementwise; `None` without a gate.
    pub fn output_gate_width(&self) -> Option<i64> {
        match self.output_gate {
            OutputGate::None => None,
            OutputGate::Headwise => Some(self.heads),
            OutputGate::Elementwise => Some(self.inner()),
        }
    }

    /// Multiply-accumulates per token of the unit's matrices over a `d_model`-wide stream: the Q/K/V and
    /// output projections and the output gate (what grows with the tokens, not with their pairs).
    pub fn matrix_macs(&self, d_model: i64) -> i64 {
        let qkv: i64 = self.projection_widths().iter().sum();
        d_model * qkv + self.inner() * d_model + self.output_gate_width().map_or(0, |w| d_model * w)
    }

    /// Multiply-accumulates per query–key pair: the score (q·k, or the additive score's wᵀ tanh(q + k), over
    /// `qk_dim` per head: two maps of half the width under differential attention) and the pair's share of
    /// the weighted sum of values (once per map).
    pub fn pair_macs(&self) -> i64 {
        self.heads * self.qk_dim + self.maps() * self.inner()
    }

    /// The softmax maps each head computes: two under differential attention, else one.
    pub fn maps(&self) -> i64 {
        if self.differential.is_some() {
            2
        } else {
            1
        }
    }

    /// The width of each dot product (each map's queries and keys): `qk_dim`, split in two halves under
    /// differential attention. The score scale, QK-norm and relative position schemes act at this width.
    pub fn score_dim(&self) -> i64 {
        self.qk_dim / self.maps()
    }

    /// Differential attention's λ_init at this layer's depth (Ye et al. 2024, §2.1); `None` when off.
    pub fn lambda_init(&self) -> Option<f64> {
        self.differential.map(|depth| 0.8 - 0.6 * (-0.3 * depth as f64).exp())
    }

    /// Ordinary multi-head attention: as many key/value heads as query heads, all of one width, dot scores.
    pub fn is_plain_shape(&self) -> bool {
        self.kv_heads == self.heads && self.qk_dim == self.head_dim && self.scoring == Scoring::Dot
    }

    /// This unit with the plain shape (for DaViT's channel attention, whose roles need one width).
    pub fn plain_shape(&self) -> Self {
        Self { kv_heads: self.heads, qk_dim: self.head_dim, scoring: Scoring::Dot, ..self.clone() }
    }
}

/// Everything a stack of Transformer layers is built from (UDL §12.4), shared by every model file.
#[derive(Debug, Clone, PartialEq)]
pub struct TransformerSpec {
    pub d_model: i64,
    pub layers: i64,
    pub ffn_hidden: i64,
    pub activation: Activation,
    /// The FFN's matrices have biases (false: none, as Llama, PaLM, Qwen and Mistral).
    pub ffn_bias: bool,
    /// false: post-LN `norm(x + f(x))` (UDL §12.4, Vaswani et al.); true: pre-LN `x + f(norm(x))`.
    pub pre_ln: bool,
    /// Which normalisation the branches (and the final norm) use.
    pub norm: Norm,
    /// Each branch adds to its input (`x + f(x)`, UDL §12.4's residual connection); false: `f(x)` alone.
    pub residual: bool,
    /// A LayerNorm after the last layer.
    pub final_norm: bool,
    /// Dropout on the embeddings and on every residual branch.
    pub dropout: f64,
    pub attention: AttentionSpec,
    pub position: PositionSpec,
    /// The longest sequence (and the rows of a learned position table).
    pub block_size: i64,
    /// The output layer shares the token embedding matrix.
    pub tie_embeddings: bool,
    /// The embedded tokens are multiplied by √d_model before positions are added (the Annotated
    /// Transformer's `Embeddings.forward`).
    pub scale_embeddings: bool,
    /// A self-attention pattern per layer (layer i takes entry i mod the length); empty: every layer takes
    /// `attention.pattern`.
    pub layer_patterns: Vec<Pattern>,
    /// The output logits capped smoothly at ±cap, `cap · tanh(z / cap)` (Gemma 2).
    pub logit_softcap: Option<f64>,
    /// How the residual-writing projections start.
    pub output_init: OutputInit,
    /// Parallel blocks: `x + attn(norm x) + ffn(norm x)` with one norm (GPT-J, PaLM); needs pre-LN.
    pub parallel: bool,
    /// Value residual learning (Zhou et al. 2024): every layer after the first mixes its values with the first
    /// layer's, `λ₁·v + λ₂·v₁`, two learned scalars per layer starting at ½ each.
    pub value_residual: bool,
    /// Value embeddings (modded-nanogpt): this many token-indexed tables, table j mixed into the values of
    /// layer j and of layer L−N+j as `μ₁·v + μ₂·e_j[token]`, (μ₁, μ₂) learned per layer from (½, ½).
    pub value_embeddings: i64,
    /// U-net skips (modded-nanogpt): the output of layer i of the first half is added, times a learned scalar
    /// starting at 1, to the input of its mirror L−1−i in the second half.
    pub unet_skips: bool,
    /// muP's width multiplier width / base width (`None`: the standard parametrisation).
    pub mup_width_mult: Option<f64>,
}

impl TransformerSpec {
    /// Multiply-accumulates per token of the FFN's matrices: W1 (and a gated unit's W3), W2.
    pub fn ffn_macs(&self) -> i64 {
        self.d_model * self.ffn_hidden * (2 + i64::from(self.activation.is_gated()))
    }

    /// Multiply-accumulates per token of a layer's matrices (attention's and the FFN's): also the number of
    /// weights in those matrices, which `tests/knobs.rs` checks against the built layer.
    pub fn layer_matrix_macs(&self) -> i64 {
        self.attention.matrix_macs(self.d_model) + self.ffn_macs()
    }

    /// Whether the absolute positions are concatenated to the token embeddings (not added).
    pub fn concatenates_positions(&self) -> bool {
        self.position.combine == Combine::Concat && self.position.encoding.is_absolute()
    }

    /// Width of the token embeddings: D, or D − P when positions are concatenated.
    pub fn token_width(&self) -> i64 {
        self.d_model - self.position_width() * i64::from(self.concatenates_positions())
    }

    /// Width of the absolute position table: D when added, P when concatenated.
    pub fn position_width(&self) -> i64 {
        if self.concatenates_positions() {
            self.position.concat_dim
        } else {
            self.d_model
        }
    }

    /// Layer i's settings: its own pattern where `layer_patterns` gives one, its depth under differential attention.
    pub fn for_layer(&self, i: i64) -> TransformerSpec {
        let mut s = self.clone();
        if !self.layer_patterns.is_empty() {
            s.attention.pattern = self.layer_patterns[(i as usize) % self.layer_patterns.len()].clone();
        }
        if s.attention.differential.is_some() {
            s.attention.differential = Some(i);
        }
        s
    }

    /// The standard deviation the residual-writing projections start with, given the model's own
    /// convention `model_std`.
    pub fn output_std(&self, model_std: f64) -> f64 {
        self.mup_init_factor()
            * match self.output_init {
                OutputInit::Model => model_std,
                OutputInit::Normal => 0.02,
                OutputInit::Scaled => 0.02 / ((2 * self.layers.max(1)) as f64).sqrt(),
                OutputInit::Zero => 0.0,
            }
    }

    /// The std the hidden matrices that read the residual stream start with (Q/K/V, the FFN's first layer):
    /// 0.02, times 1/√(width multiplier) under muP (variance 1/fan_in relative to the base width).
    pub fn hidden_std(&self) -> f64 {
        0.02 * self.mup_init_factor()
    }

    fn mup_init_factor(&self) -> f64 {
        self.mup_width_mult.map_or(1.0, |m| 1.0 / m.sqrt())
    }

    /// What the output logits are multiplied by: muP's readout multiplier base/width, else 1.
    pub fn readout_factor(&self) -> f64 {
        self.mup_width_mult.map_or(1.0, |m| 1.0 / m)
    }

    /// What the embedded tokens are multiplied by.
    pub fn embedding_factor(&self) -> f64 {
        if self.scale_embeddings {
            (self.d_model as f64).sqrt()
        } else {
            1.0
        }
    }

    /// A small standard stack: GELU, post-LN, learned positions, dense attention (tests, examples).
    pub fn small(d_model: i64, layers: i64, heads: i64, block_size: i64) -> Self {
        Self {
            d_model,
            layers,
            ffn_hidden: 4 * d_model,
            activation: Activation::Gelu,
            ffn_bias: true,
            pre_ln: false,
            norm: Norm::LayerNorm,
            residual: true,
            final_norm: true,
            dropout: 0.0,
            attention: AttentionSpec::standard(d_model, heads),
            position: PositionSpec::of(PositionEncoding::Learned),
            block_size,
            tie_embeddings: false,
            scale_embeddings: false,
            layer_patterns: Vec::new(),
            logit_softcap: None,
            output_init: OutputInit::Model,
            parallel: false,
            value_residual: false,
            value_embeddings: 0,
            unet_skips: false,
            mup_width_mult: None,
        }
    }

    /// The same settings with the width (and with it the FFN and every head count) scaled by `factor`, heads
    /// keeping their size: a later stage of a hierarchical model (Swin, DaViT).
    pub fn widened(&self, factor: i64) -> Self {
        let mut s = self.clone();
        s.d_model *= factor;
        s.ffn_hidden *= factor;
        s.attention.heads *= factor;
        s.attention.kv_heads *= factor;
        s
    }
}
