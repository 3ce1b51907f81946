//! Scaling a sweep out. The expanded runs are dealt round-robin into `n` shards; shard `i` trains its runs
//! into `<out>/shards/<i>-of-<n>/` with the usual resumable result files, and `merge` combines every shard
//! (and anything already merged) into `<out>` in the recipe's run order, so the result files and plots are
//! those of a single-machine run. The same mechanism serves a pool of local workers (one child process per
//! device, `--devices` / `--workers`) and a Slurm array job (`ablate slurm` writes the scripts).
use anyhow::{bail, Context, Result};
use std::collections::HashMap;
use std::fmt;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::str::FromStr;

use super::bench::BenchModel;
use super::results::{covers, widened, write_resolved, ResultsDir};
use crate::files::write_atomically;
use crate::judge::reading::table;
use crate::recipe::Recipe;

/// Shard `index` of `count` (0-based, as Slurm's `SLURM_ARRAY_TASK_ID`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Shard {
    pub index: usize,
    pub count: usize,
}

impl Shard {
    /// Round-robin: neighbouring runs (often the seeds of one variant) land on different shards, which
    /// balances shards when run cost grows along the sweep.
    pub fn owns(&self, run_index: usize) -> bool {
        run_index % self.count == self.index
    }

    pub fn dir(&self, out: &Path) -> PathBuf {
        out.join("shards").join(format!("{}-of-{}", self.index, self.count))
    }
}

impl fmt::Display for Shard {
    fn fmt(&self, f: &mut fmt::Formatter) -> fmt::Result {
        write!(f, "{}/{}", self.index, self.count)
    }
}

impl FromStr for Shard {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        let bad = || format!("--shard {s}: expected I/N with 0 <= I < N, e.g. 0/4 (I is Slurm's array task id)");
        let (i, n) = s.split_once('/').ok_or_else(bad)?;
        let (index, count): (usize, usize) =
            (i.trim().parse().map_err(|_| bad())?, n.trim().parse().map_err(|_| bad())?);
        if count == 0 || index >= count {
            return Err(bad());
        }
        Ok(Shard { index, count })
    }
}

/// How many local worker processes a sweep runs on: a number, or `auto` (chosen by [`probe_splits`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Workers {
    Auto,
    Count(usize),
}

impl FromStr for Workers {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        if s == "auto" {
            return Ok(Workers::Auto);
        }
        s.parse().map(Workers::Count).map_err(|_| format!("--workers {s}: expected a number of workers or `auto`"))
    }
}

/// `workers` processes of `threads` intra-op threads each, and what they trained together per second.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Split {
    pub workers: usize,
    pub threads: usize,
    pub tokens_per_s: f64,
}

/// The ways to share `cores` among at most `runs` workers, each with the same number of threads: every
/// divisor w of the cores, with cores / w threads each.
pub fn candidate_splits(cores: usize, runs: usize) -> Vec<(usize, usize)> {
    let cores = cores.max(1);
    (1..=cores).filter(|w| cores.is_multiple_of(*w) && *w <= runs.max(1)).map(|w| (w, cores / w)).collect()
}

/// The split to use: the fastest, unless one with fewer workers is within 5% of it (fewer processes hold
/// less memory and finish their last runs together).
pub fn choose_split(splits: &[Split]) -> Option<Split> {
    let best = splits.iter().map(|s| s.tokens_per_s).fold(f64::NAN, f64::max);
    splits.iter().filter(|s| s.tokens_per_s >= 0.95 * best).min_by_key(|s| s.workers).copied()
}

