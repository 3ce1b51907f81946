//! Per-arm tuning (`tune:`): every arm of a recipe (a sweep point or variant, seeds apart) picks its own
//! value of the tuned keys on the validation split, by successive halving, and its final seeds train with
//! the chosen value. Here the plan is expanded statically, so every run that could train is a checked
//! [`RunSpec`] before anything starts (resumption, shards and merges find every id): for each arm and
//! candidate, one tuning run per tuning seed and rung, and the final runs. Which of them train is decided
//! while the sweep runs (`run::tune`), from the validation scores of the rung before.
//!
//! Successive halving (Jamieson & Talwalkar 2016; the rule inside Hyperband and ASHA): with `n` candidates
//! and reduction factor `eta`, `R = ⌈log_eta n⌉` rungs; rung `r` trains its candidates for
//! `steps · eta^(r − R)` steps (warm-up scaled alike, the schedule compressed to the rung's budget: each rung
//! trains from scratch) and keeps the best `⌈n_r / eta⌉`. A grid of `eta^k` values costs `k` full runs per
//! tuning seed. A tuned `train.lr` carries `train.min_lr` with it at the recipe's ratio (unless that is
//! tuned too).
use serde::Deserialize;
use serde_yaml::{Mapping, Value};

use super::{config_hash, set_path, to_value, value_text, RecipeError, RunSpec, Source};
use crate::recipe::Config;

/// The `tune:` section as written.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct TuneFile {
    /// Dotted config key -> candidate values; several keys form a grid of candidates.
    keys: Mapping,
    /// Seeds of the tuning runs: none of them may be a final seed.
    seeds: Vec<u64>,
    /// Successive halving's reduction factor: each rung keeps the best 1/eta of its candidates.
    #[serde(default = "default_eta")]
    eta: usize,
    /// The validation curve that scores candidates (`loss`, `accuracy`, … of `val/…`).
    #[serde(default = "default_metric")]
    metric: String,
}

fn default_eta() -> usize {
    3
}

fn default_metric() -> String {
    "loss".into()
}

/// A recipe's tuning plan.
#[derive(Debug, Clone, PartialEq)]
pub struct Tuning {
    /// The tuned keys, in the order written.
    pub keys: Vec<String>,
    /// Every candidate: its value per tuned key, as text (`train.lr=0.001`).
    pub candidates: Vec<String>,
    pub seeds: Vec<u64>,
    pub eta: usize,
    /// The validation curve key that scores candidates (`val/loss`).
    pub curve: String,
    /// Rungs of successive halving (0 when there is one candidate: its final runs train directly).
    pub rungs: usize,
    /// The arms' labels, in recipe order.
    pub arms: Vec<String>,
}

/// What a run of a tuned recipe is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TuneRole {
    /// Index into [`Tuning::arms`] and [`Tuning::candidates`].
    pub arm: usize,
    pub candidate: usize,
    /// The rung of a tuning run; `None` for a final run.
    pub rung: Option<usize>,
}

impl TuneRole {
    /// The `phase` column: `tune` or `final`.
    pub fn phase(&self) -> &'static str {
        if self.rung.is_some() {
            "tune"
        } else {
            "final"
        }
    }
}

impl Tuning {
    /// How many candidates rung `rung` trains, of `n`: successive halving keeps ⌈n / eta⌉ per rung.
    pub fn survivors_at(&self, rung: usize) -> usize {
        let mut n = self.candidates.len();
        for _ in 0..rung {
            n = n.div_ceil(self.eta);
        }
        n
    }

    /// The fraction of the final run's steps that rung `rung` trains for.
    pub fn fraction(&self, rung: usize) -> f64 {
        (self.eta as f64).powi(rung as i32 - self.rungs as i32)
    }
}

/// ⌈log_eta n⌉: rungs needed to bring `n` candidates down to one.
fn rungs_for(n: usize, eta: usize) -> usize {
    let (mut rungs, mut left) = (0, n);
    while left > 1 {
        left = left.div_ceil(eta);
        rungs += 1;
    }
    rungs
}

/// Expands `base` (the recipe's runs, one per arm and final seed, validated) into the tuned recipe's runs:
/// per arm and candidate, the final runs, then per rung one tuning run per tuning seed. Refuses, at the
/// `tune:` line: an empty candidate list, a key both tuned and swept, a tuning seed that is a final seed, a
/// tuned key no run reads, an eta below 2, and a candidate that makes an invalid run.
pub(super) fn expand(
    src: &Source,
    file: &TuneFile,
    base: Vec<RunSpec>,
    sweep_keys: &[String],
    final_seeds: &[u64],
) -> Result<(Tuning, Vec<RunSpec>), RecipeError> {
    plan(src, file, base, final_seeds, tuned_keys(src, file, sweep_keys)?)
}

