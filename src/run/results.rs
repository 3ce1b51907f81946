//! The result files of a recipe: `runs.csv` (one row per finished run: the config keys it read and its
//! named metrics), `curves.csv` (step, split, metric, value per run), `samples.txt` and
//! `recipe.resolved.yaml`. Rows are appended one run
//! at a time and flushed, so an interrupted sweep keeps what finished and a re-run skips it.
use anyhow::{bail, Context, Result};
use serde_yaml::Value;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};

use crate::files::{write_atomically, DirLock};
use crate::metrics::Metric;
use crate::recipe::{columns, read_value, Recipe, RunSpec};
use crate::tasks::task;
use crate::train::RunOutcome;

/// Who a row is: its id, its legend label (the swept values without the seed), its seed, what it read, and
/// how it ended.
const RUN_FIXED_COLUMNS: [&str; 5] = ["run_id", "label", "seed", "config_hash", "status"];

/// The label of the `variants` entry a run belongs to (a column of its own when the recipe has variants).
fn variant_of(spec: &RunSpec) -> Option<&str> {
    spec.swept.iter().find(|(k, _)| k == "variant").map(|(_, v)| v.as_str())
}

/// The metrics a run records, in column order.
pub fn run_metrics(spec: &RunSpec) -> Vec<Metric> {
    task(spec.config.kind).metrics(&spec.config)
}

/// The columns of one run's `runs.csv` row, in order: who it is, the config keys its kind reads, its
/// metrics.
pub fn run_header(spec: &RunSpec) -> Vec<String> {
    RUN_FIXED_COLUMNS
        .iter()
        .map(|s| s.to_string())
        .chain(spec.tune.map(|_| "phase".to_string()))
        .chain(variant_of(spec).map(|_| "variant".to_string()))
        .chain(columns(&spec.config).into_iter().map(|(k, _)| k))
        .chain(run_metrics(spec).iter().filter_map(|m| m.column_name().map(String::from)))
        .collect()
}

/// The `runs.csv` columns of a whole recipe: every run's columns, in first-seen order. Runs of one sweep
/// can differ in their columns (a key only some kinds read, a task with an extra metric); each row leaves
/// the columns it does not have empty. Runs that all have the same columns keep exactly them.
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
    let status = match outcome.diverged_at {
        None => "ok".to_string(),
        Some(step) => format!("diverged at step {step}"),
    };
    // Metrics a diverged run does not have stay empty (plots skip them) rather than reading "NaN".
    let metrics = run_metrics(spec);
    let values = metrics.iter().filter_map(|m| m.column_name().map(|c| m.csv_value(outcome.get(c))));
    [spec.id.clone(), spec.label.clone(), spec.seed.to_string(), spec.config_hash.clone(), status]
        .into_iter()
        .chain(spec.tune.map(|t| t.phase().to_string()))
        .chain(variant_of(spec).map(String::from))
        .chain(columns(&spec.config).into_iter().map(|(_, v)| v))
        .chain(values)
        .collect()
}

/// The row of `run_row` laid out under `header` (a recipe's columns), empty where this run has no value.
pub fn row_under(header: &[String], spec: &RunSpec, outcome: &RunOutcome) -> Vec<String> {
    let values: HashMap<String, String> = run_header(spec).into_iter().zip(run_row(spec, outcome)).collect();
    header.iter().map(|c| values.get(c).cloned().unwrap_or_default()).collect()
}

/// What a results directory's `recipe.resolved.yaml` recorded that later commands read back (the rest of
/// the file is for people): the command line's overrides and the predictions the runs were made against.
#[derive(Debug, Default, serde::Deserialize)]
pub struct Recorded {
    #[serde(default)]
    pub overrides: Vec<String>,
    #[serde(default)]
    pub predictions: Vec<crate::recipe::compare::Prediction>,
    /// The settling plan recorded when the directory's first run started (`None`: its pilot ran before
    /// plans were recorded, or with no `compare:`).
    #[serde(default)]
    pub pilot_plan: Option<crate::recipe::compare::Plan>,
}

/// `dir`'s recorded overrides and predictions; empty when it has no readable `recipe.resolved.yaml`.
pub fn recorded(dir: &Path) -> Recorded {
    std::fs::read_to_string(dir.join("recipe.resolved.yaml"))
        .ok()
        .and_then(|text| serde_yaml::from_str(&text).ok())
        .unwrap_or_default()
}

