//! What each arm is worth in compute (`compare.compute`): the compute-equivalent gain of every arm over the
//! baseline's arm at the recipe's target values of the primary metric, with its 95% interval, and whether
//! the advantage changes with compute (the exponent difference's verdict). Each arm is the runs that share
//! every swept value but the ladder's; its frontier is fitted seed by seed ([`crate::ceg`], which says how
//! and where its coverage is simulated). Printed in the verdict block and `ablate summary`, drawn as
//! `compute_frontiers.png`.
use anyhow::{bail, Result};
use std::collections::BTreeMap;

use super::plot::charts::{compute_chart, ComputeAxes, FrontierBand, GainBand};
use super::reading::Results;
use crate::ceg::{fit_check, gain, scale_verdicts, seed_pairs, FitCheck, Frontier, Ladder};
use crate::recipe::compare::Comparison;
use crate::recipe::Recipe;
use crate::stats::Estimate;

/// The file of the frontier plot.
pub const PLOT: &str = "compute_frontiers.png";

/// A rung's compute from a swept value: a number (`4e12`), or a section of one number (`{flops: 4e12}`, as
/// `train.budget` is swept).
fn rung_of(value: &str) -> Option<f64> {
    if let Ok(c) = value.parse::<f64>() {
        return Some(c);
    }
    match serde_json::from_str::<serde_json::Value>(value).ok()? {
        serde_json::Value::Object(fields) if fields.len() == 1 => fields.values().next()?.as_f64(),
        _ => None,
    }
}

/// A run's rung: the ladder key's column, or the one column under it (`train.budget.flops`).
fn row_rung(row: &super::reading::Row, key: &str) -> Option<f64> {
    if let Some(v) = row.get(key) {
        return rung_of(v);
    }
    let prefix = format!("{key}.");
    let mut under = row.iter().filter(|(k, v)| k.starts_with(&prefix) && !v.is_empty());
    let (_, v) = under.next()?;
    under.next().is_none().then(|| v.parse().ok()).flatten()
}

/// Refuses, in one line, a `compare.compute` whose ladder is not a swept key of at least four numbers each
/// at least twice the one before, or a recipe that pairs no baseline (the gains are each arm's over it).
pub fn check(recipe: &Recipe) -> Result<()> {
    let Some(compute) = recipe.compare.as_ref().and_then(|c| c.compute.as_ref()) else { return Ok(()) };
    let at = format!("{}: compare.compute", recipe.file);
    let Some(key) = super::sensitivity::swept_key(recipe, &compute.ladder) else {
        bail!(
            "{at}.ladder: `{}` is not a swept key; the swept keys are {}",
            compute.ladder,
            recipe.sweep_keys.join(", ")
        );
    };
    if recipe.compare.as_ref().is_some_and(|c| c.comparison == Comparison::Ladder) {
        bail!("{at}: the gains are each arm's over a baseline: give compare.baseline, not a ladder");
    }
    // Command-line overrides may pin the key for a quick run: nothing to fit then, and no error in the recipe.
    if !recipe.overrides.describe().is_empty() {
        return Ok(());
    }
    let mut rungs: Vec<f64> = Vec::new();
    for run in &recipe.runs {
        if let Some((_, v)) = run.swept.iter().find(|(k, _)| *k == key) {
            let Some(c) = rung_of(v) else {
                bail!("{at}.ladder: `{key}` has the value `{v}`, not a number (or a section of one)")
            };
            if !rungs.contains(&c) {
                rungs.push(c);
            }
        }
    }
    rungs.sort_by(f64::total_cmp);
    if rungs.len() < 4 {
        bail!("{at}.ladder: `{key}` has {} rung(s); a frontier needs at least 4", rungs.len());
    }
    if let Some(w) = rungs.windows(2).find(|w| w[1] < 2.0 * w[0] * (1.0 - 1e-9)) {
        bail!("{at}.ladder: the rungs {} and {} are less than a factor of two apart", w[0], w[1]);
    }
    if let Some(sizes) = &compute.sizes {
        let Some(size_key) = super::sensitivity::swept_key(recipe, sizes).filter(|s| *s != key) else {
            bail!(
                "{at}.sizes: `{sizes}` is not a swept key other than the ladder's; the swept keys are {}",
                recipe.sweep_keys.join(", ")
            );
        };
        let mut values: Vec<&str> = recipe
            .runs
            .iter()
            .filter_map(|r| r.swept.iter().find(|(k, _)| *k == size_key).map(|(_, v)| v.as_str()))
            .collect();
        values.sort_unstable();
        values.dedup();
        if values.len() < 2 {
            bail!("{at}.sizes: `{size_key}` has {} value(s); choosing a size per rung needs at least 2", values.len());
        }
    }
    Ok(())
}

