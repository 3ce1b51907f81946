//! The `compare:` section: which comparisons a recipe's results answer (every variant against a baseline,
//! or a ladder), the smallest effect that matters per metric (δ), predictions written before the run, and
//! the settling plan: the primary metric whose comparisons answer the recipe's question and `max_seeds`, the
//! most seeds an arm may end with when `--until-settled` adds a second stage (the two-stage design of
//! `crate::design`). `ablate summary`, the README blocks and `--until-settled` read it; a difference smaller
//! than δ is called equivalent, never a finding. Like the predictions, the plan is recorded in the results'
//! `recipe.resolved.yaml` when the pilot runs, and a plan changed after that is printed as such.
use serde::Deserialize;
use std::collections::BTreeMap;

use super::{RecipeError, Source};

/// The `compare:` section as written.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct CompareFile {
    /// The variant every other is paired against by seed: `heads=1` (a swept key, by its last part or its
    /// full name) or a variant's label.
    baseline: Option<String>,
    /// Pair each variant with the one listed before it instead (a ladder: each rung adds one thing).
    #[serde(default)]
    ladder: bool,
    /// The smallest difference that matters, per metric column: a number in the metric's unit
    /// (`test_loss: 0.02`), or a share of the reference's mean (`tokens_per_s: 5%`). Unlisted metrics take
    /// the default of their kind (docs/results.md: 0.01 for a loss in nats or bits, 0.005 for an accuracy,
    /// 0.5 BLEU, 5% for throughput and utilisation).
    #[serde(default)]
    delta: BTreeMap<String, serde_yaml::Value>,
    /// What the literature predicts, written before the run: per comparison (the variant's label) and
    /// metric, `better`, `worse` or `equivalent` (within this section's δ), with its source. The summary sets
    /// each against the verdict; the results record the predictions they ran against.
    #[serde(default)]
    predict: Vec<PredictionFile>,
    /// The metric column whose comparisons answer the recipe's question (one Holm family, quoted in the
    /// findings; the others are secondary). Default: the kind's first headline metric of model quality.
    primary: Option<String>,
    /// The settling plan's cap: the most seeds an arm may end with when `--until-settled` adds a second stage
    /// (at least the recipe's seeds + 2, since a second stage is tested on two or more). Absent, or equal to
    /// the number of seeds: the recipe's seeds are the whole design (a fixed design, nothing added).
    max_seeds: Option<usize>,
    /// For results whose runs predate recorded plans (before 2026-12-06): when this plan was written, as the
    /// recipe's git history shows, `pilot` (after the pilot's results) or `second_stage` (after the second
    /// stage's too). The verdict block says so instead of its generic "set after the pilot"; where the results
    /// record the plan their pilot started under, that record decides and this key is refused at the summary.
    plan_written_after: Option<PlanWrittenAfter>,
    /// A swept numeric key (`train.lr`) over which to report each arm's sensitivity of the primary metric
    /// (Wortsman et al. 2023's learning-rate sensitivity, with its interval) and each arm's difference from
    /// the baseline's arm: a description of the curves beside the verdicts, not a verdict.
    sensitivity: Option<String>,
    /// What each arm is worth in compute (docs/results.md, "Compute-equivalent gains"): `ladder`, the swept
    /// key whose values are the compute rungs (`train.budget.flops`: at least four, each at least twice the
    /// one before); `targets`, values of the primary metric at which each arm's gain over the baseline is
    /// stated (inside the measured range, or printed as a forecast; absent: the baseline's mean at each inner
    /// rung, a rule fixed before the data); `exponent_delta`, the change of the frontier's exponent α that
    /// matters (default 0.05); `predict`, the gain the literature reports, written before the run
    /// (`{gain: 1.17, source: '…'}`), set against the measured one in docs/reproductions.md; `sizes`, a swept
    /// key of model sizes (`transformer.d_model`) over which each arm takes, at each rung, the size with the
    /// lowest validation value (mean over seeds), so that every arm is compared on its own frontier.
    compute: Option<ComputeFile>,
}

/// `compare.compute` as written.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ComputeFile {
    ladder: String,
    #[serde(default)]
    targets: Vec<f64>,
    exponent_delta: Option<f64>,
    predict: Option<GainPrediction>,
    sizes: Option<String>,
}

/// A published compute-equivalent gain, written before the run: every arm's gain over the baseline.
#[derive(Debug, Clone, PartialEq, Deserialize, serde::Serialize)]
#[serde(deny_unknown_fields)]
pub struct GainPrediction {
    pub gain: f64,
    pub source: String,
}

