//! Validation and test splits: disjoint for every kind's data (checked on the examples themselves), the
//! validation split read during training and the test split read once, after the last step, for the
//! reported `test_…` columns.
mod common;

use std::cell::Cell;
use std::collections::HashSet;
use std::time::Instant;

use ablate::data::images::{write_idx, ImageTask};
use ablate::data::text::CopyTask;
use ablate::data::{carve_validation, HeldOut};
use ablate::metrics::Metric;
use ablate::recipe::{DataConfig, ImageDataConfig, ImageDataset, Precision, Tokenizer, TrainConfig};
use ablate::tasks::translate::TranslationData;
use ablate::train::distributed::BatchShard;
use ablate::train::{optimise, Evaluation, Objective};
use tch::{nn, Device, Kind, Tensor};

/// libtorch's generator is one per process and the tests of a file run on parallel threads: a test that
/// compares what two seeded draws produce holds this while it draws, and so does every other test here
/// that draws, so that none moves the generator in between.
static GENERATOR: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn exclusive() -> std::sync::MutexGuard<'static, ()> {
    GENERATOR.lock().unwrap_or_else(|e| e.into_inner())
}

/// A quadratic bowl whose validation and test evaluations return different constants, counting calls.
struct Counted<'a> {
    w: &'a Tensor,
    evaluations: Cell<usize>,
    tests: Cell<usize>,
}

impl Objective for Counted<'_> {
    fn training_loss(&self, _shard: &BatchShard) -> Tensor {
        (self.w * self.w).sum(Kind::Float)
    }

    fn evaluate(&self, _step: i64) -> anyhow::Result<Evaluation> {
        self.evaluations.set(self.evaluations.get() + 1);
        Ok(Evaluation::default().with("val/loss", 1.0))
    }

    fn test(&self) -> anyhow::Result<Evaluation> {
        self.tests.set(self.tests.get() + 1);
        Ok(Evaluation::default().with("val/loss", 7.0))
    }
}

#[test]
fn the_loop_reads_the_test_split_once_after_the_last_step_and_reports_it_as_test() {
    let _serial = common::serial();
    let _generator = exclusive();
    let mut vs = nn::VarStore::new(Device::Cpu);
    let w = vs.root().randn("w", &[4], 0.0, 1.0);
    let objective = Counted { w: &w, evaluations: Cell::new(0), tests: Cell::new(0) };
    let t = TrainConfig { steps: 6, eval_interval: 2, log_interval: 1, ..Default::default() };
    let run = optimise(&t, &objective, &mut vs, Device::Cpu, &mut |_, _| {}, None).unwrap();
    assert_eq!(objective.tests.get(), 1, "the test split is read once");
    assert!(objective.evaluations.get() >= 3, "validation at steps 2, 4 and the end");
    let metrics = [
        Metric::both("test_loss", "val/loss", "test loss", "", false),
        Metric::both("val_loss", "val/loss", "validation loss", "", false),
    ];
    let outcome = run.into_outcome(Instant::now(), 1.0, 1.0, Device::Cpu, Precision::Fp32, &metrics);
    assert_eq!(outcome.get("test_loss"), 7.0);
    assert_eq!(outcome.get("val_loss"), 1.0, "a column not named test_ is the last validation");
    let recorded: Vec<f64> = outcome.curves.iter().filter(|c| c.split == "val").map(|c| c.value).collect();
    assert!(!recorded.is_empty() && recorded.iter().all(|&v| v == 1.0), "the curves are validation only");
}

#[test]
fn carving_validation_partitions_the_examples_evenly() {
    let _serial = common::serial();
    let _generator = exclusive();
    let (train, validation) = carve_validation(1000, 0.1);
    assert_eq!(validation.len(), 100);
    let all: HashSet<usize> = train.iter().chain(&validation).copied().collect();
    assert_eq!(all.len(), 1000, "every example in exactly one split");
    // Evenly spread: one in every ten, across the whole order.
    assert!(validation.windows(2).all(|w| w[1] - w[0] == 10));
    assert_eq!((validation[0], validation[99]), (9, 999));
}

