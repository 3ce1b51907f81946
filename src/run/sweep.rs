//! Running an expanded recipe: check the output directory, load every data set and check every run before
//! training anything, skip runs already in `runs.csv`, train the rest with a progress bar, then draw the
//! plots from the CSV files. Everything that depends on what a run trains goes through its task.
use anyhow::{bail, Context, Result};
use indicatif::{ProgressBar, ProgressStyle};
use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use tch::Device;

use super::results::{write_resolved, ResultsDir};
use super::scale::Shard;
use super::tune::Halving;
use crate::metrics::Metric;
use crate::recipe::{Config, Recipe, RunSpec, Tuning};
use crate::tasks::checkpoint::{self, file_stem};
use crate::tasks::{budgeted, task, DataCache, RunContext};
use crate::train::{RunOutcome, StateFile};

#[derive(Clone, Copy)]
pub struct SweepOptions<'a> {
    pub out: &'a Path,
    pub device: Device,
    pub force: bool,
    pub quiet: bool,
    /// Train only this deterministic slice of the runs, into `<out>/shards/<i>-of-<n>/`; `ablate merge`
    /// (or the worker pool) then combines the shards into `<out>`.
    pub shard: Option<Shard>,
}

/// What rank 0 of a data-parallel launch tells the other ranks before each pass over runs (a tuned recipe
/// makes one pass per rung and one for its final runs): the runs to train, in order, or that it is done
/// (or stopped with an error).
#[derive(serde::Serialize, serde::Deserialize)]
enum Pass {
    Train(Vec<String>),
    Done,
    Stopped(String),
}

/// Rank 0's side of [`Pass`], when this process is rank 0 of a data-parallel group.
fn tell_followers(pass: &Pass) -> Result<()> {
    if let Some(group) = crate::train::distributed::current() {
        group.share_from_rank0(&serde_json::to_vec(pass)?)?;
        if matches!(pass, Pass::Done) {
            // Rank 0 hosts the store: it stays until every rank has read that there is nothing more.
            group.sum([0.0])?;
        }
    }
    Ok(())
}

impl SweepOptions<'_> {
    /// Where this process writes: `<out>`, or its shard's directory under it.
    pub fn results_dir(&self) -> PathBuf {
        match self.shard {
            Some(shard) => shard.dir(self.out),
            None => self.out.to_path_buf(),
        }
    }
}

/// A data-parallel rank other than 0: trains, in step with rank 0, the runs rank 0 found unfinished, pass
/// after pass, and writes nothing (rank 0 keeps the state, the results and the plots).
fn follow_rank0(recipe: &Recipe, opts: &SweepOptions, group: &crate::train::distributed::Group) -> Result<()> {
    loop {
        let pass: Pass =
            serde_json::from_slice(&group.share_from_rank0(&[])?).context("reading rank 0's list of runs to train")?;
        match pass {
            Pass::Done => {
                group.sum([0.0])?;
                return Ok(());
            }
            Pass::Stopped(e) => bail!("rank 0 stopped before training: {e}"),
            Pass::Train(ids) => follow_pass(recipe, opts, group, &ids)?,
        }
    }
}

/// Trains one pass of rank 0's runs on this rank.
fn follow_pass(
    recipe: &Recipe,
    opts: &SweepOptions,
    group: &crate::train::distributed::Group,
    ids: &[String],
) -> Result<()> {
    let todo: Vec<_> = ids
        .iter()
        .map(|id| {
            recipe.runs.iter().find(|r| r.id == *id).with_context(|| format!("rank 0 trains `{id}`, unknown here"))
        })
        .collect::<Result<_>>()?;
    let data = prepare_data(recipe, &todo, opts.out, true)?;
    let configs = budgeted_configs(recipe, &todo, &data)?;
    let scratch = tempfile::tempdir().context("a scratch directory for this rank's side files")?;
    for run in todo {
        let stem = file_stem(&run.id);
        let mut progress = |_: i64, _: f64| {};
        let ctx =
            RunContext { device: opts.device, progress: &mut progress, state: None, out: scratch.path(), stem: &stem };
        task(run.config.kind)
            .train(&configs[&run.id], &data, ctx)
            .with_context(|| format!("run `{}` (rank {})", run.id, group.rank))?;
    }
    Ok(())
}