/// Times every candidate split on this machine: `w` concurrent `ablate bench` children at `model`'s size,
/// `threads` each, summed tokens/s. Steps are sized so each child runs for about a second.
pub fn probe_splits(model: &BenchModel, cores: usize, runs: usize) -> Result<Vec<Split>> {
    let exe = std::env::current_exe().context("locating the ablate binary")?;
    let m = model;
    let params = 12 * m.layers * m.d_model * m.d_model + m.vocab * m.d_model;
    let step_flops = 6.0 * params as f64 * (m.batch * m.block) as f64;
    let mut out = Vec::new();
    for (workers, threads) in candidate_splits(cores, runs) {
        // About 30 GFLOP/s per thread for a model this shape on a CPU: a second of steps, 3 to 30 of them.
        let steps = ((30e9 * threads as f64 / step_flops) as i64).clamp(3, 30);
        let children: Vec<_> = (0..workers)
            .map(|_| {
                // libtorch sizes its intra-op pool from OpenMP's setting when the process starts.
                Command::new(&exe)
                    .env("OMP_NUM_THREADS", threads.to_string())
                    .args(["bench", "--device", "cpu", "--warmup", "2"])
                    .args(["--steps", &steps.to_string()])
                    .args(m.args())
                    .stdout(Stdio::piped())
                    .stderr(Stdio::piped())
                    .spawn()
                    .context("starting a --workers auto probe")
            })
            .collect::<Result<_>>()?;
        let mut total = 0.0;
        for child in children {
            let done = child.wait_with_output().context("waiting for a --workers auto probe")?;
            let text = String::from_utf8_lossy(&done.stdout);
            let rate = text
                .split(": ")
                .nth(1)
                .and_then(|rest| rest.split(" tokens/s").next())
                .and_then(|v| v.trim().parse::<f64>().ok());
            match (done.status.success(), rate) {
                (true, Some(r)) => total += r,
                _ => bail!(
                    "--workers auto: the probe at {workers} worker(s) x {threads} thread(s) failed: {}",
                    String::from_utf8_lossy(&done.stderr).lines().last().unwrap_or("no message")
                ),
            }
        }
        out.push(Split { workers, threads, tokens_per_s: total });
    }
    Ok(out)
}

/// One finished run as stored in a results directory.
struct StoredRun {
    hash: String,
    row: csv::StringRecord,
    curves: Vec<csv::StringRecord>,
    sample: Option<String>,
}

/// A results directory's `runs.csv` header (if it has one) and its finished runs by id.
type DirRuns = (Option<csv::StringRecord>, Vec<(String, StoredRun)>);

fn read_dir_runs(dir: &Path, ids: &HashMap<String, usize>) -> Result<DirRuns> {
    let runs_csv = dir.join("runs.csv");
    if !runs_csv.exists() {
        return Ok((None, Vec::new()));
    }
    let shard = "re-run that shard with --force";
    let (header, rows) = table(&runs_csv).context(shard)?;
    let mut runs: Vec<(String, StoredRun)> = Vec::new();
    for row in rows {
        runs.push((row[0].to_string(), StoredRun { hash: row[3].to_string(), row, curves: Vec::new(), sample: None }));
    }
    let index: HashMap<String, usize> = runs.iter().enumerate().map(|(i, (id, _))| (id.clone(), i)).collect();
    let curves_csv = dir.join("curves.csv");
    if curves_csv.exists() {
        for row in table(&curves_csv).context(shard)?.1 {
            if let Some(&i) = index.get(&row[0]) {
                runs[i].1.curves.push(row);
            }
        }
    }
    if let Ok(text) = std::fs::read_to_string(dir.join("samples.txt")) {
        for (id, sample) in split_samples(&text, ids) {
            if let Some(&i) = index.get(&id) {
                runs[i].1.sample = Some(sample);
            }
        }
    }
    Ok((Some(header), runs))
}

/// `samples.txt` blocks (`== run id ==`, the sample, a blank line) for the run ids of the recipe.
fn split_samples(text: &str, ids: &HashMap<String, usize>) -> Vec<(String, String)> {
    let mut out: Vec<(String, String)> = Vec::new();
    for line in text.split_inclusive('\n') {
        let bare = line.trim_end_matches('\n');
        let id = bare.strip_prefix("== ").and_then(|l| l.strip_suffix(" =="));
        match id.filter(|id| ids.contains_key(*id)) {
            Some(id) => out.push((id.to_string(), String::new())),
            None => {
                if let Some(last) = out.last_mut() {
                    last.1.push_str(line);
                }
            }
        }
    }
    for (_, s) in out.iter_mut() {
        // Drop the blank line that separates blocks.
        while s.ends_with('\n') {
            s.pop();
        }
    }
    out
}

