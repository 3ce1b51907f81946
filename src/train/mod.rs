//! The optimisation loop every kind of run shares: AdamW with warm-up and a decaying schedule, gradient
//! clipping, mixed precision, periodic validation, one test evaluation at the end, divergence detection,
//! resumable state checkpoints, and a stop at a seconds budget. A kind of run supplies an [`Objective`]: a loss on a fresh training batch, and an evaluation.
//!
//! Randomness is a function of (seed, step): the generator is re-seeded before every step's batch and
//! dropout. A run restarted from a checkpoint at step k therefore draws exactly what the uninterrupted run
//! drew after step k, without saving the generator's internal state.
use anyhow::{Context, Result};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Instant;
use tch::{nn, Device, Tensor};

use crate::recipe::{Precision, TrainConfig};

pub mod distributed;
pub mod memory;
pub mod native;
pub mod optim;
pub mod precision;

use distributed::{BatchShard, Group};
use optim::{AdamW, StepReport};
use precision::LossScaler;

/// One point of a learning curve.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct CurvePoint {
    pub step: i64,
    pub split: String,
    pub metric: String,
    pub value: f64,
}

impl CurvePoint {
    pub fn new(step: i64, split: &str, metric: &str, value: f64) -> Self {
        Self { step, split: split.into(), metric: metric.into(), value }
    }
}

