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
    fn ablate_global_norm(ts: *const *mut C_tensor, n: i64, out: *mut *mut C_tensor) -> *mut c_char;
    fn ablate_foreach_mul_(ts: *const *mut C_tensor, n: i64, factor: *mut C_tensor) -> *mut c_char;
    fn ablate_autocast(cuda: bool, dtype: i32) -> *mut c_char;
    fn ablate_autocast_clear_cache();
    fn ablate_free_error(message: *mut c_char);
    fn ablate_cuda_peak_memory(device: i32, allocated: *mut i64, reserved: *mut i64) -> *mut c_char;
    fn ablate_cuda_reset_peak_memory(device: i32) -> *mut c_char;
    fn ablate_has_cuda_extras() -> bool;
    fn ablate_cuda_mem_info(device: i32, free: *mut i64, total: *mut i64) -> *mut c_char;
    fn ablate_cuda_set_device(device: i32) -> *mut c_char;
    fn ablate_set_math_modes(tf32: bool, deterministic: bool) -> *mut c_char;
    fn ablate_math_modes(tf32_matmul: *mut bool, tf32_conv: *mut bool, deterministic: *mut bool);
    fn ablate_legacy_tf32(cublas: *mut bool, cudnn: *mut bool) -> *mut c_char;
    fn ablate_profiler_start(cuda: bool) -> *mut c_char;
    fn ablate_profiler_stop(
        on_event: extern "C" fn(*mut std::ffi::c_void, *const c_char, usize, u64, u64, u64, bool),
        context: *mut std::ffi::c_void,
    ) -> *mut c_char;
}

/// One operator call libtorch's profiler recorded: nested calls overlap their caller on the same thread.
#[derive(Debug, Clone, PartialEq)]
pub struct ProfiledOp {
    pub name: String,
    pub thread: u64,
    pub start_ns: u64,
    pub duration_ns: u64,
    /// false for kernels on a GPU (their own timeline).
    pub on_cpu: bool,
}

extern "C" fn collect_event(
    context: *mut std::ffi::c_void,
    name: *const c_char,
    len: usize,
    thread: u64,
    start_ns: u64,
    duration_ns: u64,
    on_cpu: bool,
) {
    // SAFETY: `context` is the `&mut Vec<ProfiledOp>` that `profile` passed in, alive and not otherwise
    // borrowed for the duration of `ablate_profiler_stop`, which calls this synchronously on its own thread.
    let events = unsafe { &mut *(context as *mut Vec<ProfiledOp>) };
    // SAFETY: the shim passes a pointer to `len` bytes of a std::string that lives until this call returns.
    let bytes = unsafe { std::slice::from_raw_parts(name as *const u8, len) };
    events.push(ProfiledOp {
        name: String::from_utf8_lossy(bytes).into_owned(),
        thread,
        start_ns,
        duration_ns,
        on_cpu,
    });
}

/// Runs `f` under libtorch's profiler (the Kineto-backed one `torch.profiler` drives; CUDA kernels too when
/// `cuda`) and returns what it recorded.
pub fn profile<T>(cuda: bool, f: impl FnOnce() -> T) -> anyhow::Result<(T, Vec<ProfiledOp>)> {
    // SAFETY: a plain value in; the shim catches exceptions.
    cuda_result(unsafe { ablate_profiler_start(cuda) }, "starting libtorch's profiler")?;
    let out = f();
    let mut events: Vec<ProfiledOp> = Vec::new();
    // SAFETY: `collect_event` matches the callback type, and the context is `events`, exclusively borrowed
    // here until the call returns; the shim catches exceptions.
    let error =
        unsafe { ablate_profiler_stop(collect_event, &mut events as *mut Vec<ProfiledOp> as *mut std::ffi::c_void) };
    cuda_result(error, "stopping libtorch's profiler")?;
    Ok((out, events))
}

/// Whether this build has csrc/cuda.cpp: NCCL and the CUDA caching allocator's statistics.
pub fn has_cuda_extras() -> bool {
    // SAFETY: takes nothing, returns a constant of the build.
    unsafe { ablate_has_cuda_extras() }
}

