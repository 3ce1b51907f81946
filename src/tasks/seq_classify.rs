//! kind seq_classify: the Long Range Arena's tasks (ListOps, Pathfinder, pixel sequences, byte-level text;
//! `data::lra`) read by a bidirectional encoder that classifies each whole sequence, trained by
//! cross-entropy, with validation loss and accuracy at every evaluation and the test split read once.
//!
//! The examples are made once per distinct `seq_classify` section (every training seed of a recipe reads
//! the same ones: the generators follow `seq_classify.data_seed`, not `train.seed`), padded to the task's
//! longest sequence with a pad token the model masks.
use anyhow::{bail, Result};
use std::time::Instant;
use tch::{nn, Device, Kind as DType, Tensor};

use super::{Built, DataCache, RunContext, Task, Trained};
use crate::data::lra::{self, listops, pathfinder, Example, Split};
use crate::data::to_device_async;
use crate::metrics::{self, Metric};
use crate::models::seq_classifier::SeqClassifier;
use crate::recipe::{Config, ImageDataConfig, LraTask, SeqClassifyConfig};
use crate::train::distributed::BatchShard;
use crate::train::{optimise, Evaluation, Objective};

pub struct SequenceClassification;

/// Held-out sequences per evaluation batch.
const EVAL_BATCH: i64 = 100;

/// One split as tensors: token ids (n, L) padded with the pad id, labels (n).
pub struct SplitTensors {
    pub ids: Tensor,
    pub labels: Tensor,
}

impl SplitTensors {
    fn len(&self) -> i64 {
        self.labels.size()[0]
    }

    /// `count` sequences spread evenly over the split (all of them when it holds fewer), in batches of
    /// `batch`, on `device`. Spread, not the first `count`: the byte task's splits list ham before spam.
    fn batches(&self, count: i64, batch: i64, device: Device) -> Vec<(Tensor, Tensor)> {
        let (count, len) = (count.min(self.len()), self.len());
        let chosen: Vec<i64> = (0..count).map(|i| i * len / count).collect();
        let (ids, labels) = match count == len {
            true => (self.ids.shallow_clone(), self.labels.shallow_clone()),
            false => {
                let idx = Tensor::from_slice(&chosen);
                (self.ids.index_select(0, &idx), self.labels.index_select(0, &idx))
            }
        };
        (0..count)
            .step_by(batch as usize)
            .map(|s| {
                let b = batch.min(count - s);
                (ids.narrow(0, s, b).to(device), labels.narrow(0, s, b).to(device))
            })
            .collect()
    }
}

/// A task's three splits, its vocabulary (the pad token is `vocab`) and classes.
pub struct Sequences {
    pub train: SplitTensors,
    pub validation: SplitTensors,
    pub test: SplitTensors,
    pub vocab: i64,
    pub classes: i64,
    /// The padded length of every sequence.
    pub length: i64,
    /// The share of the test split in the training split's most common class: what always answering it
    /// scores.
    pub majority_accuracy: f64,
}

/// The examples a run reads: its `seq_classify` section (the pooling aside).
fn data_key(cfg: &Config) -> String {
    let s = SeqClassifyConfig { pool: crate::recipe::Pool::Mean, ..cfg.seq_classify().clone() };
    serde_yaml::to_string(&s).unwrap_or_default()
}

/// The task's vocabulary of real tokens.
fn task_vocab(task: LraTask) -> i64 {
    match task {
        LraTask::Listops => listops::VOCAB as i64,
        // Grey levels and bytes.
        LraTask::Pathfinder | LraTask::Pixels | LraTask::Bytes => 256,
    }
}

/// The first `n` examples of `split` of the section's task.
fn examples(
    s: &SeqClassifyConfig,
    split: Split,
    n: usize,
    emails: &[crate::data::spam::Email],
) -> Result<Vec<Example>> {
    Ok(match s.task {
        LraTask::Listops => {
            let spec = listops::Spec::lengths(s.min_length as usize, s.max_length as usize);
            lra::examples_of(s.data_seed, split, n, |rng| listops::generate(rng, &spec))
        }
        LraTask::Pathfinder => {
            let spec = pathfinder::Spec::sized(s.image_size as usize, s.contour_length as usize);
            lra::try_examples_of(s.data_seed, split, n, |rng| pathfinder::generate(rng, &spec))?
        }
        LraTask::Pixels => {
            let cfg = ImageDataConfig { dataset: s.dataset, ..Default::default() };
            let images = crate::data::images::ImageTask::load(&cfg, 0.1)?;
            lra::pixel_examples(&images, split, n)?
        }
        LraTask::Bytes => {
            let mut out = lra::byte_examples(emails, split, n, s.max_length as usize);
            // The bytes come padded with NUL (no email holds one): the model's own pad token replaces it,
            // so that the padding is masked.
            for e in &mut out {
                while e.tokens.last() == Some(&lra::BYTE_PAD) {
                    e.tokens.pop();
                }
            }
            out
        }
    })
}