/// Every shard directory under `<out>/shards/`.
pub fn shard_dirs(out: &Path) -> Result<Vec<PathBuf>> {
    let root = out.join("shards");
    if !root.exists() {
        return Ok(Vec::new());
    }
    let mut dirs: Vec<PathBuf> = std::fs::read_dir(&root)
        .with_context(|| format!("reading {}", root.display()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.is_dir())
        .collect();
    dirs.sort();
    Ok(dirs)
}

/// Combines the shards of `<out>` (and the runs already merged there) into `<out>/runs.csv`, `curves.csv`
/// and `samples.txt` in recipe order, moves saved models and completion grids into `<out>`, and redraws the plots.
/// Returns (runs merged, runs of the recipe still missing).
pub fn merge(recipe: &Recipe, out: &Path, quiet: bool) -> Result<(usize, usize)> {
    let order: HashMap<String, usize> = recipe.runs.iter().enumerate().map(|(i, r)| (r.id.clone(), i)).collect();
    let mut header: Option<(PathBuf, csv::StringRecord)> = None;
    let mut merged: HashMap<String, StoredRun> = HashMap::new();
    // Shards after the main directory: a shard's newer result for a run replaces the merged one.
    let mut sources = vec![out.to_path_buf()];
    sources.extend(shard_dirs(out)?);
    for dir in &sources {
        let (own, runs) = read_dir_runs(dir, &order)?;
        if let Some(h) = &own {
            reconcile_header(&mut header, h, dir, &mut merged)?;
        }
        let target = header.as_ref().map(|(_, h)| h.clone());
        for (id, mut run) in runs {
            if let (Some(own), Some(target)) = (&own, &target) {
                if own != target {
                    run.row = widened(&run.row, own, target);
                }
            }
            let current = recipe.runs.get(*order.get(&id).unwrap_or(&usize::MAX));
            if current.is_some_and(|r| r.config_hash == run.hash) {
                merged.insert(id, run);
            }
        }
        if dir != out {
            move_saved_outputs(dir, out)?;
        }
    }
    let Some((_, header)) = header else {
        bail!("nothing to merge in {}: no shard has finished a run yet", out.display());
    };
    let mut ids: Vec<&String> = merged.keys().collect();
    ids.sort_by_key(|id| order[*id]);
    write_merged(out, &header, &merged, &ids)?;
    write_resolved(recipe, &out.join("recipe.resolved.yaml"))?;
    let mut missing = recipe.planned_runs().saturating_sub(ids.len());
    // The second scale first, so that this scale's report can show the effects at both.
    if let Some((check, _)) = &recipe.scale_check {
        let dir = out.join("scale_check");
        missing += match dir.join("shards").is_dir() || dir.join("runs.csv").is_file() {
            true => merge(check, &dir, quiet)?.1,
            false => check.planned_runs(),
        };
    }
    super::finish(out, recipe)?;
    if !quiet {
        eprintln!(
            "ablate: merged {} runs from {} shard(s) into {}{}",
            ids.len(),
            sources.len() - 1,
            out.display(),
            if missing > 0 { format!(" ({missing} runs of the recipe not finished yet)") } else { String::new() }
        );
    }
    Ok((ids.len(), missing))
}

/// Folds a directory's `runs.csv` header `h` into the merge's `header` (the first directory's, or the widest
/// seen). A directory written before a column was added merges under the wider header, the rows merged so far
/// widened with that column empty; columns that differ otherwise are different recipes.
fn reconcile_header(
    header: &mut Option<(PathBuf, csv::StringRecord)>,
    h: &csv::StringRecord,
    dir: &Path,
    merged: &mut HashMap<String, StoredRun>,
) -> Result<()> {
    match header {
        Some((_, existing)) if existing == h => {}
        Some((first, existing)) => {
            if covers(h, existing) {
                for run in merged.values_mut() {
                    run.row = widened(&run.row, existing, h);
                }
                *existing = h.clone();
            } else if !covers(existing, h) {
                bail!(
                    "{} and {} have different columns (written by different versions of the recipe); re-run the stale one with --force",
                    first.join("runs.csv").display(),
                    dir.join("runs.csv").display()
                )
            }
        }
        None => *header = Some((dir.to_path_buf(), h.clone())),
    }
    Ok(())
}

/// Moves a shard's saved models and ImageGPT's completion grids to the main directory `out` (not the
/// resumable states or half-written files).
fn move_saved_outputs(dir: &Path, out: &Path) -> Result<()> {
    for kept in ["checkpoints", "completions"] {
        let saved = dir.join(kept);
        if !saved.is_dir() {
            continue;
        }
        for entry in std::fs::read_dir(&saved)?.filter_map(|e| e.ok()) {
            let name = entry.file_name().to_string_lossy().into_owned();
            if !name.contains(".state.") && !name.contains(".tmp") {
                std::fs::create_dir_all(out.join(kept))?;
                std::fs::rename(entry.path(), out.join(kept).join(&name))?;
            }
        }
    }
    Ok(())
}

/// Writes the merged runs `ids` (in the recipe's order) under `header` into `out`: curves and samples first,
/// then `runs.csv`, which is the commit point as in a single-machine run.
fn write_merged(
    out: &Path,
    header: &csv::StringRecord,
    merged: &HashMap<String, StoredRun>,
    ids: &[&String],
) -> Result<()> {
    let mut runs = csv::Writer::from_writer(Vec::new());
    runs.write_record(header)?;
    let mut curves = csv::Writer::from_writer(Vec::new());
    curves.write_record(["run_id", "step", "split", "metric", "value"])?;
    let mut samples = String::new();
    for id in ids {
        let run = &merged[*id];
        runs.write_record(&run.row)?;
        for c in &run.curves {
            curves.write_record(c)?;
        }
        if let Some(s) = &run.sample {
            samples.push_str(&format!("== {id} ==\n{s}\n\n"));
        }
    }
    let results = ResultsDir::create(out)?;
    write_atomically(&results.curves_csv(), &curves.into_inner().map_err(|e| anyhow::anyhow!("{e}"))?)?;
    write_atomically(&out.join("samples.txt"), samples.as_bytes())?;
    write_atomically(&results.runs_csv(), &runs.into_inner().map_err(|e| anyhow::anyhow!("{e}"))?)?;
    Ok(())
}

/// What a pool of local workers runs: the recipe file, and the flags every worker shares.
pub struct WorkerPlan<'a> {
    pub recipe_path: &'a Path,
    pub out: &'a Path,
    pub smoke: bool,
    pub force: bool,
    /// One worker per entry (`cpu`, `cuda:0`, ...).
    pub devices: Vec<String>,
    /// Intra-op threads per worker (CPU workers split the cores between them), fixed for every run of the
    /// pool: a run's bits depend on its thread count, so a worker never changes it (not even when a peer
    /// finishes and leaves cores idle), and `runs.csv` records it.
    pub threads: usize,
    /// Arguments every worker gets after the recipe's (`--until-settled`'s pass).
    pub child_args: Vec<String>,
    /// The recipe the shards are merged under when it is not the one trained (`--until-settled`: the recipe
    /// with every seed an arm may end with, so that rows of the other pass are kept).
    pub merged: Option<&'a Recipe>,
}