/// What one held-out evaluation measured: values by curve key (`val/loss`, `val/accuracy`, …, the keys the
/// kind's metrics declare).
#[derive(Debug, Clone, Default)]
pub struct Evaluation(pub Vec<(&'static str, f64)>);

impl Evaluation {
    pub fn with(mut self, key: &'static str, value: f64) -> Self {
        self.0.push((key, value));
        self
    }

    /// The value of `key`, NaN when this evaluation has none.
    pub fn get(&self, key: &str) -> f64 {
        self.0.iter().find(|(k, _)| *k == key).map_or(f64::NAN, |(_, v)| *v)
    }

    /// Adds this evaluation at `step` to the learning curves.
    pub fn record(&self, step: i64, curves: &mut Vec<CurvePoint>) {
        for (key, value) in &self.0 {
            let (split, metric) = key.split_once('/').unwrap_or(("val", key));
            curves.push(CurvePoint::new(step, split, metric, *value));
        }
    }
}

/// A finished run's measurements.
#[derive(Debug)]
pub struct RunOutcome {
    /// Final values by `runs.csv` column (the kind's metrics and the cost metrics).
    pub metrics: BTreeMap<String, f64>,
    /// The step whose loss was NaN or infinite, if training diverged (the run stops there).
    pub diverged_at: Option<i64>,
    /// The step this process started from (0, or the step of the checkpoint it resumed).
    pub resumed_from: i64,
    pub curves: Vec<CurvePoint>,
    /// A sample of what the model generates (text, translations), for `samples.txt`.
    pub sample: String,
}

impl RunOutcome {
    pub fn set(&mut self, column: &str, value: f64) {
        self.metrics.insert(column.to_string(), value);
    }

    /// The value of `column`, NaN when the run has none.
    pub fn get(&self, column: &str) -> f64 {
        self.metrics.get(column).copied().unwrap_or(f64::NAN)
    }
}

/// Called after every optimisation step with (step, training loss).
pub type Progress<'a> = &'a mut dyn FnMut(i64, f64);

/// Backward from `loss` (times the loss scale) and one optimiser step; returns the loss and the report.
pub fn backward_and_step(
    loss: &Tensor,
    opt: &mut AdamW,
    lr: f64,
    clip: Option<f64>,
    scaler: &mut LossScaler,
) -> (f64, StepReport) {
    backward_scaled(loss, opt, scaler);
    let report = optimiser_step(opt, lr, clip, scaler);
    (loss.double_value(&[]), report)
}

/// The first half of [`backward_and_step`]: fresh gradients from `loss` times the loss scale.
pub fn backward_scaled(loss: &Tensor, opt: &mut AdamW, scaler: &LossScaler) {
    opt.zero_grad();
    if scaler.enabled {
        (loss * scaler.scale).backward();
    } else {
        loss.backward();
    }
}

/// The second half of [`backward_and_step`]: clipping and the update, then its bookkeeping.
pub fn optimiser_step(opt: &mut AdamW, lr: f64, clip: Option<f64>, scaler: &mut LossScaler) -> StepReport {
    let report = opt.step(lr, clip, scaler.scale);
    after_update(&report, scaler);
    report
}

/// The loss scale learns whether the step was applied (fp16 skips steps with overflowed gradients), and
/// autocast's cached low-precision copies of the weights go once the weights have changed.
fn after_update(report: &StepReport, scaler: &mut LossScaler) {
    scaler.update(report.applied);
    if report.applied {
        native::clear_autocast_cache();
    }
}

/// [`backward_and_step`] of one rank of a data-parallel group: the gradients, the loss and the stop flag
/// are averaged over the ranks (one all-reduce) before clipping and the update, so every rank takes the same
/// step; returns the mean loss, the report and whether any rank was asked to stop.
fn data_parallel_step(
    group: &Group,
    loss: &Tensor,
    opt: &mut AdamW,
    lr: f64,
    clip: Option<f64>,
    scaler: &mut LossScaler,
    stop: bool,
) -> Result<(f64, StepReport, bool)> {
    backward_scaled(loss, opt, scaler);
    let (grads, extras) = group.average(&opt.grads(), &[loss.double_value(&[]), f64::from(u8::from(stop))])?;
    let report = opt.step_with(grads, lr, clip, scaler.scale);
    after_update(&report, scaler);
    Ok((extras[0], report, extras[1] > 0.0))
}

/// The seed of rank `rank`'s own stream at `step` (what it draws after taking its rows of the batch).
fn rank_seed(seed: u64, rank: usize, step: i64) -> i64 {
    step_seed(seed ^ (rank as u64).wrapping_mul(0xD1B5_4A32_D192_ED03), step)
}

/// Seed of step `step`'s generator: a splitmix64 mix, so neighbouring (seed, step) pairs share nothing.
pub fn step_seed(seed: u64, step: i64) -> i64 {
    let mut z = seed.wrapping_add((step as u64).wrapping_add(1).wrapping_mul(0x9E37_79B9_7F4A_7C15));
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    ((z ^ (z >> 31)) >> 1) as i64
}

/// Where a run keeps its resumable state, and which config it belongs to.
pub struct StateFile {
    pub path: PathBuf,
    pub config_hash: String,
    /// Processes the run trains on: a state saved by another number is refused, not resumed.
    pub world_size: i64,
}

impl StateFile {
    /// The state file of one phase of a run (a pre-training before fine-tuning), next to the run's own.
    pub fn for_phase(&self, phase: &str) -> StateFile {
        let name = self.path.file_name().map(|n| n.to_string_lossy().replace(".state.", &format!(".{phase}.state.")));
        StateFile {
            path: self.path.with_file_name(name.unwrap_or_default()),
            config_hash: self.config_hash.clone(),
            world_size: self.world_size,
        }
    }
}

/// A saved state from a run on another number of processes: resuming it would change the global batch.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct WrongWorldSize(pub String);

fn one() -> i64 {
    1
}

/// Everything of a run in progress that is not a tensor.
#[derive(Serialize, Deserialize)]
struct Progressed {
    config_hash: String,
    step: i64,
    optimiser_steps: i64,
    last_loss: f64,
    train_time: f64,
    scaler: LossScaler,
    curves: Vec<CurvePoint>,
    /// Processes that trained it (states written before data parallelism are from one).
    #[serde(default = "one")]
    world_size: i64,
}

impl StateFile {
    /// Writes weights, optimiser moments and `progressed` into one safetensors file (the non-tensor part as
    /// a byte tensor), through a temporary file and a rename: a kill leaves the old state or the new one.
    fn save(&self, vs: &nn::VarStore, opt: &AdamW, progressed: &Progressed) -> Result<()> {
        if let Some(dir) = self.path.parent() {
            std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        }
        let (m, v, _) = opt.state();
        let json = serde_json::to_vec(progressed)?;
        let mut tensors: Vec<(String, Tensor)> =
            vs.variables().into_iter().map(|(name, t)| (format!("model.{name}"), t)).collect();
        tensors.push(("optim.exp_avg".into(), m.shallow_clone()));
        tensors.push(("optim.exp_avg_sq".into(), v.shallow_clone()));
        tensors.push(("progress.json".into(), Tensor::from_slice(&json)));
        crate::files::write_atomically_with(&self.path, |tmp| {
            Tensor::write_safetensors(&tensors, tmp).with_context(|| format!("writing {}", self.path.display()))
        })?;
        Ok(())
    }

    /// Restores a saved state into a freshly built model and optimiser; `None` when there is no state for
    /// this config (absent, or left by a different config under the same run id). Every tensor is read and
    /// checked against the model before any is copied, so a state that fails leaves the model as built.
    fn load(&self, vs: &mut nn::VarStore, opt: &mut AdamW) -> Result<Option<Progressed>> {
        if !self.path.exists() {
            return Ok(None);
        }
        let what = || format!("resuming from {}", self.path.display());
        let tensors: std::collections::HashMap<String, Tensor> =
            Tensor::read_safetensors(&self.path).with_context(what)?.into_iter().collect();
        let json = tensors.get("progress.json").with_context(what)?;
        let progressed: Progressed =
            serde_json::from_slice(&Vec::<u8>::try_from(json).with_context(what)?).with_context(what)?;
        if progressed.world_size != self.world_size {
            return Err(WrongWorldSize(format!(
                "{} was saved by a run on {} processes, and this launch has {}: relaunch with {} processes to \
                 continue it, or start over with --force",
                self.path.display(),
                progressed.world_size,
                self.world_size,
                progressed.world_size
            ))
            .into());
        }
        if progressed.config_hash != self.config_hash {
            return Ok(None);
        }
        let variables = vs.variables();
        for (name, var) in &variables {
            let saved = tensors.get(&format!("model.{name}")).with_context(|| format!("{}: no {name}", what()))?;
            if saved.size() != var.size() {
                anyhow::bail!("{}: {name} has shape {:?}, the model {:?}", what(), saved.size(), var.size());
            }
        }
        let get = |k: &str| tensors.get(k).with_context(|| format!("{}: no {k}", what()));
        let (m, v) = (get("optim.exp_avg")?, get("optim.exp_avg_sq")?);
        let _guard = tch::no_grad_guard();
        opt.restore(m, v, progressed.optimiser_steps)?;
        for (name, mut var) in variables {
            var.f_copy_(&tensors[&format!("model.{name}")]).with_context(what)?;
        }
        Ok(Some(progressed))
    }

    /// [`load`](Self::load), except that a state that cannot be read (torn, overwritten, from another build)
    /// is set aside as `<file>.unreadable-<unix time>` — renamed, not deleted — and the run starts afresh
    /// with a one-line warning: one bad file must not stop the sweep.
    fn load_or_set_aside(&self, vs: &mut nn::VarStore, opt: &mut AdamW) -> Result<Option<Progressed>> {
        match self.load(vs, opt) {
            Ok(p) => Ok(p),
            Err(e) if e.downcast_ref::<WrongWorldSize>().is_some() => Err(e),
            Err(e) => {
                let stamp = std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map(|d| d.as_secs())
                    .unwrap_or(0);
                let name = self.path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
                let aside = self.path.with_file_name(format!("{name}.unreadable-{stamp}"));
                std::fs::rename(&self.path, &aside)
                    .with_context(|| format!("setting aside the unreadable {}", self.path.display()))?;
                let cause = format!("{e:#}").replace('\n', " ");
                eprintln!(
                    "ablate: warning: {cause}; set it aside as {} and restarted the run from step 0",
                    aside.display()
                );
                Ok(None)
            }
        }
    }
}

/// Work stopped by SIGTERM or SIGINT with its state saved (a run after finishing a step, or a pool whose
/// workers did so): running the same command again continues. Says what was saved where.
#[derive(Debug, thiserror::Error)]
#[error("interrupted {0}: run the same command to continue")]
pub struct Interrupted(pub String);

/// Set by SIGTERM (what Slurm sends before a time limit or a preemption) and SIGINT once
/// [`stop_on_signals`] is installed; the loop stops at the end of the step in progress.
pub static STOP_REQUESTED: std::sync::LazyLock<std::sync::Arc<std::sync::atomic::AtomicBool>> =
    std::sync::LazyLock::new(|| std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false)));

