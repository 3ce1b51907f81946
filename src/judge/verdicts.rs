//! The verdict block of a results README: every comparison its `runs.csv` answers, judged by
//! [`super::summary::judgements`] (better / worse / equivalent within ±δ / inconclusive with the seeds that
//! would settle it, and across scales), written between two markers by `ablate summary … --readme`. The
//! opening marker holds the command that wrote it, so a test can regenerate every committed block from its
//! CSVs and fail when one differs: prose around a block may explain it, never outrun it.
use anyhow::{bail, Result};
use std::path::Path;

use super::reading::Results;
use super::summary::{judgements, JudgedRow, Judgements};
use crate::files::write_atomically;
use crate::metrics::is_cost;
use crate::recipe::compare::{seeds, Expect, Prediction};
use crate::stats::{across_scales, Verdict, ALPHA};

/// The opening marker's start; the command that wrote the block follows it.
pub const BEGIN: &str = "<!-- verdicts: written by `";
/// The closing marker.
pub const END: &str = "<!-- end of verdicts -->";

/// Whether a metric measures the model (loss, accuracy) rather than the machine (throughput, MFU) or a
/// diagnostic (a token-norm ratio): only these are verdicts of model quality.
pub fn is_quality(row: &JudgedRow) -> bool {
    !row.metric.diagnostic && row.metric.column_name().is_some() && !is_cost(&row.metric)
}

/// How many of `rows` (the primary metric's only: the verdicts that answer the recipe's question) ended in
/// each verdict: `(better, worse, equivalent, inconclusive, untested, incomplete)`.
pub fn counts(rows: &[JudgedRow]) -> [usize; 6] {
    count(rows.iter().filter(|r| r.primary))
}

/// [`counts`] of the secondary quality metrics (interactions are counted apart: they are predictions' own).
pub fn secondary_counts(rows: &[JudgedRow]) -> [usize; 6] {
    count(rows.iter().filter(|r| !r.primary && r.versus.is_none() && is_quality(r)))
}

fn count<'a>(rows: impl Iterator<Item = &'a JudgedRow>) -> [usize; 6] {
    let mut out = [0; 6];
    for r in rows {
        let i = match r.judged.verdict {
            Verdict::Better { .. } => 0,
            Verdict::Worse { .. } => 1,
            Verdict::Equivalent => 2,
            Verdict::Inconclusive { .. } => 3,
            Verdict::Untested => 4,
            Verdict::Incomplete { .. } => 5,
        };
        out[i] += 1;
    }
    out
}

fn count_line(counted: [usize; 6], what: &str) -> String {
    let [better, worse, equivalent, inconclusive, untested, incomplete] = counted;
    let total = better + worse + equivalent + inconclusive + untested + incomplete;
    let tested = better + worse + equivalent + inconclusive;
    if tested == 0 && incomplete == 0 {
        return format!("{total} comparison(s) of {what}, all untested (one seed per variant, or differences with no spread: no paired test)");
    }
    let share = if tested > 0 { 100.0 * inconclusive as f64 / tested as f64 } else { 0.0 };
    let mut line = format!(
        "{total} comparison(s) of {what}: {better} better, {worse} worse, {equivalent} equivalent within \
         ±δ, {inconclusive} inconclusive ({share:.0}% of those tested)"
    );
    if incomplete > 0 {
        line.push_str(&format!(", {incomplete} incomplete (the plan's second stage not run)"));
    }
    if untested > 0 {
        line.push_str(&format!(", {untested} untested (one seed, or differences with no spread)"));
    }
    line
}

fn difference(row: &JudgedRow) -> String {
    let digits = row.metric.digits;
    match (&row.judged.paired, row.judged.interval) {
        (Some(p), Some((lo, hi))) => {
            format!("{:+.digits$} [{:+.digits$}, {:+.digits$}]", p.difference.mean, lo, hi)
        }
        (Some(p), None) => format!("{:+.digits$}", p.difference.mean),
        (None, _) => "–".into(),
    }
}

fn verdict(row: &JudgedRow) -> String {
    row.judged.verdict.describe(&row.judged.delta_text)
}

