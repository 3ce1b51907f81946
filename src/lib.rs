//! ablate: train Transformer variants from YAML recipes and measure what each mechanism buys.
//!
//! The layers, each importing only those below it:
//! - `transformer` — the core: attention, position encodings, layers, built from the plain settings of
//!   `transformer::spec`;
//! - `models` — one file per architecture over the core (GPT, BERT, encoder–decoder, ViT, Swin, DaViT,
//!   ImageGPT), structural settings in `models::spec`;
//! - `data` — corpora, image sets, sentence pairs, tokenizers, batches;
//! - `train` — the optimisation loop every kind shares (AdamW, schedules, precision, resumable state);
//! - `tasks` — one per kind of run: its data, model, objective, evaluation, FLOPs and named metrics;
//! - `run` — the sweep, result files, plots, summaries, scale-out and benchmarks;
//! - `recipe` — the schema (the config structs), validation, which keys each kind reads, expansion; with
//!   `metrics`, the names every layer above the core reads, and `stats`, the intervals and tests of the
//!   tables. These, and the two `spec` modules, need no libtorch: `cargo build --no-default-features`
//!   builds just them.
pub mod metrics;
pub mod models;
pub mod recipe;
pub mod stats;
pub mod transformer;

#[cfg(feature = "torch")]
pub mod data;
#[cfg(feature = "torch")]
pub mod files;
#[cfg(feature = "torch")]
pub mod run;
#[cfg(feature = "torch")]
pub mod tasks;
#[cfg(feature = "torch")]
pub mod train;

/// `auto` (CUDA when available), `cpu`, `cuda` or `cuda:N`.
#[cfg(feature = "torch")]
pub fn parse_device(spec: &str) -> Result<tch::Device, String> {
    let cuda = |i: usize| {
        if tch::Cuda::is_available() && i < tch::Cuda::device_count() as usize {
            Ok(tch::Device::Cuda(i))
        } else {
            Err(format!(
                "--device {spec}: CUDA device {i} is not available (found {} CUDA devices); use --device cpu",
                tch::Cuda::device_count()
            ))
        }
    };
    match spec {
        "auto" => Ok(tch::Device::cuda_if_available()),
        "cpu" => Ok(tch::Device::Cpu),
        "cuda" => cuda(0),
        s => match s.strip_prefix("cuda:").and_then(|i| i.parse().ok()) {
            Some(i) => cuda(i),
            None => Err(format!("--device {spec}: unknown device; allowed: auto, cpu, cuda, cuda:N")),
        },
    }
}
