//! AdamW over one flat parameter buffer, with global-norm gradient clipping and the warm-up + cosine schedule.
//!
//! Every trainable tensor is re-pointed at a slice of a single contiguous buffer (and so are the moments), so
//! the optimiser state and a checkpoint are three flat tensors. Gradients are not: backward hands over a
//! fresh buffer per parameter (zero_grad sets them to none, as PyTorch does), which measured faster than
//! accumulating into a zeroed flat gradient. The update is libtorch's fused AdamW kernel over the parameter
//! list (`torch.optim.AdamW(fused=True)`; tch does not bind it, `csrc/fused.cpp` does); the same maths
//! written with tensor ops (`Update::Explicit`) stays as the readable reference, and the tests check both
//! against AdamW's update written out by hand.
//!
//! With `train.optimizer: muon` the hidden layers' matrices (the self- and cross-attention projections, the
//! output gate and the FFN's matrices of every block, listed by name in [`HIDDEN_MATRICES`] and the attention core's `ROLES`) take Muon's update instead (Jordan et al. 2024, as `torch.optim.Muon` in
//! torch 2.11 computes it): Nesterov momentum orthogonalised by five Newton–Schulz iterations, the step scaled
//! by 0.2·√max(rows, cols) so that its RMS matches AdamW's and one learning rate serves both (Moonshot's
//! `match_rms_adamw`), decoupled weight decay lr·λ. Everything else (embeddings, position tables, output
//! heads, value embeddings, norms, biases, the scalars of value residuals, value embeddings and U-net skips)
//! stays with AdamW. Muon's momentum lives in the first-moment slots of its matrices, so state and
//! checkpoints keep their three flat tensors.
use tch::{Kind, Tensor};

use super::native;

/// Muon's settings for the matrices it updates.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Muon {
    pub momentum: f64,
    pub nesterov: bool,
    /// The quintic's coefficients (a, b, c): X ← a·X + (b·XXᵀ + c·(XXᵀ)²)·X.
    pub coefficients: (f64, f64, f64),
    pub ns_steps: i64,
    pub eps: f64,
}

impl Default for Muon {
    /// `torch.optim.Muon`'s defaults.
    fn default() -> Self {
        Self { momentum: 0.95, nesterov: true, coefficients: (3.4445, -4.7750, 2.0315), ns_steps: 5, eps: 1e-7 }
    }
}

/// The hidden layers' matrices, by the end of their var-store path (the unit's name and the weight's, as the
/// core's constructors name them): what Muon updates and muP's per-layer rate scales. A role is declared here,
/// not inferred: a new 2-D weight takes AdamW and the base rate until it is listed, and
/// `tests/knobs.rs: every_trainable_tensor_of_every_model_has_a_declared_role` fails until its author has
/// put it here or in [`OTHER_MATRICES`].
pub const HIDDEN_MATRICES: &[&str] = &[
    // Self- and cross-attention's are declared by the attention core (`transformer::attention::ROLES`).
    // The FFN (`ffn` in the stacks, timm's `mlp` in Swin and DaViT blocks): W1, a gated unit's W3, W2.
    "ffn.up.weight",
    "ffn.gate.weight",
    "ffn.down.weight",
    "mlp.up.weight",
    "mlp.gate.weight",
    "mlp.down.weight",
];

/// The matrices (2-D parameters) that stay with AdamW at the base rate, by the end of their path: embeddings
/// and their tables, position tables, learned tokens, output heads and the models' input and merging layers
/// (Muon's authors leave the first and last layers to AdamW), and the attention unit's small per-head tables.
pub const OTHER_MATRICES: &[&str] = &[
    "token_embedding.weight",
    "src_embedding.weight",
    "word_embedding.weight",
    "segment_embedding.weight",
    "value_embeddings.*.weight",
    "encoder_value_embeddings.*.weight",
    "decoder_value_embeddings.*.weight",
    "lm_head.weight",
    "generator.weight",
    "head.weight",
    "mlm.decoder",
    "mlm.dense.weight",
    "pooler.weight",
    "position.table",
    "pos_embed.table",
    "global_tokens",
    "downsample.reduction.weight",
];