/// The line printed after a run: its headline metrics, throughput, MFU and time.
pub fn run_line(id: &str, outcome: &RunOutcome, metrics: &[Metric]) -> String {
    if let Some(step) = outcome.diverged_at {
        return format!(
            "  {id}: diverged at step {step} (loss {}), recorded; the sweep goes on",
            outcome.get("train_loss")
        );
    }
    let mut parts: Vec<String> = metrics
        .iter()
        .filter(|m| m.headline && !matches!(m.column_name(), Some("tokens_per_s" | "mfu") | None))
        .filter_map(|m| {
            let v = outcome.get(m.column_name()?);
            v.is_finite().then(|| format!("{} {}", m.label, m.format(v)))
        })
        .collect();
    let throughput = metrics.iter().find(|m| m.column_name() == Some("tokens_per_s"));
    if let Some(m) = throughput {
        parts.push(format!("{:.0} {}", outcome.get("tokens_per_s"), m.unit));
    }
    let mfu = outcome.get("mfu");
    if mfu.is_finite() {
        parts.push(format!("MFU {:.1}%", mfu * 100.0));
    }
    parts.push(format!("{:.1}s", outcome.get("wall_s")));
    if outcome.resumed_from > 0 {
        parts.push(format!("resumed from step {}", outcome.resumed_from));
    }
    format!("  {id}: {}", parts.join(", "))
}

/// Refuses to add runs to a directory whose `runs.csv` holds a run this recipe does not have, or has with a
/// different configuration (the file was edited, or overrides differ): its rows would be mixed into the
/// tables and plots as if they were variants of this recipe.
fn refuse_foreign_rows(recipe: &Recipe, finished: &HashSet<(String, String)>, dir: &Path) -> Result<()> {
    let mut rows: Vec<&(String, String)> = finished.iter().collect();
    rows.sort();
    for (id, hash) in rows {
        let problem = match recipe.runs.iter().find(|r| r.id == *id) {
            Some(run) if run.config_hash == *hash => continue,
            Some(_) => "with a different configuration (the recipe or its overrides changed since)",
            None => "which this recipe (with these overrides) does not have",
        };
        bail!(
            "{} holds run `{id}` {problem}: start over with --force, or give another --out",
            dir.join("runs.csv").display()
        );
    }
    Ok(())
}

/// Loads every data set `runs` read (each task's `prepare`), naming the run whose data fails. `$RESULTS/`
/// checkpoints are looked up in the directory that holds `out`.
fn prepare_data(recipe: &Recipe, runs: &[&RunSpec], out: &Path, quiet: bool) -> Result<DataCache> {
    let results_root = out.parent().map(Path::to_path_buf).unwrap_or_default();
    let mut data = DataCache::new(&results_root, quiet);
    for run in runs {
        task(run.config.kind)
            .prepare(&run.config, &mut data)
            .with_context(|| format!("{}: run `{}`", recipe.file, run.id))?;
    }
    Ok(data)
}

/// Each of `runs`' configs as it trains ([`budgeted`]), by run id: a budget that buys no step fails here,
/// naming the run, before anything trains.
fn budgeted_configs(recipe: &Recipe, runs: &[&RunSpec], data: &DataCache) -> Result<HashMap<String, Config>> {
    runs.iter()
        .map(|r| {
            let config = budgeted(&r.config, data).with_context(|| format!("{}: run `{}`", recipe.file, r.id))?;
            Ok((r.id.clone(), config))
        })
        .collect()
}

/// What a pass of a sweep will do, settled before its first step: where it writes, its runs (this shard's),
/// those still to train, and their data.
struct Plan<'r> {
    results: ResultsDir,
    mine: Vec<&'r RunSpec>,
    todo: Vec<&'r RunSpec>,
    data: DataCache,
    /// The configs the runs to train train with: a `train.budget` turned into steps ([`budgeted`]).
    configs: HashMap<String, Config>,
}

