//! The attention core: multi-head scaled dot-product attention (UDL §12.2–12.3), the only place in the
//! toolkit where attention is computed. Every model composes `MultiHeadAttention`, and every attention knob
//! lives here: heads and their width, scale, position encodings that act on attention (`relative`), sparse
//! patterns (`pattern`), dropout, biases and the implementation.
//!
//! In UDL's column convention `Sa_h[X] = V_h · Softmax[K_hᵀ Q_h · s]`; here rows are tokens, so
//! `Sa_h = softmax(Q_h K_hᵀ · s + B) V_h` with `s` the scale knob and `B` an additive bias that carries every
//! mask (causal, padding, sparse pattern) and every score-level position scheme (Shaw, T5, ALiBi). RoPE
//! rotates q and k between the projection and the scores, for every implementation alike.
//!
//! Implementations of the same maths:
//! - `Fused`: libtorch's `scaled_dot_product_attention` with the bias as its mask;
//! - `Explicit`: scores, additive bias, softmax, weighted sum — readable, works for every variant, and can hand
//!   back the attention weights for inspection;
//! - `Sparse`: for windowed patterns, the blocked kernel in `pattern.rs`, whose cost grows with N·window.
//!
//! Tests prove they agree, and [`path_counts`] tells which one ran.
use std::cell::Cell;
use tch::nn::{self, Module};
use tch::{Kind, Tensor};

use super::norm::{softcap, NormLayer};
use super::spec::{
    AttentionSpec, Implementation, Norm, OutputGate, Pattern, PositionEncoding, PositionSpec, QkNorm, Scoring, Sink,
};

pub mod pattern;
pub mod relative;

pub use relative::Grid;
use relative::Relative;

thread_local! {
    /// The training step this thread is taking (`None` outside training): a window warm-up reads it.
    static TRAINING_STEP: Cell<Option<i64>> = const { Cell::new(None) };
    /// The window the last attention call with a window schedule used.
    static SCHEDULED_WINDOW: Cell<Option<i64>> = const { Cell::new(None) };
    /// Calls of each implementation on this thread since it started: fused, explicit, sparse. Per thread,
    /// so that what one caller counts is its own calls, whatever else runs beside it (tests in parallel).
    static PATHS: Cell<[usize; 3]> = const { Cell::new([0; 3]) };
    /// While recording (the outlier probe), the largest |logit| of each self-attention call.
    static LOGITS: std::cell::RefCell<Option<Vec<f64>>> = const { std::cell::RefCell::new(None) };
}

/// Starts (`true`) or stops recording, on this thread, the largest attention logit of every self-attention
/// call: max |q·k| · scale over the pairs the mask lets a query see (the dot-product part of the logit,
/// after QK-norm and RoPE, before additive position biases and any soft cap). Wortsman et al. 2023 trace
/// high-rate instability to its growth.
pub fn record_attention_logits(on: bool) {
    LOGITS.with(|l| *l.borrow_mut() = on.then(Vec::new));
}

/// What was recorded since recording started or was last taken: one value per self-attention call.
pub fn take_attention_logits() -> Vec<f64> {
    LOGITS.with(|l| l.borrow_mut().as_mut().map(std::mem::take).unwrap_or_default())
}

/// Records the largest |logit| of per-head q (B, H, N_q, ·) against k (B, H, N_k, ·) when recording.
fn record_logits(q: &Tensor, k: &Tensor, scale: f64, causal: bool) {
    LOGITS.with(|l| {
        let mut recording = l.borrow_mut();
        let Some(values) = recording.as_mut() else { return };
        let logits = (q.to_kind(Kind::Float).matmul(&k.to_kind(Kind::Float).transpose(-2, -1)) * scale).abs();
        let (n_q, n_k) = (logits.size()[2], logits.size()[3]);
        let logits = if causal {
            // Query i (the last n_q of n_k positions) sees keys up to n_k − n_q + i.
            let visible = Tensor::ones([n_q, n_k], (Kind::Bool, logits.device())).tril(n_k - n_q);
            logits.where_self(&visible, &logits.zeros_like())
        } else {
            logits
        };
        values.push(logits.max().double_value(&[]));
    });
}

/// How many attention calls each implementation computed so far on this thread (fused, explicit, sparse):
/// what shows that `transformer.attention.implementation` acts, since all three compute the same numbers.
pub fn path_counts() -> [usize; 3] {
    PATHS.with(Cell::get)
}

/// Tells this thread's attention units which training step runs (`None`: training is over, final windows),
/// and forgets the last scheduled window when a run starts (`Some(first)` after `None`).
pub fn set_training_step(step: Option<i64>) {
    if TRAINING_STEP.with(Cell::get).is_none() {
        SCHEDULED_WINDOW.with(|w| w.set(None));
    }
    TRAINING_STEP.with(|s| s.set(step));
}

/// The window the last call of a unit with a window schedule used on this thread, if any did since the
/// run started: what the training curves record as `train/window`.
pub fn scheduled_window() -> Option<i64> {
    SCHEDULED_WINDOW.with(Cell::get)
}

fn count(path: usize) {
    PATHS.with(|p| {
        let mut counts = p.get();
        counts[path] += 1;
        p.set(counts);
    });
}

/// The optimiser roles of the trainable tensors a unit's path lists, by the end of their var-store path.
/// `train::optim` reads them beside its own lists: what a tensor is for is declared where it is created.
pub struct Roles {
    /// Hidden matrices: Muon's update under `optimizer: muon`, muP's per-layer rate, weight decay.
    pub hidden_matrices: &'static [&'static str],
    /// Other matrices: AdamW at the base rate, weight decay.
    pub other_matrices: &'static [&'static str],
    /// Vectors and scalars: AdamW at the base rate, no weight decay.
    pub vectors: &'static [&'static str],
}

/// The roles of every tensor the attention unit creates (self-attention under `attn`, cross-attention under
/// `cross`): its projections, the output gate's W_g, the additive score vectors and relative position tables,
/// QK-norm's gains and the learned mixing weights of value residuals and value embeddings (biases are every
/// module's vectors, in `train::optim::VECTORS`).
pub const ROLES: Roles = Roles {
    hidden_matrices: &[
        "attn.qkv.weight",
        "attn.out.weight",
        "attn.output_gate.weight",
        "cross.qkv.weight",
        "cross.out.weight",
        "cross.output_gate.weight",
    ],
    other_matrices: &[
        "attn.score_vector",
        "attn.shaw_keys",
        "attn.t5_bias",
        "attn.relative_position_bias_table",
        "cross.score_vector",
    ],
    vectors: &[
        "q_norm.weight",
        "k_norm.weight",
        "value_mix",
        "embedding_mix",
        "diff_lambda",
        "diff_norm.weight",
        "sink",
    ],
};