/// The tuned keys with their candidate lists, each value checked, in the order written.
fn tuned_keys(
    src: &Source,
    file: &TuneFile,
    sweep_keys: &[String],
) -> Result<(Vec<String>, Vec<Vec<Value>>), RecipeError> {
    let (mut keys, mut values) = (Vec::new(), Vec::new());
    for (k, v) in &file.keys {
        let key = k.as_str().unwrap_or_default().to_string();
        let at = format!("tune.keys.{key}");
        let list = match v {
            Value::Sequence(list) if !list.is_empty() => list.clone(),
            Value::Sequence(_) => return Err(src.at(&at, format!("{at}: the candidate list is empty"))),
            _ => return Err(src.at(&at, format!("{at}: give a list of candidate values"))),
        };
        if sweep_keys.contains(&key) {
            return Err(src.at(&at, format!("{at}: {key} is also swept; tune it or sweep it, not both")));
        }
        if key == "train.steps" || key == "train.budget" {
            return Err(src.at(&at, format!("{at}: successive halving sets the steps of each rung itself")));
        }
        for (i, value) in list.iter().enumerate() {
            src.setting(&key, value, &format!("{at}.{i}"))?;
        }
        keys.push(key);
        values.push(list);
    }
    if keys.is_empty() {
        return Err(src.at("tune", "tune.keys: name at least one key with its candidate values".into()));
    }
    Ok((keys, values))
}

/// Refuses what cannot be tuned and expands the plan (see [`expand`]).
fn plan(
    src: &Source,
    file: &TuneFile,
    base: Vec<RunSpec>,
    final_seeds: &[u64],
    (keys, values): (Vec<String>, Vec<Vec<Value>>),
) -> Result<(Tuning, Vec<RunSpec>), RecipeError> {
    if file.seeds.is_empty() {
        return Err(src.at("tune.seeds", "tune.seeds: give at least one tuning seed".into()));
    }
    if let Some(seed) = file.seeds.iter().find(|s| final_seeds.contains(s)) {
        return Err(src
            .at("tune.seeds", format!("tune.seeds: {seed} is also a final seed; tuning and final seeds must differ")));
    }
    if base.iter().any(|r| r.config.train.budget.is_some()) {
        return Err(src.at(
            "tune",
            "tune: successive halving sets each rung's steps, so a tuned recipe trains by train.steps, not train.budget"
                .into(),
        ));
    }
    if file.eta < 2 {
        return Err(src.at("tune.eta", format!("tune.eta: must be at least 2, got {}", file.eta)));
    }
    for key in &keys {
        let reasons: Vec<String> = base.iter().filter_map(|r| super::reads::unread(&r.config, key)).collect();
        if !base.is_empty() && reasons.len() == base.len() {
            return Err(src.at(&format!("tune.keys.{key}"), format!("tune.keys.{key}: {}", reasons[0])));
        }
    }
    let candidates: Vec<Vec<(String, Value)>> = cartesian(&values)
        .into_iter()
        .map(|point| point.iter().enumerate().map(|(j, &i)| (keys[j].clone(), values[j][i].clone())).collect())
        .collect();
    let names: Vec<String> = candidates
        .iter()
        .map(|c| c.iter().map(|(k, v)| format!("{k}={}", value_text(v))).collect::<Vec<_>>().join(" "))
        .collect();
    let mut arms: Vec<String> = Vec::new();
    for run in &base {
        if !arms.contains(&run.label) {
            arms.push(run.label.clone());
        }
    }
    let tuning = Tuning {
        keys,
        candidates: names,
        seeds: file.seeds.clone(),
        eta: file.eta,
        curve: format!("val/{}", file.metric),
        rungs: rungs_for(candidates.len(), file.eta),
        arms,
    };
    let mut runs = Vec::new();
    for run in &base {
        let arm = tuning.arms.iter().position(|a| *a == run.label).expect("every run's label is an arm");
        let swept: Vec<String> = run.swept.iter().map(|(k, v)| format!("{k}={v}")).collect();
        let stem = swept.join(" ");
        let with_stem = |rest: String| if stem.is_empty() { rest } else { format!("{stem} {rest}") };
        for (c, candidate) in candidates.iter().enumerate() {
            let role = TuneRole { arm, candidate: c, rung: None };
            let name = &tuning.candidates[c];
            runs.push(variant_of(
                src,
                run,
                candidate,
                None,
                run.seed,
                format!("{stem} {name} seed={}", run.seed),
                role,
            )?);
        }
        // The tuning runs once per arm: after its first final seed.
        if run.seed != final_seeds[0] {
            continue;
        }
        for rung in 0..tuning.rungs {
            let steps = ((run.config.train.steps as f64 * tuning.fraction(rung)).round() as i64).max(1);
            for (c, candidate) in candidates.iter().enumerate() {
                for &seed in &tuning.seeds {
                    let role = TuneRole { arm, candidate: c, rung: Some(rung) };
                    let id = with_stem(format!("{} rung={rung} seed={seed}", tuning.candidates[c]));
                    runs.push(variant_of(src, run, candidate, Some(steps), seed, id, role)?);
                }
            }
        }
    }
    Ok((tuning, runs))
}

