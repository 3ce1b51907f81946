//! The result files of a recipe: `runs.csv` (one row per finished run, every resolved config value as a
//! column), `curves.csv` (step, split, metric, value per run) and `samples.txt`. Rows are appended one run
//! at a time and flushed, so an interrupted sweep keeps what finished and a re-run skips it.
use anyhow::{bail, Context, Result};
use serde_yaml::Value;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};

use crate::config::Config;
use crate::recipe::RunSpec;
use crate::train::RunOutcome;

/// Every leaf of the config as (dotted key, text value), in declaration order.
pub fn flatten_config(config: &Config) -> Vec<(String, String)> {
    fn walk(prefix: &str, v: &Value, out: &mut Vec<(String, String)>) {
        match v {
            Value::Mapping(m) => {
                for (k, v) in m {
                    let k = k.as_str().unwrap_or_default();
                    let key = if prefix.is_empty() { k.to_string() } else { format!("{prefix}.{k}") };
                    walk(&key, v, out);
                }
            }
            Value::Null => out.push((prefix.to_string(), String::new())),
            Value::Sequence(items) => out.push((prefix.to_string(), serde_json::to_string(items).unwrap_or_default())),
            Value::String(s) => out.push((prefix.to_string(), s.clone())),
            other => {
                out.push((prefix.to_string(), serde_yaml::to_string(other).unwrap_or_default().trim().to_string()))
            }
        }
    }
    let mut out = Vec::new();
    walk("", &serde_yaml::to_value(config).expect("config serialises"), &mut out);
    // Derived values a reader needs and the config leaves implicit.
    for (k, v) in out.iter_mut() {
        if k == "model.ffn_hidden" && v.is_empty() {
            *v = config.model.ffn_hidden().to_string();
        }
    }
    out
}

const RUN_FIXED_COLUMNS: [&str; 5] = ["run_id", "variant", "seed", "config_hash", "status"];
const RUN_METRIC_COLUMNS: [&str; 10] = [
    "params",
    "train_loss",
    "val_loss",
    "val_perplexity",
    "val_accuracy",
    "wall_s",
    "tokens_per_s",
    "model_tflops",
    "mfu",
    "steps",
];

/// Result columns only some runs have, after the common metrics: ImageGPT's bits per dimension (its test
/// loss in base 2) and linear-probe test accuracy; BERT's masked-LM held-out loss and accuracy (after
/// pre-training) and the fine-tuned task's F1 (and exact match for span prediction); a translator's BLEU
/// and exact-match rate on held-out pairs (and, decoding by beam search, the same model's greedy BLEU).
pub fn extra_columns(config: &Config) -> &'static [&'static str] {
    match (&config.vision, &config.bert) {
        (Some(v), _) if v.arch == crate::vision::Arch::ImageGpt => &["bits_per_dim", "probe_accuracy"],
        (_, Some(b)) if b.task == crate::config::BertTask::Locate => &["mlm_loss", "mlm_accuracy", "f1", "exact_match"],
        (_, Some(_)) => &["mlm_loss", "mlm_accuracy", "f1"],
        _ if config.translate.as_ref().is_some_and(|t| t.beam_width > 1) => &["bleu", "exact_match", "bleu_greedy"],
        _ if config.translate.is_some() => &["bleu", "exact_match"],
        _ => &[],
    }
}

/// The columns of one run's `runs.csv` row, in order.
pub fn run_header(spec: &RunSpec) -> Vec<String> {
    RUN_FIXED_COLUMNS
        .iter()
        .map(|s| s.to_string())
        .chain(flatten_config(&spec.config).into_iter().map(|(k, _)| k))
        .chain(RUN_METRIC_COLUMNS.iter().map(|s| s.to_string()))
        .chain(extra_columns(&spec.config).iter().map(|s| s.to_string()))
        .chain(
            spec.config
                .train
                .eval_lengths
                .iter()
                .flat_map(|k| [format!("val_loss_x{k}"), format!("val_accuracy_x{k}")]),
        )
        .collect()
}

/// The `runs.csv` columns of a whole recipe: every run's columns, in first-seen order. Runs of one sweep
/// can differ in their columns (a key that is only written when set, a task with an extra metric); each row
/// leaves the columns it does not have empty. Runs that all have the same columns keep exactly them.
pub fn recipe_header(specs: &[RunSpec]) -> Vec<String> {
    let mut header: Vec<String> = Vec::new();
    for spec in specs {
        let own = run_header(spec);
        // Columns new to the header go after the last column they follow in this run, so a key that only
        // some runs have stays inside its section rather than at the end.
        let mut at = 0;
        for column in own {
            match header.iter().position(|c| *c == column) {
                Some(i) => at = i + 1,
                None => {
                    header.insert(at, column);
                    at += 1;
                }
            }
        }
    }
    header
}

