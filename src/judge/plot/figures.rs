//! The figures of a results directory: for every named metric of the recipe's kinds, its curves against
//! step (one line per variant) and its final value against the swept key; test loss at longer
//! sequences; the interaction matrices of recipes that compare attention patterns. Read from `runs.csv` and
//! `curves.csv`, so `ablate plot` redraws them from the files alone.
use anyhow::Result;
use std::collections::BTreeMap;
use std::path::Path;

use super::charts::*;
use crate::judge::reading::{Curves, Results};
use crate::metrics::Metric;
use crate::recipe::Recipe;
use crate::stats::CONFIDENCE;
use crate::tasks::Declarations;

/// Averages a metric's curve over the runs of each variant, step by step (steps every seed recorded).
pub fn variant_curves(curves: &Curves, variants: &[(String, Vec<String>)], metric: &str) -> Vec<Series> {
    let mut out = Vec::new();
    for (label, run_ids) in variants {
        let mut by_step: BTreeMap<i64, Vec<f64>> = BTreeMap::new();
        let mut runs_with_metric = 0;
        let mut seed_curves = Vec::new();
        for id in run_ids {
            if let Some(points) = curves.get(id).and_then(|m| m.get(metric)) {
                runs_with_metric += 1;
                for &(s, v) in points {
                    by_step.entry(s).or_default().push(v);
                }
                let finite = points.iter().filter(|p| p.1.is_finite()).map(|&(s, v)| (s as f64, v));
                seed_curves.push(finite.collect::<Vec<_>>());
            }
        }
        if !(2..=SEED_CURVES_UP_TO).contains(&seed_curves.len()) {
            seed_curves.clear();
        }
        let points: Vec<(f64, f64, f64)> = by_step
            .into_iter()
            .filter(|(_, vs)| vs.len() == runs_with_metric)
            .filter_map(|(s, vs)| {
                let finite: Vec<f64> = vs.into_iter().filter(|v| v.is_finite()).collect();
                (!finite.is_empty()).then(|| {
                    let (m, half) = mean_interval(&finite);
                    (s as f64, m, half)
                })
            })
            .collect();
        if !points.is_empty() {
            out.push(Series { label: label.clone(), points, runs: Vec::new(), seed_curves });
        }
    }
    out
}

/// Every metric of the recipe's runs once per meaning: where runs of different tasks record one column or
/// curve under different labels (F1 over punctuation marks, F1 of spans), each label is its own chart, of
/// the runs that mean it, its file named with a suffix from the label. Returns (metric, its runs' ids,
/// file suffix, empty where the name is unambiguous).
pub(super) fn meanings(declarations: &Declarations) -> Vec<(Metric, Vec<String>, String)> {
    let mut out: Vec<(Metric, Vec<String>)> = Vec::new();
    for (id, _, metrics) in declarations.runs() {
        for m in metrics {
            match out.iter_mut().find(|(o, _)| o.column == m.column && o.curve == m.curve && o.label == m.label) {
                Some((_, ids)) => ids.push(id.to_string()),
                None => out.push((m.clone(), vec![id.to_string()])),
            }
        }
    }
    let shared = |m: &Metric| out.iter().filter(|(o, _)| o.column == m.column && o.curve == m.curve).count() > 1;
    let suffixes: Vec<String> = out
        .iter()
        .map(|(m, _)| {
            if shared(m) {
                // The meaning without the split: the same suffix names the validation curve and the test value.
                let slug: String = m
                    .label
                    .trim_start_matches("test ")
                    .chars()
                    .map(|c| if c.is_ascii_alphanumeric() { c.to_ascii_lowercase() } else { '_' })
                    .collect();
                format!("__{}", slug.split('_').filter(|w| !w.is_empty()).collect::<Vec<_>>().join("_"))
            } else {
                String::new()
            }
        })
        .collect();
    out.into_iter().zip(suffixes).map(|((m, ids), suffix)| (m, ids, suffix)).collect()
}

/// The variants restricted to the runs in `ids` (variants left without runs dropped).
pub(super) fn only(variants: &[(String, Vec<String>)], ids: &[String]) -> Vec<(String, Vec<String>)> {
    variants
        .iter()
        .map(|(label, runs)| (label.clone(), runs.iter().filter(|r| ids.contains(r)).cloned().collect::<Vec<_>>()))
        .filter(|(_, runs)| !runs.is_empty())
        .collect()
}

/// The chart file of a curve: `val_loss.png` for `val/loss`, `grad_norm.png` for `train/grad_norm`,
/// `pretrain_mlm_loss.png` for `pretrain_val/mlm_loss`: the metric's name, with its split where the name
/// alone is ambiguous (loss and accuracy, the pre-training phase).
pub fn chart_file(curve: &str) -> String {
    let (split, metric) = curve.split_once('/').unwrap_or(("val", curve));
    match (split, metric) {
        (_, "loss" | "accuracy") => format!("{split}_{metric}.png"),
        ("val" | "train", _) => format!("{metric}.png"),
        (phase, _) => format!("{}_{metric}.png", phase.trim_end_matches("_val").trim_end_matches("_train")),
    }
}

