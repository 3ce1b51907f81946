//! Training-step throughput of a GPT on random tokens, for side-by-side comparison with PyTorch eager
//! (`bench/eager_gpt.py` builds the same model and optimiser). Not a test: numbers go to `results/bench/`.
use std::time::Instant;
use tch::{Device, Kind, Tensor};

use crate::models::gpt::Gpt;
use crate::recipe::Precision;
use crate::train::backward_and_step;
use crate::train::optim::AdamW;
use crate::train::precision::{self, LossScaler};
use crate::transformer::spec::TransformerSpec;

pub struct BenchConfig {
    pub layers: i64,
    pub heads: i64,
    pub d_model: i64,
    pub block: i64,
    pub batch: i64,
    pub vocab: i64,
    pub warmup: i64,
    pub steps: i64,
    pub precision: Precision,
}

pub struct BenchResult {
    pub params: i64,
    pub tokens_per_s: f64,
    pub step_ms: f64,
}

pub fn run(b: &BenchConfig, device: Device) -> BenchResult {
    // nanoGPT's layout: pre-LN, GELU, learned positions, tied embeddings — what the eager script builds.
    let mut spec = TransformerSpec::small(b.d_model, b.layers, b.heads, b.block);
    spec.pre_ln = true;
    spec.tie_embeddings = true;
    tch::manual_seed(0);
    let vs = tch::nn::VarStore::new(device);
    let model = Gpt::new(&vs.root(), &spec, b.vocab);
    let mut opt = AdamW::new(vs.trainable_variables(), 0.9, 0.99, 0.1);
    let x = Tensor::randint(b.vocab, [b.batch, b.block], (Kind::Int64, device));
    let y = Tensor::randint(b.vocab, [b.batch, b.block], (Kind::Int64, device));
    let _autocast = precision::autocast(b.precision, device);
    let mut scaler = LossScaler::for_precision(b.precision);
    for _ in 0..b.warmup {
        backward_and_step(&model.loss(&x, &y, true).1, &mut opt, 1e-3, Some(1.0), &mut scaler);
    }
    let start = Instant::now();
    for _ in 0..b.steps {
        backward_and_step(&model.loss(&x, &y, true).1, &mut opt, 1e-3, Some(1.0), &mut scaler);
    }
    if let Device::Cuda(_) = device {
        tch::Cuda::synchronize(0);
    }
    let secs = start.elapsed().as_secs_f64();
    BenchResult {
        params: opt.num_params(),
        tokens_per_s: (b.steps * b.batch * b.block) as f64 / secs,
        step_ms: secs * 1000.0 / b.steps as f64,
    }
}