/// The block's text (markers included) for a results directory, written by `command`.
pub fn block(results: &Results, command: &str) -> Result<String> {
    let recipe = results.recipe;
    let Some(j) = judgements(results)? else {
        bail!(
            "{}: no comparison to judge: give --baseline or --ladder, or a `compare:` section in the recipe",
            recipe.file
        );
    };
    if let Some(refusal) = plan_written_after_refusal(results) {
        bail!("{}: {refusal}", recipe.file);
    }
    let primary = j.rows.iter().find(|r| r.primary).and_then(|r| r.metric.column_name().map(String::from));
    let mut text = render(&j, command, &plan_line(results, primary.as_deref()));
    if let Some(compare) = recipe.compare.as_ref().filter(|c| !c.predict.is_empty()) {
        let predictions = predictions_table(&j.rows, &compare.predict, &results.recorded.predictions);
        // Inside the block: the closing marker stays last.
        text = text.replace(END, &format!("{predictions}{END}"));
    }
    if let Some(column) = &primary {
        if let Some(sensitivity) = super::sensitivity::section(results, column)? {
            text = text.replace(END, &format!("{sensitivity}{END}"));
        }
        if let Some(compute) = super::compute::section(results, column)? {
            text = text.replace(END, &format!("{compute}{END}"));
        }
    }
    Ok(text)
}

/// A prediction set against the verdict: `reproduced` (the predicted direction, significant after Holm —
/// and beyond δ where the prediction says so; "in direction only" when the whole difference lies within ±δ,
/// or, for a prediction beyond δ, when the difference is shown but not its size), `consistent` (equivalent
/// within ±δ, or a difference within ±δ, where no effect was predicted), `not reproduced` (equivalent within
/// ±δ where an effect was predicted, the opposite direction, or an effect larger than δ where none was),
/// `inconclusive`, `incomplete` (the design's second stage unfinished), `untested`.
pub fn prediction_outcome(expect: Expect, verdict: Verdict) -> &'static str {
    use Expect::{Better as B, BetterBeyondDelta as BB, Equivalent as E, Worse as W, WorseBeyondDelta as WB};
    use Verdict::*;
    match (expect, verdict) {
        (_, Inconclusive { .. }) => "inconclusive",
        (_, Incomplete { .. }) => "incomplete (the plan's second stage has not run)",
        (_, Untested) => "untested",
        (E, Equivalent) => "consistent",
        (B | W | BB | WB, Equivalent) => "not reproduced (equivalent within ±δ)",
        (E, Better { negligible: true, .. } | Worse { negligible: true, .. }) => "consistent (a difference, within ±δ)",
        (E, Better { .. } | Worse { .. }) => "not reproduced (an effect beyond ±δ)",
        (B | BB, Worse { .. }) | (W | WB, Better { .. }) => "not reproduced (the opposite direction)",
        (BB, Better { beyond: true, .. }) | (WB, Worse { beyond: true, .. }) => "reproduced",
        (BB, Better { .. }) | (WB, Worse { .. }) => {
            "reproduced in direction only (a difference larger than δ is not shown)"
        }
        (B, Better { negligible: false, .. }) | (W, Worse { negligible: false, .. }) => "reproduced",
        (B, Better { negligible: true, .. }) | (W, Worse { negligible: true, .. }) => {
            "reproduced in direction only (the whole difference is within ±δ)"
        }
    }
}

/// One prediction's verdict text and outcome in `rows` (the judged comparisons of its results), the outcome
/// marked post hoc when the results did not run against it (`as_run`, their recorded predictions).
pub fn prediction_result(rows: &[JudgedRow], p: &Prediction, as_run: &[Prediction]) -> (String, String) {
    let (verdict_text, outcome) = match predicted_row(rows, p) {
        Some(r) => (verdict(r), prediction_outcome(p.expect, r.judged.verdict).to_string()),
        None => ("–".into(), "no such comparison in these results".into()),
    };
    let post_hoc = match as_run.iter().find(|q| q.same_claim(p)) {
        None => " (post hoc: not the prediction these results ran against)",
        Some(q) if q.role != p.role => " (its role given after the run)",
        Some(_) => "",
    };
    (verdict_text, format!("{outcome}{post_hoc}"))
}

/// The measured difference of a prediction's comparison, with its 95% interval ("–" without one).
pub fn prediction_measured(rows: &[JudgedRow], p: &Prediction) -> String {
    predicted_row(rows, p).map_or_else(|| "–".into(), difference)
}

/// The comparison a prediction is about: its variant against the baseline (with `versus`, the interaction
/// row of the two comparisons), on its metric.
fn predicted_row<'a>(rows: &'a [JudgedRow], p: &Prediction) -> Option<&'a JudgedRow> {
    rows.iter()
        .find(|r| r.arms.0 == p.comparison && r.versus == p.versus && r.metric.column_name() == Some(p.metric.as_str()))
}

