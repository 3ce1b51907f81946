//! The Transformer layer (UDL §12.4): a multi-head attention unit and a per-token FFN, each a residual
//! branch, with a normalisation (LayerNorm by default; RMSNorm, BatchNorm or none) after each addition
//! (post-LN, as in UDL and Vaswani et al.) or inside each branch (pre-LN, as in GPT-2). An optional cross-attention unit sits between them for decoders that read an
//! encoder's output (UDL §12.8). [`Stack`] runs a whole stack the way every sequence model does: absolute
//! positions where `position.at` says, global tokens, dropout, the layers, a final norm.
use tch::nn::{self, Module};
use tch::Tensor;

use super::attention::{ExtraValues, Grid, KvCache, Mask, MultiHeadAttention};
pub use super::norm::{softcap, NormLayer};
use super::positions::{AbsolutePositions, ConvPosEnc};
use super::spec::{AbsoluteAt, Activation, TransformerSpec};

/// A per-thread recording: `None` while off, else what was recorded since it started or was last taken.
type Recording<T> = std::cell::RefCell<Option<Vec<T>>>;
type RecordingKey<T> = std::thread::LocalKey<Recording<T>>;

/// Starts (`true`, empty) or stops a recording.
fn set_recording<T>(key: &'static RecordingKey<T>, on: bool) {
    key.with(|r| *r.borrow_mut() = on.then(Vec::new));
}

/// What a recording holds, emptied (nothing while it is off).
fn take_recorded<T>(key: &'static RecordingKey<T>) -> Vec<T> {
    key.with(|r| r.borrow_mut().as_mut().map(std::mem::take).unwrap_or_default())
}

/// Appends `value()` to a recording that is on; computes nothing while it is off.
fn push_recorded<T>(key: &'static RecordingKey<T>, value: impl FnOnce() -> T) {
    key.with(|r| {
        if let Some(values) = r.borrow_mut().as_mut() {
            values.push(value());
        }
    });
}

thread_local! {
    /// While recording (a coordinate check), the mean |x| of the stack's input and of each layer's output.
    static ACTIVATIONS: Recording<f64> = const { std::cell::RefCell::new(None) };
    /// While recording (`train.probe_outliers`), the peak ratio and the kurtosis of each self-attention
    /// unit's output, one pair per unit and forward pass.
    static ATTENTION_OUTPUTS: Recording<(f64, f64)> = const { std::cell::RefCell::new(None) };
    /// While recording (`train.probe_residual`), [`outlier_statistics`] of the residual stream after each
    /// layer, one pair per layer and forward pass.
    static RESIDUAL_STREAM: Recording<(f64, f64)> = const { std::cell::RefCell::new(None) };
}

/// Starts (`true`) or stops recording, on this thread, the mean absolute value of every stack's input and of
/// each of its layers' outputs (muP's coordinate check reads them).
pub fn record_activations(on: bool) {
    set_recording(&ACTIVATIONS, on);
}

/// What was recorded since recording started or was last taken: input, then layer 0, 1, …
pub fn take_activations() -> Vec<f64> {
    take_recorded(&ACTIVATIONS)
}

/// Starts (`true`) or stops recording, on this thread, [`outlier_statistics`] of every self-attention unit's
/// output (after its output projection and gate, before the residual sum).
pub fn record_attention_outputs(on: bool) {
    set_recording(&ATTENTION_OUTPUTS, on);
}

/// What was recorded since recording started or was last taken: one (peak ratio, kurtosis) per unit and pass.
pub fn take_attention_outputs() -> Vec<(f64, f64)> {
    take_recorded(&ATTENTION_OUTPUTS)
}

/// Starts (`true`) or stops recording, on this thread, [`outlier_statistics`] of the residual stream after
/// every layer of a stack.
pub fn record_residual_stream(on: bool) {
    set_recording(&RESIDUAL_STREAM, on);
}

/// What was recorded since recording started or was last taken: one (peak ratio, kurtosis) per layer and pass.
pub fn take_residual_stream() -> Vec<(f64, f64)> {
    take_recorded(&RESIDUAL_STREAM)
}

/// The outlier statistics of a tensor's values (after Bondarenko et al. 2023), both free of the tensor's
/// scale, so that a gate which merely shrinks every output changes neither: the peak ratio, the largest |x|
/// over the root mean square of x, and the kurtosis E[(x − μ)⁴] / σ⁴ over all its values (3 for a Gaussian;
/// large when a few values dwarf the rest), computed in float64.
pub fn outlier_statistics(x: &Tensor) -> (f64, f64) {
    let x = x.to_kind(tch::Kind::Double);
    let rms = x.square().mean(tch::Kind::Double).double_value(&[]).sqrt();
    let centred = &x - x.mean(tch::Kind::Double);
    let variance = centred.square().mean(tch::Kind::Double).double_value(&[]);
    let fourth = centred.square().square().mean(tch::Kind::Double).double_value(&[]);
    (x.abs().max().double_value(&[]) / rms, fourth / (variance * variance))
}

