//! kinds vit, swin, davit and cnn: an image classifier trained by cross-entropy on (augmented) training batches,
//! with test loss and accuracy at every evaluation, through the same optimisation loop as every kind.
use anyhow::{bail, Result};
use std::time::Instant;
use tch::{nn, Device, Tensor};

use super::{Built, DataCache, RunContext, Task, Trained};
use crate::data::images::ImageTask;
use crate::data::HeldOut;
use crate::metrics::{self, Metric};
use crate::models::cnn::Cnn;
use crate::models::davit::Davit;
use crate::models::spec::Image;
use crate::models::swin::Swin;
use crate::models::vit::Vit;
use crate::models::ImageClassifier;
use crate::recipe::{Config, Kind};
use crate::train::distributed::BatchShard;
use crate::train::{optimise, optimise_phase, Evaluation, Objective};

pub struct Classification;

/// Held-out images per evaluation batch.
const EVAL_BATCH: i64 = 500;

/// The image set a vision run reads, with its validation carve-out.
pub fn images_key(cfg: &Config) -> String {
    let images = serde_yaml::to_string(&cfg.images()).unwrap_or_default();
    format!("{images}validation_fraction: {}", cfg.data.validation_fraction)
}

/// The image set of a vision run, loaded (`validation_fraction` of its training images set aside).
pub fn load_images(cfg: &Config) -> Result<ImageTask> {
    ImageTask::load(&cfg.images(), cfg.data.validation_fraction)
}

/// The classifier of a vit, swin, davit or cnn run.
pub fn classifier(cfg: &Config, vs: &nn::Path) -> Box<dyn ImageClassifier> {
    match cfg.kind {
        Kind::Vit => Box::new(Vit::new(vs, &cfg.vit_spec())),
        Kind::Swin => Box::new(Swin::new(vs, &cfg.staged_spec())),
        Kind::Davit => Box::new(Davit::new(vs, &cfg.staged_spec())),
        Kind::Cnn => Box::new(Cnn::new(vs, &cfg.cnn_spec())),
        other => unreachable!("kind {other} is not an image classifier (tasks::task routes it elsewhere)"),
    }
}

/// Refuses a model whose input does not fit the images of `task` (channels, side, and at least its classes).
pub fn check_fits(task: &ImageTask, model: &Image) -> Result<()> {
    if (model.channels, model.size) != (task.channels, task.size) || model.classes < task.classes {
        bail!(
            "the images are {}×{}×{} in {} classes, the model expects {}×{}×{} in {} (set vision.channels, vision.image_size, vision.classes)",
            task.channels,
            task.size,
            task.size,
            task.classes,
            model.channels,
            model.size,
            model.size,
            model.classes
        );
    }
    Ok(())
}

/// The image set a classifier's pre-training reads.
fn pretrain_key(cfg: &Config) -> String {
    let images = serde_yaml::to_string(&cfg.vision().pretrain_on).unwrap_or_default();
    format!("{images}validation_fraction: {}", cfg.data.validation_fraction)
}

/// The side of the token grid a classifier's throughput counts: the first stage's patches (a convolution
/// reads every pixel).
fn tokens_side(cfg: &Config) -> i64 {
    let v = cfg.vision();
    if cfg.kind == Kind::Cnn {
        v.image_size
    } else {
        v.grid(cfg.kind)
    }
}

/// Analytic multiply-accumulates of one forward pass on one image.
pub fn forward_macs(cfg: &Config) -> f64 {
    match cfg.kind {
        Kind::Vit => cfg.vit_spec().forward_macs(),
        Kind::Cnn => cfg.cnn_spec().forward_macs(),
        _ => cfg.staged_spec().forward_macs(),
    }
}

struct Classifying<'a> {
    model: &'a dyn ImageClassifier,
    task: &'a ImageTask,
    validation: Vec<(Tensor, Tensor)>,
    test: Vec<(Tensor, Tensor)>,
    batch: i64,
    device: Device,
    probe_attention: bool,
}