/// `examples` as tensors padded to `length` with `pad`; refuses an example longer than `length`.
fn to_tensors(examples: &[Example], length: i64, pad: i64) -> Result<SplitTensors> {
    let mut ids = Vec::with_capacity(examples.len() * length as usize);
    for e in examples {
        if e.tokens.len() as i64 > length {
            bail!("seq_classify: an example has {} tokens, more than the task's length {length}", e.tokens.len());
        }
        ids.extend(e.tokens.iter().map(|&t| i64::from(t)));
        ids.extend(std::iter::repeat_n(pad, length as usize - e.tokens.len()));
    }
    let labels: Vec<i64> = examples.iter().map(|e| i64::from(e.label)).collect();
    Ok(SplitTensors {
        ids: Tensor::from_slice(&ids).view([examples.len() as i64, length]),
        labels: Tensor::from_slice(&labels),
    })
}

/// The splits of a run's task, made and checked.
pub fn load(cfg: &Config) -> Result<Sequences> {
    let s = cfg.seq_classify();
    let emails = match s.task {
        LraTask::Bytes => crate::data::spam::spam_assassin()?,
        _ => Vec::new(),
    };
    let (vocab, length, classes) = (task_vocab(s.task), s.sequence_length(), s.task.classes());
    let split = |split, n: i64| -> Result<(SplitTensors, Vec<i64>)> {
        let e = examples(s, split, n as usize, &emails)?;
        if e.is_empty() {
            bail!("seq_classify: the {split:?} split of task {:?} has no examples", s.task);
        }
        let labels = e.iter().map(|e| i64::from(e.label)).collect();
        Ok((to_tensors(&e, length, vocab)?, labels))
    };
    let (train, train_labels) = split(Split::Train, s.train_examples)?;
    let (validation, _) = split(Split::Validation, s.eval_examples)?;
    let (test, test_labels) = split(Split::Test, s.eval_examples)?;
    let mut counts = vec![0usize; classes as usize];
    for &l in &train_labels {
        counts[l as usize] += 1;
    }
    let majority = (0..counts.len()).max_by_key(|&c| (counts[c], std::cmp::Reverse(c))).unwrap_or(0) as i64;
    let majority_accuracy = test_labels.iter().filter(|&&l| l == majority).count() as f64 / test_labels.len() as f64;
    Ok(Sequences { train, validation, test, vocab, classes, length, majority_accuracy })
}

struct Classifying<'a> {
    model: &'a SeqClassifier,
    data: &'a Sequences,
    validation: Vec<(Tensor, Tensor)>,
    test: Vec<(Tensor, Tensor)>,
    batch: i64,
    device: Device,
    probe_attention: bool,
}

impl Objective for Classifying<'_> {
    fn training_loss(&self, shard: &BatchShard) -> Tensor {
        let idx = Tensor::randint(self.data.train.len(), [shard.global(self.batch)], (DType::Int64, Device::Cpu));
        let (x, y) = (self.data.train.ids.index_select(0, &idx), self.data.train.labels.index_select(0, &idx));
        let [x, y] = shard.take([to_device_async(&x, self.device), to_device_async(&y, self.device)]);
        self.model.classify(&x, true, false).0.to_kind(DType::Float).cross_entropy_for_logits(&y)
    }

    fn evaluate(&self, _step: i64) -> Result<Evaluation> {
        let e = score(self.model, &self.validation)?;
        Ok(match self.probe_attention {
            true => super::probe(e, &self.model.classify(&self.validation[0].0, false, true).1),
            false => e,
        })
    }

    fn test(&self) -> Result<Evaluation> {
        score(self.model, &self.test)
    }
}

/// Mean loss and accuracy over held-out `batches`.
fn score(model: &SeqClassifier, batches: &[(Tensor, Tensor)]) -> Result<Evaluation> {
    super::classification_score(batches, |x| model.classify(x, false, false).0)
}

/// The run's classifier over `vocab` tokens.
fn classifier(cfg: &Config, vs: &nn::Path, vocab: i64) -> SeqClassifier {
    let s = cfg.seq_classify();
    SeqClassifier::new(vs, &cfg.transformer_spec(), vocab, s.task.classes(), s.pool)
}

struct BuiltClassifier {
    model: SeqClassifier,
    length: i64,
    vocab: i64,
}

impl Built for BuiltClassifier {
    /// Every second sequence ends in padding after three quarters of its tokens, so that the masks act too.
    fn forward_example(&self, batch: i64, train: bool, device: Device) -> Tensor {
        let ids = super::example_tokens(batch, self.length, self.vocab, device);
        let position = Tensor::arange(self.length, (DType::Int64, device)).view([1, -1]);
        let odd = Tensor::arange(batch, (DType::Int64, device)).remainder(2).eq(1).view([-1, 1]);
        let padding = position.ge(self.length * 3 / 4).logical_and(&odd);
        let ids = ids.masked_fill(&padding, self.model.pad_id());
        self.model.classify(&ids, train, false).0
    }

    fn attention_on_tokens(&self, ids: &Tensor) -> Option<Vec<Tensor>> {
        let ids = ids.clamp(0, self.vocab - 1);
        Some(tch::no_grad(|| self.model.classify(&ids, false, true).1))
    }
}