fn record_layer_output(x: &Tensor) {
    push_recorded(&RESIDUAL_STREAM, || outlier_statistics(x));
}

fn record_attention_output(x: &Tensor) {
    push_recorded(&ATTENTION_OUTPUTS, || outlier_statistics(x));
}

fn record(x: &Tensor) {
    push_recorded(&ACTIVATIONS, || x.abs().mean(tch::Kind::Float).double_value(&[]));
}

/// How a model initialises and normalises its layers (a model's convention, not an ablation knob).
#[derive(Debug, Clone, Copy)]
pub struct LayerInit {
    /// Initial standard deviation of the projections that write into the residual stream.
    pub residual_std: f64,
    /// LayerNorm's ε (PyTorch's default 1e-5; BERT checkpoints use 1e-12).
    pub norm_eps: f64,
}

impl Default for LayerInit {
    fn default() -> Self {
        Self { residual_std: 0.02, norm_eps: 1e-5 }
    }
}

/// One residual branch with its normalisation: post-LN `norm(x + f(x))` or pre-LN `x + f(norm(x))`, dropout
/// on the branch's output; without the residual connection `norm(f(x))` or `f(norm(x))`.
#[derive(Debug)]
pub struct Residual {
    norm: Option<NormLayer>,
    pre_ln: bool,
    residual: bool,
    dropout: f64,
}

impl Residual {
    pub fn new(vs: nn::Path, d_model: i64, spec: &TransformerSpec, norm_eps: f64) -> Self {
        Self {
            norm: NormLayer::new(vs, d_model, spec.norm, norm_eps),
            pre_ln: spec.pre_ln,
            residual: spec.residual,
            dropout: spec.dropout,
        }
    }

    /// A parallel block's one branch: `x + f(norm x)`, `f` the sum of attention and FFN on the same normalised
    /// input (pre-LN only, which the recipe layer checks), dropout on the sum.
    pub fn forward_parallel(&self, x: &Tensor, train: bool, f: impl FnOnce(&Tensor) -> Tensor) -> Tensor {
        debug_assert!(self.pre_ln || self.norm.is_none(), "parallel blocks normalise before the branches");
        self.forward(x, train, f)
    }

    pub fn forward(&self, x: &Tensor, train: bool, f: impl FnOnce(&Tensor) -> Tensor) -> Tensor {
        let drop = |y: Tensor| if self.dropout > 0.0 { y.dropout(self.dropout, train) } else { y };
        let norm = |y: Tensor| match &self.norm {
            Some(n) => n.forward(&y, train),
            None => y,
        };
        let add = |y: Tensor| if self.residual { x + y } else { y };
        if self.pre_ln {
            add(drop(f(&norm(x.shallow_clone()))))
        } else {
            norm(add(drop(f(x))))
        }
    }
}

/// The per-token FFN: `down(act(up x))`, or for a gated unit `down(act(up x) ⊙ gate x)`.
#[derive(Debug)]
pub struct FeedForward {
    up: nn::Linear,
    /// The gated units' third matrix (W3 in `W2 (act(W1 x) ⊙ W3 x)`).
    gate: Option<nn::Linear>,
    down: nn::Linear,
    activation: Activation,
}

impl FeedForward {
    /// A two-matrix or gated FFN with biases, its second layer starting at std `down_init_std`.
    pub fn new(vs: nn::Path, d_model: i64, hidden: i64, activation: Activation, down_init_std: f64) -> Self {
        Self::build(vs, [d_model, hidden], activation, true, [0.02, down_init_std])
    }

    /// `spec`'s FFN (its width, nonlinearity and biases), the first layer's (and gate's) initial std
    /// `up_init_std` (muP scales it with the width), the second's `down_init_std`.
    pub fn of(vs: nn::Path, spec: &TransformerSpec, up_init_std: f64, down_init_std: f64) -> Self {
        let widths = [spec.d_model, spec.ffn_hidden];
        Self::build(vs, widths, spec.activation, spec.ffn_bias, [up_init_std, down_init_std])
    }

    fn build(
        vs: nn::Path,
        [d_model, hidden]: [i64; 2],
        activation: Activation,
        bias: bool,
        [up, down]: [f64; 2],
    ) -> Self {
        let lin = |std: f64| nn::LinearConfig {
            ws_init: if std > 0.0 { nn::Init::Randn { mean: 0.0, stdev: std } } else { nn::Init::Const(0.0) },
            bs_init: Some(nn::Init::Const(0.0)),
            bias,
        };
        Self {
            up: nn::linear(&vs / "up", d_model, hidden, lin(up)),
            gate: activation.is_gated().then(|| nn::linear(&vs / "gate", d_model, hidden, lin(up))),
            down: nn::linear(&vs / "down", hidden, d_model, lin(down)),
            activation,
        }
    }