/// What each arm is worth in compute: the swept key of the compute ladder, the target values of the primary
/// metric (empty: the baseline's mean at each inner rung), and the exponent difference that matters.
#[derive(Debug, Clone, PartialEq)]
pub struct Compute {
    pub ladder: String,
    pub targets: Vec<f64>,
    pub exponent_delta: f64,
    pub predict: Option<GainPrediction>,
    /// The swept key of model sizes each arm's frontier chooses from at every rung (`None`: one size).
    pub sizes: Option<String>,
}

/// One prediction as written.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct PredictionFile {
    comparison: String,
    /// An interaction: the prediction is about `comparison`'s effect minus this comparison's (each a variant
    /// against what the recipe pairs it with), the same seed of all four arms making one contrast.
    versus: Option<String>,
    metric: String,
    expect: Expect,
    source: String,
    /// What the prediction is for: `control` (a large published effect that checks the implementation and
    /// the regime) or `test` (a genuine question). Required, so that every prediction's author says which.
    role: Role,
}

/// Why a prediction is made: a positive control checks that the mechanism and the regime can show a large
/// published effect (a failure points at the implementation first); a test asks a genuine question.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Role {
    Control,
    Test,
}

impl Role {
    pub fn word(self) -> &'static str {
        match self {
            Role::Control => "control",
            Role::Test => "test",
        }
    }
}

/// The direction a prediction expects, for the variant against what it is paired with.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Expect {
    Better,
    Worse,
    /// Better by more than δ: the 95% interval beyond the margin (for a large published effect).
    BetterBeyondDelta,
    /// Worse by more than δ.
    WorseBeyondDelta,
    /// No difference larger than δ either way (the paper reports none).
    Equivalent,
}

/// A prediction: `expect` for `comparison` (a variant's label) on `metric` (a column), from `source`; with
/// `versus`, for the interaction: `comparison`'s effect minus `versus`'s.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, Deserialize)]
pub struct Prediction {
    pub comparison: String,
    /// An interaction's other comparison: the prediction is about `comparison`'s effect minus this one's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub versus: Option<String>,
    pub metric: String,
    pub expect: Expect,
    pub source: String,
    /// Always set in a recipe; `None` only in results recorded before predictions had roles.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub role: Option<Role>,
}

impl Prediction {
    /// The same claim (comparison, metric, expectation and source), whatever role either gives it: a role
    /// says what a prediction is for, not what it predicts.
    pub fn same_claim(&self, other: &Prediction) -> bool {
        (&self.comparison, &self.versus, &self.metric, self.expect, &self.source)
            == (&other.comparison, &other.versus, &other.metric, other.expect, &other.source)
    }
}

/// The smallest effect that matters for one metric.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Delta {
    /// In the metric's unit.
    Absolute(f64),
    /// A fraction of the reference variant's mean (0.05 for 5%).
    Relative(f64),
}

impl Delta {
    /// The margin in the metric's unit, given the reference's mean.
    pub fn resolve(self, reference_mean: f64) -> f64 {
        match self {
            Delta::Absolute(d) => d,
            Delta::Relative(f) => f * reference_mean.abs(),
        }
    }

    /// As written: `0.01` or `5%`.
    pub fn text(self) -> String {
        match self {
            Delta::Absolute(d) => format!("{d}"),
            Delta::Relative(f) => format!("{}%", f * 100.0),
        }
    }
}

/// What the variants are compared with.
#[derive(Debug, Clone, PartialEq)]
pub enum Comparison {
    Baseline(String),
    Ladder,
}

/// A recipe's comparisons and margins.
#[derive(Debug, Clone, PartialEq)]
pub struct Compare {
    pub comparison: Comparison,
    /// Metric column -> δ as declared (the metric's default where absent).
    pub delta: BTreeMap<String, Delta>,
    /// Predictions written before the run, in the recipe's order.
    pub predict: Vec<Prediction>,
    /// The primary metric's column as declared (`None`: the kind's default, resolved where metrics are known).
    pub primary: Option<String>,
    /// The settling plan's cap on seeds per arm (`None`: a fixed design).
    pub max_seeds: Option<usize>,
    /// When the plan was written, for results that predate recorded plans.
    pub plan_written_after: Option<PlanWrittenAfter>,
    /// The swept key over which each arm's sensitivity is reported (`judge::sensitivity`).
    pub sensitivity: Option<String>,
    /// Compute-equivalent gains over a compute ladder (`judge::compute`).
    pub compute: Option<Compute>,
}

