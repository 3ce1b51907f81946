//! Reading a recipe and its results without training: `check`, `summary`, `reproduce`, `plot`.
use anyhow::Context;
use std::path::PathBuf;

use ablate::judge::reading::Results;
use ablate::judge::reproduce;

use super::target::{Sweep, Target};
use super::{OverrideArgs, TargetArgs};

#[derive(clap::Args)]
pub struct CheckArgs {
    recipe: PathBuf,
    #[command(flatten)]
    overrides: OverrideArgs,
    #[arg(long)]
    smoke: bool,
    /// Print the runs as the rows `runs.csv` will have (CSV on stdout: who each run is and every config
    /// column it reads; metric columns empty) instead of the list.
    #[arg(long)]
    columns: bool,
}

#[derive(clap::Args)]
pub struct SummaryArgs {
    #[command(flatten)]
    target: TargetArgs,
    /// Compare every variant with this one, paired by seed: `heads=1` (a swept key, by its last part or
    /// its full name) or a variant's label.
    #[arg(long)]
    baseline: Option<String>,
    /// Compare each variant with the one listed before it, paired by seed, Holm over the steps: a ladder
    /// whose every rung adds one thing to the rung below (recipes/modern_lm.yaml).
    #[arg(long, conflicts_with = "baseline")]
    ladder: bool,
    /// Write the verdicts into the results directory's README.md, between markers that name this command
    /// (replacing the block written before), instead of printing the tables.
    #[arg(long)]
    readme: bool,
}

#[derive(clap::Args)]
pub struct PlanArgs {
    recipe: PathBuf,
    #[command(flatten)]
    overrides: OverrideArgs,
    /// Results to measure the noise from: a pilot run's directory (default: the committed results/<name>).
    #[arg(long)]
    from: Option<PathBuf>,
    /// The variant the others are paired against (default: the first): `heads=1` or a variant's label.
    #[arg(long)]
    baseline: Option<String>,
    /// An effect to plan for, as a difference in a headline metric's column, e.g. `--effect test_loss=0.01`
    /// (repeatable): the seeds needed to detect it.
    #[arg(long, value_name = "METRIC=SIZE")]
    effect: Vec<ablate::judge::summary::Effect>,
}

#[derive(clap::Args)]
pub struct FitArgs {
    /// A results directory (holding runs.csv).
    dir: PathBuf,
    /// The runs.csv column of the size: `params` (every parameter), or any numeric column.
    #[arg(long, default_value = "params")]
    x: String,
    /// The runs.csv column that falls with size.
    #[arg(long, default_value = "test_loss")]
    y: String,
    /// Subtract this many parameters per run from x first (e.g. the embedding table's, for Kaplan et al.'s
    /// non-embedding count), or a column naming them.
    #[arg(long)]
    minus: Option<String>,
    /// Fit only the runs whose runs.csv column has this value, `column=value` (repeatable: all must hold),
    /// e.g. `--where layers=2` to leave an arm of another shape out of a ladder of widths.
    #[arg(long = "where", value_name = "COLUMN=VALUE")]
    only: Vec<String>,
    /// Bootstrap resamples for α's interval.
    #[arg(long, default_value_t = 2000)]
    resamples: usize,
}

#[derive(clap::Args)]
pub struct ReproduceArgs {
    #[command(flatten)]
    target: TargetArgs,
    #[arg(long)]
    reference: Option<PathBuf>,
}

#[derive(clap::Args)]
pub struct PlotArgs {
    #[command(flatten)]
    target: TargetArgs,
}

/// `ablate check`: the recipe validated and its runs listed (or printed as `runs.csv` rows), each checked
/// against this machine's memory.
pub fn check(args: &CheckArgs) -> anyhow::Result<()> {
    let sweep = match Target::load(&args.recipe, args.smoke, &args.overrides, None)? {
        Target::Benchmark { path, recipe, .. } => {
            let c = &recipe.complexity;
            println!(
                "{}: ok, complexity benchmark: {} lengths × {} variants × {} passes",
                path.display(),
                c.lengths.len(),
                c.variants.len(),
                c.passes.len()
            );
            return Ok(());
        }
        Target::Sweep(sweep) => sweep,
    };
    let (path, recipe) = (&sweep.path, &sweep.recipe);
    ablate::tasks::memory::check_runs_fit(&path.display().to_string(), &recipe.runs, tch::Device::Cpu)?;
    ablate::judge::summary::check_compare(recipe)?;
    if args.columns {
        return print_columns(recipe);
    }
    let kinds: Vec<String> = recipe.kinds().iter().map(|k| k.to_string()).collect();
    println!("{}: ok, {} runs (kind {})", path.display(), recipe.planned_runs(), kinds.join(", "));
    if let Some(t) = &recipe.tuning {
        println!(
            "  tuning {} per arm over {} candidate(s) by successive halving (eta {}, {} rung(s)): {} of the {} runs \
             below train, which ones decided by each rung's validation scores",
            t.keys.join(", "),
            t.candidates.len(),
            t.eta,
            t.rungs,
            recipe.planned_runs(),
            recipe.runs.len()
        );
    }
    for r in &recipe.runs {
        let memory = ablate::tasks::memory::human(ablate::tasks::memory::training_bytes(&r.config));
        let phase = r.tune.map_or(String::new(), |t| format!("{}, ", t.phase()));
        println!("  {} ({phase}config {}, about {memory} to train)", r.id, r.config_hash);
    }
    Ok(())
}

