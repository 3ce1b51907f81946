//! Safe wrappers over `csrc/fused.cpp`: libtorch entry points that tch does not bind (the fused AdamW kernel,
//! autocast state, gradients that live in a caller-owned buffer). Each C function returns null on success or
//! a message, so a C++ exception never unwinds into Rust.
use std::ffi::{c_char, CStr};
use tch::Tensor;
use torch_sys::C_tensor;

extern "C" {
    #[allow(clippy::too_many_arguments)]
    fn ablate_fused_adamw(
        params: *const *mut C_tensor,
        grads: *const *mut C_tensor,
        ms: *const *mut C_tensor,
        vs: *const *mut C_tensor,
        n: i64,
        step: *mut C_tensor,
        lr: f64,
        beta1: f64,
        beta2: f64,
        weight_decay: f64,
        eps: f64,
    ) -> *mut c_char;
    fn ablate_clear_grad(param: *mut C_tensor) -> *mut c_char;
    fn ablate_autocast(cuda: bool, dtype: i32) -> *mut c_char;
    fn ablate_autocast_clear_cache();
    fn ablate_free_error(message: *mut c_char);
}

fn check(error: *mut c_char, what: &str) {
    if !error.is_null() {
        let message = unsafe { CStr::from_ptr(error) }.to_string_lossy().into_owned();
        unsafe { ablate_free_error(error) };
        // Only reachable through a libtorch bug or a misuse of these wrappers: shapes and devices are
        // checked where the tensors are built.
        panic!("libtorch's {what} failed: {message}");
    }
}

/// One step of libtorch's fused AdamW kernel on every tensor of `params` in place (with their gradients and
/// moments at the same positions); `step` holds the (incremented) count.
#[allow(clippy::too_many_arguments)]
pub fn fused_adamw(
    params: &[Tensor],
    grads: &[Tensor],
    m: &[Tensor],
    v: &[Tensor],
    step: &Tensor,
    lr: f64,
    betas: (f64, f64),
    weight_decay: f64,
    eps: f64,
) {
    let n = params.len();
    assert!(grads.len() == n && m.len() == n && v.len() == n, "one gradient and two moments per parameter");
    let ptrs = |ts: &[Tensor]| ts.iter().map(|t| t.as_ptr() as *mut C_tensor).collect::<Vec<_>>();
    let (p, g, m, v) = (ptrs(params), ptrs(grads), ptrs(m), ptrs(v));
    let error = unsafe {
        ablate_fused_adamw(
            p.as_ptr(),
            g.as_ptr(),
            m.as_ptr(),
            v.as_ptr(),
            n as i64,
            step.as_ptr() as *mut C_tensor,
            lr,
            betas.0,
            betas.1,
            weight_decay,
            eps,
        )
    };
    check(error, "fused AdamW");
}

/// Drops `param`'s gradient, so the next backward hands over a fresh buffer (`set_to_none=True`).
pub fn clear_grad(param: &Tensor) {
    check(unsafe { ablate_clear_grad(param.as_ptr() as *mut C_tensor) }, "clear_grad");
}

/// Low-precision type for autocast regions.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AutocastType {
    BFloat16,
    Float16,
}

/// Forgets autocast's cached low-precision casts of the weights. Autocast casts each weight once and reuses
/// the cast until the cache is cleared (`torch.autocast` clears it when its block exits), so after every
/// weight update the cache must go, or the next forward pass would still see the old weights.
pub fn clear_autocast_cache() {
    unsafe { ablate_autocast_clear_cache() }
}

/// Autocast on `cuda` or the CPU while the guard lives (`torch.autocast(device, dtype)`): matmuls and
/// convolutions run in the low-precision type, reductions and losses stay in float32, weights stay float32.
pub struct AutocastGuard {
    cuda: bool,
}

impl AutocastGuard {
    pub fn new(cuda: bool, kind: AutocastType) -> Self {
        let dtype = match kind {
            AutocastType::BFloat16 => 1,
            AutocastType::Float16 => 2,
        };
        check(unsafe { ablate_autocast(cuda, dtype) }, "autocast");
        Self { cuda }
    }
}

impl Drop for AutocastGuard {
    fn drop(&mut self) {
        check(unsafe { ablate_autocast(self.cuda, 0) }, "autocast");
    }
}