/// Everything that can fail on input fails here, before the first step: the output directory (before any
/// download), runs left by another recipe, memory, then the data.
fn plan<'r>(recipe: &'r Recipe, opts: &SweepOptions, mine: Vec<&'r RunSpec>) -> Result<Plan<'r>> {
    let results = ResultsDir::create(&opts.results_dir())?;
    if opts.force {
        results.clear()?;
    }
    let mut finished = results.finished()?;
    results.drop_orphan_curves(&finished)?;
    if opts.shard.is_some() && !opts.force && opts.out.join("runs.csv").exists() {
        // Runs already merged into the main results count as finished for every shard.
        finished.extend(ResultsDir::reader(opts.out).finished()?);
    }
    refuse_foreign_rows(recipe, &finished, &results.dir)?;
    let todo: Vec<&RunSpec> =
        mine.iter().filter(|r| !finished.contains(&(r.id.clone(), r.config_hash.clone()))).copied().collect();
    check_device_settings(&recipe.file, &todo, opts.device)?;
    crate::tasks::memory::check_runs_fit(&recipe.file, todo.iter().copied(), opts.device)?;
    let data = prepare_data(recipe, &todo, opts.out, opts.quiet)?;
    let configs = budgeted_configs(recipe, &todo, &data)?;
    Ok(Plan { results, mine, todo, data, configs })
}

/// The settings that depend on the device, checked (and prepared) before the first step: TF32 exists on
/// CUDA only; fp16 on a CPU needs vector half arithmetic (`precision::cpu_fp16_refusal`); deterministic
/// cuBLAS needs a fixed workspace chosen before its first call.
pub fn check_device_settings(file: &str, runs: &[&RunSpec], device: Device) -> Result<()> {
    if device == Device::Cpu {
        if let Some(run) = runs.iter().find(|r| r.config.train.tf32) {
            bail!(
                "{file}: run `{}` sets train.tf32, a float32 matmul mode of CUDA GPUs (Ampere and later); this sweep trains on the CPU, where it would do nothing",
                run.id
            );
        }
        if let Some(run) = runs.iter().find(|r| r.config.train.precision == crate::recipe::Precision::Fp16) {
            if let Some(lacks) = crate::train::precision::cpu_fp16_refusal() {
                bail!(
                    "{file}: run `{}` sets train.precision fp16, but {lacks}: libtorch emulates half precision \
                     there, many times slower than fp32; train fp16 on a GPU or such a CPU, or compare fp32 with bf16",
                    run.id
                );
            }
        }
    } else if runs.iter().any(|r| r.config.train.deterministic) && std::env::var_os("CUBLAS_WORKSPACE_CONFIG").is_none()
    {
        // Process-wide, and read by cuBLAS when it creates its handle: set before any run starts.
        std::env::set_var("CUBLAS_WORKSPACE_CONFIG", ":4096:8");
    }
    Ok(())
}

/// The sweep's progress bar over every step still to train (hidden with --quiet).
fn progress_bar(todo: &[&RunSpec], configs: &HashMap<String, Config>, quiet: bool) -> ProgressBar {
    // A seconds budget's steps are not known ahead: its run counts its recipe's `train.steps`.
    let steps = |r: &RunSpec| match configs.get(&r.id) {
        Some(c) if c.train.seconds_budget().is_none() => c.train.steps,
        _ => r.config.train.steps,
    };
    let total_steps: u64 = todo.iter().map(|r| steps(r) as u64).sum();
    let bar = if quiet { ProgressBar::hidden() } else { ProgressBar::new(total_steps) };
    bar.set_style(
        ProgressStyle::with_template("{prefix} [{bar:30}] {pos}/{len} steps {msg} ({elapsed} elapsed, eta {eta})")
            .expect("valid template")
            .progress_chars("=> "),
    );
    bar
}