/// What restricts which keys a query may attend to, besides the layer's own pattern. Every part becomes an
/// additive bias on the scores.
#[derive(Default)]
pub struct Mask<'a> {
    /// Query i may attend to key j only if j <= i (queries and keys index the same sequence).
    pub causal: bool,
    /// (B, N_k) boolean, true where the key is a real token and false where it is padding.
    pub key_padding: Option<&'a Tensor>,
    /// Absolute position of the first key. Relative schemes must give the same scores for any value (tested);
    /// RoPE rotates by absolute angles, so it needs it.
    pub offset: i64,
    /// Any further additive bias on the scores, broadcastable to (B, H, N_q, N_k): a model's own bias
    /// such as Swin's per-window relative position table and its shifted-window mask.
    pub bias: Option<&'a Tensor>,
}

impl Mask<'_> {
    pub fn causal() -> Self {
        Mask { causal: true, key_padding: None, offset: 0, bias: None }
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

/// Multi-head attention: Q/K/V projections to H query heads of `qk_dim` dimensions and `kv_heads` key and
/// value heads of `qk_dim` and `head_dim` dimensions, and an output projection from the H heads' values
/// back to the model width.
#[derive(Debug)]
pub struct MultiHeadAttention {
    /// Q, K and V projections stacked into one (H·qk_dim + H_kv·(qk_dim + head_dim), D) matrix: one matmul
    /// for self-attention; cross-attention applies the Q rows to the queries' sequence and the K/V rows to
    /// the other sequence.
    qkv: nn::Linear,
    out: nn::Linear,
    heads: i64,
    kv_heads: i64,
    qk_dim: i64,
    head_dim: i64,
    /// Rows of the stacked projection for queries, keys and values (`AttentionSpec::projection_widths`).
    widths: [i64; 3],
    /// Bahdanau's w per head (H, qk_dim), when scores are additive.
    additive: Option<Tensor>,
    /// QK-norm's normalisations of each head's queries and of its keys.
    qk_norm: Option<(NormLayer, NormLayer)>,
    scores: ScoreMap,
    implementation: Implementation,
    dropout: f64,
    pattern: Pattern,
    relative: Relative,
    /// Value residual learning's (λ₁, λ₂) of a layer after the first: its values become `λ₁·v + λ₂·v₁`.
    value_mix: Option<Tensor>,
    /// Value embeddings' (μ₁, μ₂) of a layer that reads a table: its values become `μ₁·v + μ₂·e[token]`.
    embedding_mix: Option<Tensor>,
    /// Per-head factors (H) on the heads' outputs before they are mixed: 0 removes a head (head importance
    /// and pruning, Michel et al. 2019). Set between evaluations, never while training.
    head_mask: std::sync::Mutex<Option<Tensor>>,
    /// Gated attention's W_g and b_g (D → H or H·head_dim), when the heads' outputs are gated.
    output_gate: Option<(OutputGate, nn::Linear)>,
    /// Differential attention's λ and per-head norm, when each head computes two maps.
    differential: Option<Differential>,
    /// Attention sinks' logits (H), when every softmax has a sink.
    sink: Option<Tensor>,
}

/// Differential attention (Ye et al. 2024): a head's queries and keys are two halves (sub-heads 2h and
/// 2h + 1 of the split projections) that make two softmax maps over the head's values; the head's output is
/// `RMSNorm((A₁ − λ A₂) V) · (1 − λ_init)`, with λ = exp(λ_q1·λ_k1) − exp(λ_q2·λ_k2) + λ_init learned per layer.
/// Each map goes through the whole of `weigh` (every kernel, mask, bias and the one score path), so it acts
/// on every implementation and on cached decoding alike.
#[derive(Debug)]
struct Differential {
    /// λ_q1, λ_k1, λ_q2, λ_k2 end to end: 4·score_dim values, from N(0, 0.1²) as the paper's code starts
    /// them. One vector (AdamW, no weight decay, as every vector's role).
    lambda: Tensor,
    lambda_init: f64,
    /// The per-head normalisation of the difference (RMSNorm over head_dim, one learned gain shared by the
    /// heads).
    norm: NormLayer,
}

impl Differential {
    fn new(vs: &nn::Path, spec: &AttentionSpec) -> Option<Self> {
        let lambda_init = spec.lambda_init()?;
        let lambda = vs.var("diff_lambda", &[4 * spec.score_dim()], nn::Init::Randn { mean: 0.0, stdev: 0.1 });
        let norm = NormLayer::new(vs / "diff_norm", spec.head_dim, Norm::RmsNorm, 1e-5).expect("a norm");
        Some(Self { lambda, lambda_init, norm })
    }

    /// How many learned values [`Differential::new`] creates.
    fn parameters(spec: &AttentionSpec) -> i64 {
        match spec.differential {
            Some(_) => 4 * spec.score_dim() + NormLayer::parameters(spec.head_dim, Norm::RmsNorm),
            None => 0,
        }
    }

    /// λ as a scalar tensor of `kind`, computed in single precision.
    fn lambda(&self, kind: Kind) -> Tensor {
        let l = self.lambda.to_kind(Kind::Float).view([4, -1]);
        let dot = |a: i64, b: i64| (l.get(a) * l.get(b)).sum(Kind::Float).exp();
        (dot(0, 1) - dot(2, 3) + self.lambda_init).to_kind(kind)
    }

    /// Sub-heads `half` (0 or 1) of per-map tensors (B, 2·H, N, d): (B, H, N, d).
    fn half(t: &Tensor, half: i64) -> Tensor {
        let (b, sub, n, d) = t.size4().unwrap();
        t.view([b, sub / 2, 2, n, d]).select(2, half)
    }

    /// The heads' outputs (B, H, N, head_dim) from the two maps' outputs, and the weights A₁ − λ A₂ when both
    /// maps gave theirs.
    fn combine(&self, first: (Tensor, Option<Tensor>), second: (Tensor, Option<Tensor>)) -> (Tensor, Option<Tensor>) {
        let lambda = self.lambda(first.0.kind());
        let out = self.norm.forward(&(first.0 - &lambda * second.0), false) * (1.0 - self.lambda_init);
        let weights = match (first.1, second.1) {
            (Some(a), Some(b)) => Some(a - &lambda * b),
            _ => None,
        };
        (out, weights)
    }
}

/// What a self-attention unit mixes into its own values, when it was built to: the first layer's values
/// (value residual) and the value embedding of the tokens (value embeddings), (B, N, H_kv·head_dim) each.
#[derive(Clone, Copy, Default)]
pub struct ExtraValues<'a> {
    pub first: Option<&'a Tensor>,
    pub embedding: Option<&'a Tensor>,
}