/// Draws every plot of a results directory from its CSV files, labelled by the recipe's metrics.
pub fn plot_results(results: &Results) -> Result<()> {
    let (dir, recipe, runs) = (&results.dir, results.recipe, &results.runs);
    let curves = results.curves()?;
    let mut variants = results.variants.clone();
    if let Some(tuning) = &recipe.tuning {
        // Each arm's legend says what it was tuned to.
        for (label, ids) in variants.iter_mut() {
            *label = format!("{label} ({})", crate::judge::reading::chosen_values(runs, ids, &tuning.keys));
        }
    }
    let seeds = runs.iter().map(|r| r["seed"].clone()).collect::<std::collections::BTreeSet<_>>().len();
    // Seeds added to some arms only (`--until-settled`) leave the variants with different n: say so.
    let per_variant: Vec<usize> = variants.iter().map(|(_, ids)| ids.len()).collect();
    let fewest = per_variant.iter().copied().min().unwrap_or(seeds);
    let n =
        if fewest < seeds { format!("n = {fewest}–{seeds} seeds per variant") } else { format!("n = {seeds} seeds") };
    let band = if seeds > SEED_CURVES_UP_TO {
        format!(" (mean, {:.0}% CI over {n})", 100.0 * CONFIDENCE)
    } else if seeds > 1 {
        format!(" (mean; each of {n} drawn)")
    } else {
        String::new()
    };
    let name = &recipe.name;
    let metrics = &results.metrics;
    let meanings = recorded_meanings(recipe, &results.declarations, runs);
    for (m, ids, suffix) in meanings.iter().filter(|(m, _, _)| m.chart).cloned() {
        let Some(curve) = m.curve else { continue };
        let series = variant_curves(curves, &only(&variants, &ids), curve);
        if series.is_empty() {
            continue;
        }
        let y_label = m.curve_axis();
        let title = format!("{name}: {}{band}", m.curve_label());
        let file = chart_file(curve).replace(".png", &format!("{suffix}.png"));
        line_chart(
            &dir.join(file),
            &series,
            &Axes { title: &title, x_label: "step", y_label: &y_label, x_categories: None },
        )?;
    }
    // Data efficiency of pre-training objectives: validation loss against the tokens read and against the
    // tokens that carried loss (the x values differ between variants, so steps cannot stand in).
    let losses = variant_curves(curves, &variants, "val/loss");
    for (axis, file) in [
        ("val/tokens_seen", "val_loss_by_tokens_seen.png"),
        ("val/tokens_predicted", "val_loss_by_tokens_predicted.png"),
    ] {
        let Some(x_metric) = metrics.iter().find(|m| m.curve == Some(axis)) else { continue };
        let xs = variant_curves(curves, &variants, axis);
        let series: Vec<Series> = losses
            .iter()
            .filter_map(|y| {
                let x = xs.iter().find(|x| x.label == y.label)?;
                let tokens: BTreeMap<i64, f64> = x.points.iter().map(|&(s, t, _)| (s as i64, t)).collect();
                let points = y.points.iter().filter_map(|&(s, m, sd)| Some((tokens.get(&(s as i64)).copied()?, m, sd)));
                Some(Series { label: y.label.clone(), points: points.collect(), ..Default::default() })
            })
            .collect();
        if series.is_empty() {
            continue;
        }
        let y_label = "validation loss of the objective (nats/predicted token)";
        let title = format!("{name}: validation loss against {}{band}", x_metric.label);
        line_chart(
            &dir.join(file),
            &series,
            &Axes { title: &title, x_label: x_metric.label, y_label, x_categories: None },
        )?;
    }
    length_generalisation_chart(dir, name, runs, &variants, &band)?;
    compute_frontiers(results)?;
    if super::interaction::has_patterns(recipe) {
        super::interaction::draw(dir, recipe)?;
    }
    let Some(x_key) = recipe.sweep_keys.first() else { return Ok(()) };
    for (m, ids, suffix) in meanings.into_iter().filter(|(m, _, _)| m.final_chart) {
        let Some(column) = m.column_name() else { continue };
        if runs.first().is_none_or(|r| !r.contains_key(column)) {
            continue;
        }
        let series = final_metric_series(runs, &ids, x_key, &recipe.sweep_keys[1..], column, m.label);
        if series.is_empty() {
            // No run has this metric (e.g. no BERT run of the recipe was pre-trained by masked-LM).
            continue;
        }
        let categories = x_categories(runs, x_key);
        let y_label = format!("final {}", m.axis());
        let title = format!("{name}: final {} against {x_key}{band}", m.label);
        line_chart(
            &dir.join(format!("final_{column}{suffix}.png")),
            &series,
            &Axes { title: &title, x_label: x_key, y_label: &y_label, x_categories: Some(&categories) },
        )?;
    }
    Ok(())
}

