//! Training a recipe: `ablate RECIPE` in one process, on worker processes (`--workers`, `--devices`) or as
//! one rank of a data-parallel launch; `ablate merge` for the shards of `--shard`; `ablate slurm` for the
//! scripts that run a recipe on a cluster.
use std::path::PathBuf;

use ablate::recipe::Recipe;
use ablate::run::bench::BenchModel;
use ablate::run::scale::{self, Shard, SlurmPlan, WorkerPlan, Workers};
use ablate::run::sweep::{run_recipe, SweepOptions};

use super::target::{self, Sweep, Target};
use super::OverrideArgs;

#[derive(clap::Args)]
pub struct RunArgs {
    /// Recipe file (looked up under recipes/ when not found as given).
    recipe: Option<PathBuf>,
    #[command(flatten)]
    overrides: OverrideArgs,
    /// Shrink every run to seconds (few steps, small model and data) keeping the sweep's shape.
    #[arg(long)]
    smoke: bool,
    /// Re-run everything, discarding earlier results in the output directory.
    #[arg(long)]
    force: bool,
    /// auto (CUDA when available), cpu, cuda, or cuda:N.
    #[arg(long, default_value = "auto")]
    device: String,
    /// Output directory (default: runs/<recipe name>, with a suffix naming any overrides; target/smoke/...
    /// with --smoke). The committed reference results are in results/<name>: write there only on purpose.
    #[arg(long)]
    out: Option<PathBuf>,
    /// No progress bar or per-run lines.
    #[arg(long)]
    quiet: bool,
    /// Train only shard I of N (0-based, e.g. `$SLURM_ARRAY_TASK_ID/4`) into <out>/shards/; combine the
    /// shards with `ablate merge`.
    #[arg(long, conflicts_with_all = ["workers", "devices"])]
    shard: Option<Shard>,
    /// Run the sweep on N parallel worker processes on --device (CPU workers split the cores), then merge;
    /// `auto` times the possible splits of the cores (workers × threads) at the first run's model size first.
    #[arg(long, conflicts_with = "devices")]
    workers: Option<Workers>,
    /// One worker process per listed device, e.g. `cuda:0,cuda:1` or `cpu,cpu`, then merge.
    #[arg(long, value_delimiter = ',')]
    devices: Option<Vec<String>>,
    /// Intra-op CPU threads of this process (of each worker with --workers/--devices).
    #[arg(long)]
    pub threads: Option<usize>,
    /// After the recipe's seeds (the pilot), add a second stage: every arm of a comparison of the primary
    /// metric gets at least two more seeds, as many as the pilot's paired spread says settle it at δ, up to
    /// the plan's cap (`compare.max_seeds`); the verdicts then combine the two stages (docs/results.md, "The
    /// two-stage design"). What is added never reads the pilot's verdicts or differences. With --workers or
    /// --devices both passes run on the pool; with --shard, add --settle-phase.
    #[arg(long)]
    until_settled: bool,
    /// The plan's cap when the recipe has no `compare.max_seeds` (refused when it has a different one).
    #[arg(long, requires = "until_settled")]
    max_seeds: Option<usize>,
    /// With --until-settled --shard: the pass this shard trains, `pilot` (the recipe's seeds) or `added`
    /// (the seeds the pilot asks for, read from <out>/runs.csv once `ablate merge RECIPE --until-settled` has
    /// combined the pilot's shards). Worker pools and `ablate slurm --until-settled` pass it themselves.
    #[arg(long, value_enum, requires_all = ["until_settled", "shard"])]
    settle_phase: Option<SettlePhase>,
}

/// The two passes of `--until-settled`, as a shard is told which one it trains.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum SettlePhase {
    /// The recipe's own seeds.
    Pilot,
    /// The seeds the merged pilot asks for.
    Added,
}

impl SettlePhase {
    fn name(self) -> &'static str {
        match self {
            SettlePhase::Pilot => "pilot",
            SettlePhase::Added => "added",
        }
    }
}

