//! One task per kind of run. A [`Task`] owns everything that depends on what a run trains: the data it
//! reads, the model it builds, its objective and evaluation, its FLOP count, what its checkpoint holds and
//! its named metrics. The sweep, `describe`, `summary`, `plot`, `generate`, `attention` and checkpoint
//! loading all go through [`task`]; the one other place that branches on the kind is `run::interaction`,
//! which draws each family's attention pattern from its structural settings.
//!
//! Adding a kind: a variant of `recipe::Kind` (with its defaults in `Config::defaults`, the keys it reads in
//! `recipe/reads.rs`), a model file under `models/`, and a file here implementing `Task`, listed in
//! [`task`]. The knob matrix test (`tests/knobs.rs`) then checks every Transformer knob on it.
use anyhow::{bail, Context, Result};
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use tch::{nn, Device, Tensor};

use crate::data::images::ImageTask;
use crate::data::spam::Email;
use crate::data::tokenize::TextTokenizer;
use crate::data::Dataset;
use crate::metrics::Metric;
use crate::models::decode::NextToken;
use crate::recipe::{Config, Kind};
use crate::train::{Evaluation, Progress, RunOutcome, StateFile};
use crate::transformer::attention::weight_statistics;

pub mod bert;
pub mod checkpoint;
pub mod classify;
pub mod export;
pub mod imagegpt;
pub mod import;
pub mod lm;
pub mod memory;
pub mod pretrained;
pub mod seq_classify;
pub mod translate;

/// The metric declarations of a recipe's runs, derived once (each run's task declares its metrics from its
/// config): what a results directory's readers (`judge::reading::Results`) name, head and judge columns by.
#[derive(Clone, Debug)]
pub struct Declarations {
    /// (run id, variant label, the metrics that run records) in run order.
    per_run: Vec<(String, String, Vec<Metric>)>,
    /// Every metric once ([`Declarations::metrics`]).
    metrics: Vec<Metric>,
}

impl Declarations {
    /// Every run's declarations. A detail column that the recipe's `compare` section names (its primary
    /// metric, a prediction's metric or a δ) is judged like a headline one: the recipe asked for it
    /// (`test_loss_x8` in a length-extrapolation control).
    pub fn of(recipe: &crate::recipe::Recipe) -> Self {
        let named = |column: &str| {
            recipe.compare.as_ref().is_some_and(|c| {
                c.primary.as_deref() == Some(column)
                    || c.delta.contains_key(column)
                    || c.predict.iter().any(|p| p.metric == column)
            })
        };
        let per_run: Vec<(String, String, Vec<Metric>)> = recipe
            .runs
            .iter()
            .map(|run| (run.id.clone(), run.label.clone(), task(run.config.kind).metrics(&run.config)))
            .collect();
        let mut metrics: Vec<Metric> = Vec::new();
        for m in per_run.iter().flat_map(|(_, _, ms)| ms) {
            if !metrics.iter().any(|o| o.column == m.column && o.curve == m.curve) {
                let mut m = m.clone();
                m.headline |= m.column_name().is_some_and(named);
                metrics.push(m);
            }
        }
        Declarations { per_run, metrics }
    }

    /// Every metric the recipe's runs record, once each (the first run's declaration of a name wins).
    pub fn metrics(&self) -> &[Metric] {
        &self.metrics
    }

    /// (run id, variant label, its metrics) of every run, in run order.
    pub fn runs(&self) -> impl Iterator<Item = (&str, &str, &[Metric])> {
        self.per_run.iter().map(|(id, label, ms)| (id.as_str(), label.as_str(), ms.as_slice()))
    }

    /// The declarations of `m`'s column (and curve) by every run, in run order, with the run's label.
    fn of_column<'a>(&'a self, m: &'a Metric) -> impl Iterator<Item = (&'a str, &'a Metric)> + 'a {
        self.per_run.iter().flat_map(move |(_, label, ms)| {
            ms.iter().filter(move |o| o.column == m.column && o.curve == m.curve).map(move |o| (label.as_str(), o))
        })
    }

    /// `m` as the runs labelled `variant` declare it. A sweep over tasks (`bert.task: [spam, punctuation]`)
    /// gives one column a meaning per task, and [`Declarations::metrics`] keeps the first run's, so a row
    /// about one variant takes its name from that variant's own task; `m` itself when no run of `variant`
    /// declares it.
    pub fn of_variant(&self, variant: &str, m: &Metric) -> Metric {
        self.of_column(m).find(|(label, _)| *label == variant).map_or_else(|| m.clone(), |(_, o)| o.clone())
    }

    /// `m`'s axis title over the whole recipe: its one title, or every distinct title its runs give the
    /// column, joined by " / " (a column shared by tasks that mean different things by it).
    pub fn heading(&self, m: &Metric) -> String {
        let mut titles: Vec<String> = Vec::new();
        for (_, o) in self.of_column(m) {
            let title = o.axis();
            if !titles.contains(&title) {
                titles.push(title);
            }
        }
        if titles.is_empty() {
            m.axis()
        } else {
            titles.join(" / ")
        }
    }
}