/// The output of one attention call; `weights` is (B, H, N_q, N_k) when they were asked for.
pub struct Attended {
    pub output: Tensor,
    pub weights: Option<Tensor>,
}

/// The keys and values one attention unit has computed so far in a decoding loop, (B, H_kv, N_seen, ·)
/// each (one per key/value head: multi-query and grouped-query attention keep the cache that much
/// smaller), keys already rotated for RoPE at their absolute positions; empty before the first call.
/// The positions live in buffers with room for more, doubled when full, so that a step writes its own
/// keys and values in place instead of copying every earlier position into a new tensor (a `cat` per
/// step costs O(t) at step t, O(N²) over a sequence; this costs O(N) in all).
#[derive(Debug, Default)]
pub struct KvCache {
    /// Keys and values, (B, H_kv, capacity, ·) each; positions `0..len` are filled.
    buffers: Option<(Tensor, Tensor)>,
    len: i64,
}

impl KvCache {
    /// How many positions it holds.
    pub fn len(&self) -> i64 {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Numbers held (keys and values): what the positions seen so far cost in memory, in elements (the
    /// buffers' spare room, at most as much again, is not counted).
    pub fn elements(&self) -> i64 {
        self.buffers.as_ref().map_or(0, |(k, v)| {
            let per_position = |t: &Tensor| t.numel() as i64 / t.size()[2];
            self.len * (per_position(k) + per_position(v))
        })
    }

    fn keys_values(&self) -> Option<(Tensor, Tensor)> {
        self.buffers.as_ref().map(|(k, v)| (k.narrow(2, 0, self.len), v.narrow(2, 0, self.len)))
    }

    /// Appends the new positions' keys and values and returns all of them (views of the buffers: the
    /// positions they cover are never written again).
    fn append(&mut self, k: Tensor, v: Tensor) -> (Tensor, Tensor) {
        let new = k.size()[2];
        let needed = self.len + new;
        let capacity = self.buffers.as_ref().map_or(0, |(k, _)| k.size()[2]);
        if needed > capacity {
            let room = needed.max(2 * capacity).max(16);
            let empty = |t: &Tensor| {
                let mut size = t.size();
                size[2] = room;
                Tensor::empty(size.as_slice(), (t.kind(), t.device()))
            };
            let (keys, values) = (empty(&k), empty(&v));
            if let Some((old_k, old_v)) = &self.buffers {
                keys.narrow(2, 0, self.len).copy_(&old_k.narrow(2, 0, self.len));
                values.narrow(2, 0, self.len).copy_(&old_v.narrow(2, 0, self.len));
            }
            self.buffers = Some((keys, values));
        }
        let (keys, values) = self.buffers.as_ref().expect("just made room");
        keys.narrow(2, self.len, new).copy_(&k);
        values.narrow(2, self.len, new).copy_(&v);
        self.len = needed;
        self.keys_values().expect("just filled")
    }

    /// Keeps the rows `rows` (an int64 index into the batch, repeats allowed): beam search's reordering.
    pub fn select_rows(&mut self, rows: &Tensor) {
        if let Some((k, v)) = &self.buffers {
            let rows = rows.to_device(k.device());
            self.buffers = Some((k.index_select(0, &rows), v.index_select(0, &rows)));
        }
    }
}

/// What one attention call is: self-attention (position schemes and patterns apply) or across two
/// sequences, in training or evaluation, returning the weights or not.
#[derive(Clone, Copy)]
struct Call<'a> {
    is_self: bool,
    train: bool,
    want_weights: bool,
    /// The unit's query input (B, N_q, D): what a mechanism after attention may read (the output gate).
    input: &'a Tensor,
}

impl<'a> Call<'a> {
    /// A step of a decoding loop on the new tokens `input`: evaluation, no weights.
    fn decoding(is_self: bool, input: &'a Tensor) -> Self {
        Self { is_self, train: false, want_weights: false, input }
    }
}

impl MultiHeadAttention {
    /// Self-attention with the spec's pattern and the relative position scheme of `position`, if any
    /// (absolute encodings are the model's business; `grid` places the tokens of a 2-D scheme).
    /// `out_init_std` lets a model shrink the output projection's initialisation (GPT-2 scales it by depth).
    pub fn new(
        vs: nn::Path,
        d_model: i64,
        spec: &AttentionSpec,
        position: &PositionSpec,
        grid: Option<Grid>,
        out_init_std: f64,
    ) -> Self {
        assert!(spec.heads > 0 && spec.head_dim > 0 && spec.qk_dim > 0, "heads and their widths must be positive");
        assert!(spec.kv_heads > 0 && spec.heads % spec.kv_heads == 0, "key/value heads must divide the heads");
        let lin = |std: f64| nn::LinearConfig {
            ws_init: if std > 0.0 { nn::Init::Randn { mean: 0.0, stdev: std } } else { nn::Init::Const(0.0) },
            bs_init: Some(nn::Init::Const(0.0)),
            bias: spec.bias,
        };
        assert!(spec.qk_dim % spec.maps() == 0, "differential attention splits qk_dim into two halves");
        // Scores, QK-norm, the additive vectors and relative positions act at each map's width.
        let score_dim = spec.score_dim();
        let qk_norm = match spec.qk_norm {
            QkNorm::None => None,
            kind => {
                let norm = if kind == QkNorm::RmsNorm { Norm::RmsNorm } else { Norm::LayerNorm };
                let make = |name: &str| NormLayer::new(&vs / name, score_dim, norm, 1e-5).expect("a norm");
                Some((make("q_norm"), make("k_norm")))
            }
        };
        let additive = (spec.scoring == Scoring::Additive).then(|| {
            let stdev = 1.0 / (score_dim as f64).sqrt();
            vs.var("score_vector", &[spec.heads, score_dim], nn::Init::Randn { mean: 0.0, stdev })
        });
        Self {
            qkv: nn::linear(&vs / "qkv", d_model, spec.projection_widths().iter().sum(), lin(spec.init_std)),
            widths: spec.projection_widths(),
            out: nn::linear(&vs / "out", spec.inner(), d_model, lin(out_init_std)),
            heads: spec.heads,
            kv_heads: spec.kv_heads,
            qk_dim: spec.qk_dim,
            head_dim: spec.head_dim,
            additive,
            qk_norm,
            scores: ScoreMap { scale: spec.scale.factor(score_dim), softcap: spec.softcap },
            implementation: spec.implementation,
            dropout: spec.dropout,
            pattern: spec.pattern.clone(),
            relative: Relative::new(&vs, position, spec.heads, score_dim, grid),
            head_mask: std::sync::Mutex::new(None),
            value_mix: None,
            embedding_mix: None,
            output_gate: spec.output_gate_width().map(|width| {
                let config = nn::LinearConfig { bias: true, ..lin(spec.init_std) };
                (spec.output_gate, nn::linear(&vs / "output_gate", d_model, width, config))
            }),
            differential: Differential::new(&vs, spec),
            sink: (spec.sink == Sink::Learned).then(|| vs.var("sink", &[spec.heads], nn::Init::Const(0.0))),
        }
    }

