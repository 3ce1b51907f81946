//! AdamW over one flat parameter buffer, with global-norm gradient clipping and the warm-up + cosine schedule.
//!
//! Every trainable tensor is re-pointed at a slice of a single contiguous buffer, so an optimiser step costs
//! the same few whole-buffer passes however many parameters the model has. The update itself is libtorch's
//! fused AdamW kernel (`torch.optim.AdamW(fused=True)`; tch does not bind it, `csrc/fused.cpp` does); the
//! same maths written with tensor ops (`Update::Explicit`) stays as the readable reference, and the tests
//! check both against AdamW's update written out by hand.
use tch::{Kind, Tensor};

use crate::native;

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
    /// (they do not); the parameters themselves are views of it.
    flat: Tensor,
    /// Every parameter's gradient is a view of this buffer: backward accumulates straight into it.
    flat_grad: Tensor,
    m: Tensor,
    v: Tensor,
    /// How many leading elements of `flat` get weight decay.
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
        let decayed = params.iter().map(|p| p.numel() as i64).sum();
        params.extend(rest);
        let flat = Tensor::cat(&params.iter().map(|p| p.detach().reshape([-1])).collect::<Vec<_>>(), 0);
        let flat_grad = flat.zeros_like();
        let mut offset = 0;
        for p in params.iter_mut() {
            let n = p.numel() as i64;
            p.set_data(&flat.narrow(0, offset, n).view(p.size().as_slice()));
            native::set_grad(p, &mut flat_grad.narrow(0, offset, n).view(p.size().as_slice()));
            offset += n;
        }
        let device = flat.device();
        Self {
            m: flat.zeros_like(),
            v: flat.zeros_like(),
            decayed,
            flat,
            flat_grad,
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

    pub fn zero_grad(&mut self) {
        let _ = self.flat_grad.zero_();
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

    /// One update at learning rate `lr` from the accumulated gradients, which backward produced from a loss
    /// multiplied by `loss_scale` (1 unless fp16 loss scaling is on). Clips the global gradient norm to
    /// `clip` first when given. With a loss scale, a non-finite gradient skips the update.
    pub fn step(&mut self, lr: f64, clip: Option<f64>, loss_scale: f64) -> StepReport {
        let _guard = tch::no_grad_guard();
        let mut g = self.flat_grad.shallow_clone();
        if loss_scale != 1.0 {
            let _ = g.g_mul_scalar_(1.0 / loss_scale);
        }
        let norm = match clip {
            Some(max) => clip_by_global_norm(&mut g, max),
            None => g.norm().double_value(&[]),
        };
        if loss_scale != 1.0 && !norm.is_finite() {
            return StepReport { grad_norm: norm, applied: false };
        }
        self.step += 1;
        match self.update {
            Update::Fused => self.fused_update(&g, lr),
            Update::Explicit => self.explicit_update(&g, lr),
        }
        StepReport { grad_norm: norm, applied: true }
    }

    fn fused_update(&mut self, g: &Tensor, lr: f64) {
        let _ = self.step_tensor.fill_(self.step as f64);
        let total = self.flat.numel() as i64;
        // Two calls: the decayed prefix, then the rest without decay.
        for (start, len, wd) in [(0, self.decayed, self.weight_decay), (self.decayed, total - self.decayed, 0.0)] {
            if len == 0 {
                continue;
            }
            native::fused_adamw(
                &mut self.flat.narrow(0, start, len),
                &mut g.narrow(0, start, len),
                &mut self.m.narrow(0, start, len),
                &mut self.v.narrow(0, start, len),
                &mut self.step_tensor,
                lr,
                (self.beta1, self.beta2),
                wd,
                self.eps,
            );
        }
    }

    fn explicit_update(&mut self, g: &Tensor, lr: f64) {
        let t = self.step as f64;
        // m = β1·m + (1−β1)·g;  v = β2·v + (1−β2)·g²  (as lerps: one pass each)
        let _ = self.m.lerp_(g, 1.0 - self.beta1);
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
    if norm > max {
        let _ = grad.g_mul_scalar_(max / (norm + 1e-6));
    }
    norm
}

/// Linear warm-up to `lr` over `warmup` steps, then cosine decay to `min_lr` at `total` steps.
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