/// [`Declarations::metrics`] of a recipe, for the checks made before any run (a results directory's readers
/// take them from `judge::reading::Results`, derived once).
pub fn recipe_metrics(recipe: &crate::recipe::Recipe) -> Vec<Metric> {
    Declarations::of(recipe).metrics
}

/// The task of a kind of run.
pub fn task(kind: Kind) -> &'static dyn Task {
    match kind {
        Kind::Lm => &lm::LanguageModel,
        Kind::Bert => &bert::Bert,
        Kind::Translate => &translate::Translation,
        Kind::Vit | Kind::Swin | Kind::Davit | Kind::Cnn => &classify::Classification,
        Kind::ImageGpt => &imagegpt::ImageGpt,
        Kind::SeqClassify => &seq_classify::SequenceClassification,
    }
}

/// Data runs read, loaded once per distinct setting and shared by every run that reads it; checked before
/// anything trains.
#[derive(Default)]
pub struct DataCache {
    text: HashMap<String, Dataset>,
    images: HashMap<String, ImageTask>,
    pairs: HashMap<String, translate::TranslationData>,
    emails: Option<Vec<Email>>,
    sequences: HashMap<String, seq_classify::Sequences>,
    /// Where `$RESULTS/` checkpoints live: the directory holding the recipe's output directory.
    pub results_root: PathBuf,
    /// No progress lines.
    pub quiet: bool,
}

impl DataCache {
    pub fn new(results_root: &Path, quiet: bool) -> Self {
        Self { results_root: results_root.to_path_buf(), quiet, ..Default::default() }
    }

    /// The entry of `key` in `map`, loaded by `load` the first time.
    fn get_or_load<T>(map: &mut HashMap<String, T>, key: String, load: impl FnOnce() -> Result<T>) -> Result<&T> {
        if !map.contains_key(&key) {
            let value = load()?;
            map.insert(key.clone(), value);
        }
        Ok(&map[&key])
    }

    fn loaded<'a, T>(map: &'a HashMap<String, T>, key: &str) -> Result<&'a T> {
        map.get(key).context("the run's data was not prepared (Task::prepare runs before training)")
    }
}

/// Where and how a run trains.
pub struct RunContext<'a> {
    pub device: Device,
    pub progress: Progress<'a>,
    /// The run's resumable state, when the sweep keeps one.
    pub state: Option<&'a StateFile>,
    /// The results directory, for files a kind writes besides the CSVs (ImageGPT's completion grids).
    pub out: &'a Path,
    /// The run's id made safe for a file name: what those files are called.
    pub stem: &'a str,
}

/// A trained run: its measurements, its weights, and the vocabulary a text model's checkpoint keeps.
pub struct Trained {
    pub outcome: RunOutcome,
    pub vs: nn::VarStore,
    pub tokenizer: Option<TextTokenizer>,
}

/// A built model of any kind, for inspection.
pub trait Built {
    /// The model's output on a fixed input of `batch` examples made from its config (token ids, image
    /// patterns): the same input for every model of the same shape, built on `device`, which must be the
    /// model's (a test forbids building it anywhere else). With `train`, dropout is on.
    fn forward_example(&self, batch: i64, train: bool, device: Device) -> Tensor;
    /// Every layer's attention weights on token ids (1, N); `None` for a kind that reads no text.
    fn attention_on_tokens(&self, _ids: &Tensor) -> Option<Vec<Tensor>> {
        None
    }
    /// The model as a next-token predictor, for a kind that generates text.
    fn decoder(&self) -> Option<&dyn NextToken> {
        None
    }
    /// The GPT itself, for a language model (to inspect or mask its heads).
    fn gpt(&self) -> Option<&crate::models::gpt::Gpt> {
        None
    }
}

pub trait Task: Sync {
    /// Named metrics of a run: its own, then the optimisation curves and the cost every run records.
    fn metrics(&self, cfg: &Config) -> Vec<Metric>;

    /// Loads (once per distinct setting) and checks everything the run reads, before anything trains.
    fn prepare(&self, cfg: &Config, data: &mut DataCache) -> Result<()>;

    /// Trains the run on prepared data.
    fn train(&self, cfg: &Config, data: &DataCache, ctx: RunContext) -> Result<Trained>;

    /// The size of the model's input vocabulary for this run (0 for image classifiers), from prepared data.
    fn vocab(&self, cfg: &Config, data: &DataCache) -> Result<i64>;

    /// The run's model under `vs`, exactly as training builds it (so parameter counts agree), over
    /// `vocab` tokens.
    fn build(&self, cfg: &Config, vs: &nn::Path, vocab: i64) -> Box<dyn Built>;

    /// Analytic forward FLOPs of one example, and what an example is ("image", "sequence of 64 tokens").
    fn forward_flops(&self, cfg: &Config, params: i64, vocab: i64) -> (f64, String);

    /// Tokens one training example holds, as its throughput counts them (a text block, patch tokens,
    /// pixels; a translation pair's mean length), from prepared data: what a tokens budget divides by.
    fn tokens_per_example(&self, cfg: &Config, data: &DataCache) -> Result<f64>;

