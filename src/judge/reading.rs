//! The one reading of a results directory. [`Results::open`] parses `runs.csv` once, derives the recipe's
//! metric declarations once, groups the runs into variants and reads `recipe.resolved.yaml`'s record (and
//! `scale_check/`, the second scale, the same way); `curves.csv` is read on first use. The summary, the
//! verdict block, the sensitivity section, TensorBoard, the HTML report, the plots, reproduction, staleness
//! and `ablate fit` all take a [`Results`]; the sweep's writer, the shard merge and the tuner read through
//! this file's [`table`] and [`Results`] too, so the CSV formats are parsed here and nowhere else
//! (`tests/layers.rs: results_files_are_parsed_in_one_place`).
use anyhow::{bail, Context, Result};
use std::cell::OnceCell;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use crate::files::write_atomically;
use crate::metrics::Metric;
use crate::recipe::{columns, Recipe, RunSpec};
use crate::tasks::{task, Declarations};
use crate::train::RunOutcome;
use std::collections::HashMap;

/// One `runs.csv` row: column → value.
pub type Row = BTreeMap<String, String>;

/// All rows of `curves.csv` grouped as run id -> metric key (`split/metric`) -> [(step, value)].
pub type Curves = BTreeMap<String, BTreeMap<String, Vec<(i64, f64)>>>;

/// What the paired tables compare, seed by seed, as a command asks for it: every variant with one baseline
/// (`heads=1`, `transformer.heads=1` or a variant's label), or each variant with the one listed before it (a
/// ladder, each rung adding one thing to the rung below). `None` in [`Results::open`]: the recipe's
/// `compare:` decides.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Pairing<'a> {
    Baseline(&'a str),
    Ladder,
}

/// A results directory as every judging command reads it, built once per command.
pub struct Results<'r> {
    pub dir: PathBuf,
    pub recipe: &'r Recipe,
    /// The command line's pairing (`--baseline`, `--ladder`); `None`: the recipe's `compare:`.
    pub pairing: Option<Pairing<'r>>,
    /// The metric declarations of the recipe's runs, derived once.
    pub declarations: Declarations,
    /// Every metric they declare, once each, in column order ([`Declarations::metrics`]).
    pub metrics: Vec<Metric>,
    /// The headline metrics among them that `runs.csv` has columns for.
    pub headline: Vec<Metric>,
    /// Every row of `runs.csv`, a tuned recipe's tuning runs included.
    pub all_runs: Vec<Row>,
    /// The reported rows: every row but the tuning runs (`phase` `tune`).
    pub runs: Vec<Row>,
    /// The reported rows' variants in first-seen order, each with its run ids ([`variants_of`]).
    pub variants: Vec<(String, Vec<String>)>,
    /// What `recipe.resolved.yaml` recorded (overrides, predictions, the pilot's plan).
    pub recorded: Recorded,
    /// The second scale (`scale_check/` under the recipe's `scale_check:`) and its settings, once it has runs.
    pub second: Option<(Box<Results<'r>>, String)>,
    curves: OnceCell<Curves>,
}

impl<'r> Results<'r> {
    /// Reads `dir` (which must hold a `runs.csv`) for `recipe`, judged under `pairing`.
    pub fn open(dir: &Path, recipe: &'r Recipe, pairing: Option<Pairing<'r>>) -> Result<Self> {
        let path = dir.join("runs.csv");
        let all_runs = read_rows(&path).with_context(|| format!("no results in {}", dir.display()))?;
        Self::from_rows(dir, recipe, pairing, all_runs, Declarations::of(recipe))
    }

    /// [`Results::open`], or `None` when `dir` has no `runs.csv` yet.
    pub fn open_if_any(dir: &Path, recipe: &'r Recipe, pairing: Option<Pairing<'r>>) -> Result<Option<Self>> {
        match dir.join("runs.csv").is_file() {
            true => Self::open(dir, recipe, pairing).map(Some),
            false => Ok(None),
        }
    }