/// The exit status of a run stopped by a signal with its state saved (EX_TEMPFAIL: try again).
pub const EXIT_INTERRUPTED: u8 = 75;

/// SIGTERM and SIGINT ask the training loop to stop after its current step and save its state; a second
/// one ends the process at once (status 128 + the signal, as the shell's default).
pub fn stop_on_signals() -> Result<()> {
    use signal_hook::consts::{SIGINT, SIGTERM};
    use signal_hook::flag;
    for signal in [SIGTERM, SIGINT] {
        // Registered first, so that it sees the flag as the previous signal left it.
        flag::register_conditional_shutdown(signal, 128 + signal, STOP_REQUESTED.clone())?;
        flag::register(signal, STOP_REQUESTED.clone())?;
    }
    Ok(())
}

fn stop_requested() -> bool {
    STOP_REQUESTED.load(std::sync::atomic::Ordering::SeqCst)
}

/// What the optimisation loop needs from a task: a loss on a freshly drawn training batch, an evaluation on
/// the validation split (with any extra curves, such as attention probes), and the same evaluation on the
/// test split, which the loop calls once, after the last step.
pub trait Objective {
    /// The loss of one training batch, drawn with libtorch's generator (seeded per step by the loop): in a
    /// data-parallel group, this rank's rows of the global batch (`shard.global(batch)` drawn, then
    /// `shard.take`); in one process the whole batch.
    fn training_loss(&self, shard: &BatchShard) -> Tensor;
    /// Evaluation on the validation split at `step` (the loop records it in the curves; tuning and any
    /// selection read it). In a group every rank calls it and gets the same values; a failed collective is
    /// an error.
    fn evaluate(&self, step: i64) -> Result<Evaluation>;
    /// The same measurements on the test split, under the same `val/…` keys: called once per run, at its
    /// end, for the reported `test_…` columns. Never recorded in the curves.
    fn test(&self) -> Result<Evaluation>;
}