/// Trains one run (resuming from its state file when one is there), saves its model when asked, appends
/// its row to `runs.csv` (the commit point) and writes its TensorBoard events. A run that runs out of memory
/// (in one process) records nothing and returns its one line instead ([`out_of_memory`]), so that the sweep
/// goes on with the next.
fn train_and_record(
    recipe: &Recipe,
    run: &RunSpec,
    plan: &Plan,
    opts: &SweepOptions,
    header: &[String],
    bar: &ProgressBar,
) -> Result<Option<String>> {
    let config = plan.configs.get(&run.id).unwrap_or(&run.config);
    let kind = task(config.kind);
    let steps = config.train.steps;
    let before = bar.position();
    let mut progress = |step: i64, loss: f64| {
        bar.set_position(before + step as u64);
        if step % 10 == 0 || step == steps {
            bar.set_message(format!("step {step}/{steps} loss {loss:.4}"));
        }
    };
    let dir = &plan.results.dir;
    let stem = file_stem(&run.id);
    let state = StateFile {
        path: dir.join("checkpoints").join(format!("{stem}.state.safetensors")),
        config_hash: run.config_hash.clone(),
        world_size: run.config.train.world_size,
    };
    let ctx = RunContext { device: opts.device, progress: &mut progress, state: Some(&state), out: dir, stem: &stem };
    let capacity = crate::tasks::memory::capacity(opts.device);
    let trained = match out_of_memory(|| kind.train(config, &plan.data, ctx)) {
        Ok(trained) => trained.with_context(|| format!("run `{}`", run.id))?,
        Err(error) => {
            let had = capacity
                .map_or(String::new(), |(bytes, what)| format!("; {what} {}", crate::tasks::memory::human(bytes)));
            return Ok(Some(format!(
                "run `{}` ran out of memory on {:?} (estimated about {} to train{had}): {}",
                run.id,
                opts.device,
                crate::tasks::memory::human(crate::tasks::memory::training_bytes(config)),
                error
            )));
        }
    };
    if config.train.checkpoint {
        let vocab = kind.vocab(config, &plan.data)?;
        checkpoint::save(&dir.join("checkpoints"), &run.id, config, vocab, trained.tokenizer.as_ref(), &trained.vs)?;
    }
    plan.results.append(header, run, &trained.outcome)?;
    crate::judge::tensorboard::export(&crate::judge::reading::Results::open(dir, recipe, None)?)?;
    if !opts.quiet {
        say(bar, run_line(&run.id, &trained.outcome, &kind.metrics(&run.config)));
    }
    Ok(None)
}

/// A line above the progress bar. indicatif drops println on a hidden bar (stderr not a terminal): the line
/// is printed directly then.
fn say(bar: &ProgressBar, line: String) {
    if bar.is_hidden() {
        eprintln!("{line}");
    } else {
        bar.println(line);
    }
}

/// Runs `train`, turning an out-of-memory failure (libtorch's error, returned or raised as a panic by tch's
/// infallible ops) into `Err` with the allocator's first line; any other panic goes on unwinding. In a
/// data-parallel group nothing is caught: the other ranks would wait in a collective for this one.
fn out_of_memory<T>(train: impl FnOnce() -> Result<T>) -> std::result::Result<Result<T>, String> {
    if crate::train::distributed::current().is_some() {
        return Ok(train());
    }
    quiet_out_of_memory_panics();
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(train)) {
        Ok(Err(e)) if crate::tasks::memory::is_out_of_memory(&format!("{e:#}")) => {
            Err(allocator_line(&format!("{e:#}")))
        }
        Ok(result) => Ok(result),
        Err(payload) => match panic_message(payload.as_ref()) {
            Some(message) if crate::tasks::memory::is_out_of_memory(&message) => Err(allocator_line(&message)),
            _ => std::panic::resume_unwind(payload),
        },
    }
}