    /// The score path of this unit's calls (`train`: with attention dropout).
    fn score_path(&self, train: bool) -> ScorePath {
        ScorePath { map: self.scores, dropout: self.dropout, train, sink: None }.with_sink(self.sink.as_ref())
    }

    /// How many learned values [`Self::new`] creates over a `d_model`-wide stream: the stacked Q/K/V and output
    /// projections, QK-norm's gains, the additive score vectors, the output gate and the relative position
    /// scheme's tables. The memory estimate counts with it; `tests/knobs.rs` holds it to the built unit, so a
    /// weight added above and not here fails there.
    pub fn parameters(d_model: i64, spec: &AttentionSpec, position: &PositionSpec, grid: Option<Grid>) -> i64 {
        let bias = i64::from(spec.bias);
        let qkv: i64 = spec.projection_widths().iter().sum();
        let projections = (d_model + bias) * qkv + (spec.inner() + bias) * d_model;
        let score_dim = spec.score_dim();
        let qk_norm = match spec.qk_norm {
            QkNorm::None => 0,
            QkNorm::RmsNorm => 2 * NormLayer::parameters(score_dim, Norm::RmsNorm),
            QkNorm::LayerNorm => 2 * NormLayer::parameters(score_dim, Norm::LayerNorm),
        };
        let additive = if spec.scoring == Scoring::Additive { spec.heads * score_dim } else { 0 };
        let gate = spec.output_gate_width().map_or(0, |w| (d_model + 1) * w);
        let relative = Relative::parameters(position, spec.heads, score_dim, grid);
        let sink = if spec.sink == Sink::Learned { spec.heads } else { 0 };
        projections + qk_norm + additive + gate + relative + Differential::parameters(spec) + sink
    }

    /// [`Self::parameters`] of [`Self::plain`].
    pub fn plain_parameters(d_model: i64, spec: &AttentionSpec) -> i64 {
        Self::parameters(d_model, spec, &PositionSpec::of(PositionEncoding::None), None)
    }

    /// With value residual learning's two scalars (λ₁, λ₂) under `vs`, both starting at ½: this unit's values
    /// are mixed with the first layer's (`self_attend_mixed`).
    pub fn with_value_mix(self, vs: &nn::Path) -> Self {
        Self { value_mix: Some(vs.var("value_mix", &[2], nn::Init::Const(0.5))), ..self }
    }

    /// With value embeddings' two scalars (μ₁, μ₂) under `vs`, both starting at ½: this unit's values are
    /// mixed with the embedding of the tokens it is given (`self_attend_mixed`).
    pub fn with_embedding_mix(self, vs: &nn::Path) -> Self {
        Self { embedding_mix: Some(vs.var("embedding_mix", &[2], nn::Init::Const(0.5))), ..self }
    }

    /// Attention between two sequences (cross-attention), or a plain unit: no positions, dense pattern.
    pub fn plain(vs: nn::Path, d_model: i64, spec: &AttentionSpec, out_init_std: f64) -> Self {
        let spec = AttentionSpec { pattern: Pattern::dense(), ..spec.clone() };
        Self::new(vs, d_model, &spec, &PositionSpec::of(PositionEncoding::None), None, out_init_std)
    }

    /// Multiplies each head's output by `mask` (H: 1 keeps a head, 0 removes it) in every later call;
    /// `None` keeps every head.
    pub fn set_head_mask(&self, mask: Option<Tensor>) {
        if let Some(m) = &mask {
            assert_eq!(m.size(), vec![self.heads], "one factor per head");
        }
        *self.head_mask.lock().unwrap_or_else(|e| e.into_inner()) = mask;
    }

    pub fn heads(&self) -> i64 {
        self.heads
    }

    /// Self-attention: queries, keys and values all come from `x` (B, N, D). `qk_add` (N, D) is added to the
    /// input of the query and key projections only (an absolute encoding that never reaches the values).
    pub fn self_attend(
        &self,
        x: &Tensor,
        mask: &Mask,
        qk_add: Option<&Tensor>,
        train: bool,
        want_weights: bool,
    ) -> Attended {
        self.self_attend_mixed(x, mask, qk_add, ExtraValues::default(), train, want_weights).0
    }

    /// [`self_attend`](Self::self_attend), its values mixed with the `extra` ones this unit was built to mix
    /// (value residual's, value embeddings'); also returns the values it used.
    pub fn self_attend_mixed(
        &self,
        x: &Tensor,
        mask: &Mask,
        qk_add: Option<&Tensor>,
        extra: ExtraValues,
        train: bool,
        want_weights: bool,
    ) -> (Attended, Tensor) {
        let (q, k, v) = self.project_self(x, qk_add);
        let v = self.mix_values(v, extra);
        (self.attend_projected(&q, &k, &v, mask, Call { is_self: true, train, want_weights, input: x }), v)
    }

    /// `λ₁·v + λ₂·v₁` when this unit mixes in the first layer's values and is given them, then `μ₁·v + μ₂·e`
    /// when it mixes in a value embedding and is given one; `v` otherwise.
    fn mix_values(&self, v: Tensor, extra: ExtraValues) -> Tensor {
        let v = match (&self.value_mix, extra.first) {
            (Some(l), Some(first)) => {
                let l = l.to_kind(v.kind());
                v * l.get(0) + first * l.get(1)
            }
            _ => v,
        };
        match (&self.embedding_mix, extra.embedding) {
            (Some(m), Some(e)) => {
                let m = m.to_kind(v.kind());
                v * m.get(0) + e.to_kind(m.kind()) * m.get(1)
            }
            _ => v,
        }
    }

    /// Self-attention of new tokens `x` (B, N_new, D) over themselves and the positions `cache` holds, which
    /// then holds the new ones too: one step of a decoding loop. The new tokens sit at absolute positions
    /// `mask.offset + cache.len()` onwards (RoPE rotates them there; the cached keys were rotated at theirs),
    /// and each new query sees what a query at its position sees in the uncached call over the whole sequence.
    pub fn self_attend_cached(&self, x: &Tensor, mask: &Mask, qk_add: Option<&Tensor>, cache: &mut KvCache) -> Tensor {
        self.self_attend_cached_mixed(x, mask, qk_add, ExtraValues::default(), cache).0
    }