/// What the optimisation loop did.
pub struct Optimised {
    pub params: i64,
    pub last_loss: f64,
    /// The last validation evaluation, and the one test evaluation (both empty when the run diverged).
    pub final_eval: Evaluation,
    pub test_eval: Evaluation,
    pub diverged_at: Option<i64>,
    /// Seconds spent in optimisation steps (evaluation excluded), and the steps taken.
    pub train_time: f64,
    pub steps_done: i64,
    pub resumed_from: i64,
    pub curves: Vec<CurvePoint>,
    /// Data-parallel processes, and the seconds of `train_time` spent in collectives (0 in one process).
    pub world_size: i64,
    pub global_batch: i64,
    pub comm_time: f64,
    /// Peak memory while this process optimised, in MB ([`memory::PeakMemory`]).
    pub peak_memory_mb: f64,
}

impl Optimised {
    /// The run's measurements: the cost metrics from its throughput (`throughput` items per second, of
    /// `model_flops` FLOP/s), the evaluations under the columns `metrics` declare for their `val/…` curves
    /// (a `test_…` column from the test evaluation, any other from the last validation evaluation), and
    /// `train_loss`. What only a task knows (a sample, metrics measured after training) it adds itself.
    pub fn into_outcome(
        self,
        started: Instant,
        throughput: f64,
        model_flops: f64,
        device: Device,
        precision: Precision,
        metrics: &[crate::metrics::Metric],
    ) -> RunOutcome {
        let mut values = BTreeMap::new();
        for m in metrics {
            if let (Some(column), Some(curve)) = (m.column_name(), m.curve) {
                if curve.starts_with("val/") {
                    let split = if column.starts_with("test_") { &self.test_eval } else { &self.final_eval };
                    values.insert(column.to_string(), split.get(curve));
                }
            }
        }
        let mut outcome = RunOutcome {
            metrics: values,
            diverged_at: self.diverged_at,
            resumed_from: self.resumed_from,
            curves: self.curves,
            sample: String::new(),
        };
        outcome.set("train_loss", self.last_loss);
        outcome.set("params", self.params as f64);
        outcome.set("wall_s", started.elapsed().as_secs_f64());
        outcome.set("tokens_per_s", throughput);
        outcome.set("model_tflops", model_flops / 1e12);
        outcome.set("mfu", utilisation(model_flops, device, precision, self.world_size));
        outcome.set("steps", self.steps_done as f64);
        outcome.set("threads", tch::get_num_threads() as f64);
        outcome.set("peak_memory_mb", self.peak_memory_mb);
        if self.world_size > 1 {
            outcome.set("comm_share", self.comm_time / self.train_time.max(1e-9));
            outcome.set("global_batch", (self.global_batch) as f64);
        }
        outcome
    }
}

/// Model FLOPs utilisation: `model_flops` (the whole group's) over the matmul peak of each process's device.
/// A peak measured while other work held the cores comes out low; a utilisation above 1 sends the peak to
/// be measured again (the higher measurement is kept), and one still above 1 is not recorded (NaN: an empty
/// cell), with a warning, rather than printed as a fact.
fn utilisation(model_flops: f64, device: Device, precision: Precision, world_size: i64) -> f64 {
    let of = |peak: f64| model_flops / (peak * world_size as f64);
    let first = of(precision::matmul_peak(device, precision));
    if first <= 1.0 {
        return first;
    }
    let again = of(precision::matmul_peak_measured_again(device, precision));
    if again <= 1.0 {
        return again;
    }
    eprintln!(
        "ablate: warning: the run's {:.3} TFLOP/s exceed the matmul peak measured for {device:?} ({:.3} TFLOP/s, twice): other work held the cores while the peak was measured; MFU is not recorded",
        model_flops / world_size as f64 / 1e12,
        precision::matmul_peak(device, precision) / 1e12
    );
    f64::NAN
}

