//! After a run: does each variant reproduce the committed reference results of its recipe? Per variant and
//! per headline quality metric, the rerun's values over seeds are tested against the reference's with the
//! rule of [`crate::stats::agreement`] (Welch's t-test, a prediction interval, or a stated tolerance for
//! single runs). Only runs with the reference's configuration (seed apart; a tuned arm at the value the
//! reference chose) are compared; a reference made with another configuration is *stale*, in one line
//! naming the change and what a refresh costs. The verdicts are printed and written to
//! `reproduction.csv` beside the results.
use anyhow::Result;
use std::collections::BTreeMap;
use std::path::Path;

use super::reading::Results;
use crate::files::write_atomically;
use crate::metrics::{is_cost, Metric};
use crate::recipe::{columns, Recipe};
use crate::stats::{agreement, Estimate};

type Row = BTreeMap<String, String>;

/// One variant's verdict on one metric.
#[derive(Debug, Clone)]
pub struct Verdict {
    pub variant: String,
    pub metric: String,
    pub reference: Option<Estimate>,
    pub rerun: Option<Estimate>,
    /// `reproduces`, `differs`, `stale` (the reference was made with another configuration: the rule
    /// names the change and what a refresh costs) or `overridden` (this run's command-line overrides made the
    /// difference: the rule names them).
    pub verdict: &'static str,
    pub rule: String,
}

/// The quality metrics worth comparing: headline, and not a measure of the machine or the launch (throughput,
/// time, communication; a world of 2 lists the data-parallel columns too).
fn quality_metrics(metrics: &[Metric]) -> Vec<Metric> {
    metrics.iter().filter(|m| m.headline && m.column_name().is_some() && !is_cost(m)).cloned().collect()
}

fn finite(rows: &[&Row], column: &str) -> Vec<f64> {
    rows.iter().filter_map(|r| r.get(column)?.parse::<f64>().ok()).filter(|v| v.is_finite()).collect()
}

/// How a reference's rows meet a recipe's variant: the rows made with a configuration the recipe can train
/// for it (a tuned arm: any of its candidates, so the value the reference chose), or why none are.
enum Match<'a> {
    Rows(Vec<&'a Row>),
    /// One line naming what changed since the reference was made.
    Stale(String),
}

/// The reference rows of variant `label` that the recipe's runs reproduce: those whose config columns
/// (seed apart) equal one of the recipe's final runs of that label.
fn match_reference<'a>(recipe: &Recipe, label: &str, theirs: &[&'a Row]) -> Match<'a> {
    if theirs.is_empty() {
        return Match::Stale(format!("the reference has no variant `{label}` (the recipe gained it since)"));
    }
    let candidates: Vec<Vec<(String, String)>> = recipe
        .runs
        .iter()
        .filter(|r| r.label == label && r.tune.is_none_or(|t| t.rung.is_none()))
        .map(|r| columns(&r.config).into_iter().filter(|(k, _)| k != "train.seed").collect())
        .collect();
    let Some(first) = candidates.first() else {
        return Match::Stale(format!("the recipe has no variant `{label}` any more"));
    };
    // A key the reference has no column for matches while it is unset (empty): an optional key added
    // since, off, as every run was before it existed.
    let agrees = |row: &Row, k: &str, v: &str| row.get(k).map_or(v.is_empty(), |old| old == v);
    for config in &candidates {
        let rows: Vec<&Row> = theirs.iter().copied().filter(|r| config.iter().all(|(k, v)| agrees(r, k, v))).collect();
        if !rows.is_empty() {
            return Match::Rows(rows);
        }
    }
    // Name what differs from the first candidate (for a tuned arm, its tuned keys aside when another
    // candidate would have matched them).
    let tuned: Vec<&str> =
        recipe.tuning.as_ref().map(|t| t.keys.iter().map(String::as_str).collect()).unwrap_or_default();
    let differences: Vec<String> = first
        .iter()
        .filter(|(k, _)| !tuned.contains(&k.as_str()))
        .filter(|(k, v)| !agrees(theirs[0], k, v))
        .take(3)
        .map(|(k, v)| match theirs[0].get(k) {
            None => format!("the reference predates `{k}` (now {v})"),
            Some(old) => format!("{k} {v} now, {old} in the reference"),
        })
        .collect();
    let changed = if differences.is_empty() {
        "its tuned values are not among the candidates".to_string()
    } else {
        differences.join(", ")
    };
    let by = if recipe.overrides.is_empty() { String::new() } else { " (with this command's overrides)".into() };
    Match::Stale(format!("configuration changed since the reference was made{by}: {changed}"))
}