/// Each arm's ladder of the primary metric `column`, in the order the arms first appear: (arm, ladder), and
/// per arm the size chosen at each rung (empty without `sizes`). With `sizes` (a swept key of model sizes),
/// an arm is the runs that share every swept value but the ladder's and the size's, and its value at a rung
/// is each seed's at the size whose last validation value of the metric's curve, averaged over the seeds, is
/// the lowest there: the arm's own frontier, chosen on validation data and reported on `column`.
fn ladders(
    results: &Results,
    key: &str,
    sizes: Option<&str>,
    column: &str,
) -> (Vec<(String, Ladder)>, Vec<Vec<String>>) {
    // Per arm: (rung written out, size) -> seed -> (value, last validation value).
    type Cells = BTreeMap<(String, String), BTreeMap<u64, (f64, f64)>>;
    let mut cells: Vec<(String, Cells)> = Vec::new();
    let mut rungs: Vec<f64> = Vec::new();
    let curve = results.headline.iter().find(|m| m.column_name() == Some(column)).and_then(|m| m.curve);
    let curves = sizes.and_then(|_| results.curves().ok());
    for row in &results.runs {
        let (Some(label), Some(c), Some(seed)) = (row.get("label"), row_rung(row, key), row.get("seed")) else {
            continue;
        };
        let Ok(seed) = seed.parse::<u64>() else { continue };
        let value = row.get(column).and_then(|v| v.parse::<f64>().ok()).unwrap_or(f64::NAN);
        let (arm, size) = match sizes {
            None => (super::reading::arm_of(label, key), String::new()),
            Some(s) => {
                let Some(size) = row.get(s) else { continue };
                (super::reading::arm_of(&super::reading::arm_of(label, key), s), size.clone())
            }
        };
        let validation = curves
            .zip(curve)
            .zip(row.get("run_id"))
            .and_then(|((all, curve), id)| all.get(id)?.get(curve)?.last().map(|p| p.1))
            .unwrap_or(f64::NAN);
        if !rungs.contains(&c) {
            rungs.push(c);
        }
        let i = match cells.iter().position(|(a, _)| *a == arm) {
            Some(i) => i,
            None => {
                cells.push((arm, BTreeMap::new()));
                cells.len() - 1
            }
        };
        cells[i].1.entry((format!("{c:e}"), size)).or_default().insert(seed, (value, validation));
    }
    rungs.sort_by(f64::total_cmp);
    let mut arms = Vec::new();
    let mut chosen = Vec::new();
    for (arm, cells) in cells {
        // The size at each rung: the only one, or the lowest mean validation value over seeds.
        let picks: Vec<Option<&BTreeMap<u64, (f64, f64)>>> = rungs
            .iter()
            .map(|c| {
                let at = format!("{c:e}");
                let candidates = cells.iter().filter(|((r, _), _)| *r == at);
                match sizes {
                    None => candidates.map(|(_, seeds)| seeds).next(),
                    Some(_) => candidates
                        .filter_map(|(_, seeds)| {
                            let v: Vec<f64> = seeds.values().map(|p| p.1).collect();
                            let mean = v.iter().sum::<f64>() / v.len() as f64;
                            mean.is_finite().then_some((mean, seeds))
                        })
                        .min_by(|a, b| a.0.total_cmp(&b.0))
                        .map(|(_, seeds)| seeds),
                }
            })
            .collect();
        let sizes_chosen: Vec<String> = rungs
            .iter()
            .zip(&picks)
            .map(|(c, pick)| {
                let at = format!("{c:e}");
                cells
                    .iter()
                    .find(|((r, _), seeds)| *r == at && pick.is_some_and(|p| std::ptr::eq(p, *seeds)))
                    .map_or("–".to_string(), |((_, size), _)| size.clone())
            })
            .collect();
        let mut seeds_seen: Vec<u64> = cells.values().flat_map(|s| s.keys().copied()).collect();
        seeds_seen.sort_unstable();
        seeds_seen.dedup();
        // A seed counts when it ran every rung (at the chosen size).
        let seeds = seeds_seen
            .into_iter()
            .filter_map(|s| {
                let row: Option<Vec<f64>> =
                    picks.iter().map(|p| p.and_then(|seeds| seeds.get(&s)).map(|v| v.0)).collect();
                Some((s, row?))
            })
            .collect();
        arms.push((arm, Ladder { compute: rungs.clone(), seeds }));
        chosen.push(if sizes.is_some() { sizes_chosen } else { Vec::new() });
    }
    (arms, chosen)
}

