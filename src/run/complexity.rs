//! Sequence-length complexity curves: time and memory of one attention unit against N, per pattern and
//! implementation, forward and forward+backward, with the empirical exponent (log-log slope) fitted. The
//! same benchmark measures whole vision models against image resolution (variants naming a `preset`):
//! ViT's global attention against Swin's and DaViT's windows.
//!
//! Every point runs in a child process (`ablate complexity-point`), so its peak memory is its own: on the CPU
//! the child reads its resident-set high-water mark (`VmHWM`), on a GPU the CUDA caching allocator's peak
//! (reset before the first call, synchronised timings), and a point that runs out of memory or time is
//! killed and recorded as such while the sweep goes on.
use anyhow::{anyhow, bail, Context, Result};
use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use std::io::Write;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};
use tch::{nn, Device, Kind as DType, Tensor};

use crate::judge::plot::{loglog_chart, Axes, Series};
use crate::recipe::presets::{preset, PRESETS};
use crate::recipe::{Config, Implementation, Kind, PatternConfig};
use crate::tasks::task;
use crate::transformer::attention::{Mask, MultiHeadAttention};
use crate::transformer::spec::{AttentionSpec, PositionEncoding, PositionSpec};

/// A `complexity` recipe: a benchmark, not a training sweep.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ComplexityRecipe {
    pub name: Option<String>,
    pub description: Option<String>,
    pub complexity: ComplexitySpec,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ComplexitySpec {
    /// Sequence lengths N to measure (for vision variants: image sides in pixels).
    pub lengths: Vec<i64>,
    #[serde(default = "d_model")]
    pub d_model: i64,
    #[serde(default = "four")]
    pub heads: i64,
    #[serde(default = "one")]
    pub batch: i64,
    /// Causal (decoder) attention.
    #[serde(default)]
    pub causal: bool,
    pub variants: Vec<Variant>,
    /// `forward` and/or `forward_backward`.
    pub passes: Vec<Pass>,
    #[serde(default = "three")]
    pub repeats: usize,
    #[serde(default = "one_usize")]
    pub warmup: usize,
    /// A point still running after this long is killed and recorded as `timeout`.
    #[serde(default = "sixty")]
    pub timeout_s: f64,
    /// A point whose resident memory passes this is killed and recorded as `out_of_memory`.
    #[serde(default = "eight")]
    pub memory_limit_gb: f64,
}

fn one() -> i64 {
    1
}
fn four() -> i64 {
    4
}
fn d_model() -> i64 {
    256
}
fn one_usize() -> usize {
    1
}
fn three() -> usize {
    3
}
fn sixty() -> f64 {
    60.0
}
fn eight() -> f64 {
    8.0
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Variant {
    pub label: String,
    #[serde(default)]
    pub pattern: PatternConfig,
    #[serde(default = "auto")]
    pub implementation: Implementation,
    /// A vision model preset (`ablate describe --list`) measured whole on images of side N: the variant's
    /// `pattern` and `implementation` and the spec's `d_model`/`heads` do not apply.
    #[serde(default)]
    pub preset: Option<String>,
    /// Causal (decoder) attention for this variant, overriding the spec's `causal`: a query sees only the
    /// keys up to itself, half of the interactions.
    #[serde(default)]
    pub causal: Option<bool>,
}

fn auto() -> Implementation {
    Implementation::Auto
}

#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum Pass {
    Forward,
    ForwardBackward,
}

impl Pass {
    fn name(self) -> &'static str {
        match self {
            Pass::Forward => "forward",
            Pass::ForwardBackward => "forward_backward",
        }
    }
}

/// What a child process measures for one point.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct PointSpec {
    pub n: i64,
    pub d_model: i64,
    pub heads: i64,
    pub batch: i64,
    pub causal: bool,
    pub pattern: PatternConfig,
    pub implementation: Implementation,
    pub pass: Pass,
    pub repeats: usize,
    pub warmup: usize,
    /// A whole vision model (its `vision.image_size` is N) instead of one attention unit.
    #[serde(default)]
    pub model: Option<Config>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct PointResult {
    pub median_ms: f64,
    pub min_ms: f64,
    /// Peak resident memory of the whole process (libtorch included).
    pub peak_mb: f64,
    /// Peak minus the resident memory just before the first attention call: what the computation itself used.
    pub working_mb: f64,
}

