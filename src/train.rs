//! One training run of a GPT on a text corpus: AdamW with warm-up and cosine decay, gradient clipping,
//! mixed precision, periodic evaluation on the held-out split, optional attention probes, resumable state
//! checkpoints, and a sample at the end.
//!
//! Randomness is a function of (seed, step): the generator is re-seeded before every step's batch and
//! dropout. A run restarted from a checkpoint at step k therefore draws exactly what the uninterrupted run
//! drew after step k, without saving the generator's internal state.
use anyhow::{Context, Result};
use serde::{Deserialize, Serialize};
use std::path::PathBuf;
use std::time::Instant;
use tch::{nn, Device, Kind, Tensor};

use crate::attention::weight_statistics;
use crate::config::Config;
use crate::data::{Dataset, IGNORE};
use crate::generate::{generate, Decoding};
use crate::gpt::Gpt;
use crate::optim::{AdamW, StepReport};
use crate::precision::{self, LossScaler};

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

#[derive(Debug, Clone)]
pub struct Evaluation {
    pub loss: f64,
    pub accuracy: f64,
}

impl Evaluation {
    /// Adds this held-out evaluation at `step` to the learning curves.
    pub fn record(&self, step: i64, curves: &mut Vec<CurvePoint>) {
        curves.push(CurvePoint::new(step, "val", "loss", self.loss));
        curves.push(CurvePoint::new(step, "val", "accuracy", self.accuracy));
    }
}

#[derive(Debug)]
pub struct RunOutcome {
    pub params: i64,
    pub final_train_loss: f64,
    pub final_eval: Evaluation,
    /// (multiple of block_size, evaluation at that length or `None` when the model cannot read it).
    pub length_evals: Vec<(i64, Option<Evaluation>)>,
    /// The step whose loss was NaN or infinite, if training diverged (the run stops there).
    pub diverged_at: Option<i64>,
    pub wall_s: f64,
    /// Training tokens per second over the optimisation steps (evaluation time excluded).
    pub tokens_per_s: f64,
    /// Achieved model FLOP/s over the optimisation steps, and its fraction of the device's matmul peak.
    pub model_flops: f64,
    pub mfu: f64,
    /// The step this process started from (0, or the step of the checkpoint it resumed).
    pub resumed_from: i64,
    pub curves: Vec<CurvePoint>,
    pub sample: String,
    /// Values of the config's extra result columns (`results::extra_columns`), in that order.
    pub extra_metrics: Vec<f64>,
}

/// Called after every optimisation step with (step, training loss).
pub type Progress<'a> = &'a mut dyn FnMut(i64, f64);

pub fn build_model(cfg: &Config, vocab: i64, device: Device) -> (nn::VarStore, Gpt) {
    let vs = nn::VarStore::new(device);
    let model = Gpt::new(&vs.root(), &cfg.model, vocab);
    (vs, model)
}

pub fn evaluate(model: &Gpt, batches: &[(Tensor, Tensor)]) -> Evaluation {
    let _guard = tch::no_grad_guard();
    let (mut loss, mut correct, mut count) = (0.0, 0.0, 0.0);
    for (x, y) in batches {
        let (logits, l) = model.loss(x, y, false);
        loss += l.double_value(&[]);
        let scored = y.ne(IGNORE);
        let right = logits.argmax(-1, false).eq_tensor(y).logical_and(&scored);
        correct += right.to_kind(Kind::Float).sum(Kind::Float).double_value(&[]);
        count += scored.to_kind(Kind::Float).sum(Kind::Float).double_value(&[]);
    }
    Evaluation { loss: loss / batches.len() as f64, accuracy: correct / count }
}