pub fn run_row(spec: &RunSpec, outcome: &RunOutcome) -> Vec<String> {
    let e = &outcome.final_eval;
    // Metrics a diverged run does not have stay empty (plots skip them) rather than reading "NaN".
    let num = |v: f64, digits: usize| if v.is_finite() { format!("{v:.digits$}") } else { String::new() };
    let metrics = [
        outcome.params.to_string(),
        num(outcome.final_train_loss, 6),
        num(e.loss, 6),
        num(e.loss.exp(), 6),
        num(e.accuracy, 6),
        format!("{:.3}", outcome.wall_s),
        format!("{:.1}", outcome.tokens_per_s),
        format!("{:.4}", outcome.model_flops / 1e12),
        format!("{:.4}", outcome.mfu),
        spec.config.train.steps.to_string(),
    ];
    let extra = (0..extra_columns(&spec.config).len())
        .map(|i| outcome.extra_metrics.get(i).map_or(String::new(), |&v| num(v, 6)));
    // Empty where the model cannot read that length (a learned position table).
    let lengths = outcome.length_evals.iter().flat_map(|(_, e)| match e {
        Some(e) => [num(e.loss, 6), num(e.accuracy, 6)],
        None => [String::new(), String::new()],
    });
    let status = match outcome.diverged_at {
        None => "ok".to_string(),
        Some(step) => format!("diverged at step {step}"),
    };
    [spec.id.clone(), spec.label.clone(), spec.seed.to_string(), spec.config_hash.clone(), status]
        .into_iter()
        .chain(flatten_config(&spec.config).into_iter().map(|(_, v)| v))
        .chain(metrics)
        .chain(extra)
        .chain(lengths)
        .collect()
}

/// The row of `run_row` laid out under `header` (a recipe's columns), empty where this run has no value.
pub fn row_under(header: &[String], spec: &RunSpec, outcome: &RunOutcome) -> Vec<String> {
    let values: HashMap<String, String> = run_header(spec).into_iter().zip(run_row(spec, outcome)).collect();
    header.iter().map(|c| values.get(c).cloned().unwrap_or_default()).collect()
}

/// The output directory of one recipe.
pub struct ResultsDir {
    pub dir: PathBuf,
}

impl ResultsDir {
    pub fn create(dir: &Path) -> Result<Self> {
        std::fs::create_dir_all(dir)
            .with_context(|| format!("cannot create the output directory {}", dir.display()))?;
        let probe = dir.join(".write-test");
        File::create(&probe).with_context(|| format!("the output directory {} is not writable", dir.display()))?;
        let _ = std::fs::remove_file(probe);
        Ok(Self { dir: dir.to_path_buf() })
    }

    pub fn runs_csv(&self) -> PathBuf {
        self.dir.join("runs.csv")
    }

    pub fn curves_csv(&self) -> PathBuf {
        self.dir.join("curves.csv")
    }

    /// Deletes previous results (for `--force`), resumable training states included: starting over must
    /// not continue from them.
    pub fn clear(&self) -> Result<()> {
        for f in ["runs.csv", "curves.csv", "samples.txt"] {
            let p = self.dir.join(f);
            if p.exists() {
                std::fs::remove_file(&p)?;
            }
        }
        if let Ok(entries) = std::fs::read_dir(self.dir.join("checkpoints")) {
            for e in entries.filter_map(|e| e.ok()) {
                if e.file_name().to_string_lossy().ends_with(".state.safetensors") {
                    std::fs::remove_file(e.path())?;
                }
            }
        }
        let grids = self.dir.join("completions");
        if grids.is_dir() {
            std::fs::remove_dir_all(&grids)?;
        }
        Ok(())
    }

    /// (run id, config hash) of every run already recorded in `runs.csv`.
    pub fn finished(&self) -> Result<HashSet<(String, String)>> {
        let path = self.runs_csv();
        if !path.exists() {
            return Ok(HashSet::new());
        }
        let mut reader = csv::Reader::from_path(&path)?;
        let mut done = HashSet::new();
        for row in reader.records() {
            let row = row.with_context(|| format!("{} is damaged; re-run with --force", path.display()))?;
            done.insert((row[0].to_string(), row[3].to_string()));
        }
        Ok(done)
    }