    /// How many learned values [`Self::of`] creates for `spec`: W1 (and a gated unit's W3), W2, their biases.
    pub fn parameters(spec: &TransformerSpec) -> i64 {
        let (d_model, hidden, bias) = (spec.d_model, spec.ffn_hidden, i64::from(spec.ffn_bias));
        let up = (d_model + bias) * hidden;
        up * (1 + i64::from(spec.activation.is_gated())) + (hidden + bias) * d_model
    }
}

impl Module for FeedForward {
    fn forward(&self, x: &Tensor) -> Tensor {
        let h = self.up.forward(x);
        let h = match self.activation {
            Activation::Relu => h.relu(),
            Activation::Gelu | Activation::Geglu => h.gelu("none"),
            Activation::Relu2 => h.relu().square(),
            Activation::Swiglu => h.silu(),
        };
        let h = match &self.gate {
            Some(gate) => h * gate.forward(x),
            None => h,
        };
        self.down.forward(&h)
    }
}

/// The block of a windowed vision model (Swin, DaViT): an attention branch whose token mixing the model
/// supplies (attention inside windows, over channels), then an FFN branch, each a [`Residual`]. The two are
/// separate calls so a model can act between them (DaViT's second convolutional position encoding).
pub struct AttentionBlock {
    attention_branch: Residual,
    pub attn: MultiHeadAttention,
    ffn_branch: Residual,
    mlp: FeedForward,
}

impl AttentionBlock {
    /// timm's names: `norm1`, `attn`, `norm2`, `mlp`; `grid` places the tokens of a 2-D position scheme.
    pub fn new(vs: &nn::Path, spec: &TransformerSpec, grid: Option<Grid>) -> Self {
        let (d, init) = (spec.d_model, LayerInit::default());
        let out_std = spec.output_std(init.residual_std);
        let attention_branch = Residual::new(vs / "norm1", d, spec, init.norm_eps);
        Self {
            attention_branch,
            attn: MultiHeadAttention::new(vs / "attn", d, &spec.attention, &spec.position, grid, out_std),
            ffn_branch: Residual::new(vs / "norm2", d, spec, init.norm_eps),
            mlp: FeedForward::of(vs / "mlp", spec, 0.02, out_std),
        }
    }

    /// How many learned values [`Self::new`] creates (the attention unit's position tables on `grid` included).
    pub fn parameters(spec: &TransformerSpec, grid: Option<Grid>) -> i64 {
        let d = spec.d_model;
        2 * NormLayer::parameters(d, spec.norm)
            + MultiHeadAttention::parameters(d, &spec.attention, &spec.position, grid)
            + FeedForward::parameters(spec)
    }

    /// The attention branch, `mix` mapping the (normalised) tokens through `self.attn`.
    pub fn attend(&self, x: &Tensor, train: bool, mix: impl FnOnce(&MultiHeadAttention, &Tensor) -> Tensor) -> Tensor {
        self.attention_branch.forward(x, train, |h| mix(&self.attn, h))
    }

    /// The FFN branch.
    pub fn feed_forward(&self, x: &Tensor, train: bool) -> Tensor {
        self.ffn_branch.forward(x, train, |h| self.mlp.forward(h))
    }
}

pub struct TransformerLayer {
    self_attention: MultiHeadAttention,
    norm_attention: Residual,
    cross: Option<(MultiHeadAttention, Residual)>,
    ffn: FeedForward,
    /// The FFN's own branch; `None` in a parallel block, whose FFN shares the attention branch.
    norm_ffn: Option<Residual>,
    /// U-net skips: the learned weight of the skip this layer of the second half receives from its mirror.
    skip_weight: Option<Tensor>,
}

/// Where a layer sits in its stack (value residual and U-net skips depend on it).
#[derive(Debug, Clone, Copy)]
pub struct Placement {
    pub index: i64,
    pub count: i64,
}

impl Placement {
    /// For U-net skips: the first-half layer whose output this layer of the second half receives.
    pub fn mirror(self) -> Option<i64> {
        (self.index >= self.count - self.count / 2).then(|| self.count - 1 - self.index).filter(|&m| m < self.count / 2)
    }

    /// For value embeddings with `tables` tables: the table this layer reads. Layer j and layer L−N+j read
    /// table j (the first and the last N layers); the layers between read none.
    pub fn value_table(self, tables: i64) -> Option<i64> {
        if self.index < tables {
            Some(self.index)
        } else if self.index >= self.count - tables {
            Some(self.index - (self.count - tables))
        } else {
            None
        }
    }
}