/// A worker process of the pool: its index, the child, and the thread forwarding its stderr (which returns
/// the worker's last line, the one that says why it failed).
type Worker = (usize, std::process::Child, std::thread::JoinHandle<String>);

/// The first GPU that two of the workers' `devices` would share (`cuda` and `cuda:0` are one; `auto` is
/// cuda:0 where CUDA is usable), as `cuda:N`. Sharing a GPU is allowed (small models leave one mostly
/// idle), but a run's speed then depends on its neighbours: seconds budgets are refused, and MFU is
/// measured against a peak taken while the others run.
pub fn shared_gpu(devices: &[String]) -> Option<String> {
    let mut seen = std::collections::HashSet::new();
    devices
        .iter()
        .filter_map(|d| match crate::device_spec(d) {
            Ok(crate::DeviceSpec::Cuda(i)) => Some(i),
            Ok(crate::DeviceSpec::Auto) if tch::Cuda::is_available() => Some(0),
            _ => None,
        })
        .find(|i| !seen.insert(*i))
        .map(|i| format!("cuda:{i}"))
}

/// Runs the recipe's shards in parallel, one child process per device, then merges them. Each child's
/// per-run lines are forwarded with a `[worker k]` prefix.
pub fn run_workers(recipe: &Recipe, plan: &WorkerPlan, quiet: bool) -> Result<()> {
    // Held until the merge: the workers write their shard directories, this process the main one.
    let results = ResultsDir::create(plan.out)?;
    if plan.force {
        results.clear()?;
    }
    if !quiet {
        eprintln!(
            "ablate: {} — {} runs on {} workers ({}), {} thread(s) each -> {}",
            recipe.name,
            recipe.planned_runs(),
            plan.devices.len(),
            plan.devices.join(", "),
            plan.threads,
            plan.out.display()
        );
    }
    let mut workers = Vec::new();
    for k in 0..plan.devices.len() {
        workers.push(start_worker(recipe, plan, k, quiet)?);
    }
    supervise(&mut workers);
    let mut failures = Vec::new();
    let mut interrupted = false;
    for (k, mut child, forward) in workers {
        let status = child.wait()?;
        let last = forward.join().unwrap_or_default();
        if status.code() == Some(crate::train::EXIT_INTERRUPTED as i32) {
            interrupted = true;
        } else if !status.success() {
            failures.push(format!("worker {k} failed: {last}"));
        }
    }
    merge(plan.merged.unwrap_or(recipe), plan.out, quiet)?;
    if interrupted {
        let at = format!("with the workers' states saved under {}", plan.out.join("shards").display());
        return Err(crate::train::Interrupted(at).into());
    }
    if !failures.is_empty() {
        bail!("{}", failures.join("; "));
    }
    Ok(())
}