    /// Another directory of the same recipe (the committed reference a rerun is compared with), read the same
    /// way, its metric declarations this one's; `None` when it has no `runs.csv`.
    pub fn other(&self, dir: &Path) -> Result<Option<Results<'r>>> {
        if !dir.join("runs.csv").is_file() {
            return Ok(None);
        }
        let all_runs = read_rows(&dir.join("runs.csv"))?;
        Self::from_rows(dir, self.recipe, self.pairing, all_runs, self.declarations.clone()).map(Some)
    }

    fn from_rows(
        dir: &Path,
        recipe: &'r Recipe,
        pairing: Option<Pairing<'r>>,
        all_runs: Vec<Row>,
        declarations: Declarations,
    ) -> Result<Self> {
        let metrics = declarations.metrics().to_vec();
        let runs: Vec<Row> = all_runs.iter().filter(|r| reported(r)).cloned().collect();
        let headline = metrics
            .iter()
            .filter(|m| m.headline && m.column_name().is_some_and(|c| runs.first().is_some_and(|r| r.contains_key(c))))
            .cloned()
            .collect();
        let second = match &recipe.scale_check {
            Some((check, settings)) => Results::open_if_any(&dir.join("scale_check"), check, pairing)?
                .map(|r| (Box::new(r), settings.join(" "))),
            None => None,
        };
        Ok(Results {
            dir: dir.to_path_buf(),
            recipe,
            pairing,
            declarations,
            metrics,
            headline,
            variants: variants_of(&runs),
            all_runs,
            runs,
            recorded: recorded(dir),
            second,
            curves: OnceCell::new(),
        })
    }

    /// `curves.csv`, read on first use (empty when the directory has none).
    pub fn curves(&self) -> Result<&Curves> {
        if let Some(curves) = self.curves.get() {
            return Ok(curves);
        }
        let path = self.dir.join("curves.csv");
        let curves = if path.is_file() { read_curves(&path)? } else { Curves::new() };
        Ok(self.curves.get_or_init(|| curves))
    }

    /// The reported row of run `id`.
    pub fn run(&self, id: &str) -> Option<&Row> {
        self.runs.iter().find(|r| r.get("run_id").map(String::as_str) == Some(id))
    }

    /// The training time the rows record, in minutes: every row's `wall_s`, tuning runs included.
    pub fn recorded_minutes(&self) -> f64 {
        self.all_runs.iter().filter_map(|r| r.get("wall_s")?.parse::<f64>().ok()).sum::<f64>() / 60.0
    }
}

// The columns of `runs.csv`, which the sweep writes (`run::results`) and the recipe checks lay out before
// any run: defined here, beside their parse.

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

/// The arm a run belongs to when the swept key `key` is read across it (a learning-rate grid, a compute
/// ladder): its label without that key's `short=value` word (`all runs` when nothing else is left).
pub fn arm_of(label: &str, key: &str) -> String {
    let short = format!("{}=", key.rsplit('.').next().unwrap_or(key));
    let words: Vec<&str> = label.split(' ').filter(|w| !w.starts_with(&short)).collect();
    if words.is_empty() {
        "all runs".to_string()
    } else {
        words.join(" ")
    }
}

/// The rows of `rows` whose seed is one of `seeds` (a pilot's: the recipe's own seeds).
pub fn rows_of_seeds(rows: &[Row], seeds: &[u64]) -> Vec<Row> {
    rows.iter()
        .filter(|r| r.get("seed").and_then(|s| s.parse::<u64>().ok()).is_some_and(|s| seeds.contains(&s)))
        .cloned()
        .collect()
}

/// Whether a row is reported (summaries, plots, reports and reproduction read it): every row but a tuned
/// recipe's tuning runs (`phase` `tune`).
fn reported(row: &Row) -> bool {
    row.get("phase").is_none_or(|p| p != "tune")
}

/// The reported rows of `dir`'s `runs.csv`, for what reads a results directory without its recipe: `ablate
/// fit` (any directory), the settling loop's list of runs already finished.
pub fn reported_runs(dir: &Path) -> Result<Vec<Row>> {
    let path = dir.join("runs.csv");
    Ok(read_rows(&path)?.into_iter().filter(reported).collect())
}

/// Every row of `dir`'s `runs.csv`, tuning runs included (tests, and tools without the recipe).
pub fn all_runs(dir: &Path) -> Result<Vec<Row>> {
    read_rows(&dir.join("runs.csv"))
}

/// `dir`'s `curves.csv` (tests, and tools without the recipe).
pub fn curves_of(dir: &Path) -> Result<Curves> {
    read_curves(&dir.join("curves.csv"))
}

/// A CSV file's header and records, as stored (no column is interpreted): the writer's checks, the shard
/// merge and the small side tables (`failed.csv`, `reproduction.csv`, a benchmark's table) read through it.
pub fn table(path: &Path) -> Result<(csv::StringRecord, Vec<csv::StringRecord>)> {
    let mut reader = csv::Reader::from_path(path).with_context(|| format!("cannot read {}", path.display()))?;
    let header = reader.headers().with_context(|| format!("{} is damaged", path.display()))?.clone();
    let records = reader
        .records()
        .collect::<std::result::Result<Vec<_>, _>>()
        .with_context(|| format!("{} is damaged", path.display()))?;
    Ok((header, records))
}

/// Every row of `runs.csv`, tuning runs included, as column -> value maps.
fn read_rows(path: &Path) -> Result<Vec<Row>> {
    let (header, records) = table(path)?;
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
    Ok(records.iter().map(|r| header.iter().map(String::from).zip(r.iter().map(String::from)).collect()).collect())
}

