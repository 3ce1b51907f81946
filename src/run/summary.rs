//! `ablate summary`: markdown tables of a results directory. One row per variant with the headline metrics
//! of the recipe's kinds (n, mean ± sample standard deviation, Student-t 95% confidence interval of the
//! mean); with a baseline, a paired comparison of every other variant against it over shared seeds.
use anyhow::{bail, Context, Result};
use std::collections::BTreeMap;
use std::path::Path;

use super::results::{read_runs, variants_of};
use crate::metrics::Metric;
use crate::recipe::Recipe;
use crate::stats::{
    format_p, holm, minimum_detectable_effect, paired, seeds_needed, Estimate, Paired, ALPHA, CONFIDENCE, POWER,
};
use crate::tasks::recipe_metrics;

type Row = BTreeMap<String, String>;

/// `mean ± std [lo, hi]` with the metric's digits; a single value alone.
pub fn format_estimate(e: &Estimate, digits: usize) -> String {
    match e.half_width {
        None => format!("{:.digits$}", e.mean),
        Some(h) => {
            format!("{:.digits$} ± {:.digits$} [{:.digits$}, {:.digits$}]", e.mean, e.std, e.mean - h, e.mean + h)
        }
    }
}

/// The headline metrics of the recipe that `runs` has columns for.
fn headline_metrics(recipe: &Recipe, runs: &[Row]) -> Vec<Metric> {
    recipe_metrics(recipe)
        .into_iter()
        .filter(|m| m.headline && m.column_name().is_some_and(|c| runs.first().is_some_and(|r| r.contains_key(c))))
        .collect()
}

/// `(seed, value)` of `column` for each run of `ids` that recorded a number.
fn seed_values(runs: &[Row], ids: &[String], column: &str) -> Vec<(u64, f64)> {
    runs.iter()
        .filter(|r| ids.contains(&r["run_id"]))
        .filter_map(|r| Some((r.get("seed")?.parse().ok()?, r.get(column)?.parse::<f64>().ok()?)))
        .filter(|(_, v): &(u64, f64)| v.is_finite())
        .collect()
}

/// One table of a summary: a sentence saying how to read it, the column names, the cells.
pub struct Table {
    pub note: String,
    pub header: Vec<String>,
    pub rows: Vec<Vec<String>>,
}

impl Table {
    pub fn markdown(&self) -> String {
        let mut out =
            format!("{}\n\n| {} |\n|{}\n", self.note, self.header.join(" | "), "---|".repeat(self.header.len()));
        for row in &self.rows {
            out.push_str(&format!("| {} |\n", row.join(" | ")));
        }
        out
    }
}

/// What the paired table compares, seed by seed: every variant with one baseline (`heads=1`,
/// `transformer.heads=1` or a variant's label), or each variant with the one listed before it (a ladder,
/// each rung adding one thing to the rung below).
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Pairing<'a> {
    Baseline(&'a str),
    Ladder,
}

/// A [`Pairing`] resolved to the variants of a runs.csv.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Reference {
    Baseline(usize),
    Ladder,
}

impl Reference {
    /// The comparisons (variant, the variant it is paired against), in variant order: one family for Holm.
    fn pairs(self, variants: usize) -> Vec<(usize, usize)> {
        match self {
            Reference::Baseline(base) => (0..variants).filter(|&i| i != base).map(|i| (i, base)).collect(),
            Reference::Ladder => (1..variants).map(|i| (i, i - 1)).collect(),
        }
    }
}

/// The summary of `dir` as markdown: the per-variant table, then, with a `pairing`, the paired comparisons.
pub fn summary_table(dir: &Path, recipe: &Recipe, pairing: Option<Pairing>) -> Result<String> {
    let tables = summary_tables(dir, recipe, pairing)?;
    Ok(tables.iter().map(Table::markdown).collect::<Vec<_>>().join("\n"))
}