/// The trainable vectors (and scalars), by the end of their path: AdamW at the base rate, without weight
/// decay. Declared, not inferred from the shape, for the same reason as the matrices:
/// `tests/knobs.rs: every_trainable_tensor_of_every_model_has_a_declared_role` fails until a new tensor's
/// author has listed it here or in another list.
pub const VECTORS: &[&str] = &[
    // Every bias: of a projection, an FFN, a gate, a head, a norm.
    "bias",
    // Norm gains: of the residual branches, the stacks' ends, the embeddings, QK-norm and the vision models'
    // stems, patch embeddings and merges.
    "norm_attn.weight",
    "norm_ffn.weight",
    "norm_cross.weight",
    "norm1.weight",
    "norm2.weight",
    "norm.weight",
    "final_norm.weight",
    "embedding_norm.weight",
    "encoder_norm.weight",
    "decoder_norm.weight",
    "stem_norm.weight",
    "patch_norm.weight",
    "downsample_norm.weight",
    // U-net skips' learned weight (the attention unit's own vectors are in `transformer::attention::ROLES`).
    "skip_weight",
];

/// Trainable tensors of more than two dimensions: convolution kernels (the vision stems, patch embeddings,
/// merges and convolutional position encodings) and ViT's <cls> token (1 × 1 × D). AdamW at the base rate,
/// with weight decay, as the matrices of [`OTHER_MATRICES`].
pub const OTHER_DECAYED: &[&str] =
    &["stem.weight", "patch_embed.weight", "downsample.weight", "cpe.*.proj.weight", "cpe.proj.weight", "cls_token"];

/// A trainable tensor's declared role: what updates it, at which rate, with or without weight decay.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Declared {
    /// [`HIDDEN_MATRICES`]: Muon under `optimizer: muon`, muP's hidden rate; weight decay.
    Hidden,
    /// [`OTHER_MATRICES`] and [`OTHER_DECAYED`]: AdamW at the base rate, with weight decay.
    Decayed,
    /// [`VECTORS`]: AdamW at the base rate, no weight decay.
    Vector,
}

/// The declared role of the tensor named `name` of shape `size`; `None` when no list declares it.
pub fn declared_role(name: &str, size: &[i64]) -> Option<Declared> {
    let listed = |list: &[&str], core: &[&str]| list.iter().chain(core).any(|p| path_ends_with(name, p));
    let core = &crate::transformer::attention::ROLES;
    match size.len() {
        2 if listed(HIDDEN_MATRICES, core.hidden_matrices) => Some(Declared::Hidden),
        2 if listed(OTHER_MATRICES, core.other_matrices) => Some(Declared::Decayed),
        3 | 4 if listed(OTHER_DECAYED, &[]) => Some(Declared::Decayed),
        0 | 1 if listed(VECTORS, core.vectors) => Some(Declared::Vector),
        _ => None,
    }
}

/// Whether `name` ends with `pattern`, component by component (`*` matches any one component).
fn path_ends_with(name: &str, pattern: &str) -> bool {
    let (name, pattern): (Vec<&str>, Vec<&str>) = (name.split('.').collect(), pattern.split('.').collect());
    name.len() >= pattern.len()
        && name[name.len() - pattern.len()..].iter().zip(&pattern).all(|(n, p)| *p == "*" || n == p)
}

/// Whether the parameter named `name` (a var-store path such as `layers.0.attn.qkv.weight`) of shape `size`
/// is a hidden layer's matrix ([`HIDDEN_MATRICES`]), which Muon updates.
pub fn is_hidden_matrix(name: &str, size: &[i64]) -> bool {
    declared_role(name, size) == Some(Declared::Hidden)
}

/// Whether a matrix named `name` has a declared role: listed in [`HIDDEN_MATRICES`] or [`OTHER_MATRICES`].
pub fn has_declared_role(name: &str) -> bool {
    let core = &crate::transformer::attention::ROLES;
    HIDDEN_MATRICES
        .iter()
        .chain(OTHER_MATRICES)
        .chain(core.hidden_matrices)
        .chain(core.other_matrices)
        .any(|p| path_ends_with(name, p))
}