/// The baseline's arm among `arms`: the one the recipe's `compare.baseline` names (`variant=X`, `X`, or a
/// `key=value` token of its label).
fn baseline_arm(recipe: &Recipe, arms: &[(String, Ladder)]) -> Option<usize> {
    let Some(Comparison::Baseline(b)) = recipe.compare.as_ref().map(|c| &c.comparison) else { return None };
    let value = b.split_once('=').map_or(b.as_str(), |(_, v)| v);
    arms.iter().position(|(arm, _)| arm == b || arm == value || arm.split(' ').any(|t| t == b))
}

fn with_interval(ratio: f64, interval: Option<(f64, f64)>) -> String {
    match interval {
        Some((lo, hi)) => format!("{ratio:.2}× [{lo:.2}, {hi:.2}]"),
        None => format!("{ratio:.2}× (one seed: no interval)"),
    }
}

/// What the section, the gains and the plot all read: the recipe's `compare.compute`, the ladder's swept key,
/// every arm's ladder of the primary metric `column` and the baseline's arm among them; `None` without
/// `compare.compute` or a baseline arm.
struct Setup<'a> {
    compute: &'a crate::recipe::compare::Compute,
    key: String,
    arms: Vec<(String, Ladder)>,
    base: usize,
    /// The swept key of model sizes (`compare.compute.sizes`), and per arm the size chosen at each rung.
    sizes: Option<String>,
    chosen: Vec<Vec<String>>,
}