/// A first phase of a run (pre-training before fine-tuning) under `phase`: trained without progress
/// lines, resumable from its own state file next to the run's, its curves' splits prefixed `<phase>_`.
pub fn optimise_phase(
    phase: &str,
    t: &TrainConfig,
    objective: &dyn Objective,
    vs: &mut nn::VarStore,
    device: Device,
    state: Option<&StateFile>,
) -> Result<Optimised> {
    let mut quiet = |_: i64, _: f64| {};
    let mut run = optimise(t, objective, vs, device, &mut quiet, state.map(|s| s.for_phase(phase)).as_ref())?;
    for c in run.curves.iter_mut() {
        c.split = format!("{phase}_{}", c.split);
    }
    Ok(run)
}

/// Where a run's loop stands: what a state file saves, and what the end of the run reports.
struct Standing {
    /// The step the loop (re)started from.
    first_step: i64,
    last_loss: f64,
    train_time: f64,
    comm_time: f64,
    scaler: LossScaler,
    curves: Vec<CurvePoint>,
}

/// The optimiser of `t` over `vs`: AdamW, with Muon for the hidden layers' matrices under `optimizer: muon`.
pub fn optimiser(t: &TrainConfig, vs: &nn::VarStore) -> AdamW {
    let params = vs.trainable_variables();
    // The trainable tensors come without names: match them to the store's named ones by storage.
    let names: std::collections::HashMap<usize, String> =
        vs.variables().into_iter().map(|(name, t)| (t.data_ptr() as usize, name)).collect();
    // Each tensor's declared role (`optim::declared_role`); one no list declares (the role test fails on it)
    // is decayed by its shape.
    let roles: Vec<optim::Role> = params
        .iter()
        .map(|p| {
            let declared = names.get(&(p.data_ptr() as usize)).and_then(|n| optim::declared_role(n, &p.size()));
            let hidden = declared == Some(optim::Declared::Hidden);
            optim::Role {
                muon: hidden && t.optimizer == crate::recipe::Optimizer::Muon,
                lr_scale: if hidden { t.hidden_lr_scale } else { 1.0 },
                decay: declared.map_or(p.dim() >= 2, |d| d != optim::Declared::Vector),
            }
        })
        .collect();
    let muon = optim::Muon { momentum: t.muon_momentum, ..Default::default() };
    AdamW::with_roles(params, &roles, muon, t.beta1, t.beta2, t.weight_decay)
}