#[test]
fn the_copy_task_draws_validation_and_test_sequences_apart() {
    let _serial = common::serial();
    let _generator = exclusive();
    let copy = CopyTask::new(12, 10);
    let rows = |split| -> HashSet<Vec<i64>> {
        let batches = copy.held_out_batches(split, 4, 16, Device::Cpu);
        batches.iter().flat_map(|(x, _)| (0..x.size()[0]).map(|i| Vec::<i64>::try_from(x.get(i)).unwrap())).collect()
    };
    let (validation, test) = (rows(HeldOut::Validation), rows(HeldOut::Test));
    assert_eq!((validation.len(), test.len()), (64, 64));
    assert!(validation.is_disjoint(&test));
}

/// An IDX set whose every image is unique (its index written into its first two pixels).
fn unique_images(dir: &std::path::Path, name: &str, n: u32, offset: u32) {
    let mut pixels = vec![0u8; (n * 64) as usize];
    for i in 0..n {
        let id = i + offset;
        pixels[(i * 64) as usize] = (id % 256) as u8;
        pixels[(i * 64 + 1) as usize] = (id / 256) as u8;
    }
    let labels: Vec<u8> = (0..n).map(|i| (i % 4) as u8).collect();
    write_idx(&dir.join(format!("{name}-images-idx3-ubyte")), &[n, 8, 8], &pixels).unwrap();
    write_idx(&dir.join(format!("{name}-labels-idx1-ubyte")), &[n], &labels).unwrap();
}

fn image_ids(images: &Tensor) -> HashSet<i64> {
    let flat = images.view([images.size()[0], -1]).to_kind(Kind::Int64);
    let ids = flat.select(1, 0) + flat.select(1, 1) * 256;
    Vec::<i64>::try_from(ids).unwrap().into_iter().collect()
}

#[test]
fn image_validation_is_carved_from_the_training_images_and_never_trained_on() {
    let _serial = common::serial();
    let _generator = exclusive();
    let dir = common::scratch("splits-images");
    unique_images(&dir, "train", 500, 0);
    unique_images(&dir, "t10k", 100, 10_000);
    let cfg = ImageDataConfig {
        dataset: ImageDataset::Idx,
        path: Some(dir.display().to_string()),
        ..ImageDataConfig::default()
    };
    let task = ImageTask::load(&cfg, 0.2).unwrap();
    let (train, validation, test) =
        (image_ids(&task.train.images), image_ids(&task.validation.images), image_ids(&task.test.images));
    assert_eq!((train.len(), validation.len(), test.len()), (400, 100, 100));
    assert!(train.is_disjoint(&validation) && train.is_disjoint(&test) && validation.is_disjoint(&test));
    assert_eq!(train.union(&validation).count(), 500, "together, the training images");
    // Training batches draw only from the training part.
    tch::manual_seed(0);
    let (x, _) = task.train_batch(256, Device::Cpu);
    let drawn = image_ids(&((x + 1.0) * 127.5).round());
    assert!(drawn.is_subset(&train));
    let held: Vec<_> = task.held_out_batches(HeldOut::Validation, 50, 20, Device::Cpu);
    assert_eq!(held.iter().map(|(x, _)| x.size()[0]).sum::<i64>(), 50);
}

#[test]
fn translation_pairs_fall_in_exactly_one_split() {
    let _serial = common::serial();
    let _generator = exclusive();
    let pairs: Vec<(String, String)> =
        (0..400).map(|i| (format!("the {i} cats sleep"), format!("los {i} gatos duermen"))).collect();
    let cfg = DataConfig { tokenizer: Tokenizer::Bpe, vocab_size: Some(300), ..Default::default() };
    let data = TranslationData::from_pairs(&pairs, &cfg, 16).unwrap();
    let set = |v: &[(Vec<i64>, Vec<i64>)]| -> HashSet<Vec<i64>> { v.iter().map(|p| p.0.clone()).collect() };
    let (train, validation, test) = (set(&data.train), set(&data.validation), set(&data.test));
    assert_eq!((train.len(), validation.len(), test.len()), (342, 38, 20));
    assert!(train.is_disjoint(&validation) && train.is_disjoint(&test) && validation.is_disjoint(&test));
}