/// Starts worker `k`: this binary on shard k of n, on its device, its stderr forwarded line by line.
fn start_worker(recipe: &Recipe, plan: &WorkerPlan, k: usize, quiet: bool) -> Result<Worker> {
    let exe = std::env::current_exe().context("locating the ablate binary")?;
    let n = plan.devices.len();
    let mut cmd = Command::new(&exe);
    cmd.arg(plan.recipe_path)
        .args(recipe.overrides.args())
        .args(&plan.child_args)
        .arg("--shard")
        .arg(format!("{k}/{n}"))
        .arg("--device")
        .arg(&plan.devices[k])
        .arg("--threads")
        .arg(plan.threads.to_string())
        .arg("--out")
        .arg(plan.out)
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    if plan.smoke {
        cmd.arg("--smoke");
    }
    if plan.force {
        cmd.arg("--force");
    }
    let mut child = cmd.spawn().with_context(|| format!("starting worker {k}"))?;
    let stderr = child.stderr.take().expect("piped");
    let forward = std::thread::spawn(move || {
        let mut last = String::new();
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            if !quiet {
                eprintln!("[worker {k}] {line}");
            }
            last = line;
        }
        last
    });
    Ok((k, child, forward))
}

/// Waits for every worker, passing a stop signal on to every worker (each saves its state and exits).
fn supervise(workers: &mut [Worker]) {
    let mut forwarded = false;
    loop {
        let still = workers.iter_mut().map(|(_, child, _)| child.try_wait()).filter(|s| matches!(s, Ok(None))).count();
        if still == 0 {
            return;
        }
        if !forwarded && crate::train::STOP_REQUESTED.load(std::sync::atomic::Ordering::SeqCst) {
            for (_, child, _) in workers.iter() {
                // SAFETY: `kill` takes a pid and a signal number and touches no memory of ours.
                unsafe { libc::kill(child.id() as libc::pid_t, libc::SIGTERM) };
            }
            forwarded = true;
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
}

/// Options of the Slurm scripts.
pub struct SlurmPlan<'a> {
    pub recipe_path: &'a Path,
    pub out: &'a Path,
    pub shards: usize,
    pub smoke: bool,
    pub device: &'a str,
    pub cpus_per_task: usize,
    pub gpus_per_task: usize,
    pub partition: Option<&'a str>,
    pub time: Option<&'a str>,
    /// `--until-settled` with this cap: the pilot's array and merge, then the added seeds' array and merge.
    pub until_settled: Option<usize>,
}

/// Writes `<out>/slurm/{array.sbatch, merge.sbatch, submit.sh}`: an array job with one task per shard,
/// and a merge job that runs once every task has succeeded. Returns the path of `submit.sh`.
/// `p` in single quotes for the shell.
fn shell_quote(p: &Path) -> String {
    format!("'{}'", p.display().to_string().replace('\'', r"'\''"))
}

/// What every script `ablate slurm` writes shares: absolute, shell-quoted paths of this binary, the recipe
/// and the output directory, the flags every task passes, and the `#SBATCH` header.
struct ScriptParts {
    exe: String,
    recipe: String,
    out: String,
    dir: PathBuf,
    smoke: &'static str,
    overrides: String,
    header: String,
    gpus: String,
}

impl ScriptParts {
    fn new(recipe: &Recipe, plan: &SlurmPlan) -> Result<Self> {
        let exe = std::env::current_exe().context("locating the ablate binary")?;
        let abs = |p: &Path| -> Result<PathBuf> {
            Ok(if p.is_absolute() { p.to_path_buf() } else { std::env::current_dir()?.join(p) })
        };
        let (recipe_path, out) = (abs(plan.recipe_path)?, abs(plan.out)?);
        let dir = out.join("slurm");
        std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
        let quote = |p: &Path| shell_quote(p);
        // The command line's overrides travel with every task, quoted for the shell.
        let overrides: String =
            recipe.overrides.args().iter().map(|a| format!(" '{}'", a.replace('\'', r"'\''"))).collect();
        let mut header = format!("#!/bin/bash\n#SBATCH --job-name=ablate-{}\n", recipe.name);
        if let Some(p) = plan.partition {
            header.push_str(&format!("#SBATCH --partition={p}\n"));
        }
        if let Some(t) = plan.time {
            header.push_str(&format!("#SBATCH --time={t}\n"));
        }
        let gpus = match plan.gpus_per_task {
            0 => String::new(),
            n => format!("#SBATCH --gpus-per-task={n}\n"),
        };
        Ok(Self {
            exe: quote(&exe),
            recipe: quote(&recipe_path),
            out: quote(&out),
            dir,
            smoke: if plan.smoke { " --smoke" } else { "" },
            overrides,
            header,
            gpus,
        })
    }

    /// Writes each (name, text) into the scripts' directory, executable; returns the path of `submit.sh`.
    fn write(&self, files: &[(&str, String)]) -> Result<PathBuf> {
        for (name, text) in files {
            let path = self.dir.join(name);
            std::fs::write(&path, text).with_context(|| format!("writing {}", path.display()))?;
            #[cfg(unix)]
            {
                use std::os::unix::fs::PermissionsExt;
                std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755))?;
            }
        }
        Ok(self.dir.join("submit.sh"))
    }
}