/// One optimisation step on a batch; returns the loss and what the optimiser did. The loss is multiplied
/// by the scaler's factor before backward (fp16), and the scaler updated from the outcome.
pub fn train_step(
    model: &Gpt,
    opt: &mut AdamW,
    x: &Tensor,
    y: &Tensor,
    lr: f64,
    clip: Option<f64>,
    scaler: &mut LossScaler,
) -> (f64, StepReport) {
    let (_, loss) = model.loss(x, y, true);
    backward_and_step(&loss, opt, lr, clip, scaler)
}

/// Backward from `loss` (times the loss scale) and one optimiser step; returns the loss and the report.
pub fn backward_and_step(
    loss: &Tensor,
    opt: &mut AdamW,
    lr: f64,
    clip: Option<f64>,
    scaler: &mut LossScaler,
) -> (f64, StepReport) {
    opt.zero_grad();
    if scaler.enabled {
        (loss * scaler.scale).backward();
    } else {
        loss.backward();
    }
    let report = opt.step(lr, clip, scaler.scale);
    scaler.update(report.applied);
    if report.applied {
        crate::native::clear_autocast_cache();
    }
    (loss.double_value(&[]), report)
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
        let tmp = self.path.with_extension("tmp");
        Tensor::write_safetensors(&tensors, &tmp).with_context(|| format!("writing {}", tmp.display()))?;
        std::fs::rename(&tmp, &self.path).with_context(|| format!("writing {}", self.path.display()))?;
        Ok(())
    }

    /// Restores a saved state into a freshly built model and optimiser; `None` when there is no state for
    /// this config (absent, or left by a different config under the same run id).
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
        if progressed.config_hash != self.config_hash {
            return Ok(None);
        }
        let _guard = tch::no_grad_guard();
        for (name, mut var) in vs.variables() {
            let saved = tensors.get(&format!("model.{name}")).with_context(|| format!("{}: no {name}", what()))?;
            var.f_copy_(saved).with_context(what)?;
        }
        let get = |k: &str| tensors.get(k).with_context(|| format!("{}: no {k}", what()));
        opt.restore(get("optim.exp_avg")?, get("optim.exp_avg_sq")?, progressed.optimiser_steps)?;
        Ok(Some(progressed))
    }
}

/// A finished run: its measurements and the trained model.
pub struct TrainedRun {
    pub outcome: RunOutcome,
    pub model: Gpt,
    pub vs: nn::VarStore,
}

pub fn train(cfg: &Config, data: &Dataset, device: Device, progress: Progress) -> Result<TrainedRun> {
    train_resumable(cfg, data, device, progress, None)
}

/// What the optimisation loop needs from a task: a loss on a freshly drawn training batch, and an
/// evaluation on held-out data (with any extra curves, such as attention probes).
pub trait Objective {
    /// The loss of one training batch, drawn with libtorch's generator (seeded per step by the loop).
    fn training_loss(&self) -> Tensor;
    /// Held-out evaluation at `step`; may push extra curve points.
    fn evaluate(&self, step: i64, curves: &mut Vec<CurvePoint>) -> Evaluation;
}

/// What the optimisation loop did.
pub struct Optimised {
    pub params: i64,
    pub last_loss: f64,
    pub final_eval: Evaluation,
    pub diverged_at: Option<i64>,
    /// Seconds spent in optimisation steps (evaluation excluded), and the steps taken.
    pub train_time: f64,
    pub steps_done: i64,
    pub resumed_from: i64,
    pub curves: Vec<CurvePoint>,
}

impl Optimised {
    /// The run's measurements, given its throughput: everything a task adds (held-out lengths, a sample,
    /// extra metrics) starts empty for the task to fill in.
    pub fn into_outcome(
        self,
        started: Instant,
        tokens_per_s: f64,
        model_flops: f64,
        device: Device,
        precision: crate::config::Precision,
    ) -> RunOutcome {
        RunOutcome {
            params: self.params,
            final_train_loss: self.last_loss,
            final_eval: self.final_eval,
            length_evals: Vec::new(),
            diverged_at: self.diverged_at,
            wall_s: started.elapsed().as_secs_f64(),
            tokens_per_s,
            model_flops,
            mfu: model_flops / precision::matmul_peak(device, precision),
            resumed_from: self.resumed_from,
            curves: self.curves,
            sample: String::new(),
            extra_metrics: Vec::new(),
        }
    }
}