/// What refreshing the committed reference costs: the wall time its rows record (tuning runs included), as
/// a phrase.
pub fn refresh_cost(reference: &Results) -> String {
    let minutes = reference.recorded_minutes();
    if minutes.is_finite() {
        format!("refreshing it took {minutes:.0} min of training when it was made")
    } else {
        "its cost is not recorded".into()
    }
}

/// Why a recipe's committed reference (`reference`, read with the recipe as it is today) cannot be compared
/// with a rerun today, one line per stale variant (empty when every variant matches).
pub fn staleness(reference: &Results) -> Vec<String> {
    let (recipe, rows) = (reference.recipe, &reference.runs);
    let mut labels: Vec<&str> = Vec::new();
    for r in recipe.runs.iter().filter(|r| r.tune.is_none_or(|t| t.rung.is_none())) {
        if !labels.contains(&r.label.as_str()) {
            labels.push(&r.label);
        }
    }
    let mut out = Vec::new();
    for label in labels {
        let theirs: Vec<&Row> = rows.iter().filter(|r| r["label"] == label).collect();
        if let Match::Stale(why) = match_reference(recipe, label, &theirs) {
            out.push(format!("{label}: {why}"));
        }
    }
    out
}

/// Compares the runs of `results` with the reference results in `reference` (`None` when there is no
/// reference `runs.csv`).
pub fn compare(results: &Results, reference: &Path) -> Result<Option<Vec<Verdict>>> {
    let Some(reference) = results.other(reference)? else { return Ok(None) };
    let (recipe, rows, reference_rows) = (results.recipe, &results.runs, &reference.runs);
    let metrics = quality_metrics(&results.metrics);
    let mut labels: Vec<&str> = Vec::new();
    for r in rows {
        if !labels.contains(&r["label"].as_str()) {
            labels.push(&r["label"]);
        }
    }
    let tuned: Vec<String> = recipe.tuning.as_ref().map(|t| t.keys.clone()).unwrap_or_default();
    let mut verdicts = Vec::new();
    for label in labels {
        let mine: Vec<&Row> = rows.iter().filter(|r| r["label"] == label).collect();
        let theirs: Vec<&Row> = reference_rows.iter().filter(|r| r["label"] == label).collect();
        let matching = match match_reference(recipe, label, &theirs) {
            Match::Rows(rows) => rows,
            Match::Stale(why) => {
                let rule = format!("{why}; {}", refresh_cost(&reference));
                verdicts.extend(metrics.iter().map(|m| Verdict {
                    variant: label.to_string(),
                    metric: m.label.to_string(),
                    reference: None,
                    rerun: None,
                    verdict: "stale",
                    rule: rule.clone(),
                }));
                continue;
            }
        };
        // A tuned arm re-tunes in the rerun: say whether it chose what the reference chose.
        let choice = |rows: &[&Row]| -> String {
            tuned
                .iter()
                .map(|k| format!("{k}={}", rows.first().and_then(|r| r.get(k)).map_or("?", String::as_str)))
                .collect::<Vec<_>>()
                .join(" ")
        };
        let retuned = match tuned.is_empty() {
            true => String::new(),
            false if choice(&mine) == choice(&matching) => {
                format!("; re-tuned to the reference's choice {}", choice(&mine))
            }
            false => format!("; re-tuned to {} where the reference chose {}", choice(&mine), choice(&matching)),
        };
        let threads = threads_note(&mine, &matching);
        for m in &metrics {
            let column = m.column_name().expect("quality metrics are columns");
            let (new, old) = (finite(&mine, column), finite(&matching, column));
            if new.is_empty() || old.is_empty() {
                continue;
            }
            let a = agreement(&old, &new);
            verdicts.push(Verdict {
                variant: label.to_string(),
                metric: m.label.to_string(),
                reference: Some(Estimate::of(&old)),
                rerun: Some(Estimate::of(&new)),
                verdict: if a.reproduces { "reproduces" } else { "differs" },
                rule: format!("{}{retuned}{threads}", a.rule),
            });
        }
    }
    Ok(Some(verdicts))
}

