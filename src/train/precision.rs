//! Mixed precision and how well a run uses the hardware: autocast per `train.precision`, dynamic loss
//! scaling for fp16, the analytic model FLOPs of a training step, and the measured matmul peak they are
//! compared with (model FLOPs utilisation, MFU).
use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Instant;
use tch::{Device, Kind, Tensor};

use super::native::{AutocastGuard, AutocastType};
use crate::recipe::Precision;

/// Autocast for the run's precision on its device, for as long as the guard lives; `None` for fp32.
pub fn autocast(precision: Precision, device: Device) -> Option<AutocastGuard> {
    let cuda = device.is_cuda();
    match precision {
        Precision::Fp32 => None,
        Precision::Bf16 => Some(AutocastGuard::new(cuda, AutocastType::BFloat16)),
        Precision::Fp16 => Some(AutocastGuard::new(cuda, AutocastType::Float16)),
    }
}

pub fn kind(precision: Precision) -> Kind {
    match precision {
        Precision::Fp32 => Kind::Float,
        Precision::Bf16 => Kind::BFloat16,
        Precision::Fp16 => Kind::Half,
    }
}

/// Why this machine's CPU cannot train `fp16` in useful time (one clause naming what it lacks), or `None`
/// where it can or where `/proc/cpuinfo` cannot say. libtorch runs half precision on the CPU fast only where
/// its kernels have vector half arithmetic or conversions: AVX-512 (a Xeon with AVX-512 and no AMX trained the
/// precision recipe's fp16 arm at 58% of fp32's tokens/s), AVX512-FP16 or AMX-FP16, or ARM's half-precision
/// SIMD. Elsewhere it emulates: on a 2-core AMD EPYC with AVX2 and F16C, an fp16 run of that recipe had not
/// finished after 14 minutes where its fp32 run took 65 s.
pub fn cpu_fp16_refusal() -> Option<String> {
    let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").ok()?;
    fp16_refusal_for(&cpuinfo, std::env::consts::ARCH)
}

/// [`cpu_fp16_refusal`] for a `/proc/cpuinfo` text of an `arch` (`std::env::consts::ARCH`'s names).
pub fn fp16_refusal_for(cpuinfo: &str, arch: &str) -> Option<String> {
    // x86 lists its features under `flags`, ARM under `Features`; every core lists the same.
    let field = |name: &str| {
        cpuinfo.lines().find_map(|l| {
            let (key, value) = l.split_once(':')?;
            (key.trim() == name).then(|| value.split_whitespace().map(str::to_string).collect::<Vec<_>>())
        })
    };
    let model = field("model name").map(|w| w.join(" "));
    let named = model.map_or(String::new(), |m| format!(" ({m})"));
    match arch {
        "x86_64" | "x86" => {
            let flags = field("flags")?;
            let has = |f: &str| flags.iter().any(|x| x == f);
            let avx512 = ["avx512f", "avx512bw", "avx512vl", "avx512dq"].iter().all(|f| has(f));
            (!(avx512 || has("avx512_fp16") || has("amx_fp16"))).then(|| {
                format!("this CPU{named} has neither AVX-512 nor AVX512-FP16 or AMX-FP16 (flags in /proc/cpuinfo)")
            })
        }
        "aarch64" => {
            let features = field("Features")?;
            (!features.iter().any(|x| x == "asimdhp"))
                .then(|| format!("this CPU{named} has no half-precision SIMD (asimdhp in /proc/cpuinfo)"))
        }
        _ => None,
    }
}

/// Dynamic loss scaling (as `torch.amp.GradScaler`): fp16 gradients of small losses underflow, so the loss
/// is multiplied by a large factor before backward and the gradients divided by it before the update. An
/// overflow skips the step and halves the factor; every `growth_interval` clean steps double it.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct LossScaler {
    pub enabled: bool,
    pub scale: f64,
    pub clean_steps: i64,
    pub growth_interval: i64,
}

impl LossScaler {
    /// Scaling for fp16; a fixed factor of 1 (no scaling) otherwise.
    pub fn for_precision(precision: Precision) -> Self {
        let enabled = precision == Precision::Fp16;
        Self { enabled, scale: if enabled { 65536.0 } else { 1.0 }, clean_steps: 0, growth_interval: 2000 }
    }

    /// Updates the factor after a step (`applied` false: the scaled gradient overflowed).
    pub fn update(&mut self, applied: bool) {
        if !self.enabled {
            return;
        }
        if applied {
            self.clean_steps += 1;
            if self.clean_steps % self.growth_interval == 0 {
                self.scale *= 2.0;
            }
        } else {
            self.scale = (self.scale / 2.0).max(1.0);
            self.clean_steps = 0;
        }
    }
}

/// The peaks measured in this process, by device, type and intra-op thread count: the highest measurement
/// of each (a measurement can only come out low, when other work holds the cores).
static PEAKS: Mutex<Option<HashMap<PeakKey, f64>>> = Mutex::new(None);

/// A device (as `Debug` prints it), an element type and an intra-op thread count.
type PeakKey = (String, Kind, i32);