/// `--until-settled`'s recipe extended to every seed an arm may end with, and the runs of each pass.
struct Settling {
    cap: usize,
    pool: Vec<u64>,
    /// The recipe with the whole pool of seeds: every run either pass may train, and every row kept by a merge.
    full: Recipe,
}

impl Settling {
    fn new(sweep: &Sweep, smoke: bool, overrides: &OverrideArgs, max_seeds: Option<usize>) -> anyhow::Result<Self> {
        // Checked before the pool is built: the cap bounds its size.
        let cap = ablate::run::settle::check(&sweep.recipe, max_seeds)?;
        let pool = ablate::run::settle::seed_pool(&sweep.recipe.seeds, cap);
        let mut parsed = overrides.parse()?;
        parsed.seeds = Some((pool.clone(), format!("--until-settled --max-seeds {cap}")));
        let mut full = ablate::recipe::load_with(&sweep.path, smoke, &parsed)?;
        // The plan the runs record: the cap, whether the recipe or the command line gave it.
        if let Some(c) = full.compare.as_mut() {
            c.max_seeds = Some(cap);
        }
        Ok(Self { cap, pool, full })
    }

    /// The recipe as given with the plan's cap: its seeds are the pilot, and its verdicts combine the stages.
    fn planned(&self, base: &Recipe) -> Recipe {
        let mut planned = base.clone();
        if let Some(c) = planned.compare.as_mut() {
            c.max_seeds = Some(self.cap);
        }
        planned
    }

    /// Per arm, the seeds it should end with at each scale: none for the pilot, else what the pilot's rows in
    /// `out` (and `out/scale_check`) ask for (a function of those rows alone, so every shard computes the same).
    fn targets(&self, base: &Recipe, phase: SettlePhase, out: &std::path::Path) -> anyhow::Result<Targets> {
        Ok(match phase {
            SettlePhase::Pilot => Targets::default(),
            SettlePhase::Added => {
                let results = ablate::judge::reading::Results::open(out, base, None)?;
                Targets {
                    main: ablate::run::settle::targets(&results, self.cap)?,
                    second: ablate::run::settle::second_scale_targets(&results, self.cap)?,
                }
            }
        })
    }

    /// The runs of one pass over `base` (the recipe as given) with `targets`, in the order of the full recipe,
    /// its second scale filtered the same way by that scale's targets; with `finished_in`, also every run
    /// already in that directory's `runs.csv` or one of its shards' (rows an earlier call added beyond this
    /// call's plan). Every shard reads the same rows, so the shards split the same list of runs.
    fn pass(&self, base: &Recipe, targets: &Targets, finished_in: Option<&std::path::Path>) -> Recipe {
        let pilot = base.seeds.len();
        let filter = |recipe: &Recipe, arms: &ArmTargets, dir: Option<std::path::PathBuf>| {
            let mut dirs: Vec<std::path::PathBuf> = dir.iter().cloned().collect();
            dirs.extend(dir.iter().flat_map(|d| ablate::run::scale::shard_dirs(d).unwrap_or_default()));
            let finished: std::collections::HashSet<String> = dirs
                .iter()
                .filter_map(|d| ablate::judge::reading::reported_runs(d).ok())
                .flat_map(|rows| rows.into_iter().map(|r| r["run_id"].clone()))
                .collect();
            let keeps = |r: &&ablate::recipe::RunSpec| {
                ablate::run::settle::keeps(r, &self.pool, pilot, arms) || finished.contains(&r.id)
            };
            recipe.runs.iter().filter(keeps).cloned().collect::<Vec<_>>()
        };
        let scale_check = self.full.scale_check.as_ref().map(|(check, settings)| {
            let runs = filter(check, &targets.second, finished_in.map(|d| d.join("scale_check")));
            (Box::new(Recipe { runs, ..(**check).clone() }), settings.clone())
        });
        let runs = filter(&self.full, &targets.main, finished_in.map(std::path::Path::to_path_buf));
        Recipe { runs, scale_check, ..self.full.clone() }
    }
}