    /// [`self_attend_cached`](Self::self_attend_cached) with the new tokens' values mixed as
    /// [`self_attend_mixed`](Self::self_attend_mixed) mixes them; also returns the new tokens' values.
    pub fn self_attend_cached_mixed(
        &self,
        x: &Tensor,
        mask: &Mask,
        qk_add: Option<&Tensor>,
        extra: ExtraValues,
        cache: &mut KvCache,
    ) -> (Tensor, Tensor) {
        let (q, k, v) = self.project_self(x, qk_add);
        let v = self.mix_values(v, extra);
        let values = v.shallow_clone();
        let start = mask.offset + cache.len();
        let (q, k, v) = self.split_qkv(&q, &k, &v);
        let (q, k) = (self.relative.rotate(&q, start), self.relative.rotate(&k, start));
        let (k, v) = cache.append(k, v);
        (self.attend_heads(&q, &k, &v, mask, Call::decoding(true, x)).output, values)
    }

    /// The queries, keys and values of self-attention, (B, N, ·) each.
    fn project_self(&self, x: &Tensor, qk_add: Option<&Tensor>) -> (Tensor, Tensor, Tensor) {
        let [wq, wk, wv] = self.widths;
        match qk_add {
            None => {
                let parts = self.qkv.forward(x).split_with_sizes([wq, wk, wv], -1);
                (parts[0].shallow_clone(), parts[1].shallow_clone(), parts[2].shallow_clone())
            }
            Some(p) => {
                let qk = self.project(&(x + p), 0, wq + wk).split_with_sizes([wq, wk], -1);
                (qk[0].shallow_clone(), qk[1].shallow_clone(), self.project(x, wq + wk, wv))
            }
        }
    }

    /// The keys and values of `memory`, (B, N_k, ·) each.
    fn project_memory(&self, memory: &Tensor) -> (Tensor, Tensor) {
        let [wq, wk, wv] = self.widths;
        let kv = self.project(memory, wq, wk + wv).split_with_sizes([wk, wv], -1);
        (kv[0].shallow_clone(), kv[1].shallow_clone())
    }

    /// Per-head views: queries (B, H, N, qk_dim), keys (B, H_kv, N, qk_dim), values (B, H_kv, N, head_dim).
    /// With QK-norm, each head's queries and keys normalised over their qk_dim features.
    fn split_qkv(&self, q: &Tensor, k: &Tensor, v: &Tensor) -> (Tensor, Tensor, Tensor) {
        (self.split_queries(q), self.split_keys(k), split_heads(v, self.kv_heads))
    }

    /// The softmax maps per head: two under differential attention.
    fn maps(&self) -> i64 {
        if self.differential.is_some() {
            2
        } else {
            1
        }
    }

    /// Per-head queries (B, H, N, qk_dim), normalised under QK-norm; under differential attention each head's
    /// two halves are sub-heads 2h and 2h + 1, (B, 2·H, N, qk_dim / 2).
    fn split_queries(&self, q: &Tensor) -> Tensor {
        let q = split_heads(q, self.heads * self.maps());
        match &self.qk_norm {
            Some((norm, _)) => norm.forward(&q, false),
            None => q,
        }
    }

    /// Per-head keys (B, H_kv, N, qk_dim), normalised under QK-norm; halves as sub-heads under differential
    /// attention, as [`Self::split_queries`].
    fn split_keys(&self, k: &Tensor) -> Tensor {
        let k = split_heads(k, self.kv_heads * self.maps());
        match &self.qk_norm {
            Some((_, norm)) => norm.forward(&k, false),
            None => k,
        }
    }

    /// `x` through rows `start..start+rows` of the stacked Q/K/V projection.
    fn project(&self, x: &Tensor, start: i64, rows: i64) -> Tensor {
        x.linear(&self.qkv.ws.narrow(0, start, rows), self.qkv.bs.as_ref().map(|b| b.narrow(0, start, rows)))
    }

    /// Cross-attention: queries from `x` (B, N_q, D), keys and values from `memory` (B, N_k, D).
    pub fn cross_attend(&self, x: &Tensor, memory: &Tensor, mask: &Mask, train: bool, want_weights: bool) -> Attended {
        let q = self.project(x, 0, self.widths[0]);
        let (k, v) = self.project_memory(memory);
        self.attend_projected(&q, &k, &v, mask, Call { is_self: false, train, want_weights, input: x })
    }

    /// Cross-attention in a decoding loop: the memory's keys and values are projected on the first call and
    /// kept in `cache` for every later one (the memory does not change while a sequence is decoded).
    pub fn cross_attend_cached(&self, x: &Tensor, memory: &Tensor, mask: &Mask, cache: &mut KvCache) -> Tensor {
        let (k, v) = match cache.keys_values() {
            Some(kv) => kv,
            None => {
                let (k, v) = self.project_memory(memory);
                cache.append(self.split_keys(&k), split_heads(&v, self.kv_heads))
            }
        };
        let q = self.split_queries(&self.project(x, 0, self.widths[0]));
        self.attend_heads(&q, &k, &v, mask, Call::decoding(false, x)).output
    }

    /// Channel attention (DaViT's channel group attention): tokens exchange information through attention
    /// *between channels*. Within each group of C_g = D/H channels the weights are C_g × C_g: softmax over
    /// channels of (k·s)ᵀ v, applied to qᵀ, with s = C_g^-0.5 on k as in timm's `ChannelAttention` (another
    /// port scales by the token count instead; we follow timm). It is `explicit_attention` with the roles
    /// transposed: queries kᵀ, keys vᵀ, values qᵀ. `weights`: (B, H, C_g, C_g).
    pub fn channel_attend(&self, x: &Tensor, train: bool, want_weights: bool) -> Attended {
        assert!(
            self.kv_heads == self.heads
                && self.qk_dim == self.head_dim
                && self.additive.is_none()
                && self.differential.is_none(),
            "channel attention swaps the roles of q, k and v: it needs the plain shape"
        );
        let (b, n, _) = x.size3().unwrap();
        let parts = self.qkv.forward(x).chunk(3, -1);
        let (q, k, v) = self.split_qkv(&parts[0], &parts[1], &parts[2]);
        let t = |x: &Tensor| x.transpose(-2, -1);
        count(1);
        let path = self.score_path(train);
        let (out, weights) = explicit_attention(&t(&k), &t(&v), &t(&q), None, &path);
        // (B, H, C_g, N) -> (B, H, N, C_g): each head's output per token, as every other path gives it.
        let heads_out = t(&out);
        debug_assert_eq!(heads_out.size(), vec![b, self.heads, n, self.head_dim]);
        Attended { output: self.finish(heads_out, x), weights: want_weights.then_some(weights) }
    }

