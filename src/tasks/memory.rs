//! A run's peak training memory, estimated from its config before anything is built: so that a run that
//! cannot fit (a batch of 10¹¹, a block of a million tokens) is refused with one line instead of aborting
//! the process when the allocation fails. The estimate counts what dominates, in float32:
//! - the model's state: weights, gradients and AdamW's two moments, 16 bytes per parameter (parameters
//!   counted from the shapes: attention and feed-forward per layer, embeddings and output layer);
//! - activations kept for the backward pass, per example and layer: about 17 values per token and model
//!   dimension (Korthikanti et al., 2022, "Reducing activation recomputation", counted in float32), plus
//!   three per attention score (scores, softmax, its gradient) for the keys each query sees;
//! - the output layer's logits over the vocabulary, three values each.
//!
//! It is an estimate, not a bound: libtorch's workspaces and allocator slack come on top, and the fused
//! attention kernels keep fewer scores. It is meant to refuse what cannot possibly fit, and to say what
//! a run needs (`ablate check`).
use crate::recipe::{Config, Kind};
use crate::transformer::spec::PositionEncoding;

/// Tokens per example, and keys each query attends to.
fn sequence(cfg: &Config) -> (f64, f64) {
    let t = &cfg.transformer;
    let text_keys = |n: f64| match t.attention.pattern.window {
        Some(w) => (2.0 * w as f64 + 1.0 + t.attention.pattern.global_tokens as f64).min(n),
        None => n,
    };
    match cfg.kind {
        Kind::Lm | Kind::Bert => {
            let n = t.block_size as f64;
            (n, text_keys(n))
        }
        // Source and target sequences, and the target's cross-attention to the source.
        Kind::Translate => {
            let n = t.block_size as f64;
            (2.0 * n, 1.5 * text_keys(n))
        }
        Kind::Vit | Kind::ImageGpt => {
            let v = cfg.vision.clone().unwrap_or_default();
            let side = (v.image_size as f64 / v.patch_size.max(1) as f64).ceil();
            let n = side * side + 1.0;
            (n, text_keys(n))
        }
        Kind::Swin | Kind::Davit => {
            let v = cfg.vision.clone().unwrap_or_default();
            let side = v.grid(cfg.kind) as f64;
            (side * side, (v.window * v.window) as f64)
        }
        Kind::SeqClassify => {
            let n = cfg.seq_classify().positions() as f64;
            (n, text_keys(n))
        }
        // A convolution's positions are the pixels; nothing attends.
        Kind::Cnn => {
            let side = cfg.vision.clone().unwrap_or_default().image_size as f64;
            (side * side, 0.0)
        }
    }
}

/// The convolutional baseline: its state, and per example each stage's map kept three times (the
/// convolution's output, the normalised one, the ReLU's) and the input.
fn cnn_bytes(cfg: &Config) -> f64 {
    let spec = cfg.cnn_spec();
    let k2 = (spec.kernel * spec.kernel) as f64;
    let (mut inputs, mut params, mut values) = (spec.image.channels as f64, 0.0, 0.0);
    for (i, &c) in spec.channels.iter().enumerate() {
        let c = c as f64;
        params += inputs * c * k2 + 2.0 * c;
        values += 3.0 * c * (spec.side(i) * spec.side(i)) as f64;
        inputs = c;
    }
    params += inputs * spec.image.classes as f64;
    values += (spec.image.channels * spec.image.size * spec.image.size) as f64;
    16.0 * params + cfg.train.batch_size as f64 * 4.0 * values
}

/// A stack's parameters: the core's exact sum over its layers, unless the stack is far beyond anything
/// trained here (more than 10,000 layers, or above 10¹⁵ parameters by the rough 4·D·inner + 3·D·hidden per
/// layer), where that rough count in floating point is returned instead: no loop over a billion layers, no
/// integer overflow, and such a run is refused all the same.
fn stack_parameters(
    spec: &crate::transformer::spec::TransformerSpec,
    count: i64,
    cross: impl Fn(i64) -> bool,
    grid: Option<crate::transformer::attention::Grid>,
) -> f64 {
    let (d, inner, hidden) = (spec.d_model as f64, spec.attention.inner() as f64, spec.ffn_hidden as f64);
    let rough = count as f64 * (4.0 * d * inner + 3.0 * d * hidden);
    if rough > 1e15 || count > 10_000 {
        return rough;
    }
    crate::transformer::layers::layers_parameters(spec, count, cross, grid) as f64
}

