//! `--until-settled`: the second stage of the two-stage design (`crate::design`). Every arm of every
//! comparison of the primary metric gets at least two seeds beyond the pilot, more where the pilot's paired
//! spread says the comparison needs them (power 0.8 at δ for the difference test and TOST at the family's
//! level α/m), up to the plan's cap (`compare.max_seeds`); the verdicts then combine the two stages. Whether
//! and how many seeds are added reads the pilot's spread, δ and the plan only, never its verdicts; and the
//! combination test keeps its level whatever the second stage's size, so the stated error rates hold.
//!
//! The pilot is the recipe's own seeds. Since the plan reads only the pilot's rows, a sweep killed while
//! adding seeds resumes to the same plan. Added seeds continue the recipe's: max + 1, max + 2, … (common to
//! every arm that needs them, so paired arms share their seeds and data orders).
use anyhow::{bail, Result};
use std::collections::BTreeMap;

use crate::design::{family_level, is_second_stage, Planner, MOST_PLANNED_SEEDS, SECOND_STAGE_MIN};
use crate::judge::reading::{rows_of_seeds, variants_of, Results};
use crate::judge::summary::paired_spreads;
use crate::recipe::{Recipe, RunSpec};

/// The seeds an arm may end with: the recipe's, then max + 1, max + 2, … up to `max_seeds` in all. Call
/// [`check`] first: it bounds `max_seeds`.
pub fn seed_pool(seeds: &[u64], max_seeds: usize) -> Vec<u64> {
    let mut pool = seeds.to_vec();
    let mut next = seeds.iter().max().map_or(0, |m| m + 1);
    while pool.len() < max_seeds {
        pool.push(next);
        next += 1;
    }
    pool
}

/// Refuses, in one line before anything is allocated or trained, what `--until-settled` cannot do: a recipe
/// with no comparison (`compare:`), a cap that is not a second stage for the recipe's seeds (below its seeds
/// + 2 or above the verdicts' limit), and a command-line cap that differs from the recipe's plan.
pub fn check(recipe: &Recipe, cli_cap: Option<usize>) -> Result<usize> {
    let Some(compare) = &recipe.compare else {
        bail!(
            "{}: --until-settled adds seeds to settle the recipe's comparisons, and it names none: add a `compare:` section (a baseline or ladder: true)",
            recipe.file
        );
    };
    let cap = match (compare.max_seeds, cli_cap) {
        (Some(plan), Some(cli)) if plan != cli => bail!(
            "{}: --max-seeds {cli} differs from the recipe's plan, compare.max_seeds: {plan}; a plan is fixed before the data: drop --max-seeds, or change the recipe (the verdicts will say the plan was set after the pilot)",
            recipe.file
        ),
        (Some(plan), _) => plan,
        (None, Some(cli)) => cli,
        (None, None) => bail!(
            "{}: --until-settled needs the plan's cap: add `compare.max_seeds: N` to the recipe (the most seeds an arm may end with), or give --max-seeds N",
            recipe.file
        ),
    };
    let seeds = recipe.seeds.len();
    let floor = seeds + SECOND_STAGE_MIN;
    if !is_second_stage(seeds, cap) {
        bail!(
            "{}: a cap of {cap} seeds per arm is no second stage for the recipe's {seeds} seeds: give {floor} to {MOST_PLANNED_SEEDS} (a second stage is tested on at least {SECOND_STAGE_MIN} added seeds)",
            recipe.file
        );
    }
    // Every final run of the recipe per seed, times the cap: the runs the pool may expand to.
    let per_seed = recipe.runs.iter().filter(|r| r.tune.is_none_or(|t| t.rung.is_none())).count() / seeds.max(1);
    let runs = per_seed as u128 * cap as u128;
    if runs > crate::recipe::MAX_RUNS {
        bail!(
            "{}: a cap of {cap} seeds per arm expands the recipe's {per_seed} final runs per seed to {runs} runs; at most {} (lower the cap, or split the recipe)",
            recipe.file,
            crate::recipe::MAX_RUNS
        );
    }
    Ok(cap)
}

/// Per arm (variant label), the seeds it should end with: every arm of a comparison of the primary metric
/// gets the plan's count for that comparison ([`Planner::target`]), the largest over its comparisons.
pub fn targets(results: &Results, max_seeds: usize) -> Result<BTreeMap<String, usize>> {
    arm_targets(results, &results.recipe.seeds, max_seeds)
}

/// [`targets`] at the recipe's second scale (`scale_check:`), from the pilot rows in `<dir>/scale_check`:
/// that scale's comparisons are judged over their own family and settle on their own spread. Empty without
/// a second scale or before its pilot has rows.
pub fn second_scale_targets(results: &Results, max_seeds: usize) -> Result<BTreeMap<String, usize>> {
    match &results.second {
        Some((check, _)) => arm_targets(check, &results.recipe.seeds, max_seeds),
        None => Ok(BTreeMap::new()),
    }
}

fn arm_targets(results: &Results, pilot_seeds: &[u64], max_seeds: usize) -> Result<BTreeMap<String, usize>> {
    let mut out: BTreeMap<String, usize> = BTreeMap::new();
    let Some(spreads) = paired_spreads(results, pilot_seeds)? else { return Ok(out) };
    let planner = Planner::new(pilot_seeds.len(), max_seeds, family_level(spreads.len()));
    for (arms, sd, delta) in &spreads {
        let needed = planner.target(*sd, *delta);
        for arm in [&arms.0, &arms.1] {
            let t = out.entry(arm.clone()).or_insert(0);
            *t = (*t).max(needed);
        }
    }
    // Arms in no comparison (none in a baseline or ladder design) keep their pilot.
    for (label, _) in variants_of(&rows_of_seeds(&results.runs, pilot_seeds)) {
        out.entry(label).or_insert(pilot_seeds.len());
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