/// A vision preset at image side `n`.
fn preset_at(name: &str, n: i64) -> Option<Config> {
    let mut cfg = preset(name)?;
    if let Some(v) = cfg.vision.as_mut() {
        v.image_size = n;
    }
    Some(cfg)
}

impl ComplexitySpec {
    /// Every problem with the benchmark, as (recipe path of the offending key, message): attention variants
    /// are checked as a Transformer section of that width and length would be.
    pub fn validate(&self) -> std::result::Result<(), (String, String)> {
        let at = |key: &str, message: String| Err((format!("complexity.{key}"), message));
        if self.lengths.is_empty() || self.lengths.iter().any(|&n| !(2..=1 << 24).contains(&n)) {
            return at("lengths", "give at least one length, each in 2..=16777216".into());
        }
        if self.variants.is_empty() || self.passes.is_empty() {
            return at("variants", "complexity.variants and complexity.passes must not be empty".into());
        }
        let vision = self.variants.iter().filter(|v| v.preset.is_some()).count();
        if vision > 0 && vision < self.variants.len() {
            return at(
                "variants",
                "vision presets (measured against image side) and attention units (against sequence length) need separate recipes".into(),
            );
        }
        for (i, v) in self.variants.iter().enumerate() {
            let key = format!("variants.{i}");
            if let Some(name) = &v.preset {
                if v.causal.is_some() {
                    return at(
                        &key,
                        format!("`{}`: `causal` applies to attention units; vision presets attend both ways", v.label),
                    );
                }
                let Some(base) = preset(name) else {
                    return at(&key, format!("no preset `{name}`; presets: {}", PRESETS.join(", ")));
                };
                if base.kind == Kind::ImageGpt {
                    return at(&key, format!("`{}`: measure classifiers (ViT, Swin, DaViT)", v.label));
                }
                for &n in &self.lengths {
                    let cfg = preset_at(name, n).expect("listed above");
                    if let Err(e) = cfg.validate_vision_model() {
                        return at(&key, format!("`{}` at image side {n}: {}: {}", v.label, e.key, e.message));
                    }
                }
                continue;
            }
            // Checked as a Transformer over the longest length: a window may cover the shorter ones (that
            // is where the sparse kernel's overhead shows), not every one.
            let longest = self.lengths.iter().copied().max().unwrap_or(2);
            let mut cfg = Config::defaults(Kind::Lm);
            cfg.transformer.d_model = self.d_model;
            cfg.transformer.heads = self.heads;
            cfg.transformer.block_size = longest;
            cfg.transformer.pe = PositionEncoding::None;
            cfg.transformer.attention.implementation = v.implementation;
            cfg.transformer.attention.pattern = v.pattern.clone();
            if let Err(e) = cfg.validate_transformer() {
                let key = if e.key.contains("heads") || e.key.contains("d_model") { "heads".into() } else { key };
                return at(&key, format!("`{}` at N = {longest}: {}: {}", v.label, e.key, e.message));
            }
        }
        if self.repeats < 1 || self.timeout_s <= 0.0 || self.memory_limit_gb <= 0.0 {
            return at("repeats", "repeats, timeout_s and memory_limit_gb must be positive".into());
        }
        Ok(())
    }

    /// The measurement of `variant` at length `n`.
    pub fn point(&self, variant: &Variant, pass: Pass, n: i64) -> PointSpec {
        PointSpec {
            n,
            d_model: self.d_model,
            heads: self.heads,
            batch: self.batch,
            causal: variant.causal.unwrap_or(self.causal),
            pattern: variant.pattern.clone(),
            implementation: variant.implementation,
            pass,
            repeats: self.repeats,
            warmup: self.warmup,
            model: variant.preset.as_deref().and_then(|name| preset_at(name, n)),
        }
    }

    /// Whether the variants are vision models (lengths are image sides).
    pub fn is_vision(&self) -> bool {
        self.variants.iter().any(|v| v.preset.is_some())
    }

    /// The `--smoke` form: the three shortest lengths (at most 256 tokens; vision: the two smallest images),
    /// one repeat.
    pub fn shrink_for_smoke(&mut self) {
        self.lengths.sort();
        if self.is_vision() {
            self.lengths.truncate(2);
        } else {
            self.lengths.truncate(3);
            self.lengths.iter_mut().for_each(|n| *n = (*n).min(256));
        }
        self.lengths.dedup();
        self.repeats = 1;
        self.warmup = 0;
    }
}