/// Writes `recipe.resolved.yaml`: the recipe as it ran, every run's full config and hash.
pub fn write_resolved(recipe: &Recipe, path: &Path) -> Result<()> {
    #[derive(serde::Serialize)]
    struct Resolved<'a> {
        name: &'a str,
        source: &'a str,
        description: Option<&'a str>,
        smoke: bool,
        /// The command line's changes to the file (`train.steps=300`, `--sweep …`, `--seeds …`).
        #[serde(skip_serializing_if = "Vec::is_empty")]
        overrides: Vec<String>,
        sweep_keys: &'a [String],
        seeds: &'a [u64],
        /// The predictions (`compare.predict`) these results were run against, so that one edited later
        /// shows in the summary.
        #[serde(skip_serializing_if = "<[_]>::is_empty")]
        predictions: &'a [crate::recipe::compare::Prediction],
        /// The settling plan these results ran under, and the one recorded when the first of them started
        /// (kept from then on; absent where the pilot predates plans), so that a plan changed after the
        /// pilot shows in the verdicts.
        #[serde(skip_serializing_if = "Option::is_none")]
        plan: Option<crate::recipe::compare::Plan>,
        #[serde(skip_serializing_if = "Option::is_none")]
        pilot_plan: Option<crate::recipe::compare::Plan>,
        runs: Vec<BTreeMap<&'a str, Value>>,
    }
    let plan = recipe.compare.as_ref().map(|c| c.plan(recipe.seeds.len()));
    let dir = path.parent().unwrap_or(Path::new("."));
    let started = read_runs(&dir.join("runs.csv")).is_ok_and(|rows| !rows.is_empty());
    let pilot_plan = if started { recorded(dir).pilot_plan } else { plan.clone() };
    let runs = recipe
        .runs
        .iter()
        .map(|r| {
            let mut m = BTreeMap::new();
            m.insert("id", Value::from(r.id.as_str()));
            m.insert("config_hash", Value::from(r.config_hash.as_str()));
            m.insert("config", read_value(&r.config));
            m
        })
        .collect();
    let resolved = Resolved {
        name: &recipe.name,
        source: &recipe.file,
        description: recipe.description.as_deref(),
        smoke: recipe.smoke,
        overrides: recipe.overrides.describe(),
        sweep_keys: &recipe.sweep_keys,
        seeds: &recipe.seeds,
        predictions: recipe.compare.as_ref().map_or(&[], |c| c.predict.as_slice()),
        plan,
        pilot_plan,
        runs,
    };
    write_atomically(path, serde_yaml::to_string(&resolved)?.as_bytes())
}

/// The variants of `runs.csv` in first-seen order, each with its run ids, labelled for legends. Diverged
/// runs keep their curves up to the blow-up; the label says so, so a short line is not mistaken for a crash
/// or a plotting bug.
/// The tuned keys' values of a variant's final runs (`train.lr=0.001`; several if its runs differ).
pub fn chosen_values(runs: &[BTreeMap<String, String>], ids: &[String], keys: &[String]) -> String {
    let mut seen: Vec<String> = Vec::new();
    for r in runs.iter().filter(|r| ids.contains(&r["run_id"])) {
        let value = keys.iter().map(|k| format!("{k}={}", r.get(k).map_or("", |v| v))).collect::<Vec<_>>().join(" ");
        if !seen.contains(&value) {
            seen.push(value);
        }
    }
    seen.join("; ")
}

pub fn variants_of(runs: &[BTreeMap<String, String>]) -> Vec<(String, Vec<String>)> {
    let mut variants: Vec<(String, Vec<String>)> = Vec::new();
    for r in runs {
        let label = r["label"].clone();
        match variants.iter_mut().find(|v| v.0 == label) {
            Some(v) => v.1.push(r["run_id"].clone()),
            None => variants.push((label, vec![r["run_id"].clone()])),
        }
    }
    for (label, ids) in variants.iter_mut() {
        let steps: Vec<&str> = runs
            .iter()
            .filter(|r| ids.contains(&r["run_id"]))
            .filter_map(|r| r["status"].strip_prefix("diverged at step "))
            .collect();
        if steps.len() == ids.len() && ids.len() == 1 {
            label.push_str(&format!(" (diverged at step {})", steps[0]));
        } else if !steps.is_empty() {
            label.push_str(&format!(" ({} of {} runs diverged)", steps.len(), ids.len()));
        }
    }
    variants
}

/// The output directory of one recipe. A writer holds its lock: a second process is refused at start.
pub struct ResultsDir {
    pub dir: PathBuf,
    _lock: Option<std::sync::Arc<DirLock>>,
}

impl ResultsDir {
    /// Creates the directory if needed and takes its lock (see [`DirLock`]).
    pub fn create(dir: &Path) -> Result<Self> {
        std::fs::create_dir_all(dir)
            .with_context(|| format!("cannot create the output directory {}", dir.display()))?;
        let probe = dir.join(".write-test");
        File::create(&probe).with_context(|| format!("the output directory {} is not writable", dir.display()))?;
        let _ = std::fs::remove_file(probe);
        let lock = DirLock::acquire(dir)?;
        Ok(Self { dir: dir.to_path_buf(), _lock: Some(lock) })
    }