/// The runs as the rows `runs.csv` will have, metric columns empty.
fn print_columns(recipe: &ablate::recipe::Recipe) -> anyhow::Result<()> {
    let header = ablate::judge::reading::recipe_header(&recipe.runs);
    let mut w = csv::Writer::from_writer(std::io::stdout());
    w.write_record(&header)?;
    let untrained = ablate::train::RunOutcome {
        metrics: Default::default(),
        diverged_at: None,
        resumed_from: 0,
        curves: Vec::new(),
        sample: String::new(),
    };
    for r in &recipe.runs {
        w.write_record(ablate::judge::reading::row_under(&header, r, &untrained))?;
    }
    w.flush()?;
    Ok(())
}

/// `ablate summary`: the results table, optionally paired against a baseline.
pub fn summary(args: &SummaryArgs) -> anyhow::Result<()> {
    let sweep = args.target.load()?;
    use ablate::judge::reading::Pairing;
    let pairing = match (&args.baseline, args.ladder) {
        (Some(b), _) => Some(Pairing::Baseline(b)),
        (None, true) => Some(Pairing::Ladder),
        (None, false) => None,
    };
    let results = Results::open(&sweep.out, &sweep.recipe, pairing)?;
    if args.readme {
        let mut command = format!("ablate summary {} --out {}", args.target.recipe().display(), sweep.out.display());
        match (&args.baseline, args.ladder) {
            (Some(b), _) if b.contains(' ') => command.push_str(&format!(" --baseline \"{b}\"")),
            (Some(b), _) => command.push_str(&format!(" --baseline {b}")),
            (None, true) => command.push_str(" --ladder"),
            (None, false) => {}
        }
        command.push_str(" --readme");
        let block = ablate::judge::verdicts::block(&results, &command)?;
        ablate::judge::verdicts::write_block(&sweep.out, &block)?;
        eprintln!("ablate: wrote the verdicts into {}", sweep.out.join("README.md").display());
        return Ok(());
    }
    print!("{}", ablate::judge::summary::summary_table(&results)?);
    if let Some(compare) = sweep.recipe.compare.as_ref().filter(|c| !c.predict.is_empty()) {
        if let Some(j) = ablate::judge::summary::judgements(&results)? {
            let as_run = &results.recorded.predictions;
            print!("{}", ablate::judge::verdicts::predictions_table(&j.rows, &compare.predict, as_run));
        }
    }
    if let Some(column) = ablate::judge::summary::primary_column(&sweep.recipe, &results.metrics) {
        if let Some(sensitivity) = ablate::judge::sensitivity::section(&results, &column)? {
            print!("{sensitivity}");
        }
        if let Some(compute) = ablate::judge::compute::section(&results, &column)? {
            print!("{compute}");
        }
    }
    Ok(())
}

/// `ablate plan`: the noise floor, the detectable difference at the recipe's seeds, and seeds needed.
pub fn plan(args: &PlanArgs) -> anyhow::Result<()> {
    let sweep = Sweep::load(&args.recipe, false, &args.overrides.parse()?, None)?;
    let from = args.from.clone().unwrap_or_else(|| sweep.reference());
    let results = Results::open(&from, &sweep.recipe, None).context("no results to plan from")?;
    let table = ablate::judge::summary::plan_table(&results, args.baseline.as_deref(), &args.effect)?;
    print!("{}", table.markdown());
    Ok(())
}