/// [`summary_table`]'s tables.
pub fn summary_tables(dir: &Path, recipe: &Recipe, pairing: Option<Pairing>) -> Result<Vec<Table>> {
    let path = dir.join("runs.csv");
    let runs = read_runs(&path).with_context(|| format!("no results to summarise in {}", dir.display()))?;
    let metrics = headline_metrics(recipe, &runs);
    let variants = variants_of(&runs);
    // Resolve the baseline before anything else, so a bad one is one line and no table.
    let reference = match pairing {
        Some(Pairing::Baseline(b)) => Some(Reference::Baseline(find_baseline(&runs, &variants, b)?)),
        Some(Pairing::Ladder) if variants.len() < 2 => bail!("--ladder needs at least two variants"),
        Some(Pairing::Ladder) => Some(Reference::Ladder),
        None => None,
    };
    let baseline = match reference {
        Some(Reference::Baseline(base)) => Some(base),
        _ => None,
    };
    let confidence = 100.0 * CONFIDENCE;
    let note = format!(
        "Per variant: n runs (seeds), then each metric as mean ± sample std [{confidence:.0}% confidence interval \
         of the mean, Student t with n − 1 degrees of freedom]."
    );
    let mut header = vec!["variant".to_string(), "n".to_string()];
    if recipe.tuning.is_some() {
        header.push("chosen on validation".to_string());
    }
    header.extend(metrics.iter().map(|m| m.axis()));
    let mut rows = Vec::new();
    for (label, ids) in &variants {
        let n = runs.iter().filter(|r| ids.contains(&r["run_id"])).count();
        let mut cells = vec![label.clone(), n.to_string()];
        if let Some(tuning) = &recipe.tuning {
            cells.push(super::results::chosen_values(&runs, ids, &tuning.keys));
        }
        for m in &metrics {
            let column = m.column_name().expect("filtered to columns");
            let values: Vec<f64> = seed_values(&runs, ids, column).into_iter().map(|(_, v)| v).collect();
            cells.push(if values.is_empty() {
                "–".to_string()
            } else {
                format_estimate(&Estimate::of(&values), m.digits)
            });
        }
        rows.push(cells);
    }
    let mut tables = vec![Table { note, header, rows }];
    if let Some(tuning) = &recipe.tuning {
        tables.push(tuning_cost(&path, tuning)?);
    }
    if let Some(reference) = reference {
        tables.push(paired_table(&runs, &variants, reference, &metrics));
    }
    if let Some((check, settings)) = &recipe.scale_check {
        let check_dir = dir.join("scale_check");
        if check_dir.join("runs.csv").is_file() {
            let mut at_check = summary_tables(&check_dir, check, None)?;
            if let Some(first) = at_check.first_mut() {
                first.note = format!("At the second scale ({}): {}", settings.join(" "), first.note);
            }
            tables.extend(at_check);
            if let Some(base) = baseline {
                let check_runs = read_runs(&check_dir.join("runs.csv"))?;
                let scales = [
                    (&runs, base),
                    (&check_runs, find_baseline(&check_runs, &variants_of(&check_runs), &variants[base].0)?),
                ];
                tables.push(effects_at_both_scales(scales, &metrics, &settings.join(" ")));
            }
        }
    }
    Ok(tables)
}

/// Per variant and headline metric, the paired effect against the baseline at the recipe's scale and at
/// its second scale (each Holm-adjusted over its own scale's family), and whether it holds: the same sign
/// at both and significant (adjusted p < `ALPHA`) at both.
fn effects_at_both_scales(scales: [(&Vec<Row>, usize); 2], metrics: &[Metric], settings: &str) -> Table {
    let confidence = 100.0 * CONFIDENCE;
    let note = format!(
        "Effects at both scales, paired against `{}` by seed: mean difference [{confidence:.0}% CI] and the \
         Holm-adjusted p over that scale's comparisons of the metric; \"holds\" where the sign is the same and \
         the adjusted p is below {ALPHA} at both. Second scale: {settings}.",
        variants_of(scales[0].0)[scales[0].1].0
    );
    let header = ["variant", "metric", "this scale", "second scale", "verdict"].iter().map(|s| s.to_string()).collect();
    // (variant label, metric) -> (difference, adjusted p) at each scale.
    let effects: Vec<BTreeMap<(String, String), (Estimate, f64)>> = scales
        .iter()
        .map(|(runs, base)| {
            let variants = variants_of(runs);
            let mut out = BTreeMap::new();
            for m in metrics {
                let column = m.column_name().expect("filtered to columns");
                let family = against_baseline(runs, &variants, *base, column);
                let adjusted = holm_adjusted(&family);
                let labels = variants.iter().enumerate().filter(|(i, _)| i != base).map(|(_, (l, _))| l);
                for ((label, (_, p)), adj) in labels.zip(family).zip(adjusted) {
                    if let Some(p) = p {
                        out.insert((label.clone(), column.to_string()), (p.difference, adj));
                    }
                }
            }
            out
        })
        .collect();
    let cell = |e: &Estimate, p: f64, m: &Metric| format!("{} (p {})", format_difference(e, m.digits), format_p(p));
    let mut rows = Vec::new();
    // In the recipe's variant order, each variant's metrics in the summary's order.
    let labels: Vec<String> = variants_of(scales[0].0).into_iter().map(|(l, _)| l).collect();
    for label in &labels {
        for m in metrics {
            let column = m.column_name().expect("filtered to columns").to_string();
            let Some((here, p_here)) = effects[0].get(&(label.clone(), column.clone())) else { continue };
            let Some((there, p_there)) = effects[1].get(&(label.clone(), column.clone())) else { continue };
            let verdict = scale_verdict((here.mean, *p_here), (there.mean, *p_there));
            rows.push(vec![label.clone(), m.axis(), cell(here, *p_here, m), cell(there, *p_there, m), verdict.into()]);
        }
    }
    Table { note, header, rows }
}