/// The training loop every task shares: AdamW over `vs` with warm-up + cosine decay and clipping, mixed
/// precision, per-step seeding, evaluation every `eval_interval` steps, divergence detection, and with
/// `state` resumable checkpoints every `checkpoint_every` steps and at the end.
pub fn optimise(
    t: &crate::config::TrainConfig,
    objective: &dyn Objective,
    vs: &mut nn::VarStore,
    device: Device,
    progress: Progress,
    state: Option<&StateFile>,
) -> Result<Optimised> {
    let mut opt = AdamW::new(vs.trainable_variables(), t.beta1, t.beta2, t.weight_decay);
    let _autocast = precision::autocast(t.precision, device);
    let mut curves = Vec::new();
    let mut train_time = 0.0;
    let mut last_loss = f64::NAN;
    let mut scaler = LossScaler::for_precision(t.precision);
    let mut first_step = 0;
    let resumed = match state {
        Some(s) => s.load(vs, &mut opt)?,
        None => None,
    };
    match resumed {
        Some(p) => {
            first_step = p.step;
            last_loss = p.last_loss;
            train_time = p.train_time;
            scaler = p.scaler;
            curves = p.curves;
            progress(first_step, last_loss);
        }
        None => {
            objective.evaluate(0, &mut curves);
        }
    }
    let mut diverged_at = None;
    for step in first_step..t.steps {
        let tick = Instant::now();
        tch::manual_seed(step_seed(t.seed, step));
        let lr = t.lr_at(step);
        let loss = objective.training_loss();
        let (loss, report) = backward_and_step(&loss, &mut opt, lr, t.grad_clip, &mut scaler);
        last_loss = loss;
        train_time += tick.elapsed().as_secs_f64();
        let done = step + 1;
        if !last_loss.is_finite() {
            // A diverged run is a result (e.g. of unscaled attention), not an error: record it and stop.
            curves.push(CurvePoint::new(done, "train", "loss", last_loss));
            diverged_at = Some(done);
            progress(t.steps, last_loss);
            break;
        }
        if done % t.log_interval == 0 || done == t.steps {
            curves.push(CurvePoint::new(done, "train", "loss", last_loss));
            curves.push(CurvePoint::new(done, "train", "grad_norm", report.grad_norm));
            curves.push(CurvePoint::new(done, "train", "lr", lr));
            if scaler.enabled {
                curves.push(CurvePoint::new(done, "train", "loss_scale", scaler.scale));
            }
        }
        if done % t.eval_interval == 0 && done != t.steps {
            objective.evaluate(done, &mut curves);
        }
        if let (Some(s), Some(every)) = (state, t.checkpoint_every) {
            // Every k steps and at the end: the final state lets a run be continued or inspected later.
            if done % every == 0 || done == t.steps {
                let progressed = Progressed {
                    config_hash: s.config_hash.clone(),
                    step: done,
                    optimiser_steps: opt.steps_taken(),
                    last_loss,
                    train_time,
                    scaler: scaler.clone(),
                    curves: curves.clone(),
                };
                s.save(vs, &opt, &progressed)?;
            }
        }
        progress(done, last_loss);
    }
    let final_eval = match diverged_at {
        None => objective.evaluate(t.steps, &mut curves),
        Some(_) => Evaluation { loss: f64::NAN, accuracy: f64::NAN },
    };
    Ok(Optimised {
        params: opt.num_params(),
        last_loss,
        final_eval,
        diverged_at,
        train_time,
        steps_done: diverged_at.unwrap_or(t.steps),
        resumed_from: first_step,
        curves,
    })
}

