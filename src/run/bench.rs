//! Training-step throughput of a GPT on random tokens, for side-by-side comparison with PyTorch eager
//! (`bench/eager_gpt.py` builds the same model and optimiser). Not a test: numbers go to `results/bench/`.
use std::time::Instant;
use tch::{Device, Kind, Tensor};

use crate::models::gpt::Gpt;
use crate::recipe::Precision;
use crate::train::optim::AdamW;
use crate::train::precision::{self, LossScaler};
use crate::train::{backward_and_step, backward_scaled, optimiser_step};
use crate::transformer::spec::TransformerSpec;

/// The benchmark's model and batch: a nanoGPT-layout GPT (what `bench/eager_gpt.py` builds) on random
/// tokens. `--workers auto` probes splits of the cores at a run's size through the same flags.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BenchModel {
    pub layers: i64,
    pub heads: i64,
    pub d_model: i64,
    pub block: i64,
    pub batch: i64,
    pub vocab: i64,
}

impl BenchModel {
    /// nanoGPT's layout: pre-LN, GELU, learned positions, tied embeddings, over a context of `block`.
    fn spec(&self, block: i64) -> TransformerSpec {
        let mut spec = TransformerSpec::small(self.d_model, self.layers, self.heads, block);
        spec.pre_ln = true;
        spec.tie_embeddings = true;
        spec
    }

    /// The `ablate bench` flags that build this model.
    pub fn args(&self) -> Vec<String> {
        let flags = [
            ("--layers", self.layers),
            ("--heads", self.heads),
            ("--d-model", self.d_model),
            ("--block", self.block),
            ("--batch", self.batch),
            ("--vocab", self.vocab),
        ];
        flags.iter().flat_map(|(flag, value)| [flag.to_string(), value.to_string()]).collect()
    }
}

pub struct BenchConfig {
    pub model: BenchModel,
    pub warmup: i64,
    pub steps: i64,
    pub precision: Precision,
}

pub struct BenchResult {
    pub params: i64,
    pub tokens_per_s: f64,
    pub step_ms: f64,
}

/// The benchmark's model, optimiser and fixed batch.
struct Setup {
    _vs: tch::nn::VarStore,
    model: Gpt,
    opt: AdamW,
    x: Tensor,
    y: Tensor,
    spec: TransformerSpec,
}

fn setup(b: &BenchConfig, device: Device) -> Setup {
    let m = &b.model;
    let spec = m.spec(m.block);
    tch::manual_seed(0);
    let vs = tch::nn::VarStore::new(device);
    let model = Gpt::new(&vs.root(), &spec, m.vocab);
    let opt = AdamW::new(vs.trainable_variables(), 0.9, 0.99, 0.1);
    let x = Tensor::randint(m.vocab, [m.batch, m.block], (Kind::Int64, device));
    let y = Tensor::randint(m.vocab, [m.batch, m.block], (Kind::Int64, device));
    Setup { _vs: vs, model, opt, x, y, spec }
}

fn synchronize(device: Device) {
    if let Device::Cuda(i) = device {
        tch::Cuda::synchronize(i as i64);
    }
}

pub fn run(b: &BenchConfig, device: Device) -> BenchResult {
    let Setup { model, mut opt, x, y, .. } = setup(b, device);
    let _autocast = precision::autocast(b.precision, device);
    let mut scaler = LossScaler::for_precision(b.precision);
    for _ in 0..b.warmup {
        backward_and_step(&model.loss(&x, &y, true).1, &mut opt, 1e-3, Some(1.0), &mut scaler);
    }
    let start = Instant::now();
    for _ in 0..b.steps {
        backward_and_step(&model.loss(&x, &y, true).1, &mut opt, 1e-3, Some(1.0), &mut scaler);
    }
    synchronize(device);
    let secs = start.elapsed().as_secs_f64();
    BenchResult {
        params: opt.num_params(),
        tokens_per_s: (b.steps * b.model.batch * b.model.block) as f64 / secs,
        step_ms: secs * 1000.0 / b.steps as f64,
    }
}