/// The sentence of an allocator's message that says what did not fit ("CUDA out of memory. Tried to allocate
/// 2.00 GiB…", "DefaultCPUAllocator: can't allocate memory: you tried to allocate 1610612736 bytes…"), without
/// tch's wrapping or libtorch's backtrace.
fn allocator_line(message: &str) -> String {
    let first = message.lines().next().unwrap_or(message);
    let start =
        ["CUDA out of memory", "DefaultCPUAllocator", "out of memory"].iter().find_map(|m| first.find(m)).unwrap_or(0);
    let line = &first[start..];
    line.split(" Error code").next().unwrap_or(line).trim_end_matches(['"', ')', '.']).to_string()
}

fn panic_message(payload: &(dyn std::any::Any + Send)) -> Option<String> {
    payload.downcast_ref::<String>().cloned().or_else(|| payload.downcast_ref::<&str>().map(|s| s.to_string()))
}

/// A panic hook that stays silent for out-of-memory panics (the sweep catches them and says so in one
/// line) and hands every other panic to the hook there was before.
fn quiet_out_of_memory_panics() {
    static INSTALLED: std::sync::Once = std::sync::Once::new();
    INSTALLED.call_once(|| {
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            let message = panic_message(info.payload()).unwrap_or_default();
            if !crate::tasks::memory::is_out_of_memory(&message) {
                previous(info);
            }
        }));
    });
}

/// Runs a recipe's runs (this shard's) in this process: everything that can fail on input is checked first
/// ([`plan`]), finished runs are skipped, the rest train one by one, each committed to `runs.csv` as it
/// ends; then the plots, TensorBoard files and report. A tuned recipe trains in passes ([`super::tune`]).
/// Other ranks of a data-parallel launch follow rank 0.
pub fn run_recipe(recipe: &Recipe, opts: &SweepOptions) -> Result<()> {
    // A margin on a metric the recipe does not measure is refused before anything trains.
    crate::judge::summary::check_compare(recipe)?;
    if let Some(group) = crate::train::distributed::current().filter(|g| g.rank != 0) {
        follow_rank0(recipe, opts, group)?;
        return run_second_scale(recipe, opts);
    }
    let trained = match &recipe.tuning {
        Some(tuning) => run_tuned(recipe, tuning, opts).map(|_| Vec::new()),
        None => {
            let mine =
                recipe.runs.iter().enumerate().filter(|(i, _)| opts.shard.is_none_or(|s| s.owns(*i))).map(|(_, r)| r);
            train_pass(recipe, opts, mine.collect(), "")
        }
    };
    let failed = trained?;
    tell_followers(&Pass::Done)?;
    // Before this scale's report, so that it can show the effects at both.
    run_second_scale(recipe, opts)?;
    let dir = opts.results_dir();
    // Runs that ran out of memory: said after what finished is written, as the command's error.
    let failures = || match failed.len() {
        0 => Ok(()),
        n => Err(anyhow::anyhow!(
            "{n} of {} runs ran out of memory ({}): the others are recorded; lower their train.batch_size (or the \
             model or sequence) and run again to train them",
            recipe.runs.len(),
            dir.join(super::results::FAILED_CSV).display()
        )),
    };
    if let Some(shard) = opts.shard {
        if !opts.quiet {
            eprintln!(
                "ablate: shard {shard} done in {}; `ablate merge {}` combines the shards",
                dir.display(),
                recipe.file
            );
        }
        return failures();
    }
    super::finish(&dir, recipe)?;
    if !opts.quiet {
        eprintln!("ablate: wrote {}", dir.display());
    }
    failures()
}

/// Followers of a data-parallel launch wait for the next pass between passes: tell them there is none.
fn stop_followers(e: &anyhow::Error) {
    let _ = tell_followers(&Pass::Stopped(format!("{e:#}")));
}