/// `ablate reproduce`: a run directory against reference results; writes reproduction.csv and the report.
pub fn reproduce(args: &ReproduceArgs) -> anyhow::Result<()> {
    let sweep = args.target.load()?;
    let reference = args.reference.clone().unwrap_or_else(|| sweep.reference());
    let results = Results::open(&sweep.out, &sweep.recipe, None)?;
    let Some(verdicts) = reproduce::compare(&results, &reference)? else {
        anyhow::bail!("{} has no runs.csv to compare with", reference.display());
    };
    reproduce::write(&verdicts, &sweep.out.join("reproduction.csv"))?;
    ablate::judge::report::write_report(&results)?;
    for line in reproduce::lines(&verdicts, &reference) {
        println!("{line}");
    }
    Ok(())
}

/// `ablate stale`: every training recipe under recipes/ with a committed reference under results/ (or
/// retired), and whether a rerun today would be compared with it (the committed results/stale.md is this
/// output). Fails, after the whole table, when a reference is stale or a retirement does not hold: CI calls
/// it, so a change that alters a reference's data or model refreshes or retires that reference with it.
pub fn stale() -> anyhow::Result<()> {
    let recipes = training_recipes()?;
    println!("# Committed references: current, stale or retired\n");
    println!(
        "Generated by `ablate stale` (a test fails when it differs, and the command fails while a reference is \
         stale): for every training recipe, whether `ablate reproduce` (and the end of a run) can compare a \
         rerun with `results/<name>/` (*current*), or why the reference is *stale*: what changed since it was \
         made, and the training time a refresh took when it was made. A *retired* recipe is kept as an example \
         with no reference (its recipe's `retired:` says why), its question answered by its successors' \
         current results where it names any.\n"
    );
    println!("| recipe | reference | state |\n|---|---|---|");
    let mut problems = Vec::new();
    // Per stale reference, the keys it predates: one new key that every stale reference predates is most
    // often a new knob whose default was meant to leave the model as it was.
    let mut predated: Vec<Vec<String>> = Vec::new();
    for path in recipes {
        let recipe = ablate::recipe::load(&path, false)?;
        let reference = PathBuf::from("results").join(&recipe.name);
        let state = match &recipe.retired {
            Some(retired) => {
                let (state, problem) = retirement(&recipe.name, retired)?;
                problems.extend(problem);
                state
            }
            None => {
                let Some(results) = Results::open_if_any(&reference, &recipe, None)? else { continue };
                let stale = reproduce::staleness(&results);
                match stale.as_slice() {
                    [] => "current".to_string(),
                    [first, rest @ ..] => {
                        problems.push(format!("{} is stale", reference.display()));
                        predated.push(predated_keys(&stale));
                        let more = match rest.is_empty() {
                            true => String::new(),
                            false => format!(" (and {} more variant(s))", rest.len()),
                        };
                        format!("**stale**: {first}{more}; {}", reproduce::refresh_cost(&results))
                    }
                }
            }
        };
        println!("| `{}` | `{}` | {state} |", path.display(), reference.display());
    }
    if let Some(key) = shared_new_key(&predated) {
        anyhow::bail!(
            "{} reference(s) predate `{key}`: if its default leaves the model as it was, add a line for it to \
             `silent_default` in src/recipe/reads.rs (`\"{key}\" => <the default holds>,`) and nothing is \
             stale; if it does not, refresh or retire them ({})",
            predated.len(),
            problems.join("; ")
        );
    }
    if !problems.is_empty() {
        anyhow::bail!(
            "{} reference(s) not current: {} (refresh with `bin/ablate recipes/<name>.yaml --out results/<name>`, \
             or retire the recipe with `retired:`)",
            problems.len(),
            problems.join("; ")
        );
    }
    Ok(())
}

/// The keys named by "the reference predates `KEY`" in a reference's staleness lines.
fn predated_keys(stale: &[String]) -> Vec<String> {
    let mut keys: Vec<String> = stale
        .iter()
        .filter_map(|line| line.split("the reference predates `").nth(1)?.split('`').next().map(String::from))
        .collect();
    keys.sort();
    keys.dedup();
    keys
}

/// A key that two or more stale references all predate, when every stale reference does.
fn shared_new_key(predated: &[Vec<String>]) -> Option<String> {
    let (first, rest) = predated.split_first()?;
    if rest.is_empty() {
        return None;
    }
    first.iter().find(|k| rest.iter().all(|keys| keys.contains(k))).cloned()
}