/// The shim's message as an error (the CUDA calls fail on a build without CUDA headers, or off a GPU).
fn cuda_result(error: *mut c_char, what: &str) -> anyhow::Result<()> {
    if error.is_null() {
        return Ok(());
    }
    // SAFETY: as in `check`: a string the shim allocated, read once and freed once by the shim.
    let message = unsafe { CStr::from_ptr(error) }.to_string_lossy().into_owned();
    // SAFETY: freed once, by the shim's deallocator, after the message was copied.
    unsafe { ablate_free_error(error) };
    anyhow::bail!("{what}: {message}")
}

/// Peak bytes allocated and reserved by the CUDA caching allocator on GPU `device` since the last
/// [`reset_cuda_peak_memory`] (`torch.cuda.max_memory_allocated` / `max_memory_reserved`).
pub fn cuda_peak_memory(device: usize) -> anyhow::Result<(i64, i64)> {
    let (mut allocated, mut reserved) = (0i64, 0i64);
    // SAFETY: plain values and two out-pointers to locals that outlive the call; the shim catches exceptions.
    let error = unsafe { ablate_cuda_peak_memory(device as i32, &mut allocated, &mut reserved) };
    cuda_result(error, "reading the CUDA allocator's peak memory")?;
    Ok((allocated, reserved))
}

/// Starts the CUDA caching allocator's peaks afresh (`torch.cuda.reset_peak_memory_stats`).
pub fn reset_cuda_peak_memory(device: usize) -> anyhow::Result<()> {
    // SAFETY: a plain value in; the shim catches exceptions.
    cuda_result(unsafe { ablate_cuda_reset_peak_memory(device as i32) }, "resetting the CUDA allocator's peaks")
}

/// Free and total bytes of GPU `device` (`torch.cuda.mem_get_info`).
pub fn cuda_mem_info(device: usize) -> anyhow::Result<(i64, i64)> {
    let (mut free, mut total) = (0i64, 0i64);
    // SAFETY: a plain value and two out-pointers to locals that outlive the call; the shim catches exceptions.
    let error = unsafe { ablate_cuda_mem_info(device as i32, &mut free, &mut total) };
    cuda_result(error, "reading GPU memory")?;
    Ok((free, total))
}

/// Makes GPU `device` this process's current one (`torch.cuda.set_device`).
pub fn cuda_set_device(device: usize) -> anyhow::Result<()> {
    // SAFETY: a plain value in; the shim catches exceptions.
    cuda_result(unsafe { ablate_cuda_set_device(device as i32) }, "selecting the GPU")
}

/// TF32 for CUDA's float32 matmuls and convolutions, and deterministic algorithms, for what runs next
/// (process-wide settings of libtorch's context; `train.tf32`, `train.deterministic`).
pub fn set_math_modes(tf32: bool, deterministic: bool) -> anyhow::Result<()> {
    // SAFETY: plain values in; the shim catches exceptions.
    cuda_result(unsafe { ablate_set_math_modes(tf32, deterministic) }, "setting float32 precision and determinism")
}

/// The modes libtorch's context holds: (TF32 for CUDA matmuls, TF32 for cuDNN convolutions, deterministic
/// algorithms with deterministic cuDNN).
pub fn math_modes() -> (bool, bool, bool) {
    let (mut matmul, mut conv, mut deterministic) = (false, false, false);
    // SAFETY: three out-pointers to locals that outlive the call; the shim only reads libtorch's context.
    unsafe { ablate_math_modes(&mut matmul, &mut conv, &mut deterministic) };
    (matmul, conv, deterministic)
}

/// TF32 as libtorch's legacy getters report it (`torch.backends.cuda.matmul.allow_tf32`,
/// `torch.backends.cudnn.allow_tf32`; libtorch_cuda's kernels call them too): (cuBLAS, cuDNN), or the error
/// they throw when the legacy and new precision APIs were left disagreeing.
pub fn legacy_tf32() -> anyhow::Result<(bool, bool)> {
    let (mut cublas, mut cudnn) = (false, false);
    // SAFETY: two out-pointers to locals that outlive the call; the shim catches exceptions.
    let error = unsafe { ablate_legacy_tf32(&mut cublas, &mut cudnn) };
    cuda_result(error, "reading TF32 through libtorch's legacy getters")?;
    Ok((cublas, cudnn))
}

