//! `ablate summary`: a markdown table of a results directory, one row per variant, with the headline
//! metrics of the recipe's kinds (mean ± sample standard deviation over seeds) and its cost.
use anyhow::{Context, Result};
use std::path::Path;

use super::plot::recipe_metrics;
use super::results::{read_runs, variants_of};
use crate::metrics::mean_std;
use crate::recipe::Recipe;

/// The table: per variant the number of runs, then each headline metric (mean ± std with several seeds).
pub fn summary_table(dir: &Path, recipe: &Recipe) -> Result<String> {
    let path = dir.join("runs.csv");
    let runs = read_runs(&path).with_context(|| format!("no results to summarise in {}", dir.display()))?;
    let metrics: Vec<_> = recipe_metrics(recipe)
        .into_iter()
        .filter(|m| m.headline && m.column_name().is_some_and(|c| runs.first().is_some_and(|r| r.contains_key(c))))
        .collect();
    let mut out = format!(
        "| variant | runs | {} |\n|---|---|{}\n",
        metrics.iter().map(|m| m.axis()).collect::<Vec<_>>().join(" | "),
        "---|".repeat(metrics.len())
    );
    for (label, ids) in variants_of(&runs) {
        let rows: Vec<_> = runs.iter().filter(|r| ids.contains(&r["run_id"])).collect();
        let mut cells = vec![label, rows.len().to_string()];
        for m in &metrics {
            let column = m.column_name().expect("filtered to columns");
            let values: Vec<f64> =
                rows.iter().filter_map(|r| r.get(column).and_then(|v| v.parse::<f64>().ok())).collect();
            let digits = m.digits;
            cells.push(match values.len() {
                0 => "–".to_string(),
                1 => format!("{:.digits$}", values[0]),
                _ => {
                    let (mean, std) = mean_std(&values);
                    format!("{mean:.digits$} ± {std:.digits$}")
                }
            });
        }
        out.push_str(&format!("| {} |\n", cells.join(" | ")));
    }
    Ok(out)
}