impl<'a> Setup<'a> {
    fn of(results: &'a Results, column: &str) -> Option<Setup<'a>> {
        let compute = results.recipe.compare.as_ref()?.compute.as_ref()?;
        let key = super::sensitivity::swept_key(results.recipe, &compute.ladder)?;
        let sizes = compute.sizes.as_deref().and_then(|s| super::sensitivity::swept_key(results.recipe, s));
        let (arms, chosen) = ladders(results, &key, sizes.as_deref(), column);
        let base = baseline_arm(results.recipe, &arms)?;
        Some(Setup { compute, key, arms, base, sizes, chosen })
    }

    fn baseline(&self) -> &Ladder {
        &self.arms[self.base].1
    }

    /// A frontier needs at least two rungs (a smoke run's budgets are seconds, with no rung at all).
    fn has_ladder(&self) -> bool {
        self.baseline().compute.len() >= 2
    }
}

/// Every arm's gain over the baseline at each target (absent targets: the baseline's inner rung means),
/// with how well the law fits the two arms: (arm, gain, fit), in the arms' order; empty without
/// `compare.compute` or a ladder of at least two rungs.
pub fn measured(results: &Results, column: &str) -> Vec<(String, crate::ceg::Gain, Option<FitCheck>)> {
    let Some(Setup { compute, arms, base, .. }) = Setup::of(results, column).filter(Setup::has_ladder) else {
        return Vec::new();
    };
    let targets = targets(&compute.targets, &arms[base].1);
    let mut out = Vec::new();
    for (_, (arm, ladder)) in arms.iter().enumerate().filter(|(i, _)| *i != base) {
        let fit = fit_check(&arms[base].1, ladder);
        out.extend(targets.iter().filter_map(|&t| Some((arm.clone(), gain(&arms[base].1, ladder, t)?, fit))));
    }
    out
}

/// The targets a recipe states, or (absent) the baseline's mean at each inner rung.
fn targets(stated: &[f64], baseline: &Ladder) -> Vec<f64> {
    if !stated.is_empty() {
        return stated.to_vec();
    }
    let means = baseline.means();
    let inner = if means.len() > 2 { &means[1..means.len() - 1] } else { &means[..] };
    inner.iter().copied().filter(|m| m.is_finite()).collect()
}

/// The block's compute section for the primary metric `column` (markdown), or `None` without
/// `compare.compute`.
pub fn section(results: &Results, column: &str) -> Result<Option<String>> {
    let Some(setup) = Setup::of(results, column) else { return Ok(None) };
    if !setup.has_ladder() {
        let key = &setup.key;
        // A smoke run (its budgets made seconds) or a ladder not yet run: no frontier to fit.
        return Ok(Some(format!(
            "\n**What each arm is worth in compute** (`compare.compute`, over `{key}`): no ladder of at least two \
             rungs in these results yet.\n"
        )));
    }
    let Setup { compute, key, arms, base, sizes, chosen } = setup;
    let delta = compute.exponent_delta;
    let mut out = format!(
        "\n**What each arm is worth in compute** (`compare.compute`, over `{key}`): each seed's ladder of \
         {column} fitted as L = E + A·C^−α, E shared by the seed's two arms (docs/results.md, \
         \"Compute-equivalent gains\"); the gain at L* is C_baseline(L*) / C_arm(L*), the compute the baseline \
         needs for the arm's result, as a geometric mean over seeds with a 95% t interval (simulated coverage \
         94.6–94.9%, `tests/ceg.rs`). A target outside either arm's measured range is a forecast, not a \
         finding. With compute: the paired difference α_arm − α_baseline, Holm over the arms, at ±{delta}, \
         under the shared floor and under each arm's own floor (free E); a verdict is stated only where both \
         fits give it, else *inconclusive: depends on the floor* (simulated in `tests/ceg.rs`).\n\n\
         The law must describe the ladders first: where its residual standard deviation (over seeds, arms and \
         rungs, on the degrees of freedom left after each seed's 5 parameters) exceeds twice the seeds' own \
         spread, the row says the law misfits and its gain is no estimate.\n\n\
         | arm | L* | worth (× the baseline's compute) [95% CI] | seeds | fit: residual / seed spread | α_arm − α_baseline [95% CI]: shared E; free E | with compute |\n\
         |---|---|---|---|---|---|---|\n"
    );
    // Absent targets: the baseline's mean at each inner rung (inside its range by construction).
    let targets = targets(&compute.targets, &arms[base].1);
    let others: Vec<usize> = (0..arms.len()).filter(|&i| i != base).collect();
    let ladders: Vec<&Ladder> = others.iter().map(|&i| &arms[i].1).collect();
    let verdicts = scale_verdicts(&arms[base].1, &ladders, delta);
    let interval = |differences: &[f64]| match differences.len() {
        0 => "–".to_string(),
        1 => format!("{:+.3} (one seed)", differences[0]),
        _ => {
            let e = Estimate::of(differences);
            let h = e.half_width.unwrap_or(f64::NAN);
            format!("{:+.3} [{:+.3}, {:+.3}]", e.mean, e.mean - h, e.mean + h)
        }
    };
    for (k, &i) in others.iter().enumerate() {
        let (arm, ladder) = &arms[i];
        let alpha = format!("{}; {}", interval(&verdicts[k].shared.0), interval(&verdicts[k].free.0));
        let fit = fit_check(&arms[base].1, ladder);
        let fit_cell = fit.map_or("–".to_string(), |f| {
            format!("{:.4} / {:.4}{}", f.residual, f.seed_spread, if f.fits() { "" } else { ": **the law misfits**" })
        });
        for &target in &targets {
            let Some(g) = gain(&arms[base].1, ladder, target) else {
                out.push_str(&format!(
                    "| {arm} | {target} | no seed's frontiers reach it | – | {fit_cell} | {alpha} | – |\n"
                ));
                continue;
            };
            let mut worth = with_interval(g.ratio, g.interval);
            if fit.is_some_and(|f| !f.fits()) {
                worth = format!("no estimate (the law misfits; read off it: {worth})");
            } else if !g.inside {
                worth = format!("forecast: {worth} (outside the measured range)");
            } else if g.interval.is_some_and(|(lo, hi)| lo <= 1.0 && 1.0 <= hi) {
                worth.push_str(": the interval includes 1, no gain shown");
            }
            let with_compute = match fit.is_some_and(|f| !f.fits()) {
                true => "no verdict (the law misfits)".to_string(),
                false => verdicts[k].words(),
            };
            out.push_str(&format!(
                "| {arm} | {target:.4} | {worth} | {} | {fit_cell} | {alpha} | {with_compute} |\n",
                g.log_ratios.len()
            ));
        }
    }
    let (lo, hi) = arms[base].1.range();
    out.push_str(&format!(
        "\nThe baseline ({}) measured {column} from {lo:.4} to {hi:.4} over {} rungs of `{key}` ({}); the frontiers \
         and the gains are drawn in `{PLOT}`.\n",
        arms[base].0,
        arms[base].1.compute.len(),
        arms[base].1.compute.iter().map(|c| format!("{c:e}")).collect::<Vec<_>>().join(", ")
    ));
    if let Some(sizes) = &sizes {
        out.push_str(&format!(
            "\nEach arm's frontier is its own best size: at each rung, the value of `{sizes}` whose last validation \
             value (the mean over seeds) was lowest, its runs' {column} reported. Chosen per rung: {}.\n",
            arms.iter()
                .zip(&chosen)
                .map(|((arm, _), picks)| format!("{arm} {}", picks.join(", ")))
                .collect::<Vec<_>>()
                .join("; ")
        ));
    }
    out.push_str(&wall_clock_part(results, &arms, base, &targets)?);
    Ok(Some(out))
}

/// The one-minute load average at most which the cores count as quiet before a timing (on two cores, a
/// training process beside it holds the load near 1 or more).
pub const QUIET_LOAD: f64 = 0.5;

/// The highest load average before the first run of any timing (NaN where none was read: not quiet).
fn load_at_start(timings: &[super::reading::Timing]) -> f64 {
    timings.iter().map(|t| t.load_at_start).fold(f64::NAN, f64::max)
}

/// The section's wall-clock part: each arm's speed relative to the baseline (model FLOP/s, paired by repeat,
/// from `wall_clock.csv`) and, where the cores were quiet, its gain in wall-clock time at each target.
fn wall_clock_part(results: &Results, arms: &[(String, Ladder)], base: usize, targets: &[f64]) -> Result<String> {
    let Some(timings) = super::reading::wall_clock(&results.dir)? else {
        return Ok("\nWall-clock gains are not stated: no `wall_clock.csv` (`ablate wall-clock` times the arms, \
                   in turn, on quiet cores).\n"
            .into());
    };
    let Some(first) = timings.first() else { return Ok(String::new()) };
    let repeats = timings.iter().map(|t| t.repeat).collect::<std::collections::BTreeSet<_>>().len();
    let load = load_at_start(&timings);
    let quiet = load <= QUIET_LOAD;
    let mut out = format!(
        "\n**In wall-clock time** (`wall_clock.csv`, by `ablate wall-clock`: every arm trained for a fixed number \
         of steps in turn, {repeats} repeats, on {} with {} threads, load average {load:.2} before the first run): \
         an arm's speed is its model FLOP/s over the baseline's, paired by repeat (geometric mean, 95% t \
         interval); its gain in time is the gain in compute times its speed, with Welch's 95% interval on the \
         two independent means (simulated coverage 94.4–96.2%, `tests/ceg.rs`). ",
        first.cpu, first.threads
    );
    if quiet {
        out.push_str(&format!("The cores were quiet (load at most {QUIET_LOAD}).\n\n"));
    } else {
        out.push_str(&format!(
            "**The cores were busy** (load above {QUIET_LOAD}): the speeds are printed, no gain in time is stated.\n\n"
        ));
    }
    out.push_str("| arm | speed (× the baseline's FLOP/s) [95% CI] | L* | worth in wall-clock time [95% CI] |\n|---|---|---|---|\n");
    let baseline = &arms[base];
    for (arm, ladder) in arms.iter().enumerate().filter(|(i, _)| *i != base).map(|(_, a)| (&a.0, &a.1)) {
        let speeds = super::reading::speed_logs(&timings, arm, &baseline.0);
        let speed = match speeds.len() {
            0 => "not timed".to_string(),
            1 => format!("{:.3}× (one repeat)", speeds[0].exp()),
            _ => {
                let (m, lo, hi) = centre_and_interval(&speeds);
                format!("{:.3}× [{:.3}, {:.3}]", m.exp(), lo.exp(), hi.exp())
            }
        };
        let misfits = fit_check(&baseline.1, ladder).is_some_and(|f| !f.fits());
        for &target in targets {
            let worth = wall_cell(gain(&baseline.1, ladder, target).as_ref(), &speeds, quiet, misfits);
            out.push_str(&format!("| {arm} | {speed} | {target:.4} | {worth} |\n"));
        }
    }
    Ok(out)
}

/// An arm's gain in wall-clock time at one target, in words: the gain in compute `g` times the speed ratios
/// `speeds` (log, by repeat), stated only on quiet cores and where the law fits.
fn wall_cell(g: Option<&crate::ceg::Gain>, speeds: &[f64], quiet: bool, misfits: bool) -> String {
    let Some(g) = g else { return "no seed's frontiers reach it".into() };
    if speeds.is_empty() {
        return "not timed".into();
    }
    if misfits {
        return "no estimate (the law misfits)".into();
    }
    if !quiet {
        return "not stated (busy cores)".into();
    }
    let Some((ratio, interval)) = crate::ceg::wall_gain(g, speeds) else { return "–".into() };
    let text = with_interval(ratio, interval);
    if !g.inside {
        format!("forecast: {text} (outside the measured range)")
    } else if interval.is_some_and(|(lo, hi)| lo <= 1.0 && 1.0 <= hi) {
        format!("{text}: the interval includes 1, no gain shown")
    } else {
        text
    }
}

/// An arm's gain in wall-clock time at `g`'s target, for the reproductions table: the section's words, or
/// "not timed" without `wall_clock.csv`.
pub fn wall_clock_words(results: &Results, column: &str, arm: &str, g: &crate::ceg::Gain) -> Result<String> {
    let Some(timings) = super::reading::wall_clock(&results.dir)? else { return Ok("not timed".into()) };
    let Some(Setup { arms, base, .. }) = Setup::of(results, column) else { return Ok("–".into()) };
    let Some((_, ladder)) = arms.iter().find(|(a, _)| a == arm) else { return Ok("–".into()) };
    let quiet = load_at_start(&timings) <= QUIET_LOAD;
    let misfits = fit_check(&arms[base].1, ladder).is_some_and(|f| !f.fits());
    let speeds = super::reading::speed_logs(&timings, arm, &arms[base].0);
    Ok(wall_cell(Some(g), &speeds, quiet, misfits))
}

/// Each seed's frontier of every arm, fitted as the gain fits it ([`seed_pairs`] with the baseline, the floor
/// shared). The baseline's: with one other arm, its side of that pair, so both drawn curves are the ones the
/// gain reads; beside several arms (one floor per pair) its own ladder's fit.
fn seed_frontiers(arms: &[(String, Ladder)], base: usize) -> Vec<Vec<Frontier>> {
    let baseline = &arms[base].1;
    let only_other = (arms.len() == 2).then(|| &arms[1 - base].1);
    arms.iter()
        .enumerate()
        .map(|(i, (_, ladder))| match only_other {
            Some(other) if i == base => seed_pairs(baseline, other).into_iter().map(|(_, b, _)| b).collect(),
            _ => seed_pairs(baseline, ladder).into_iter().map(|(_, _, a)| a).collect(),
        })
        .collect()
}

/// The mean of `values` and its 95% t interval (the mean itself, twice, from one value).
fn centre_and_interval(values: &[f64]) -> (f64, f64, f64) {
    let e = Estimate::of(values);
    let h = e.half_width.unwrap_or(0.0);
    (e.mean, e.mean - h, e.mean + h)
}

/// Draws `compute_frontiers.png`: on the left each arm's runs of the primary metric against compute (TFLOP)
/// and the mean of its seeds' fitted frontiers with their 95% band; on the right each arm's gain over the
/// baseline across the targets inside both arms' measured ranges, with its 95% band, read against 1 and the
/// prediction. An arm whose law misfits has no gain curve (its gain is no estimate).
pub fn plot(results: &Results, column: &str, label: &str) -> Result<()> {
    let Some(Setup { compute, arms, base, .. }) = Setup::of(results, column).filter(Setup::has_ladder) else {
        return Ok(());
    };
    let tera = 1e12;
    let per_seed = seed_frontiers(&arms, base);
    let mut bands = Vec::new();
    for (i, ((arm, ladder), fits)) in arms.iter().zip(&per_seed).enumerate() {
        let runs: Vec<(f64, f64)> = ladder
            .seeds
            .iter()
            .flat_map(|(_, l)| ladder.compute.iter().zip(l).map(|(c, v)| (c / tera, *v)))
            .filter(|(_, v)| v.is_finite())
            .collect();
        let (c0, c1) = (ladder.compute[0], ladder.compute[ladder.compute.len() - 1]);
        let frontier = if fits.is_empty() {
            Vec::new()
        } else {
            (0..=24)
                .map(|i| c0 * (c1 / c0).powf(i as f64 / 24.0))
                .map(|c| {
                    let (m, lo, hi) = centre_and_interval(&fits.iter().map(|f| f.loss_at(c)).collect::<Vec<_>>());
                    (c / tera, m, lo, hi)
                })
                .collect()
        };
        let fit_words = match fits.len() {
            0 => "no fit".to_string(),
            n => {
                let mean = |v: Vec<f64>| v.iter().sum::<f64>() / n as f64;
                let (e, alpha) =
                    (mean(fits.iter().map(|f| f.floor).collect()), mean(fits.iter().map(|f| f.exponent).collect()));
                let own = if arms.len() > 2 && i == base { ", its own floor" } else { "" };
                format!("fit E = {e:.3}{own}, α = {alpha:.3}")
            }
        };
        bands.push(FrontierBand { label: format!("{arm} ({fit_words})"), runs, frontier });
    }
    let targets = targets(&compute.targets, &arms[base].1);
    let mut gains = Vec::new();
    for (i, (arm, ladder)) in arms.iter().enumerate().filter(|(i, _)| *i != base) {
        if fit_check(&arms[base].1, ladder).is_some_and(|f| !f.fits()) {
            bands[i].label.push_str(": the law misfits, no gain");
            continue;
        }
        let ((b0, b1), (a0, a1)) = (arms[base].1.range(), ladder.range());
        let (lo, hi) = (b0.max(a0), b1.min(a1));
        if lo >= hi || lo.is_nan() || hi.is_nan() {
            continue;
        }
        let point = |t: f64| {
            let g = gain(&arms[base].1, ladder, t)?;
            let (l, h) = g.interval.unwrap_or((g.ratio, g.ratio));
            Some((t, g.ratio, l, h))
        };
        let points: Vec<_> = (0..=30).filter_map(|k| point(lo + (hi - lo) * k as f64 / 30.0)).collect();
        let marked =
            targets.iter().filter(|t| (lo..=hi).contains(*t)).filter_map(|&t| point(t)).map(|p| (p.0, p.1)).collect();
        gains.push(GainBand { label: arm.clone(), arm: i, points, marked });
    }
    let title = format!("{}: {label} against training compute, and what each arm is worth", results.recipe.name);
    let predicted = compute.predict.as_ref().map(|p| (p.gain, format!("predicted {}×", p.gain)));
    compute_chart(
        &results.dir.join(PLOT),
        &bands,
        &gains,
        &ComputeAxes {
            title: &title,
            compute_label: "training compute (TFLOP)",
            value_label: label,
            predicted,
            no_gain: "no gain to draw: the law misfits every arm's ladder",
        },
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ladder(floor: f64, scale: f64) -> Ladder {
        let compute: Vec<f64> = vec![1.0e12, 2.0e12, 4.0e12, 8.0e12];
        let seeds = (0..3u64)
            .map(|s| (s, compute.iter().map(|&c| floor + scale * (c / 1.0e12).powf(-0.4) + 0.01 * s as f64).collect()))
            .collect();
        Ladder { compute, seeds }
    }

    /// Beside one arm the baseline's drawn frontiers are its side of the pair fits (the floor shared, as the
    /// gain reads them); beside several, its own ladder's fits.
    #[test]
    fn the_baseline_is_drawn_with_the_floor_it_shares_with_its_one_arm() {
        let (base, arm) = (ladder(1.5, 1.0), ladder(1.3, 0.9));
        let two = [("base".to_string(), base.clone()), ("arm".to_string(), arm.clone())];
        let drawn = seed_frontiers(&two, 0);
        let pairs = seed_pairs(&base, &arm);
        assert_eq!(drawn[0].len(), 3);
        for ((b, a), (_, pb, pa)) in drawn[0].iter().zip(&drawn[1]).zip(&pairs) {
            assert_eq!((b, a), (pb, pa));
            assert_eq!(b.floor, a.floor);
        }
        let own = seed_pairs(&base, &base);
        assert!(own.iter().zip(&drawn[0]).all(|((_, o, _), d)| o.floor != d.floor), "a shared floor, not its own");
        let three = [two[0].clone(), two[1].clone(), ("other".to_string(), ladder(1.2, 0.8))];
        let drawn = seed_frontiers(&three, 0);
        assert!(own.iter().zip(&drawn[0]).all(|((_, o, _), d)| o == d), "beside two arms, its own fit");
    }
}
