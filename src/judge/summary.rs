//! `ablate summary`: markdown tables of a results directory. One row per variant with the headline metrics
//! of the recipe's kinds (n, mean ± sample standard deviation, Student-t 95% confidence interval of the
//! mean); with a baseline, a paired comparison of every other variant against it over shared seeds.
use anyhow::{bail, Result};
use std::collections::BTreeMap;

pub use super::reading::Pairing;
use super::reading::{variants_of, Results};
use crate::design::{judge_family, Analysis, Evidence, Stages};
use crate::metrics::{is_cost, Metric};
use crate::recipe::compare::{default_delta, Comparison, Delta};
use crate::recipe::Recipe;
use crate::stats::{
    across_scales, format_p, minimum_detectable_effect, paired, seeds_needed, seeds_to_settle, Estimate, Paired,
    Verdict, ALPHA, CONFIDENCE, POWER,
};
use crate::tasks::Declarations;

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

/// A [`Pairing`] resolved to the variants of a runs.csv.
#[derive(Debug, Clone, PartialEq)]
enum Reference {
    Baseline(usize),
    Ladder,
    /// `key=value` of one swept key in a grid: every variant with another value of `key` is paired with
    /// the variant that has `value` and the same values of every other swept key (a simple effect within
    /// each level of the others).
    Within {
        baseline: String,
        pairs: Vec<(usize, usize)>,
    },
}

impl Reference {
    /// The comparisons (variant, the variant it is paired against), in variant order: one family for Holm.
    fn pairs(&self, variants: usize) -> Vec<(usize, usize)> {
        match self {
            Reference::Baseline(base) => (0..variants).filter(|i| i != base).map(|i| (i, *base)).collect(),
            Reference::Ladder => (1..variants).map(|i| (i, i - 1)).collect(),
            Reference::Within { pairs, .. } => pairs.clone(),
        }
    }
}

/// The summary of a results directory as markdown: the per-variant table, then, with a pairing (the
/// command's, else the recipe's `compare:`), the paired comparisons.
pub fn summary_table(results: &Results) -> Result<String> {
    let tables = summary_tables(results)?;
    Ok(tables.iter().map(Table::markdown).collect::<Vec<_>>().join("\n"))
}