/// Where a training step's time goes: the phases timed around the step's parts, and libtorch's profiler's
/// per-operator self times grouped into classes, against the device's measured matmul peak.
pub struct Profile {
    pub tokens_per_s: f64,
    pub step_ms: f64,
    /// (phase, ms per step): forward, backward, optimiser.
    pub phases: Vec<(&'static str, f64)>,
    /// Largest first.
    pub classes: Vec<OpClass>,
    /// Analytic FLOPs of the step's weight matmuls (forward and backward), and of the whole step.
    pub matmul_flops: f64,
    pub step_flops: f64,
    /// The device's matmul peak in the benchmark's precision (FLOP/s), as MFU's denominator.
    pub peak: f64,
    /// Per step under the profiler: GPU kernels launched (on the CPU, operators called: each is at least one
    /// kernel on a GPU), and reads of a value to the host (`aten::_local_scalar_dense`, each a wait for the
    /// device).
    pub kernels_per_step: f64,
    pub host_reads_per_step: f64,
    /// On a GPU, the kernels' summed time over the step's wall time (how busy the device is; under 1 when the
    /// host's launches are the bottleneck); NaN on the CPU.
    pub busy_share: f64,
}

/// One class of operators in a profile.
pub struct OpClass {
    pub name: &'static str,
    /// Self time per step, summed over the class's operators.
    pub ms: f64,
    /// Its operators with their ms per step, largest first.
    pub ops: Vec<(String, f64)>,
}

impl Profile {
    pub fn mfu(&self) -> f64 {
        self.step_flops / (self.step_ms / 1000.0) / self.peak
    }

    /// The weight matmuls' achieved rate (FLOP/s) over the time the profiler gives the matmul class.
    pub fn matmul_rate(&self) -> f64 {
        let ms = self.classes.iter().find(|c| c.name == "matmul").map_or(0.0, |c| c.ms);
        self.matmul_flops / (ms / 1000.0)
    }
}

/// Which class an ATen operator (or autograd node) belongs to, by its name.
pub fn op_class(name: &str) -> &'static str {
    let n = name.trim_start_matches("aten::").to_ascii_lowercase();
    let has = |parts: &[&str]| parts.iter().any(|p| n.contains(p));
    // Autograd's own frames (`autograd::engine::evaluate_function: AddmmBackward0`, the node `AddmmBackward0`):
    // the ATen ops they call are recorded inside them, so their self time is the engine's bookkeeping.
    if name.starts_with("autograd::") || name.contains("Backward") {
        "autograd"
    } else if has(&["scaled_dot_product", "flash", "fmha", "efficient_attention", "softmax"]) && !has(&["log_softmax"])
    {
        "attention"
    } else if has(&["adamw", "_foreach", "linalg_vector_norm", "clamp"]) {
        "optimiser"
    } else if has(&["addmm", "bmm", "mm", "matmul", "linear", "gemm", "cutlass", "xmma"]) {
        "matmul"
    } else if has(&["layer_norm", "layernorm", "rms_norm", "batch_norm"]) {
        "norm"
    } else if has(&["gelu", "relu", "threshold", "silu", "tanh"]) {
        "activation"
    } else if has(&["log_softmax", "nll_loss", "cross_entropy"]) {
        "loss"
    } else if has(&["embedding", "index_select", "index_add", "gather", "scatter"]) {
        "embedding"
    } else if has(&["copy", "contiguous", "clone", "to_copy", "cat", "stack", "unsafe_split", "chunk", "memcpy"]) {
        "copies"
    } else if has(&["empty", "zeros", "zero_", "fill_", "resize", "ones", "memset"]) {
        "allocation"
    } else if has(&["add", "mul", "div", "sub", "sum", "mean", "dropout", "where", "masked", "sqrt", "pow"]) {
        "elementwise"
    } else {
        "other"
    }
}