/// Per arm (variant label), the seeds it should end with under `--until-settled`.
type ArmTargets = std::collections::BTreeMap<String, usize>;

/// [`ArmTargets`] at the recipe's scale and at its second scale (`scale_check:`), each from its own pilot.
#[derive(Default)]
struct Targets {
    main: ArmTargets,
    second: ArmTargets,
}

impl RunArgs {
    /// Whether the sweep is spread over several processes of this machine (or limited to one shard).
    fn splits_the_sweep(&self) -> bool {
        self.shard.is_some() || self.workers.is_some() || self.devices.is_some()
    }
}

#[derive(clap::Args)]
pub struct MergeArgs {
    recipe: PathBuf,
    #[command(flatten)]
    overrides: OverrideArgs,
    #[arg(long)]
    out: Option<PathBuf>,
    #[arg(long)]
    smoke: bool,
    /// The shards of an `--until-settled` run: keep the rows of every seed an arm may end with (the recipe's
    /// plus those added, up to --max-seeds), not only the recipe's.
    #[arg(long)]
    until_settled: bool,
    /// The cap the run was given when the recipe has no `compare.max_seeds`.
    #[arg(long, requires = "until_settled")]
    max_seeds: Option<usize>,
}

#[derive(clap::Args)]
pub struct WallClockArgs {
    recipe: PathBuf,
    /// The results directory `wall_clock.csv` goes into (default: the recipe's, as `ablate RECIPE` writes it).
    #[arg(long)]
    out: Option<PathBuf>,
    /// Steps each timed run trains (more than the recipe's warm-up).
    #[arg(long, default_value_t = 200)]
    steps: i64,
    /// Timed runs of each arm, the arms in turn within each.
    #[arg(long, default_value_t = 5)]
    repeats: usize,
    /// Shrink the model and data to seconds, as `--smoke` does for a run (CI times the path this way).
    #[arg(long)]
    smoke: bool,
    /// auto (CUDA when available), cpu, cuda, or cuda:N.
    #[arg(long, default_value = "auto")]
    device: String,
}

#[derive(clap::Args)]
pub struct SlurmArgs {
    recipe: PathBuf,
    #[command(flatten)]
    overrides: OverrideArgs,
    /// Number of array tasks (shards).
    #[arg(long, required_unless_present = "nodes", conflicts_with_all = ["nodes", "tasks_per_node"])]
    shards: Option<usize>,
    /// Nodes of a data-parallel job (srun starts --tasks-per-node ranks on each).
    #[arg(long, requires = "tasks_per_node")]
    nodes: Option<usize>,
    /// Ranks per node of a data-parallel job (one per GPU on a GPU node).
    #[arg(long, requires = "nodes")]
    tasks_per_node: Option<usize>,
    #[arg(long)]
    out: Option<PathBuf>,
    #[arg(long)]
    smoke: bool,
    /// Device of every task (`cuda` with --gpus-per-task).
    #[arg(long, default_value = "auto")]
    device: String,
    #[arg(long, default_value_t = 1)]
    cpus_per_task: usize,
    #[arg(long, default_value_t = 0)]
    gpus_per_task: usize,
    #[arg(long)]
    partition: Option<String>,
    /// Wall-clock limit per task, Slurm syntax (e.g. 02:00:00).
    #[arg(long)]
    time: Option<String>,
    /// Scripts for `--until-settled`: the pilot's array and its merge, then an array for the seeds the
    /// merged pilot asks for and the final merge, chained by dependencies.
    #[arg(long, conflicts_with = "nodes")]
    until_settled: bool,
    /// The plan's cap when the recipe has no `compare.max_seeds`.
    #[arg(long, requires = "until_settled")]
    max_seeds: Option<usize>,
}