/// Whether an effect (mean difference, adjusted p) at one scale holds at another: the same sign, and
/// significant at both.
pub fn scale_verdict(here: (f64, f64), there: (f64, f64)) -> &'static str {
    let same_sign = (here.0 > 0.0) == (there.0 > 0.0);
    let (significant_here, significant_there) = (here.1 < ALPHA, there.1 < ALPHA);
    match (same_sign, significant_here, significant_there) {
        (true, true, true) => "holds",
        (true, true, false) => "same sign; significant here only",
        (true, false, true) => "same sign; significant at the second scale only",
        (true, false, false) => "same sign; significant at neither",
        (false, true, true) => "reverses (significant at both)",
        (false, _, _) => "sign differs",
    }
}

/// A paired difference with its interval: `+0.0123 [+0.0050, +0.0196]`.
fn format_difference(e: &Estimate, digits: usize) -> String {
    match e.half_width {
        Some(h) => format!("{:+.digits$} [{:+.digits$}, {:+.digits$}]", e.mean, e.mean - h, e.mean + h),
        None => format!("{:+.digits$}", e.mean),
    }
}

/// What tuning cost, from every row of `runs.csv`: optimisation steps and wall time of the tuning runs
/// against the final runs.
fn tuning_cost(runs_csv: &Path, tuning: &crate::recipe::Tuning) -> Result<Table> {
    let all = super::results::read_all_runs(runs_csv)?;
    let total = |phase: &str, column: &str| -> f64 {
        all.iter()
            .filter(|r| r.get("phase").is_some_and(|p| p == phase))
            .filter_map(|r| r.get(column).and_then(|v| v.parse::<f64>().ok()))
            .sum()
    };
    let count = |phase: &str| all.iter().filter(|r| r.get("phase").is_some_and(|p| p == phase)).count();
    let note = format!(
        "Tuning: each arm chose among {} candidate(s) of {} by successive halving (eta {}, {} rung(s), tuning \
         seeds {:?}, disjoint from the final seeds), scored on the validation split's `{}` at the end of each \
         rung run. The tables above use the final runs only.",
        tuning.candidates.len(),
        tuning.keys.join(", "),
        tuning.eta,
        tuning.rungs,
        tuning.seeds,
        tuning.curve
    );
    let header = ["phase", "runs", "optimisation steps", "wall time (s)"].iter().map(|s| s.to_string()).collect();
    let rows = ["tune", "final"]
        .iter()
        .map(|phase| {
            vec![
                phase.to_string(),
                count(phase).to_string(),
                format!("{:.0}", total(phase, "steps")),
                format!("{:.0}", total(phase, "wall_s")),
            ]
        })
        .collect();
    Ok(Table { note, header, rows })
}