pub fn load(path: &Path, smoke: bool) -> Result<ComplexityRecipe> {
    let text = std::fs::read_to_string(path).with_context(|| format!("cannot read {}", path.display()))?;
    let mut recipe: ComplexityRecipe = serde_yaml::from_str(&text).map_err(|e| {
        let line = e.location().map(|l| l.line()).unwrap_or(1);
        anyhow::anyhow!("{}:{}: {}", path.display(), line, e.to_string().split(" at line ").next().unwrap_or(""))
    })?;
    recipe.complexity.validate().map_err(|(key, message)| {
        let line = crate::recipe::lines::LineMap::build(&text).map(|l| l.line(&key)).unwrap_or(1);
        anyhow::anyhow!("{}:{line}: {key}: {message}", path.display())
    })?;
    if smoke {
        recipe.complexity.shrink_for_smoke();
    }
    Ok(recipe)
}

/// Whether a recipe file is a complexity benchmark (it has a top-level `complexity:` section).
pub fn is_complexity_recipe(path: &Path) -> bool {
    std::fs::read_to_string(path)
        .ok()
        .and_then(|t| serde_yaml::from_str::<serde_yaml::Value>(&t).ok())
        .is_some_and(|v| v.get("complexity").is_some())
}

/// Attention FLOPs of one point as implemented (multiply-adds count 2): the projections, the scores and the
/// weighted sum. Mask-based patterns compute every score; the sparse kernel computes span·w per query plus
/// the global rows and columns. Backward is counted as twice the forward.
pub fn analytic_flops(s: &PointSpec) -> f64 {
    if let Some(cfg) = &s.model {
        let forward = s.batch as f64 * task(cfg.kind).forward_flops(cfg, 0, 0).0;
        return match s.pass {
            Pass::Forward => forward,
            Pass::ForwardBackward => 3.0 * forward,
        };
    }
    let (b, n, d) = (s.batch as f64, s.n as f64, s.d_model as f64);
    let projections = 2.0 * b * n * d * 4.0 * d;
    let keys_per_query = if s.implementation == Implementation::Sparse {
        let w = s.pattern.window.unwrap_or(0) as f64;
        let span = if s.causal { 2.0 } else { 3.0 };
        let globals = s.pattern.spec().global_positions(s.n).len() as f64;
        span * w + globals + globals // a column per global key, plus each global query's full row (≈ N/N·g)
    } else if s.causal && s.pattern.spec().is_dense() && s.implementation != Implementation::Explicit {
        // The fused kernel's causal path skips the key blocks after each query block: about half.
        (n + 1.0) / 2.0
    } else {
        n
    };
    let attention = 2.0 * 2.0 * b * n * keys_per_query * d;
    let forward = projections + attention;
    match s.pass {
        Pass::Forward => forward,
        Pass::ForwardBackward => 3.0 * forward,
    }
}

/// Runs one point in this process (the child side). Prints nothing; returns the measurements.
pub fn measure_point(s: &PointSpec, device: Device) -> PointResult {
    tch::manual_seed(0);
    let vs = nn::VarStore::new(device);
    let backward = s.pass == Pass::ForwardBackward;
    if let Some(cfg) = &s.model {
        let model = task(cfg.kind).build(cfg, &vs.root(), 0);
        return time_steps(s, device, || {
            if backward {
                model.forward_example(s.batch, true, device).sum(DType::Float).backward();
            } else {
                let _guard = tch::no_grad_guard();
                let _ = model.forward_example(s.batch, false, device);
            }
        });
    }
    let spec = AttentionSpec {
        implementation: s.implementation,
        pattern: s.pattern.spec(),
        ..AttentionSpec::standard(s.d_model, s.heads)
    };
    let mha =
        MultiHeadAttention::new(vs.root(), s.d_model, &spec, &PositionSpec::of(PositionEncoding::None), None, 0.02);
    let x = Tensor::randn([s.batch, s.n, s.d_model], (DType::Float, device)).set_requires_grad(backward);
    let mask = Mask { causal: s.causal, key_padding: None, offset: 0, bias: None };
    time_steps(s, device, || {
        if backward {
            let out = mha.self_attend(&x, &mask, None, true, false).output;
            out.sum(DType::Float).backward();
        } else {
            let _guard = tch::no_grad_guard();
            let _ = mha.self_attend(&x, &mask, None, false, false).output;
        }
    })
}