/// [`meanings`] with each metric's runs read from `runs.csv`: every recorded run of a variant whose recipe
/// runs declare the metric, so that seeds a second stage added (`--until-settled`, past the recipe's
/// `seeds`) are drawn too, as the verdicts count them.
fn recorded_meanings(
    recipe: &Recipe,
    declarations: &Declarations,
    runs: &[BTreeMap<String, String>],
) -> Vec<(Metric, Vec<String>, String)> {
    meanings(declarations)
        .into_iter()
        .map(|(m, ids, suffix)| {
            let labels: std::collections::BTreeSet<&str> =
                recipe.runs.iter().filter(|r| ids.contains(&r.id)).map(|r| r.label.as_str()).collect();
            let recorded = runs
                .iter()
                .filter(|r| ids.contains(&r["run_id"]) || r.get("label").is_some_and(|l| labels.contains(l.as_str())))
                .map(|r| r["run_id"].clone())
                .collect();
            (m, recorded, suffix)
        })
        .collect()
}

/// The value of swept `key` in run `r`. A column left blank (a default that runs.csv records nowhere, such
/// as `vision.registers: 0`) is read from the run's label (`registers=0`). A swept section (e.g.
/// `data.images`) has no column of its own: its columns that this run sets and whose values differ between
/// runs stand in (`dataset=mnist train_fraction=1`), and failing those the run's variant label.
pub(super) fn swept_value(runs: &[BTreeMap<String, String>], r: &BTreeMap<String, String>, key: &str) -> String {
    match r.get(key) {
        Some(v) if !v.is_empty() => return v.clone(),
        Some(_) => {
            let part = format!("{}=", short_key(key));
            let labelled = r.get("label").and_then(|l| l.split(' ').find_map(|p| p.strip_prefix(part.as_str())));
            return labelled.unwrap_or_default().to_string();
        }
        None => {}
    }
    let prefix = format!("{key}.");
    let varying: Vec<String> = r
        .iter()
        .filter(|(column, value)| column.starts_with(&prefix) && !value.is_empty())
        .filter(|(column, value)| runs.iter().any(|other| other.get(*column) != Some(*value)))
        .map(|(column, value)| format!("{}={value}", &column[prefix.len()..]))
        .collect();
    if varying.is_empty() {
        r.get("label").cloned().unwrap_or_default()
    } else {
        varying.join(" ")
    }
}

/// The last part of a dotted key, as labels write it.
fn short_key(key: &str) -> &str {
    key.rsplit('.').next().unwrap_or(key)
}

/// Distinct values of `key` in `runs.csv`, in first-seen order (the x positions of the final-metric plot).
pub(super) fn x_categories(runs: &[BTreeMap<String, String>], key: &str) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for r in runs {
        let v = swept_value(runs, r, key);
        if !out.contains(&v) {
            out.push(v);
        }
    }
    out
}

/// One series per combination of the other swept keys: the final `column` against the first swept key.
pub(super) fn final_metric_series(
    runs: &[BTreeMap<String, String>],
    ids: &[String],
    x_key: &str,
    other_keys: &[String],
    column: &str,
    label_alone: &str,
) -> Vec<Series> {
    let cats = x_categories(runs, x_key);
    let mut groups: Vec<(String, BTreeMap<usize, Vec<f64>>)> = Vec::new();
    for r in runs.iter().filter(|r| ids.contains(&r["run_id"])) {
        let label = if other_keys.is_empty() {
            label_alone.to_string()
        } else {
            other_keys
                .iter()
                .map(|k| match r.contains_key(k) {
                    true => format!("{}={}", short_key(k), swept_value(runs, r, k)),
                    false => swept_value(runs, r, k),
                })
                .collect::<Vec<_>>()
                .join(" ")
        };
        let Some(Ok(v)) = r.get(column).map(|v| v.parse::<f64>()) else { continue };
        let x = swept_value(runs, r, x_key);
        let Some(xi) = cats.iter().position(|c| *c == x) else { continue };
        let idx = match groups.iter().position(|g| g.0 == label) {
            Some(i) => i,
            None => {
                groups.push((label, BTreeMap::new()));
                groups.len() - 1
            }
        };
        groups[idx].1.entry(xi).or_default().push(v);
    }
    groups
        .into_iter()
        .map(|(label, by_x)| Series {
            label,
            points: by_x
                .iter()
                .map(|(&x, vs)| {
                    let (m, half) = mean_interval(vs);
                    (x as f64, m, half)
                })
                .collect(),
            runs: by_x
                .iter()
                .filter(|(_, vs)| vs.len() > 1)
                .flat_map(|(&x, vs)| vs.iter().map(move |&v| (x as f64, v)))
                .collect(),
            seed_curves: Vec::new(),
        })
        .collect()
}