/// What a layer hands back besides its output: the self-attention weights (B, H, N, N) when asked, and the
/// values its self-attention used (value residual reads the first layer's).
pub struct LayerOutput {
    pub output: Tensor,
    pub self_weights: Option<Tensor>,
    pub values: Tensor,
}

impl TransformerLayer {
    /// A layer of `spec` (its relative position scheme in the self-attention unit, placed on `grid` for a
    /// 2-D scheme), with a cross-attention unit when `cross_attention`.
    pub fn new(
        vs: nn::Path,
        spec: &TransformerSpec,
        cross_attention: bool,
        init: LayerInit,
        grid: Option<Grid>,
        at: Placement,
    ) -> Self {
        let d = spec.d_model;
        let out_std = spec.output_std(init.residual_std);
        let mut self_attention =
            MultiHeadAttention::new(&vs / "attn", d, &spec.attention, &spec.position, grid, out_std);
        if spec.value_residual && at.index > 0 {
            self_attention = self_attention.with_value_mix(&(&vs / "attn"));
        }
        if at.value_table(spec.value_embeddings).is_some() {
            self_attention = self_attention.with_embedding_mix(&(&vs / "attn"));
        }
        let norm_attention = Residual::new(&vs / "norm_attn", d, spec, init.norm_eps);
        let cross = cross_attention.then(|| {
            let mha = MultiHeadAttention::plain(&vs / "cross", d, &spec.attention, out_std);
            (mha, Residual::new(&vs / "norm_cross", d, spec, init.norm_eps))
        });
        let skip_weight =
            (spec.unet_skips && at.mirror().is_some()).then(|| vs.var("skip_weight", &[1], nn::Init::Const(1.0)));
        Self {
            self_attention,
            norm_attention,
            cross,
            ffn: FeedForward::of(&vs / "ffn", spec, spec.hidden_std(), out_std),
            norm_ffn: (!spec.parallel).then(|| Residual::new(&vs / "norm_ffn", d, spec, init.norm_eps)),
            skip_weight,
        }
    }

    /// How many learned values [`Self::new`] creates with the same arguments: the units, their norms, the
    /// value-residual and value-embedding mixes and the U-net skip weight this placement takes. The memory
    /// estimate counts with it; `tests/knobs.rs` holds it to the built layer for every knob, so a weight added
    /// in `new` and not here fails there.
    pub fn parameters(spec: &TransformerSpec, cross_attention: bool, grid: Option<Grid>, at: Placement) -> i64 {
        let d = spec.d_model;
        let norm = NormLayer::parameters(d, spec.norm);
        let attention = MultiHeadAttention::parameters(d, &spec.attention, &spec.position, grid)
            + 2 * i64::from(spec.value_residual && at.index > 0)
            + 2 * i64::from(at.value_table(spec.value_embeddings).is_some());
        let cross = if cross_attention { MultiHeadAttention::plain_parameters(d, &spec.attention) + norm } else { 0 };
        let ffn = FeedForward::parameters(spec) + norm * i64::from(!spec.parallel);
        attention + norm + cross + ffn + i64::from(spec.unet_skips && at.mirror().is_some())
    }

    /// The learned weight of the U-net skip this layer receives, if it receives one.
    pub fn skip_weight(&self) -> Option<&Tensor> {
        self.skip_weight.as_ref()
    }

    /// Its self-attention unit (to inspect it, or to mask its heads).
    pub fn self_attention(&self) -> &MultiHeadAttention {
        &self.self_attention
    }

    /// Whether this layer cross-attends to an encoder's output.
    pub fn has_cross_attention(&self) -> bool {
        self.cross.is_some()
    }

    /// `qk_add` (N, D) is an absolute position encoding for the query/key inputs only. `memory` and its mask
    /// are the encoder output and its padding, for layers built with cross-attention (others ignore it).
    /// `extra` are the values its self-attention mixes into its own: the first layer's (value residual; none
    /// in the first layer) and its value embedding of the tokens.
    #[allow(clippy::too_many_arguments)]
    pub fn forward(
        &self,
        x: &Tensor,
        mask: &Mask,
        qk_add: Option<&Tensor>,
        memory: Option<(&Tensor, &Mask)>,
        extra: ExtraValues,
        train: bool,
        want_weights: bool,
    ) -> LayerOutput {
        let mut self_weights = None;
        let mut values = None;
        let mut attend = |h: &Tensor| {
            let (a, v) = self.self_attention.self_attend_mixed(h, mask, qk_add, extra, train, want_weights);
            (self_weights, values) = (a.weights, Some(v));
            record_attention_output(&a.output);
            a.output
        };
        let Some(norm_ffn) = &self.norm_ffn else {
            // A parallel block: attention and FFN read the same normalised input (no cross-attention here).
            let output = self.norm_attention.forward_parallel(x, train, |h| attend(h) + self.ffn.forward(h));
            return LayerOutput { output, self_weights, values: values.expect("attention ran") };
        };
        let x = self.norm_attention.forward(x, train, attend);
        let x = match (&self.cross, memory) {
            (Some((cross, residual)), Some((mem, mem_mask))) => {
                residual.forward(&x, train, |h| cross.cross_attend(h, mem, mem_mask, train, false).output)
            }
            _ => x,
        };
        let output = norm_ffn.forward(&x, train, |h| self.ffn.forward(h));
        LayerOutput { output, self_weights, values: values.expect("attention ran") }
    }
}