/// Newton–Schulz orthogonalisation of `g` as `torch.optim.Muon` computes it: in bfloat16, on the wide
/// orientation, normalised by its Frobenius norm, `steps` quintic iterations; the result has g's shape and
/// singular values near 1 (in the band the coefficients map (0, 1] to after `steps` iterations).
pub fn newton_schulz(g: &Tensor, muon: &Muon) -> Tensor {
    let tall = g.size()[0] > g.size()[1];
    let mut x = g.to_kind(Kind::BFloat16);
    if tall {
        x = x.tr();
    }
    x = &x / x.norm().clamp_min(muon.eps);
    let (a, b, c) = muon.coefficients;
    // baddbmm on one-matrix batches: addmm's beta and alpha, which tch's addmm does not take (bit-identical).
    let batch = |t: &Tensor| t.unsqueeze(0);
    for _ in 0..muon.ns_steps {
        let gram = x.matmul(&x.tr());
        let update = batch(&gram).baddbmm(&batch(&gram), &batch(&gram), b, c).squeeze_dim(0);
        x = batch(&x).baddbmm(&batch(&update), &batch(&x), a, 1.0).squeeze_dim(0);
    }
    if tall {
        x = x.tr();
    }
    x.to_kind(g.kind())
}

/// How one parameter is updated: by Muon or by AdamW, at the learning rate times `lr_scale`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Role {
    pub muon: bool,
    pub lr_scale: f64,
    /// Decoupled weight decay applies (matrices and kernels; never a vector: [`Declared`]).
    pub decay: bool,
}

/// Which implementation performs the AdamW update.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Update {
    /// libtorch's fused kernel: one pass over parameters, gradients and moments.
    Fused,
    /// The same maths as a handful of whole-buffer tensor ops.
    Explicit,
}

pub struct AdamW {
    /// Every parameter, matrices and embeddings first (they get weight decay), then biases and norm gains
    /// (they do not); the parameters themselves are views of it, as are `m_parts` and `v_parts` of the
    /// moments, so state and checkpoints are three flat tensors.
    flat: Tensor,
    params: Vec<Tensor>,
    m: Tensor,
    v: Tensor,
    m_parts: Vec<Tensor>,
    v_parts: Vec<Tensor>,
    /// How many leading tensors of `params` get weight decay: Muon's matrices first, then AdamW's matrices
    /// and embeddings.
    decayed_tensors: usize,
    /// How many leading tensors of `params` Muon updates, and how.
    muon_tensors: usize,
    muon: Muon,
    /// Each parameter's learning rate is `lr` times its scale (1 but under muP).
    lr_scales: Vec<f64>,
    pub beta1: f64,
    pub beta2: f64,
    pub eps: f64,
    pub weight_decay: f64,
    step: i64,
    /// The step count as the fused kernel wants it: a one-element float tensor.
    step_tensor: Tensor,
    pub update: Update,
}

/// What one optimiser step did.
#[derive(Debug)]
pub struct StepReport {
    /// Global gradient norm before clipping (after removing any loss scale): a 0-dim float64 tensor on the
    /// parameters' device, read ([`grad_norm`](Self::grad_norm)) only where it is recorded, since reading
    /// it makes the host wait for the device.
    pub norm: Tensor,
    /// False when the step was skipped because a scaled gradient overflowed (fp16 loss scaling).
    pub applied: bool,
}

impl StepReport {
    /// The global gradient norm, read to the host.
    pub fn grad_norm(&self) -> f64 {
        self.norm.double_value(&[])
    }
}

impl AdamW {
    /// Takes over `params`: their storage moves into the flat buffer (values unchanged).
    pub fn new(params: Vec<Tensor>, beta1: f64, beta2: f64, weight_decay: f64) -> Self {
        let none = vec![false; params.len()];
        Self::with_muon(params, &none, Muon::default(), beta1, beta2, weight_decay)
    }

    /// As [`AdamW::new`], with Muon updating the parameters `orthogonalised` marks (2-D each).
    pub fn with_muon(
        params: Vec<Tensor>,
        orthogonalised: &[bool],
        muon: Muon,
        beta1: f64,
        beta2: f64,
        weight_decay: f64,
    ) -> Self {
        // Anonymous tensors: decay by shape, as a declared role would give them.
        let roles: Vec<Role> = orthogonalised
            .iter()
            .zip(&params)
            .map(|(&muon, p)| Role { muon, lr_scale: 1.0, decay: p.dim() >= 2 })
            .collect();
        Self::with_roles(params, &roles, muon, beta1, beta2, weight_decay)
    }