/// The training loop every task shares: AdamW over `vs` with warm-up + cosine decay and clipping, mixed
/// precision, per-step seeding, evaluation every `eval_interval` steps, divergence detection, and with
/// `state` resumable checkpoints every `checkpoint_every` steps and at the end.
pub fn optimise(
    t: &TrainConfig,
    objective: &dyn Objective,
    vs: &mut nn::VarStore,
    device: Device,
    progress: Progress,
    state: Option<&StateFile>,
) -> Result<Optimised> {
    let peak = memory::PeakMemory::start(device);
    // Process-wide modes, set for every run (an earlier run of this process may have set others).
    native::set_math_modes(t.tf32, t.deterministic)?;
    let mut opt = optimiser(t, vs);
    // A run starts with no scheduled window recorded (an earlier run on this thread may have left one).
    crate::transformer::attention::set_training_step(None);
    let _autocast = precision::autocast(t.precision, device);
    let group = distributed::current();
    let mut at = resume_or_start(t, objective, vs, &mut opt, state, progress)?;
    // The communication share is of the training steps: evaluations' reductions are not counted.
    let discard_comm = || group.map(|g| g.take_comm_seconds());
    discard_comm();
    let mut diverged_at = None;
    // The losses of the steps since the last read: reading one makes the host wait for the device, so they
    // are read together where something needs them (see `must_read`).
    let mut unread: Vec<(i64, Tensor)> = Vec::new();
    // The last step taken: `t.steps`, or under a seconds budget the step that reached it.
    let mut last_step = at.first_step;
    let out_of_time = |seconds: f64| t.seconds_budget().is_some_and(|s| seconds >= s);
    for step in at.first_step..t.steps {
        if out_of_time(at.train_time) {
            // A run resumed after its budget was spent: nothing left to train.
            break;
        }
        let tick = Instant::now();
        crate::transformer::attention::set_training_step(Some(step));
        let lr = t.lr_at_time(step, at.train_time);
        let (loss, report, stop) = train_step(t, objective, &mut opt, &mut at, step, lr)?;
        let done = step + 1;
        last_step = done;
        unread.push((done, loss));
        // Whether a seconds budget is spent is asked with the host's time so far (the read below depends on
        // the answer); the step's time on the clock runs until after that read, so it includes the wait for
        // the device to finish the steps queued since the last read. Stopped before the read, a GPU-bound
        // run's clock would count only the host's queueing (4–10% short at a read every 10–25 steps,
        // several-fold at every step), and tokens_per_s and mfu would overstate by as much.
        let host_time = at.train_time + tick.elapsed().as_secs_f64();
        let last = done == t.steps || out_of_time(host_time);
        let diverged = match must_read(t, done, last || stop) {
            true => read_losses(&mut unread, &mut at),
            false => None,
        };
        at.train_time += tick.elapsed().as_secs_f64();
        if let Some((bad_step, bad_loss)) = diverged {
            // A diverged run is a result (e.g. of unscaled attention), not an error: record it and stop
            // at the step whose loss was not finite (the steps trained after it, until this read, are
            // discarded: nothing of them was recorded or saved).
            at.curves.push(CurvePoint::new(bad_step, "train", "loss", bad_loss));
            diverged_at = Some(bad_step);
            last_step = bad_step;
            progress(t.steps, bad_loss);
            break;
        }
        if done % t.log_interval == 0 || last {
            log_step(t, &mut at, done, report.grad_norm(), lr);
        }
        if done % t.eval_interval == 0 && !last {
            validate(objective, done)?.record(done, &mut at.curves);
            discard_comm();
        }
        save_or_stop(t, vs, &opt, &at, state, (done, last), stop)?;
        progress(done, at.last_loss);
        if last {
            break;
        }
    }
    // Training is over: every later call (the last evaluation, test, decoding) uses the final windows.
    crate::transformer::attention::set_training_step(None);
    let (final_eval, test_eval) = match diverged_at {
        None => final_evaluations(t, objective, last_step, &mut at.curves)?,
        Some(_) => (Evaluation::default(), Evaluation::default()),
    };
    Ok(Optimised {
        params: opt.num_params(),
        last_loss: at.last_loss,
        final_eval,
        test_eval,
        diverged_at,
        train_time: at.train_time,
        steps_done: diverged_at.unwrap_or(last_step),
        resumed_from: at.first_step,
        curves: at.curves,
        world_size: group.map_or(1, |g| g.world as i64),
        global_batch: t.global_batch(),
        comm_time: at.comm_time,
        peak_memory_mb: peak.megabytes(),
    })
}

/// A log step's curve points: loss, gradient norm and rate (`record_step`), the scheduled window, and under a
/// seconds budget the share of it spent.
fn log_step(t: &TrainConfig, at: &mut Standing, done: i64, grad_norm: f64, lr: f64) {
    record_step(at, done, grad_norm, lr);
    if let Some(w) = crate::transformer::attention::scheduled_window() {
        at.curves.push(CurvePoint::new(done, "train", "window", w as f64));
    }
    if let Some(s) = t.seconds_budget() {
        at.curves.push(CurvePoint::new(done, "train", "budget_fraction", (at.train_time / s).min(1.0)));
    }
}

/// The validation evaluation at `step`, its error naming the step as a training step's does (so that a rank
/// lost during an evaluation's collective is reported where it was noticed).
fn validate(objective: &dyn Objective, step: i64) -> Result<Evaluation> {
    objective.evaluate(step).with_context(|| format!("step {step}: validation"))
}

/// The validation evaluation at the last step (recorded in the curves) and, unless `train.skip_test`, the
/// test split's, read once here.
fn final_evaluations(
    t: &TrainConfig,
    objective: &dyn Objective,
    last_step: i64,
    curves: &mut Vec<CurvePoint>,
) -> Result<(Evaluation, Evaluation)> {
    let e = validate(objective, last_step)?;
    e.record(last_step, curves);
    let test = if t.skip_test {
        Evaluation::default()
    } else {
        objective.test().with_context(|| format!("step {last_step}: test"))?
    };
    Ok((e, test))
}

