//! The wall-clock cost of each arm of a compute ladder (`ablate wall-clock`): every arm's configuration
//! trained for a fixed number of steps, the arms in turn within each repeat (their order alternating from
//! one repeat to the next, so a drift in the machine's speed falls on both alike), in one process on every
//! core, and each run's training throughput in model FLOP/s written to `wall_clock.csv` with the CPU, the
//! threads and the load average before it. The compute section turns an arm's compute-equivalent gain into
//! a wall-clock one with these paired speed ratios (`crate::ceg::wall_gain`); the load average says whether
//! the cores were quiet, which a wall-clock claim needs.
use anyhow::{bail, Context, Result};
use std::path::Path;
use tch::Device;

use crate::judge::reading::arm_of;
use crate::judge::sensitivity::swept_key;
use crate::recipe::{Recipe, RunSpec};
use crate::tasks::{task, DataCache, RunContext};

pub use crate::judge::reading::WALL_CLOCK_FILE as FILE;

/// The columns of `wall_clock.csv`, in order.
pub const COLUMNS: [&str; 10] =
    ["repeat", "arm", "order", "steps", "tokens_per_s", "model_tflops", "threads", "load_at_start", "load_1m", "cpu"];

/// One arm to time: its name (the run's label without the ladder's word) and the run whose configuration it
/// trains (the recipe's first run of that arm: its lowest seed and first rung; the rung does not change the
/// model, only how long it trains).
fn arms(recipe: &Recipe) -> Result<Vec<(String, &RunSpec)>> {
    let Some(compute) = recipe.compare.as_ref().and_then(|c| c.compute.as_ref()) else {
        bail!(
            "{}: `ablate wall-clock` times the arms of a compute ladder; the recipe has no compare.compute",
            recipe.file
        )
    };
    if let Some(sizes) = &compute.sizes {
        bail!(
            "{}: compare.compute.sizes `{sizes}`: `ablate wall-clock` times one configuration per arm, and each arm here \
             has several sizes (time them as separate recipes)",
            recipe.file
        )
    }
    let key = swept_key(recipe, &compute.ladder)
        .with_context(|| format!("{}: compare.compute.ladder `{}` is not a swept key", recipe.file, compute.ladder))?;
    let mut out: Vec<(String, &RunSpec)> = Vec::new();
    for run in &recipe.runs {
        let arm = arm_of(&run.label, &key);
        if !out.iter().any(|(a, _)| *a == arm) {
            out.push((arm, run));
        }
    }
    Ok(out)
}

/// The machine's CPU model as /proc/cpuinfo names it, with "AMX" where its flags have it.
pub fn cpu_name() -> String {
    let info = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let model = info
        .lines()
        .find_map(|l| l.strip_prefix("model name").and_then(|r| r.split_once(':')).map(|(_, v)| v.trim().to_string()))
        .unwrap_or_else(|| "unknown CPU".into());
    let amx = info.lines().any(|l| l.starts_with("flags") && l.split_whitespace().any(|f| f.starts_with("amx")));
    if amx {
        format!("{model} (AMX)")
    } else {
        model
    }
}

/// The one-minute load average (NaN where the system does not say).
fn load_1m() -> f64 {
    std::fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|t| t.split_whitespace().next().and_then(|v| v.parse().ok()))
        .unwrap_or(f64::NAN)
}

/// Times every arm of `recipe`'s compute ladder `repeats` times for `steps` steps each (after one untimed
/// run of each arm), writing `out/wall_clock.csv` once every repeat has finished.
pub fn measure(recipe: &Recipe, out: &Path, steps: i64, repeats: usize, device: Device) -> Result<()> {
    if repeats < 2 {
        bail!("--repeats {repeats}: a speed ratio's interval needs at least 2 repeats");
    }
    let arms = arms(recipe)?;
    if arms.len() < 2 {
        bail!("{}: the compute ladder has one arm; there is nothing to compare", recipe.file);
    }
    let mut configs = Vec::new();
    for (arm, run) in &arms {
        let mut cfg = run.config.clone();
        if steps <= cfg.train.warmup_steps {
            bail!(
                "--steps {steps}: arm `{arm}` warms up for {} steps; time more steps than that",
                cfg.train.warmup_steps
            );
        }
        // A fixed number of steps instead of the rung's budget; one validation batch at the end and no test.
        cfg.train.budget = None;
        cfg.train.steps = steps;
        cfg.train.eval_interval = steps;
        cfg.train.eval_batches = 1;
        cfg.train.skip_test = true;
        cfg.train.checkpoint = false;
        configs.push(cfg);
    }
    let mut data = DataCache::new(out.parent().unwrap_or(Path::new(".")), true);
    for cfg in &configs {
        task(cfg.kind).prepare(cfg, &mut data)?;
    }
    // Before anything of ours runs: whether the cores were quiet (the load during the timing includes its own).
    let load_at_start = load_1m();
    let scratch = tempfile::tempdir().context("a scratch directory for the timing runs' side files")?;
    let time = |i: usize| -> Result<(f64, f64, f64)> {
        let load = load_1m();
        let mut progress = |_: i64, _: f64| {};
        let ctx = RunContext { device, progress: &mut progress, state: None, out: scratch.path(), stem: "timing" };
        let trained = task(configs[i].kind).train(&configs[i], &data, ctx)?;
        let m = &trained.outcome.metrics;
        let get = |k: &str| m.get(k).copied().filter(|v| v.is_finite()).with_context(|| format!("no {k} measured"));
        Ok((get("tokens_per_s")?, get("model_tflops")?, load))
    };
    for (i, (arm, _)) in arms.iter().enumerate() {
        time(i).with_context(|| format!("the untimed first run of arm `{arm}`"))?;
    }
    let (cpu, threads) = (cpu_name(), tch::get_num_threads());
    let mut rows = Vec::new();
    for repeat in 0..repeats {
        let mut order: Vec<usize> = (0..configs.len()).collect();
        if repeat % 2 == 1 {
            order.reverse();
        }
        for (position, &i) in order.iter().enumerate() {
            let (tokens, tflops, load) = time(i).with_context(|| format!("repeat {repeat} of arm `{}`", arms[i].0))?;
            rows.push(vec![
                repeat.to_string(),
                arms[i].0.clone(),
                position.to_string(),
                steps.to_string(),
                format!("{tokens:.1}"),
                format!("{tflops:.6}"),
                threads.to_string(),
                format!("{load_at_start:.2}"),
                format!("{load:.2}"),
                cpu.clone(),
            ]);
            println!(
                "  repeat {repeat}, {}: {tokens:.0} tokens/s, {tflops:.4} model TFLOP/s (load {load:.2} before)",
                arms[i].0
            );
        }
    }
    let mut writer = csv::Writer::from_writer(Vec::new());
    writer.write_record(COLUMNS)?;
    for row in rows {
        writer.write_record(row)?;
    }
    let bytes = writer.into_inner().map_err(|e| anyhow::anyhow!("writing {FILE}: {e}"))?;
    std::fs::create_dir_all(out)?;
    crate::files::write_atomically(&out.join(FILE), &bytes)
}