    /// Attention on projected q (B, N_q, D), k and v (B, N_k, D). Position schemes and patterns apply to
    /// self-attention only: across two sequences there is no shared notion of position.
    fn attend_projected(&self, q: &Tensor, k: &Tensor, v: &Tensor, mask: &Mask, call: Call) -> Attended {
        let (n_q, n_k) = (q.size()[1], k.size()[1]);
        let (mut q, mut k, v) = self.split_qkv(q, k, v);
        if call.is_self {
            q = self.relative.rotate(&q, mask.offset + n_k - n_q);
            k = self.relative.rotate(&k, mask.offset);
        }
        self.attend_heads(&q, &k, &v, mask, call)
    }

    /// Attention on per-head q (B, H, N_q, qk_dim), k and v (B, H_kv, N_k, ·), already rotated for RoPE (under
    /// differential attention, q and k as sub-head halves); the queries are the last N_q of the N_k
    /// positions. Returns the output projection of the merged heads.
    fn attend_heads(&self, q: &Tensor, k: &Tensor, v: &Tensor, mask: &Mask, call: Call) -> Attended {
        let (heads_out, weights) = match &self.differential {
            None => self.weigh(q, k, v, mask, call),
            Some(d) => {
                let map =
                    |half: i64| self.weigh(&Differential::half(q, half), &Differential::half(k, half), v, mask, call);
                d.combine(map(0), map(1))
            }
        };
        let output = self.finish(heads_out, call.input);
        Attended { output, weights: if call.want_weights { weights } else { None } }
    }

    /// One softmax map's weighted values (B, H, N_q, head_dim) and, where a path gives them, its weights:
    /// the implementation chosen here (fused, explicit, additive or the sparse kernel), every mask and bias,
    /// and the one score path.
    fn weigh(&self, q: &Tensor, k: &Tensor, v: &Tensor, mask: &Mask, call: Call) -> (Tensor, Option<Tensor>) {
        let Call { is_self, train, want_weights, .. } = call;
        let pattern = self.pattern_now();
        let (b, _, n_q, _) = q.size4().unwrap();
        let n_k = k.size()[2];
        // Each key/value head serves heads / kv_heads consecutive query heads.
        let group = self.heads / self.kv_heads;
        let (k, v) = if group > 1 {
            (k.repeat_interleave_self_int(group, 1, None), v.repeat_interleave_self_int(group, 1, None))
        } else {
            (k.shallow_clone(), v.shallow_clone())
        };
        let (k, v) = (&k, &v);
        if is_self {
            record_logits(q, k, self.scores.scale, mask.causal);
        }
        let path = self.score_path(train);
        // The sparse kernel's blocks take q·kᵀ products: additive scores and a model's own dense bias (Swin's
        // window table) are not blockwise, and weights are asked for as the whole N × N matrix.
        let sparse_kernel = is_self
            && self.implementation == Implementation::Sparse
            && pattern.window.is_some()
            && !want_weights
            && mask.bias.is_none()
            && self.additive.is_none()
            && n_q == n_k;
        let (heads_out, weights) = if sparse_kernel {
            count(2);
            let rules = pattern::ScoreRules {
                causal: mask.causal,
                path,
                relative: &self.relative,
                key_padding: mask.key_padding,
            };
            let out = pattern::sliding_window_attention(q, k, v, &pattern, &rules);
            (out, None)
        } else {
            // What the fused kernel cannot compute takes the explicit route (`ScorePath::fused_cannot`).
            let explicit = want_weights
                || self.implementation == Implementation::Explicit
                || self.additive.is_some()
                || path.fused_cannot().is_some();
            let bias = self.score_bias(q, n_k, mask, is_self, &pattern);
            // A plain causal mask over square scores is the fused kernel's own fast path; a single query at
            // the last position (a decoding step) may see every key, so it needs no mask at all.
            let kernel_causal = !explicit && bias.is_none() && mask.causal && n_q == n_k;
            let bias = if bias.is_none() && mask.causal && !kernel_causal && n_q > 1 {
                mask.additive_bias(n_q, n_k, q.device(), q.kind())
            } else {
                bias
            };
            if let Some(w) = &self.additive {
                count(1);
                let (o, w) = additive_attention(q, k, v, w, bias.as_ref(), &path);
                (o, Some(w))
            } else if explicit {
                count(1);
                let (o, w) = explicit_attention(q, k, v, bias.as_ref(), &path);
                (o, Some(w))
            } else {
                count(0);
                (fused_attention(q, k, v, bias.as_ref(), kernel_causal, &path), None)
            }
        };
        debug_assert_eq!(heads_out.size()[..3], [b, self.heads, n_q]);
        (heads_out, weights)
    }

    /// Every path's last part, in one place: the heads' outputs (B, H, N, head_dim) with any head mask and
    /// output gate applied, concatenated and mixed by the output projection Ω_c (UDL's MhSa). A mechanism
    /// that acts on the heads' outputs, reading the unit's query `input` (B, N, D), goes here.
    fn finish(&self, heads_out: Tensor, input: &Tensor) -> Tensor {
        let (b, h, n, dv) = heads_out.size4().unwrap();
        let heads_out = match self.head_mask.lock().unwrap_or_else(|e| e.into_inner()).as_ref() {
            Some(m) => {
                let m = m.to(heads_out.device()).to_kind(heads_out.kind()).view([1, h, 1, 1]);
                heads_out * m
            }
            None => heads_out,
        };
        let merged = heads_out.transpose(1, 2).contiguous().view([b, n, h * dv]);
        let merged = match &self.output_gate {
            None => merged,
            Some((gate, w)) => {
                let g = w.forward(input).sigmoid(); // (B, N, H) or (B, N, H·dv)
                let g = match gate {
                    OutputGate::Headwise => g.unsqueeze(-1).expand([b, n, h, dv], false).reshape([b, n, h * dv]),
                    _ => g,
                };
                merged * g
            }
        };
        self.out.forward(&merged)
    }

    /// The pattern this call uses: under a window warm-up, the window of the training step in progress.
    fn pattern_now(&self) -> std::borrow::Cow<'_, Pattern> {
        if self.pattern.window_schedule.is_empty() {
            return std::borrow::Cow::Borrowed(&self.pattern);
        }
        let now = self.pattern.at_step(TRAINING_STEP.with(Cell::get));
        SCHEDULED_WINDOW.with(|w| w.set(now.window));
        std::borrow::Cow::Owned(now)
    }

