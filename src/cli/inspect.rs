//! Looking into models and checkpoints: `describe` (sizes and FLOPs), `generate` (text from a decoder),
//! `heads-importance` (head pruning), `attention` (weight maps), `embed` (sentence embeddings), `coord-check`
//! (muP's coordinate check).
use std::path::{Path, PathBuf};

use ablate::models::decode::Decoding;
use ablate::recipe;
use ablate::tasks::{checkpoint, parameter_count, task, DataCache};
use clap::ValueEnum;

use super::target;

#[derive(clap::Args)]
pub struct DescribeArgs {
    /// A preset name (see `ablate describe --list`) or a recipe.
    preset: Option<String>,
    #[arg(long)]
    list: bool,
}

/// Which decoder `ablate generate` uses; its parameters (temperature, top-k, width) are flags of their own.
#[derive(Clone, Copy, ValueEnum)]
enum Decoder {
    Greedy,
    Sample,
    Beam,
}

#[derive(clap::Args)]
pub struct GenerateArgs {
    /// The run's `.safetensors` (or `.json`) file under `<results>/checkpoints/`.
    checkpoint: PathBuf,
    #[arg(long, default_value = "\n")]
    prompt: String,
    /// Number of new tokens.
    #[arg(long, default_value_t = 200)]
    tokens: usize,
    /// greedy, sample (temperature, optional top-k) or beam (width).
    #[arg(long, value_enum, default_value_t = Decoder::Sample)]
    decoding: Decoder,
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
}

impl GenerateArgs {
    fn decoding(&self) -> anyhow::Result<Decoding> {
        match self.decoding {
            Decoder::Greedy => Ok(Decoding::Greedy),
            Decoder::Sample if self.temperature > 0.0 => {
                Ok(Decoding::Sample { temperature: self.temperature, top_k: self.top_k })
            }
            Decoder::Sample => anyhow::bail!("--temperature must be positive, got {}", self.temperature),
            Decoder::Beam if self.width >= 1 => Ok(Decoding::Beam { width: self.width }),
            Decoder::Beam => anyhow::bail!("--width must be at least 1"),
        }
    }
}

#[derive(clap::Args)]
pub struct HeadsImportanceArgs {
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
}

#[derive(clap::Args)]
pub struct AttentionArgs {
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
}

#[derive(clap::Args)]
pub struct EmbedArgs {
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
}

/// `ablate generate`: the checkpoint's decoder continues the prompt.
pub fn generate(args: &GenerateArgs) -> anyhow::Result<()> {
    let decoding = args.decoding()?;
    let device = target::device(&args.device)?;
    let loaded = checkpoint::load(&args.checkpoint, device)?;
    let kind = loaded.config.kind;
    let (Some(decoder), Some(tokenizer)) = (loaded.model.decoder(), loaded.tokenizer.as_ref()) else {
        anyhow::bail!("{}: a kind {kind} model does not generate text (kind lm does)", args.checkpoint.display());
    };
    let ids = tokenizer.encode(&args.prompt).map_err(|e| anyhow::anyhow!("--prompt: {e}"))?;
    if ids.is_empty() {
        anyhow::bail!("--prompt is empty: give at least one character");
    }
    tch::manual_seed(args.seed);
    let out = ablate::models::decode::generate(decoder, &ids, args.tokens, decoding, !args.no_cache);
    println!("{}", tokenizer.decode(&out));
    Ok(())
}

#[derive(clap::Args)]
pub struct ExportArgs {
    /// A checkpoint (`.safetensors` or `.json` under `<results>/checkpoints/`), or a results directory with --run.
    source: PathBuf,
    /// With a results directory: the run to export, by its run_id in runs.csv (it must have been trained
    /// with `train.checkpoint: true`).
    #[arg(long)]
    run: Option<String>,
    /// The library to write for: `hf` (Hugging Face transformers, which TransformerLens reads too) or `timm`
    /// (Swin, DaViT); when left out, the chosen layout's. A layout of the other library is refused.
    #[arg(long, value_parser = ["hf", "timm"])]
    to: Option<String>,
    /// `auto` (the plainest layout that expresses the model exactly), `gpt2`, `opt`, `llama`, `mistral` or `qwen3` (decoders), `bert`, `vit`, `imagegpt`, `swin`, `davit` (timm).
    #[arg(long, default_value = "auto")]
    layout: String,
    /// The directory to write (created if missing).
    #[arg(long)]
    out: PathBuf,
}