/// Self time (ns) of each recorded operator: its duration minus that of the calls nested directly in it on
/// the same thread. Returns (name, total self ns) for every CPU-side name.
pub fn self_times(events: &[crate::train::native::ProfiledOp]) -> Vec<(String, f64)> {
    use std::collections::{BTreeMap, HashMap};
    let mut by_thread: BTreeMap<u64, Vec<usize>> = BTreeMap::new();
    for (i, e) in events.iter().enumerate().filter(|(_, e)| e.on_cpu) {
        by_thread.entry(e.thread).or_default().push(i);
    }
    let mut own: Vec<f64> = events.iter().map(|e| e.duration_ns as f64).collect();
    for indices in by_thread.values_mut() {
        // Callers first: earlier start, and among equal starts the longer call.
        indices.sort_by_key(|&i| (events[i].start_ns, std::cmp::Reverse(events[i].duration_ns)));
        let mut open: Vec<usize> = Vec::new();
        for &i in indices.iter() {
            let start = events[i].start_ns;
            while let Some(&top) = open.last() {
                if events[top].start_ns + events[top].duration_ns <= start {
                    open.pop();
                } else {
                    break;
                }
            }
            if let Some(&parent) = open.last() {
                own[parent] -= events[i].duration_ns as f64;
            }
            open.push(i);
        }
    }
    let mut totals: HashMap<&str, f64> = HashMap::new();
    for (i, e) in events.iter().enumerate().filter(|(_, e)| e.on_cpu) {
        *totals.entry(e.name.as_str()).or_default() += own[i].max(0.0);
    }
    totals.into_iter().map(|(k, v)| (k.to_string(), v)).collect()
}

/// The reads of a value to the host (`aten::_local_scalar_dense`, behind `item()` / `double_value`) that
/// ablate's own code made, each a wait for a GPU: those called directly (inside nothing but `aten::item`),
/// not those made inside a CPU kernel (the CPU's fused AdamW reads its step count, `multinomial` checks its
/// input), whose CUDA kernels read nothing back.
pub fn host_reads(events: &[crate::train::native::ProfiledOp]) -> usize {
    let by_ablate = |read: &crate::train::native::ProfiledOp| {
        let end = read.start_ns + read.duration_ns;
        events
            .iter()
            .filter(|o| {
                o.on_cpu && o.thread == read.thread && o.start_ns <= read.start_ns && o.start_ns + o.duration_ns >= end
            })
            .filter(|o| !std::ptr::eq(*o, read))
            .all(|o| o.name == "aten::item")
    };
    events.iter().filter(|e| e.on_cpu && e.name == "aten::_local_scalar_dense" && by_ablate(e)).count()
}

/// Total duration (ns) of each GPU kernel name the profiler recorded.
pub fn kernel_times(events: &[crate::train::native::ProfiledOp]) -> Vec<(String, f64)> {
    let mut totals: std::collections::HashMap<&str, f64> = std::collections::HashMap::new();
    for e in events.iter().filter(|e| !e.on_cpu) {
        *totals.entry(e.name.as_str()).or_default() += e.duration_ns as f64;
    }
    totals.into_iter().map(|(k, v)| (k.to_string(), v)).collect()
}