    /// Everything that shapes the scores beyond q·k, as one additive bias: the pattern in force (`pattern_now`)
    /// and causal mask, key
    /// padding, and the relative position bias. `None` when at most a plain causal mask applies (the caller
    /// adds it, or lets the fused kernel apply its own).
    fn score_bias(&self, q: &Tensor, n_k: i64, mask: &Mask, is_self: bool, pattern_now: &Pattern) -> Option<Tensor> {
        let n_q = q.size()[2];
        let device = q.device();
        let pattern_mask = if is_self && !pattern_now.is_dense() {
            pattern::allowed(pattern_now, n_k, mask.causal, device).map(|a| a.narrow(0, n_k - n_q, n_q))
        } else {
            None
        };
        let relative = if is_self && !self.relative.is_none() {
            let i = Tensor::arange_start(n_k - n_q, n_k, (Kind::Int64, device)).view([n_q, 1]);
            let j = Tensor::arange(n_k, (Kind::Int64, device)).view([1, n_k]);
            self.relative
                .score_bias(q, &(i - j), mask.causal, self.scores.scale)
                .or_else(|| self.relative.grid_bias(n_q, n_k))
        } else {
            None
        };
        if pattern_mask.is_none() && relative.is_none() && mask.key_padding.is_none() && mask.bias.is_none() {
            return None;
        }
        // The pattern's mask already includes causality; otherwise take causal + padding from `mask`.
        let mut bias = match &pattern_mask {
            Some(allowed) => {
                let mut b = Tensor::zeros([n_q, n_k], (q.kind(), device))
                    .masked_fill(&allowed.logical_not(), f64::NEG_INFINITY);
                if let Some(pad) = mask.key_padding {
                    // Padding keys are hidden from every query but their own position: under a window a padding
                    // query may have no real key in reach, and a row with no key at all would be NaN (as the
                    // sparse kernel does). Broadcasting grows the bias to (B, 1, N_q, N_k): not in place.
                    let rows = Tensor::arange_start(n_k - n_q, n_k, (Kind::Int64, device));
                    let hidden = pattern::padding_of_rows(&pad.to_kind(Kind::Bool), &rows);
                    b = &b + Tensor::zeros(hidden.size(), (q.kind(), device)).masked_fill(&hidden, f64::NEG_INFINITY);
                }
                b
            }
            None => mask
                .additive_bias(n_q, n_k, device, q.kind())
                .unwrap_or_else(|| Tensor::zeros([1, 1, 1, 1], (q.kind(), device))),
        };
        if let Some(r) = relative {
            bias = &bias + r; // broadcasts to (B, H, N_q, N_k)
        }
        if let Some(extra) = mask.bias {
            bias = &bias + extra;
        }
        Some(bias)
    }
}

/// What the raw scores go through before the bias is added: the scale, then an optional soft cap.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ScoreMap {
    pub scale: f64,
    /// `cap · tanh(s / cap)` after the scale (Gemma 2).
    pub softcap: Option<f64>,
}

impl ScoreMap {
    /// Scaled scores, no cap.
    pub fn scaled(scale: f64) -> Self {
        Self { scale, softcap: None }
    }

    fn apply(self, raw: Tensor) -> Tensor {
        softcap(raw * self.scale, self.softcap)
    }
}

/// The one path from scores to probabilities, and the one description of what the softmax sees. Every
/// implementation takes it: the explicit and additive paths, channel attention, the sparse kernel's blocks,
/// its global keys and rows, the one-query decoding step through [`ScorePath::probabilities`]; both calls of
/// libtorch's fused kernel (dense attention and the sparse kernel's fused blocks) through
/// [`ScorePath::fused`], which builds the kernel's operands (extra keys, mask columns) from the same fields.
/// The stages: the raw scores through the [`ScoreMap`] (scale, soft cap), plus the additive bias (masks,
/// relative positions, a model's own), any sink logit joining the keys, the softmax, then attention dropout
/// on the weights in training. A mechanism on the scores or on the softmax is written here once;
/// [`ScorePath::fused_cannot`] says, in one place, which stages the fused kernel cannot compute, and those
/// calls take the explicit route. Learned tensors ride on the path by value (shallow clones sharing storage
/// and gradient), so the kernels' rules carry no lifetime for them.
#[derive(Debug)]
pub struct ScorePath {
    pub map: ScoreMap,
    /// Attention dropout's rate, applied to the weights when `train`.
    pub dropout: f64,
    pub train: bool,
    /// Attention sinks' logits, one per head (H): an extra key per softmax whose value is zero.
    pub sink: Option<Tensor>,
}

impl Clone for ScorePath {
    fn clone(&self) -> Self {
        Self { sink: self.sink.as_ref().map(Tensor::shallow_clone), ..*self }
    }
}

impl ScorePath {
    /// Evaluation (no dropout) under `map`.
    pub fn eval(map: ScoreMap) -> Self {
        Self { map, dropout: 0.0, train: false, sink: None }
    }

    /// With attention sinks' per-head logits `sink` (H).
    pub fn with_sink(self, sink: Option<&Tensor>) -> Self {
        Self { sink: sink.map(Tensor::shallow_clone), ..self }
    }

    /// The sink's logits shaped for `logits` (heads on axis 1, the key axis last, of length 1) and of its
    /// kind: the extra column that joins the keys.
    fn sink_column(&self, logits_size: &[i64], kind: Kind) -> Option<Tensor> {
        self.sink.as_ref().map(|sink| {
            let heads = sink.size()[0];
            assert_eq!(logits_size[1], heads, "the score path's tensors keep the heads on axis 1");
            let mut shape = vec![1; logits_size.len()];
            shape[1] = heads;
            let mut column = logits_size.to_vec();
            *column.last_mut().unwrap() = 1;
            sink.to_kind(kind).view(shape.as_slice()).expand(column.as_slice(), false)
        })
    }

    /// The logits: the mapped raw scores plus `bias` (broadcast).
    pub fn logits(&self, raw: Tensor, bias: Option<&Tensor>) -> Tensor {
        let mapped = self.map.apply(raw);
        match bias {
            Some(bias) => mapped + bias,
            None => mapped,
        }
    }

    /// The attention weights: the softmax of `logits` over the keys (the last axis), before dropout. With a
    /// sink its logit joins the softmax and its weight is dropped (its value is zero): a row then sums to
    /// less than 1.
    pub fn probabilities(&self, logits: &Tensor) -> Tensor {
        match self.sink_column(&logits.size(), logits.kind()) {
            None => logits.softmax(-1, logits.kind()),
            Some(column) => {
                let n_k = logits.size()[logits.dim() - 1];
                Tensor::cat(&[logits, &column], -1).softmax(-1, logits.kind()).narrow(-1, 0, n_k)
            }
        }
    }