impl Objective for Classifying<'_> {
    fn training_loss(&self, shard: &BatchShard) -> Tensor {
        let (x, y) = self.task.train_batch(shard.global(self.batch), self.device);
        let [x, y] = shard.take([x, y]);
        self.model.classify(&x, true, false).0.cross_entropy_for_logits(&y)
    }

    fn evaluate(&self, _step: i64) -> Result<Evaluation> {
        let e = self.with_norms(self.score(&self.validation)?, &self.validation);
        Ok(match self.probe_attention {
            true => super::probe(e, &self.model.classify(&self.validation[0].0, false, true).1),
            false => e,
        })
    }

    fn test(&self) -> Result<Evaluation> {
        Ok(self.with_norms(self.score(&self.test)?, &self.test))
    }
}

impl Classifying<'_> {
    /// `e` with the token norm ratio of the first of `batches` (ViT; unchanged for the others).
    fn with_norms(&self, e: Evaluation, batches: &[(Tensor, Tensor)]) -> Evaluation {
        match batches.first().and_then(|(x, _)| self.model.token_norm_ratio(x)) {
            Some(ratio) => e.with("val/token_norm_ratio", ratio),
            None => e,
        }
    }

    /// Mean loss and accuracy over held-out `batches`.
    fn score(&self, batches: &[(Tensor, Tensor)]) -> Result<Evaluation> {
        super::classification_score(batches, |x| self.model.classify(x, false, false).0)
    }
}

struct BuiltClassifier {
    model: Box<dyn ImageClassifier>,
    image: Image,
}

impl Built for BuiltClassifier {
    fn forward_example(&self, batch: i64, train: bool, device: Device) -> Tensor {
        let images = super::example_images(batch, self.image.channels, self.image.size, device);
        self.model.classify(&images, train, false).0
    }
}

impl Task for Classification {
    fn metrics(&self, cfg: &Config) -> Vec<Metric> {
        let mut m = vec![
            Metric::both("test_loss", "val/loss", "test loss", "nats/image", false),
            Metric::both("test_accuracy", "val/accuracy", "test accuracy", "", true),
        ];
        if cfg.train.probe_attention {
            m.extend(metrics::attention_probes());
        }
        if cfg.kind == Kind::Vit {
            m.push(
                Metric::both(
                    "test_token_norm_ratio",
                    "val/token_norm_ratio",
                    "largest patch-token norm / median, last layer",
                    "",
                    false,
                )
                .diagnostic(),
            );
        }
        if cfg.vision().pretrain_steps > 0 {
            m.push(Metric::column(
                "pretrain_accuracy",
                "test accuracy on the pre-training images, before fine-tuning",
                "",
                true,
            ));
            m.push(Metric::curve("pretrain_val/accuracy", "validation accuracy during pre-training", "", true));
        }
        m.extend(metrics::optimisation("nats/image"));
        let tokens = if cfg.kind == Kind::Cnn { "pixels/s" } else { "patch tokens/s" };
        m.extend(metrics::cost(tokens, cfg.train.world_size));
        m
    }

    fn prepare(&self, cfg: &Config, data: &mut DataCache) -> Result<()> {
        let task = DataCache::get_or_load(&mut data.images, images_key(cfg), || load_images(cfg))?;
        check_fits(task, &cfg.image())?;
        if cfg.vision().pretrain_steps > 0 {
            let on = &cfg.vision().pretrain_on;
            let validation_fraction = cfg.data.validation_fraction;
            let source = DataCache::get_or_load(&mut data.images, pretrain_key(cfg), || {
                ImageTask::load(on, validation_fraction)
            })?;
            check_fits(source, &cfg.image())?;
        }
        Ok(())
    }

    fn vocab(&self, _cfg: &Config, _data: &DataCache) -> Result<i64> {
        Ok(0)
    }

    fn build(&self, cfg: &Config, vs: &nn::Path, _vocab: i64) -> Box<dyn Built> {
        Box::new(BuiltClassifier { model: classifier(cfg, vs), image: cfg.image() })
    }