/// The intra-op thread counts the two sides trained on (`runs.csv`'s `threads`), said when they differ:
/// libtorch's CPU kernels split reductions by thread, so a run's bits depend on it. Empty when they agree or
/// a side predates the column.
fn threads_note(mine: &[&Row], theirs: &[&Row]) -> String {
    let counts = |rows: &[&Row]| -> Vec<String> {
        let mut c: Vec<String> =
            rows.iter().filter_map(|r| r.get("threads")).filter(|t| !t.is_empty()).cloned().collect();
        c.sort();
        c.dedup();
        c
    };
    let (mine, theirs) = (counts(mine), counts(theirs));
    if mine.is_empty() || theirs.is_empty() || mine == theirs {
        return String::new();
    }
    format!(
        "; trained on {} thread(s), the reference on {} (a run's bits depend on its thread count)",
        mine.join("/"),
        theirs.join("/")
    )
}

fn describe(e: &Option<Estimate>) -> String {
    match e {
        None => "–".into(),
        Some(e) if e.n == 1 => format!("{:.4} (n 1)", e.mean),
        Some(e) => format!("{:.4} ± {:.4} (n {})", e.mean, e.std, e.n),
    }
}

/// One line per variant: `reproduces` when every metric does, else the first metric that differs.
pub fn lines(verdicts: &[Verdict], reference: &Path) -> Vec<String> {
    let mut out = vec![format!("ablate: compared with the reference results in {}:", reference.display())];
    let mut seen: Vec<&str> = Vec::new();
    for v in verdicts {
        if seen.contains(&v.variant.as_str()) {
            continue;
        }
        seen.push(&v.variant);
        let mine: Vec<&Verdict> = verdicts.iter().filter(|w| w.variant == v.variant).collect();
        let worst = mine.iter().find(|w| w.verdict != "reproduces").unwrap_or(&mine[0]);
        let line = if worst.verdict == "stale" {
            format!("  {}: stale reference ({})", v.variant, worst.rule)
        } else if worst.verdict == "overridden" {
            format!(
                "  {}: not compared: this run's configuration differs from the reference's ({})",
                v.variant, worst.rule
            )
        } else {
            format!(
                "  {}: {} ({} {} vs reference {}; {})",
                v.variant,
                if worst.verdict == "reproduces" { "reproduces" } else { "DIFFERS" },
                worst.metric,
                describe(&worst.rerun),
                describe(&worst.reference),
                worst.rule
            )
        };
        out.push(line);
    }
    out
}

/// Writes `reproduction.csv`: variant, metric, both sides' n, mean and std, verdict and rule.
pub fn write(verdicts: &[Verdict], path: &Path) -> Result<()> {
    let mut w = csv::Writer::from_writer(Vec::new());
    w.write_record([
        "variant",
        "metric",
        "reference_n",
        "reference_mean",
        "reference_std",
        "rerun_n",
        "rerun_mean",
        "rerun_std",
        "verdict",
        "rule",
    ])?;
    let cells = |e: &Option<Estimate>| match e {
        Some(e) => [e.n.to_string(), format!("{:.6}", e.mean), format!("{:.6}", e.std)],
        None => [String::new(), String::new(), String::new()],
    };
    for v in verdicts {
        let [rn, rm, rs] = cells(&v.reference);
        let [n, m, s] = cells(&v.rerun);
        w.write_record([&v.variant, &v.metric, &rn, &rm, &rs, &n, &m, &s, v.verdict, &v.rule])?;
    }
    let bytes = w.into_inner().map_err(|e| anyhow::anyhow!("{e}"))?;
    write_atomically(path, &bytes)
}