/// A tuned recipe's passes in this process (this shard's arms): each rung of successive halving
/// ([`Halving`]), then the final runs of each arm's choice.
fn run_tuned(recipe: &Recipe, tuning: &Tuning, opts: &SweepOptions) -> Result<()> {
    let owns = |arm: usize| opts.shard.is_none_or(|s| s.owns(arm));
    let mut halving = Halving::start(recipe, tuning, owns).inspect_err(stop_followers)?;
    for rung in 0..tuning.rungs {
        refuse_failures(train_pass(recipe, opts, halving.rung_runs(rung), &halving.rung_title(rung))?)?;
        halving.score_rung(&opts.results_dir(), rung).inspect_err(stop_followers)?;
    }
    if !opts.quiet {
        for (label, choice) in halving.choices() {
            eprintln!("ablate: {label}: chose {choice}");
        }
    }
    refuse_failures(train_pass(recipe, opts, halving.final_runs(), " final runs")?)
}

/// A tuned pass cannot go on without every run (the next rung is chosen from all of them).
fn refuse_failures(failed: Vec<String>) -> Result<()> {
    match failed.first() {
        None => Ok(()),
        Some(first) => bail!("{first}; tuning needs every run of a rung: lower train.batch_size and run again"),
    }
}

/// With `scale_check:`, the whole recipe again at its second scale, into `<out>/scale_check/` (this shard's
/// part of it, when sharded).
fn run_second_scale(recipe: &Recipe, opts: &SweepOptions) -> Result<()> {
    let Some((check, settings)) = &recipe.scale_check else { return Ok(()) };
    let out = opts.out.join("scale_check");
    if !opts.quiet {
        eprintln!("ablate: {} at its second scale ({}) -> {}", recipe.name, settings.join(" "), out.display());
    }
    run_recipe(check, &SweepOptions { out: &out, ..*opts })
}

/// One pass over `mine` (runs of this shard; `what` names the pass in the opening line): plans, then trains
/// the unfinished ones in order, each committed to `runs.csv` as it ends.
fn train_pass(recipe: &Recipe, opts: &SweepOptions, mine: Vec<&RunSpec>, what: &str) -> Result<Vec<String>> {
    let planned = plan(recipe, opts, mine);
    if crate::train::distributed::current().is_some() {
        // The other ranks train what rank 0 found unfinished, in its order, or stop with its error.
        match &planned {
            Ok(plan) => tell_followers(&Pass::Train(plan.todo.iter().map(|r| r.id.clone()).collect()))?,
            Err(e) => tell_followers(&Pass::Stopped(format!("{e:#}")))?,
        }
    }
    let plan = planned?;
    let dir = plan.results.dir.clone();
    write_resolved(recipe, &dir.join("recipe.resolved.yaml"))?;
    let skipped = plan.mine.len() - plan.todo.len();
    if !opts.quiet {
        let shard = opts.shard.map(|s| format!(" (shard {s} of the {} runs)", recipe.runs.len())).unwrap_or_default();
        eprintln!(
            "ablate: {}{what} — {} runs{shard} ({} already finished, {} to train) on {:?} -> {}",
            recipe.name,
            plan.mine.len(),
            skipped,
            plan.todo.len(),
            opts.device,
            dir.display()
        );
    }
    // Every shard and pass writes the whole recipe's columns, so shards merge and passes share one file.
    let header = crate::judge::reading::recipe_header(&recipe.runs);
    let bar = progress_bar(&plan.todo, &plan.configs, opts.quiet);
    // The runs about to train are tried afresh: an earlier out-of-memory record of theirs goes.
    plan.results.forget_failures(&plan.todo.iter().map(|r| r.id.as_str()).collect())?;
    let mut failed = Vec::new();
    for (k, run) in plan.todo.iter().enumerate() {
        bar.set_prefix(format!("run {}/{} [{}]", skipped + k + 1, plan.mine.len(), run.id));
        if let Some(line) = train_and_record(recipe, run, &plan, opts, &header, &bar)? {
            plan.results.record_failure(run, &line)?;
            say(
                &bar,
                format!("ablate: {line}; recorded in {}, going on", dir.join(super::results::FAILED_CSV).display()),
            );
            failed.push(run.id.clone());
        }
    }
    bar.finish_and_clear();
    Ok(failed)
}