/// A retired recipe's state line, and what is wrong with the retirement: its results directory still
/// committed, or a successor without a current reference of its own.
fn retirement(name: &str, retired: &ablate::recipe::Retired) -> anyhow::Result<(String, Option<String>)> {
    let mut wrong = Vec::new();
    if PathBuf::from("results").join(name).exists() {
        wrong.push(format!("results/{name} is still committed"));
    }
    for successor in &retired.successors {
        let recipe_path = PathBuf::from("recipes").join(format!("{successor}.yaml"));
        if !recipe_path.is_file() {
            wrong.push(format!("its successor {successor} is not a shipped recipe"));
            continue;
        }
        let recipe = ablate::recipe::load(&recipe_path, false)?;
        let reference = Results::open_if_any(&PathBuf::from("results").join(successor), &recipe, None)?;
        let current = recipe.retired.is_none() && reference.is_some_and(|r| reproduce::staleness(&r).is_empty());
        if !current {
            wrong.push(format!("its successor {successor} has no current reference"));
        }
    }
    let state = format!("**retired** → {}: {}", successor_links(retired, ""), retired.reason.trim());
    let problem = (!wrong.is_empty()).then(|| format!("{name} is retired but {}", wrong.join(" and ")));
    Ok((state, problem))
}

/// A retired recipe's successors as links to their results READMEs (`results_dir`: the path from the page
/// to results/, empty from results/stale.md), or "no successor".
fn successor_links(retired: &ablate::recipe::Retired, results_dir: &str) -> String {
    match retired.successors.as_slice() {
        [] => "no successor".to_string(),
        names => names.iter().map(|n| format!("[{n}]({results_dir}{n}/README.md)")).collect::<Vec<_>>().join(", "),
    }
}

/// The training recipes under recipes/ (complexity benchmarks aside), in name order.
fn training_recipes() -> anyhow::Result<Vec<PathBuf>> {
    let mut recipes: Vec<PathBuf> = std::fs::read_dir("recipes")?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|e| e == "yaml"))
        .filter(|p| !ablate::run::complexity::is_complexity_recipe(p))
        .collect();
    recipes.sort();
    Ok(recipes)
}

/// `ablate reproductions`: every prediction of the shipped recipes (`compare.predict`, the papers' headline
/// ablations written down before their run) against the verdict of its committed results, or "not yet run".
/// docs/reproductions.md is this output.
pub fn reproductions() -> anyhow::Result<()> {
    use ablate::judge::verdicts::{expect_word, prediction_measured, prediction_result};
    println!(
        "# Reproductions\n\n\
         Generated by `ablate reproductions` from the shipped recipes' predictions (`compare.predict`, written \
         in the recipe before its run and recorded in its results' `recipe.resolved.yaml`) and the verdicts of \
         the committed results: do not edit by hand; a test fails when this file and the command's output \
         differ. Each prediction has a *role*: a *control* is a large published effect that checks the \
         implementation and the regime, a *test* a genuine question (tallied apart below; a role given after \
         the results were made is marked so in the outcome, and such outcomes, like post hoc ones, are tallied \
         apart from the predictions that preceded their results). Each metric is marked *primary* (the recipe's `compare.primary`, whose verdicts answer its \
         question) or *secondary*. *reproduced*: the predicted direction after Holm (beyond δ where predicted \
         so); *consistent*: equivalent within ±δ where no \
         effect was predicted; *not reproduced*: equivalence where an effect was predicted, the opposite \
         direction, or an effect beyond ±δ where none was; *inconclusive*: with the seeds that would settle it. \
         An outcome marked post hoc compares results with a prediction they did not run against. *measured*: \
         the paired difference (variant minus baseline) with the design's 95% interval (the paired t interval, \
         or the two-stage combination test's where seeds were added); *training*: the \
         recorded training time of the whole results directory (every arm, tuning and second scale included), \
         in minutes of the 2-core machine its README names.\n"
    );
    let mut rows = Vec::new();
    let mut tallies: std::collections::BTreeMap<&str, Vec<String>> = std::collections::BTreeMap::new();
    for path in training_recipes()? {
        let recipe = ablate::recipe::load(&path, false)?;
        let Some(compare) = &recipe.compare else { continue };
        if compare.predict.is_empty() {
            continue;
        }
        let dir = PathBuf::from("results").join(&recipe.name);
        let results = Results::open_if_any(&dir, &recipe, None)?;
        let judged = match &results {
            Some(results) => ablate::judge::summary::judgements(results)?,
            None => None,
        };
        let no_predictions = Vec::new();
        let as_run = results.as_ref().map_or(&no_predictions, |r| &r.recorded.predictions);
        let minutes = results.as_ref().map_or("–".to_string(), |r| format!("{:.0}", training_minutes(r)));
        let primary = judged
            .as_ref()
            .and_then(|j| j.rows.iter().find(|r| r.primary))
            .and_then(|r| r.metric.column_name().map(String::from));
        for p in &compare.predict {
            let role = match (&p.versus, primary.as_deref() == Some(p.metric.as_str())) {
                (Some(_), _) => "interaction",
                (None, true) => "primary",
                (None, false) => "secondary",
            };
            let measured = judged.as_ref().map_or("–".to_string(), |j| prediction_measured(&j.rows, p));
            let (verdict, outcome) = match &judged {
                Some(j) => prediction_result(&j.rows, p, as_run),
                None => {
                    ("–".to_string(), format!("not yet run (`bin/ablate {} --out {}`)", path.display(), dir.display()))
                }
            };
            let name = match &judged {
                Some(_) => format!("[{}](../results/{}/README.md)", recipe.name, recipe.name),
                None => recipe.name.clone(),
            };
            let purpose = p.role.map_or("–", |r| r.word());
            tallies.entry(purpose).or_default().push(outcome.clone());
            rows.push(format!(
                "| {name} | {purpose} | {} | {} ({role}) | {} | {} | {measured} | {verdict} | {outcome} | {minutes} |",
                ablate::judge::verdicts::predicted_claim(p),
                p.metric,
                expect_word(p.expect),
                p.source.replace('|', "\\|")
            ));
        }
    }
    for (purpose, heading) in [("control", "Controls"), ("test", "Tests")] {
        println!(
            "**{heading}** ({}): {}.\n",
            role_meaning(purpose),
            tally(tallies.get(purpose).map_or(&[], Vec::as_slice))
        );
    }
    println!("| recipe | role | comparison | metric | predicted | source | measured [95% CI] | verdict | outcome | training (min) |");
    println!("|---|---|---|---|---|---|---|---|---|---|");
    for row in rows {
        println!("{row}");
    }
    compute_gains()
}