/// Every combination of one index per list, first list slowest.
fn cartesian(values: &[Vec<Value>]) -> Vec<Vec<usize>> {
    let mut out: Vec<Vec<usize>> = vec![Vec::new()];
    for list in values {
        out = out.into_iter().flat_map(|p| (0..list.len()).map(move |i| [p.clone(), vec![i]].concat())).collect();
    }
    out
}

/// `run` with `candidate`'s values, the seed `seed`, and for a tuning run `steps` steps (warm-up and
/// evaluation interval scaled to them): validated, its id `id` and its tuning role set.
fn variant_of(
    src: &Source,
    run: &RunSpec,
    candidate: &[(String, Value)],
    steps: Option<i64>,
    seed: u64,
    id: String,
    role: TuneRole,
) -> Result<RunSpec, RecipeError> {
    let mut value = to_value(&run.config);
    for (key, v) in candidate {
        set_path(&mut value, key, v.clone());
    }
    set_path(&mut value, "train.seed", Value::from(seed));
    // The schedule's floor keeps its ratio to a tuned peak learning rate (unless it is tuned itself).
    let tuned = |key: &str| candidate.iter().find(|(k, _)| k == key).map(|(_, v)| v);
    if let (Some(lr), None) = (tuned("train.lr").and_then(Value::as_f64), tuned("train.min_lr")) {
        let t = &run.config.train;
        if t.lr > 0.0 {
            set_path(&mut value, "train.min_lr", Value::from(t.min_lr * lr / t.lr));
        }
    }
    if let Some(steps) = steps {
        let t = &run.config.train;
        let fraction = steps as f64 / t.steps as f64;
        set_path(&mut value, "train.steps", Value::from(steps));
        if !candidate.iter().any(|(k, _)| k == "train.warmup_steps") {
            let warmup = ((t.warmup_steps as f64 * fraction).round() as i64).min(steps - 1).max(0);
            set_path(&mut value, "train.warmup_steps", Value::from(warmup));
        }
        set_path(&mut value, "train.eval_interval", Value::from(t.eval_interval.min(steps)));
        set_path(&mut value, "train.checkpoint", Value::from(false));
    }
    let at = format!("tune.keys.{}", candidate.first().map_or("", |(k, _)| k.as_str()));
    let mut config: Config = serde_yaml::from_value(value)
        .map_err(|e| src.at(&at, format!("{at}: {}", super::explain_serde_error(&e.to_string()))))?;
    config.validate().map_err(|inv| src.at(&at, format!("{at}: {}: {}", inv.key, inv.message)))?;
    config.resolve();
    // Tuning reads the validation split only: a tuning run never evaluates on test.
    config.train.skip_test = steps.is_some();
    let config_hash = config_hash(&config);
    Ok(RunSpec { id, label: run.label.clone(), swept: run.swept.clone(), seed, config, config_hash, tune: Some(role) })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rungs_halve_by_eta_down_to_one() {
        assert_eq!(rungs_for(1, 3), 0);
        assert_eq!(rungs_for(3, 3), 1);
        assert_eq!(rungs_for(4, 3), 2);
        assert_eq!(rungs_for(9, 3), 2);
        assert_eq!(rungs_for(8, 2), 3);
        let t = Tuning {
            keys: vec![],
            candidates: vec![String::new(); 9],
            seeds: vec![],
            eta: 3,
            curve: "val/loss".into(),
            rungs: 2,
            arms: vec![],
        };
        assert_eq!((t.survivors_at(0), t.survivors_at(1), t.survivors_at(2)), (9, 3, 1));
        // 9 candidates at 1/9 of the steps, then 3 at 1/3: two full runs' worth per tuning seed.
        assert!((t.fraction(0) * 9.0 + t.fraction(1) * 3.0 - 2.0).abs() < 1e-12);
    }

    #[test]
    fn the_candidate_grid_is_every_combination_first_key_slowest() {
        let v = |n: usize| (0..n).map(|i| Value::from(i as u64)).collect::<Vec<_>>();
        assert_eq!(cartesian(&[v(2), v(3)]).len(), 6);
        assert_eq!(cartesian(&[v(2), v(3)])[1], vec![0, 1]);
    }
}