/// What one layer keeps between the steps of a decoding loop: its self-attention's keys and values, and
/// its cross-attention's projection of the encoder's output.
#[derive(Debug, Default)]
pub struct LayerCache {
    pub self_attention: KvCache,
    pub cross_attention: KvCache,
}

impl TransformerLayer {
    /// [`TransformerLayer::forward`] for new tokens `x` (B, N_new, D) after the positions `cache` holds, in
    /// evaluation mode (no dropout, no weights).
    /// Returns the output and the new tokens' self-attention values (as [`TransformerLayer::forward`]).
    pub fn forward_cached(
        &self,
        x: &Tensor,
        mask: &Mask,
        qk_add: Option<&Tensor>,
        memory: Option<(&Tensor, &Mask)>,
        extra: ExtraValues,
        cache: &mut LayerCache,
    ) -> (Tensor, Tensor) {
        let mut values = None;
        let self_cache = &mut cache.self_attention;
        let mut attend = |h: &Tensor| {
            let (out, v) = self.self_attention.self_attend_cached_mixed(h, mask, qk_add, extra, self_cache);
            values = Some(v);
            out
        };
        let Some(norm_ffn) = &self.norm_ffn else {
            let output = self.norm_attention.forward_parallel(x, false, |h| attend(h) + self.ffn.forward(h));
            return (output, values.expect("attention ran"));
        };
        let x = self.norm_attention.forward(x, false, attend);
        let x = match (&self.cross, memory) {
            (Some((cross, residual)), Some((mem, mem_mask))) => {
                residual.forward(&x, false, |h| cross.cross_attend_cached(h, mem, mem_mask, &mut cache.cross_attention))
            }
            _ => x,
        };
        (norm_ffn.forward(&x, false, |h| self.ffn.forward(h)), values.expect("attention ran"))
    }
}

/// A stack's decoding state: every layer's [`LayerCache`] and how many positions (global tokens included)
/// they hold. It cannot slide past a context: a deeper layer's cached keys depend on every earlier token,
/// dropped ones included, so a decoding loop rebuilds it from the cropped context instead.
#[derive(Debug, Default)]
pub struct StackCache {
    layers: Vec<LayerCache>,
    seen: i64,
}

impl StackCache {
    /// Positions held, the global tokens included.
    pub fn len(&self) -> i64 {
        self.seen
    }

    pub fn is_empty(&self) -> bool {
        self.seen == 0
    }

    /// Numbers held by every layer's caches (keys and values), in elements.
    pub fn elements(&self) -> i64 {
        self.layers.iter().map(|l| l.self_attention.elements() + l.cross_attention.elements()).sum()
    }

    /// Keeps the batch rows `rows` (int64 indices, repeats allowed) in every layer: beam search's reordering.
    pub fn select_rows(&mut self, rows: &Tensor) {
        for layer in &mut self.layers {
            layer.self_attention.select_rows(rows);
            layer.cross_attention.select_rows(rows);
        }
    }
}

/// Extra learned tokens prepended to every sequence (a sparse pattern's global tokens): they attend to all
/// and are attended by all, and carry no position.
pub struct GlobalTokens(Option<Tensor>);

impl GlobalTokens {
    pub fn new(vs: &nn::Path, count: i64, d_model: i64) -> Self {
        Self(
            (count > 0).then(|| vs.var("global_tokens", &[count, d_model], nn::Init::Randn { mean: 0.0, stdev: 0.02 })),
        )
    }

    pub fn count(&self) -> i64 {
        self.0.as_ref().map_or(0, |t| t.size()[0])
    }
}

/// Value embeddings (modded-nanogpt): `transformer.value_embeddings` token-indexed tables of the values'
/// width (H_kv·head_dim), each row starting at N(0, 0.02) as the token embeddings do; the layers that read
/// table j (see [`Placement::value_table`]) mix its row for each token into their values. The tables read
/// token ids, so the model that has them builds the tables and hands the ids over in its [`Pass`].
pub struct ValueEmbeddings(Vec<nn::Embedding>);