/// When a plan was written relative to results that did not record it (`compare.plan_written_after`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PlanWrittenAfter {
    /// After the pilot's results, before any second stage.
    Pilot,
    /// After the second stage's results too.
    SecondStage,
}

/// What a results directory records of its plan when its pilot runs, and what a verdict block compares
/// with the recipe's: the cap, the primary metric and the declared margins, as written.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, Deserialize)]
pub struct Plan {
    /// The most seeds an arm may end with (the recipe's seeds in a fixed design).
    pub max_seeds: usize,
    /// The primary metric as declared (`default` for the kind's).
    pub primary: String,
    /// Each declared δ as written (`0.01`, `5%`); unlisted metrics take their defaults.
    pub delta: BTreeMap<String, String>,
}

impl Compare {
    /// The plan of a recipe with `seeds` seeds.
    pub fn plan(&self, seeds: usize) -> Plan {
        Plan {
            max_seeds: self.max_seeds.unwrap_or(seeds),
            primary: self.primary.clone().unwrap_or_else(|| "default".into()),
            delta: self.delta.iter().map(|(k, d)| (k.clone(), d.text())).collect(),
        }
    }

    /// Whether the plan adds a second stage to a pilot of `seeds` seeds.
    pub fn two_stage(&self, seeds: usize) -> bool {
        // A cap too close to `seeds` for a second stage (a fixed design of 3 that a smoke run keeps 2 seeds
        // of) is no second stage.
        self.max_seeds.is_some_and(|m| crate::design::is_second_stage(seeds, m))
    }
}

impl Plan {
    /// One line: `at most 6 seeds per arm, primary test_loss, δ test_loss 0.02`.
    pub fn describe(&self) -> String {
        let delta = if self.delta.is_empty() {
            "every δ its metric's default".to_string()
        } else {
            format!("δ {}", self.delta.iter().map(|(k, v)| format!("{k} {v}")).collect::<Vec<_>>().join(", "))
        };
        format!("at most {} per arm, primary metric {}, {delta}", seeds(self.max_seeds), self.primary)
    }
}

/// `1 seed`, `3 seeds`.
pub fn seeds(n: usize) -> String {
    if n == 1 {
        "1 seed".into()
    } else {
        format!("{n} seeds")
    }
}

/// `5%` as 0.05, `0.02` as itself; `None` when it is neither.
fn parse_delta(v: &serde_yaml::Value) -> Option<Delta> {
    match v {
        serde_yaml::Value::Number(n) => n.as_f64().map(Delta::Absolute),
        serde_yaml::Value::String(s) => {
            s.trim().strip_suffix('%')?.trim().parse::<f64>().ok().map(|p| Delta::Relative(p / 100.0))
        }
        _ => None,
    }
}