/// The loop's starting point: a saved state's (weights and moments loaded into `vs` and `opt`), or step 0
/// after a first evaluation. In a data-parallel group only rank 0 keeps a state (the sweep gives the others
/// none); it shares what it resumed, and its weights and moments.
fn resume_or_start(
    t: &TrainConfig,
    objective: &dyn Objective,
    vs: &mut nn::VarStore,
    opt: &mut AdamW,
    state: Option<&StateFile>,
    progress: Progress,
) -> Result<Standing> {
    let mut resumed = match state {
        Some(s) => s.load_or_set_aside(vs, opt)?,
        None => None,
    };
    if let Some(g) = distributed::current() {
        resumed = serde_json::from_slice(&g.share_from_rank0(&serde_json::to_vec(&resumed)?)?)?;
        let (m, v, _) = opt.state();
        g.broadcast_all(&[opt.flat(), m, v]).context("sharing rank 0's weights")?;
        if let Some(p) = &resumed {
            opt.set_steps_taken(p.optimiser_steps);
        }
    }
    Ok(match resumed {
        Some(p) => {
            progress(p.step, p.last_loss);
            Standing {
                first_step: p.step,
                last_loss: p.last_loss,
                train_time: p.train_time,
                comm_time: 0.0,
                scaler: p.scaler,
                curves: p.curves,
            }
        }
        None => {
            let mut curves = Vec::new();
            validate(objective, 0)?.record(0, &mut curves);
            Standing {
                first_step: 0,
                last_loss: f64::NAN,
                train_time: 0.0,
                comm_time: 0.0,
                scaler: LossScaler::for_precision(t.precision),
                curves,
            }
        }
    })
}

/// One optimisation step at `step` (0-based) with learning rate `lr`, seeded from (seed, step): alone, or
/// as this rank's shard of a data-parallel step. Returns the loss (0-dim, left on the device: the loop reads
/// it when it needs it), the step's report, and whether a stop was asked for (agreed by every rank in a
/// group).
fn train_step(
    t: &TrainConfig,
    objective: &dyn Objective,
    opt: &mut AdamW,
    at: &mut Standing,
    step: i64,
    lr: f64,
) -> Result<(Tensor, StepReport, bool)> {
    tch::manual_seed(step_seed(t.seed, step));
    match distributed::current() {
        None => {
            let loss = objective.training_loss(&BatchShard::whole());
            backward_scaled(&loss, opt, &at.scaler);
            let report = optimiser_step(opt, lr, t.grad_clip, &mut at.scaler);
            Ok((loss.detach(), report, stop_requested()))
        }
        Some(g) => {
            let shard = BatchShard::of(g.rank, g.world, rank_seed(t.seed, g.rank, step));
            let loss = objective.training_loss(&shard);
            let (mean_loss, report, stop) =
                data_parallel_step(g, &loss, opt, lr, t.grad_clip, &mut at.scaler, stop_requested())
                    .with_context(|| format!("step {}", step + 1))?;
            at.comm_time += g.take_comm_seconds();
            Ok((Tensor::from(mean_loss), report, stop))
        }
    }
}

/// Whether the loop reads the losses after step `done` (`end`: the last step, or a stop was asked for):
/// where they are recorded (the log interval), before an evaluation or a state file, and at the end. A
/// non-finite loss is found at the next read at the latest, so nothing after it is recorded or saved.
fn must_read(t: &TrainConfig, done: i64, end: bool) -> bool {
    end || done % t.log_interval == 0
        || done % t.eval_interval == 0
        || t.checkpoint_every.is_some_and(|every| done % every == 0)
}

/// Reads the `unread` losses to the host in one transfer, oldest first, and empties the list: the last
/// becomes `at.last_loss`, unless one is not finite, which is returned with its step (the run diverged
/// there) and becomes `last_loss` instead.
fn read_losses(unread: &mut Vec<(i64, Tensor)>, at: &mut Standing) -> Option<(i64, f64)> {
    if unread.is_empty() {
        return None;
    }
    let losses: Vec<Tensor> = unread.iter().map(|(_, l)| l.to_kind(tch::Kind::Double)).collect();
    let values = losses_to_host(&Tensor::stack(&losses, 0));
    let steps: Vec<i64> = unread.drain(..).map(|(s, _)| s).collect();
    let bad = steps.iter().zip(&values).find(|(_, v)| !v.is_finite()).map(|(&s, &v)| (s, v));
    at.last_loss = bad.map_or_else(|| values.last().copied().unwrap_or(at.last_loss), |(_, v)| v);
    bad
}

/// The stacked losses on the host: where the host waits for the device to finish every step queued so far.
fn losses_to_host(stacked: &Tensor) -> Vec<f64> {
    #[cfg(test)]
    tests::READ_DELAY.with(|delay| std::thread::sleep(delay.get()));
    Vec::try_from(stacked.to_device(Device::Cpu)).unwrap_or_default()
}

