//! `ablate summary`: markdown tables of a results directory. One row per variant with the headline metrics
//! of the recipe's kinds (n, mean ± sample standard deviation, Student-t 95% confidence interval of the
//! mean); with a baseline, a paired comparison of every other variant against it over shared seeds.
use anyhow::{bail, Context, Result};
use std::collections::BTreeMap;
use std::path::Path;

use super::plot::recipe_metrics;
use super::results::{read_runs, variants_of};
use crate::metrics::Metric;
use crate::recipe::Recipe;
use crate::stats::{format_p, paired, Estimate, CONFIDENCE};

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

/// The summary of `dir` as markdown: the per-variant table, then, with `baseline` (`heads=1`,
/// `transformer.heads=1` or a variant's label), the paired comparison against it.
pub fn summary_table(dir: &Path, recipe: &Recipe, baseline: Option<&str>) -> Result<String> {
    let tables = summary_tables(dir, recipe, baseline)?;
    Ok(tables.iter().map(Table::markdown).collect::<Vec<_>>().join("\n"))
}

/// [`summary_table`]'s tables.
pub fn summary_tables(dir: &Path, recipe: &Recipe, baseline: Option<&str>) -> Result<Vec<Table>> {
    let path = dir.join("runs.csv");
    let runs = read_runs(&path).with_context(|| format!("no results to summarise in {}", dir.display()))?;
    let metrics = headline_metrics(recipe, &runs);
    let variants = variants_of(&runs);
    // Resolve the baseline before anything else, so a bad one is one line and no table.
    let baseline = baseline.map(|b| find_baseline(&runs, &variants, b)).transpose()?;
    let confidence = 100.0 * CONFIDENCE;
    let note = format!(
        "Per variant: n runs (seeds), then each metric as mean ± sample std [{confidence:.0}% confidence interval \
         of the mean, Student t with n − 1 degrees of freedom]."
    );
    let mut header = vec!["variant".to_string(), "n".to_string()];
    header.extend(metrics.iter().map(|m| m.axis()));
    let mut rows = Vec::new();
    for (label, ids) in &variants {
        let n = runs.iter().filter(|r| ids.contains(&r["run_id"])).count();
        let mut cells = vec![label.clone(), n.to_string()];
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
    if let Some(base) = baseline {
        tables.push(paired_table(&runs, &variants, base, &metrics));
    }
    Ok(tables)
}

/// Paired differences (variant − baseline) over the seeds both ran, per headline metric.
fn paired_table(runs: &[Row], variants: &[(String, Vec<String>)], base: usize, metrics: &[Metric]) -> Table {
    let (base_label, base_ids) = &variants[base];
    let confidence = 100.0 * CONFIDENCE;
    let note = format!(
        "Paired against `{base_label}`: per seed the difference variant − baseline; mean difference \
         [{confidence:.0}% CI], marked better or worse where the interval excludes 0; two-sided paired t-test \
         p-value. Fewer than two shared seeds: no test."
    );
    let header =
        ["variant", "metric", "pairs", &format!("mean difference [{confidence:.0}% CI]"), "p", "per-seed differences"]
            .iter()
            .map(|s| s.to_string())
            .collect();
    let mut rows = Vec::new();
    for (i, (label, ids)) in variants.iter().enumerate() {
        if i == base {
            continue;
        }
        for m in metrics {
            let column = m.column_name().expect("filtered to columns");
            let b = seed_values(runs, base_ids, column);
            let v = seed_values(runs, ids, column);
            let digits = m.digits;
            rows.push(match paired(&b, &v) {
                Some(p) => {
                    let h = p.difference.half_width.expect("two or more pairs");
                    // A direction only where the interval excludes no difference.
                    let better = if (p.difference.mean - h) * (p.difference.mean + h) <= 0.0 {
                        ""
                    } else if (p.difference.mean > 0.0) == m.higher_is_better {
                        " (better)"
                    } else {
                        " (worse)"
                    };
                    let diffs: Vec<String> =
                        p.seeds.iter().zip(&p.differences).map(|(s, d)| format!("seed {s}: {d:+.digits$}")).collect();
                    vec![
                        label.clone(),
                        m.axis(),
                        p.seeds.len().to_string(),
                        format!(
                            "{:+.digits$} [{:+.digits$}, {:+.digits$}]{better}",
                            p.difference.mean,
                            p.difference.mean - h,
                            p.difference.mean + h
                        ),
                        format_p(p.p),
                        diffs.join(", "),
                    ]
                }
                None => {
                    let shared = v.iter().filter(|(s, _)| b.iter().any(|(bs, _)| bs == s)).count();
                    vec![label.clone(), m.axis(), shared.to_string(), "–".into(), "–".into(), "–".into()]
                }
            });
        }
    }
    Table { note, header, rows }
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