/// `ablate export`: a checkpoint in a Hugging Face layout.
pub fn export(args: &ExportArgs) -> anyhow::Result<()> {
    use ablate::tasks::export;
    let (path, results) = match (&args.run, args.source.is_dir()) {
        (Some(run), true) => {
            let stem = checkpoint::file_stem(run);
            let path = args.source.join("checkpoints").join(format!("{stem}.safetensors"));
            if !path.exists() {
                anyhow::bail!(
                    "{}: no checkpoint of run `{run}` (train it with `train.checkpoint: true`)",
                    path.display()
                );
            }
            (path, Some(args.source.as_path()))
        }
        (None, true) => anyhow::bail!("{} is a directory: name the run to export with --run", args.source.display()),
        (Some(_), false) => anyhow::bail!("--run reads a results directory, and {} is none", args.source.display()),
        (None, false) => (args.source.clone(), None),
    };
    let loaded = checkpoint::load(&path, tch::Device::Cpu)?;
    let layout = match args.layout.as_str() {
        "auto" => export::choose(&loaded.config).map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?,
        name => export::Layout::parse(name).map_err(|e| anyhow::anyhow!("--layout: {e}"))?,
    };
    if let Some(to) = &args.to {
        if layout.library() != to {
            anyhow::bail!(
                "--to {to}: the {} layout is {}'s (--to {})",
                layout.name(),
                layout.library(),
                layout.library()
            );
        }
    }
    let weights: std::collections::HashMap<String, tch::Tensor> = loaded.vs.variables();
    let vocab = weights.get("token_embedding.weight").map_or(0, |w| w.size()[0]);
    let exported = export::convert(layout, &loaded.config, &weights, vocab)?;
    export::write(&args.out, &exported)?;
    if let Some(t) = &loaded.tokenizer {
        export::write_tokenizer(&args.out, t)?;
    }
    let run_id = args
        .run
        .clone()
        .unwrap_or_else(|| path.file_stem().map(|s| s.to_string_lossy().into_owned()).unwrap_or_default());
    let metrics = match results {
        Some(dir) => ablate::judge::reading::all_runs(dir)?
            .into_iter()
            .find(|r| r.get("run_id") == Some(&run_id))
            .map(|r| r.into_iter().filter(|(k, v)| k.starts_with("test_") && !v.is_empty()).collect())
            .unwrap_or_default(),
        None => Vec::new(),
    };
    let commit = std::process::Command::new("git")
        .args(["rev-parse", "--short", "HEAD"])
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string());
    let source = format!(
        "kind {}, checkpoint {}{}",
        loaded.config.kind,
        path.display(),
        commit.map_or(String::new(), |c| format!(", exported at commit {c}"))
    );
    export::write_card(&args.out, layout, &source, &run_id, &metrics)?;
    eprintln!(
        "ablate: wrote {} in the {} layout ({}) to {}",
        run_id,
        layout.name(),
        layout.class(),
        args.out.display()
    );
    Ok(())
}

#[derive(clap::Args)]
pub struct ImportArgs {
    /// A Hugging Face model directory: config.json, model.safetensors (and tokenizer.json, if any).
    source: PathBuf,
    /// The recipe to write (`-`: standard output).
    #[arg(long, default_value = "-")]
    out: PathBuf,
}

