//! ablate: train Transformer variants from YAML recipes and measure what each mechanism buys.
pub mod attention;
pub mod bench;
pub mod bert;
pub mod bert_tasks;
pub mod checkpoint;
pub mod complexity;
pub mod config;
pub mod corpus_tasks;
pub mod data;
pub mod generate;
pub mod gpt;
pub mod images;
pub mod labelled;
pub mod layers;
pub mod native;
pub mod optim;
pub mod parallel;
pub mod pe;
pub mod plot;
pub mod precision;
pub mod recipe;
pub mod results;
pub mod scale;
pub mod seq2seq;
pub mod sweep;
pub mod sword;
pub mod tokenize;
pub mod train;
pub mod translate;
pub mod vision;

/// `auto` (CUDA when available), `cpu`, `cuda` or `cuda:N`.
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