/// Profiles `b`'s training step: `b.steps` steps timed phase by phase (forward with the loss; zeroing
/// gradients and backward; clipping, the fused AdamW update and the loss-scale bookkeeping), then a few more
/// under libtorch's profiler for the operator classes (the profiler's own overhead stays out of the phases).
pub fn profile(b: &BenchConfig, device: Device) -> anyhow::Result<Profile> {
    let Setup { model, mut opt, x, y, spec, .. } = setup(b, device);
    let _autocast = precision::autocast(b.precision, device);
    let mut scaler = LossScaler::for_precision(b.precision);
    for _ in 0..b.warmup {
        backward_and_step(&model.loss(&x, &y, true).1, &mut opt, 1e-3, Some(1.0), &mut scaler);
    }
    let mut phase = [0.0f64; 3];
    let step = |phase: &mut [f64; 3], opt: &mut AdamW, scaler: &mut LossScaler| {
        let t = Instant::now();
        let loss = model.loss(&x, &y, true).1;
        synchronize(device);
        phase[0] += t.elapsed().as_secs_f64();
        let t = Instant::now();
        backward_scaled(&loss, opt, scaler);
        synchronize(device);
        phase[1] += t.elapsed().as_secs_f64();
        let t = Instant::now();
        optimiser_step(opt, 1e-3, Some(1.0), scaler);
        // No read of the loss: the training loop reads it only at log steps, and the host reads counted
        // below are then the step's own.
        drop(loss);
        synchronize(device);
        phase[2] += t.elapsed().as_secs_f64();
    };
    let start = Instant::now();
    for _ in 0..b.steps {
        step(&mut phase, &mut opt, &mut scaler);
    }
    let secs = start.elapsed().as_secs_f64();
    let profiled_steps = b.steps.clamp(1, 5);
    let mut scratch = [0.0f64; 3];
    let ((), events) = crate::train::native::profile(device.is_cuda(), || {
        for _ in 0..profiled_steps {
            step(&mut scratch, &mut opt, &mut scaler);
        }
    })?;
    let per_step = |ns: f64| ns / 1e6 / profiled_steps as f64;
    let count_per_step = |n: usize| n as f64 / profiled_steps as f64;
    let kernels = events.iter().filter(|e| e.on_cpu != device.is_cuda()).count();
    let host_reads = host_reads(&events);
    // On a GPU the time is the kernels' (the CPU side only launches them); on the CPU, operator self times.
    let timeline = if device.is_cuda() { kernel_times(&events) } else { self_times(&events) };
    let mut classes: Vec<OpClass> = Vec::new();
    for (name, ns) in timeline {
        let class = op_class(&name);
        let entry = match classes.iter().position(|c| c.name == class) {
            Some(i) => &mut classes[i],
            None => {
                classes.push(OpClass { name: class, ms: 0.0, ops: Vec::new() });
                classes.last_mut().expect("just pushed")
            }
        };
        entry.ms += per_step(ns);
        entry.ops.push((name, per_step(ns)));
    }
    for c in &mut classes {
        c.ops.sort_by(|a, b| b.1.total_cmp(&a.1));
    }
    classes.sort_by(|a, b| b.ms.total_cmp(&a.ms));
    let m = &b.model;
    let tokens = (m.batch * m.block) as f64;
    // Weight matmuls: every parameter but the position table takes part in one multiply-add per token
    // forward and two backward; attention's QKᵀ and AV add 12·L·T·inner FLOPs per token over the step.
    let matmul_params = (opt.num_params() - m.block * m.d_model) as f64;
    let matmul_flops = 6.0 * matmul_params * tokens;
    let attention_flops = 12.0 * (spec.layers * m.block * spec.attention.inner()) as f64 * tokens;
    let ms = |s: f64| s * 1000.0 / b.steps as f64;
    let kernel_ms: f64 = kernel_times(&events).iter().map(|(_, ns)| per_step(*ns)).sum();
    Ok(Profile {
        kernels_per_step: count_per_step(kernels),
        host_reads_per_step: count_per_step(host_reads),
        busy_share: if device.is_cuda() { kernel_ms / ms(secs) } else { f64::NAN },
        tokens_per_s: b.steps as f64 * tokens / secs,
        step_ms: ms(secs),
        phases: vec![("forward", ms(phase[0])), ("backward", ms(phase[1])), ("optimiser", ms(phase[2]))],
        classes,
        matmul_flops,
        step_flops: matmul_flops + attention_flops,
        peak: precision::matmul_peak(device, b.precision),
    })
}