    /// The loss, in the run's test-loss units, of a model that knows only the training text's token
    /// frequencies ([`crate::data::text::TextData::unigram_cross_entropy`]), for a kind whose test loss is
    /// a mean over text tokens; `None` for the others.
    fn frequency_level(&self, _cfg: &Config, _data: &DataCache) -> Result<Option<f64>> {
        Ok(None)
    }
}

/// Steps a seconds budget may take at most: a ceiling it does not reach (the loop stops at the budget).
pub const SECONDS_BUDGET_CEILING: i64 = 1_000_000_000;

/// The run's config as it trains: a tokens or FLOPs budget (`train.budget`) turned into the steps it buys,
/// from the run's prepared data (its vocabulary and examples); a seconds budget given a ceiling of steps
/// it will not reach. Refuses, in one line, a budget that buys no step or no more steps than the warm-up.
pub fn budgeted(cfg: &Config, data: &DataCache) -> Result<Config> {
    use crate::recipe::BudgetKind as Budget;
    let Some(budget) = cfg.train.budget.and_then(|b| b.kind()) else { return Ok(cfg.clone()) };
    let (t, kind) = (&cfg.train, task(cfg.kind));
    let mut out = cfg.clone();
    let (per_step, unit) = match budget {
        Budget::Seconds(_) => {
            out.train.steps = SECONDS_BUDGET_CEILING;
            return Ok(out);
        }
        Budget::Tokens(_) => (kind.tokens_per_example(cfg, data)? * t.global_batch() as f64, "tokens"),
        Budget::Flops(_) => {
            let vocab = kind.vocab(cfg, data)?;
            let per_example = kind.forward_flops(cfg, parameter_count(cfg, vocab), vocab).0;
            (3.0 * per_example * t.global_batch() as f64, "FLOPs")
        }
    };
    let steps = (budget.amount() / per_step).floor();
    if steps < 1.0 {
        bail!("train.budget: {:.4e} {unit} buy no step (one step takes {per_step:.4e})", budget.amount());
    }
    if steps as i64 <= t.warmup_steps {
        bail!(
            "train.budget: {:.4e} {unit} buy {steps} steps, no more than train.warmup_steps = {}",
            budget.amount(),
            t.warmup_steps
        );
    }
    out.train.steps = steps as i64;
    Ok(out)
}

/// Trainable parameters of a run's model over `vocab` tokens (built on the CPU).
pub fn parameter_count(cfg: &Config, vocab: i64) -> i64 {
    let vs = nn::VarStore::new(Device::Cpu);
    drop(task(cfg.kind).build(cfg, &vs.root(), vocab));
    vs.trainable_variables().iter().map(|t| t.numel() as i64).sum()
}

/// Token ids (B, N) of the fixed example input: a deterministic walk through the vocabulary.
pub fn example_tokens(batch: i64, n: i64, vocab: i64, device: Device) -> Tensor {
    let i = Tensor::arange(batch * n, (tch::Kind::Int64, device));
    ((i * 7 + 3).remainder(vocab.max(1))).view([batch, n])
}

/// Images (B, C, S, S) of the fixed example input in the model's input range [−1, 1]: smooth patterns that
/// differ per example and channel.
pub fn example_images(batch: i64, channels: i64, size: i64, device: Device) -> Tensor {
    let i = Tensor::arange(batch * channels * size * size, (tch::Kind::Float, device));
    (i * 0.37).sin().view([batch, channels, size, size])
}

/// Mean cross-entropy and accuracy of the class logits `logits(x)` over held-out `batches` of (inputs,
/// labels), under `val/loss` and `val/accuracy` (this rank's share in a data-parallel group, summed over it).
pub fn classification_score(batches: &[(Tensor, Tensor)], logits: impl Fn(&Tensor) -> Tensor) -> Result<Evaluation> {
    let _guard = tch::no_grad_guard();
    let [loss, correct, count] = crate::train::distributed::sum_over_share(batches, |(x, y)| {
        let logits = logits(x).to_kind(tch::Kind::Float);
        let n = y.size()[0] as f64;
        [
            logits.cross_entropy_for_logits(y).double_value(&[]) * n,
            logits.argmax(-1, false).eq_tensor(y).to_kind(tch::Kind::Float).sum(tch::Kind::Float).double_value(&[]),
            n,
        ]
    })?;
    Ok(Evaluation::default().with("val/loss", loss / count).with("val/accuracy", correct / count))
}

/// `e` with the attention probes of `weights` (one tensor per layer or block): the mean entropy of the
/// attention rows and the mean of each row's largest weight, averaged over the layers.
pub fn probe(e: Evaluation, weights: &[Tensor]) -> Evaluation {
    let stats: Vec<(f64, f64)> = weights.iter().map(|w| weight_statistics(&w.to_kind(tch::Kind::Float))).collect();
    let n = stats.len().max(1) as f64;
    let entropy = stats.iter().map(|s| s.0).sum::<f64>() / n;
    let max_weight = stats.iter().map(|s| s.1).sum::<f64>() / n;
    e.with("val/attn_entropy", entropy).with("val/attn_max_weight", max_weight)
}