/// `ablate RECIPE`: a complexity benchmark, or the recipe's runs here, on workers or as one rank of a
/// launch; then the comparison with the committed reference results.
pub fn run(args: &RunArgs) -> anyhow::Result<()> {
    let Some(name) = &args.recipe else {
        anyhow::bail!("no recipe given: try `ablate recipes/heads.yaml` or `ablate --help`");
    };
    ablate::train::stop_on_signals()?;
    let sweep = match Target::load(name, args.smoke, &args.overrides, args.out.clone())? {
        Target::Benchmark { path, recipe, out } => {
            if args.splits_the_sweep() {
                anyhow::bail!(
                    "{}: a complexity benchmark times one point at a time on one device; --shard, --workers and --devices do not apply",
                    path.display()
                );
            }
            // Validate the device here, once, rather than in every child.
            target::device(&args.device)?;
            return ablate::run::complexity::run(&recipe, &std::env::current_exe()?, &out, &args.device, args.quiet);
        }
        Target::Sweep(sweep) => sweep,
    };
    let (sweep, device) = match ablate::run::launch::from_env()? {
        None => (alone(sweep)?, target::device(&args.device)?),
        Some(membership) => {
            if args.splits_the_sweep() {
                anyhow::bail!(
                    "a data-parallel launch ({} processes) trains each run on all of them: --shard, --workers and --devices do not apply",
                    membership.world
                );
            }
            let Sweep { path, recipe, .. } = sweep;
            let request = ablate::run::launch::Request {
                recipe,
                recipe_path: &path,
                device: &args.device,
                threads: args.threads,
                quiet: args.quiet,
            };
            let (recipe, device) = ablate::run::launch::join(&membership, request)?;
            let out = args.out.clone().unwrap_or_else(|| target::default_out(&recipe));
            (Sweep { path, recipe, out }, device)
        }
    };
    let rank = ablate::train::distributed::current().map_or(0, |g| g.rank);
    if args.until_settled {
        until_settled(args, &sweep, device)?;
        if args.shard.is_some() {
            return Ok(());
        }
    } else if let Some((devices, threads)) = worker_devices(args, &sweep.recipe, device)? {
        run_on_workers(args, &sweep, devices, threads, None)?;
    } else {
        let quiet = args.quiet || rank != 0;
        let opts = SweepOptions { out: &sweep.out, device, force: args.force, quiet, shard: args.shard };
        run_recipe(&sweep.recipe, &opts)?;
        if args.shard.is_some() || rank != 0 {
            return Ok(());
        }
    }
    // Keys set on the command line, when the reference is current for the recipe itself: a difference from
    // the reference is then theirs, not the reference's age.
    let parsed = args.overrides.parse()?;
    let mut overridden: Vec<String> =
        parsed.set.iter().map(|(k, _, _)| k.clone()).chain(parsed.sweep.iter().map(|(k, _, _)| k.clone())).collect();
    if !overridden.is_empty() {
        let plain = Sweep::load(&sweep.path, false, &Default::default(), None)?;
        let reference = ablate::judge::reading::Results::open_if_any(&sweep.reference(), &plain.recipe, None)?;
        if reference.is_none_or(|r| !ablate::judge::reproduce::staleness(&r).is_empty()) {
            overridden.clear();
        }
    }
    ablate::judge::reproduce::report(&sweep.recipe, &sweep.out, &sweep.reference(), args.quiet, &overridden)
}