    /// A directory only read (the merged results a shard consults), without its lock.
    pub fn reader(dir: &Path) -> Self {
        Self { dir: dir.to_path_buf(), _lock: None }
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
        for derived in ["completions", "tensorboard"] {
            let path = self.dir.join(derived);
            if path.is_dir() {
                std::fs::remove_dir_all(&path)?;
            }
        }
        for derived in ["reproduction.csv", "index.html", FAILED_CSV] {
            let path = self.dir.join(derived);
            if path.exists() {
                std::fs::remove_file(&path)?;
            }
        }
        Ok(())
    }

    /// (run id, config hash) of every run already recorded in `runs.csv`.
    pub fn finished(&self) -> Result<HashSet<(String, String)>> {
        let path = self.runs_csv();
        if !path.exists() {
            return Ok(HashSet::new());
        }
        repair_torn_tail(&path)?;
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
        repair_torn_tail(&path)?;
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

/// The runs of a results directory that stopped on an out-of-memory error: `run_id`, `config_hash`, `error`
/// (one line: the estimate and the memory there was). They are not in `runs.csv` (nothing of them counts), and
/// a re-run trains them again.
pub const FAILED_CSV: &str = "failed.csv";

impl ResultsDir {
    /// Records that `spec` stopped on `error` (replacing an earlier record of it).
    pub fn record_failure(&self, spec: &RunSpec, error: &str) -> Result<()> {
        let mut rows = self.failures()?;
        rows.retain(|r| r[0] != spec.id);
        rows.push(vec![spec.id.clone(), spec.config_hash.clone(), error.to_string()]);
        self.write_failures(&rows)
    }

    /// Forgets the failures of `ids` (about to be trained again); the file goes when none is left.
    pub fn forget_failures(&self, ids: &HashSet<&str>) -> Result<()> {
        let rows = self.failures()?;
        let kept: Vec<Vec<String>> = rows.iter().filter(|r| !ids.contains(r[0].as_str())).cloned().collect();
        match (kept.len() == rows.len(), kept.is_empty()) {
            (true, _) => Ok(()),
            (false, true) => Ok(std::fs::remove_file(self.dir.join(FAILED_CSV))?),
            (false, false) => self.write_failures(&kept),
        }
    }

    /// The recorded failures, as rows of `run_id`, `config_hash`, `error`.
    pub fn failures(&self) -> Result<Vec<Vec<String>>> {
        let path = self.dir.join(FAILED_CSV);
        if !path.exists() {
            return Ok(Vec::new());
        }
        let mut reader = csv::Reader::from_path(&path)?;
        reader
            .records()
            .map(|r| Ok(r?.iter().map(str::to_string).collect()))
            .collect::<Result<_>>()
            .with_context(|| format!("{} is damaged; delete it (its runs train again)", path.display()))
    }

    fn write_failures(&self, rows: &[Vec<String>]) -> Result<()> {
        let mut writer = csv::Writer::from_writer(Vec::new());
        writer.write_record(["run_id", "config_hash", "error"])?;
        for row in rows {
            writer.write_record(row)?;
        }
        write_atomically(&self.dir.join(FAILED_CSV), &writer.into_inner()?)
    }
}

/// A CSV file whose last record was cut short (a write interrupted by power loss or a full disk: the file
/// does not end with a line break, or its last line has the wrong number of fields) loses that record, and
/// only it: the damaged file is kept beside it as `<name>.torn-<unix time>`, and one line says so. The run
/// that record belonged to never committed (`runs.csv` is written last), so it trains again.
pub fn repair_torn_tail(path: &Path) -> Result<()> {
    let bytes = std::fs::read(path).with_context(|| format!("cannot read {}", path.display()))?;
    if bytes.is_empty() {
        return Ok(());
    }
    // Complete records end with a line break; a file cut short keeps what precedes its last one.
    let mut keep =
        if bytes.ends_with(b"\n") { bytes.len() } else { bytes.iter().rposition(|&b| b == b'\n').map_or(0, |i| i + 1) };
    // A last line that ends but has the wrong number of fields (cut inside a quoted field) goes too.
    let mut reader = csv::ReaderBuilder::new().flexible(true).has_headers(false).from_reader(&bytes[..keep]);
    let records: Vec<csv::ByteRecord> =
        reader.byte_records().collect::<std::result::Result<_, _>>().unwrap_or_default();
    if let (Some(header), Some(last)) = (records.first(), records.last()) {
        if records.len() > 1 && last.len() != header.len() {
            let start = last.position().map_or(keep, |p| p.byte() as usize);
            keep = start.min(keep);
        }
    }
    if keep == bytes.len() {
        return Ok(());
    }
    let stamp = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0);
    let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    let backup = path.with_file_name(format!("{name}.torn-{stamp}"));
    std::fs::copy(path, &backup).with_context(|| format!("keeping a copy of {}", path.display()))?;
    write_atomically(path, &bytes[..keep])?;
    eprintln!(
        "ablate: {} ended in a torn record ({} bytes cut short); dropped it, kept the damaged file as {}",
        path.display(),
        bytes.len() - keep,
        backup.display()
    );
    Ok(())
}

/// Appends rows to a CSV file, writing the header if the file is new; refuses if the existing header differs.
fn append_rows(path: &Path, header: &[String], rows: &[Vec<String>]) -> Result<()> {
    let exists = path.exists() && std::fs::metadata(path)?.len() > 0;
    if exists {
        let mut reader = csv::Reader::from_path(path)?;
        let existing = reader.headers()?.clone();
        let wanted = csv::StringRecord::from(header.to_vec());
        if existing != wanted {
            if !covers(&wanted, &existing) {
                bail!(
                    "{} was written by a different version of this recipe (its columns differ); re-run with --force to start over",
                    path.display()
                );
            }
            widen_csv(path, &existing, &wanted)?;
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

/// Whether `wide` has every column of `narrow`: a `runs.csv` written under `narrow` predates columns added
/// since, and can be widened to `wide` ([`widened`]) rather than refused.
pub(crate) fn covers(wide: &csv::StringRecord, narrow: &csv::StringRecord) -> bool {
    narrow.iter().all(|c| wide.iter().any(|w| w == c))
}

/// `row`, written under `own`, under `target` (a header that [`covers`] it): the columns it lacks empty.
pub(crate) fn widened(
    row: &csv::StringRecord,
    own: &csv::StringRecord,
    target: &csv::StringRecord,
) -> csv::StringRecord {
    let by_column: HashMap<&str, &str> = own.iter().zip(row.iter()).collect();
    target.iter().map(|c| by_column.get(c).copied().unwrap_or("")).collect()
}

/// Rewrites `path` (atomically) under `header`, which [`covers`] the `existing` one: a file written before a
/// column was added (e.g. `params_non_embedding`) keeps every row, with the new columns empty, so resuming or
/// adding seeds to an older results directory appends instead of refusing. Says so in one line.
fn widen_csv(path: &Path, existing: &csv::StringRecord, header: &csv::StringRecord) -> Result<()> {
    let mut reader = csv::Reader::from_path(path)?;
    let mut buf = csv::Writer::from_writer(Vec::new());
    buf.write_record(header)?;
    let mut rows = 0usize;
    for record in reader.records() {
        buf.write_record(&widened(&record?, existing, header))?;
        rows += 1;
    }
    let bytes = buf.into_inner().map_err(|e| anyhow::anyhow!("{e}"))?;
    write_atomically(path, &bytes)?;
    let added: Vec<&str> = header.iter().filter(|c| !existing.iter().any(|e| e == *c)).collect();
    eprintln!(
        "ablate: {} predates the column(s) {}: its {rows} row(s) keep their values, with those columns empty",
        path.display(),
        added.join(", ")
    );
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

/// The reported rows of `runs.csv`, as column -> value maps: every row but a tuned recipe's tuning runs
/// (`phase` `tune`), which summaries, plots, reports and reproduction leave out.
pub fn read_runs(path: &Path) -> Result<Vec<BTreeMap<String, String>>> {
    let rows = read_all_runs(path)?;
    Ok(rows.into_iter().filter(|r| r.get("phase").is_none_or(|p| p != "tune")).collect())
}

/// Every row of `runs.csv`, tuning runs included, as column -> value maps.
pub fn read_all_runs(path: &Path) -> Result<Vec<BTreeMap<String, String>>> {
    let mut reader = csv::Reader::from_path(path).with_context(|| format!("cannot read {}", path.display()))?;
    let header: Vec<String> = reader.headers()?.iter().map(String::from).collect();
    // Plots and summaries group runs by these; a table without them (hand-made, or from an older ablate)
    // is refused here rather than failing deep inside a chart.
    for needed in ["run_id", "label", "status"] {
        if !header.iter().any(|h| h == needed) {
            bail!(
                "{} has no `{needed}` column: it was not written by this version of ablate (rerun the recipe)",
                path.display()
            );
        }
    }
    // Rows of the wrong length are refused by the reader itself (it is not `flexible`).
    reader
        .records()
        .map(|r| {
            let r = r.with_context(|| format!("{} is malformed", path.display()))?;
            Ok(header.iter().cloned().zip(r.iter().map(String::from)).collect())
        })
        .collect()
}
