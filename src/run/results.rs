//! Writing the result files of a recipe: `runs.csv` (one row per finished run: the config keys it read and
//! its named metrics), `curves.csv` (step, split, metric, value per run), `samples.txt` and
//! `recipe.resolved.yaml`. Rows are appended one run at a time and flushed, so an interrupted sweep keeps
//! what finished and a re-run skips it. They are read back through `judge::reading`, the one parser.
use anyhow::{bail, Context, Result};
use serde_yaml::Value;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};

use crate::files::{write_atomically, DirLock};
use crate::judge::reading::{recorded, repair_torn_tail, row_under, table};
use crate::recipe::{read_value, Recipe, RunSpec};
use crate::train::RunOutcome;

/// The pilot plan a shard of `dir` (`dir/shards/*/`) recorded when it started, from a shard that trained a
/// pilot seed (`pilot_seeds`, the recipe's own): a shard first started for added seeds recorded the plan of
/// that later time, which is no evidence of the pilot's.
fn shards_pilot_plan(dir: &Path, pilot_seeds: &[u64]) -> Option<crate::recipe::compare::Plan> {
    let mut shards: Vec<PathBuf> =
        std::fs::read_dir(dir.join("shards")).ok()?.filter_map(|e| Some(e.ok()?.path())).collect();
    shards.sort();
    let trained_pilot = |shard: &Path| {
        crate::judge::reading::all_runs(shard)
            .is_ok_and(|rows| !crate::judge::reading::rows_of_seeds(&rows, pilot_seeds).is_empty())
    };
    shards.iter().filter(|s| trained_pilot(s)).find_map(|shard| recorded(shard).pilot_plan)
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
    let started = table(&dir.join("runs.csv")).is_ok_and(|(_, rows)| !rows.is_empty());
    // A directory whose runs were trained by shards (a worker pool, Slurm) gets its first record at the merge,
    // after its pilot: the plan then is the one its shards recorded when they started training the pilot.
    let pilot_plan = match started {
        true => recorded(dir).pilot_plan.or_else(|| shards_pilot_plan(dir, &recipe.seeds)),
        false => plan.clone(),
    };
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
        let (_, rows) = table(&path).context("re-run with --force to start over")?;
        Ok(rows.iter().map(|row| (row[0].to_string(), row[3].to_string())).collect())
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
        let (header, rows) = table(&path)?;
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
        let (_, rows) = table(&path).context("delete it (its runs train again)")?;
        Ok(rows.iter().map(|r| r.iter().map(str::to_string).collect()).collect())
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

/// Appends rows to a CSV file, writing the header if the file is new; refuses if the existing header differs.
fn append_rows(path: &Path, header: &[String], rows: &[Vec<String>]) -> Result<()> {
    let exists = path.exists() && std::fs::metadata(path)?.len() > 0;
    if exists {
        let (existing, _) = table(path)?;
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
    let (_, records) = table(path)?;
    let mut buf = csv::Writer::from_writer(Vec::new());
    buf.write_record(header)?;
    let rows = records.len();
    for record in &records {
        buf.write_record(&widened(record, existing, header))?;
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