/// Checks the section: a baseline or a ladder (not both), and every δ a positive finite number or share.
/// Whether each δ names a metric of the recipe's kinds is checked where the metrics are known, before
/// anything trains (`run::summary::check_compare`).
pub(super) fn expand(src: &Source, file: &CompareFile, seeds: usize) -> Result<Compare, RecipeError> {
    let comparison = match (&file.baseline, file.ladder) {
        (Some(_), true) => {
            return Err(src.at("compare.ladder", "compare: give a baseline or ladder: true, not both".into()))
        }
        (Some(b), false) => Comparison::Baseline(b.clone()),
        (None, true) => Comparison::Ladder,
        (None, false) => {
            return Err(src.at(
                "compare",
                "compare: name the comparison: `baseline: <variant>` (e.g. heads=1) or `ladder: true`".into(),
            ))
        }
    };
    let mut delta = BTreeMap::new();
    for (metric, value) in &file.delta {
        let at = format!("compare.delta.{metric}");
        let d = parse_delta(value).ok_or_else(|| {
            src.at(&at, format!("{at}: give a number in the metric's unit (0.01) or a share of the reference (5%)"))
        })?;
        let (Delta::Absolute(x) | Delta::Relative(x)) = d;
        if !(x.is_finite() && x > 0.0) {
            return Err(
                src.at(&at, format!("{at}: the smallest effect that matters must be above 0, got {}", d.text()))
            );
        }
        delta.insert(metric.clone(), d);
    }
    let mut predict: Vec<Prediction> = Vec::new();
    for (i, p) in file.predict.iter().enumerate() {
        let at = format!("compare.predict.{i}");
        if p.source.trim().is_empty() {
            return Err(
                src.at(&at, format!("{at}: say where the prediction comes from (`source: Liu et al. 2021, Table 4`)"))
            );
        }
        if predict.iter().any(|q| q.comparison == p.comparison && q.versus == p.versus && q.metric == p.metric) {
            return Err(src.at(&at, format!("{at}: {} on {} is predicted twice", p.comparison, p.metric)));
        }
        if p.versus.as_ref() == Some(&p.comparison) {
            return Err(src.at(&at, format!("{at}: versus: an interaction sets a comparison against another one")));
        }
        predict.push(Prediction {
            comparison: p.comparison.clone(),
            versus: p.versus.clone(),
            metric: p.metric.clone(),
            expect: p.expect,
            source: p.source.trim().to_string(),
            role: Some(p.role),
        });
    }
    if let Some(cap) = file.max_seeds {
        let at = "compare.max_seeds";
        let floor = seeds + crate::design::SECOND_STAGE_MIN;
        if cap != seeds && !crate::design::is_second_stage(seeds, cap) {
            return Err(src.at(
                at,
                format!(
                    "{at}: {cap} seeds per arm is not a plan for {seeds} seeds: give {seeds} (a fixed design) or \
                     {floor} to {} (a second stage is tested on at least {} added seeds)",
                    crate::design::MOST_PLANNED_SEEDS,
                    crate::design::SECOND_STAGE_MIN
                ),
            ));
        }
    }
    if let Some(p) = &file.primary {
        if p.trim().is_empty() {
            return Err(src.at("compare.primary", "compare.primary: name a metric column (test_loss)".into()));
        }
    }
    let compute = match &file.compute {
        None => None,
        Some(c) => {
            let at = "compare.compute";
            if c.targets.iter().any(|t| !t.is_finite()) {
                return Err(src.at(at, format!("{at}.targets: give finite values of the primary metric")));
            }
            let exponent_delta = c.exponent_delta.unwrap_or(0.05);
            if !(exponent_delta > 0.0 && exponent_delta.is_finite()) {
                return Err(src.at(at, format!("{at}.exponent_delta: must be positive, got {exponent_delta}")));
            }
            if let Some(p) = c.predict.as_ref().filter(|p| !(p.gain > 0.0 && p.gain.is_finite())) {
                return Err(src.at(at, format!("{at}.predict.gain: a gain is a positive factor, got {}", p.gain)));
            }
            Some(Compute {
                ladder: c.ladder.clone(),
                targets: c.targets.clone(),
                exponent_delta,
                predict: c.predict.clone(),
                sizes: c.sizes.clone(),
            })
        }
    };
    Ok(Compare {
        comparison,
        delta,
        predict,
        primary: file.primary.clone(),
        max_seeds: file.max_seeds,
        plan_written_after: file.plan_written_after,
        sensitivity: file.sensitivity.clone(),
        compute,
    })
}

/// The default δ of a metric by its kind: its column and unit.
pub fn default_delta(column: &str, unit: &str) -> Delta {
    let is = |suffixes: &[&str]| suffixes.iter().any(|s| column.ends_with(s));
    if unit.starts_with("nats") || unit.starts_with("bits") || column.contains("loss") || column.contains("bits") {
        Delta::Absolute(0.01)
    } else if column.contains("bleu") {
        Delta::Absolute(0.5)
    } else if is(&["accuracy", "f1", "exact_match"]) {
        Delta::Absolute(0.005)
    } else {
        // Throughput, utilisation, FLOP/s, memory: 5% of the reference.
        Delta::Relative(0.05)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_by_kind_of_metric() {
        assert_eq!(default_delta("test_loss", "nats/token"), Delta::Absolute(0.01));
        assert_eq!(default_delta("test_bits_per_dim", "bits/pixel"), Delta::Absolute(0.01));
        assert_eq!(default_delta("test_accuracy", ""), Delta::Absolute(0.005));
        assert_eq!(default_delta("test_f1", ""), Delta::Absolute(0.005));
        assert_eq!(default_delta("test_bleu", ""), Delta::Absolute(0.5));
        assert_eq!(default_delta("tokens_per_s", "tokens/s"), Delta::Relative(0.05));
        assert_eq!(Delta::Relative(0.05).resolve(-2000.0), 100.0);
        assert_eq!(Delta::Relative(0.05).text(), "5%");
    }

    #[test]
    fn a_delta_is_a_number_or_a_percentage() {
        let v = |s: &str| serde_yaml::from_str::<serde_yaml::Value>(s).unwrap();
        assert_eq!(parse_delta(&v("0.02")), Some(Delta::Absolute(0.02)));
        assert_eq!(parse_delta(&v("5%")), Some(Delta::Relative(0.05)));
        assert_eq!(parse_delta(&v("five")), None);
        assert_eq!(parse_delta(&v("[1]")), None);
    }
}
