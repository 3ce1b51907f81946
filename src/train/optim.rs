//! AdamW over one flat parameter buffer, with global-norm gradient clipping and the warm-up + cosine schedule.
//!
//! Every trainable tensor is re-pointed at a slice of a single contiguous buffer (and so are the moments), so
//! the optimiser state and a checkpoint are three flat tensors. Gradients are not: backward hands over a
//! fresh buffer per parameter (zero_grad sets them to none, as PyTorch does), which measured faster than
//! accumulating into a zeroed flat gradient. The update is libtorch's fused AdamW kernel over the parameter
//! list (`torch.optim.AdamW(fused=True)`; tch does not bind it, `csrc/fused.cpp` does); the same maths
//! written with tensor ops (`Update::Explicit`) stays as the readable reference, and the tests check both
//! against AdamW's update written out by hand.
use tch::{Kind, Tensor};

use super::native;

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
    /// How many leading tensors of `params` (and elements of `flat`) get weight decay.
    decayed_tensors: usize,
    decayed: i64,
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
#[derive(Debug, Clone, Copy)]
pub struct StepReport {
    /// Global gradient norm before clipping (after removing any loss scale).
    pub grad_norm: f64,
    /// False when the step was skipped because a scaled gradient overflowed (fp16 loss scaling).
    pub applied: bool,
}

impl AdamW {
    /// Takes over `params`: their storage moves into the flat buffer (values unchanged).
    pub fn new(params: Vec<Tensor>, beta1: f64, beta2: f64, weight_decay: f64) -> Self {
        assert!(!params.is_empty(), "no parameters to optimise");
        let _guard = tch::no_grad_guard();
        // Decayed tensors first, so decay is one multiply over a prefix of the buffer.
        let (mut params, rest): (Vec<Tensor>, Vec<Tensor>) = params.into_iter().partition(|p| p.dim() >= 2);
        let decayed_tensors = params.len();
        let decayed = params.iter().map(|p| p.numel() as i64).sum();
        params.extend(rest);
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
            decayed,
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
    pub fn step_with(&mut self, mut grads: Vec<Tensor>, lr: f64, clip: Option<f64>, loss_scale: f64) -> StepReport {
        let _guard = tch::no_grad_guard();
        let norms: Vec<Tensor> = grads.iter().map(|g| g.norm()).collect();
        let norm = Tensor::stack(&norms, 0).norm().double_value(&[]) / loss_scale;
        if loss_scale != 1.0 && !norm.is_finite() {
            return StepReport { grad_norm: norm, applied: false };
        }
        // Removing the loss scale and clipping are one multiply (as torch.nn.utils.clip_grad_norm_'s
        // max / (norm + 1e-6)).
        let coef = clip.map_or(1.0, |max| clip_factor(norm, max)) / loss_scale;
        if coef != 1.0 {
            for g in grads.iter_mut() {
                let _ = g.g_mul_scalar_(coef);
            }
        }
        self.step += 1;
        match self.update {
            Update::Fused => self.fused_update(&grads, lr),
            Update::Explicit => self.explicit_update(&grads, lr),
        }
        StepReport { grad_norm: norm, applied: true }
    }

    fn fused_update(&mut self, grads: &[Tensor], lr: f64) {
        let _ = self.step_tensor.fill_(self.step as f64);
        // Two calls: the decayed tensors, then the rest without decay.
        let k = self.decayed_tensors;
        for (range, wd) in [(0..k, self.weight_decay), (k..self.params.len(), 0.0)] {
            if range.is_empty() {
                continue;
            }
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
        let g = Tensor::cat(&grads.iter().map(|g| g.reshape([-1])).collect::<Vec<_>>(), 0);
        let t = self.step as f64;
        // m = β1·m + (1−β1)·g;  v = β2·v + (1−β2)·g²  (as lerps: one pass each)
        let _ = self.m.lerp_(&g, 1.0 - self.beta1);
        let _ = self.v.lerp_(&g.square(), 1.0 - self.beta2);
        if self.weight_decay > 0.0 && self.decayed > 0 {
            let _ = self.flat.narrow(0, 0, self.decayed).g_mul_scalar_(1.0 - lr * self.weight_decay);
        }
        // p −= step·m / (sqrt(v)/sqrt(bias2) + eps), written as one addcdiv_ with a negated, pre-scaled
        // denominator (tch's addcdiv_ has no `value` argument).
        let step = lr / (1.0 - self.beta1.powf(t));
        let bias2_sqrt = (1.0 - self.beta2.powf(t)).sqrt();
        let mut denom = self.v.sqrt();
        let _ = denom.g_mul_scalar_(-1.0 / (bias2_sqrt * step));
        let _ = denom.g_add_scalar_(-self.eps / step);
        let _ = self.flat.addcdiv_(&self.m, &denom);
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
pub fn clip_factor(norm: f64, max: f64) -> f64 {
    if norm > max {
        max / (norm + 1e-6)
    } else {
        1.0
    }
}

pub use crate::recipe::schema::warmup_cosine;