impl ValueEmbeddings {
    /// `spec.value_embeddings` tables over `vocab` tokens under `vs / i`; `None` when the spec has none.
    pub fn new(vs: &nn::Path, spec: &TransformerSpec, vocab: i64) -> Option<Self> {
        let width = spec.attention.projection_widths()[2];
        let cfg = nn::EmbeddingConfig { ws_init: nn::Init::Randn { mean: 0.0, stdev: 0.02 }, ..Default::default() };
        (spec.value_embeddings > 0)
            .then(|| Self((0..spec.value_embeddings).map(|j| nn::embedding(vs / j, vocab, width, cfg)).collect()))
    }

    /// Every table's rows for token ids (B, N), after `lead` zero rows for the global tokens put first.
    fn lookup(&self, ids: &Tensor, lead: i64) -> Vec<Tensor> {
        let pad = |e: Tensor| if lead > 0 { e.constant_pad_nd([0, 0, lead, 0]) } else { e };
        self.0.iter().map(|table| pad(table.forward(ids))).collect()
    }
}

/// A stack of layers with what surrounds it in every sequence model. Models create the parts in their own
/// order (initialisation draws from one generator, so the order is part of a model's definition).
pub struct Stack {
    pub positions: AbsolutePositions,
    pub at: AbsoluteAt,
    /// BERT's LayerNorm of the summed embeddings, before dropout.
    pub embedding_norm: Option<nn::LayerNorm>,
    pub global_tokens: GlobalTokens,
    pub layers: Vec<TransformerLayer>,
    /// `pe: conv` on an image grid: a convolutional position encoding before every layer (its grid's
    /// `lead` counts the tokens before the grid other than global tokens, e.g. a `<cls>` token).
    pub conv_positions: Option<(Vec<ConvPosEnc>, Grid)>,
    pub final_norm: Option<NormLayer>,
    pub dropout: f64,
    /// What the embedded tokens are multiplied by before positions are added (`transformer.scale_embeddings`).
    pub embedding_scale: f64,
    /// The absolute table is concatenated to the (narrower) token embeddings instead of added.
    pub concat_positions: bool,
    /// `transformer.value_embeddings`' tables, which read the token ids the pass carries.
    pub value_embeddings: Option<ValueEmbeddings>,
}

/// The layers of `spec` under `vs / name / i` (each with its own pattern where the spec gives one); layer i
/// cross-attends when `cross(i)`.
pub fn layers(
    vs: &nn::Path,
    spec: &TransformerSpec,
    count: i64,
    cross: impl Fn(i64) -> bool,
    init: LayerInit,
    grid: Option<Grid>,
) -> Vec<TransformerLayer> {
    (0..count)
        .map(|i| TransformerLayer::new(vs / i, &spec.for_layer(i), cross(i), init, grid, Placement { index: i, count }))
        .collect()
}

/// How many learned values [`layers`] creates with the same arguments.
pub fn layers_parameters(spec: &TransformerSpec, count: i64, cross: impl Fn(i64) -> bool, grid: Option<Grid>) -> i64 {
    (0..count)
        .map(|i| TransformerLayer::parameters(&spec.for_layer(i), cross(i), grid, Placement { index: i, count }))
        .sum()
}

/// The stack's final norm of width `d` when `spec.final_norm`, of the spec's kind (none when the spec
/// normalises nothing).
pub fn final_norm(vs: nn::Path, d: i64, spec: &TransformerSpec, eps: f64) -> Option<NormLayer> {
    if spec.final_norm {
        NormLayer::new(vs, d, spec.norm, eps)
    } else {
        None
    }
}

impl Stack {
    /// A stack as every sequence model builds it: the settings of `spec` (where absolute positions enter, how
    /// they join the tokens, the embedding scale, dropout) over the parts the model file names and builds.
    pub fn new(
        spec: &TransformerSpec,
        positions: AbsolutePositions,
        global_tokens: GlobalTokens,
        layers: Vec<TransformerLayer>,
        final_norm: Option<NormLayer>,
    ) -> Self {
        Self {
            positions,
            at: spec.position.at,
            embedding_norm: None,
            global_tokens,
            layers,
            conv_positions: None,
            final_norm,
            dropout: spec.dropout,
            embedding_scale: spec.embedding_factor(),
            concat_positions: spec.concatenates_positions(),
            value_embeddings: None,
        }
    }

    /// With value embeddings (`None`: without); every pass then carries the token ids (`Pass::with_tokens`).
    pub fn with_value_embeddings(self, value_embeddings: Option<ValueEmbeddings>) -> Self {
        Self { value_embeddings, ..self }
    }