/// What a prediction is about, as a table names it: its variant, or an interaction "A beyond B" (A's effect
/// minus B's).
pub fn predicted_claim(p: &Prediction) -> String {
    match &p.versus {
        None => p.comparison.clone(),
        Some(b) => format!("{}, beyond {b} (interaction)", p.comparison),
    }
}

/// How a prediction's expectation is written.
pub fn expect_word(expect: Expect) -> &'static str {
    match expect {
        Expect::Better => "better",
        Expect::Worse => "worse",
        Expect::BetterBeyondDelta => "better by more than δ",
        Expect::WorseBeyondDelta => "worse by more than δ",
        Expect::Equivalent => "equivalent",
    }
}

/// Each prediction against its comparison's verdict ([`prediction_outcome`]); a prediction the results
/// did not run against (written or edited after them) is marked post hoc.
pub fn predictions_table(rows: &[JudgedRow], predict: &[Prediction], as_run: &[Prediction]) -> String {
    let mut out = String::from(
        "\n**Predictions** (the recipe's `compare.predict`, written before the run and recorded in \
         `recipe.resolved.yaml`): *reproduced* is the predicted direction after Holm; *consistent*, equivalence \
         within ±δ where no effect was predicted; *not reproduced*, equivalence where an effect was predicted or \
         the opposite direction. A *control* is a large published effect that checks the implementation and the \
         regime; a *test*, a genuine question.\n\n| comparison | role | metric | predicted | source | verdict | outcome |\n|---|---|---|---|---|---|---|\n",
    );
    let mut post_hoc = 0;
    for p in predict {
        let (verdict_text, outcome) = prediction_result(rows, p, as_run);
        post_hoc += usize::from(!as_run.iter().any(|q| q.same_claim(p)));
        out.push_str(&format!(
            "| {} | {} | {} | {} | {} | {verdict_text} | {outcome} |\n",
            predicted_claim(p),
            p.role.map_or("–", |r| r.word()),
            p.metric,
            expect_word(p.expect),
            p.source
        ));
    }
    if post_hoc > 0 {
        out.push_str(&format!(
            "\n{post_hoc} of {} prediction(s) differ from those recorded when these results were made: their outcomes are post hoc.\n",
            predict.len()
        ));
    }
    out
}

/// What a row is in the block: the primary metric's verdict, a secondary quality metric's, the machine's
/// cost, or a diagnostic.
fn role(row: &JudgedRow) -> &'static str {
    if row.versus.is_some() {
        "interaction"
    } else if row.primary {
        "primary"
    } else if is_quality(row) {
        "secondary"
    } else if row.metric.diagnostic {
        "diagnostic"
    } else {
        "cost"
    }
}

/// The rows in the block's order: the primary metric's first, then secondary, diagnostics and cost, each in
/// the order of the comparisons.
fn ordered(rows: &[JudgedRow]) -> Vec<&JudgedRow> {
    let rank = |r: &JudgedRow| {
        ["primary", "interaction", "secondary", "diagnostic", "cost"].iter().position(|x| *x == role(r))
    };
    let mut out: Vec<&JudgedRow> = rows.iter().collect();
    out.sort_by_key(|r| rank(r));
    out
}

/// Why the recipe's `compare.plan_written_after` cannot be read with these results: they record the plan
/// their pilot started under, which decides (`None`: readable, or not given).
fn plan_written_after_refusal(results: &Results) -> Option<String> {
    let compare = results.recipe.compare.as_ref()?;
    (compare.plan_written_after.is_some() && results.recorded.pilot_plan.is_some()).then(|| {
        "compare.plan_written_after: these results record the plan their pilot started under, which decides \
         when the plan was set; drop the key"
            .to_string()
    })
}