/// Median and fastest time of `s.repeats` calls of `step` after `s.warmup` unmeasured ones, and the
/// process's peak memory above what it held before the first call.
fn time_steps(s: &PointSpec, device: Device, step: impl Fn()) -> PointResult {
    let step = || {
        step();
        if let Device::Cuda(i) = device {
            tch::Cuda::synchronize(i as i64);
        }
    };
    // On a GPU the memory is the CUDA caching allocator's (peaks reset here, so neither the model's set-up
    // nor another point counts); on the CPU the process's resident set.
    let gpu = match device {
        Device::Cuda(i) => Some(i),
        _ => None,
    };
    let gpu_bytes = |i: usize| crate::train::native::cuda_peak_memory(i).map_or(f64::NAN, |(a, _)| a as f64);
    let baseline_kb = match gpu {
        Some(i) => {
            let _ = crate::train::native::reset_cuda_peak_memory(i);
            gpu_bytes(i) / 1024.0
        }
        None => crate::train::memory::status_kb("/proc/self/status", "VmRSS:").unwrap_or(f64::NAN),
    };
    for _ in 0..s.warmup {
        step();
    }
    let mut times: Vec<f64> = (0..s.repeats)
        .map(|_| {
            let t = Instant::now();
            step();
            t.elapsed().as_secs_f64() * 1000.0
        })
        .collect();
    times.sort_by(f64::total_cmp);
    let peak_kb = match gpu {
        Some(i) => gpu_bytes(i) / 1024.0,
        None => crate::train::memory::status_kb("/proc/self/status", "VmHWM:").unwrap_or(f64::NAN),
    };
    PointResult {
        median_ms: times[times.len() / 2],
        min_ms: times[0],
        peak_mb: peak_kb / 1024.0,
        working_mb: (peak_kb - baseline_kb) / 1024.0,
    }
}

/// How a point ended.
#[derive(Debug, Clone)]
pub enum Outcome {
    Ok(PointResult),
    Timeout,
    OutOfMemory,
    Failed(String),
}