/// `--until-settled`: the recipe's seeds (the pilot), then the seeds its inconclusive comparisons need
/// (`run::settle`), trained into the same directory, here or on a worker pool; rows of seeds added by an
/// earlier call are kept. A shard (`--shard` with `--settle-phase`) trains its part of one pass only.
fn until_settled(args: &RunArgs, sweep: &Sweep, device: tch::Device) -> anyhow::Result<()> {
    let settling = Settling::new(sweep, args.smoke, &args.overrides, args.max_seeds)?;
    let base = &sweep.recipe;
    let opts = SweepOptions { out: &sweep.out, device, force: args.force, quiet: args.quiet, shard: args.shard };
    match (args.shard, args.settle_phase) {
        (Some(_), Some(phase)) => {
            let targets = settling.targets(base, phase, &sweep.out)?;
            // Rows an earlier call added beyond this pass's plan (the second stage of an earlier pool, in
            // this shard or merged) stay, as they do in one process: a resumed pool's pilot pass meets them.
            return run_recipe(&settling.pass(base, &targets, Some(&sweep.out)), &opts);
        }
        (Some(shard), None) => anyhow::bail!(
            "--until-settled --shard {shard}: a shard trains one of the two passes: add --settle-phase pilot (the recipe's seeds), or --settle-phase added once `ablate merge {} --until-settled` has combined the pilot",
            sweep.path.display()
        ),
        _ => {}
    }
    let workers = worker_devices(args, base, device)?;
    for phase in [SettlePhase::Pilot, SettlePhase::Added] {
        let targets = settling.targets(base, phase, &sweep.out)?;
        if phase == SettlePhase::Added && !args.quiet {
            let pilot = base.seeds.len();
            let mut added: Vec<String> = Vec::new();
            for (arms, scale) in [(&targets.main, ""), (&targets.second, " (second scale)")] {
                added
                    .extend(arms.iter().filter(|(_, &n)| n > pilot).map(|(arm, n)| format!("{arm}{scale}: {n} seeds")));
            }
            match added.is_empty() {
                true => eprintln!("ablate: --until-settled: every arm already has its second stage"),
                false => {
                    eprintln!("ablate: --until-settled (at most {} seeds per arm): {}", settling.cap, added.join(", "))
                }
            }
        }
        match &workers {
            Some((devices, threads)) => {
                let settle = WorkerSettle { phase, cap: settling.cap, merged: &settling.full };
                let pass = settling.pass(base, &targets, None);
                let shown = Recipe { runs: pass.runs, scale_check: pass.scale_check, ..base.clone() };
                let shown = Sweep { path: sweep.path.clone(), recipe: shown, out: sweep.out.clone() };
                run_on_workers(args, &shown, devices.clone(), *threads, Some(settle))?
            }
            // Rows an earlier call added beyond this call's plan stay in runs.csv.
            None => run_recipe(&settling.pass(base, &targets, Some(&sweep.out)), &opts)?,
        }
    }
    if !args.quiet {
        let planned = settling.planned(base);
        let results = ablate::judge::reading::Results::open(&sweep.out, &planned, None)?;
        if let Some(j) = ablate::judge::summary::judgements(&results)? {
            let [better, worse, equivalent, inconclusive, untested, incomplete] =
                ablate::judge::verdicts::counts(&j.rows);
            eprintln!(
                "ablate: verdicts of the primary metric over both stages: {better} better, {worse} worse, {equivalent} equivalent, {inconclusive} inconclusive, {incomplete} incomplete, {untested} untested"
            );
        }
    }
    Ok(())
}

/// What the workers of one `--until-settled` pass are told, and the recipe their shards merge under.
struct WorkerSettle<'a> {
    phase: SettlePhase,
    cap: usize,
    merged: &'a Recipe,
}

/// A recipe run by a lone process must not ask for several data-parallel processes.
fn alone(sweep: Sweep) -> anyhow::Result<Sweep> {
    if let Some(run) = sweep.recipe.runs.iter().find(|r| r.config.train.world_size > 1) {
        anyhow::bail!(
            "{}: run `{}` has train.world_size {n}, but this process was launched alone: start {n} with \
             `torchrun --no-python --nproc-per-node {n} ablate …` or `srun -n {n} ablate …`",
            sweep.path.display(),
            run.id,
            n = run.config.train.world_size
        );
    }
    Ok(sweep)
}

/// The devices of the worker processes (`--devices`, or `--workers` copies of `--device`) and their
/// threads (given, chosen by `--workers auto`, or None); `None` without workers.
fn worker_devices(
    args: &RunArgs,
    recipe: &Recipe,
    device: tch::Device,
) -> anyhow::Result<Option<(Vec<String>, Option<usize>)>> {
    Ok(match (&args.devices, args.workers) {
        (Some(list), _) => Some((list.clone(), args.threads)),
        (None, Some(Workers::Count(n))) => Some((vec![args.device.clone(); n], args.threads)),
        (None, Some(Workers::Auto)) => {
            let (n, t) = auto_workers(recipe, device, args.quiet)?;
            Some((vec![args.device.clone(); n], Some(t)))
        }
        (None, None) => None,
    })
}