/// The profile as text: phases, classes (with their three largest operators), MFU and the matmul rate.
pub fn profile_report(p: &Profile, label: &str) -> String {
    let mut out = format!(
        "ablate profile {label}: {:.0} tokens/s, {:.2} ms/step, MFU {:.3} (peak {:.1} GFLOP/s); weight matmuls at {:.1} GFLOP/s ({:.0}% of peak)\n",
        p.tokens_per_s,
        p.step_ms,
        p.mfu(),
        p.peak / 1e9,
        p.matmul_rate() / 1e9,
        100.0 * p.matmul_rate() / p.peak
    );
    let busy = match p.busy_share.is_finite() {
        true => format!(", GPU busy {:.0}% of the step", 100.0 * p.busy_share),
        false => String::new(),
    };
    out.push_str(&format!(
        "per step: {:.0} kernels (operators on the CPU), {:.2} host reads{busy}\n",
        p.kernels_per_step, p.host_reads_per_step
    ));
    out.push_str("phase        ms/step  share\n");
    for (name, ms) in &p.phases {
        out.push_str(&format!("{name:<12} {ms:>7.2}  {:>4.1}%\n", 100.0 * ms / p.step_ms));
    }
    let total: f64 = p.classes.iter().map(|c| c.ms).sum();
    out.push_str("class (profiler self time)  ms/step  share  largest operators\n");
    for c in &p.classes {
        let top: Vec<String> = c.ops.iter().take(3).map(|(n, t)| format!("{n} {t:.2}")).collect();
        out.push_str(&format!("{:<27} {:>7.2}  {:>4.1}%  {}\n", c.name, c.ms, 100.0 * c.ms / total, top.join(", ")));
    }
    out
}

/// The profile as CSV: `config,kind,name,ms_per_step,share` for every phase, class and operator, then
/// `summary` rows (tokens/s, MFU, peak and matmul GFLOP/s).
pub fn profile_csv(p: &Profile, label: &str) -> String {
    let mut out = String::from("config,kind,name,ms_per_step,share\n");
    let q = |s: &str| if s.contains([',', '"']) { format!("\"{}\"", s.replace('"', "\"\"")) } else { s.to_string() };
    for (name, ms) in &p.phases {
        out.push_str(&format!("{label},phase,{name},{ms:.4},{:.4}\n", ms / p.step_ms));
    }
    let total: f64 = p.classes.iter().map(|c| c.ms).sum();
    for c in &p.classes {
        out.push_str(&format!("{label},class,{},{:.4},{:.4}\n", c.name, c.ms, c.ms / total));
        for (name, t) in &c.ops {
            out.push_str(&format!("{label},op:{},{},{t:.4},{:.4}\n", c.name, q(name), t / total));
        }
    }
    for (name, v) in [
        ("tokens_per_s", p.tokens_per_s),
        ("step_ms", p.step_ms),
        ("kernels_per_step", p.kernels_per_step),
        ("host_reads_per_step", p.host_reads_per_step),
        ("busy_share", p.busy_share),
        ("mfu", p.mfu()),
        ("peak_gflops", p.peak / 1e9),
        ("matmul_gflops", p.matmul_rate() / 1e9),
    ] {
        out.push_str(&format!("{label},summary,{name},{v:.4},\n"));
    }
    out
}