/// Next-token prediction with a GPT: batches from the corpus (or the copy task), evaluation on fixed
/// held-out batches, attention probes when asked.
struct LanguageModelling<'a> {
    model: &'a Gpt,
    data: &'a Dataset,
    val: Vec<(Tensor, Tensor)>,
    batch: i64,
    block: i64,
    device: Device,
    probe_attention: bool,
}

impl Objective for LanguageModelling<'_> {
    fn training_loss(&self) -> Tensor {
        let (x, y) = self.data.train_batch(self.batch, self.block, self.device);
        self.model.loss(&x, &y, true).1
    }

    fn evaluate(&self, step: i64, curves: &mut Vec<CurvePoint>) -> Evaluation {
        let e = evaluate(self.model, &self.val);
        e.record(step, curves);
        if self.probe_attention {
            let _guard = tch::no_grad_guard();
            let (_, weights) = self.model.forward_with_weights(&self.val[0].0, false, true);
            let stats: Vec<(f64, f64)> = weights.iter().map(|w| weight_statistics(&w.to_kind(Kind::Float))).collect();
            let n = stats.len() as f64;
            let entropy = stats.iter().map(|s| s.0).sum::<f64>() / n;
            let max_weight = stats.iter().map(|s| s.1).sum::<f64>() / n;
            curves.push(CurvePoint::new(step, "val", "attn_entropy", entropy));
            curves.push(CurvePoint::new(step, "val", "attn_max_weight", max_weight));
        }
        e
    }
}

/// Trains one run; with `state`, saves the training state every `train.checkpoint_every` steps and starts
/// from the saved state when one exists for this config.
pub fn train_resumable(
    cfg: &Config,
    data: &Dataset,
    device: Device,
    progress: Progress,
    state: Option<&StateFile>,
) -> Result<TrainedRun> {
    let t = &cfg.train;
    let block = cfg.model.block_size;
    data.check_block_size(cfg.longest_window())?;
    tch::manual_seed(t.seed as i64);
    let started = Instant::now();
    let (mut vs, model) = build_model(cfg, data.tokenizer().vocab_size(), device);
    let objective = LanguageModelling {
        model: &model,
        data,
        val: data.val_batches(t.eval_batches, t.batch_size, block, device),
        batch: t.batch_size,
        block,
        device,
        probe_attention: t.probe_attention,
    };
    let run = optimise(t, &objective, &mut vs, device, progress, state)?;
    let _autocast = precision::autocast(t.precision, device);
    // Length generalisation: the same number of held-out tokens, in windows k times longer.
    let length_evals = t
        .eval_lengths
        .iter()
        .map(|&k| {
            let long = block * k;
            let batch = (t.batch_size / k).max(1);
            let e =
                model.covers(long).then(|| evaluate(&model, &data.val_batches(t.eval_batches, batch, long, device)));
            (k, e)
        })
        .collect();
    let tokens_per_s = (run.steps_done * t.batch_size * block) as f64 / run.train_time.max(1e-9);
    let model_flops = tokens_per_s * precision::train_flops_per_token(cfg, run.params, data.tokenizer().vocab_size());
    tch::manual_seed(t.seed as i64);
    let (prompt, new_tokens) = data.sample_prompt();
    let decoding = match data {
        Dataset::Text(_) => Decoding::Sample { temperature: 0.8, top_k: Some(10) },
        Dataset::Copy(_) => Decoding::Greedy,
    };
    let sample = match run.diverged_at {
        None => data.tokenizer().decode(&generate(&model, &prompt, new_tokens, decoding)),
        Some(step) => format!("(no sample: training diverged at step {step})"),
    };
    drop(_autocast);
    let outcome = RunOutcome {
        length_evals,
        sample,
        ..run.into_outcome(started, tokens_per_s, model_flops, device, t.precision)
    };
    Ok(TrainedRun { outcome, model, vs })
}