/// Multiply-accumulates of one forward pass on one sequence: each layer's projections, scores over the keys
/// its pattern lets a query see, and FFN, then the head.
fn forward_macs(cfg: &Config) -> f64 {
    let spec = cfg.transformer_spec();
    let n = cfg.seq_classify().positions() + spec.attention.pattern.global_tokens;
    let classes = cfg.seq_classify().task.classes();
    crate::models::spec::encoder_macs(&spec, n, classes)
}

impl Task for SequenceClassification {
    fn metrics(&self, cfg: &Config) -> Vec<Metric> {
        let mut m = vec![
            Metric::both("test_loss", "val/loss", "test loss", "nats/sequence", false),
            Metric::both("test_accuracy", "val/accuracy", "test accuracy", "", true),
            Metric::column(
                "test_majority_accuracy",
                "test accuracy of always answering the training split's most common class",
                "",
                true,
            )
            .detail(),
        ];
        if cfg.train.probe_attention {
            m.extend(metrics::attention_probes());
        }
        m.extend(metrics::optimisation("nats/sequence"));
        m.extend(metrics::cost("tokens/s", cfg.train.world_size));
        m
    }

    fn prepare(&self, cfg: &Config, data: &mut DataCache) -> Result<()> {
        DataCache::get_or_load(&mut data.sequences, data_key(cfg), || load(cfg))?;
        Ok(())
    }

    fn vocab(&self, cfg: &Config, _data: &DataCache) -> Result<i64> {
        Ok(task_vocab(cfg.seq_classify().task))
    }

    fn build(&self, cfg: &Config, vs: &nn::Path, vocab: i64) -> Box<dyn Built> {
        let length = cfg.seq_classify().sequence_length();
        Box::new(BuiltClassifier { model: classifier(cfg, vs, vocab), length, vocab })
    }

    fn forward_flops(&self, cfg: &Config, _params: i64, _vocab: i64) -> (f64, String) {
        let n = cfg.seq_classify().positions();
        (2.0 * forward_macs(cfg), format!("sequence of {n} tokens"))
    }

    fn tokens_per_example(&self, cfg: &Config, _data: &DataCache) -> Result<f64> {
        Ok(cfg.seq_classify().positions() as f64)
    }

    /// Validation reads `eval_batches × 100` validation sequences (spread over the split) at every
    /// evaluation; the test split is read whole (`seq_classify.eval_examples`) once, at the end.
    fn train(&self, cfg: &Config, data: &DataCache, ctx: RunContext) -> Result<Trained> {
        let sequences = DataCache::loaded(&data.sequences, &data_key(cfg))?;
        let (t, device) = (&cfg.train, ctx.device);
        tch::manual_seed(t.seed as i64);
        let started = Instant::now();
        let mut vs = nn::VarStore::new(device);
        let model = classifier(cfg, &vs.root(), sequences.vocab);
        let objective = Classifying {
            model: &model,
            data: sequences,
            validation: sequences.validation.batches(t.eval_batches * EVAL_BATCH, EVAL_BATCH, device),
            test: sequences.test.batches(sequences.test.len(), EVAL_BATCH, device),
            batch: t.batch_size,
            device,
            probe_attention: t.probe_attention,
        };
        let run = optimise(t, &objective, &mut vs, device, ctx.progress, ctx.state)?;
        let per_s = (run.steps_done * t.global_batch()) as f64 / run.train_time.max(1e-9);
        let tokens_per_s = per_s * cfg.seq_classify().positions() as f64;
        let model_flops = per_s * 6.0 * forward_macs(cfg);
        let mut outcome = run.into_outcome(started, tokens_per_s, model_flops, device, t.precision, &self.metrics(cfg));
        // The majority class's accuracy is measured on the test labels: a tuning run reads none.
        if !t.skip_test {
            outcome.set("test_majority_accuracy", sequences.majority_accuracy);
        }
        Ok(Trained { outcome, vs, tokenizer: None })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn held_out_batches_spread_over_a_split_ordered_by_class() {
        // Ten sequences, the first five of class 0 (as the byte task lists ham before spam).
        let split = SplitTensors {
            ids: Tensor::arange(10, (DType::Int64, Device::Cpu)).view([10, 1]),
            labels: Tensor::from_slice(&[0i64, 0, 0, 0, 0, 1, 1, 1, 1, 1]),
        };
        let batches = split.batches(4, 3, Device::Cpu);
        let ids: Vec<i64> = batches.iter().flat_map(|(x, _)| Vec::<i64>::try_from(x.view([-1])).unwrap()).collect();
        assert_eq!(ids, vec![0, 2, 5, 7]);
        assert_eq!(batches.iter().map(|(x, _)| x.size()[0]).collect::<Vec<_>>(), vec![3, 1]);
        // All of a split when asked for more.
        let all: i64 = split.batches(50, 4, Device::Cpu).iter().map(|(_, y)| y.size()[0]).sum();
        assert_eq!(all, 10);
    }
}
