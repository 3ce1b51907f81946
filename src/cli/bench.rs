//! Benchmarks: `ablate bench` (training-step throughput, generation speed, the step's profile) and the
//! hidden `complexity-point` that a complexity recipe runs in a fresh process per point.
use std::path::PathBuf;

use ablate::recipe::Precision;
use ablate::run::bench::{self, BenchConfig, BenchModel};

use super::target;

#[derive(clap::Args)]
pub struct ComplexityPointArgs {
    #[arg(long)]
    spec: String,
    #[arg(long, default_value = "cpu")]
    device: String,
}

#[derive(clap::Args)]
pub struct BenchArgs {
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
    #[arg(long, value_enum, default_value_t = Precision::Fp32)]
    precision: Precision,
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
}

impl BenchArgs {
    fn config(&self) -> BenchConfig {
        let model = BenchModel {
            layers: self.layers,
            heads: self.heads,
            d_model: self.d_model,
            block: self.block,
            batch: self.batch,
            vocab: self.vocab,
        };
        BenchConfig { model, warmup: self.warmup, steps: self.steps, precision: self.precision }
    }
}

/// `ablate complexity-point`: one point measured here, printed as JSON for the parent process.
pub fn complexity_point(args: &ComplexityPointArgs) -> anyhow::Result<()> {
    let spec: ablate::run::complexity::PointSpec = serde_json::from_str(&args.spec)?;
    let result = ablate::run::complexity::measure_point(&spec, target::device(&args.device)?);
    println!("{}", serde_json::to_string(&result)?);
    Ok(())
}

/// `ablate bench`: the step's throughput, or generation speed (--generate), or its profile (--profile).
pub fn bench(args: &BenchArgs) -> anyhow::Result<()> {
    let device = target::device(&args.device)?;
    let cfg = args.config();
    let (layers, heads, d_model, precision) = (args.layers, args.heads, args.d_model, args.precision);
    if let Some(n) = args.generate {
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
    let (block, batch) = (args.block, args.batch);
    if args.profile {
        let p = bench::profile(&cfg, device)?;
        let label = format!("{layers}L/{heads}H/d{d_model} T={block} B={batch} {precision:?} {device:?}");
        print!("{}", bench::profile_report(&p, &label));
        if let Some(dir) = &args.out {
            std::fs::create_dir_all(dir)?;
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
}