fn check(error: *mut c_char, what: &str) {
    if !error.is_null() {
        // SAFETY: a non-null result is a NUL-terminated string the shim allocated for us; it is read once
        // and then handed back to the shim's own deallocator, exactly once.
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
    // The C signature takes `*mut` because libtorch's tensor handles are mutable; what the kernel mutates
    // is the storage the handles share, as any in-place op on a `&Tensor` does in tch.
    let ptrs = |ts: &[Tensor]| ts.iter().map(|t| t.as_ptr() as *mut C_tensor).collect::<Vec<_>>();
    let (p, g, m, v) = (ptrs(params), ptrs(grads), ptrs(m), ptrs(v));
    // SAFETY: the four pointer arrays hold `n` live tensor handles each (checked above) and outlive the
    // call, as do `params`, `grads`, `m`, `v` and `step`; the shim catches every C++ exception.
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

/// The global 2-norm of `tensors` (the norm of their norms: `torch.nn.utils.clip_grad_norm_`'s), a 0-dim
/// tensor left on their device: per-tensor norms in one `_foreach_norm` call.
pub fn global_norm(tensors: &[Tensor]) -> Tensor {
    let ptrs: Vec<*mut C_tensor> = tensors.iter().map(|t| t.as_ptr() as *mut C_tensor).collect();
    let mut out: *mut C_tensor = std::ptr::null_mut();
    // SAFETY: `ptrs` holds live tensor handles that outlive the call; the shim writes a freshly allocated
    // tensor into `out` on success and catches every C++ exception.
    check(unsafe { ablate_global_norm(ptrs.as_ptr(), ptrs.len() as i64, &mut out) }, "global norm");
    // SAFETY: on success `out` is a tensor the shim allocated for us, owned from here on (freed on drop).
    unsafe { Tensor::from_ptr(out) }
}

/// Multiplies every one of `tensors` in place by the 0-dim `factor` (`torch._foreach_mul_`), which may
/// stay on the device: nothing is read back.
pub fn foreach_mul_(tensors: &[Tensor], factor: &Tensor) {
    let ptrs: Vec<*mut C_tensor> = tensors.iter().map(|t| t.as_ptr() as *mut C_tensor).collect();
    // SAFETY: `ptrs` and `factor` are live tensor handles for the call; the in-place multiply writes the
    // storage the handles share, as any in-place op on a `&Tensor` does in tch; the shim catches exceptions.
    check(
        unsafe { ablate_foreach_mul_(ptrs.as_ptr(), ptrs.len() as i64, factor.as_ptr() as *mut C_tensor) },
        "foreach multiply",
    );
}

/// Drops `param`'s gradient, so the next backward hands over a fresh buffer (`set_to_none=True`).
pub fn clear_grad(param: &Tensor) {
    // SAFETY: `param` is a live tensor handle for the duration of the call; the shim catches exceptions.
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
    // SAFETY: takes no arguments and only clears libtorch's thread-local autocast cache.
    unsafe { ablate_autocast_clear_cache() }
}

/// Autocast on `cuda` or the CPU while the guard lives (`torch.autocast(device, dtype)`): matmuls and
/// convolutions run in the low-precision type, reductions and losses stay in float32, weights stay float32.
pub struct AutocastGuard {
    cuda: bool,
    /// Autocast state is per thread, so the guard must be dropped on the thread that made it: not `Send`.
    _per_thread: std::marker::PhantomData<*const ()>,
}

impl AutocastGuard {
    pub fn new(cuda: bool, kind: AutocastType) -> Self {
        let dtype = match kind {
            AutocastType::BFloat16 => 1,
            AutocastType::Float16 => 2,
        };
        // SAFETY: plain values in; the shim sets this thread's autocast state and catches exceptions.
        check(unsafe { ablate_autocast(cuda, dtype) }, "autocast");
        Self { cuda, _per_thread: std::marker::PhantomData }
    }
}

impl Drop for AutocastGuard {
    fn drop(&mut self) {
        // SAFETY: as in `new`; dtype 0 turns autocast off on this (the creating) thread.
        check(unsafe { ablate_autocast(self.cuda, 0) }, "autocast");
    }
}