/// The training curves' points after step `done`: loss, gradient norm, learning rate, and the loss scale
/// where one is kept.
fn record_step(at: &mut Standing, done: i64, grad_norm: f64, lr: f64) {
    at.curves.push(CurvePoint::new(done, "train", "loss", at.last_loss));
    at.curves.push(CurvePoint::new(done, "train", "grad_norm", grad_norm));
    at.curves.push(CurvePoint::new(done, "train", "lr", lr));
    if at.scaler.enabled {
        at.curves.push(CurvePoint::new(done, "train", "loss_scale", at.scaler.scale));
    }
}

/// Saves the state every `checkpoint_every` steps, at the `last` step, and when a signal asks to stop (the final
/// state lets a run be continued or inspected later); then, if asked, stops with [`Interrupted`].
fn save_or_stop(
    t: &TrainConfig,
    vs: &nn::VarStore,
    opt: &AdamW,
    at: &Standing,
    state: Option<&StateFile>,
    (done, last): (i64, bool),
    stop: bool,
) -> Result<()> {
    if let Some(s) = state {
        let scheduled = t.checkpoint_every.is_some_and(|every| done % every == 0 || last);
        if scheduled || stop {
            let progressed = Progressed {
                config_hash: s.config_hash.clone(),
                step: done,
                optimiser_steps: opt.steps_taken(),
                last_loss: at.last_loss,
                train_time: at.train_time,
                scaler: at.scaler.clone(),
                curves: at.curves.clone(),
                world_size: s.world_size,
            };
            s.save(vs, opt, &progressed)?;
        }
        if stop {
            let at = format!("after step {done}, its state saved in {}", s.path.display());
            return Err(Interrupted(at).into());
        }
        if last && t.checkpoint_every.is_none() {
            // A state saved on an earlier interruption belongs to a step this run has now passed; a run
            // without `checkpoint_every` keeps none once it finishes. (Absent: nothing to remove.)
            let _ = std::fs::remove_file(&s.path);
        }
    } else if let (true, Some(g)) = (stop, distributed::current()) {
        let at = format!("after step {done} on rank {} (rank 0 saved the state)", g.rank);
        return Err(Interrupted(at).into());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::Cell;
    use std::time::Duration;

    thread_local! {
        /// How long each read of the losses to the host takes, standing in for the wait for a GPU to finish
        /// the steps queued before it.
        pub(super) static READ_DELAY: Cell<Duration> = const { Cell::new(Duration::ZERO) };
    }

    struct Bowl<'a> {
        w: &'a Tensor,
    }

    impl Objective for Bowl<'_> {
        fn training_loss(&self, _shard: &BatchShard) -> Tensor {
            (self.w * self.w).sum(tch::Kind::Float)
        }
        fn evaluate(&self, _step: i64) -> Result<Evaluation> {
            Ok(Evaluation::default().with("val/loss", 1.0))
        }
        fn test(&self) -> Result<Evaluation> {
            Ok(Evaluation::default().with("val/loss", 1.0))
        }
    }

    /// Training seconds of `steps` steps reading the losses every `log` steps, each read taking `delay`.
    fn train_time(steps: i64, log: i64, delay: Duration) -> f64 {
        READ_DELAY.with(|d| d.set(delay));
        let mut vs = nn::VarStore::new(Device::Cpu);
        let w = vs.root().randn("w", &[4], 0.0, 1.0);
        let t = TrainConfig { steps, log_interval: log, eval_interval: 1000, ..Default::default() };
        let run = optimise(&t, &Bowl { w: &w }, &mut vs, Device::Cpu, &mut |_, _| {}, None).unwrap();
        READ_DELAY.with(|d| d.set(Duration::ZERO));
        run.train_time
    }

    #[test]
    fn the_training_clock_counts_the_wait_for_the_device_at_each_read() {
        // Reads at steps 2, 4, 6 and 8, each 40 ms: at least 0.16 s on the clock, however quick the steps.
        let delay = Duration::from_millis(40);
        let slow = train_time(8, 2, delay);
        assert!(slow >= 4.0 * delay.as_secs_f64(), "train_time {slow:.3} s leaves out the reads' waits");
        // Without the waits the same run is quicker by about them.
        let quick = train_time(8, 2, Duration::ZERO);
        assert!(quick < slow - 3.0 * delay.as_secs_f64(), "quick {quick:.3} s, slow {slow:.3} s");
    }
}