    /// Drops curve rows of runs that never reached `runs.csv` (a run killed mid-way), so a re-run does not
    /// duplicate them. Rewrites through a temporary file and a rename.
    pub fn drop_orphan_curves(&self, finished: &HashSet<(String, String)>) -> Result<()> {
        let path = self.curves_csv();
        if !path.exists() {
            return Ok(());
        }
        let ids: HashSet<&str> = finished.iter().map(|(id, _)| id.as_str()).collect();
        let mut reader = csv::Reader::from_path(&path)?;
        let header = reader.headers()?.clone();
        let rows: Vec<csv::StringRecord> = reader.records().collect::<Result<_, _>>()?;
        let keep: Vec<&csv::StringRecord> = rows.iter().filter(|r| ids.contains(&r[0])).collect();
        if keep.len() == rows.len() {
            return Ok(());
        }
        let tmp = path.with_extension("csv.tmp");
        {
            let mut w = csv::Writer::from_path(&tmp)?;
            w.write_record(&header)?;
            for r in keep {
                w.write_record(r)?;
            }
            w.flush()?;
        }
        std::fs::rename(tmp, path)?;
        Ok(())
    }

    /// Appends one finished run: its curve rows first, then its `runs.csv` row (the commit point) under
    /// `header` (the recipe's columns, [`recipe_header`]), then its sample.
    pub fn append(&self, header: &[String], spec: &RunSpec, outcome: &RunOutcome) -> Result<()> {
        let curve_rows: Vec<Vec<String>> = outcome
            .curves
            .iter()
            .map(|p| {
                vec![
                    spec.id.clone(),
                    p.step.to_string(),
                    p.split.to_string(),
                    p.metric.to_string(),
                    format!("{:.6}", p.value),
                ]
            })
            .collect();
        let curve_header: Vec<String> =
            ["run_id", "step", "split", "metric", "value"].iter().map(|s| s.to_string()).collect();
        append_rows(&self.curves_csv(), &curve_header, &curve_rows)?;
        append_rows(&self.runs_csv(), header, &[row_under(header, spec, outcome)])?;
        if !outcome.sample.is_empty() {
            let mut samples = OpenOptions::new().create(true).append(true).open(self.dir.join("samples.txt"))?;
            writeln!(samples, "== {} ==\n{}\n", spec.id, outcome.sample)?;
        }
        Ok(())
    }
}

/// Replaces `path` with `bytes` through a temporary file and a rename: a reader (or a kill) sees the old
/// file or the new one, never half of one.
pub fn write_atomically(path: &Path, bytes: &[u8]) -> Result<()> {
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, bytes).with_context(|| format!("writing {}", tmp.display()))?;
    std::fs::rename(&tmp, path).with_context(|| format!("writing {}", path.display()))?;
    Ok(())
}

/// Appends rows to a CSV file, writing the header if the file is new; refuses if the existing header differs.
fn append_rows(path: &Path, header: &[String], rows: &[Vec<String>]) -> Result<()> {
    let exists = path.exists() && std::fs::metadata(path)?.len() > 0;
    if exists {
        let mut reader = csv::Reader::from_path(path)?;
        let existing: Vec<String> = reader.headers()?.iter().map(String::from).collect();
        if existing != header {
            bail!(
                "{} was written by a different version of this recipe (its columns differ); re-run with --force to start over",
                path.display()
            );
        }
    }
    // Build the whole chunk first and write it with one call, so a crash cannot leave half a row.
    let mut buf = csv::Writer::from_writer(Vec::new());
    if !exists {
        buf.write_record(header)?;
    }
    for r in rows {
        buf.write_record(r)?;
    }
    let bytes = buf.into_inner().map_err(|e| anyhow::anyhow!("{e}"))?;
    let mut f = OpenOptions::new().create(true).append(true).open(path)?;
    f.write_all(&bytes)?;
    f.sync_data()?;
    Ok(())
}

/// All rows of `curves.csv` grouped as run id -> metric key (`split/metric`) -> [(step, value)].
pub type Curves = BTreeMap<String, BTreeMap<String, Vec<(i64, f64)>>>;

pub fn read_curves(path: &Path) -> Result<Curves> {
    let mut out: Curves = BTreeMap::new();
    let mut reader = csv::Reader::from_path(path)?;
    for row in reader.records() {
        let row = row?;
        let key = format!("{}/{}", &row[2], &row[3]);
        let step: i64 = row[1].parse()?;
        let value: f64 = row[4].parse()?;
        out.entry(row[0].to_string()).or_default().entry(key).or_default().push((step, value));
    }
    Ok(out)
}

/// `runs.csv` as a list of column -> value maps.
pub fn read_runs(path: &Path) -> Result<Vec<BTreeMap<String, String>>> {
    let mut reader = csv::Reader::from_path(path)?;
    let header: Vec<String> = reader.headers()?.iter().map(String::from).collect();
    reader.records().map(|r| Ok(header.iter().cloned().zip(r?.iter().map(String::from)).collect())).collect()
}
