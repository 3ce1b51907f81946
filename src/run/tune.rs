//! Running a tuned recipe (`tune:`, planned in `recipe::tune`): successive halving per arm, one pass over
//! the runs per rung, then the final runs of each arm's chosen candidate. Each pass is an ordinary sweep
//! pass (resumable, skipping finished runs), so a killed sweep re-run continues where it stopped: the
//! rungs already trained are scored again from `runs.csv` and `curves.csv` and lead to the same choices.
//! A shard owns whole arms (arm `a` is shard `a mod n`'s), so shards, the worker pool and Slurm arrays tune
//! independently.
//!
//! The score of a candidate in a rung is its last validation value of the tuning metric, averaged over
//! the tuning seeds; a diverged run scores worst. Ties go to the candidate listed first.
use anyhow::{bail, Result};
use std::collections::BTreeMap;
use std::path::Path;

use super::results::{read_all_runs, read_curves};
use super::sweep::{tell_followers, train_pass, Pass, SweepOptions};
use crate::recipe::{Recipe, RunSpec, Tuning};
use crate::tasks::recipe_metrics;

/// Whether a higher value of the tuning curve is better, from the metric that declares it.
fn higher_is_better(recipe: &Recipe, tuning: &Tuning) -> Result<bool> {
    match recipe_metrics(recipe).iter().find(|m| m.curve == Some(tuning.curve.as_str())) {
        Some(m) => Ok(m.higher_is_better),
        None => {
            bail!("{}: tune.metric: no run of this recipe records the validation curve `{}`", recipe.file, tuning.curve)
        }
    }
}

/// Each candidate's score in `rung` for each arm: (arm, candidate) -> mean over the tuning seeds of the
/// last validation value, oriented so that lower is better (a diverged or missing run: +∞).
fn rung_scores(
    dir: &Path,
    recipe: &Recipe,
    tuning: &Tuning,
    rung: usize,
    higher: bool,
) -> Result<BTreeMap<(usize, usize), f64>> {
    let rows = read_all_runs(&dir.join("runs.csv"))?;
    let curves = read_curves(&dir.join("curves.csv"))?;
    let status: BTreeMap<&str, &str> = rows.iter().map(|r| (r["run_id"].as_str(), r["status"].as_str())).collect();
    let mut sums: BTreeMap<(usize, usize), (f64, usize)> = BTreeMap::new();
    for run in recipe.runs.iter().filter(|r| r.tune.is_some_and(|t| t.rung == Some(rung))) {
        let Some(role) = run.tune else { continue };
        let Some(state) = status.get(run.id.as_str()) else { continue };
        let last = curves.get(&run.id).and_then(|c| c.get(&tuning.curve)).and_then(|points| points.last());
        let score = match (*state, last) {
            ("ok", Some(&(_, v))) if v.is_finite() => {
                if higher {
                    -v
                } else {
                    v
                }
            }
            _ => f64::INFINITY,
        };
        let entry = sums.entry((role.arm, role.candidate)).or_insert((0.0, 0));
        entry.0 += score;
        entry.1 += 1;
    }
    Ok(sums.into_iter().map(|(k, (sum, n))| (k, sum / n as f64)).collect())
}

/// The best `keep` of `alive` by score (lower first; ties to the earlier candidate).
fn keep_best(alive: &[usize], scores: &BTreeMap<(usize, usize), f64>, arm: usize, keep: usize) -> Vec<usize> {
    let mut ranked: Vec<usize> = alive.to_vec();
    let score = |c: usize| scores.get(&(arm, c)).copied().unwrap_or(f64::INFINITY);
    ranked.sort_by(|&a, &b| score(a).total_cmp(&score(b)).then(a.cmp(&b)));
    ranked.truncate(keep);
    ranked.sort();
    ranked
}

/// Followers of a data-parallel launch wait for the next pass between passes: tell them there is none.
fn stop_followers(e: &anyhow::Error) {
    let _ = tell_followers(&Pass::Stopped(format!("{e:#}")));
}

/// Trains a tuned recipe's passes in this process (this shard's arms): each rung, then the final runs.
pub fn run_tuned(recipe: &Recipe, tuning: &Tuning, opts: &SweepOptions) -> Result<()> {
    let higher = higher_is_better(recipe, tuning).inspect_err(stop_followers)?;
    let dir = match opts.shard {
        Some(shard) => shard.dir(opts.out),
        None => opts.out.to_path_buf(),
    };
    let owned = |arm: usize| opts.shard.is_none_or(|s| s.owns(arm));
    let n = tuning.candidates.len();
    let mut alive: Vec<Vec<usize>> = vec![(0..n).collect(); tuning.arms.len()];
    for rung in 0..tuning.rungs {
        let mine: Vec<&RunSpec> = recipe
            .runs
            .iter()
            .filter(|r| {
                r.tune.is_some_and(|t| t.rung == Some(rung) && owned(t.arm) && alive[t.arm].contains(&t.candidate))
            })
            .collect();
        let what = format!(
            " tuning rung {}/{} ({} of {} candidates per arm at {:.0}% of the steps)",
            rung + 1,
            tuning.rungs,
            tuning.survivors_at(rung),
            n,
            100.0 * tuning.fraction(rung)
        );
        train_pass(recipe, opts, mine, &what)?;
        let scores = rung_scores(&dir, recipe, tuning, rung, higher).inspect_err(stop_followers)?;
        let keep = tuning.survivors_at(rung + 1);
        for (arm, candidates) in alive.iter_mut().enumerate().filter(|(a, _)| owned(*a)) {
            *candidates = keep_best(candidates, &scores, arm, keep);
        }
    }
    if !opts.quiet {
        for (arm, label) in tuning.arms.iter().enumerate().filter(|(a, _)| owned(*a)) {
            eprintln!("ablate: {label}: chose {}", tuning.candidates[alive[arm][0]]);
        }
    }
    let finals: Vec<&RunSpec> = recipe
        .runs
        .iter()
        .filter(|r| r.tune.is_some_and(|t| t.rung.is_none() && owned(t.arm) && alive[t.arm][0] == t.candidate))
        .collect();
    train_pass(recipe, opts, finals, " final runs")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn halving_keeps_the_lowest_scores_and_breaks_ties_by_order() {
        let scores: BTreeMap<(usize, usize), f64> =
            [((0, 0), 2.0), ((0, 1), 1.0), ((0, 2), 1.0), ((0, 3), f64::INFINITY)].into_iter().collect();
        assert_eq!(keep_best(&[0, 1, 2, 3], &scores, 0, 2), vec![1, 2]);
        assert_eq!(keep_best(&[0, 1, 2, 3], &scores, 0, 1), vec![1]);
        assert_eq!(keep_best(&[0, 3], &scores, 0, 1), vec![0], "a diverged candidate loses");
    }
}