pub fn write_slurm_scripts(recipe: &Recipe, plan: &SlurmPlan) -> Result<PathBuf> {
    let parts = ScriptParts::new(recipe, plan)?;
    let dir = &parts.dir;
    let Some(cap) = plan.until_settled else {
        let submit = format!(
            "#!/bin/bash\n# Submits the array job, then the merge job to run after every shard succeeded.\n\
             set -euo pipefail\ncd {dir}\n\
             array=$(sbatch --parsable array.sbatch)\n\
             merge=$(sbatch --parsable --dependency=afterok:\"${{array%%;*}}\" merge.sbatch)\n\
             echo \"array job $array ({n} shards), merge job $merge\"\n",
            dir = shell_quote(dir),
            n = plan.shards,
        );
        let (array, merge) = (array_script(&parts, plan, "", "shard-%a.log"), merge_script(&parts, "", "merge.log"));
        return parts.write(&[("array.sbatch", array), ("merge.sbatch", merge), ("submit.sh", submit)]);
    };
    // --until-settled: the seeds the added pass trains are read from the merged pilot, so the pilot's shards
    // are merged before the second array starts; each job waits for the one before it to succeed.
    let settle = format!(" --until-settled --max-seeds {cap}");
    let phase = |p: &str| format!("{settle} --settle-phase {p}");
    let submit = format!(
        "#!/bin/bash\n# Submits --until-settled's four jobs, each to run after the one before it succeeded: the pilot's\n\
         # array (the recipe's seeds), its merge, the added seeds' array (as many as the merged pilot asks\n\
         # for, up to {cap} per arm), the final merge.\n\
         set -euo pipefail\ncd {dir}\n\
         pilot=$(sbatch --parsable pilot.sbatch)\n\
         pilot_merge=$(sbatch --parsable --dependency=afterok:\"${{pilot%%;*}}\" pilot-merge.sbatch)\n\
         added=$(sbatch --parsable --dependency=afterok:\"${{pilot_merge%%;*}}\" added.sbatch)\n\
         merge=$(sbatch --parsable --dependency=afterok:\"${{added%%;*}}\" merge.sbatch)\n\
         echo \"pilot array $pilot, its merge $pilot_merge, added seeds' array $added, merge $merge ({n} shards each)\"\n",
        dir = shell_quote(dir),
        n = plan.shards,
    );
    parts.write(&[
        ("pilot.sbatch", array_script(&parts, plan, &phase("pilot"), "pilot-%a.log")),
        ("pilot-merge.sbatch", merge_script(&parts, &settle, "pilot-merge.log")),
        ("added.sbatch", array_script(&parts, plan, &phase("added"), "added-%a.log")),
        ("merge.sbatch", merge_script(&parts, &settle, "merge.log")),
        ("submit.sh", submit),
    ])
}