/// Parameters: every Transformer layer counted by the core's own formulas (`layers_parameters`,
/// `AttentionBlock::parameters`, exact and tested against the built layers), the embeddings, position tables
/// and heads around them from their shapes (`tests/knobs.rs` holds the whole to the built model).
pub fn parameters(cfg: &Config, vocab: f64) -> f64 {
    use crate::transformer::attention::Grid;
    use crate::transformer::layers::AttentionBlock;
    let t = cfg.transformer_spec();
    let (d, blocks) = (t.d_model as f64, t.block_size as f64);
    let no_cross = |_| false;
    // Value embeddings: a stack's tables of the values' width, looked up by token id.
    let value_tables = |v: f64| (t.value_embeddings * t.attention.kv_heads * t.attention.head_dim) as f64 * v;
    // Concatenated positions narrow the token embeddings to D − P and the position table to P.
    let positions_width = t.position_width() as f64;
    let learned_positions =
        |n: f64| if t.position.encoding == PositionEncoding::Learned { n * positions_width } else { 0.0 };
    let outputs = |v: f64| if t.tie_embeddings { v * d } else { v * (d + t.token_width() as f64) };
    // A stack's final norm and its global tokens.
    let stack_extras = {
        let norm = if t.final_norm { crate::transformer::norm::NormLayer::parameters(t.d_model, t.norm) } else { 0 };
        (norm + t.attention.pattern.global_tokens * t.d_model) as f64
    };
    // A stack over a vocabulary: its layers, its embeddings and output layer, `positions` learned positions,
    // its final norm and global tokens, its value-embedding tables.
    let token_model = |spec: &crate::transformer::spec::TransformerSpec, vocab: f64, positions: f64, grid| {
        stack_parameters(spec, t.layers, no_cross, grid)
            + outputs(vocab)
            + learned_positions(positions)
            + stack_extras
            + value_tables(vocab)
    };
    match cfg.kind {
        Kind::Swin | Kind::Davit => {
            let s = cfg.staged_spec();
            let patch = (s.image.patch * s.image.patch * s.image.channels) as f64 * d;
            let stages: f64 = (0..s.stages())
                .map(|i| {
                    let grid = Some(Grid { side: s.window(i), lead: 0 });
                    // Patch merging doubles the width between stages (4·D → 2·D).
                    let merge = if i > 0 { 8.0 * (s.stage(i - 1).d_model as f64).powi(2) } else { 0.0 };
                    // Convolutional positions: a depthwise 3×3 convolution per block (DaViT: two).
                    let convs = if s.blocks.is_empty() { 1 } else { 2 };
                    let conv =
                        i64::from(t.position.encoding == PositionEncoding::Conv) * convs * 10 * s.stage(i).d_model;
                    s.depths[i] as f64 * (AttentionBlock::parameters(&s.stage(i), grid) + conv) as f64 + merge
                })
                .sum();
            let positions = learned_positions((s.grid(0) * s.grid(0)) as f64);
            patch + positions + stages + (s.stage(s.stages() - 1).d_model * s.image.classes) as f64
        }
        Kind::Translate => {
            let tr = cfg.translate();
            let first_cross = tr.decoder_layers - tr.cross_attention_layers.unwrap_or(tr.decoder_layers);
            let encoder = stack_parameters(&t, tr.encoder_layers, no_cross, None);
            let decoder = stack_parameters(&t, tr.decoder_layers, |i| i >= first_cross, None);
            encoder + decoder + outputs(vocab) + 2.0 * (stack_extras + learned_positions(blocks) + value_tables(vocab))
        }
        Kind::Vit => {
            let v = cfg.vit_spec();
            let grid = Some(Grid { side: v.grid(), lead: 1 });
            let tokens = (v.grid() * v.grid() + 1) as f64;
            let patch = ((v.image.patch * v.image.patch * v.image.channels + 1) * t.token_width()) as f64;
            stack_parameters(&v.transformer, t.layers, no_cross, grid)
                + patch
                + learned_positions(tokens)
                + stack_extras
                + d * v.image.classes as f64
        }
        Kind::ImageGpt => {
            let g = cfg.image_gpt_spec();
            let grid = Some(Grid { side: g.grid(), lead: 1 });
            // The palette and a start token.
            token_model(&g.transformer, (g.palette + 1) as f64, (g.grid() * g.grid()) as f64, grid)
        }
        // BERT adds a pooler and the masked-LM head's dense layer (D × D each) to the embeddings.
        Kind::Bert => token_model(&t, vocab, blocks, None) + 2.0 * d * d,
        _ => token_model(&t, vocab, blocks, None),
    }
}