/// Paired differences (variant − its reference) over the seeds both ran, per headline metric, with each
/// p-value raw and Holm-adjusted over its family: the comparisons of one metric (one per compared variant).
/// A difference is called better or worse only where the adjusted p is below `ALPHA`.
fn paired_table(runs: &[Row], variants: &[(String, Vec<String>)], reference: Reference, metrics: &[Metric]) -> Table {
    let confidence = 100.0 * CONFIDENCE;
    let pairs = reference.pairs(variants.len());
    let others = pairs.len();
    let (what, family) = match reference {
        Reference::Baseline(base) => (
            format!("Paired against `{}`: per seed the difference variant − baseline", variants[base].0),
            "with the baseline",
        ),
        Reference::Ladder => (
            "As a ladder: each variant paired with the one listed before it, per seed the difference variant − \
             previous"
                .to_string(),
            "along the ladder",
        ),
    };
    let note = format!(
        "{what}; mean difference [{confidence:.0}% CI]; two-sided paired t-test p-value, raw and \
         Holm–Bonferroni-adjusted over the family of the {others} comparison(s) of that metric {family}; marked \
         better or worse where the adjusted p is below {ALPHA}. Fewer than two shared seeds: no test."
    );
    let header = [
        "variant",
        "metric",
        "pairs",
        &format!("mean difference [{confidence:.0}% CI]"),
        "p",
        "p (Holm)",
        "per-seed differences",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    // Every comparison first, so that each metric's family is adjusted together.
    let compared: Vec<Vec<(usize, Option<Paired>)>> = metrics
        .iter()
        .map(|m| compare(runs, variants, &pairs, m.column_name().expect("filtered to columns")))
        .collect();
    let adjusted: Vec<Vec<f64>> = compared.iter().map(|family| holm_adjusted(family)).collect();
    let mut rows = Vec::new();
    for (k, &(v, against)) in pairs.iter().enumerate() {
        let label = match reference {
            Reference::Baseline(_) => variants[v].0.clone(),
            Reference::Ladder => format!("{} vs {}", variants[v].0, variants[against].0),
        };
        for (j, m) in metrics.iter().enumerate() {
            let (shared, comparison) = &compared[j][k];
            rows.push(match comparison {
                Some(p) => paired_row(&label, m, p, adjusted[j][k]),
                None => {
                    vec![label.clone(), m.axis(), shared.to_string(), "–".into(), "–".into(), "–".into(), "–".into()]
                }
            });
        }
    }
    Table { note, header, rows }
}

/// Holm-adjusted p-values of a family of comparisons ([`against_baseline`]'s), NaN where one had no test.
fn holm_adjusted(family: &[(usize, Option<Paired>)]) -> Vec<f64> {
    holm(&family.iter().map(|(_, p)| p.as_ref().map_or(f64::NAN, |p| p.p)).collect::<Vec<_>>())
}

/// Each other variant's comparison with variant `base` in `column`, in variant order (see [`compare`]).
fn against_baseline(
    runs: &[Row],
    variants: &[(String, Vec<String>)],
    base: usize,
    column: &str,
) -> Vec<(usize, Option<Paired>)> {
    compare(runs, variants, &Reference::Baseline(base).pairs(variants.len()), column)
}

/// For each (variant, reference) of `pairs`, in `column`: the seeds they share, and the paired test of
/// variant − reference over them (`None` below two shared seeds).
fn compare(
    runs: &[Row],
    variants: &[(String, Vec<String>)],
    pairs: &[(usize, usize)],
    column: &str,
) -> Vec<(usize, Option<Paired>)> {
    pairs
        .iter()
        .map(|&(v, against)| {
            let r = seed_values(runs, &variants[against].1, column);
            let v = seed_values(runs, &variants[v].1, column);
            let shared = v.iter().filter(|(s, _)| r.iter().any(|(rs, _)| rs == s)).count();
            (shared, paired(&r, &v))
        })
        .collect()
}

/// One row of the paired table: the mean difference with its interval, marked by direction where the
/// Holm-adjusted p-value is below `ALPHA`, both p-values, and the per-seed differences.
fn paired_row(label: &str, m: &Metric, p: &Paired, adjusted: f64) -> Vec<String> {
    let digits = m.digits;
    let better = if adjusted.is_nan() || adjusted >= ALPHA {
        ""
    } else if (p.difference.mean > 0.0) == m.higher_is_better {
        " (better)"
    } else {
        " (worse)"
    };
    let diffs: Vec<String> =
        p.seeds.iter().zip(&p.differences).map(|(s, d)| format!("seed {s}: {d:+.digits$}")).collect();
    vec![
        label.to_string(),
        m.axis(),
        p.seeds.len().to_string(),
        format!("{}{better}", format_difference(&p.difference, digits)),
        format_p(p.p),
        format_p(adjusted),
        diffs.join(", "),
    ]
}

/// An effect a researcher wants to be able to detect: a difference of `size` in the metric whose column is
/// `column` (`test_loss=0.01`).
#[derive(Debug, Clone, PartialEq)]
pub struct Effect {
    pub column: String,
    pub size: f64,
}

impl std::str::FromStr for Effect {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        let (column, size) =
            s.split_once('=').ok_or_else(|| format!("`{s}`: give METRIC=SIZE, e.g. test_loss=0.01"))?;
        let size: f64 = size.trim().parse().map_err(|_| format!("`{s}`: the size `{size}` is not a number"))?;
        if size == 0.0 || !size.is_finite() {
            return Err(format!("`{s}`: the size must be a non-zero number"));
        }
        Ok(Effect { column: column.trim().to_string(), size: size.abs() })
    }
}

