//! Running an expanded recipe: check the output directory, load every data set and check every run before
//! training anything, skip runs already in `runs.csv`, train the rest with a progress bar, then draw the
//! plots from the CSV files. Everything that depends on what a run trains goes through its task.
use anyhow::{bail, Context, Result};
use indicatif::{ProgressBar, ProgressStyle};
use std::collections::HashSet;
use std::path::Path;
use tch::Device;

use super::results::{write_resolved, ResultsDir};
use super::scale::Shard;
use crate::metrics::Metric;
use crate::recipe::Recipe;
use crate::tasks::checkpoint::{self, file_stem};
use crate::tasks::{task, DataCache, RunContext};
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

/// A data-parallel rank other than 0: trains, in step with rank 0, the runs rank 0 found unfinished, and
/// writes nothing (rank 0 keeps the state, the results and the plots).
fn follow_rank0(recipe: &Recipe, opts: &SweepOptions, group: &crate::train::distributed::Group) -> Result<()> {
    let shared: Result<Vec<String>, String> =
        serde_json::from_slice(&group.share_from_rank0(&[])?).context("reading rank 0's list of runs to train")?;
    let ids = shared.map_err(|e| anyhow::anyhow!("rank 0 stopped before training: {e}"))?;
    let todo: Vec<_> = ids
        .iter()
        .map(|id| {
            recipe.runs.iter().find(|r| r.id == *id).with_context(|| format!("rank 0 trains `{id}`, unknown here"))
        })
        .collect::<Result<_>>()?;
    let results_root = opts.out.parent().map(Path::to_path_buf).unwrap_or_default();
    let mut data = DataCache::new(&results_root, true);
    for run in &todo {
        task(run.config.kind)
            .prepare(&run.config, &mut data)
            .with_context(|| format!("{}: run `{}`", recipe.file, run.id))?;
    }
    let scratch = tempfile::tempdir().context("a scratch directory for this rank's side files")?;
    for run in todo {
        let stem = file_stem(&run.id);
        let mut progress = |_: i64, _: f64| {};
        let ctx =
            RunContext { device: opts.device, progress: &mut progress, state: None, out: scratch.path(), stem: &stem };
        task(run.config.kind)
            .train(&run.config, &data, ctx)
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
    parts.push(format!("MFU {:.1}%", outcome.get("mfu") * 100.0));
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

pub fn run_recipe(recipe: &Recipe, opts: &SweepOptions) -> Result<()> {
    if let Some(group) = crate::train::distributed::current().filter(|g| g.rank != 0) {
        return follow_rank0(recipe, opts, group);
    }
    let planned = (|| -> Result<_> {
        // Everything that can fail on input fails here, before the first step: the output directory (before any
        // download), then data and sizes.
        let results = ResultsDir::create(&match opts.shard {
            Some(shard) => shard.dir(opts.out),
            None => opts.out.to_path_buf(),
        })?;
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
        let mine: Vec<_> = recipe
            .runs
            .iter()
            .enumerate()
            .filter(|(i, _)| opts.shard.is_none_or(|s| s.owns(*i)))
            .map(|(_, r)| r)
            .collect();
        let todo: Vec<_> =
            mine.iter().filter(|r| !finished.contains(&(r.id.clone(), r.config_hash.clone()))).copied().collect();
        // A run that cannot fit in memory is refused before anything is loaded or allocated.
        if opts.device == Device::Cpu {
            if let Some(limit) = crate::tasks::memory::host_memory_bytes() {
                for run in &todo {
                    crate::tasks::memory::check_fits(&run.config, limit, "this machine")
                        .map_err(|e| anyhow::anyhow!("{}: run `{}` {e}", recipe.file, run.id))?;
                }
            }
        }
        // Where `$RESULTS/` checkpoints live: the directory holding this recipe's output directory.
        let results_root = opts.out.parent().map(Path::to_path_buf).unwrap_or_default();
        let mut data = DataCache::new(&results_root, opts.quiet);
        for run in &todo {
            task(run.config.kind)
                .prepare(&run.config, &mut data)
                .with_context(|| format!("{}: run `{}`", recipe.file, run.id))?;
        }
        Ok((results, mine, todo, data))
    })();
    if let Some(group) = crate::train::distributed::current() {
        // The other ranks train what rank 0 found unfinished, in its order, or stop with its error.
        let shared: Result<Vec<&str>, String> = match &planned {
            Ok((_, _, todo, _)) => Ok(todo.iter().map(|r| r.id.as_str()).collect()),
            Err(e) => Err(format!("{e:#}")),
        };
        group.share_from_rank0(&serde_json::to_vec(&shared)?)?;
    }
    let (results, mine, todo, data) = planned?;
    write_resolved(recipe, &results.dir.join("recipe.resolved.yaml"))?;
    let skipped = mine.len() - todo.len();
    if !opts.quiet {
        let shard = opts.shard.map(|s| format!(" (shard {s} of the {} runs)", recipe.runs.len())).unwrap_or_default();
        eprintln!(
            "ablate: {} — {} runs{shard} ({} already finished, {} to train) on {:?} -> {}",
            recipe.name,
            mine.len(),
            skipped,
            todo.len(),
            opts.device,
            results.dir.display()
        );
    }
    // Every shard writes the whole recipe's columns, so shards merge.
    let header = super::results::recipe_header(&recipe.runs);
    let total_steps: u64 = todo.iter().map(|r| r.config.train.steps as u64).sum();
    let bar = if opts.quiet { ProgressBar::hidden() } else { ProgressBar::new(total_steps) };
    bar.set_style(
        ProgressStyle::with_template("{prefix} [{bar:30}] {pos}/{len} steps {msg} ({elapsed} elapsed, eta {eta})")
            .expect("valid template")
            .progress_chars("=> "),
    );
    for (k, run) in todo.iter().enumerate() {
        let kind = task(run.config.kind);
        bar.set_prefix(format!("run {}/{} [{}]", skipped + k + 1, mine.len(), run.id));
        let steps = run.config.train.steps;
        let before = bar.position();
        let mut progress = |step: i64, loss: f64| {
            bar.set_position(before + step as u64);
            if step % 10 == 0 || step == steps {
                bar.set_message(format!("step {step}/{steps} loss {loss:.4}"));
            }
        };
        let stem = file_stem(&run.id);
        let state = StateFile {
            path: results.dir.join("checkpoints").join(format!("{stem}.state.safetensors")),
            config_hash: run.config_hash.clone(),
            world_size: run.config.train.world_size,
        };
        let ctx = RunContext {
            device: opts.device,
            progress: &mut progress,
            state: Some(&state),
            out: &results.dir,
            stem: &stem,
        };
        let trained = kind.train(&run.config, &data, ctx).with_context(|| format!("run `{}`", run.id))?;
        if run.config.train.checkpoint {
            let vocab = kind.vocab(&run.config, &data)?;
            let dir = results.dir.join("checkpoints");
            checkpoint::save(&dir, &run.id, &run.config, vocab, trained.tokenizer.as_ref(), &trained.vs)?;
        }
        results.append(&header, run, &trained.outcome)?;
        super::tensorboard::export(&results.dir, recipe)?;
        if !opts.quiet {
            let line = run_line(&run.id, &trained.outcome, &kind.metrics(&run.config));
            // indicatif drops println on a hidden bar (stderr not a terminal): print the line directly then.
            if bar.is_hidden() {
                eprintln!("{line}");
            } else {
                bar.println(line);
            }
        }
    }
    bar.finish_and_clear();
    if let Some(shard) = opts.shard {
        if !opts.quiet {
            eprintln!(
                "ablate: shard {shard} done in {}; `ablate merge {}` combines the shards",
                results.dir.display(),
                recipe.file
            );
        }
        return Ok(());
    }
    super::finish(&results.dir, recipe)?;
    if !opts.quiet {
        eprintln!("ablate: wrote {}", results.dir.display());
    }
    Ok(())
}