    /// As [`AdamW::new`], each parameter in its `roles` entry: updated by Muon or AdamW, at the learning rate
    /// times its scale (muP's per-layer rates).
    pub fn with_roles(
        params: Vec<Tensor>,
        roles: &[Role],
        muon: Muon,
        beta1: f64,
        beta2: f64,
        weight_decay: f64,
    ) -> Self {
        assert!(!params.is_empty(), "no parameters to optimise");
        assert_eq!(params.len(), roles.len(), "one role per parameter");
        let _guard = tch::no_grad_guard();
        // Muon's matrices, then AdamW's decayed tensors, then the rest: decay is one multiply over a prefix.
        type Assigned = Vec<(Tensor, Role)>;
        let (muon_params, adam): (Assigned, Assigned) =
            params.into_iter().zip(roles.iter().copied()).partition(|(_, r)| r.muon);
        let (mut params, mut lr_scales): (Vec<Tensor>, Vec<f64>) =
            muon_params.into_iter().map(|(p, r)| (p, r.lr_scale)).unzip();
        assert!(params.iter().all(|p| p.dim() == 2), "Muon orthogonalises matrices only");
        let muon_tensors = params.len();
        let (decayed_adam, rest): (Assigned, Assigned) = adam.into_iter().partition(|(_, r)| r.decay);
        for (p, r) in decayed_adam {
            params.push(p);
            lr_scales.push(r.lr_scale);
        }
        let decayed_tensors = params.len();
        for (p, r) in rest {
            params.push(p);
            lr_scales.push(r.lr_scale);
        }
        let flat = Tensor::cat(&params.iter().map(|p| p.detach().reshape([-1])).collect::<Vec<_>>(), 0);
        let (m, v) = (flat.zeros_like(), flat.zeros_like());
        let (mut m_parts, mut v_parts) = (Vec::new(), Vec::new());
        let mut offset = 0;
        for p in params.iter_mut() {
            let n = p.numel() as i64;
            let shape = p.size();
            p.set_data(&flat.narrow(0, offset, n).view(shape.as_slice()));
            m_parts.push(m.narrow(0, offset, n).view(shape.as_slice()));
            v_parts.push(v.narrow(0, offset, n).view(shape.as_slice()));
            offset += n;
        }
        let device = flat.device();
        Self {
            flat,
            params,
            m,
            v,
            m_parts,
            v_parts,
            decayed_tensors,
            muon_tensors,
            muon,
            lr_scales,
            beta1,
            beta2,
            eps: 1e-8,
            weight_decay,
            step: 0,
            step_tensor: Tensor::zeros([1], (Kind::Float, device)),
            update: Update::Fused,
        }
    }

    pub fn num_params(&self) -> i64 {
        self.flat.numel() as i64
    }

    /// Updates applied so far.
    pub fn steps_taken(&self) -> i64 {
        self.step
    }

    /// Drops every gradient (`set_to_none`): backward then hands its gradient buffers over without a copy
    /// into zeroed ones.
    pub fn zero_grad(&mut self) {
        for p in &self.params {
            native::clear_grad(p);
        }
    }

    /// The optimiser's state for a checkpoint: first and second moments, and the step count.
    pub fn state(&self) -> (&Tensor, &Tensor, i64) {
        (&self.m, &self.v, self.step)
    }

    /// Restores moments and step count saved by `state` (parameters are restored through the var store).
    pub fn restore(&mut self, m: &Tensor, v: &Tensor, step: i64) -> anyhow::Result<()> {
        anyhow::ensure!(
            m.size() == self.m.size() && v.size() == self.v.size(),
            "the checkpoint's optimiser state has {} values, this model {}",
            m.numel(),
            self.m.numel()
        );
        let _guard = tch::no_grad_guard();
        self.m.copy_(m);
        self.v.copy_(v);
        self.step = step;
        Ok(())
    }

    /// The flat buffer every parameter is a view of (what a data-parallel group broadcasts).
    pub fn flat(&self) -> &Tensor {
        &self.flat
    }

    /// Sets the count of updates applied (a rank that received a resumed state's moments).
    pub fn set_steps_taken(&mut self, steps: i64) {
        self.step = steps;
    }