    fn forward_flops(&self, cfg: &Config, _params: i64, _vocab: i64) -> (f64, String) {
        (2.0 * forward_macs(cfg), "image".into())
    }

    fn tokens_per_example(&self, cfg: &Config, _data: &DataCache) -> Result<f64> {
        Ok((tokens_side(cfg) * tokens_side(cfg)) as f64)
    }

    /// Evaluation uses the first `eval_batches × 500` validation images during training and as many test
    /// images at the end (all 10,000 at 20 batches). With `vision.pretrain_steps`, the model first trains on
    /// `vision.pretrain_on` (evaluated on its own splits), then its head is drawn afresh and the whole model
    /// fine-tuned on the run's images.
    fn train(&self, cfg: &Config, data: &DataCache, ctx: RunContext) -> Result<Trained> {
        let task = DataCache::loaded(&data.images, &images_key(cfg))?;
        let (t, device, v) = (&cfg.train, ctx.device, cfg.vision());
        tch::manual_seed(t.seed as i64);
        let started = Instant::now();
        let mut vs = nn::VarStore::new(device);
        let model = classifier(cfg, &vs.root());
        let objective = |task| Classifying {
            model: model.as_ref(),
            task,
            validation: task.held_out_batches(HeldOut::Validation, t.eval_batches * EVAL_BATCH, EVAL_BATCH, device),
            test: task.held_out_batches(HeldOut::Test, t.test_batches() * EVAL_BATCH, EVAL_BATCH, device),
            batch: t.batch_size,
            device,
            probe_attention: t.probe_attention,
        };
        let (mut curves, mut pretrain_accuracy, mut pretrain_time, mut pretrain_steps) = (Vec::new(), None, 0.0, 0);
        // The fine-tuning phase restarts the peak: the run's is the larger of the two phases'.
        let mut pretrain_peak_mb = f64::NAN;
        if v.pretrain_steps > 0 {
            let source = DataCache::loaded(&data.images, &pretrain_key(cfg))?;
            let lr = v.pretrain_lr.unwrap_or(t.lr);
            let phase = crate::recipe::TrainConfig { steps: v.pretrain_steps, lr, ..t.clone() };
            let mut run = optimise_phase("pretrain", &phase, &objective(source), &mut vs, device, ctx.state)?;
            if run.diverged_at.is_some() {
                // Recorded like any diverged run (the sweep goes on); there is nothing to fine-tune.
                (ctx.progress)(t.steps, run.last_loss);
                let outcome = run.into_outcome(started, 0.0, 0.0, device, t.precision, &self.metrics(cfg));
                return Ok(Trained { outcome, vs, tokenizer: None });
            }
            pretrain_accuracy = Some(run.test_eval.get("val/accuracy"));
            (pretrain_time, pretrain_steps, pretrain_peak_mb) = (run.train_time, run.steps_done, run.peak_memory_mb);
            curves.append(&mut run.curves);
            // A new head: the pre-training's classes are not the run's (even when they have the same count).
            crate::models::redraw(model.head());
        }
        let mut run = optimise(t, &objective(task), &mut vs, device, ctx.progress, ctx.state)?;
        run.peak_memory_mb = run.peak_memory_mb.max(pretrain_peak_mb);
        curves.append(&mut run.curves);
        run.curves = curves;
        let images = ((run.steps_done + pretrain_steps) * t.global_batch()) as f64;
        let images_per_s = images / (run.train_time + pretrain_time).max(1e-9);
        let model_flops = images_per_s * 6.0 * forward_macs(cfg);
        let tokens_per_s = images_per_s * (tokens_side(cfg) * tokens_side(cfg)) as f64;
        let mut outcome = run.into_outcome(started, tokens_per_s, model_flops, device, t.precision, &self.metrics(cfg));
        if let Some(accuracy) = pretrain_accuracy {
            outcome.set("pretrain_accuracy", accuracy);
        }
        Ok(Trained { outcome, vs, tokenizer: None })
    }
}