    /// With BERT's LayerNorm of the summed embeddings.
    pub fn with_embedding_norm(self, norm: nn::LayerNorm) -> Self {
        Self { embedding_norm: Some(norm), ..self }
    }

    /// With a convolutional position encoding before every layer (`pe: conv` on an image grid).
    pub fn with_conv_positions(self, conv_positions: Option<(Vec<ConvPosEnc>, Grid)>) -> Self {
        Self { conv_positions, ..self }
    }

    fn scaled(&self, x: &Tensor) -> Tensor {
        if self.embedding_scale == 1.0 {
            x.shallow_clone()
        } else {
            x * self.embedding_scale
        }
    }

    /// The embedded tokens `x` (B, N, D or D − P) joined with the positions `table` (N, D or P) at the
    /// input: added, or concatenated along the features.
    fn join_positions(&self, x: &Tensor, table: &Tensor) -> Tensor {
        if self.concat_positions {
            let (b, n, _) = x.size3().unwrap();
            Tensor::cat(&[x, &table.unsqueeze(0).expand([b, n, -1], false)], 2)
        } else {
            x + table
        }
    }

    /// Where `position.at` puts the absolute table before a layer: added to its input `x` (every layer), or
    /// returned for its query/key projections only; nothing when it went in once at the input.
    fn layer_positions<'t>(&self, x: &mut Tensor, table: Option<&'t Tensor>) -> Option<&'t Tensor> {
        match (self.at, table) {
            (AbsoluteAt::EveryLayer, Some(t)) => {
                *x = &*x + t;
                None
            }
            (AbsoluteAt::Qk, table) => table,
            _ => None,
        }
    }

    /// The stack's input: the embedded tokens `x` (B, N, D) scaled, joined with the absolute positions
    /// `start..start + N` where they enter at the input, normalised (BERT), and with `lead` global tokens
    /// put first; and the position table the layers read (zero rows for the global tokens, which carry none).
    fn input(&self, x: &Tensor, start: i64, lead: i64) -> (Tensor, Option<Tensor>) {
        let (b, n, _) = x.size3().unwrap();
        let table = match start {
            0 => self.positions.table(n),
            _ => self.positions.table(start + n).map(|t| t.narrow(0, start, n)),
        };
        let mut x = self.scaled(x);
        if let (Some(t), AbsoluteAt::Input) = (&table, self.at) {
            x = self.join_positions(&x, t);
        }
        if let Some(norm) = &self.embedding_norm {
            x = norm.forward(&x);
        }
        let table = table.map(|t| if lead > 0 { t.constant_pad_nd([0, 0, lead, 0]) } else { t });
        if let (true, Some(tokens)) = (lead > 0, &self.global_tokens.0) {
            x = Tensor::cat(&[tokens.unsqueeze(0).expand([b, lead, -1], false), x], 1);
        }
        (x, table)
    }

    /// Runs `x` (B, N, D): embedded tokens before any position encoding. Returns the final states (B, N, D)
    /// and, when `pass` asks, every layer's self-attention weights (over the global tokens too: they come
    /// first). `mask.key_padding` covers the N tokens; global tokens are always real.
    ///
    /// With a cache (`Pass::cached`, a step of a decoding loop, in evaluation mode) `x` are the tokens after
    /// the `cache.len()` positions already seen, the global tokens are put first on the first call only, and
    /// the cache then holds the new positions too; `mask.offset` is the absolute position of the cache's
    /// first position.
    pub fn forward(
        &self,
        x: &Tensor,
        mask: &Mask,
        memory: Option<(&Tensor, &Mask)>,
        pass: Pass,
    ) -> (Tensor, Vec<Tensor>) {
        let (b, n, _) = x.size3().unwrap();
        let g = self.global_tokens.count();
        let Pass { train, weights: want_weights, mut cache, before_final_norm, tokens } = pass;
        // Absolute positions of the new tokens, counted after the global tokens; which come first once.
        let (start, lead) = match &cache {
            None => (0, g),
            Some(c) if c.is_empty() => (0, g),
            Some(c) => (c.seen - g, 0),
        };
        let (mut x, table) = self.input(x, start, lead);
        let padding;
        let mut mask =
            Mask { causal: mask.causal, key_padding: mask.key_padding, offset: mask.offset, bias: mask.bias };
        if let Some(cache) = cache.as_deref_mut() {
            assert!(self.conv_positions.is_none(), "a convolutional position encoding needs the whole grid");
            assert!(mask.key_padding.is_none() && mask.bias.is_none(), "cached decoding masks causally only");
            if cache.is_empty() {
                cache.layers = self.layers.iter().map(|_| LayerCache::default()).collect();
            }
        } else if let (true, Some(pad)) = (g > 0, mask.key_padding) {
            padding = Tensor::cat(&[pad.ones_like().narrow(1, 0, 1).expand([b, g], false), pad.shallow_clone()], 1);
            mask.key_padding = Some(&padding);
        }
        if self.dropout > 0.0 && cache.is_none() {
            x = x.dropout(self.dropout, train);
        }
        let mut weights = Vec::new();
        // Value residual: the first layer's values; U-net skips: the first half's outputs.
        let mut first_values: Option<Tensor> = None;
        let mut skips: Vec<Tensor> = Vec::new();
        let count = self.layers.len() as i64;
        let value_embeddings = match (&self.value_embeddings, tokens) {
            (Some(tables), Some(ids)) => tables.lookup(ids, lead),
            (Some(_), None) => panic!("a stack with value embeddings needs its pass to carry the token ids"),
            (None, _) => Vec::new(),
        };
        record(&x);
        for (i, layer) in self.layers.iter().enumerate() {
            if let Some((convs, grid)) = &self.conv_positions {
                x = convs[i].forward(&x, grid.side, grid.lead + g);
            }
            if let Some(w) = layer.skip_weight() {
                let mirror = Placement { index: i as i64, count }.mirror().expect("a skip weight has a mirror");
                x = &x + &skips[mirror as usize] * w;
            }
            let qk_add = self.layer_positions(&mut x, table.as_ref());
            let embedding = Placement { index: i as i64, count }
                .value_table(value_embeddings.len() as i64)
                .map(|j| &value_embeddings[j as usize]);
            let extra = ExtraValues { first: first_values.as_ref(), embedding };
            let values = match cache.as_deref_mut() {
                Some(c) => {
                    let (out, v) = layer.forward_cached(&x, &mask, qk_add, memory, extra, &mut c.layers[i]);
                    x = out;
                    v
                }
                None => {
                    let out = layer.forward(&x, &mask, qk_add, memory, extra, train, want_weights);
                    x = out.output;
                    weights.extend(out.self_weights);
                    out.values
                }
            };
            first_values.get_or_insert(values);
            record(&x);
            record_layer_output(&x);
            if (i as i64) < count / 2 && self.layers.iter().any(|l| l.skip_weight().is_some()) {
                skips.push(x.shallow_clone());
            }
        }
        if let Some(c) = cache {
            c.seen += n + lead;
        }
        if lead > 0 {
            x = x.narrow(1, lead, n);
        }
        if let (Some(norm), false) = (&self.final_norm, before_final_norm) {
            x = norm.forward(&x, train);
        }
        (x, weights)
    }
}

