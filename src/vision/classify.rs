//! Training an image classifier: cross-entropy on (augmented) training batches, test loss and accuracy at
//! every evaluation, through the same optimisation loop as the language models.
use anyhow::Result;
use std::time::Instant;
use tch::{nn, Device, Kind, Tensor};

use super::VisionModel;
use crate::config::Config;
use crate::images::ImageTask;
use crate::train::{optimise, CurvePoint, Evaluation, Objective, Progress, RunOutcome, StateFile};

/// Test images per evaluation batch.
const EVAL_BATCH: i64 = 500;

struct Classification<'a> {
    model: &'a VisionModel,
    task: &'a ImageTask,
    test: Vec<(Tensor, Tensor)>,
    batch: i64,
    device: Device,
}

impl Objective for Classification<'_> {
    fn training_loss(&self) -> Tensor {
        let (x, y) = self.task.train_batch(self.batch, self.device);
        self.model.forward(&x, true).cross_entropy_for_logits(&y)
    }

    fn evaluate(&self, step: i64, curves: &mut Vec<CurvePoint>) -> Evaluation {
        let _guard = tch::no_grad_guard();
        let (mut loss, mut correct, mut count) = (0.0, 0.0, 0.0);
        for (x, y) in &self.test {
            let logits = self.model.forward(x, false).to_kind(Kind::Float);
            let n = y.size()[0] as f64;
            loss += logits.cross_entropy_for_logits(y).double_value(&[]) * n;
            correct += logits.argmax(-1, false).eq_tensor(y).to_kind(Kind::Float).sum(Kind::Float).double_value(&[]);
            count += n;
        }
        let e = Evaluation { loss: loss / count, accuracy: correct / count };
        e.record(step, curves);
        e
    }
}

/// A trained classifier and its measurements.
pub struct TrainedClassifier {
    pub outcome: RunOutcome,
    pub vs: nn::VarStore,
}

/// Trains `cfg.vision` on `task`; evaluation uses the first `eval_batches × 500` test images (all 10,000 at
/// 20 batches).
pub fn train_classifier(
    cfg: &Config,
    task: &ImageTask,
    device: Device,
    progress: Progress,
    state: Option<&StateFile>,
) -> Result<TrainedClassifier> {
    let v = cfg.vision.as_ref().expect("a vision run");
    let t = &cfg.train;
    task.check_model(v)?;
    tch::manual_seed(t.seed as i64);
    let started = Instant::now();
    let mut vs = nn::VarStore::new(device);
    let model = VisionModel::new(&vs.root(), v);
    let objective = Classification {
        model: &model,
        task,
        test: task.test_batches(t.eval_batches * EVAL_BATCH, EVAL_BATCH, device),
        batch: t.batch_size,
        device,
    };
    let run = optimise(t, &objective, &mut vs, device, progress, state)?;
    let images_per_s = (run.steps_done * t.batch_size) as f64 / run.train_time.max(1e-9);
    let grid = v.stage_grid(0);
    let model_flops = images_per_s * 6.0 * v.forward_macs();
    // Tokens are the first stage's patches.
    let outcome = run.into_outcome(started, images_per_s * (grid * grid) as f64, model_flops, device, t.precision);
    Ok(TrainedClassifier { outcome, vs })
}