/// docs/reproductions.md's compute-equivalent gains: every recipe with a predicted gain
/// (`compare.compute.predict`) against the gain its committed results measure at each target, the outcome by
/// a rule fixed before the data: *reproduced* (the 95% interval holds the prediction and excludes 1),
/// *consistent, no gain shown* (it holds the prediction and 1), *below* or *above the prediction* (the whole
/// interval on one side), and a target outside the measured range as a *forecast*.
fn compute_gains() -> anyhow::Result<()> {
    let mut rows = Vec::new();
    for path in training_recipes()? {
        let recipe = ablate::recipe::load(&path, false)?;
        let Some(compute) = recipe.compare.as_ref().and_then(|c| c.compute.as_ref()) else { continue };
        let Some(predicted) = &compute.predict else { continue };
        let dir = PathBuf::from("results").join(&recipe.name);
        let source = predicted.source.replace('|', "\\|");
        let Some(results) = Results::open_if_any(&dir, &recipe, None)? else {
            let run = format!("not yet run (`bin/ablate {} --out {}`)", path.display(), dir.display());
            rows.push(format!("| {} | – | {:.2}× | {source} | – | – | {run} | – | – |", recipe.name, predicted.gain));
            continue;
        };
        let column = ablate::judge::summary::primary_column(&recipe, &results.headline).unwrap_or_default();
        let minutes = format!("{:.0}", training_minutes(&results));
        for (arm, g, fit) in ablate::judge::compute::measured(&results, &column) {
            let (measured, outcome) = match g.interval {
                None => (format!("{:.2}×", g.ratio), "one seed: no interval".to_string()),
                Some((lo, hi)) => {
                    let outcome = if fit.is_some_and(|f| !f.fits()) {
                        "no estimate: the law misfits the ladders"
                    } else if !g.inside {
                        "forecast (outside the measured range)"
                    } else if hi < predicted.gain {
                        "below the prediction"
                    } else if lo > predicted.gain {
                        "above the prediction"
                    } else if lo <= 1.0 {
                        "consistent, no gain shown"
                    } else {
                        "reproduced"
                    };
                    (format!("{:.2}× [{lo:.2}, {hi:.2}]", g.ratio), outcome.to_string())
                }
            };
            let wall = ablate::judge::compute::wall_clock_words(&results, &column, &arm, &g)?;
            rows.push(format!(
                "| [{}](../results/{}/README.md) | {arm} | {:.2}× | {source} | {column} = {:.4} | {measured} | {outcome} | {wall} | {minutes} |",
                recipe.name, recipe.name, predicted.gain, g.target
            ));
        }
    }
    if rows.is_empty() {
        return Ok(());
    }
    println!(
        "\n## Compute-equivalent gains\n\n\
         What each mechanism is worth in compute (`compare.compute`, docs/results.md \"Compute-equivalent gains\"): \
         the gain the literature reports, written in the recipe before its run, against the gain the committed \
         results measure at each target L* with its 95% interval. *reproduced*: the interval holds the prediction \
         and excludes 1; *consistent, no gain shown*: it holds both; *below* / *above the prediction*: the whole \
         interval on one side; a target outside the measured range is a *forecast*, never a finding; where the law \
         misses the rungs by more than twice the seeds' spread, *no estimate*. In wall-clock time: the gain in \
         compute times the arm's measured speed (`ablate wall-clock`, stated on quiet cores only).\n"
    );
    println!("| recipe | arm | predicted | source | at | measured [95% CI] | outcome | in wall-clock time [95% CI] | training (min) |");
    println!("|---|---|---|---|---|---|---|---|---|");
    for row in rows {
        println!("{row}");
    }
    Ok(())
}

