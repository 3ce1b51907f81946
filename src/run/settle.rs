//! `--until-settled`: seeds added to the arms whose comparisons are inconclusive, as many as the pilot's
//! paired spread says would settle them (power 0.8 at δ for both the difference and the equivalence test,
//! `stats::seeds_to_settle`), up to a cap, then the verdicts recomputed over every seed.
//!
//! The pilot is the recipe's own seeds. The number of seeds added reads the pilot's spread and δ only, never
//! the observed difference, so adding them leaves the tests' error rates as they were (an internal pilot:
//! Wittes & Brittain 1990); and since it reads only the pilot's rows, a sweep killed while adding seeds
//! resumes to the same plan. Added seeds continue the recipe's: max + 1, max + 2, … (common to every arm
//! that needs them, so paired arms share their seeds and data orders).
use anyhow::{bail, Result};
use std::collections::BTreeMap;
use std::path::Path;

use super::summary::judge_pilot;
use super::verdicts::is_quality;
use crate::recipe::{Recipe, RunSpec};
use crate::stats::Verdict;

/// The seeds an arm may end with: the recipe's, then max + 1, max + 2, … up to `max_seeds` in all.
pub fn seed_pool(seeds: &[u64], max_seeds: usize) -> Vec<u64> {
    let mut pool = seeds.to_vec();
    let mut next = seeds.iter().max().map_or(0, |m| m + 1);
    while pool.len() < max_seeds {
        pool.push(next);
        next += 1;
    }
    pool
}

/// Refuses, in one line before anything trains, what `--until-settled` cannot do: a recipe with no
/// comparison (`compare:`), a cap below the recipe's seeds.
pub fn check(recipe: &Recipe, max_seeds: usize) -> Result<()> {
    if recipe.compare.is_none() {
        bail!(
            "{}: --until-settled adds seeds to settle the recipe's comparisons, and it names none: add a `compare:` section (a baseline or ladder: true)",
            recipe.file
        );
    }
    if max_seeds < recipe.seeds.len() {
        bail!(
            "{}: --max-seeds {max_seeds} is below the recipe's own {} seeds; the cap counts every seed of an arm",
            recipe.file,
            recipe.seeds.len()
        );
    }
    Ok(())
}

/// Per arm (variant label), the seeds it should end with: its pilot's count, raised for every arm of an
/// inconclusive comparison of model quality to the seeds that comparison needs, capped at `max_seeds`.
pub fn targets(dir: &Path, recipe: &Recipe, max_seeds: usize) -> Result<BTreeMap<String, usize>> {
    arm_targets(dir, recipe, &recipe.seeds, max_seeds)
}

/// [`targets`] at the recipe's second scale (`scale_check:`), from the pilot rows in `<dir>/scale_check`:
/// that scale's comparisons are judged over their own family and settle on their own spread. Empty without
/// a second scale or before its pilot has rows.
pub fn second_scale_targets(dir: &Path, recipe: &Recipe, max_seeds: usize) -> Result<BTreeMap<String, usize>> {
    let check_dir = dir.join("scale_check");
    match &recipe.scale_check {
        Some((check, _)) if check_dir.join("runs.csv").is_file() => {
            arm_targets(&check_dir, check, &recipe.seeds, max_seeds)
        }
        _ => Ok(BTreeMap::new()),
    }
}

fn arm_targets(dir: &Path, recipe: &Recipe, pilot_seeds: &[u64], max_seeds: usize) -> Result<BTreeMap<String, usize>> {
    let pilot = pilot_seeds.len();
    let mut out: BTreeMap<String, usize> = BTreeMap::new();
    let Some(rows) = judge_pilot(dir, recipe, pilot_seeds)? else { return Ok(out) };
    for row in rows.iter().filter(|r| is_quality(r)) {
        let needed = match row.judged.verdict {
            Verdict::Inconclusive { seeds: Some(n) } => n.min(max_seeds),
            Verdict::Inconclusive { seeds: None } => max_seeds,
            _ => continue,
        };
        for arm in [&row.arms.0, &row.arms.1] {
            let t = out.entry(arm.clone()).or_insert(pilot);
            *t = (*t).max(needed);
        }
    }
    Ok(out)
}

/// Whether `run` of the recipe extended to `pool` trains: a pilot seed, or one of the first `target`
/// seeds of its arm (tuning runs always: they choose the arm's value).
pub fn keeps(run: &RunSpec, pool: &[u64], pilot: usize, targets: &BTreeMap<String, usize>) -> bool {
    if run.tune.is_some_and(|t| t.rung.is_some()) {
        return true;
    }
    let index = pool.iter().position(|&s| s == run.seed).unwrap_or(usize::MAX);
    index < pilot || index < targets.get(&run.label).copied().unwrap_or(pilot)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_pool_continues_the_recipes_seeds() {
        assert_eq!(seed_pool(&[0, 1, 2], 5), [0, 1, 2, 3, 4]);
        assert_eq!(seed_pool(&[4, 9], 3), [4, 9, 10]);
        assert_eq!(seed_pool(&[0, 1], 2), [0, 1]);
    }
}