/// [`summary_table`]'s tables.
pub fn summary_tables(results: &Results) -> Result<Vec<Table>> {
    let (recipe, runs, metrics, variants) = (results.recipe, &results.runs, &results.headline, &results.variants);
    // Resolve the comparison (the command line's, else the recipe's `compare:`) before anything else, so a
    // bad baseline is one line and no table.
    let reference = resolve_pairing(runs, recipe, results.pairing)?;
    let confidence = 100.0 * CONFIDENCE;
    let note = format!(
        "Per variant: n runs (seeds), then each metric as mean ± sample std [{confidence:.0}% confidence interval \
         of the mean, Student t with n − 1 degrees of freedom]."
    );
    let mut header = vec!["variant".to_string(), "n".to_string()];
    if recipe.tuning.is_some() {
        header.push("chosen on validation".to_string());
    }
    header.extend(metrics.iter().map(|m| results.declarations.heading(m)));
    let mut rows = Vec::new();
    for (label, ids) in variants {
        let n = runs.iter().filter(|r| ids.contains(&r["run_id"])).count();
        let mut cells = vec![label.clone(), n.to_string()];
        if let Some(tuning) = &recipe.tuning {
            cells.push(super::reading::chosen_values(runs, ids, &tuning.keys));
        }
        for m in metrics {
            let column = m.column_name().expect("filtered to columns");
            let values: Vec<f64> = seed_values(runs, ids, column).into_iter().map(|(_, v)| v).collect();
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
        tables.push(tuning_cost(&results.all_runs, tuning));
    }
    if let Some(reference) = &reference {
        let deltas: Vec<Delta> = metrics.iter().map(|m| delta_of(recipe, m)).collect();
        let own_metric = |v: usize, m: &Metric| results.declarations.of_variant(&variants[v].0, m);
        tables.push(paired_table(runs, variants, reference, metrics, &deltas, &StagePlan::of(recipe), own_metric));
    }
    if let Some((check, settings)) = &results.second {
        let mut at_check = summary_tables(check)?;
        if let Some(first) = at_check.first_mut() {
            first.note = format!("At the second scale ({settings}): {}", first.note);
        }
        tables.extend(at_check);
        if let Some(reference) = reference {
            let check_reference = second_scale_reference(&reference, variants, check)?;
            let scales = [(runs, reference), (&check.runs, check_reference)];
            tables.push(effects_at_both_scales(scales, metrics, recipe, &results.declarations, settings));
        }
    }
    Ok(tables)
}

/// One comparison of one metric, judged: its name in the tables, the metric, the verdict.
#[derive(Debug, Clone)]
pub struct JudgedRow {
    pub comparison: String,
    /// The two arms' labels: the variant and the one it is paired against.
    pub arms: (String, String),
    /// An interaction's other comparison (its variant's label): this row judges the effect of `arms.0`
    /// against `arms.1` minus the effect of that variant against its own reference.
    pub versus: Option<String>,
    pub metric: Metric,
    pub judged: Judged,
    /// Whether the metric is the recipe's primary one (`compare.primary`): its verdicts answer the recipe's
    /// question; the other quality metrics' are secondary.
    pub primary: bool,
}

/// The primary metric's column among `metrics`: the recipe's `compare.primary`, else the first headline
/// metric of model quality (not throughput or utilisation, not a diagnostic).
pub fn primary_column(recipe: &Recipe, metrics: &[Metric]) -> Option<String> {
    if let Some(p) = recipe.compare.as_ref().and_then(|c| c.primary.clone()) {
        return Some(p);
    }
    metrics.iter().filter(|m| !m.diagnostic && !is_cost(m)).find_map(|m| m.column_name()).map(String::from)
}

/// Every comparison a results directory answers, judged at its scale and (with `scale_check/`) at the
/// second; `None` when neither the command line nor the recipe's `compare:` names a comparison.
#[derive(Debug, Clone)]
pub struct Judgements {
    /// What the comparisons pair: `paired against `heads=1` by seed` or the ladder.
    pub pairing: String,
    pub rows: Vec<JudgedRow>,
    /// The second scale's settings and rows.
    pub second: Option<(String, Vec<JudgedRow>)>,
}

/// The [`Judgements`] of a results directory (see [`summary_tables`] for how the pairing and the recipe's
/// `compare:` choose the comparison).
pub fn judgements(results: &Results) -> Result<Option<Judgements>> {
    let (recipe, runs, metrics, variants) = (results.recipe, &results.runs, &results.headline, &results.variants);
    let Some(reference) = resolve_pairing(runs, recipe, results.pairing)? else { return Ok(None) };
    let rows = judge_rows(runs, &reference, metrics, recipe, &results.declarations);
    let mut second = None;
    if let Some((check, settings)) = &results.second {
        let check_reference = second_scale_reference(&reference, variants, check)?;
        let at_check = judge_rows(&check.runs, &check_reference, &check.headline, check.recipe, &check.declarations);
        second = Some((settings.clone(), at_check));
    }
    Ok(Some(Judgements { pairing: describe_reference(&reference, variants), rows, second }))
}

/// The second scale's comparison: the same baseline variant (by label), the ladder, or the same grouping.
fn second_scale_reference(
    reference: &Reference,
    variants: &[(String, Vec<String>)],
    check: &Results,
) -> Result<Reference> {
    Ok(match reference {
        Reference::Baseline(base) => {
            Reference::Baseline(find_baseline(&check.runs, &check.variants, &variants[*base].0)?)
        }
        Reference::Ladder => Reference::Ladder,
        Reference::Within { .. } => {
            resolve_pairing(&check.runs, check.recipe, check.pairing)?.expect("the same comparison")
        }
    })
}

/// Every comparison of `runs` under `reference`, each headline metric judged as one family.
fn judge_rows(
    runs: &[Row],
    reference: &Reference,
    metrics: &[Metric],
    recipe: &Recipe,
    declarations: &Declarations,
) -> Vec<JudgedRow> {
    let variants = variants_of(runs);
    let pairs = reference.pairs(variants.len());
    let primary = primary_column(recipe, metrics);
    let stages = StagePlan::of(recipe);
    let families: Vec<Vec<Judged>> =
        metrics.iter().map(|m| judge(runs, &variants, &pairs, m, delta_of(recipe, m), &stages)).collect();
    let mut rows = Vec::new();
    for (k, &(v, against)) in pairs.iter().enumerate() {
        for (j, m) in metrics.iter().enumerate() {
            rows.push(JudgedRow {
                comparison: comparison_label(reference, &variants, v, against),
                arms: (variants[v].0.clone(), variants[against].0.clone()),
                versus: None,
                metric: declarations.of_variant(&variants[v].0, m),
                judged: families[j][k].clone(),
                primary: m.column_name().is_some() && m.column_name() == primary.as_deref(),
            });
        }
    }
    let interactions = interaction_rows(&rows, recipe, metrics);
    rows.extend(interactions);
    rows
}

/// The interactions the recipe's predictions name (`versus:`), judged on `rows`' comparisons: for each
/// seed every arm of both comparisons ran among the recipe's own seeds, the contrast (A − A's reference) −
/// (B − B's reference); the paired tests of `crate::design` on those contrasts, as a fixed design (a second
/// stage adds seeds for the plain comparisons, so its seeds are not the interaction's plan), Holm-adjusted
/// over the interactions of each metric. δ is A's, in the metric's unit.
fn interaction_rows(rows: &[JudgedRow], recipe: &Recipe, metrics: &[Metric]) -> Vec<JudgedRow> {
    let Some(compare) = &recipe.compare else { return Vec::new() };
    let mut out = Vec::new();
    for m in metrics {
        let Some(column) = m.column_name() else { continue };
        let plain = |label: &str| {
            rows.iter().find(|r| r.versus.is_none() && r.arms.0 == label && r.metric.column_name() == Some(column))
        };
        let asked: Vec<(&JudgedRow, &JudgedRow)> = compare
            .predict
            .iter()
            .filter(|p| p.metric == column)
            .filter_map(|p| Some((plain(&p.comparison)?, plain(p.versus.as_deref()?)?)))
            .collect();
        if asked.is_empty() {
            continue;
        }
        let compared: Vec<(usize, Option<Paired>)> = asked
            .iter()
            .map(|(a, b)| {
                let by_seed = |r: &JudgedRow| -> Vec<(u64, f64)> {
                    r.judged.paired.as_ref().map_or_else(Vec::new, |p| {
                        p.seeds
                            .iter()
                            .zip(&p.differences)
                            .filter(|(s, _)| recipe.seeds.contains(s))
                            .map(|(&s, &d)| (s, d))
                            .collect()
                    })
                };
                let contrast = paired(&by_seed(b), &by_seed(a));
                (contrast.as_ref().map_or(0, |c| c.seeds.len()), contrast)
            })
            .collect();
        let pairs: Vec<(usize, usize)> = asked.iter().map(|(a, _)| (a.judged.variant, a.judged.against)).collect();
        let margins: Vec<f64> = asked.iter().map(|(a, _)| a.judged.delta).collect();
        let delta_texts = asked.iter().map(|(a, _)| a.judged.delta_text.clone()).collect();
        // A fixed design: no pilot named, every shared seed is the one stage.
        let judged = judge_paired(compared, &pairs, &margins, delta_texts, m.higher_is_better, &StagePlan::default());
        for ((a, b), judged) in asked.iter().zip(judged) {
            out.push(JudgedRow {
                comparison: format!("({} − {}) − ({} − {})", a.arms.0, a.arms.1, b.arms.0, b.arms.1),
                arms: a.arms.clone(),
                versus: Some(b.arms.0.clone()),
                metric: a.metric.clone(),
                judged,
                primary: false,
            });
        }
    }
    out
}

/// A comparison's arms (variant, reference), the standard deviation of its paired differences and its δ.
pub type Spread = ((String, String), f64, f64);

/// δ in `column`'s unit for a comparison against the runs `ids`: a share resolves against their mean (NaN
/// without a value).
fn margin(runs: &[Row], ids: &[String], column: &str, delta: Delta) -> f64 {
    let reference: Vec<f64> = seed_values(runs, ids, column).into_iter().map(|(_, v)| v).collect();
    delta.resolve(if reference.is_empty() { f64::NAN } else { Estimate::of(&reference).mean })
}

/// The paired spread of every comparison of the primary metric in the pilot's rows (those of
/// `pilot_seeds`): each comparison's arms, the sample standard deviation of its paired differences (NaN
/// below two pairs) and its δ in the metric's unit; `None` when the recipe names no comparison or no
/// primary metric has a column.
pub fn paired_spreads(results: &Results, pilot_seeds: &[u64]) -> Result<Option<Vec<Spread>>> {
    let (recipe, metrics) = (results.recipe, &results.headline);
    let runs: &[Row] = &super::reading::rows_of_seeds(&results.runs, pilot_seeds);
    let Some(primary) = primary_column(recipe, metrics) else { return Ok(None) };
    let Some(metric) = metrics.iter().find(|m| m.column_name() == Some(primary.as_str())) else { return Ok(None) };
    let Some(reference) = resolve_pairing(runs, recipe, None)? else { return Ok(None) };
    let variants = variants_of(runs);
    let pairs = reference.pairs(variants.len());
    let column = column_of(metric);
    let delta = delta_of(recipe, metric);
    let spreads = pairs
        .iter()
        .zip(compare(runs, &variants, &pairs, &column))
        .map(|(&(v, against), (_, paired))| {
            let margin = margin(runs, &variants[against].1, &column, delta);
            let sd = paired.map_or(f64::NAN, |p| p.difference.std);
            ((variants[v].0.clone(), variants[against].0.clone()), sd, margin)
        })
        .collect();
    Ok(Some(spreads))
}

/// The comparison of `runs`: the command line's `pairing`, else the recipe's `compare:`, else none.
fn resolve_pairing(runs: &[Row], recipe: &Recipe, pairing: Option<Pairing>) -> Result<Option<Reference>> {
    let variants = variants_of(runs);
    let from_recipe = pairing.is_none();
    let pairing = pairing.or(match recipe.compare.as_ref().map(|c| &c.comparison) {
        Some(Comparison::Baseline(b)) => Some(Pairing::Baseline(b)),
        Some(Comparison::Ladder) => Some(Pairing::Ladder),
        None => None,
    });
    // The file's comparison under command-line overrides that pinned the key it reads (a quick run of one
    // arm): nothing to pair, no error (`check_compare` says the same before training).
    if from_recipe && pairing.is_some() && !recipe.overrides.describe().is_empty() {
        let resolved = resolve_pairing(runs, recipe, pairing);
        return Ok(resolved.ok().flatten());
    }
    Ok(match pairing {
        Some(Pairing::Baseline(b)) => Some(match find_baseline(runs, &variants, b) {
            Ok(base) => Reference::Baseline(base),
            // `key=value` shared by several variants of a grid: paired within the levels of the other keys.
            Err(e) => within(recipe, &variants, b).ok_or(e)?,
        }),
        Some(Pairing::Ladder) if variants.len() < 2 => bail!("--ladder needs at least two variants"),
        Some(Pairing::Ladder) => Some(Reference::Ladder),
        None => None,
    })
}

/// Per comparison and headline metric, the verdict at the recipe's scale and at its second scale (each
/// judged over its own scale's family) and what the two say together: `holds at both` (the same decided
/// direction, or equivalent at both), `sign differs`, `one scale only`, `inconclusive at both`.
fn effects_at_both_scales(
    scales: [(&Vec<Row>, Reference); 2],
    metrics: &[Metric],
    recipe: &Recipe,
    declarations: &Declarations,
    settings: &str,
) -> Table {
    let note = format!(
        "Verdicts at both scales ({}): at each scale the paired difference [{:.0}% CI] and its verdict over that \
         scale's family; then whether they agree. Second scale: {settings}.",
        describe_reference(&scales[0].1, &variants_of(scales[0].0)),
        100.0 * CONFIDENCE
    );
    let header =
        ["comparison", "metric", "this scale", "second scale", "across scales"].iter().map(|s| s.to_string()).collect();
    // (comparison label, metric column) -> the judged comparison, at each scale.
    let stages = StagePlan::of(recipe);
    let judged: Vec<BTreeMap<(String, String), Judged>> = scales
        .iter()
        .map(|(runs, reference)| {
            let variants = variants_of(runs);
            let pairs = reference.pairs(variants.len());
            let mut out = BTreeMap::new();
            for m in metrics {
                for j in judge(runs, &variants, &pairs, m, delta_of(recipe, m), &stages) {
                    out.insert((comparison_label(reference, &variants, j.variant, j.against), column_of(m)), j);
                }
            }
            out
        })
        .collect();
    let variants = variants_of(scales[0].0);
    let mut rows = Vec::new();
    for (v, against) in scales[0].1.pairs(variants.len()) {
        let label = comparison_label(&scales[0].1, &variants, v, against);
        for m in metrics {
            let key = (label.clone(), column_of(m));
            let (Some(here), Some(there)) = (judged[0].get(&key), judged[1].get(&key)) else { continue };
            rows.push(vec![
                label.clone(),
                declarations.of_variant(&variants[v].0, m).axis(),
                here.cell(m),
                there.cell(m),
                across_scales(here.verdict, there.verdict).into(),
            ]);
        }
    }
    Table { note, header, rows }
}

fn column_of(m: &Metric) -> String {
    m.column_name().expect("headline metrics are columns").to_string()
}

/// A comparison's name in the tables: the variant (against a baseline) or `variant vs other` (a ladder, or a
/// baseline within the other swept keys), each label [`readable`], with the swept values both sides share
/// said once: `window 32 vs dense (task=listops max_length=500)`.
fn comparison_label(reference: &Reference, variants: &[(String, Vec<String>)], v: usize, against: usize) -> String {
    let labels = readable(&variants.iter().map(|(label, _)| label.clone()).collect::<Vec<_>>());
    match reference {
        Reference::Baseline(_) => labels[v].clone(),
        Reference::Ladder | Reference::Within { .. } => {
            let (a, b): (Vec<&str>, Vec<&str>) = (labels[v].split(' ').collect(), labels[against].split(' ').collect());
            // The trailing `key=value` words both labels end with: the swept values the pairing holds equal.
            let shared = a
                .iter()
                .rev()
                .zip(b.iter().rev())
                .take_while(|(x, y)| x == y && x.contains('='))
                .count()
                .min(a.len() - 1)
                .min(b.len() - 1);
            // Or the leading words both share, where what differs is swept values alone (`width 64 lr=0.1 vs
            // width 64 lr=0.001`: the variant held equal, the swept key compared).
            let leading = a.iter().zip(&b).take_while(|(x, y)| x == y).count().min(a.len() - 1).min(b.len() - 1);
            let swept_only = |words: &[&str]| words.iter().all(|w| w.contains('='));
            match shared {
                0 if leading > 0 && swept_only(&a[leading..]) && swept_only(&b[leading..]) => {
                    format!("{} vs {} ({})", a[leading..].join(" "), b[leading..].join(" "), a[..leading].join(" "))
                }
                0 => format!("{} vs {}", labels[v], labels[against]),
                n => format!(
                    "{} vs {} ({})",
                    a[..a.len() - n].join(" "),
                    b[..b.len() - n].join(" "),
                    a[a.len() - n..].join(" ")
                ),
            }
        }
    }
}

/// (section key, its fields, the byte range of `key={…}`) of every inline section value in a label.
type Sections = Vec<(String, Vec<(String, String)>, std::ops::Range<usize>)>;

fn sections(label: &str) -> Sections {
    let mut out = Vec::new();
    let mut from = 0;
    while let Some(at) = label[from..].find("={").map(|i| from + i) {
        let start = label[..at].rfind(' ').map_or(0, |i| i + 1);
        let mut depth = 0;
        let mut end = None;
        for (i, c) in label[at + 1..].char_indices() {
            match c {
                '{' | '[' => depth += 1,
                '}' | ']' => depth -= 1,
                _ => {}
            }
            if depth == 0 {
                end = Some(at + 1 + i);
                break;
            }
        }
        let Some(end) = end else { break };
        let body = &label[at + 2..end];
        let mut fields = Vec::new();
        let (mut depth, mut field_start) = (0, 0);
        for (i, c) in body.char_indices().chain(std::iter::once((body.len(), ','))) {
            match c {
                '{' | '[' => depth += 1,
                '}' | ']' => depth -= 1,
                ',' if depth == 0 => {
                    if let Some((k, v)) = body[field_start..i].split_once(':') {
                        fields.push((k.to_string(), v.to_string()));
                    }
                    field_start = i + 1;
                }
                _ => {}
            }
        }
        out.push((label[start..at].to_string(), fields, start..end + 1));
        from = end + 1;
    }
    out
}

/// Labels as tables show them: a swept section's inline value (`seq_classify={task:listops,min_length:200,
/// train_examples:8000}`) becomes the fields whose values differ between `labels` (`task=listops
/// min_length=200`; a field one label lacks differs), so a row names what varies, not a whole configuration.
pub fn readable(labels: &[String]) -> Vec<String> {
    let parsed: Vec<Sections> = labels.iter().map(|l| sections(l)).collect();
    let value_of = |label: usize, key: &str, field: &str| -> Option<String> {
        parsed[label].iter().find(|(k, _, _)| k == key)?.1.iter().find(|(f, _)| f == field).map(|(_, v)| v.clone())
    };
    labels
        .iter()
        .enumerate()
        .map(|(i, label)| {
            let mut out = label.clone();
            for (key, fields, range) in parsed[i].iter().rev() {
                let differing: Vec<String> = fields
                    .iter()
                    .filter(|(field, value)| (0..labels.len()).any(|j| value_of(j, key, field).as_ref() != Some(value)))
                    .map(|(field, value)| format!("{field}={value}"))
                    .collect();
                out.replace_range(range.clone(), &differing.join(" "));
            }
            out.split_whitespace().collect::<Vec<_>>().join(" ")
        })
        .collect()
}

fn describe_reference(reference: &Reference, variants: &[(String, Vec<String>)]) -> String {
    match reference {
        Reference::Baseline(base) => format!("paired against `{}` by seed", variants[*base].0),
        Reference::Ladder => "each variant paired with the one before it, by seed".into(),
        Reference::Within { baseline, .. } => format!(
            "each variant paired by seed with the variant that has `{baseline}` and the same values of the other swept keys"
        ),
    }
}

/// [`Reference::Within`] for `spec` (`key=value` of a swept key, or of the `variant` list), from the swept
/// values the recipe gives each label; `None` when `spec` names no swept key or pairs nothing.
fn within(recipe: &Recipe, variants: &[(String, Vec<String>)], spec: &str) -> Option<Reference> {
    let (key, value) = spec.split_once('=')?;
    let (key, value) = (key.trim(), value.trim());
    let swept = |label: &str| -> Option<&Vec<(String, String)>> {
        recipe.runs.iter().find(|r| r.label == label).map(|r| &r.swept)
    };
    let matches_key = |k: &str| k == key || k.ends_with(&format!(".{key}"));
    let same_value =
        |a: &str| a == value || matches!((a.parse::<f64>(), value.parse::<f64>()), (Ok(x), Ok(y)) if x == y);
    let mut pairs = Vec::new();
    for (v, (label, _)) in variants.iter().enumerate() {
        let mine = swept(label)?;
        let (_, my_value) = mine.iter().find(|(k, _)| matches_key(k))?;
        if same_value(my_value) {
            continue;
        }
        let reference = variants.iter().position(|(other, _)| {
            swept(other).is_some_and(|theirs| {
                theirs.iter().zip(mine).all(|((k, a), (_, b))| if matches_key(k) { same_value(a) } else { a == b })
            })
        });
        if let Some(r) = reference {
            pairs.push((v, r));
        }
    }
    (!pairs.is_empty()).then(|| Reference::Within { baseline: format!("{key}={value}"), pairs })
}

/// The smallest effect that matters for `m` in `recipe`: its `compare.delta` entry, else the default of its
/// kind of metric.
pub fn delta_of(recipe: &Recipe, m: &Metric) -> Delta {
    let column = column_of(m);
    recipe
        .compare
        .as_ref()
        .and_then(|c| c.delta.get(&column).copied())
        .unwrap_or_else(|| default_delta(&column, m.unit))
}

/// Refuses, in one line, a `compare.delta` entry that names no headline metric of the recipe's kinds, and
/// a `compare.baseline` that names no variant (or no level of a swept key) of the recipe's runs.
pub fn check_compare(recipe: &Recipe) -> Result<()> {
    let Some(compare) = &recipe.compare else { return Ok(()) };
    super::sensitivity::check(recipe)?;
    super::compute::check(recipe)?;
    // The rows runs.csv will have (metrics empty), final runs only: resolved as the summary will.
    let untrained = crate::train::RunOutcome {
        metrics: Default::default(),
        diverged_at: None,
        resumed_from: 0,
        curves: Vec::new(),
        sample: String::new(),
    };
    let rows: Vec<Row> = recipe
        .runs
        .iter()
        .filter(|r| r.tune.is_none_or(|t| t.rung.is_none()))
        .map(|r| {
            let header = super::reading::run_header(r);
            header.into_iter().zip(super::reading::run_row(r, &untrained)).collect()
        })
        .collect();
    // Command-line overrides may pin the swept key the comparison reads (`transformer.heads=4` for a quick
    // run): the file's comparison then has nothing to pair, which is no error in the recipe.
    let narrowed = !recipe.overrides.describe().is_empty();
    if let Comparison::Baseline(b) = &compare.comparison {
        if let Err(e) = resolve_pairing(&rows, recipe, Some(Pairing::Baseline(b))) {
            if !narrowed {
                bail!("{}: compare.baseline: {e:#}", recipe.file);
            }
        }
    }
    let labels: Vec<String> = variants_of(&rows).into_iter().map(|v| v.0).collect();
    for (i, p) in compare.predict.iter().enumerate() {
        let named = [("comparison", Some(&p.comparison)), ("versus", p.versus.as_ref())];
        for (field, label) in named.into_iter().filter_map(|(f, l)| Some((f, l?))) {
            if !labels.contains(label) && !narrowed {
                bail!(
                    "{}: compare.predict.{i}.{field}: no variant `{label}`; the variants are {}",
                    recipe.file,
                    labels.join(", ")
                );
            }
        }
    }
    let declared = crate::tasks::recipe_metrics(recipe);
    let metrics: Vec<String> =
        declared.iter().filter(|m| m.headline).filter_map(|m| m.column_name().map(String::from)).collect();
    for (i, p) in compare.predict.iter().enumerate() {
        if !metrics.contains(&p.metric) {
            bail!(
                "{}: compare.predict.{i}.metric: no headline metric `{}` in this recipe; its metrics are {}",
                recipe.file,
                p.metric,
                metrics.join(", ")
            );
        }
    }
    if let Some(primary) = &compare.primary {
        let quality: Vec<&str> = declared
            .iter()
            .filter(|m| m.headline && !m.diagnostic && !is_cost(m))
            .filter_map(|m| m.column_name().map(|c| metrics.iter().find(|x| *x == c).map(String::as_str)))
            .flatten()
            .collect();
        if !quality.contains(&primary.as_str()) {
            bail!(
                "{}: compare.primary: `{primary}` is not a headline metric of model quality in this recipe; those are {}",
                recipe.file,
                quality.join(", ")
            );
        }
    }
    for column in compare.delta.keys() {
        if !metrics.contains(column) {
            bail!(
                "{}: compare.delta.{column}: no headline metric `{column}` in this recipe; its metrics are {}",
                recipe.file,
                metrics.join(", ")
            );
        }
    }
    Ok(())
}

/// One comparison of a family, judged: the difference test, the equivalence test at ±δ and the margin
/// test, each Holm-adjusted over the family, and the verdict.
#[derive(Debug, Clone)]
pub struct Judged {
    pub variant: usize,
    pub against: usize,
    /// Seeds both ran.
    pub shared: usize,
    /// The differences over every shared seed (their mean is the difference shown).
    pub paired: Option<Paired>,
    /// The design's 95% interval of the difference (the paired t interval with one stage; the combination
    /// test's with two).
    pub interval: Option<(f64, f64)>,
    pub analysis: Analysis,
    /// The difference test's p before Holm (the paired t-test's with one stage, the combination test's with two).
    pub p_raw: f64,
    pub p_holm: f64,
    pub equivalence_p_holm: f64,
    /// The margin test in the direction of the observed difference ("beyond δ").
    pub margin_p_holm: f64,
    /// δ in the metric's unit, and as declared (`0.01`, `5%`).
    pub delta: f64,
    pub delta_text: String,
    pub verdict: Verdict,
}

impl Judged {
    /// `−0.0123 [−0.02, −0.005]: better` for a scale's cell.
    fn cell(&self, m: &Metric) -> String {
        match &self.paired {
            Some(p) => format!("{}: {}", self.difference(p, m.digits), self.verdict.describe(&self.delta_text)),
            None => self.verdict.describe(&self.delta_text),
        }
    }

    /// The mean difference with the design's interval (the paired t interval, or the two-stage one).
    fn difference(&self, p: &Paired, digits: usize) -> String {
        match self.interval {
            Some((lo, hi)) => format!("{:+.digits$} [{lo:+.digits$}, {hi:+.digits$}]", p.difference.mean),
            None => format_difference(&p.difference, digits),
        }
    }
}

/// Which seeds of a results directory are its pilot (the recipe's own) and whether the recipe's plan adds
/// a second stage: what splits each comparison into the stages of `crate::design`.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct StagePlan {
    pub pilot: Vec<u64>,
    pub two_stage: bool,
}