/// How a stack runs a forward pass: training (dropout and batch statistics on) or evaluation, whether it
/// returns every layer's attention weights, and, in a decoding loop, the cache of the positions already
/// seen. `Pass::train()`, `Pass::eval().with_weights()`, `Pass::cached(&mut cache)` read at the call site.
pub struct Pass<'c> {
    pub train: bool,
    pub weights: bool,
    pub cache: Option<&'c mut StackCache>,
    /// Return the last layer's output before the final norm (to measure its token norms).
    pub before_final_norm: bool,
    /// The token ids (B, N) of the stack's input, which value embeddings look up.
    pub tokens: Option<&'c Tensor>,
}

impl Pass<'_> {
    /// A training pass.
    pub fn train() -> Self {
        Self { train: true, weights: false, cache: None, before_final_norm: false, tokens: None }
    }

    /// An evaluation pass.
    pub fn eval() -> Self {
        Self { train: false, weights: false, cache: None, before_final_norm: false, tokens: None }
    }

    /// A training pass when `train`, else an evaluation pass.
    pub fn new(train: bool) -> Self {
        Self { train, weights: false, cache: None, before_final_norm: false, tokens: None }
    }

    /// The same pass, also returning every layer's attention weights.
    pub fn with_weights(self) -> Self {
        Self { weights: true, ..self }
    }

    /// The same pass, its output taken before the stack's final norm.
    pub fn before_final_norm(self) -> Self {
        Self { before_final_norm: true, ..self }
    }

    /// The same pass, returning the attention weights when `want`.
    pub fn with_weights_if(self, want: bool) -> Self {
        Self { weights: want, ..self }
    }
}

impl<'c> Pass<'c> {
    /// The same pass, carrying the token ids (B, N) of the input for value embeddings to look up.
    pub fn with_tokens(self, ids: &'c Tensor) -> Self {
        Self { tokens: Some(ids), ..self }
    }
}

impl<'c> Pass<'c> {
    /// An evaluation pass in a decoding loop, after (and into) `cache`.
    pub fn cached(cache: &'c mut StackCache) -> Self {
        Self { train: false, weights: false, cache: Some(cache), before_final_norm: false, tokens: None }
    }
}