/// Power and the noise floor of a recipe, from the results in `dir` (a pilot, or the committed reference):
/// per headline metric, the seed-to-seed standard deviation of the paired differences against the baseline
/// (pooled over the other variants: the root of their mean variance, with its range), the smallest
/// difference the recipe's number of seeds detects (two-sided paired t-test at `ALPHA`, power `POWER`), and
/// for each of `effects` the seeds needed to detect it.
pub fn plan_table(dir: &Path, recipe: &Recipe, baseline: Option<&str>, effects: &[Effect]) -> Result<Table> {
    let path = dir.join("runs.csv");
    let runs = read_runs(&path).with_context(|| format!("no results to plan from in {}", dir.display()))?;
    let metrics = headline_metrics(recipe, &runs);
    let variants = variants_of(&runs);
    let base = match baseline {
        Some(b) => find_baseline(&runs, &variants, b)?,
        None => 0,
    };
    for e in effects {
        if !metrics.iter().any(|m| m.column_name() == Some(e.column.as_str())) {
            let names: Vec<&str> = metrics.iter().filter_map(|m| m.column_name()).collect();
            bail!(
                "--effect {}={}: no headline metric `{}`; the recipe's are {}",
                e.column,
                e.size,
                e.column,
                names.join(", ")
            );
        }
    }
    let seeds = recipe.seeds.len();
    let base_label = &variants[base].0;
    let note = format!(
        "Noise floor against `{base_label}` from {}: per metric, the standard deviation of the per-seed \
         differences variant − baseline, pooled over the {} other variant(s) (root of the mean variance; range \
         in brackets); the smallest mean difference {seeds} seed(s) detect with a two-sided paired t-test at \
         α = {ALPHA} with power {POWER}; and the seeds needed for each --effect.",
        dir.display(),
        variants.len() - 1
    );
    let header = [
        "metric",
        "comparisons",
        "SD of paired differences",
        "seeds",
        "detectable difference",
        "effect",
        "seeds needed",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    let mut rows = Vec::new();
    for m in &metrics {
        let column = m.column_name().expect("filtered to columns");
        let sds: Vec<f64> = against_baseline(&runs, &variants, base, column)
            .into_iter()
            .filter_map(|(_, p)| Some(p?.difference.std))
            .collect();
        let digits = m.digits + 1;
        if sds.is_empty() {
            rows.push(vec![m.axis(), "0".into(), "–".into(), seeds.to_string(), "–".into(), "–".into(), "–".into()]);
            continue;
        }
        let pooled = (sds.iter().map(|s| s * s).sum::<f64>() / sds.len() as f64).sqrt();
        let (lo, hi) = sds.iter().fold((f64::MAX, f64::MIN), |(lo, hi), &s| (lo.min(s), hi.max(s)));
        let detectable = if seeds >= 2 {
            format!("{:.digits$}", minimum_detectable_effect(seeds) * pooled)
        } else {
            "– (one seed: no test)".into()
        };
        let asked: Vec<&Effect> = effects.iter().filter(|e| e.column == column).collect();
        let needed = |e: &Effect| match seeds_needed(e.size / pooled) {
            Some(n) => n.to_string(),
            None => "more than 10,000".into(),
        };
        rows.push(vec![
            m.axis(),
            sds.len().to_string(),
            format!("{pooled:.digits$} [{lo:.digits$}, {hi:.digits$}]"),
            seeds.to_string(),
            detectable,
            asked.iter().map(|e| format!("{}", e.size)).collect::<Vec<_>>().join(", "),
            asked.iter().map(|e| needed(e)).collect::<Vec<_>>().join(", "),
        ]);
    }
    Ok(Table { note, header, rows })
}

/// The index of the variant named by `spec`: a variant label, or `key=value` where `key` is a column of
/// `runs.csv` or its last part(s) (`heads=1` for `transformer.heads`), matching the runs of exactly one
/// variant.
fn find_baseline(runs: &[Row], variants: &[(String, Vec<String>)], spec: &str) -> Result<usize> {
    let names = || variants.iter().map(|v| format!("`{}`", v.0)).collect::<Vec<_>>().join(", ");
    if let Some(i) = variants.iter().position(|v| v.0 == spec) {
        return Ok(i);
    }
    let Some((key, value)) = spec.split_once('=') else {
        bail!("--baseline {spec}: give key=value (e.g. heads=1) or a variant's label; the variants are {}", names());
    };
    let (key, value) = (key.trim(), value.trim());
    let columns: Vec<&String> = runs.first().map(|r| r.keys().collect()).unwrap_or_default();
    let candidates: Vec<&String> =
        columns.into_iter().filter(|c| *c == key || c.ends_with(&format!(".{key}"))).collect();
    let column = match candidates.as_slice() {
        [one] => *one,
        [] => bail!("--baseline {spec}: runs.csv has no column `{key}`; the variants are {}", names()),
        many => bail!(
            "--baseline {spec}: `{key}` is ambiguous ({}); give the full name",
            many.iter().map(|c| c.as_str()).collect::<Vec<_>>().join(", ")
        ),
    };
    let same = |a: &str| a == value || matches!((a.parse::<f64>(), value.parse::<f64>()), (Ok(x), Ok(y)) if x == y);
    let matching: Vec<usize> = variants
        .iter()
        .enumerate()
        .filter(|(_, (_, ids))| runs.iter().any(|r| ids.contains(&r["run_id"]) && same(&r[column])))
        .map(|(i, _)| i)
        .collect();
    match matching.as_slice() {
        [one] => Ok(*one),
        [] => bail!("--baseline {spec}: no run has {column} = {value}; the variants are {}", names()),
        many => bail!(
            "--baseline {spec}: {} variants have {column} = {value} ({}); name one by its label",
            many.len(),
            many.iter().map(|&i| format!("`{}`", variants[i].0)).collect::<Vec<_>>().join(", ")
        ),
    }
}

#[cfg(test)]
mod tests {

    #[test]
    fn an_effect_holds_only_with_one_sign_and_significance_at_both_scales() {
        assert_eq!(scale_verdict((-0.03, 0.01), (-0.02, 0.04)), "holds");
        assert_eq!(scale_verdict((-0.03, 0.01), (-0.02, 0.2)), "same sign; significant here only");
        assert_eq!(scale_verdict((-0.03, 0.3), (-0.02, 0.01)), "same sign; significant at the second scale only");
        assert_eq!(scale_verdict((0.03, 0.3), (0.02, 0.2)), "same sign; significant at neither");
        assert_eq!(scale_verdict((-0.03, 0.01), (0.02, 0.01)), "reverses (significant at both)");
        assert_eq!(scale_verdict((-0.03, 0.01), (0.02, 0.5)), "sign differs");
        // A missing p (fewer than two pairs) is never significant.
        assert_eq!(scale_verdict((-0.03, f64::NAN), (-0.02, 0.01)), "same sign; significant at the second scale only");
    }
    use super::*;

    type Variants = Vec<(String, Vec<String>)>;

    /// Four variants, three seeds each, one metric (test loss).
    fn four_variants() -> (Vec<Row>, Variants, Metric) {
        let values = [
            ("base", [1.00, 1.10, 0.95]),
            ("small", [0.97, 1.085, 0.925]),
            ("clear", [0.90, 0.99, 0.86]),
            ("noise", [1.02, 1.07, 0.97]),
        ];
        let mut runs = Vec::new();
        for (label, seeds) in values {
            for (seed, v) in seeds.iter().enumerate() {
                let row: Row = [
                    ("run_id".to_string(), format!("{label} seed={seed}")),
                    ("label".to_string(), label.to_string()),
                    ("seed".to_string(), seed.to_string()),
                    ("status".to_string(), "ok".to_string()),
                    ("test_loss".to_string(), v.to_string()),
                ]
                .into_iter()
                .collect();
                runs.push(row);
            }
        }
        let variants = variants_of(&runs);
        (runs, variants, Metric::column("test_loss", "test loss", "nats", false))
    }

    /// Three variants against a baseline: the adjusted column is Holm over the three raw p-values, and only
    /// an adjusted p below 0.05 earns a direction.
    #[test]
    fn paired_comparisons_report_raw_and_holm_adjusted_p_and_call_only_adjusted_wins() {
        let (runs, variants, metric) = four_variants();
        let table = paired_table(&runs, &variants, Reference::Baseline(0), &[metric]);
        assert_eq!(table.header[4..6], ["p".to_string(), "p (Holm)".to_string()]);
        let raw: Vec<f64> = table.rows.iter().map(|r| r[4].parse().unwrap()).collect();
        let adjusted: Vec<f64> = table.rows.iter().map(|r| r[5].parse().unwrap()).collect();
        let expected = holm(&raw);
        for (a, e) in adjusted.iter().zip(&expected) {
            // Both columns are printed to three digits.
            assert!((a - e).abs() < 2e-3, "{adjusted:?} against Holm of {raw:?}");
        }
        for (row, (&p, &q)) in table.rows.iter().zip(raw.iter().zip(&adjusted)) {
            assert!(q >= p, "{row:?}");
            assert_eq!(row[3].ends_with("(better)"), q < ALPHA, "{row:?}");
        }
        assert!(
            raw[0] < ALPHA && adjusted[0] >= ALPHA,
            "the small gain is significant raw but not after Holm: {raw:?} {adjusted:?}"
        );
    }

    #[test]
    fn a_ladder_pairs_each_variant_with_the_one_before_it_and_adjusts_along_the_ladder() {
        let (runs, variants, metric) = four_variants();
        // Each variant meets the one before it: small − base, clear − small, noise − clear, Holm over those
        // three. clear − small is −0.07, −0.095, −0.065 (mean −0.0767, sd 0.0161: t = −8.25, two
        // degrees of freedom, p = 0.0144 by p = 1 − |t|/√(t² + 2)).
        let ladder = paired_table(&runs, &variants, Reference::Ladder, &[metric]);
        let labels: Vec<&str> = ladder.rows.iter().map(|r| r[0].as_str()).collect();
        assert_eq!(labels, ["small vs base", "clear vs small", "noise vs clear"]);
        assert!(ladder.rows[1][3].starts_with("-0.0767"), "{:?}", ladder.rows[1]);
        assert_eq!(ladder.rows[1][4], "0.014");
        let raw: Vec<f64> = ladder.rows.iter().map(|r| r[4].parse().unwrap()).collect();
        let adjusted: Vec<f64> = ladder.rows.iter().map(|r| r[5].parse().unwrap()).collect();
        for (a, e) in adjusted.iter().zip(&holm(&raw)) {
            assert!((a - e).abs() < 2e-3, "{adjusted:?} against Holm of {raw:?}");
        }
        assert!(ladder.note.contains("3 comparison(s) of that metric along the ladder"), "{}", ladder.note);
    }

    #[test]
    fn an_effect_is_a_metric_and_a_non_zero_size_or_one_line_saying_what_is_wrong() {
        assert_eq!("test_loss=0.01".parse::<Effect>(), Ok(Effect { column: "test_loss".into(), size: 0.01 }));
        assert_eq!("test_accuracy=-0.02".parse::<Effect>().map(|e| e.size), Ok(0.02));
        for bad in ["test_loss", "test_loss=x", "test_loss=0", "test_loss=inf"] {
            let e = bad.parse::<Effect>().unwrap_err();
            assert!(e.starts_with(&format!("`{bad}`")) && !e.contains('\n'), "{e}");
        }
    }
}