    /// Every parameter's gradient (zeros for one that got none).
    pub fn grads(&self) -> Vec<Tensor> {
        self.params
            .iter()
            .map(|p| {
                let g = p.grad();
                if g.defined() {
                    g
                } else {
                    p.zeros_like()
                }
            })
            .collect()
    }

    /// One update at learning rate `lr` from the accumulated gradients, which backward produced from a loss
    /// multiplied by `loss_scale` (1 unless fp16 loss scaling is on). Clips the global gradient norm to
    /// `clip` first when given. With a loss scale, a non-finite gradient skips the update.
    pub fn step(&mut self, lr: f64, clip: Option<f64>, loss_scale: f64) -> StepReport {
        self.step_with(self.grads(), lr, clip, loss_scale)
    }

    /// [`step`](Self::step) from `grads` (one per parameter, in [`grads`](Self::grads)' order) instead of the
    /// parameters' own: a data-parallel group's averaged gradients.
    pub fn step_with(&mut self, grads: Vec<Tensor>, lr: f64, clip: Option<f64>, loss_scale: f64) -> StepReport {
        // The fused update reads each gradient as its parameter's shape: a list in another order would be
        // read as garbage, not refused.
        assert!(
            grads.len() == self.params.len() && grads.iter().zip(&self.params).all(|(g, p)| g.size() == p.size()),
            "step_with takes one gradient per parameter, in grads()' order"
        );
        let _guard = tch::no_grad_guard();
        // The norm and the clip coefficient stay on the device (float64, the arithmetic `clip_factor` does
        // on the host), so a step makes the host wait for nothing; fp16's overflow check alone reads it.
        let norm = native::global_norm(&grads).to_kind(Kind::Double) / loss_scale;
        if loss_scale != 1.0 && !norm.double_value(&[]).is_finite() {
            return StepReport { norm, applied: false };
        }
        // Removing the loss scale and clipping are one multiply (as torch.nn.utils.clip_grad_norm_'s
        // max / (norm + 1e-6)); a coefficient of exactly 1 leaves every gradient as it was.
        let coef = match clip {
            Some(max) => clip_factor_on_device(&norm, max) / loss_scale,
            None if loss_scale != 1.0 => norm.full_like(1.0 / loss_scale),
            None => norm.ones_like(),
        };
        if clip.is_some() || loss_scale != 1.0 {
            let kind = grads.first().map_or(Kind::Float, |g| g.kind());
            native::foreach_mul_(&grads, &coef.to_kind(kind));
        }
        self.step += 1;
        self.muon_update(&grads, lr);
        match self.update {
            Update::Fused => self.fused_update(&grads, lr),
            Update::Explicit => self.explicit_update(&grads, lr),
        }
        StepReport { norm, applied: true }
    }

    /// Muon's step on its matrices (`torch.optim.Muon`'s single-tensor loop, `match_rms_adamw` scaling).
    fn muon_update(&mut self, grads: &[Tensor], lr: f64) {
        let (muon, k) = (self.muon, self.muon_tensors);
        let matrices =
            self.params[..k].iter_mut().zip(&grads[..k]).zip(&mut self.m_parts[..k]).zip(&self.lr_scales[..k]);
        for (((param, grad), buf), scale) in matrices {
            let _ = buf.lerp_(grad, 1.0 - muon.momentum);
            let update = if muon.nesterov { grad.lerp(buf, muon.momentum) } else { buf.shallow_clone() };
            let orthogonal = newton_schulz(&update, &muon);
            let (rows, cols) = (param.size()[0], param.size()[1]);
            let lr = lr * scale;
            let adjusted = lr * 0.2 * (rows.max(cols) as f64).sqrt();
            let _ = param.g_mul_scalar_(1.0 - lr * self.weight_decay);
            let _ = param.g_add_(&(orthogonal * -adjusted));
        }
    }

    /// AdamW's parameters as runs of consecutive tensors that share weight decay and learning-rate scale:
    /// (tensors, decay, scale). Two runs (decayed, the rest) but under muP.
    fn adam_runs(&self) -> Vec<(std::ops::Range<usize>, f64, f64)> {
        let mut runs: Vec<(std::ops::Range<usize>, f64, f64)> = Vec::new();
        for i in self.muon_tensors..self.params.len() {
            let wd = if i < self.decayed_tensors { self.weight_decay } else { 0.0 };
            let scale = self.lr_scales[i];
            match runs.last_mut() {
                Some((range, w, s)) if *w == wd && *s == scale => range.end = i + 1,
                _ => runs.push((i..i + 1, wd, scale)),
            }
        }
        runs
    }