impl StagePlan {
    /// The recipe's stages: its seeds are the pilot; its plan says whether seeds are added.
    pub fn of(recipe: &Recipe) -> StagePlan {
        StagePlan {
            pilot: recipe.seeds.clone(),
            two_stage: recipe.compare.as_ref().is_some_and(|c| c.two_stage(recipe.seeds.len())),
        }
    }

    /// `paired`'s differences by stage (with no pilot named, every seed is the one stage).
    fn split(&self, paired: &Paired) -> Stages {
        let (mut pilot, mut added) = (Vec::new(), Vec::new());
        for (seed, d) in paired.seeds.iter().zip(&paired.differences) {
            if self.pilot.is_empty() || self.pilot.contains(seed) {
                pilot.push(*d);
            } else {
                added.push(*d);
            }
        }
        Stages { pilot, added, planned: self.two_stage }
    }
}

/// Judges a family of comparisons (`pairs`, one metric) under the design of `stages`: each comparison's
/// difference test, TOST at ±δ and margin tests (one stage: the paired t-tests; two: the inverse-normal
/// combination of `crate::design`), each Holm-adjusted over the family, and the verdict by
/// [`Verdict::decide`]. An inconclusive comparison names the seeds that would settle it in a fixed design
/// at the family's Bonferroni level α/m (Holm's first step), from the paired spread and δ alone.
pub fn judge(
    runs: &[Row],
    variants: &[(String, Vec<String>)],
    pairs: &[(usize, usize)],
    m: &Metric,
    delta: Delta,
    stages: &StagePlan,
) -> Vec<Judged> {
    let column = column_of(m);
    let compared = compare(runs, variants, pairs, &column);
    let margins: Vec<f64> =
        pairs.iter().map(|&(_, against)| margin(runs, &variants[against].1, &column, delta)).collect();
    let delta_texts = margins
        .iter()
        .map(|&resolved| match delta {
            Delta::Absolute(_) => delta.text(),
            Delta::Relative(_) => format!("{} = {}", delta.text(), format_margin(resolved)),
        })
        .collect();
    judge_paired(compared, pairs, &margins, delta_texts, m.higher_is_better, stages)
}