/// Peak matmul throughput of `device` in the precision's type (FLOP/s) at this process's thread count,
/// measured once per process and thread count on square matmuls sized to the device (large enough to reach
/// the peak, small enough to take a second where the type is slow), the best of the three operand layouts a
/// training step uses: the denominator of MFU.
pub fn matmul_peak(device: Device, precision: Precision) -> f64 {
    let key = peak_key(device, precision);
    if let Some(&p) = PEAKS.lock().unwrap_or_else(|p| p.into_inner()).get_or_insert_with(HashMap::new).get(&key) {
        return p;
    }
    matmul_peak_measured_again(device, precision)
}

/// Measures the peak again and keeps the higher of this and any earlier measurement (for a utilisation
/// that came out above 1: the first measurement was made while other work held the cores).
pub fn matmul_peak_measured_again(device: Device, precision: Precision) -> f64 {
    let key = peak_key(device, precision);
    let measured = measure_matmul_peak(device, kind(precision));
    let mut peaks = PEAKS.lock().unwrap_or_else(|p| p.into_inner());
    let peak = peaks.get_or_insert_with(HashMap::new).entry(key).or_insert(0.0);
    *peak = peak.max(measured);
    *peak
}

fn peak_key(device: Device, precision: Precision) -> PeakKey {
    (format!("{device:?}"), kind(precision), tch::get_num_threads())
}

fn measure_matmul_peak(device: Device, kind: Kind) -> f64 {
    let _guard = tch::no_grad_guard();
    let sync = || {
        if let Device::Cuda(i) = device {
            tch::Cuda::synchronize(i as i64);
        }
    };
    // Each operand layout is its own kernel, and they can differ tenfold: on a CPU without bf16 units
    // (oneDNN limited to AVX2) A·B in bf16 runs at 1.5 GFLOP/s and A·Bᵀ — `linear`'s layout — at 16. A step
    // uses all three (forward x·Wᵀ, backward g·W and gᵀ·x), so the peak is the best of them.
    let layouts: [fn(&Tensor, &Tensor) -> Tensor; 3] =
        [|a, b| a.matmul(b), |a, b| a.matmul(&b.tr()), |a, b| a.tr().matmul(b)];
    let timed = |product: fn(&Tensor, &Tensor) -> Tensor, a: &Tensor, b: &Tensor| {
        let t = Instant::now();
        let _ = product(a, b);
        sync();
        t.elapsed().as_secs_f64()
    };
    // The product grows until one takes 50 ms (or reaches the size that saturates the device): big enough
    // for the peak, yet where the type is slow (about 1 GFLOP/s) a layout costs a second here, not a minute.
    let largest: i64 = if device.is_cuda() { 8192 } else { 2048 };
    let rate = |product: fn(&Tensor, &Tensor) -> Tensor| {
        let mut n: i64 = 256;
        let (a, b) = loop {
            let a = Tensor::randn([n, n], (kind, device));
            let b = Tensor::randn([n, n], (kind, device));
            let _ = product(&a, &b);
            sync();
            if n >= largest || timed(product, &a, &b) >= 0.05 {
                break (a, b);
            }
            n *= 2;
        };
        let best = (0..3).map(|_| timed(product, &a, &b)).fold(f64::INFINITY, f64::min);
        2.0 * (n as f64).powi(3) / best
    };
    layouts.into_iter().map(rate).fold(0.0, f64::max)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fp16_on_the_cpu_needs_avx512_or_native_half_arithmetic() {
        let x86 = |flags: &str| format!("processor\t: 0\nmodel name\t: Some CPU\nflags\t\t: fpu sse2 {flags}\n");
        let epyc = fp16_refusal_for(&x86("fma avx f16c avx2"), "x86_64").expect("AVX2 alone is refused");
        assert!(epyc.contains("(Some CPU)") && epyc.contains("AVX-512"), "{epyc}");
        assert!(fp16_refusal_for(&x86("avx2 avx512f avx512dq avx512bw avx512vl"), "x86_64").is_none());
        assert!(fp16_refusal_for(&x86("avx2 avx512f"), "x86_64").is_some(), "AVX-512 Foundation alone");
        assert!(fp16_refusal_for(&x86("avx2 avx512_fp16"), "x86_64").is_none());
        assert!(fp16_refusal_for(&x86("avx2 amx_fp16"), "x86_64").is_none());
        let arm = |features: &str| format!("processor\t: 0\nFeatures\t: fp asimd {features}\n");
        assert!(fp16_refusal_for(&arm("evtstrm aes"), "aarch64").unwrap().contains("asimdhp"));
        assert!(fp16_refusal_for(&arm("fphp asimdhp"), "aarch64").is_none());
        assert!(fp16_refusal_for("", "x86_64").is_none(), "no flags: cannot say, so allowed");
        assert!(fp16_refusal_for(&x86("avx2"), "riscv64").is_none());
    }

    #[test]
    fn the_scaler_halves_on_overflow_and_doubles_after_clean_steps() {
        let mut s = LossScaler::for_precision(Precision::Fp16);
        s.growth_interval = 3;
        s.update(false);
        assert_eq!(s.scale, 32768.0);
        for _ in 0..3 {
            s.update(true);
        }
        assert_eq!(s.scale, 65536.0);
        let mut fp32 = LossScaler::for_precision(Precision::Fp32);
        fp32.update(false);
        assert_eq!(fp32.scale, 1.0);
    }
}