    /// The weights as they multiply the values: after dropout in training.
    pub fn dropped(&self, weights: &Tensor) -> Tensor {
        if self.train && self.dropout > 0.0 {
            weights.dropout(self.dropout, true)
        } else {
            weights.shallow_clone()
        }
    }

    /// The weighted sum of `v` under `logits`: the output and the weights (before dropout).
    pub fn attend(&self, logits: &Tensor, v: &Tensor) -> (Tensor, Tensor) {
        let weights = self.probabilities(logits);
        (self.dropped(&weights).matmul(v), weights)
    }

    /// Why libtorch's `scaled_dot_product_attention` cannot compute this path, or `None` when it can: the
    /// kernel scales q·kᵀ, adds one additive mask (with a gradient, so a learned bias or an extra logit is
    /// expressible), takes the softmax and drops weights out — nothing may stand between the scale and the
    /// bias.
    pub fn fused_cannot(&self) -> Option<&'static str> {
        self.map.softcap.map(|_| "a soft cap stands between the scale and the bias")
    }

    /// Attention dropout's rate in effect (0 outside training): what the fused kernel is given.
    fn dropout_now(&self) -> f64 {
        if self.train {
            self.dropout
        } else {
            0.0
        }
    }

    /// softmax(map(q kᵀ) + mask) v through libtorch's fused kernel, for a path it can express
    /// ([`ScorePath::fused_cannot`]): the one call of the kernel. q: (B', H, N_q, d), k and v: (B', H, N_k, ·),
    /// `mask` additive and broadcastable to (B', H, N_q, N_k); `is_causal` asks for the kernel's own causal
    /// mask (square scores, no `mask`). The operands come from [`Self::fused_operands`].
    pub fn fused(&self, q: &Tensor, k: &Tensor, v: &Tensor, mask: Option<&Tensor>, is_causal: bool) -> Tensor {
        assert!(self.fused_cannot().is_none(), "the fused kernel cannot compute this path: {:?}", self.fused_cannot());
        let operands = self.fused_operands(q, k, v, mask, is_causal);
        let mask = operands.mask.as_ref().or(mask);
        let (k, v) = (operands.k.as_ref().unwrap_or(k), operands.v.as_ref().unwrap_or(v));
        Tensor::scaled_dot_product_attention(
            q,
            k,
            v,
            mask,
            self.dropout_now(),
            operands.is_causal,
            Some(self.map.scale),
            false,
        )
    }

    /// What the fused kernel must be given beyond the caller's q, k, v and mask for this path (`None`: the
    /// caller's own). A sink is a key of zeros (its score q·0 = 0 after any scale) with a zero value, whose
    /// mask column is the sink's logit; the kernel's own causal mask cannot stretch over it, so a causal call
    /// gets the mask written out.
    fn fused_operands(
        &self,
        q: &Tensor,
        k: &Tensor,
        v: &Tensor,
        mask: Option<&Tensor>,
        is_causal: bool,
    ) -> FusedOperands {
        let (n_q, n_k) = (q.size()[2], k.size()[2]);
        let lead = q.size()[..2].to_vec();
        let Some(column) = self.sink_column(&[lead[0], lead[1], n_q, 1], q.kind()) else {
            return FusedOperands { k: None, v: None, mask: None, is_causal };
        };
        let zero_position = |t: &Tensor| {
            let mut size = t.size();
            size[2] = 1;
            Tensor::cat(&[t, &Tensor::zeros(size.as_slice(), (t.kind(), t.device()))], 2)
        };
        let written = match (mask, is_causal) {
            (Some(m), _) => m.to_kind(q.kind()),
            (None, true) => Tensor::zeros([n_q, n_k], (q.kind(), q.device()))
                .masked_fill(&causal_allowed(n_q, n_k, q.device()).logical_not(), f64::NEG_INFINITY),
            (None, false) => Tensor::zeros([1, 1, 1, 1], (q.kind(), q.device())),
        };
        let mask = Tensor::cat(&[&written.expand([lead[0], lead[1], n_q, n_k], false), &column], -1);
        FusedOperands { k: Some(zero_position(k)), v: Some(zero_position(v)), mask: Some(mask), is_causal: false }
    }
}

/// The fused kernel's operands that a [`ScorePath`] replaces: keys and values with extra positions, the
/// additive mask with their columns (`None`: the caller's), and whether the kernel applies its own causal mask.
struct FusedOperands {
    k: Option<Tensor>,
    v: Option<Tensor>,
    mask: Option<Tensor>,
    is_causal: bool,
}

/// softmax(map(q kᵀ) + bias) v, written out along the [`ScorePath`]. q: (B, H, N_q, d), k and v:
/// (B, H, N_k, d). Returns the output (B, H, N_q, d) and the weights (B, H, N_q, N_k) (before dropout).
pub fn explicit_attention(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    bias: Option<&Tensor>,
    path: &ScorePath,
) -> (Tensor, Tensor) {
    path.attend(&path.logits(q.matmul(&k.transpose(-2, -1)), bias), v)
}

/// Bahdanau's additive attention: softmax(wᵀ tanh(q_i + k_j) · scale + bias) v, one learned w (H, d) per head,
/// written out (no kernel computes it). q: (B, H, N_q, d), k: (B, H, N_k, d), v: (B, H, N_k, d_v). Returns the
/// output (B, H, N_q, d_v) and the weights (B, H, N_q, N_k) (before dropout). Its cost is N_q·N_k·d per head
/// in memory as well as time, against the dot product's N_q·N_k.
pub fn additive_attention(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    w: &Tensor,
    bias: Option<&Tensor>,
    path: &ScorePath,
) -> (Tensor, Tensor) {
    let (heads, d) = (w.size()[0], w.size()[1]);
    let hidden = (q.unsqueeze(3) + k.unsqueeze(2)).tanh(); // (B, H, N_q, N_k, d)
    let raw = hidden.matmul(&w.to_kind(q.kind()).view([1, heads, 1, d, 1])).squeeze_dim(-1);
    path.attend(&path.logits(raw, bias), v)
}

/// (B, N, H·d) -> (B, H, N, d).
fn split_heads(t: &Tensor, heads: i64) -> Tensor {
    let (b, n, width) = t.size3().unwrap();
    t.view([b, n, heads, width / heads]).transpose(1, 2)
}

/// The same maths through libtorch's fused kernel ([`ScorePath::fused`]), for a path it can express.
/// `is_causal` asks the kernel for its own causal mask (square scores, no `bias`).
pub fn fused_attention(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    bias: Option<&Tensor>,
    is_causal: bool,
    path: &ScorePath,
) -> Tensor {
    path.fused(q, k, v, bias, is_causal)
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