/// What a prediction of each role is for, as the tallies say it.
fn role_meaning(role: &str) -> &'static str {
    match role {
        "control" => {
            "large published effects that check the implementation and the regime: one that does not \
                      reproduce points at the mechanism's code first"
        }
        _ => "genuine questions, whose answer may go either way",
    }
}

/// "k of n reproduced" for a role's outcomes, with the other outcomes counted. An outcome whose prediction or
/// role came after its results (post hoc, or a role given after the run) is tallied apart, never among the
/// predictions that preceded their results.
fn tally(outcomes: &[String]) -> String {
    let after_the_results = |o: &&String| o.contains("post hoc") || o.contains("its role given after the run");
    let (apart, predicted): (Vec<&String>, Vec<&String>) = outcomes.iter().partition(after_the_results);
    let mut text = counted(&predicted);
    if !apart.is_empty() {
        text.push_str(&format!(
            "; tallied apart, {} whose prediction or role came after its results: {}",
            apart.len(),
            counted(&apart)
        ));
    }
    text
}

/// "k of n run reproduced, … consistent, … not reproduced, … inconclusive" (and those not yet run).
fn counted(outcomes: &[&String]) -> String {
    let first = |o: &String| o.split(" (").next().unwrap_or_default().to_string();
    let decided = outcomes.iter().filter(|o| !o.starts_with("not yet run")).count();
    let count = |word: &str| outcomes.iter().filter(|o| first(o) == word).count();
    let mut text = format!(
        "{} of {decided} run reproduced, {} consistent, {} not reproduced, {} inconclusive",
        count("reproduced"),
        count("consistent"),
        count("not reproduced"),
        count("inconclusive")
    );
    let waiting = outcomes.len() - decided;
    if waiting > 0 {
        text.push_str(&format!("; {waiting} not yet run"));
    }
    text
}

/// The recorded training time of a results directory in minutes: every row's `wall_s` (tuning runs too),
/// its second scale's included.
fn training_minutes(results: &Results) -> f64 {
    results.recorded_minutes() + results.second.as_ref().map_or(0.0, |(check, _)| check.recorded_minutes())
}