/// Runs one point in a child process, killing it past the time or memory limit.
fn run_child(exe: &Path, s: &PointSpec, device: &str, timeout: Duration, memory_limit_kb: f64) -> Result<Outcome> {
    let mut child = Command::new(exe)
        .args(["complexity-point", "--device", device, "--spec", &serde_json::to_string(s)?])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .context("starting a complexity-point child process")?;
    let pid = child.id();
    let started = Instant::now();
    loop {
        if let Some(status) = child.try_wait()? {
            let out = child.wait_with_output()?;
            if !status.success() {
                let err = String::from_utf8_lossy(&out.stderr);
                let last = err.lines().find(|l| l.contains("error") || l.contains("Error")).unwrap_or("").trim();
                // An allocation that did not fit, not any message naming memory ("an illegal memory access"
                // is a fault, reported as one).
                if crate::tasks::memory::is_out_of_memory(&err) {
                    return Ok(Outcome::OutOfMemory);
                }
                return Ok(Outcome::Failed(format!("exit {status}: {last}")));
            }
            let text = String::from_utf8_lossy(&out.stdout);
            let line = text.lines().last().unwrap_or("");
            return Ok(Outcome::Ok(serde_json::from_str(line).with_context(|| format!("child printed {line:?}"))?));
        }
        let rss_kb = crate::train::memory::status_kb(&format!("/proc/{pid}/status"), "VmRSS:").unwrap_or(0.0);
        if rss_kb > memory_limit_kb {
            let _ = child.kill();
            let _ = child.wait();
            return Ok(Outcome::OutOfMemory);
        }
        if started.elapsed() > timeout {
            let _ = child.kill();
            let _ = child.wait();
            return Ok(Outcome::Timeout);
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Least-squares slope of log(y) against log(x): the empirical complexity exponent.
pub fn loglog_slope(points: &[(f64, f64)]) -> Option<f64> {
    if points.len() < 2 {
        return None;
    }
    let logs: Vec<(f64, f64)> = points.iter().map(|&(x, y)| (x.ln(), y.ln())).collect();
    let n = logs.len() as f64;
    let mx = logs.iter().map(|p| p.0).sum::<f64>() / n;
    let my = logs.iter().map(|p| p.1).sum::<f64>() / n;
    let sxy: f64 = logs.iter().map(|p| (p.0 - mx) * (p.1 - my)).sum();
    let sxx: f64 = logs.iter().map(|p| (p.0 - mx).powi(2)).sum();
    (sxx > 0.0).then(|| sxy / sxx)
}

/// The slope over the largest lengths that finished (up to four): where the asymptotic cost shows, past the
/// fixed costs that flatten short sequences.
fn tail_slope(points: &[(f64, f64)]) -> Option<f64> {
    let start = points.len().saturating_sub(4);
    loglog_slope(&points[start..])
}

struct Row {
    variant: String,
    pass: Pass,
    spec: PointSpec,
    outcome: Outcome,
}

/// Runs every point, each in a child process of `exe` (the `ablate` binary), and writes `points.csv`,
/// `slopes.csv` and the log-log plots into `out`.
pub fn run(recipe: &ComplexityRecipe, exe: &Path, out: &Path, device: &str, quiet: bool) -> Result<()> {
    let spec = &recipe.complexity;
    let name = recipe.name.clone().unwrap_or_else(|| "complexity".into());
    std::fs::create_dir_all(out).with_context(|| format!("cannot create {}", out.display()))?;
    let mut rows: Vec<Row> = Vec::new();
    let total = spec.variants.len() * spec.passes.len() * spec.lengths.len();
    let mut k = 0;
    for variant in &spec.variants {
        for &pass in &spec.passes {
            let mut failed = false;
            for &n in &spec.lengths {
                k += 1;
                let point = spec.point(variant, pass, n);
                // Once a point ran out of memory or time, longer ones will too: record them without running.
                let outcome = if failed {
                    Outcome::Failed("skipped after a shorter length failed".into())
                } else {
                    run_child(
                        exe,
                        &point,
                        device,
                        Duration::from_secs_f64(spec.timeout_s),
                        spec.memory_limit_gb * 1024.0 * 1024.0,
                    )?
                };
                if !matches!(outcome, Outcome::Ok(_)) {
                    failed = true;
                }
                if !quiet {
                    let what = match &outcome {
                        Outcome::Ok(r) => {
                            format!("{:.2} ms, peak {:.0} MB (+{:.0} MB)", r.median_ms, r.peak_mb, r.working_mb)
                        }
                        Outcome::Timeout => "timeout".into(),
                        Outcome::OutOfMemory => "out of memory".into(),
                        Outcome::Failed(m) => format!("failed: {m}"),
                    };
                    eprintln!("  [{k}/{total}] {} {} N={n}: {what}", variant.label, pass.name());
                }
                rows.push(Row { variant: variant.label.clone(), pass, spec: point, outcome });
            }
        }
    }
    write_csv(&out.join("points.csv"), &rows)?;
    if let Some(why) = all_failed(&rows) {
        // points.csv keeps the record; a benchmark that measured nothing is an error (on a GPU a device
        // mismatch fails every point, and a script must not read that as success).
        bail!("{}: every point failed ({why}); see {}", name, out.join("points.csv").display());
    }
    let slopes = plot_all(out, &name, spec, &rows)?;
    write_slopes(&out.join("slopes.csv"), &slopes)?;
    if !quiet {
        for s in &slopes {
            eprintln!(
                "  {} {}: time slope {:.2}, memory slope {:.2}",
                s.0,
                s.1,
                s.2.unwrap_or(f64::NAN),
                s.3.unwrap_or(f64::NAN)
            );
        }
        eprintln!("ablate: wrote {}", out.display());
    }
    Ok(())
}

/// When not one of `rows` was measured: the first row's outcome, to say why.
fn all_failed(rows: &[Row]) -> Option<String> {
    if rows.is_empty() || rows.iter().any(|r| matches!(r.outcome, Outcome::Ok(_))) {
        return None;
    }
    let first = &rows[0];
    let why = match &first.outcome {
        Outcome::Ok(_) => unreachable!("no row is ok"),
        Outcome::Timeout => "timeout".to_string(),
        Outcome::OutOfMemory => "out of memory".to_string(),
        Outcome::Failed(m) => format!("failed: {m}"),
    };
    Some(format!("first, {} {} N={}: {why}", first.variant, first.pass.name(), first.spec.n))
}

/// Redraws the plots of a finished benchmark from its `points.csv`, matching each row to the recipe's point
/// by variant, pass and length.
pub fn replot(recipe: &ComplexityRecipe, out: &Path) -> Result<()> {
    let spec = &recipe.complexity;
    let name = recipe.name.clone().unwrap_or_else(|| "complexity".into());
    let path = out.join("points.csv");
    let (header, records) =
        crate::judge::reading::table(&path).with_context(|| format!("no benchmark results in {}", out.display()))?;
    let mut measured: HashMap<(String, String, i64), csv::StringRecord> = HashMap::new();
    let column = |name: &str| {
        header.iter().position(|h| h == name).ok_or_else(|| anyhow!("{}: no column {name}", path.display()))
    };
    let (variant_at, pass_at, n_at, status_at) = (column("variant")?, column("pass")?, column("n")?, column("status")?);
    let (median_at, min_at, peak_at, working_at) =
        (column("median_ms")?, column("min_ms")?, column("peak_mb")?, column("working_mb")?);
    for record in records {
        let n: i64 = record[n_at].parse().with_context(|| format!("{}: bad length", path.display()))?;
        measured.insert((record[variant_at].to_string(), record[pass_at].to_string(), n), record);
    }
    let mut rows = Vec::new();
    for variant in &spec.variants {
        for &pass in &spec.passes {
            for &n in &spec.lengths {
                let Some(record) = measured.get(&(variant.label.clone(), pass.name().to_string(), n)) else {
                    bail!(
                        "{} has no point for {} {} N={n}: rerun the benchmark",
                        path.display(),
                        variant.label,
                        pass.name()
                    );
                };
                let number =
                    |i: usize| record[i].parse::<f64>().with_context(|| format!("{}: bad number", path.display()));
                let outcome = match &record[status_at] {
                    "ok" => Outcome::Ok(PointResult {
                        median_ms: number(median_at)?,
                        min_ms: number(min_at)?,
                        peak_mb: number(peak_at)?,
                        working_mb: number(working_at)?,
                    }),
                    "timeout" => Outcome::Timeout,
                    "out_of_memory" => Outcome::OutOfMemory,
                    other => Outcome::Failed(other.trim_start_matches("failed: ").to_string()),
                };
                rows.push(Row { variant: variant.label.clone(), pass, spec: spec.point(variant, pass, n), outcome });
            }
        }
    }
    // slopes.csv stays as measured: points.csv keeps three decimals, so slopes recomputed from it can move
    // in the third decimal; the legends show two.
    plot_all(out, &name, spec, &rows).map(|_| ())
}

fn write_csv(path: &Path, rows: &[Row]) -> Result<()> {
    let mut w = csv::Writer::from_writer(Vec::new());
    w.write_record([
        "variant",
        "implementation",
        "window",
        "dilation",
        "global_every",
        "global_tokens",
        "pass",
        "n",
        "d_model",
        "heads",
        "batch",
        "causal",
        "status",
        "median_ms",
        "min_ms",
        "peak_mb",
        "working_mb",
        "analytic_gflop",
    ])?;
    for r in rows {
        let (status, m) = match &r.outcome {
            Outcome::Ok(p) => ("ok".to_string(), Some(p)),
            Outcome::Timeout => ("timeout".to_string(), None),
            Outcome::OutOfMemory => ("out_of_memory".to_string(), None),
            Outcome::Failed(msg) => (format!("failed: {msg}"), None),
        };
        let f = |x: Option<f64>| x.map(|v| format!("{v:.3}")).unwrap_or_default();
        let p = &r.spec.pattern;
        w.write_record([
            r.variant.clone(),
            format!("{:?}", r.spec.implementation).to_lowercase(),
            p.window.map(|w| w.to_string()).unwrap_or_default(),
            p.dilation.to_string(),
            p.global_every.map(|g| g.to_string()).unwrap_or_default(),
            p.global_tokens.to_string(),
            r.pass.name().to_string(),
            r.spec.n.to_string(),
            r.spec.d_model.to_string(),
            r.spec.heads.to_string(),
            r.spec.batch.to_string(),
            r.spec.causal.to_string(),
            status,
            f(m.map(|m| m.median_ms)),
            f(m.map(|m| m.min_ms)),
            f(m.map(|m| m.peak_mb)),
            f(m.map(|m| m.working_mb)),
            format!("{:.4}", analytic_flops(&r.spec) / 1e9),
        ])?;
    }
    let bytes = w.into_inner().map_err(|e| anyhow::anyhow!("{e}"))?;
    let tmp = path.with_extension("csv.tmp");
    std::fs::File::create(&tmp)?.write_all(&bytes)?;
    std::fs::rename(tmp, path)?;
    Ok(())
}

type Slope = (String, &'static str, Option<f64>, Option<f64>);

fn write_slopes(path: &Path, slopes: &[Slope]) -> Result<()> {
    let mut w = csv::Writer::from_path(path)?;
    w.write_record(["variant", "pass", "time_slope", "memory_slope"])?;
    for (v, p, t, m) in slopes {
        let f = |x: &Option<f64>| x.map(|v| format!("{v:.3}")).unwrap_or_default();
        w.write_record([v.as_str(), p, &f(t), &f(m)])?;
    }
    w.flush()?;
    Ok(())
}

fn plot_all(out: &Path, name: &str, spec: &ComplexitySpec, rows: &[Row]) -> Result<Vec<Slope>> {
    let mut slopes = Vec::new();
    for &pass in &spec.passes {
        let mut time_series = Vec::new();
        let mut memory_series = Vec::new();
        for variant in &spec.variants {
            let ok: Vec<(f64, &PointResult)> = rows
                .iter()
                .filter(|r| r.variant == variant.label && r.pass == pass)
                .filter_map(|r| match &r.outcome {
                    Outcome::Ok(p) => Some((r.spec.n as f64, p)),
                    _ => None,
                })
                .collect();
            let time: Vec<(f64, f64)> = ok.iter().map(|(n, p)| (*n, p.median_ms)).collect();
            let memory: Vec<(f64, f64)> = ok.iter().map(|(n, p)| (*n, p.working_mb.max(0.1))).collect();
            let (ts, ms) = (tail_slope(&time), tail_slope(&memory));
            slopes.push((variant.label.clone(), pass.name(), ts, ms));
            let label = |s: Option<f64>| match s {
                Some(s) => format!("{} (slope {s:.2})", variant.label),
                None => variant.label.clone(),
            };
            if !time.is_empty() {
                time_series.push(Series {
                    label: label(ts),
                    points: time.iter().map(|&(x, y)| (x, y, 0.0)).collect(),
                    ..Default::default()
                });
                memory_series.push(Series {
                    label: label(ms),
                    points: memory.iter().map(|&(x, y)| (x, y, 0.0)).collect(),
                    ..Default::default()
                });
            }
        }
        // Analytic FLOPs of dense and (first) sparse variant, as milliseconds at the fastest measured rate:
        // how far each implementation is from doing only the arithmetic it must.
        let rate = rows
            .iter()
            .filter(|r| r.pass == pass)
            .filter_map(|r| match &r.outcome {
                Outcome::Ok(p) => Some(analytic_flops(&r.spec) / (p.median_ms / 1000.0)),
                _ => None,
            })
            .fold(0.0f64, f64::max);
        let mut flops_series = Vec::new();
        let references: Vec<&Variant> = if spec.is_vision() {
            spec.variants.iter().collect()
        } else {
            spec.variants
                .iter()
                .filter(|v| v.pattern.spec().is_dense())
                .take(1)
                .chain(spec.variants.iter().filter(|v| v.implementation == Implementation::Sparse).take(1))
                .collect()
        };
        let (x_label, against) = if spec.is_vision() {
            ("image side (pixels)", "image side")
        } else {
            ("sequence length N", "sequence length")
        };
        for variant in references {
            let pts: Vec<(f64, f64, f64)> = spec
                .lengths
                .iter()
                .map(|&n| (n as f64, analytic_flops(&spec.point(variant, pass, n)) / rate * 1000.0, 0.0))
                .collect();
            flops_series.push(Series {
                label: format!("FLOPs ÷ {:.0} GFLOP/s, {}", rate / 1e9, variant.label),
                points: pts,
                ..Default::default()
            });
        }
        if rate > 0.0 && !time_series.is_empty() {
            let title = format!("{name}: {} time against {against}", pass.name());
            loglog_chart(
                &out.join(format!("time_{}.png", pass.name())),
                &time_series,
                &flops_series,
                &Axes { title: &title, x_label, y_label: "median time (ms)", x_categories: None },
            )?;
            let title = format!("{name}: {} peak working memory against {against}", pass.name());
            loglog_chart(
                &out.join(format!("memory_{}.png", pass.name())),
                &memory_series,
                &[],
                &Axes { title: &title, x_label, y_label: "peak memory above baseline (MB)", x_categories: None },
            )?;
        }
    }
    Ok(slopes)
}
