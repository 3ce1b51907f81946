//! AdamW over one flat parameter buffer, with global-norm gradient clipping and the warm-up + cosine schedule.
//!
//! Every trainable tensor is re-pointed at a slice of a single contiguous buffer, so an optimiser step is a
//! dozen whole-buffer kernels however many parameters the model has — the same idea as PyTorch's fused /
//! multi-tensor AdamW (which tch does not expose). The maths is `torch.optim.AdamW`'s, checked against it in
//! the tests.
use tch::Tensor;

pub struct AdamW {
    params: Vec<Tensor>,
    flat: Tensor,
    m: Tensor,
    v: Tensor,
    /// 1 for tensors that get weight decay (matrices and embeddings), 0 for biases and norm gains.
    decay_mask: Tensor,
    pub beta1: f64,
    pub beta2: f64,
    pub eps: f64,
    pub weight_decay: f64,
    step: i64,
}

impl AdamW {
    /// Takes over `params`: their storage moves into the flat buffer (values unchanged).
    pub fn new(params: Vec<Tensor>, beta1: f64, beta2: f64, weight_decay: f64) -> Self {
        assert!(!params.is_empty(), "no parameters to optimise");
        let _guard = tch::no_grad_guard();
        let flat = Tensor::cat(&params.iter().map(|p| p.detach().reshape([-1])).collect::<Vec<_>>(), 0);
        let mut masks = Vec::with_capacity(params.len());
        let mut offset = 0;
        let mut params = params;
        for p in params.iter_mut() {
            let n = p.numel() as i64;
            let view = flat.narrow(0, offset, n).view(p.size().as_slice());
            p.set_data(&view);
            let decays = if p.dim() >= 2 { 1.0 } else { 0.0 };
            masks.push(Tensor::full([n], decays, (flat.kind(), flat.device())));
            offset += n;
        }
        Self {
            m: flat.zeros_like(),
            v: flat.zeros_like(),
            decay_mask: Tensor::cat(&masks, 0),
            flat,
            params,
            beta1,
            beta2,
            eps: 1e-8,
            weight_decay,
            step: 0,
        }
    }

    pub fn num_params(&self) -> i64 {
        self.flat.numel() as i64
    }

    pub fn zero_grad(&mut self) {
        for p in self.params.iter_mut() {
            let mut g = p.grad();
            if g.defined() {
                let _ = g.detach_().zero_();
            }
        }
    }

    /// All gradients as one flat tensor (zeros for parameters that got none).
    fn flat_grad(&self) -> Tensor {
        let grads: Vec<Tensor> = self
            .params
            .iter()
            .map(|p| {
                let g = p.grad();
                if g.defined() {
                    g.reshape([-1])
                } else {
                    p.zeros_like().reshape([-1])
                }
            })
            .collect();
        Tensor::cat(&grads, 0)
    }

    /// One update at learning rate `lr`. Clips the global gradient norm to `clip` first when given.
    /// Returns the gradient norm before clipping.
    pub fn step(&mut self, lr: f64, clip: Option<f64>) -> f64 {
        let _guard = tch::no_grad_guard();
        let mut g = self.flat_grad().to_kind(self.flat.kind());
        let norm = match clip {
            Some(max) => clip_by_global_norm(&mut g, max),
            None => g.norm().double_value(&[]),
        };
        self.step += 1;
        let t = self.step as f64;
        let _ = self.m.lerp_(&g, 1.0 - self.beta1);
        let _ = self.v.g_mul_scalar_(self.beta2);
        let _ = self.v.addcmul_(&(&g * (1.0 - self.beta2)), &g);
        let bias1 = 1.0 - self.beta1.powf(t);
        let bias2 = 1.0 - self.beta2.powf(t);
        if self.weight_decay > 0.0 {
            let decay = &self.flat * &self.decay_mask * (lr * self.weight_decay);
            let _ = self.flat.g_sub_(&decay);
        }
        let denom = (self.v.sqrt() / bias2.sqrt()).g_add_scalar_(self.eps);
        let update = (&self.m / denom) * (lr / bias1);
        let _ = self.flat.g_sub_(&update);
        norm
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