/// Judges one family of paired comparisons — for each of `pairs`, the seeds it shared and its paired
/// differences (`None` below two), with its margin in the metric's unit and as written — under the design of
/// `stages`: the tests of `crate::design`, Holm-adjusted over the family, and the verdicts.
fn judge_paired(
    compared: Vec<(usize, Option<Paired>)>,
    pairs: &[(usize, usize)],
    margins: &[f64],
    delta_texts: Vec<String>,
    higher_is_better: bool,
    stages: &StagePlan,
) -> Vec<Judged> {
    let split: Vec<Option<Stages>> = compared.iter().map(|(_, p)| p.as_ref().map(|p| stages.split(p))).collect();
    let evidence: Vec<Evidence> = split
        .iter()
        .zip(margins)
        .map(|(s, &d)| match s {
            Some(s) if d.is_finite() && d > 0.0 => Evidence::of(s, d),
            _ => Evidence::untestable(),
        })
        .collect();
    let family = evidence.iter().filter(|e| !e.difference.is_nan()).count().max(1);
    let seeds: Vec<Option<usize>> = compared
        .iter()
        .zip(margins)
        .map(|((_, p), &d)| p.as_ref().and_then(|p| seeds_to_settle(p.difference.std, d, ALPHA / family as f64)))
        .collect();
    let (adjusted, verdicts) = judge_family(&evidence, higher_is_better, &seeds);
    compared
        .into_iter()
        .zip(pairs)
        .zip(delta_texts)
        .enumerate()
        .map(|(k, (((shared, paired), &(variant, against)), delta_text))| {
            let verdict = if paired.is_some() { verdicts[k] } else { Verdict::Untested };
            let margin_p_holm =
                if evidence[k].mean > 0.0 { adjusted.above_margin[k] } else { adjusted.below_margin[k] };
            Judged {
                variant,
                against,
                shared,
                interval: split[k].as_ref().and_then(Stages::interval),
                analysis: split[k].as_ref().map_or(Analysis::Fixed, Stages::analysis),
                paired,
                p_raw: evidence[k].difference,
                p_holm: adjusted.difference[k],
                equivalence_p_holm: adjusted.equivalence[k],
                margin_p_holm,
                delta: margins[k],
                delta_text,
                verdict,
            }
        })
        .collect()
}