/// The vocabulary the output layer predicts over, as far as the config says (256 for characters and
/// pixels, whose count is known only once the data is read).
fn vocabulary(cfg: &Config) -> f64 {
    match cfg.kind {
        Kind::Vit | Kind::Swin | Kind::Davit => cfg.vision.as_ref().map_or(10, |v| v.classes) as f64,
        Kind::ImageGpt => cfg.image_gpt.as_ref().map_or(256, |g| g.palette) as f64,
        _ => cfg.data.vocab_size.unwrap_or(256) as f64,
    }
}

/// Estimated peak bytes of training `cfg` (see the module's comment for what is counted).
pub fn training_bytes(cfg: &Config) -> f64 {
    if cfg.kind == Kind::Cnn {
        return cnn_bytes(cfg);
    }
    let t = &cfg.transformer;
    let (tokens, keys) = sequence(cfg);
    let vocab = vocabulary(cfg);
    let layers = match cfg.kind {
        Kind::Swin | Kind::Davit => cfg.vision.as_ref().map_or(2, |v| v.depths.iter().sum::<i64>()) as f64,
        Kind::Translate => 2.0 * t.layers as f64,
        _ => t.layers as f64,
    };
    let d = t.d_model as f64;
    let heads = t.heads as f64;
    let state = 16.0 * parameters(cfg, vocab);
    let per_example = 4.0 * layers * (17.0 * tokens * d + 3.0 * heads * tokens * keys) + 12.0 * tokens * vocab;
    state + cfg.train.batch_size as f64 * per_example
}

/// `Err` with one line when a run cannot fit `limit` bytes (the device's memory, which `what` names: "this
/// machine has").
pub fn check_fits(cfg: &Config, limit: f64, what: &str) -> Result<(), String> {
    let needed = training_bytes(cfg);
    if needed <= limit {
        return Ok(());
    }
    let model = match cfg.kind {
        Kind::Cnn => format!("channels {:?}", cfg.cnn().channels),
        _ => format!("d_model {}, {} layers", cfg.transformer.d_model, cfg.transformer.layers),
    };
    Err(format!(
        "needs about {} to train (estimated: batch of {}, {} positions per example, {model}) but {what} {}: \
         lower train.batch_size, the sequence length or the model's size",
        human(needed),
        cfg.train.batch_size,
        sequence(cfg).0,
        human(limit)
    ))
}

/// Refuses, before anything is loaded or allocated, the first of `runs` that cannot train in the memory of
/// `device`: the host's physical memory on the CPU, the GPU's free memory on CUDA (`torch.cuda.mem_get_info`,
/// where this build has the CUDA shim). One line naming the recipe file, the run and what to lower.
pub fn check_runs_fit<'a>(
    file: &str,
    runs: impl IntoIterator<Item = &'a crate::recipe::RunSpec>,
    device: tch::Device,
) -> anyhow::Result<()> {
    match capacity(device) {
        Some((limit, what)) => check_runs_fit_within(file, runs, limit, &what),
        None => Ok(()),
    }
}

/// The memory a run on `device` can use, in bytes, and its name for a message: the host's physical memory on
/// the CPU ("this machine has"), the GPU's free memory on CUDA ("GPU cuda:0 has free"); `None` where it cannot
/// be read.
pub fn capacity(device: tch::Device) -> Option<(f64, String)> {
    match device {
        tch::Device::Cuda(i) => {
            crate::train::native::cuda_mem_info(i).ok().map(|(free, _)| (free as f64, format!("GPU cuda:{i} has free")))
        }
        _ => host_memory_bytes().map(|bytes| (bytes, "this machine has".to_string())),
    }
}

/// Whether a failure's message is an allocation that did not fit: the CUDA caching allocator's "CUDA out of
/// memory", libtorch's CPU allocator's "can't allocate memory" (not "an illegal memory access", a fault).
pub fn is_out_of_memory(message: &str) -> bool {
    message.contains("out of memory") || message.contains("can't allocate memory")
}

/// [`check_runs_fit`] against `limit` bytes, which `what` names ("this machine has", "GPU cuda:0 has free").
pub fn check_runs_fit_within<'a>(
    file: &str,
    runs: impl IntoIterator<Item = &'a crate::recipe::RunSpec>,
    limit: f64,
    what: &str,
) -> anyhow::Result<()> {
    for run in runs {
        check_fits(&run.config, limit, what).map_err(|e| anyhow::anyhow!("{file}: run `{}` {e}", run.id))?;
    }
    Ok(())
}

/// Physical memory of this machine, from /proc/meminfo (`None` where it cannot be read).
pub fn host_memory_bytes() -> Option<f64> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = text.lines().find(|l| l.starts_with("MemTotal:"))?;
    let kb: f64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb * 1024.0)
}

