//! Sensitivity to a swept key (`compare.sensitivity: train.lr`): for each arm (the runs that share every
//! other swept value), Wortsman et al. 2023's learning-rate sensitivity of the primary metric over the key's
//! levels, with its 95% interval, and each arm's difference from the baseline's arm. A description of the
//! curves printed beside the verdicts (the README's block), not a verdict: `crate::stats::Sensitivity` says
//! how it is computed and `tests/sequential.rs` simulates its interval's coverage.
use anyhow::{bail, Result};
use std::collections::BTreeMap;

use super::reading::Results;
use crate::recipe::Recipe;
use crate::stats::Sensitivity;

/// One arm's grid: the key's levels (as written, in grid order) and each level's capped values.
struct Arm {
    levels: Vec<String>,
    cells: Vec<Vec<f64>>,
}

/// The swept key `spec` names (`train.lr` or its last part `lr`), if the recipe sweeps it.
pub fn swept_key(recipe: &Recipe, spec: &str) -> Option<String> {
    recipe.sweep_keys.iter().find(|k| *k == spec || k.rsplit('.').next() == Some(spec)).cloned()
}

/// Refuses, in one line, a `compare.sensitivity` that names no swept key, or one whose levels are not
/// at least three numbers (unless command-line overrides narrowed them).
pub fn check(recipe: &Recipe) -> Result<()> {
    let Some(spec) = recipe.compare.as_ref().and_then(|c| c.sensitivity.as_deref()) else { return Ok(()) };
    let Some(key) = swept_key(recipe, spec) else {
        bail!(
            "{}: compare.sensitivity: `{spec}` is not a swept key; the swept keys are {}",
            recipe.file,
            recipe.sweep_keys.join(", ")
        );
    };
    let mut levels: Vec<&str> = Vec::new();
    for run in &recipe.runs {
        if let Some((_, v)) = run.swept.iter().find(|(k, _)| *k == key) {
            if v.parse::<f64>().is_err() {
                bail!("{}: compare.sensitivity: `{key}` has the level `{v}`, not a number", recipe.file);
            }
            if !levels.contains(&v.as_str()) {
                levels.push(v);
            }
        }
    }
    // Command-line overrides may pin the key for a quick run: nothing to describe then, and no error in the
    // recipe.
    let narrowed = !recipe.overrides.describe().is_empty();
    if levels.len() < 3 && !narrowed {
        bail!(
            "{}: compare.sensitivity: `{key}` has {} level(s); a sensitivity needs at least 3",
            recipe.file,
            levels.len()
        );
    }
    Ok(())
}

/// The block's sensitivity section for `dir` (markdown) of the primary metric `column`, or `None` when the
/// recipe asks for none.
pub fn section(results: &Results, column: &str) -> Result<Option<String>> {
    let recipe = results.recipe;
    let Some(spec) = recipe.compare.as_ref().and_then(|c| c.sensitivity.as_deref()) else { return Ok(None) };
    let Some(key) = swept_key(recipe, spec) else { return Ok(None) };
    let short = key.rsplit('.').next().unwrap_or(&key).to_string();
    let (runs, curves) = (&results.runs, results.curves()?);
    let value = |id: &str| -> Option<f64> {
        let row = runs.iter().find(|r| r.get("run_id").map(String::as_str) == Some(id))?;
        Some(row.get(column).and_then(|v| v.parse::<f64>().ok()).unwrap_or(f64::NAN))
    };
    // The loss at initialisation: the run's first validation point (step 0).
    let initial = |id: &str| -> Option<f64> {
        curves.get(id)?.get("val/loss")?.iter().find(|(step, _)| *step == 0).map(|&(_, v)| v)
    };
    let mut arms: BTreeMap<String, Arm> = BTreeMap::new();
    let mut order: Vec<String> = Vec::new();
    let mut uncapped = 0;
    // Every reported run of the directory, the seeds a second stage added included (the recipe lists only
    // its own).
    for row in runs {
        let (Some(id), Some(level), Some(label)) = (row.get("run_id"), row.get(&key), row.get("label")) else {
            continue;
        };
        let Some(v) = value(id) else { continue };
        let capped = match initial(id) {
            Some(l0) if v.is_finite() => v.min(l0),
            Some(l0) => l0,
            None => {
                uncapped += 1;
                v
            }
        };
        let arm_label = super::reading::arm_of(label, &key);
        if !order.contains(&arm_label) {
            order.push(arm_label.clone());
        }
        let arm = arms.entry(arm_label).or_insert_with(|| Arm { levels: Vec::new(), cells: Vec::new() });
        let i = match arm.levels.iter().position(|l| l == level) {
            Some(i) => i,
            None => {
                arm.levels.push(level.clone());
                arm.cells.push(Vec::new());
                arm.levels.len() - 1
            }
        };
        arm.cells[i].push(capped);
    }
    let mut out = format!(
        "\n**Sensitivity to `{key}`** (`compare.sensitivity`; Wortsman et al. 2023's learning-rate sensitivity of \
         {column}): over each arm's levels of `{short}`, the mean of (the level's mean over seeds − the best \
         level's), each run's value first capped at its loss at step 0 (a diverged run counts as that loss); 0 is \
         a flat curve. 95% interval: t with Welch–Satterthwaite degrees of freedom, the best level taken as known \
         (its simulated coverage: docs/results.md, \"Sensitivity\"). A description beside the verdicts, not one.\n\n\
         | arm | levels (runs) | best level | its mean | sensitivity [95% CI] |\n|---|---|---|---|---|\n"
    );
    let mut judged: Vec<(String, Sensitivity)> = Vec::new();
    for label in &order {
        let arm = &arms[label];
        let runs: usize = arm.cells.iter().map(Vec::len).sum();
        let Some(s) = Sensitivity::of(&arm.cells) else { continue };
        let best_mean = crate::stats::mean_std(&arm.cells[s.best]).0;
        out.push_str(&format!(
            "| {label} | {} ({runs}) | {short}={} | {best_mean:.4} | {} |\n",
            arm.levels.len(),
            arm.levels[s.best],
            with_interval(s.value, s.interval())
        ));
        judged.push((label.clone(), s));
    }
    let baseline = recipe.compare.as_ref().and_then(|c| match &c.comparison {
        crate::recipe::compare::Comparison::Baseline(b) => Some(b.clone()),
        crate::recipe::compare::Comparison::Ladder => None,
    });
    let base = baseline.and_then(|b| judged.iter().position(|(label, _)| label.split(' ').any(|t| t == b)));
    if let Some(base) = base {
        out.push_str(&format!(
            "\nAgainst the baseline's arm ({}), each arm's sensitivity minus its own:\n\n| arm | difference [95% CI] |\n|---|---|\n",
            judged[base].0
        ));
        for (label, s) in judged.iter().filter(|(label, _)| *label != judged[base].0) {
            let (d, interval) = s.difference(&judged[base].1);
            out.push_str(&format!("| {label} | {} |\n", with_interval(d, interval)));
        }
    }
    if uncapped > 0 {
        out.push_str(&format!("\n{uncapped} run(s) have no step-0 loss in curves.csv: their values are not capped.\n"));
    }
    Ok(Some(out))
}

fn with_interval(value: f64, interval: Option<(f64, f64)>) -> String {
    match interval {
        Some((lo, hi)) => format!("{value:.4} [{lo:.4}, {hi:.4}]"),
        None => format!("{value:.4} (one run per level: no interval)"),
    }
}