/// The block's sentence on the settling plan: as the recipe states it, and whether it is the one recorded
/// when the results' pilot started.
pub fn plan_line(results: &Results, primary: Option<&str>) -> String {
    let Some(compare) = &results.recipe.compare else { return String::new() };
    let recipe = results.recipe;
    let plan = compare.plan(recipe.seeds.len());
    let mut shown = plan.clone();
    if let (None, Some(p)) = (&compare.primary, primary) {
        shown.primary = format!("{p} (the kind's default)");
    }
    let pilot = recipe.seeds.len();
    let design = if compare.two_stage(pilot) {
        format!(
            "a pilot of {} per arm, then a second stage of at least {} added seeds (up to {} in all) \
             sized on the pilot's spread; two stages are judged by the inverse-normal combination of each stage's \
             paired t-test (docs/results.md, \"The two-stage design\"), a comparison whose second stage has not \
             run is *incomplete*",
            seeds(pilot),
            crate::design::SECOND_STAGE_MIN,
            plan.max_seeds
        )
    } else {
        format!("a fixed design of the recipe's {} per arm, judged by the paired t-test", seeds(pilot))
    };
    use crate::recipe::compare::PlanWrittenAfter;
    // A recorded pilot plan decides; `compare.plan_written_after` dates a plan only where none was recorded
    // (`block` refuses the key beside a record).
    let when = match (&results.recorded.pilot_plan, compare.plan_written_after) {
        (Some(p), _) if *p == plan => {
            "fixed before the pilot (recorded in `recipe.resolved.yaml` when it started)".to_string()
        }
        (Some(p), _) => format!("**set after the pilot**, which started under: {}", p.describe()),
        (None, None) => "**set after the pilot** (its runs predate recorded plans)".to_string(),
        (None, Some(PlanWrittenAfter::Pilot)) => {
            "**set after the pilot** (its runs predate recorded plans; the recipe's git history dates it)".to_string()
        }
        (None, Some(PlanWrittenAfter::SecondStage)) => "**set after the second stage's results** (its runs predate \
             recorded plans; the recipe's git history dates it)"
            .to_string(),
    };
    format!("**Plan**: {}; {design}; {when}.\n\n", shown.describe())
}

/// What an interaction row is, said once in a block that has one.
const INTERACTIONS: &str = "An *interaction* (a prediction's `versus:`) judges one comparison's effect minus \
     another's: for each of the recipe's own seeds that all four arms ran, (A − A's reference) − (B − B's \
     reference), the paired tests on those contrasts as a fixed design (a second stage adds seeds for the plain \
     comparisons, not for it), Holm-adjusted over the interactions of its metric, at A's δ.\n\n";

fn render(j: &Judgements, command: &str, plan: &str) -> String {
    let mut out = format!("{BEGIN}{command}`; do not edit by hand -->\n");
    out.push_str(&format!(
        "**Verdicts** ({}; every headline metric's comparisons are one family, Holm-adjusted at α = {ALPHA}): \
         *better*/*worse* where the difference test holds (*by more than δ* where the 95% interval also lies \
         beyond δ), *equivalent* where the equivalence test (TOST) at ±δ holds, else *inconclusive* with the \
         seeds (per arm) a fixed design would need for power 0.8 in both tests at δ. The primary metric's \
         verdicts answer the recipe's question; the rest are *secondary*, and throughput, utilisation and \
         diagnostics are not verdicts of model quality. δ: the recipe's `compare.delta`, else the metric's \
         default (docs/results.md).\n\n",
        j.pairing
    ));
    if j.rows.iter().any(|r| r.versus.is_some()) {
        out.push_str(INTERACTIONS);
    }
    out.push_str(plan);
    out.push_str(&format!("Primary: {}.\n", count_line(counts(&j.rows), "the primary metric")));
    let secondary = secondary_counts(&j.rows);
    if secondary.iter().sum::<usize>() > 0 {
        out.push_str(&format!("Secondary: {}.\n", count_line(secondary, "other quality metrics")));
    }
    out.push('\n');
    match &j.second {
        None => {
            out.push_str(
                "| comparison | metric | role | difference [95% CI] | δ | verdict |\n|---|---|---|---|---|---|\n",
            );
            for r in ordered(&j.rows) {
                out.push_str(&format!(
                    "| {} | {} | {} | {} | {} | {} |\n",
                    r.comparison,
                    r.metric.axis(),
                    role(r),
                    difference(r),
                    r.judged.delta_text,
                    verdict(r)
                ));
            }
        }
        Some((settings, second)) => {
            out.push_str(&format!(
                "At the second scale ({settings}): primary: {}.\n\n",
                count_line(counts(second), "the primary metric")
            ));
            out.push_str(
                "| comparison | metric | role | this scale | second scale | across scales |\n|---|---|---|---|---|---|\n",
            );
            for r in ordered(&j.rows) {
                let there = second.iter().find(|s| s.comparison == r.comparison && s.metric.column == r.metric.column);
                let (cell, across) = match there {
                    Some(s) => (
                        format!("{}: {}", difference(s), verdict(s)),
                        across_scales(r.judged.verdict, s.judged.verdict).to_string(),
                    ),
                    None => ("–".into(), "–".into()),
                };
                out.push_str(&format!(
                    "| {} | {} | {} | {}: {} | {} | {} |\n",
                    r.comparison,
                    r.metric.axis(),
                    role(r),
                    difference(r),
                    verdict(r),
                    cell,
                    across
                ));
            }
        }
    }
    out.push_str(END);
    out.push('\n');
    out
}