/// A margin resolved from a share: three significant digits.
fn format_margin(x: f64) -> String {
    if !x.is_finite() {
        return "–".into();
    }
    let digits = (2 - x.abs().log10().floor() as i32).max(0) as usize;
    format!("{x:.digits$}")
}

/// A paired difference with its interval: `+0.0123 [+0.0050, +0.0196]`.
fn format_difference(e: &Estimate, digits: usize) -> String {
    match e.half_width {
        Some(h) => format!("{:+.digits$} [{:+.digits$}, {:+.digits$}]", e.mean, e.mean - h, e.mean + h),
        None => format!("{:+.digits$}", e.mean),
    }
}

/// What tuning cost, from every row of `runs.csv` (`all`): optimisation steps and wall time of the tuning
/// runs against the final runs.
fn tuning_cost(all: &[Row], tuning: &crate::recipe::Tuning) -> Table {
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
    Table { note, header, rows }
}

/// Paired differences (variant − its reference) over the seeds both ran, per headline metric: the paired
/// t-test's p raw and Holm-adjusted over its family (the comparisons of one metric), TOST's p at ±δ
/// Holm-adjusted over the same family, and the verdict: better / worse, equivalent within ±δ, or
/// inconclusive with the seeds that would settle it.
fn paired_table(
    runs: &[Row],
    variants: &[(String, Vec<String>)],
    reference: &Reference,
    metrics: &[Metric],
    deltas: &[Delta],
    stages: &StagePlan,
    own_metric: impl Fn(usize, &Metric) -> Metric,
) -> Table {
    let confidence = 100.0 * CONFIDENCE;
    let pairs = reference.pairs(variants.len());
    let others = pairs.len();
    let (what, family) = match reference {
        Reference::Baseline(base) => (
            format!("Paired against `{}`: per seed the difference variant − baseline", variants[*base].0),
            "with the baseline",
        ),
        Reference::Ladder => (
            "As a ladder: each variant paired with the one listed before it, per seed the difference variant − \
             previous"
                .to_string(),
            "along the ladder",
        ),
        Reference::Within { baseline, .. } => (
            format!(
                "Within each level of the other swept keys: each variant paired with the one that has `{baseline}`, \
                 per seed the difference variant − that one"
            ),
            "",
        ),
    };
    let note = format!(
        "{what}; mean difference [{confidence:.0}% CI of the design: the paired t interval over the recipe's seeds, \
         or the two-stage combination test's where seeds were added]; the difference test's two-sided p (the \
         paired t-test, or the two-stage combination test), raw and Holm–Bonferroni-adjusted over the family of \
         the {others} comparison(s) of that metric {family}; the equivalence test's p (TOST at ±δ, \
         Holm-adjusted over the same family). Verdict: better or worse where the adjusted difference p is below \
         {ALPHA} (by more than δ where the interval lies beyond it); equivalent where the adjusted TOST p is (no difference larger than \
         δ either way); otherwise inconclusive, with the seeds that would give power {POWER} to both tests at δ \
         (from the paired spread and δ only, at the family's level α/m). δ per metric: the recipe's \
         `compare.delta`, else its kind's default. Fewer than two shared seeds: no test."
    );
    let header = [
        "comparison",
        "metric",
        "pairs",
        &format!("mean difference [{confidence:.0}% CI]"),
        "p",
        "p (Holm)",
        "δ",
        "p equivalent (Holm)",
        "verdict",
        "per-seed differences",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    // Every comparison first, so that each metric's family is judged together.
    let judged: Vec<Vec<Judged>> =
        metrics.iter().zip(deltas).map(|(m, &d)| judge(runs, variants, &pairs, m, d, stages)).collect();
    let mut rows = Vec::new();
    for (k, &(v, against)) in pairs.iter().enumerate() {
        let label = comparison_label(reference, variants, v, against);
        for (j, m) in metrics.iter().enumerate() {
            rows.push(paired_row(&label, &own_metric(v, m), &judged[j][k]));
        }
    }
    Table { note, header, rows }
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

/// One row of the paired table.
fn paired_row(label: &str, m: &Metric, j: &Judged) -> Vec<String> {
    let digits = m.digits;
    let Some(p) = &j.paired else {
        let mut row = vec![label.to_string(), m.axis(), j.shared.to_string()];
        row.extend(["–", "–", "–"].map(String::from));
        row.extend([j.delta_text.clone(), "–".into(), j.verdict.describe(&j.delta_text), "–".into()]);
        return row;
    };
    let diffs: Vec<String> =
        p.seeds.iter().zip(&p.differences).map(|(s, d)| format!("seed {s}: {d:+.digits$}")).collect();
    vec![
        label.to_string(),
        m.axis(),
        p.seeds.len().to_string(),
        j.difference(p, digits),
        format_p(j.p_raw),
        format_p(j.p_holm),
        j.delta_text.clone(),
        format_p(j.equivalence_p_holm),
        j.verdict.describe(&j.delta_text),
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
pub fn plan_table(results: &Results, baseline: Option<&str>, effects: &[Effect]) -> Result<Table> {
    let (dir, recipe, runs, metrics, variants) =
        (&results.dir, results.recipe, &results.runs, &results.headline, &results.variants);
    let base = match baseline {
        Some(b) => find_baseline(runs, variants, b)?,
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
    for m in metrics {
        let column = m.column_name().expect("filtered to columns");
        let sds: Vec<f64> = against_baseline(runs, variants, base, column)
            .into_iter()
            .filter_map(|(_, p)| Some(p?.difference.std))
            .collect();
        let digits = m.digits + 1;
        if sds.is_empty() {
            let heading = results.declarations.heading(m);
            rows.push(vec![heading, "0".into(), "–".into(), seeds.to_string(), "–".into(), "–".into(), "–".into()]);
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
            results.declarations.heading(m),
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

    use super::*;

    #[test]
    fn a_swept_section_is_named_by_the_fields_that_differ_and_shared_values_are_said_once() {
        let labels: Vec<String> = [
            "dense seq_classify={task:listops,min_length:200,max_length:500,train_examples:8000}",
            "window 32 seq_classify={task:listops,min_length:200,max_length:500,train_examples:8000}",
            "dense seq_classify={task:bytes,max_length:1024,train_examples:8000}",
            "window 32 seq_classify={task:bytes,max_length:1024,train_examples:8000}",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        assert_eq!(
            readable(&labels),
            [
                "dense task=listops min_length=200 max_length=500",
                "window 32 task=listops min_length=200 max_length=500",
                "dense task=bytes max_length=1024",
                "window 32 task=bytes max_length=1024",
            ]
        );
        let variants: Vec<(String, Vec<String>)> = labels.iter().map(|l| (l.clone(), Vec::new())).collect();
        let within = Reference::Within { baseline: "variant=dense".into(), pairs: Vec::new() };
        assert_eq!(
            comparison_label(&within, &variants, 1, 0),
            "window 32 vs dense (task=listops min_length=200 max_length=500)"
        );
        assert_eq!(comparison_label(&within, &variants, 3, 2), "window 32 vs dense (task=bytes max_length=1024)");
        // Labels without a section, and nothing shared, are as they were.
        let plain: Vec<(String, Vec<String>)> =
            ["heads=1", "heads=2"].iter().map(|l| (l.to_string(), Vec::new())).collect();
        assert_eq!(comparison_label(&Reference::Ladder, &plain, 1, 0), "heads=2 vs heads=1");
        // A variant held equal while a swept key is compared: the variant said once; a ladder's rungs that
        // only share a word stay whole.
        let widths: Vec<(String, Vec<String>)> = ["width 64 lr=0.001", "width 64 lr=0.1", "+ rope", "+ qk_norm"]
            .iter()
            .map(|l| (l.to_string(), Vec::new()))
            .collect();
        assert_eq!(comparison_label(&within, &widths, 1, 0), "lr=0.1 vs lr=0.001 (width 64)");
        assert_eq!(comparison_label(&Reference::Ladder, &widths, 3, 2), "+ qk_norm vs + rope");
        assert_eq!(comparison_label(&Reference::Baseline(0), &plain, 1, 0), "heads=2");
    }
    use crate::stats::holm;

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
        let table = paired_table(
            &runs,
            &variants,
            &Reference::Baseline(0),
            &[metric],
            &[Delta::Absolute(0.01)],
            &StagePlan::default(),
            |_, m| m.clone(),
        );
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
            assert_eq!(row[8].starts_with("better"), q < ALPHA, "{row:?}");
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
        let ladder = paired_table(
            &runs,
            &variants,
            &Reference::Ladder,
            &[metric],
            &[Delta::Absolute(0.01)],
            &StagePlan::default(),
            |_, m| m.clone(),
        );
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

    /// Against the baseline at δ = 0.1 and 0.01: the paired and equivalence p-values, Holm-adjusted, as
    /// statsmodels' `ttest_rel`, `ttost_paired(variant, base, -δ, δ)` and `multipletests(method="holm")`
    /// give them (values computed once with statsmodels 0.15.0 and SciPy).
    #[test]
    fn verdicts_are_better_equivalent_or_inconclusive_with_the_seeds_that_would_settle_it() {
        let (runs, variants, metric) = four_variants();
        let pairs = Reference::Baseline(0).pairs(variants.len());
        let wide = judge(&runs, &variants, &pairs, &metric, Delta::Absolute(0.1), &StagePlan::default());
        let expected_p = [0.06781643, 0.00995028, 0.85997199];
        let expected_equivalence = [0.0049377, 0.5, 0.02846345];
        for (j, (p, e)) in wide.iter().zip(expected_p.iter().zip(expected_equivalence)) {
            assert!((j.p_holm - p).abs() < 1e-6 && (j.equivalence_p_holm - e).abs() < 1e-6, "{j:?}");
        }
        let words: Vec<String> = wide.iter().map(|j| j.verdict.describe(&j.delta_text)).collect();
        assert_eq!(words, ["equivalent (±0.1)", "better", "equivalent (±0.1)"]);
        // At δ = 0.01 nothing is equivalent: the small gain and the noise are inconclusive, each naming the
        // seeds its spread needs at the family's level 0.05/3, more for the noisier one.
        let narrow = judge(&runs, &variants, &pairs, &metric, Delta::Absolute(0.01), &StagePlan::default());
        assert!(narrow.iter().all(|j| j.equivalence_p_holm == 1.0));
        let seeds = |j: &Judged| match j.verdict {
            Verdict::Inconclusive { seeds: Some(n) } => n,
            v => panic!("{v:?}"),
        };
        let (small, noise) = (seeds(&narrow[0]), seeds(&narrow[2]));
        let sd = |j: &Judged| j.paired.as_ref().unwrap().difference.std;
        assert_eq!(Some(small), seeds_to_settle(sd(&narrow[0]), 0.01, ALPHA / 3.0));
        assert!(noise > small, "{noise} vs {small}");
        assert!(matches!(narrow[1].verdict, Verdict::Better { negligible: false, .. }), "{:?}", narrow[1].verdict);
        // A share of the reference's mean: 5% of the baseline's 1.0167.
        let relative = judge(&runs, &variants, &pairs, &metric, Delta::Relative(0.05), &StagePlan::default());
        assert!((relative[0].delta - 0.05 * 3.05 / 3.0).abs() < 1e-12 && relative[0].delta_text == "5% = 0.0508");
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