/// `ablate findings`: per shipped recipe with results, its question (the recipe's description), the decided
/// verdicts of its primary metric's comparisons and the count left inconclusive, and whether its reference
/// is comparable today. The README's table is this output.
pub fn findings() -> anyhow::Result<()> {
    use ablate::judge::verdicts::counts;
    println!("| recipe | question | decided verdicts of the primary metric (generated from the results' verdict blocks) | reference |");
    println!("|---|---|---|---|");
    for path in training_recipes()? {
        let recipe = ablate::recipe::load(&path, false)?;
        let question = recipe.description.clone().unwrap_or_default().replace('|', "/");
        if let Some(retired) = &recipe.retired {
            let successors = successor_links(retired, "results/");
            println!("| {} | {question} | – (an example; no reference) | retired → {successors} |", recipe.name);
            continue;
        }
        let dir = PathBuf::from("results").join(&recipe.name);
        let Some(results) = Results::open_if_any(&dir, &recipe, None)? else { continue };
        let Some(j) = ablate::judge::summary::judgements(&results)? else { continue };
        let decided: Vec<String> = j
            .rows
            .iter()
            .filter(|r| r.primary && r.judged.verdict.is_decided())
            .map(|r| {
                let d = r
                    .judged
                    .paired
                    .as_ref()
                    .map_or(String::new(), |p| format!(" {:+.*}", r.metric.digits, p.difference.mean));
                format!("{}: {}{d} {}", r.comparison, r.metric.label, r.judged.verdict.word())
            })
            .collect();
        let [better, worse, equivalent, inconclusive, untested, incomplete] = counts(&j.rows);
        let tested = better + worse + equivalent + inconclusive;
        let mut cell = if tested == 0 && incomplete == 0 {
            format!("untested: one seed per variant ({untested} comparisons)")
        } else {
            format!("{} of {} decided", better + worse + equivalent, tested + incomplete)
        };
        if incomplete > 0 {
            cell.push_str(&format!(" ({incomplete} incomplete: the plan's second stage not run)"));
        }
        if !decided.is_empty() {
            cell.push_str(&format!(": {}", decided.join("; ")));
        }
        if let Some((settings, second)) = &j.second {
            let [b, w, e, _, _, _] = counts(second);
            cell.push_str(&format!(". At {settings}: {} decided", b + w + e));
            let both: Vec<String> = j
                .rows
                .iter()
                .filter(|r| r.primary)
                .filter_map(|r| {
                    let s =
                        second.iter().find(|s| s.comparison == r.comparison && s.metric.column == r.metric.column)?;
                    (ablate::stats::across_scales(r.judged.verdict, s.judged.verdict) == "holds at both")
                        .then(|| format!("{}: {}", r.comparison, r.metric.label))
                })
                .collect();
            cell.push_str(&match both.is_empty() {
                true => "; none holds at both".to_string(),
                false => format!("; holds at both: {}", both.join(", ")),
            });
        }
        let state = match reproduce::staleness(&results).is_empty() {
            true => "current",
            false => "stale",
        };
        println!("| [{}](results/{}/README.md) | {question} | {cell} | {state} |", recipe.name, recipe.name);
    }
    Ok(())
}

/// `ablate plot`: plots, TensorBoard files and the report redrawn from the CSVs.
pub fn plot(args: &PlotArgs) -> anyhow::Result<()> {
    let TargetArgs { recipe, overrides, out } = &args.target;
    match Target::load(recipe, false, overrides, out.clone())? {
        Target::Benchmark { recipe, out, .. } => ablate::run::complexity::replot(&recipe, &out),
        Target::Sweep(sweep) => ablate::run::finish(&sweep.out, &sweep.recipe),
    }
}

/// The recipe file a results directory's `recipe.resolved.yaml` names as its `source`, if it still exists.
fn recorded_source(dir: &std::path::Path) -> Option<PathBuf> {
    let path = PathBuf::from(ablate::judge::reading::recorded(dir).source?);
    path.is_file().then_some(path)
}