/// The sweep (one pass of `--until-settled` with `settle`) on one worker process per device, then merged.
fn run_on_workers(
    args: &RunArgs,
    sweep: &Sweep,
    devices: Vec<String>,
    threads: Option<usize>,
    settle: Option<WorkerSettle>,
) -> anyhow::Result<()> {
    if devices.is_empty() {
        anyhow::bail!("--workers / --devices: need at least one worker");
    }
    for d in &devices {
        target::device(d).map_err(|e| anyhow::anyhow!("--devices: {e}"))?;
    }
    if let Some(gpu) = ablate::run::scale::shared_gpu(&devices) {
        if let Some(run) = sweep.recipe.runs.iter().find(|r| r.config.train.seconds_budget().is_some()) {
            anyhow::bail!(
                "{}: run `{}` has a seconds budget, but several workers share GPU {gpu}: a run's steps would depend on which runs happen to share it; give each worker its own GPU (--devices cuda:0,cuda:1,...) or budget tokens or FLOPs",
                sweep.path.display(),
                run.id
            );
        }
    }
    let cores = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1);
    let threads = threads.unwrap_or((cores / devices.len()).max(1));
    let plan = WorkerPlan {
        recipe_path: &sweep.path,
        out: &sweep.out,
        smoke: args.smoke,
        force: args.force,
        devices,
        threads,
        child_args: settle.as_ref().map_or(Vec::new(), |s| {
            let cap = s.cap.to_string();
            ["--until-settled", "--max-seeds", &cap, "--settle-phase", s.phase.name()].map(String::from).to_vec()
        }),
        merged: settle.as_ref().map(|s| s.merged),
    };
    scale::run_workers(&sweep.recipe, &plan, args.quiet)
}

/// `--workers auto`: times every split of the cores into workers × threads on a GPT of the first run's size
/// and picks one (see `scale::choose_split`), saying what it measured.
fn auto_workers(recipe: &Recipe, device: tch::Device, quiet: bool) -> anyhow::Result<(usize, usize)> {
    if device != tch::Device::Cpu {
        anyhow::bail!("--workers auto splits CPU cores; on GPUs list them with --devices cuda:0,cuda:1,...");
    }
    let first = &recipe.runs.first().ok_or_else(|| anyhow::anyhow!("{}: no runs", recipe.name))?.config;
    let t = first.transformer_spec();
    let model = BenchModel {
        layers: t.layers,
        heads: t.attention.heads,
        d_model: t.d_model,
        block: t.block_size,
        batch: first.train.batch_size,
        vocab: first.data.vocab_size.unwrap_or(96),
    };
    let cores = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1);
    let splits = scale::probe_splits(&model, cores, recipe.runs.len())?;
    let chosen = scale::choose_split(&splits).ok_or_else(|| anyhow::anyhow!("--workers auto: nothing to probe"))?;
    if !quiet {
        let measured: Vec<String> = splits
            .iter()
            .map(|s| format!("{} x {} thread(s) {:.0} tokens/s", s.workers, s.threads, s.tokens_per_s))
            .collect();
        eprintln!(
            "ablate: --workers auto on {cores} cores ({}L/d{} T={} B={}): {} -> {} worker(s) x {} thread(s)",
            model.layers,
            model.d_model,
            model.block,
            model.batch,
            measured.join(", "),
            chosen.workers,
            chosen.threads
        );
    }
    Ok((chosen.workers, chosen.threads))
}

/// `ablate merge`: the shards of a sharded run combined into its output directory.
pub fn merge(args: &MergeArgs) -> anyhow::Result<()> {
    let sweep = Sweep::load(&args.recipe, args.smoke, &args.overrides.parse()?, args.out.clone())?;
    if args.until_settled {
        let settling = Settling::new(&sweep, args.smoke, &args.overrides, args.max_seeds)?;
        return scale::merge(&settling.full, &sweep.out, false).map(|_| ());
    }
    if let Some(flags) = settled_with(&sweep.out) {
        anyhow::bail!(
            "{}: its runs were trained with `{flags}`: merge with the same flags, or the seeds it added would be dropped",
            sweep.out.display()
        );
    }
    scale::merge(&sweep.recipe, &sweep.out, false).map(|_| ())
}

