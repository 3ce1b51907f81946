//! Deciding a tuned recipe's passes (`tune:`, planned in `recipe::tune`): successive halving per arm, one
//! pass over the runs per rung, then the final runs of each arm's chosen candidate. The sweep trains each
//! pass as an ordinary resumable pass, so a killed sweep re-run continues where it stopped: the rungs
//! already trained are scored again from `runs.csv` and `curves.csv` and lead to the same choices.
//! A shard owns whole arms (arm `a` is shard `a mod n`'s), so shards, the worker pool and Slurm arrays tune
//! independently.
//!
//! The score of a candidate in a rung is its last validation value of the tuning metric, averaged over
//! the tuning seeds; a diverged run scores worst. Ties go to the candidate listed first.
use anyhow::{bail, Result};
use std::collections::BTreeMap;
use std::path::Path;

use crate::judge::reading::Results;
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
    let results = Results::open(dir, recipe, None)?;
    let (rows, curves) = (&results.all_runs, results.curves()?);
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

/// Successive halving as one process runs it: which candidates of each arm it owns are still in.
pub struct Halving<'r> {
    recipe: &'r Recipe,
    tuning: &'r Tuning,
    higher_is_better: bool,
    /// Per arm: whether this process (its shard) tunes it.
    owned: Vec<bool>,
    /// Per arm: the candidates still in, in listed order.
    alive: Vec<Vec<usize>>,
}

impl<'r> Halving<'r> {
    /// Every candidate of every arm `owns` says is this process's.
    pub fn start(recipe: &'r Recipe, tuning: &'r Tuning, owns: impl Fn(usize) -> bool) -> Result<Self> {
        let n = tuning.candidates.len();
        Ok(Self {
            recipe,
            tuning,
            higher_is_better: higher_is_better(recipe, tuning)?,
            owned: (0..tuning.arms.len()).map(owns).collect(),
            alive: vec![(0..n).collect(); tuning.arms.len()],
        })
    }

    /// The runs of `rung` still to be trained: its candidates still in, on the owned arms.
    pub fn rung_runs(&self, rung: usize) -> Vec<&'r RunSpec> {
        self.runs(|t| t.rung == Some(rung) && self.alive[t.arm].contains(&t.candidate))
    }

    /// The final runs: each owned arm's chosen candidate.
    pub fn final_runs(&self) -> Vec<&'r RunSpec> {
        self.runs(|t| t.rung.is_none() && self.alive[t.arm][0] == t.candidate)
    }

    fn runs(&self, wanted: impl Fn(&crate::recipe::TuneRole) -> bool) -> Vec<&'r RunSpec> {
        self.recipe.runs.iter().filter(|r| r.tune.is_some_and(|t| self.owned[t.arm] && wanted(&t))).collect()
    }

    /// What `rung`'s pass is, for its opening line.
    pub fn rung_title(&self, rung: usize) -> String {
        let t = self.tuning;
        format!(
            " tuning rung {}/{} ({} of {} candidates per arm at {:.0}% of the steps)",
            rung + 1,
            t.rungs,
            t.survivors_at(rung),
            t.candidates.len(),
            100.0 * t.fraction(rung)
        )
    }

    /// After `rung` trained into `dir`: each owned arm keeps its best ⌈n / eta⌉ candidates.
    pub fn score_rung(&mut self, dir: &Path, rung: usize) -> Result<()> {
        let scores = rung_scores(dir, self.recipe, self.tuning, rung, self.higher_is_better)?;
        let keep = self.tuning.survivors_at(rung + 1);
        for (arm, candidates) in self.alive.iter_mut().enumerate().filter(|(a, _)| self.owned[*a]) {
            *candidates = keep_best(candidates, &scores, arm, keep);
        }
        Ok(())
    }

    /// Each owned arm's label and the candidate it is on (after the last rung: its choice).
    pub fn choices(&self) -> Vec<(&'r str, &'r str)> {
        let t = self.tuning;
        (0..t.arms.len())
            .filter(|&a| self.owned[a])
            .map(|a| (t.arms[a].as_str(), t.candidates[self.alive[a][0]].as_str()))
            .collect()
    }
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