/// Compares, prints and writes, when `reference` holds results and is not `dir` itself.
/// `overridden`: the keys set on the command line (`KEY=VALUE`, `--sweep`): a variant they make differ from
/// the reference is said to differ by them, not to have a stale reference.
pub fn report(recipe: &Recipe, dir: &Path, reference: &Path, quiet: bool, overridden: &[String]) -> Result<()> {
    let same = match (dir.canonicalize(), reference.canonicalize()) {
        (Ok(a), Ok(b)) => a == b,
        _ => false,
    };
    if same || recipe.smoke {
        return Ok(());
    }
    // A reference that cannot be read (from an older ablate, damaged) costs the comparison, not the run.
    let Some(results) = Results::open_if_any(dir, recipe, None)? else { return Ok(()) };
    let verdicts = match compare(&results, reference) {
        Ok(Some(verdicts)) => verdicts,
        Ok(None) => return Ok(()),
        Err(e) => {
            eprintln!("ablate: no comparison with the reference in {}: {e:#}", reference.display());
            return Ok(());
        }
    };
    let verdicts = overridden_lines(&verdicts, overridden);
    write(&verdicts, &dir.join("reproduction.csv"))?;
    super::report::write_report(&results)?;
    if !quiet {
        for line in lines(&verdicts, reference) {
            eprintln!("{line}");
        }
    }
    Ok(())
}

/// The verdicts of a run made with command-line overrides (`overridden`: their keys) against a reference
/// that is current for the recipe itself: each stale verdict is the overrides' doing, so it becomes
/// `overridden`, naming the keys (those its difference names, else all of them). Pass no keys where the
/// reference is stale for the recipe too.
pub fn overridden_lines(verdicts: &[Verdict], overridden: &[String]) -> Vec<Verdict> {
    verdicts
        .iter()
        .map(|v| match v.verdict {
            "stale" if !overridden.is_empty() => {
                let named: Vec<&String> = overridden.iter().filter(|k| v.rule.contains(&format!("{k} "))).collect();
                let keys: Vec<String> = if named.is_empty() { overridden.iter().collect() } else { named }
                    .iter()
                    .map(|k| format!("`{k}`"))
                    .collect();
                let what = v.rule.split("; ").next().unwrap_or(&v.rule).replace(" (the recipe gained it since)", "");
                Verdict {
                    verdict: "overridden",
                    rule: format!("{what}: {} set on the command line", keys.join(", ")),
                    ..v.clone()
                }
            }
            _ => v.clone(),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stale(variant: &str, rule: &str) -> Verdict {
        Verdict {
            variant: variant.into(),
            metric: "test loss".into(),
            reference: None,
            rerun: None,
            verdict: "stale",
            rule: rule.into(),
        }
    }

    #[test]
    fn a_difference_made_on_the_command_line_is_said_so_and_not_called_a_stale_reference() {
        let verdicts = vec![
            stale("heads=4", "train.steps 30 now, 1500 in the reference; refreshing it took 69 min of training"),
            stale(
                "base",
                "the reference has no variant `base` (the recipe gained it since); refreshing it took 69 min",
            ),
        ];
        let keys = vec!["transformer.heads".to_string(), "train.steps".to_string()];
        let said = overridden_lines(&verdicts, &keys);
        assert_eq!(said[0].verdict, "overridden");
        assert_eq!(said[0].rule, "train.steps 30 now, 1500 in the reference: `train.steps` set on the command line");
        assert_eq!(
            said[1].rule,
            "the reference has no variant `base`: `transformer.heads`, `train.steps` set on the command line"
        );
        let text = lines(&said, Path::new("results/heads"));
        assert!(
            text[1].starts_with("  heads=4: not compared: this run's configuration differs from the reference's ("),
            "{text:?}"
        );
        assert!(!text.iter().any(|l| l.contains("stale") || l.contains("refreshing")), "{text:?}");
        // Without overrides (or against a reference stale for the recipe itself) a stale verdict stays stale.
        assert_eq!(overridden_lines(&verdicts, &[])[0].verdict, "stale");
    }
}