    fn fused_update(&mut self, grads: &[Tensor], lr: f64) {
        let _ = self.step_tensor.fill_(self.step as f64);
        // One call per run: the decayed tensors, then the rest without decay (after Muon's matrices).
        for (range, wd, scale) in self.adam_runs() {
            let lr = lr * scale;
            native::fused_adamw(
                &self.params[range.clone()],
                &grads[range.clone()],
                &self.m_parts[range.clone()],
                &self.v_parts[range],
                &self.step_tensor,
                lr,
                (self.beta1, self.beta2),
                wd,
                self.eps,
            );
        }
    }

    fn explicit_update(&mut self, grads: &[Tensor], lr: f64) {
        // Run by run over AdamW's part of the buffers (everything after Muon's matrices).
        let offsets: Vec<i64> = std::iter::once(0)
            .chain(self.params.iter().scan(0, |o, p| {
                *o += p.numel() as i64;
                Some(*o)
            }))
            .collect();
        for (range, wd, scale) in self.adam_runs() {
            let (start, len) = (offsets[range.start], offsets[range.end] - offsets[range.start]);
            let part = |t: &Tensor| t.narrow(0, start, len);
            let g = Tensor::cat(&grads[range].iter().map(|g| g.reshape([-1])).collect::<Vec<_>>(), 0);
            self.explicit_run(&part(&self.flat), &part(&self.m), &part(&self.v), &g, lr * scale, wd);
        }
    }

    /// AdamW's update written out on one run's slices of the buffers.
    fn explicit_run(&self, flat: &Tensor, m: &Tensor, v: &Tensor, g: &Tensor, lr: f64, wd: f64) {
        let (mut flat, mut m, mut v) = (flat.shallow_clone(), m.shallow_clone(), v.shallow_clone());
        let t = self.step as f64;
        // m = β1·m + (1−β1)·g;  v = β2·v + (1−β2)·g²  (as lerps: one pass each)
        let _ = m.lerp_(g, 1.0 - self.beta1);
        let _ = v.lerp_(&g.square(), 1.0 - self.beta2);
        if wd > 0.0 {
            let _ = flat.g_mul_scalar_(1.0 - lr * wd);
        }
        // p −= step·m / (sqrt(v)/sqrt(bias2) + eps), written as one addcdiv_ with a negated, pre-scaled
        // denominator (tch's addcdiv_ has no `value` argument).
        let step = lr / (1.0 - self.beta1.powf(t));
        let bias2_sqrt = (1.0 - self.beta2.powf(t)).sqrt();
        let mut denom = v.sqrt();
        let _ = denom.g_mul_scalar_(-1.0 / (bias2_sqrt * step));
        let _ = denom.g_add_scalar_(-self.eps / step);
        let _ = flat.addcdiv_(&m, &denom);
    }
}

/// Scales `grad` in place so that its norm is at most `max` (as `torch.nn.utils.clip_grad_norm_`);
/// returns the norm before clipping.
pub fn clip_by_global_norm(grad: &mut Tensor, max: f64) -> f64 {
    let norm = grad.norm().double_value(&[]);
    let factor = clip_factor(norm, max);
    if factor != 1.0 {
        let _ = grad.g_mul_scalar_(factor);
    }
    norm
}

/// What clipping a gradient of norm `norm` to `max` multiplies it by: `max / (norm + 1e-6)` above the
/// limit, 1 below it.
/// [`clip_factor`] on a 0-dim float64 `norm`, computed where it lives (the same IEEE double arithmetic).
pub fn clip_factor_on_device(norm: &Tensor, max: f64) -> Tensor {
    let clipped = norm.full_like(max) / (norm + 1e-6);
    clipped.where_self(&norm.gt(max), &norm.ones_like())
}

pub fn clip_factor(norm: f64, max: f64) -> f64 {
    if norm > max {
        max / (norm + 1e-6)
    } else {
        1.0
    }
}

pub use crate::recipe::schema::warmup_cosine;