fn read_curves(path: &Path) -> Result<Curves> {
    let (_, records) = table(path)?;
    let mut out: Curves = BTreeMap::new();
    for row in records {
        let key = format!("{}/{}", &row[2], &row[3]);
        let step: i64 = row[1].parse().with_context(|| format!("{}: a step that is not a number", path.display()))?;
        let value: f64 = row[4].parse().with_context(|| format!("{}: a value that is not a number", path.display()))?;
        out.entry(row[0].to_string()).or_default().entry(key).or_default().push((step, value));
    }
    Ok(out)
}

/// What a results directory's `recipe.resolved.yaml` recorded that later commands read back (the rest of
/// the file is for people): the command line's overrides and the predictions the runs were made against.
#[derive(Debug, Default, serde::Deserialize)]
pub struct Recorded {
    /// The recipe file the results were made from, as its path was given.
    #[serde(default)]
    pub source: Option<String>,
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

/// The tuned keys' values of a variant's final runs (`train.lr=0.001`; several if its runs differ).
pub fn chosen_values(runs: &[Row], ids: &[String], keys: &[String]) -> String {
    let mut seen: Vec<String> = Vec::new();
    for r in runs.iter().filter(|r| ids.contains(&r["run_id"])) {
        let value = keys.iter().map(|k| format!("{k}={}", r.get(k).map_or("", |v| v))).collect::<Vec<_>>().join(" ");
        if !seen.contains(&value) {
            seen.push(value);
        }
    }
    seen.join("; ")
}

/// The variants of `runs` in first-seen order, each with its run ids, labelled for legends. Diverged runs
/// keep their curves up to the blow-up; the label says so, so a short line is not mistaken for a crash or a
/// plotting bug.
pub fn variants_of(runs: &[Row]) -> Vec<(String, Vec<String>)> {
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

/// The file `ablate wall-clock` writes beside `runs.csv`: each arm's training speed, repeat by repeat.
pub const WALL_CLOCK_FILE: &str = "wall_clock.csv";

/// One timed run of `wall_clock.csv`: which repeat, which arm, its model FLOP/s (in TFLOP/s), and the
/// conditions it ran in.
#[derive(Debug, Clone, PartialEq)]
pub struct Timing {
    pub repeat: u64,
    pub arm: String,
    pub model_tflops: f64,
    pub threads: i64,
    /// The one-minute load average before the first (untimed) run: whether the cores were quiet.
    pub load_at_start: f64,
    pub load_1m: f64,
    pub cpu: String,
}

/// `dir`'s `wall_clock.csv`, `None` where it has none; a damaged file is an error naming it.
pub fn wall_clock(dir: &Path) -> Result<Option<Vec<Timing>>> {
    let path = dir.join(WALL_CLOCK_FILE);
    if !path.is_file() {
        return Ok(None);
    }
    let (header, records) = table(&path)?;
    let column = |name: &str| {
        header.iter().position(|h| h == name).with_context(|| format!("{} has no `{name}` column", path.display()))
    };
    let (repeat, arm, tflops, threads, start, load, cpu) = (
        column("repeat")?,
        column("arm")?,
        column("model_tflops")?,
        column("threads")?,
        column("load_at_start")?,
        column("load_1m")?,
        column("cpu")?,
    );
    let number = |r: &csv::StringRecord, i: usize| -> Result<f64> {
        r[i].parse().with_context(|| format!("{}: `{}` is not a number", path.display(), &r[i]))
    };
    records
        .iter()
        .map(|r| {
            Ok(Timing {
                repeat: number(r, repeat)? as u64,
                arm: r[arm].to_string(),
                model_tflops: number(r, tflops)?,
                threads: number(r, threads)? as i64,
                load_at_start: number(r, start)?,
                load_1m: number(r, load)?,
                cpu: r[cpu].to_string(),
            })
        })
        .collect::<Result<Vec<_>>>()
        .map(Some)
}

/// Per repeat both arms ran: ln(FLOP/s of `arm` ÷ FLOP/s of `baseline`).
pub fn speed_logs(timings: &[Timing], arm: &str, baseline: &str) -> Vec<f64> {
    let of =
        |name: &str, repeat: u64| timings.iter().find(|t| t.arm == name && t.repeat == repeat).map(|t| t.model_tflops);
    let mut repeats: Vec<u64> = timings.iter().map(|t| t.repeat).collect();
    repeats.sort_unstable();
    repeats.dedup();
    repeats.into_iter().filter_map(|r| Some((of(arm, r)? / of(baseline, r)?).ln())).filter(|v| v.is_finite()).collect()
}