/// Bytes as people read them: `512 MB`, `1.6 TB`.
pub fn human(bytes: f64) -> String {
    let units = ["B", "kB", "MB", "GB", "TB", "PB", "EB"];
    let mut value = bytes;
    let mut unit = 0;
    while value >= 1000.0 && unit + 1 < units.len() {
        value /= 1000.0;
        unit += 1;
    }
    if value >= 100.0 || unit == 0 {
        format!("{value:.0} {}", units[unit])
    } else {
        format!("{value:.1} {}", units[unit])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(text: &str) -> Config {
        crate::recipe::parse(text, "m.yaml", "m", false).unwrap().runs[0].config.clone()
    }

    #[test]
    fn the_estimate_grows_as_the_run_does() {
        let base = training_bytes(&config("kind: lm\n"));
        let batch = training_bytes(&config("kind: lm\ntrain:\n  batch_size: 64\n"));
        let small = training_bytes(&config("kind: lm\ntrain:\n  batch_size: 1\n"));
        assert!(batch > base && base > small);
        // Activations are linear in the batch: the state is what a batch of zero would need.
        let b1 = small;
        let b2 = training_bytes(&config("kind: lm\ntrain:\n  batch_size: 2\n"));
        let b3 = training_bytes(&config("kind: lm\ntrain:\n  batch_size: 3\n"));
        assert!(((b3 - b2) - (b2 - b1)).abs() < 1e-6 * b3);
        // A window bounds the scores each query keeps.
        let dense = training_bytes(&config("kind: lm\ntransformer:\n  block_size: 1024\n"));
        let window = training_bytes(&config(
            "kind: lm\ntransformer:\n  block_size: 1024\n  attention:\n    pattern:\n      window: 16\n",
        ));
        assert!(window < dense / 2.0);
        for kind in [
            "bert\ndata:\n  tokenizer: wordpiece\n  vocab_size: 2000",
            "translate\ndata:\n  tokenizer: bpe\n  vocab_size: 2000",
            "vit",
            "swin",
            "davit",
            "image_gpt",
        ] {
            let b = training_bytes(&config(&format!("kind: {kind}\n")));
            assert!(b > 1e6 && b < 1e11, "{kind}: {}", human(b));
        }
        assert_eq!(human(1.6e13), "16.0 TB");
        assert_eq!(human(512e6), "512 MB");
    }

    #[test]
    fn an_absurd_depth_is_counted_in_floating_point_and_refused() {
        // The layers are counted one by one up to 10,000 of them; beyond, by the rough formula in floating
        // point: a billion layers must not be looped over.
        let cfg = config("kind: lm\ntransformer:\n  layers: 1000000000\n");
        let spec = cfg.transformer_spec();
        let (d, inner, hidden) = (spec.d_model as f64, spec.attention.inner() as f64, spec.ffn_hidden as f64);
        let rough = spec.layers as f64 * (4.0 * d * inner + 3.0 * d * hidden);
        assert_eq!(stack_parameters(&spec, spec.layers, |_| false, None), rough);
        assert!(check_fits(&cfg, 1e12, "this machine has").is_err());
        // The widest model the recipe layer accepts is counted exactly, without overflow, and refused.
        let wide = config("kind: lm\ntransformer:\n  d_model: 1048576\n  heads: 1\n  ffn_hidden: 67108864\n");
        assert!(parameters(&wide, 256.0) > 1e14);
        assert!(check_fits(&wide, 1e12, "this machine has").is_err());
        // A stack of ordinary size is counted exactly.
        let spec = config("kind: lm\n").transformer_spec();
        let exact = crate::transformer::layers::layers_parameters(&spec, spec.layers, |_| false, None);
        assert_eq!(stack_parameters(&spec, spec.layers, |_| false, None), exact as f64);
    }

    #[test]
    fn a_run_that_cannot_fit_the_device_is_refused_in_one_line_that_names_it() {
        let recipe = crate::recipe::parse("kind: lm\ntrain:\n  batch_size: 64\n", "m.yaml", "m", false).unwrap();
        let needed = training_bytes(&recipe.runs[0].config);
        let what = "GPU cuda:0 has free";
        check_runs_fit_within("m.yaml", &recipe.runs, needed * 1.01, what).unwrap();
        let err = check_runs_fit_within("m.yaml", &recipe.runs, needed * 0.5, what).unwrap_err().to_string();
        assert!(err.starts_with("m.yaml: run `") && err.contains("but GPU cuda:0 has free"), "{err}");
        assert!(err.contains("lower train.batch_size") && err.lines().count() == 1, "{err}");
    }
}