/// `ablate fit`: a power law over a results directory's runs, printed, drawn and written as CSV.
pub fn fit(args: &FitArgs) -> anyhow::Result<()> {
    // The directory read through the recipe it recorded (its `recipe.resolved.yaml` `source`), whose metric
    // declarations name the axes in words with units; a directory whose recipe is gone is read bare.
    let recipe = recorded_source(&args.dir).and_then(|p| ablate::recipe::load(&p, false).ok());
    let results = recipe.as_ref().and_then(|r| Results::open(&args.dir, r, None).ok());
    let runs = match &results {
        Some(results) => results.runs.clone(),
        None => ablate::judge::reading::reported_runs(&args.dir)
            .with_context(|| format!("{}: no runs.csv to fit", args.dir.display()))?,
    };
    let number = |row: &std::collections::BTreeMap<String, String>, column: &str| -> anyhow::Result<f64> {
        let text = row
            .get(column)
            .ok_or_else(|| anyhow::anyhow!("{}: runs.csv has no column `{column}`", args.dir.display()))?;
        text.parse::<f64>().map_err(|_| {
            anyhow::anyhow!("{}: run `{}`: {column} is `{text}`, not a number", args.dir.display(), row["run_id"])
        })
    };
    let mut conditions = Vec::new();
    for condition in &args.only {
        let (column, value) = condition
            .split_once('=')
            .ok_or_else(|| anyhow::anyhow!("--where {condition}: expected COLUMN=VALUE, e.g. layers=2"))?;
        if runs.first().is_some_and(|row| !row.contains_key(column)) {
            anyhow::bail!("--where {condition}: {}/runs.csv has no column `{column}`", args.dir.display());
        }
        conditions.push((column, value));
    }
    let selected = |row: &std::collections::BTreeMap<String, String>| {
        row.get("status").is_none_or(|s| s == "ok")
            && conditions.iter().all(|(c, v)| row.get(*c).is_some_and(|x| x == v))
    };
    let mut points = Vec::new();
    for row in runs.iter().filter(|r| selected(r)) {
        let minus = match &args.minus {
            None => 0.0,
            Some(m) => m.parse::<f64>().or_else(|_| number(row, m))?,
        };
        points.push((number(row, &args.x)? - minus, number(row, &args.y)?));
    }
    let fit = ablate::stats::fit_power_law(&points, args.resamples, 0)
        .map_err(|e| anyhow::anyhow!("{}: {e}", args.dir.display()))?;
    let x_name = match &args.minus {
        Some(m) => format!("{} − {m}", args.x),
        None => args.x.clone(),
    };
    let interval = fit.interval.map_or("no interval: fewer than three sizes".to_string(), |(lo, hi)| {
        format!("95% bootstrap interval [{lo:.4}, {hi:.4}] over {} resamples", args.resamples)
    });
    println!(
        "{y} = {c:.4} · ({x_name})^(−{a:.4}); α = {a:.4}, {interval}; R² on log axes {r2:.3}; {n} runs",
        y = args.y,
        c = fit.coefficient,
        a = fit.exponent,
        r2 = fit.r_squared,
        n = fit.points
    );
    let stem = format!("fit_{}_vs_{}", args.y, args.x);
    let mut csv = String::from("quantity,value\n");
    csv.push_str(&format!(
        "exponent,{}\ncoefficient,{}\nr_squared,{}\npoints,{}\n",
        fit.exponent, fit.coefficient, fit.r_squared, fit.points
    ));
    if let Some((lo, hi)) = fit.interval {
        csv.push_str(&format!("exponent_low,{lo}\nexponent_high,{hi}\n"));
    }
    ablate::files::write_atomically(&args.dir.join(format!("{stem}.csv")), csv.as_bytes())?;
    let (x0, x1) = points.iter().fold((f64::MAX, f64::MIN), |(a, b), p| (a.min(p.0), b.max(p.0)));
    let line: Vec<(f64, f64, f64)> = (0..=20)
        .map(|i| x0 * (x1 / x0).powf(i as f64 / 20.0))
        .map(|x| (x, fit.coefficient * x.powf(-fit.exponent), 0.0))
        .collect();
    let runs_series = ablate::judge::plot::Series {
        label: "runs".into(),
        points: Vec::new(),
        runs: points.clone(),
        seed_curves: Vec::new(),
    };
    let fitted = ablate::judge::plot::Series {
        label: format!("fit: α = {:.3}", fit.exponent),
        points: line,
        runs: Vec::new(),
        seed_curves: Vec::new(),
    };
    // Axes named in words with units by the recipe's metric declarations; a column none declares keeps its name.
    let declared: &[ablate::metrics::Metric] = results.as_ref().map_or(&[], |r| r.metrics.as_slice());
    let words = |column: &str| {
        declared.iter().find(|m| m.column_name() == Some(column)).map_or(column.to_string(), |m| m.axis())
    };
    let x_words = match &args.minus {
        Some(m) => format!("{} − {m}", words(&args.x)),
        None => words(&args.x),
    };
    let y_words = words(&args.y);
    let title = format!("{y_words} against {x_words} (power-law fit)");
    let axes = ablate::judge::plot::Axes { title: &title, x_label: &x_words, y_label: &y_words, x_categories: None };
    ablate::judge::plot::loglog_chart(&args.dir.join(format!("{stem}.png")), &[runs_series], &[fitted], &axes)?;
    eprintln!("ablate: wrote {}/{stem}.png and .csv", args.dir.display());
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::tally;

    /// A role given after the run, or a post hoc prediction, never counts among the reproduced predictions
    /// (issue 69: four such controls were in "13 of 21").
    #[test]
    fn outcomes_whose_role_came_after_the_results_are_tallied_apart() {
        let outcomes: Vec<String> = [
            "reproduced",
            "reproduced (its role given after the run)",
            "not reproduced (the opposite direction)",
            "inconclusive",
            "reproduced (post hoc: not the prediction these results ran against)",
            "not yet run",
        ]
        .map(String::from)
        .to_vec();
        assert_eq!(
            tally(&outcomes),
            "1 of 3 run reproduced, 0 consistent, 1 not reproduced, 1 inconclusive; 1 not yet run; tallied apart, 2 \
             whose prediction or role came after its results: 2 of 2 run reproduced, 0 consistent, 0 not reproduced, \
             0 inconclusive"
        );
    }
}