/// The block committed in `readme` (markers included) and the command its marker names; `None` without one.
pub fn committed(readme: &str) -> Option<(String, String)> {
    let start = readme.find(BEGIN)?;
    let end = start + readme[start..].find(END)? + END.len();
    let command_end = readme[start + BEGIN.len()..].find('`')?;
    let command = readme[start + BEGIN.len()..start + BEGIN.len() + command_end].to_string();
    let mut text = readme[start..end].to_string();
    text.push('\n');
    Some((text, command))
}

/// Writes `block` into `dir/README.md`: in place of the committed block, else before the first `## `
/// heading, else at the end (a README is created if there is none).
pub fn write_block(dir: &Path, block: &str) -> Result<()> {
    let path = dir.join("README.md");
    let readme = std::fs::read_to_string(&path).unwrap_or_default();
    let updated = match (readme.find(BEGIN), readme.find(END)) {
        (Some(start), Some(end)) if end > start => {
            let mut after = end + END.len();
            if readme[after..].starts_with('\n') {
                after += 1;
            }
            format!("{}{block}{}", &readme[..start], &readme[after..])
        }
        _ => match readme.find("\n## ") {
            Some(i) => format!("{}{block}{}", &readme[..i + 1], &readme[i..]),
            None if readme.is_empty() => block.to_string(),
            None => format!("{}\n\n{block}", readme.trim_end()),
        },
    };
    write_atomically(&path, updated.as_bytes())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_prediction_is_reproduced_only_by_a_decided_verdict_in_its_direction() {
        let better = Verdict::Better { negligible: false, beyond: false };
        assert_eq!(prediction_outcome(Expect::Better, better), "reproduced");
        assert_eq!(prediction_outcome(Expect::Worse, better), "not reproduced (the opposite direction)");
        assert_eq!(prediction_outcome(Expect::Better, Verdict::Equivalent), "not reproduced (equivalent within ±δ)");
        assert_eq!(prediction_outcome(Expect::Equivalent, Verdict::Equivalent), "consistent");
        assert_eq!(prediction_outcome(Expect::Equivalent, better), "not reproduced (an effect beyond ±δ)");
        assert_eq!(
            prediction_outcome(Expect::Equivalent, Verdict::Worse { negligible: true, beyond: false }),
            "consistent (a difference, within ±δ)"
        );
        assert!(prediction_outcome(Expect::Worse, Verdict::Worse { negligible: true, beyond: false })
            .starts_with("reproduced in"));
        let far = Verdict::Worse { negligible: false, beyond: true };
        assert_eq!(prediction_outcome(Expect::WorseBeyondDelta, far), "reproduced");
        assert!(prediction_outcome(Expect::WorseBeyondDelta, Verdict::Worse { negligible: false, beyond: false })
            .starts_with("reproduced in direction only"));
        assert_eq!(prediction_outcome(Expect::BetterBeyondDelta, far), "not reproduced (the opposite direction)");
        assert!(prediction_outcome(Expect::Worse, Verdict::Incomplete { added: 0 }).starts_with("incomplete"));
        assert_eq!(prediction_outcome(Expect::Better, Verdict::Inconclusive { seeds: Some(9) }), "inconclusive");
        assert_eq!(prediction_outcome(Expect::Equivalent, Verdict::Untested), "untested");
    }

    #[test]
    fn a_block_is_found_with_its_command_and_replaced_in_place() {
        let dir = tempfile::tempdir().unwrap();
        let block = |n: usize| format!("{BEGIN}ablate summary x --readme`; do not edit by hand -->\nbody {n}\n{END}\n");
        std::fs::write(dir.path().join("README.md"), "# x\n\nintro\n\n## Results\n\ntext\n").unwrap();
        write_block(dir.path(), &block(1)).unwrap();
        let text = std::fs::read_to_string(dir.path().join("README.md")).unwrap();
        assert_eq!(text, format!("# x\n\nintro\n\n{}\n## Results\n\ntext\n", block(1)));
        write_block(dir.path(), &block(2)).unwrap();
        let text = std::fs::read_to_string(dir.path().join("README.md")).unwrap();
        assert_eq!(text, format!("# x\n\nintro\n\n{}\n## Results\n\ntext\n", block(2)));
        let (found, command) = committed(&text).unwrap();
        assert_eq!((found, command.as_str()), (block(2), "ablate summary x --readme"));
        assert!(committed("no block").is_none());
    }
}