/// An array job with one task per shard, each training its runs with `extra` arguments, logging to `log`.
fn array_script(parts: &ScriptParts, plan: &SlurmPlan, extra: &str, log: &str) -> String {
    let ScriptParts { exe, recipe, out, dir, smoke, overrides, header, gpus } = parts;
    // Two minutes before the time limit (or on preemption) Slurm sends SIGTERM to this script, which passes
    // it on; ablate finishes its step, saves the state and exits with EXIT_INTERRUPTED, and the task is
    // requeued to continue from there.
    format!(
        "{header}#SBATCH --array=0-{last}\n#SBATCH --cpus-per-task={cpus}\n{gpus}#SBATCH --output={log}\n\
         #SBATCH --signal=B:TERM@120\n#SBATCH --requeue\n\
         # Shard $SLURM_ARRAY_TASK_ID of {n}: trains every {n}th run of the recipe into {out}/shards/.\n\
         set -uo pipefail\n\
         {exe} {recipe}{overrides}{extra} --shard \"$SLURM_ARRAY_TASK_ID/{n}\" --out {out} --device {device} \
         --threads \"${{SLURM_CPUS_PER_TASK:-1}}\"{smoke} --quiet &\n\
         pid=$!\n\
         trap 'kill -TERM \"$pid\" 2>/dev/null' TERM INT\n\
         wait \"$pid\"; status=$?\n\
         # A signal interrupts the first wait; wait again for ablate to save its state and exit.\n\
         while kill -0 \"$pid\" 2>/dev/null; do wait \"$pid\"; status=$?; done\n\
         if [ \"$status\" -eq {interrupted} ]; then\n\
         \x20 scontrol requeue \"${{SLURM_ARRAY_JOB_ID}}_${{SLURM_ARRAY_TASK_ID}}\"\n\
         fi\n\
         exit \"$status\"\n",
        interrupted = crate::train::EXIT_INTERRUPTED,
        last = plan.shards - 1,
        cpus = plan.cpus_per_task,
        log = dir.join(log).display(),
        n = plan.shards,
        device = plan.device,
    )
}

/// The job that combines the shards (`ablate merge` with `extra` arguments), logging to `log`.
fn merge_script(parts: &ScriptParts, extra: &str, log: &str) -> String {
    let ScriptParts { exe, recipe, out, dir, smoke, overrides, header, .. } = parts;
    format!(
        "{header}#SBATCH --cpus-per-task=1\n#SBATCH --output={log}\n\
         # Combines the shards into {out}/runs.csv, curves.csv and the plots.\n\
         set -euo pipefail\nexec {exe} merge {recipe}{overrides}{extra} --out {out}{smoke}\n",
        log = dir.join(log).display(),
    )
}

