//! One training run of a GPT on a text corpus: AdamW with warm-up and cosine decay, gradient clipping,
//! periodic evaluation on the held-out split, optional attention probes, and a sample at the end.
use anyhow::Result;
use std::time::Instant;
use tch::{nn, Device, Kind, Tensor};

use crate::attention::weight_statistics;
use crate::config::Config;
use crate::data::{Dataset, IGNORE};
use crate::generate::{generate, Decoding};
use crate::gpt::Gpt;
use crate::optim::{warmup_cosine, AdamW};

/// One point of a learning curve.
#[derive(Debug, Clone)]
pub struct CurvePoint {
    pub step: i64,
    pub split: &'static str,
    pub metric: &'static str,
    pub value: f64,
}

#[derive(Debug, Clone)]
pub struct Evaluation {
    pub loss: f64,
    pub accuracy: f64,
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
    pub curves: Vec<CurvePoint>,
    pub sample: String,
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

/// One optimisation step on a batch; returns the loss and the gradient norm before clipping.
pub fn train_step(model: &Gpt, opt: &mut AdamW, x: &Tensor, y: &Tensor, lr: f64, clip: Option<f64>) -> (f64, f64) {
    let (_, loss) = model.loss(x, y, true);
    opt.zero_grad();
    loss.backward();
    let grad_norm = opt.step(lr, clip);
    (loss.double_value(&[]), grad_norm)
}

/// A finished run: its measurements and the trained model.
pub struct TrainedRun {
    pub outcome: RunOutcome,
    pub model: Gpt,
    pub vs: nn::VarStore,
}

pub fn train(cfg: &Config, data: &Dataset, device: Device, progress: Progress) -> Result<TrainedRun> {
    let t = &cfg.train;
    let block = cfg.model.block_size;
    data.check_block_size(cfg.longest_window())?;
    tch::manual_seed(t.seed as i64);
    let (vs, model) = build_model(cfg, data.tokenizer().vocab_size(), device);
    let mut opt = AdamW::new(vs.trainable_variables(), t.beta1, t.beta2, t.weight_decay);
    let val = data.val_batches(t.eval_batches, t.batch_size, block, device);
    let mut curves = Vec::new();
    let started = Instant::now();
    let mut train_time = 0.0;
    let mut last_loss = f64::NAN;
    let mut diverged_at = None;
    let record_eval = |step: i64, curves: &mut Vec<CurvePoint>| {
        let e = evaluate(&model, &val);
        curves.push(CurvePoint { step, split: "val", metric: "loss", value: e.loss });
        curves.push(CurvePoint { step, split: "val", metric: "accuracy", value: e.accuracy });
        if t.probe_attention {
            let _guard = tch::no_grad_guard();
            let (_, weights) = model.forward_with_weights(&val[0].0, false, true);
            let stats: Vec<(f64, f64)> = weights.iter().map(weight_statistics).collect();
            let n = stats.len() as f64;
            let entropy = stats.iter().map(|s| s.0).sum::<f64>() / n;
            let max_weight = stats.iter().map(|s| s.1).sum::<f64>() / n;
            curves.push(CurvePoint { step, split: "val", metric: "attn_entropy", value: entropy });
            curves.push(CurvePoint { step, split: "val", metric: "attn_max_weight", value: max_weight });
        }
        e
    };
    record_eval(0, &mut curves);
    for step in 0..t.steps {
        let tick = Instant::now();
        let lr = warmup_cosine(step, t.warmup_steps, t.steps, t.lr, t.min_lr);
        let (x, y) = data.train_batch(t.batch_size, block, device);
        let (loss, grad_norm) = train_step(&model, &mut opt, &x, &y, lr, t.grad_clip);
        last_loss = loss;
        train_time += tick.elapsed().as_secs_f64();
        let done = step + 1;
        if !last_loss.is_finite() {
            // A diverged run is a result (e.g. of unscaled attention), not an error: record it and stop.
            curves.push(CurvePoint { step: done, split: "train", metric: "loss", value: last_loss });
            diverged_at = Some(done);
            progress(t.steps, last_loss);
            break;
        }
        if done % t.log_interval == 0 || done == t.steps {
            curves.push(CurvePoint { step: done, split: "train", metric: "loss", value: last_loss });
            curves.push(CurvePoint { step: done, split: "train", metric: "grad_norm", value: grad_norm });
            curves.push(CurvePoint { step: done, split: "train", metric: "lr", value: lr });
        }
        if done % t.eval_interval == 0 && done != t.steps {
            record_eval(done, &mut curves);
        }
        progress(done, last_loss);
    }
    let final_eval = match diverged_at {
        None => record_eval(t.steps, &mut curves),
        Some(_) => Evaluation { loss: f64::NAN, accuracy: f64::NAN },
    };
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
    let tokens = (t.steps * t.batch_size * block) as f64;
    tch::manual_seed(t.seed as i64);
    let (prompt, new_tokens) = data.sample_prompt();
    let decoding = match data {
        Dataset::Text(_) => Decoding::Sample { temperature: 0.8, top_k: Some(10) },
        Dataset::Copy(_) => Decoding::Greedy,
    };
    let sample = match diverged_at {
        None => data.tokenizer().decode(&generate(&model, &prompt, new_tokens, decoding)),
        Some(step) => format!("(no sample: training diverged at step {step})"),
    };
    let outcome = RunOutcome {
        params: opt.num_params(),
        final_train_loss: last_loss,
        final_eval,
        length_evals,
        diverged_at,
        wall_s: started.elapsed().as_secs_f64(),
        tokens_per_s: tokens / train_time.max(1e-9),
        curves,
        sample,
    };
    Ok(TrainedRun { outcome, model, vs })
}