/// `ablate import`: the recipe that starts from a Hugging Face decoder.
pub fn import(args: &ImportArgs) -> anyhow::Result<()> {
    let checkpoint = ablate::tasks::import::read(&args.source)?;
    let recipe = ablate::tasks::import::recipe(&checkpoint, &args.source.display().to_string())?;
    if args.out.as_os_str() == "-" {
        print!("{recipe}");
        return Ok(());
    }
    ablate::files::write_atomically(&args.out, recipe.as_bytes())?;
    eprintln!(
        "ablate: wrote {} ({} layout, {} tokens): set its data section, then `ablate {}`",
        args.out.display(),
        checkpoint.layout.name(),
        checkpoint.vocab()?,
        args.out.display()
    );
    Ok(())
}

/// `ablate heads-importance`.
pub fn heads_importance(args: &HeadsImportanceArgs) -> anyhow::Result<()> {
    let device = target::device(&args.device)?;
    ablate::run::heads::run(&args.checkpoints, &args.out, args.batches, device)
}

/// `ablate attention`: per-head attention maps of a trained or untrained model on a text.
pub fn attention(args: &AttentionArgs) -> anyhow::Result<()> {
    tch::manual_seed(args.seed);
    let (tokenizer, model, config, what) = match (&args.checkpoint, &args.recipe) {
        (Some(c), _) => {
            let loaded = checkpoint::load(c, tch::Device::Cpu)?;
            let tokenizer = loaded
                .tokenizer
                .ok_or_else(|| anyhow::anyhow!("{}: a kind {} model reads no text", c.display(), loaded.config.kind))?;
            let stem = c.file_stem().map(|s| s.to_string_lossy().into_owned()).unwrap_or_default();
            (tokenizer, loaded.model, loaded.config, format!("trained {stem}"))
        }
        (None, Some(r)) => {
            let path = target::find_recipe(r)?;
            let recipe = recipe::load(&path, false)?;
            let config = recipe.runs[0].config.clone();
            // An untrained model whose vocabulary is the text's characters.
            let tokenizer =
                ablate::data::tokenize::TextTokenizer::Char(ablate::data::tokenize::CharTokenizer::fit(&args.text));
            let vs = tch::nn::VarStore::new(tch::Device::Cpu);
            let model = task(config.kind).build(&config, &vs.root(), tokenizer.vocab_size());
            (tokenizer, model, config, format!("untrained model of {}", path.display()))
        }
        (None, None) => anyhow::bail!("give --checkpoint FILE or --recipe FILE"),
    };
    let text = &args.text;
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
    ablate::judge::plot::attention_heatmaps(&args.out, &maps, &format!("{what}, on {shown:?}"))?;
    println!("wrote {}", args.out.display());
    Ok(())
}

/// `ablate embed`: one JSON array per text.
pub fn embed(args: &EmbedArgs) -> anyhow::Result<()> {
    let dir = match &args.model {
        Some(dir) => dir.clone(),
        None => ablate::tasks::pretrained::minilm_dir()?,
    };
    let pretrained = ablate::tasks::pretrained::load_pretrained(&dir, target::device(&args.device)?)?;
    let texts: Vec<&str> = args.texts.iter().map(String::as_str).collect();
    if args.show_tokens {
        for t in &texts {
            let ids = pretrained.tokenizer.encode(t)?;
            eprintln!("{t:?}: {:?} {ids:?}", pretrained.tokenizer.tokens(&ids));
        }
    }
    let embeddings = pretrained.embed(&texts, args.normalize.unwrap_or(pretrained.normalize))?;
    for row in 0..texts.len() as i64 {
        let values = Vec::<f32>::try_from(embeddings.get(row).to_device(tch::Device::Cpu))?;
        println!("{}", serde_json::to_string(&values)?);
    }
    Ok(())
}