/// The `--until-settled --max-seeds N` a results directory's runs were trained with, as its
/// `recipe.resolved.yaml` records them among the overrides.
fn settled_with(out: &std::path::Path) -> Option<String> {
    ablate::judge::reading::recorded(out).overrides.into_iter().find(|o| o.starts_with("--until-settled"))
}

/// `ablate slurm`: an array job of shards and its merge job, or one data-parallel job.
pub fn slurm(args: &SlurmArgs) -> anyhow::Result<()> {
    if args.cpus_per_task == 0 {
        anyhow::bail!("--cpus-per-task must be at least 1");
    }
    let data_parallel = match (args.nodes, args.tasks_per_node) {
        (Some(0), _) | (_, Some(0)) => anyhow::bail!("--nodes and --tasks-per-node must be at least 1"),
        (Some(n), Some(t)) => Some((n, t)),
        _ => None,
    };
    let shards = match (data_parallel, args.shards) {
        (Some(_), _) => 1,
        (None, Some(n)) if n > 0 => n,
        (None, _) => anyhow::bail!("--shards must be at least 1"),
    };
    let mut overrides = args.overrides.parse()?;
    if let Some((n, t)) = data_parallel {
        // The job's ranks are recorded as train.world_size (and name the default output directory), so a
        // job started with another number of tasks is refused.
        overrides = overrides.with(&format!("train.world_size={}", n * t))?;
    }
    let sweep = Sweep::load(&args.recipe, args.smoke, &overrides, args.out.clone())?;
    let until_settled = match args.until_settled {
        true => Some(Settling::new(&sweep, args.smoke, &args.overrides, args.max_seeds)?.cap),
        false => None,
    };
    // The scripts are written on a login node, which often has no GPU: only the spelling is checked here.
    ablate::device_spec(&args.device).map_err(anyhow::Error::msg)?;
    let plan = SlurmPlan {
        recipe_path: &sweep.path,
        out: &sweep.out,
        shards,
        smoke: args.smoke,
        device: &args.device,
        cpus_per_task: args.cpus_per_task,
        gpus_per_task: args.gpus_per_task,
        partition: args.partition.as_deref(),
        time: args.time.as_deref(),
        until_settled,
    };
    let recipe = &sweep.recipe;
    if let Some((nodes, tasks)) = data_parallel {
        let submit = scale::write_slurm_data_parallel_script(recipe, &plan, nodes, tasks)?;
        println!(
            "{} runs, each data-parallel over {nodes} nodes x {tasks} tasks; submit with: {}",
            recipe.runs.len(),
            submit.display()
        );
        return Ok(());
    }
    let submit = scale::write_slurm_scripts(recipe, &plan)?;
    println!(
        "{} runs in {shards} array tasks; submit with: {}\n(or sbatch {} yourself, then `ablate merge {}`)",
        recipe.runs.len(),
        submit.display(),
        submit.with_file_name("array.sbatch").display(),
        sweep.path.display()
    );
    Ok(())
}

/// `ablate wall-clock`: each arm of a compute ladder timed in turn, written to `<out>/wall_clock.csv` for the
/// compute section's gains in wall-clock time.
pub fn wall_clock(args: &WallClockArgs) -> anyhow::Result<()> {
    let sweep = Sweep::load(&args.recipe, args.smoke, &ablate::recipe::Overrides::default(), args.out.clone())?;
    let device = super::target::device(&args.device)?;
    ablate::run::wall_clock::measure(&sweep.recipe, &sweep.out, args.steps, args.repeats, device)?;
    println!("wrote {}", sweep.out.join(ablate::run::wall_clock::FILE).display());
    Ok(())
}