/// A model of `width` weights whose training loss first draws a batch of indices, as every kind's objective
/// does, and records it.
struct Recording<'a> {
    w: &'a Tensor,
    drawn: std::cell::RefCell<Vec<Vec<i64>>>,
}

impl Objective for Recording<'_> {
    fn training_loss(&self, _shard: &BatchShard) -> Tensor {
        let batch = Tensor::randint(1000, [8], (Kind::Int64, Device::Cpu));
        self.drawn.borrow_mut().push(Vec::<i64>::try_from(&batch).unwrap());
        // Dropout-like draws of a size that depends on the model come after the batch.
        let _noise = Tensor::rand(self.w.size(), (Kind::Float, Device::Cpu));
        (self.w * self.w).sum(Kind::Float)
    }

    fn evaluate(&self, _step: i64) -> anyhow::Result<Evaluation> {
        Ok(Evaluation::default().with("val/loss", 1.0))
    }

    fn test(&self) -> anyhow::Result<Evaluation> {
        Ok(Evaluation::default())
    }
}

/// Common random numbers: arms with the same seed see the same data in the same order whatever their
/// models (each step's generator is seeded from (seed, step), and every objective draws its batch first),
/// and, where their parameters have the same shapes, start from the same weights (heads and activation
/// change no shape). A paired difference then leaves out the noise both arms share.
#[test]
fn arms_with_one_seed_share_the_data_order_and_where_shapes_agree_the_initial_weights() {
    let _serial = common::serial();
    let _generator = exclusive();
    let batches = |width: i64, seed: u64| {
        tch::manual_seed(seed as i64);
        let mut vs = nn::VarStore::new(Device::Cpu);
        let w = vs.root().randn("w", &[width], 0.0, 1.0);
        let objective = Recording { w: &w, drawn: Default::default() };
        let t = TrainConfig { steps: 5, eval_interval: 5, log_interval: 1, seed, ..Default::default() };
        optimise(&t, &objective, &mut vs, Device::Cpu, &mut |_, _| {}, None).unwrap();
        objective.drawn.into_inner()
    };
    let (small, large) = (batches(3, 4), batches(300, 4));
    assert_eq!(small.len(), 5);
    assert_eq!(small, large, "a model of another size saw other data");
    assert_ne!(small, batches(3, 5), "another seed, other data");
    use ablate::recipe::parse;
    let weights = |text: &str| {
        let recipe = parse(text, "crn.yaml", "crn", false).unwrap();
        let cfg = &recipe.runs[0].config;
        tch::manual_seed(cfg.train.seed as i64);
        let vs = nn::VarStore::new(Device::Cpu);
        let _model = ablate::tasks::task(cfg.kind).build(cfg, &vs.root(), 50);
        let mut named: Vec<(String, Tensor)> = vs.variables().into_iter().collect();
        named.sort_by(|a, b| a.0.cmp(&b.0));
        named
    };
    let base = "kind: lm\ntransformer: {d_model: 32, layers: 2, block_size: 16, heads: 1, activation: gelu}\n";
    let reference = weights(base);
    for other in [base.replace("heads: 1", "heads: 4"), base.replace("gelu", "relu")] {
        let theirs = weights(&other);
        assert_eq!(reference.len(), theirs.len());
        for ((name, a), (their_name, b)) in reference.iter().zip(&theirs) {
            assert_eq!(name, their_name);
            assert!(a.equal(b), "{other}: {name} starts elsewhere");
        }
    }
    let wider = weights(&base.replace("d_model: 32", "d_model: 48"));
    assert!(reference.iter().zip(&wider).any(|((_, a), (_, b))| a.size() != b.size()), "shapes differ there");
}