/// Test loss at the training length and at every `train.eval_lengths` multiple, one line per variant
/// (a variant whose position table cannot read a length has no point there).
pub(super) fn length_generalisation_chart(
    dir: &Path,
    name: &str,
    runs: &[BTreeMap<String, String>],
    variants: &[(String, Vec<String>)],
    band: &str,
) -> Result<()> {
    let Some(first) = runs.first() else { return Ok(()) };
    let mut columns = vec![("1".to_string(), "test_loss".to_string())];
    columns.extend(
        first
            .keys()
            .filter_map(|k| k.strip_prefix("test_loss_x").map(|m| (m.to_string(), k.clone())))
            .collect::<Vec<_>>(),
    );
    if columns.len() == 1 {
        return Ok(());
    }
    columns.sort_by_key(|(m, _)| m.parse::<i64>().unwrap_or(0));
    let block = first.get("transformer.block_size").cloned().unwrap_or_default();
    let categories: Vec<String> = columns
        .iter()
        .map(|(m, _)| format!("{m}× ({} tokens)", m.parse::<i64>().unwrap_or(1) * block.parse::<i64>().unwrap_or(0)))
        .collect();
    let series: Vec<Series> = variants
        .iter()
        .filter_map(|(label, ids)| {
            let mut points = Vec::new();
            let mut each_run = Vec::new();
            for (x, (_, col)) in columns.iter().enumerate() {
                let values: Vec<f64> = runs
                    .iter()
                    .filter(|r| ids.contains(&r["run_id"]))
                    .filter_map(|r| r.get(col).and_then(|v| v.parse::<f64>().ok()))
                    .collect();
                if values.is_empty() {
                    continue;
                }
                let (m, half) = mean_interval(&values);
                points.push((x as f64, m, half));
                // Every run beside its mean where there are several (with two, instead of an error bar).
                if values.len() > 1 {
                    each_run.extend(values.iter().map(|&v| (x as f64, v)));
                }
            }
            (!points.is_empty()).then(|| Series {
                label: label.clone(),
                points,
                runs: each_run,
                seed_curves: Vec::new(),
            })
        })
        .collect();
    let title = format!("{name}: test loss at longer sequences than trained on{band}");
    line_chart(
        &dir.join("length_generalisation.png"),
        &series,
        &Axes {
            title: &title,
            x_label: "evaluation length (multiple of the training block)",
            y_label: "test loss",
            x_categories: Some(&categories),
        },
    )
}

/// `compute_frontiers.png` of the recipe's primary metric (`judge::compute::plot`), its axis named by the
/// metric's declaration.
fn compute_frontiers(results: &Results) -> Result<()> {
    let Some(column) = crate::judge::summary::primary_column(results.recipe, &results.headline) else {
        return Ok(());
    };
    match results.headline.iter().find(|m| m.column_name() == Some(column.as_str())) {
        Some(m) => crate::judge::compute::plot(results, &column, &results.declarations.heading(m)),
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seeds_recorded_past_the_recipes_own_are_drawn_with_their_variant() {
        let recipe = crate::recipe::parse(
            "kind: lm\ntransformer: {d_model: 32, heads: 2, block_size: 16}\nsweep:\n  transformer.heads: [1, 2]\nseeds: [0]\n",
            "r.yaml",
            "r",
            false,
        )
        .unwrap();
        let row = |run: &crate::recipe::RunSpec, id: &str| -> BTreeMap<String, String> {
            [("run_id", id), ("label", run.label.as_str())]
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect()
        };
        // Each variant's recipe run (seed 0), and seeds 1 and 2 added to the first variant by a second stage.
        let (first, second) = (&recipe.runs[0], &recipe.runs[1]);
        let runs = vec![
            row(first, &first.id),
            row(second, &second.id),
            row(first, &first.id.replace("seed=0", "seed=1")),
            row(first, &first.id.replace("seed=0", "seed=2")),
        ];
        assert_ne!(runs[2]["run_id"], first.id);
        let declarations = Declarations::of(&recipe);
        let (_, ids, _) = recorded_meanings(&recipe, &declarations, &runs)
            .into_iter()
            .find(|(m, _, _)| m.column.as_deref() == Some("test_loss"))
            .unwrap();
        assert_eq!(ids.len(), 4, "{ids:?}");
        // Without the runs.csv reading, only the recipe's own seed of each variant.
        let (_, own, _) =
            meanings(&declarations).into_iter().find(|(m, _, _)| m.column.as_deref() == Some("test_loss")).unwrap();
        assert_eq!(own.len(), 2);
    }
}