/// Writes `<out>/slurm/{ddp.sbatch, submit.sh}`: one job of `nodes` × `tasks_per_node` tasks that `srun`
/// starts together, each a rank of every run's data-parallel training (rank 0 writes the results). The
/// ranks meet at the job's first node, on `MASTER_PORT` or a port derived from the job id. Returns the path
/// of `submit.sh`.
pub fn write_slurm_data_parallel_script(
    recipe: &Recipe,
    plan: &SlurmPlan,
    nodes: usize,
    tasks_per_node: usize,
) -> Result<PathBuf> {
    let parts = ScriptParts::new(recipe, plan)?;
    let ScriptParts { exe, recipe: recipe_path, out, dir, smoke, overrides, header, gpus } = &parts;
    let world = nodes * tasks_per_node;
    // As the array job: SIGTERM two minutes ahead reaches srun, which passes it to every rank; the stop flag
    // rides in the next all-reduce, every rank stops after the same step, rank 0 saves, and the job requeues.
    let job = format!(
        "{header}#SBATCH --nodes={nodes}\n#SBATCH --ntasks-per-node={tasks_per_node}\n#SBATCH --cpus-per-task={cpus}\n\
         {gpus}#SBATCH --output={log}\n#SBATCH --signal=B:TERM@120\n#SBATCH --requeue\n\
         # Every run of the recipe trained data-parallel over {world} ranks ({nodes} nodes x {tasks_per_node}); rank 0\n\
         # writes {out}.\n\
         set -uo pipefail\n\
         export MASTER_PORT=\"${{MASTER_PORT:-$((20000 + SLURM_JOB_ID % 20000))}}\"\n\
         srun --kill-on-bad-exit=1 {exe} {recipe}{overrides} --out {out} --device {device} \
         --threads \"${{SLURM_CPUS_PER_TASK:-1}}\"{smoke} --quiet &\n\
         pid=$!\n\
         trap 'kill -TERM \"$pid\" 2>/dev/null' TERM INT\n\
         wait \"$pid\"; status=$?\n\
         while kill -0 \"$pid\" 2>/dev/null; do wait \"$pid\"; status=$?; done\n\
         if [ \"$status\" -eq {interrupted} ]; then\n\
         \x20 scontrol requeue \"$SLURM_JOB_ID\"\n\
         fi\n\
         exit \"$status\"\n",
        interrupted = crate::train::EXIT_INTERRUPTED,
        cpus = plan.cpus_per_task,
        log = dir.join("ddp.log").display(),
        recipe = recipe_path,
        device = plan.device,
    );
    let submit = format!(
        "#!/bin/bash\n# Submits the data-parallel job.\nset -euo pipefail\ncd {dir}\n\
         job=$(sbatch --parsable ddp.sbatch)\n\
         echo \"data-parallel job $job ({world} ranks)\"\n",
        dir = shell_quote(dir),
    );
    parts.write(&[("ddp.sbatch", job), ("submit.sh", submit)])
}

#[cfg(test)]
mod tests {
    #[test]
    fn workers_that_name_one_gpu_twice_share_it() {
        let list = |d: &[&str]| d.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        assert_eq!(super::shared_gpu(&list(&["cuda:0", "cuda:1"])), None);
        assert_eq!(super::shared_gpu(&list(&["cuda", "cuda:1", "cuda:0"])).as_deref(), Some("cuda:0"));
        assert_eq!(super::shared_gpu(&list(&["cpu", "cpu"])), None);
    }

    use super::*;

    #[test]
    fn shards_parse_and_partition_the_runs() {
        let s: Shard = "1/3".parse().unwrap();
        assert_eq!(s, Shard { index: 1, count: 3 });
        assert_eq!((0..7).filter(|&i| s.owns(i)).collect::<Vec<_>>(), vec![1, 4]);
        // Every run belongs to exactly one shard.
        for i in 0..20 {
            assert_eq!((0..3).filter(|&k| Shard { index: k, count: 3 }.owns(i)).count(), 1);
        }
        for bad in ["3/3", "1", "a/2", "0/0", "-1/2"] {
            let e = bad.parse::<Shard>().unwrap_err();
            assert!(e.contains("expected I/N"), "{e}");
        }
    }

    #[test]
    fn samples_split_into_their_runs() {
        let ids: HashMap<String, usize> = [("a seed=0".to_string(), 0), ("b seed=0".to_string(), 1)].into();
        let text = "== a seed=0 ==\nline one\n== not an id ==\n\n== b seed=0 ==\nsecond\n\n";
        let s = split_samples(text, &ids);
        assert_eq!(
            s,
            vec![("a seed=0".into(), "line one\n== not an id ==".into()), ("b seed=0".into(), "second".into())]
        );
    }
}