/// `ablate describe`: presets (all, or one) as a table, or every run of a recipe.
pub fn describe(args: &DescribeArgs) -> anyhow::Result<()> {
    use ablate::recipe::presets::{preset, PRESETS};
    let names: Vec<&str> = match (args.preset.as_deref(), args.list) {
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
    let path = target::find_recipe(Path::new(name)).map_err(|_| {
        anyhow::anyhow!("`{name}` is neither a preset ({}) nor a recipe", ablate::recipe::presets::PRESETS.join(", "))
    })?;
    let recipe = recipe::load(&path, false)?;
    let results_root = target::default_out(&recipe).parent().map(Path::to_path_buf).unwrap_or_default();
    let mut data = DataCache::new(&results_root, false);
    println!("| run | kind | params | forward GFLOPs | per | frequency level (test loss) |");
    println!("|---|---|---|---|---|---|");
    for run in &recipe.runs {
        let kind = task(run.config.kind);
        kind.prepare(&run.config, &mut data)?;
        let vocab = kind.vocab(&run.config, &data)?;
        let params = parameter_count(&run.config, vocab);
        let (flops, per) = kind.forward_flops(&run.config, params, vocab);
        let flops = if flops.is_finite() { format!("{:.4}", flops / 1e9) } else { "—".into() };
        let level = kind.frequency_level(&run.config, &data)?.map_or("—".into(), |l| format!("{l:.4}"));
        println!("| {} | {} | {params} | {flops} | {per} | {level} |", run.id, run.config.kind);
    }
    Ok(())
}

#[derive(clap::Args)]
pub struct CoordCheckArgs {
    /// A recipe of kind lm: its first run is the model (every setting but the width and the parametrisation).
    recipe: PathBuf,
    #[command(flatten)]
    overrides: super::OverrideArgs,
    /// The widths (d_model) to compare.
    #[arg(long, value_delimiter = ',', default_value = "64,128,256,512,1024")]
    widths: Vec<i64>,
    /// Optimisation steps at the run's peak learning rate (no warm-up, no clipping) before the last
    /// measurement.
    #[arg(long, default_value_t = 5)]
    steps: i64,
    /// Where coord_check.csv and the charts go (default: <the recipe's output directory>/coord_check).
    #[arg(long)]
    out: Option<PathBuf>,
}

/// `ablate coord-check`: both parametrisations at every width; prints the last step's table, writes the CSV
/// and one chart per parametrisation.
pub fn coord_check(args: &CoordCheckArgs) -> anyhow::Result<()> {
    use ablate::run::coord;
    anyhow::ensure!(!args.widths.is_empty() && args.widths.iter().all(|&w| w > 0), "--widths: give positive widths");
    anyhow::ensure!(args.steps >= 1, "--steps must be at least 1");
    let sweep = target::Sweep::load(&args.recipe, false, &args.overrides.parse()?, None)?;
    let run = sweep.recipe.runs.first().ok_or_else(|| anyhow::anyhow!("the recipe has no runs"))?;
    let out = args.out.clone().unwrap_or_else(|| sweep.out.join("coord_check"));
    let coords = coord::coord_check(&run.config, &args.widths, args.steps)?;
    coord::write(&coords, &out)?;
    println!("{}", coord::table(&coords));
    eprintln!("ablate: wrote {}", out.display());
    Ok(())
}

#[derive(clap::Args)]
pub struct InitGradsArgs {
    /// A recipe of kind lm: every run's decoder, built and seeded as it trains.
    recipe: PathBuf,
    #[command(flatten)]
    overrides: super::OverrideArgs,
    /// Training batches the norms are averaged over.
    #[arg(long, default_value_t = 8)]
    batches: i64,
}

/// `ablate init-grads`: per run and layer, the gradient norms at initialisation (Xiong et al. 2020's
/// Figure 3 statistic), as a Markdown table.
pub fn init_grads(args: &InitGradsArgs) -> anyhow::Result<()> {
    let sweep = target::Sweep::load(&args.recipe, false, &args.overrides.parse()?, None)?;
    println!("| run | layer | gradient norm (whole layer) | gradient norm (FFN weights) |");
    println!("|---|---|---|---|");
    for run in &sweep.recipe.runs {
        for g in ablate::run::init_grads::init_gradients(&run.config, args.batches)? {
            println!("| {} | {} | {:.4} | {:.4} |", run.id, g.layer, g.layer_norm, g.ffn_norm);
        }
    }
    Ok(())
}