/// Generation throughput of the same model (random weights: speed does not depend on what they say):
/// `new_tokens` greedy tokens after a 16-token prompt, with or without the KV cache. The context holds
/// prompt and continuation, so the uncached path recomputes the whole sequence at every step and the
/// cached one feeds one position.
pub fn generation(b: &BenchConfig, new_tokens: usize, cached: bool, device: Device) -> f64 {
    const PROMPT: usize = 16;
    let m = &b.model;
    let spec = m.spec((PROMPT + new_tokens) as i64);
    tch::manual_seed(0);
    let vs = tch::nn::VarStore::new(device);
    let model = Gpt::new(&vs.root(), &spec, m.vocab);
    let prompt: Vec<i64> = (0..PROMPT as i64).map(|i| (i * 7) % m.vocab).collect();
    let _autocast = precision::autocast(b.precision, device);
    let decode =
        |n: usize| crate::models::decode::generate(&model, &prompt, n, crate::models::decode::Decoding::Greedy, cached);
    decode(8.min(new_tokens)); // warm-up
    let start = Instant::now();
    let out = decode(new_tokens);
    if let Device::Cuda(i) = device {
        tch::Cuda::synchronize(i as i64);
    }
    assert_eq!(out.len(), PROMPT + new_tokens);
    new_tokens as f64 / start.elapsed().as_secs_f64()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::train::native::ProfiledOp;

    fn op(name: &str, thread: u64, start_ns: u64, duration_ns: u64) -> ProfiledOp {
        ProfiledOp { name: name.into(), thread, start_ns, duration_ns, on_cpu: true }
    }

    #[test]
    fn self_time_is_duration_minus_directly_nested_calls_on_the_same_thread() {
        // linear [0, 100) holds t [0, 10) and addmm [10, 90), which holds empty [20, 25); on another thread an
        // overlapping mm [50, 80) is nobody's child.
        let events = vec![
            op("aten::linear", 1, 0, 100),
            op("aten::t", 1, 0, 10),
            op("aten::addmm", 1, 10, 80),
            op("aten::empty", 1, 20, 5),
            op("aten::mm", 2, 50, 30),
            op("aten::addmm", 1, 200, 40),
        ];
        let mut times = self_times(&events);
        times.sort_by(|a, b| a.0.cmp(&b.0));
        let get = |n: &str| times.iter().find(|(k, _)| k == n).unwrap().1;
        assert_eq!(get("aten::linear"), 10.0);
        assert_eq!(get("aten::t"), 10.0);
        assert_eq!(get("aten::addmm"), 75.0 + 40.0);
        assert_eq!(get("aten::empty"), 5.0);
        assert_eq!(get("aten::mm"), 30.0);
        // Self times add up to the busy time of each thread.
        assert_eq!(times.iter().map(|t| t.1).sum::<f64>(), 100.0 + 40.0 + 30.0);
    }

    #[test]
    fn a_profiled_step_counts_its_kernels_and_reads_nothing_back_to_the_host() {
        let model = BenchModel { layers: 1, heads: 2, d_model: 16, block: 8, batch: 2, vocab: 11 };
        let b = BenchConfig { model, warmup: 1, steps: 2, precision: Precision::Fp32 };
        let p = profile(&b, Device::Cpu).unwrap();
        // Forward, backward and the fused update of a one-layer model: hundreds of operators, none of them a
        // read of a value to the host (the clip and the update stay on the device).
        assert!(p.kernels_per_step > 100.0, "{}", p.kernels_per_step);
        assert_eq!(p.host_reads_per_step, 0.0);
        assert!(p.busy_share.is_nan(), "no GPU timeline on the CPU");
        let report = profile_report(&p, "t");
        assert!(report.contains("kernels (operators on the CPU), 0.00 host reads"), "{report}");
    }

    #[test]
    fn operators_fall_into_their_classes() {
        for (name, class) in [
            ("aten::addmm", "matmul"),
            ("aten::mm", "matmul"),
            ("aten::bmm", "matmul"),
            ("aten::_scaled_dot_product_flash_attention_for_cpu", "attention"),
            ("aten::_scaled_dot_product_flash_attention_for_cpu_backward", "attention"),
            ("aten::native_layer_norm_backward", "norm"),
            ("aten::gelu_backward", "activation"),
            ("aten::_log_softmax_backward_data", "loss"),
            ("aten::nll_loss_forward", "loss"),
            ("aten::_fused_adamw_", "optimiser"),
            ("aten::embedding_dense_backward", "embedding"),
            ("aten::copy_", "copies"),
            ("aten::empty_strided", "allocation"),
            ("aten::add_", "elementwise"),
            ("autograd::engine::evaluate_function: AddmmBackward0", "autograd"),
            ("AddmmBackward0", "autograd"),
            ("sm90_xmma_gemm_f32f32_tf32f32_f32_tn_n_tilesize128x128x32", "matmul"),
            ("void pytorch_flash::flash_fwd_kernel<Flash_fwd_kernel_traits>", "attention"),
            ("void at::native::(anonymous namespace)::vectorized_layer_norm_kernel<float>", "norm"),
            ("Memcpy DtoD (Device -> Device)", "copies"),
            ("Memset (Device)", "allocation"),
        ] {
            assert_eq!(op_class(name), class, "{name}");
        }
    }
}
