//! Reading a recipe and its results without training: `check`, `summary`, `reproduce`, `plot`.
use std::path::PathBuf;

use ablate::run::reproduce;

use super::target::{Sweep, Target};
use super::OverrideArgs;

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
    recipe: PathBuf,
    #[command(flatten)]
    overrides: OverrideArgs,
    #[arg(long)]
    out: Option<PathBuf>,
    /// Compare every variant with this one, paired by seed: `heads=1` (a swept key, by its last part or
    /// its full name) or a variant's label.
    #[arg(long)]
    baseline: Option<String>,
}

#[derive(clap::Args)]
pub struct ReproduceArgs {
    recipe: PathBuf,
    #[command(flatten)]
    overrides: OverrideArgs,
    #[arg(long)]
    out: Option<PathBuf>,
    #[arg(long)]
    reference: Option<PathBuf>,
}

#[derive(clap::Args)]
pub struct PlotArgs {
    recipe: PathBuf,
    #[command(flatten)]
    overrides: OverrideArgs,
    #[arg(long)]
    out: Option<PathBuf>,
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
    ablate::tasks::memory::check_runs_fit(&path.display().to_string(), &recipe.runs)?;
    if args.columns {
        return print_columns(recipe);
    }
    let kinds: Vec<String> = recipe.kinds().iter().map(|k| k.to_string()).collect();
    println!("{}: ok, {} runs (kind {})", path.display(), recipe.runs.len(), kinds.join(", "));
    for r in &recipe.runs {
        let memory = ablate::tasks::memory::human(ablate::tasks::memory::training_bytes(&r.config));
        println!("  {} (config {}, about {memory} to train)", r.id, r.config_hash);
    }
    Ok(())
}

/// The runs as the rows `runs.csv` will have, metric columns empty.
fn print_columns(recipe: &ablate::recipe::Recipe) -> anyhow::Result<()> {
    let header = ablate::run::results::recipe_header(&recipe.runs);
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
        w.write_record(ablate::run::results::row_under(&header, r, &untrained))?;
    }
    w.flush()?;
    Ok(())
}

/// `ablate summary`: the results table, optionally paired against a baseline.
pub fn summary(args: &SummaryArgs) -> anyhow::Result<()> {
    let sweep = Sweep::load(&args.recipe, false, &args.overrides.parse()?, args.out.clone())?;
    print!("{}", ablate::run::summary::summary_table(&sweep.out, &sweep.recipe, args.baseline.as_deref())?);
    Ok(())
}

/// `ablate reproduce`: a run directory against reference results; writes reproduction.csv and the report.
pub fn reproduce(args: &ReproduceArgs) -> anyhow::Result<()> {
    let sweep = Sweep::load(&args.recipe, false, &args.overrides.parse()?, args.out.clone())?;
    let reference = args.reference.clone().unwrap_or_else(|| sweep.reference());
    let Some(verdicts) = reproduce::compare(&sweep.recipe, &sweep.out, &reference)? else {
        anyhow::bail!("{} has no runs.csv to compare with", reference.display());
    };
    reproduce::write(&verdicts, &sweep.out.join("reproduction.csv"))?;
    ablate::run::report::write_report(&sweep.out, &sweep.recipe)?;
    for line in reproduce::lines(&verdicts, &reference) {
        println!("{line}");
    }
    Ok(())
}

/// `ablate plot`: plots, TensorBoard files and the report redrawn from the CSVs.
pub fn plot(args: &PlotArgs) -> anyhow::Result<()> {
    match Target::load(&args.recipe, false, &args.overrides, args.out.clone())? {
        Target::Benchmark { recipe, out, .. } => ablate::run::complexity::replot(&recipe, &out),
        Target::Sweep(sweep) => ablate::run::finish(&sweep.out, &sweep.recipe),
    }
}
