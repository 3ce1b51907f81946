//! Decoding with a KV cache computes what decoding without one computes: the same logits at every step (to
//! float tolerance) and the same tokens, for every position encoding and placement, sparse patterns and the
//! sparse kernel, past the context (where the cache slides or is rebuilt), for greedy decoding, sampling and
//! beam search (whose beams reorder the cache); for the encoder–decoder's self and cross attention; and for
//! ImageGPT's completions on its 2-D grid.
mod common;
use ablate::models::decode::{generate, Decoder, Decoding};
use ablate::models::gpt::Gpt;
use ablate::models::imagegpt::ImageGpt;
use ablate::models::seq2seq::{translate, Seq2Seq, Seq2SeqSpec};
use ablate::models::spec::{Image, ImageGptSpec};
use ablate::transformer::layers::StackCache;
use ablate::transformer::spec::{
    AbsoluteAt, Combine, Implementation, OutputGate, Pattern, PositionEncoding, PositionSpec, TransformerSpec,
};
use tch::{nn, Device, Kind, Tensor};

const VOCAB: i64 = 13;

/// libtorch's generator is one per process: the tests here take turns, so a seeded sample is not disturbed
/// by another test drawing random weights meanwhile.
static GENERATOR: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn exclusive() -> std::sync::MutexGuard<'static, ()> {
    GENERATOR.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}
const CONTEXT: i64 = 12;

/// Sharper weights than the training init, so next-token distributions are far from uniform and ties rare.
fn sharpen(vs: &nn::VarStore) {
    tch::no_grad(|| {
        for mut p in vs.trainable_variables() {
            if p.dim() >= 2 {
                p.copy_(&(Tensor::randn(p.size(), (Kind::Float, Device::Cpu)) * 0.4));
            } else {
                p.copy_(&(Tensor::randn(p.size(), (Kind::Float, Device::Cpu)) * 0.1));
            }
        }
    });
}

fn decoder_spec(
    encoding: PositionEncoding,
    at: AbsoluteAt,
    pattern: Pattern,
    implementation: Implementation,
) -> TransformerSpec {
    let mut spec = TransformerSpec::small(32, 2, 4, CONTEXT);
    spec.position = PositionSpec { at, ..PositionSpec::of(encoding) };
    spec.position.t5_max_distance = 16;
    spec.position.shaw_max_distance = 4;
    spec.attention.pattern = pattern;
    spec.attention.implementation = implementation;
    spec.pre_ln = true;
    spec
}

fn gpt(spec: &TransformerSpec, seed: i64) -> (nn::VarStore, Gpt) {
    tch::manual_seed(seed);
    let vs = nn::VarStore::new(Device::Cpu);
    let model = Gpt::new(&vs.root(), spec, VOCAB);
    sharpen(&vs);
    (vs, model)
}

fn max_diff(a: &Tensor, b: &Tensor) -> f64 {
    (a - b).abs().max().double_value(&[])
}

/// Both decoders fed the same tokens (the uncached one's greedy choices) for `steps` steps from a batch of
/// two prompts: the logits agree at every step. Returns the largest difference seen.
fn teacher_forced_difference(model: &Gpt, steps: usize) -> f64 {
    let prompts = vec![vec![1, 5, 2, 7, 3], vec![4, 4, 9, 0, 12]];
    let _guard = tch::no_grad_guard();
    let mut cached = Decoder::new(model, prompts.clone(), true);
    let mut plain = Decoder::new(model, prompts, false);
    assert!(cached.is_cached() && !plain.is_cached());
    let mut worst = 0.0f64;
    for _ in 0..steps {
        let (a, b) = (cached.logits(), plain.logits());
        assert_eq!(a.size(), vec![2, VOCAB]);
        worst = worst.max(max_diff(&a, &b));
        let next = Vec::<i64>::try_from(b.argmax(-1, false)).unwrap();
        cached.push(&next);
        plain.push(&next);
    }
    assert_eq!(cached.rows(), plain.rows());
    worst
}

fn patterns() -> Vec<(&'static str, Pattern, Implementation)> {
    let window = |w: i64, d: i64| Pattern { window: Some(w), dilation: d, ..Pattern::dense() };
    vec![
        ("dense", Pattern::dense(), Implementation::Auto),
        ("dense explicit", Pattern::dense(), Implementation::Explicit),
        ("window 3 dilation 2", window(3, 2), Implementation::Auto),
        ("window 3, sparse kernel", window(3, 1), Implementation::Sparse),
        ("window 2 + every 4th global", Pattern { global_every: Some(4), ..window(2, 1) }, Implementation::Auto),
        ("window 2 + 2 global tokens", Pattern { global_tokens: 2, ..window(2, 1) }, Implementation::Sparse),
    ]
}

#[test]
fn cached_logits_match_the_whole_context_for_every_position_encoding_and_pattern() {
    let _serial = common::serial();
    let _turn = exclusive();
    use PositionEncoding::*;
    let mut cases = Vec::new();
    for encoding in [None, Sinusoidal, Learned, Shaw, T5, Alibi, Rope] {
        for (name, pattern, implementation) in patterns() {
            cases.push((
                format!("{encoding:?}, {name}"),
                decoder_spec(encoding, AbsoluteAt::Input, pattern, implementation),
            ));
        }
    }
    for at in [AbsoluteAt::EveryLayer, AbsoluteAt::Qk] {
        for encoding in [Sinusoidal, Learned] {
            cases.push((
                format!("{encoding:?} at {at:?}"),
                decoder_spec(encoding, at, Pattern::dense(), Implementation::Auto),
            ));
        }
    }
    for encoding in [Sinusoidal, Learned] {
        let mut spec = decoder_spec(encoding, AbsoluteAt::Input, Pattern::dense(), Implementation::Auto);
        (spec.position.combine, spec.position.concat_dim) = (Combine::Concat, 8);
        cases.push((format!("{encoding:?} concatenated"), spec));
    }
    // Gated attention reads the new tokens' own input, which the cached call must hand the gate.
    for gate in [OutputGate::Headwise, OutputGate::Elementwise] {
        let mut spec = decoder_spec(Rope, AbsoluteAt::Input, Pattern::dense(), Implementation::Auto);
        spec.attention.output_gate = gate;
        cases.push((format!("output gate {gate:?}"), spec));
    }
    for (i, (name, spec)) in cases.iter().enumerate() {
        let (_vs, model) = gpt(spec, i as i64);
        // 5 prompt tokens + 16 steps: 8 steps past the 12-token context, where the cache is rebuilt from the
        // cropped context.
        let worst = teacher_forced_difference(&model, 16);
        assert!(worst < 1e-4, "{name}: cached logits differ by {worst:e}");
    }
}

#[test]
fn greedy_sampled_and_beam_tokens_are_the_same_with_and_without_the_cache() {
    let _serial = common::serial();
    let _turn = exclusive();
    for (i, encoding) in
        [PositionEncoding::Learned, PositionEncoding::Rope, PositionEncoding::T5].into_iter().enumerate()
    {
        let spec = decoder_spec(encoding, AbsoluteAt::Input, Pattern::dense(), Implementation::Auto);
        let (_vs, model) = gpt(&spec, 40 + i as i64);
        let prompt = [3i64, 1, 4, 1, 5];
        for decoding in [
            Decoding::Greedy,
            Decoding::Sample { temperature: 1.0, top_k: None },
            Decoding::Sample { temperature: 0.7, top_k: Some(4) },
            Decoding::Beam { width: 3 },
        ] {
            let run = |cached| {
                tch::manual_seed(7);
                generate(&model, &prompt, 14, decoding, cached)
            };
            let (with, without) = (run(true), run(false));
            assert_eq!(with.len(), prompt.len() + 14);
            assert_eq!(with, without, "{encoding:?}, {decoding:?}");
        }
    }
}

#[test]
fn a_batch_through_the_cache_one_token_at_a_time_equals_one_forward_pass() {
    let _serial = common::serial();
    let _turn = exclusive();
    // Prefill 3 positions, then one at a time: the logits of every position equal the uncached forward's.
    let spec = decoder_spec(PositionEncoding::Rope, AbsoluteAt::Input, Pattern::dense(), Implementation::Auto);
    let (_vs, model) = gpt(&spec, 3);
    let _guard = tch::no_grad_guard();
    let idx = Tensor::randint(VOCAB, [3, 10], (Kind::Int64, Device::Cpu));
    let whole = model.forward(&idx, false);
    let mut cache = StackCache::default();
    let mut parts = vec![model.forward_cached(&idx.narrow(1, 0, 3), &mut cache)];
    for t in 3..10 {
        parts.push(model.forward_cached(&idx.narrow(1, t, 1), &mut cache));
    }
    assert_eq!(cache.len(), 10);
    let stepped = Tensor::cat(&parts, 1);
    assert!(max_diff(&stepped, &whole) < 1e-4, "{}", max_diff(&stepped, &whole));
    // Reordering the batch reorders the cache: the next step of row 2 placed first equals its own.
    let next = Tensor::randint(VOCAB, [3, 1], (Kind::Int64, Device::Cpu));
    let mut reordered = StackCache::default();
    let _ = model.forward_cached(&idx, &mut reordered);
    reordered.select_rows(&Tensor::from_slice(&[2i64, 2, 0]));
    let order = Tensor::from_slice(&[2i64, 2, 0]);
    let after = model.forward_cached(&next.index_select(0, &order), &mut reordered);
    let expected = model.forward(&Tensor::cat(&[&idx, &next], 1).index_select(0, &order), false).narrow(1, 10, 1);
    assert!(max_diff(&after, &expected) < 1e-4);
}

#[test]
fn the_cache_grows_past_its_buffers_and_reorders_without_losing_a_position() {
    let _serial = common::serial();
    let _turn = exclusive();
    // Chunks of uneven size cross the buffers' doublings (16, 32, 64 positions), with a beam-style reorder
    // in the middle: every chunk's logits equal the uncached forward's over the reordered sequence.
    let mut spec = decoder_spec(PositionEncoding::Rope, AbsoluteAt::Input, Pattern::dense(), Implementation::Auto);
    spec.block_size = 80;
    let (_vs, model) = gpt(&spec, 4);
    let _guard = tch::no_grad_guard();
    let mut idx = Tensor::randint(VOCAB, [3, 70], (Kind::Int64, Device::Cpu));
    let mut cache = StackCache::default();
    let mut start = 0;
    for (i, chunk) in [5i64, 1, 9, 1, 1, 17, 3, 1, 30, 2].into_iter().enumerate() {
        if i == 5 {
            let order = Tensor::from_slice(&[1i64, 0, 1]);
            cache.select_rows(&order);
            idx = idx.index_select(0, &order);
        }
        let stepped = model.forward_cached(&idx.narrow(1, start, chunk), &mut cache);
        start += chunk;
        let whole = model.forward(&idx.narrow(1, 0, start), false).narrow(1, start - chunk, chunk);
        assert!(max_diff(&stepped, &whole) < 1e-4, "chunk {i} ends at {start}: {}", max_diff(&stepped, &whole));
    }
    assert_eq!(cache.len(), 70);
}

#[test]
fn translations_are_the_same_with_the_cache_for_greedy_and_beam_search() {
    let _serial = common::serial();
    let _turn = exclusive();
    for (i, encoding) in
        [PositionEncoding::Sinusoidal, PositionEncoding::Rope, PositionEncoding::T5].into_iter().enumerate()
    {
        tch::manual_seed(60 + i as i64);
        let vs = nn::VarStore::new(Device::Cpu);
        let mut spec = Seq2SeqSpec::small(VOCAB);
        spec.transformer.position = PositionSpec::of(encoding);
        spec.transformer.block_size = 32;
        // One decoder layer without cross-attention, one with: both kinds of cached layer.
        spec.cross_attention_layers = 1;
        // Under RoPE, value embeddings too: the cached decoder looks up the new tokens' rows only.
        spec.transformer.value_embeddings = if encoding == PositionEncoding::Rope { 1 } else { 0 };
        let model = Seq2Seq::new(&vs.root(), &spec);
        sharpen(&vs);
        for src in [vec![3i64, 4, 5, 6, 7, 8], vec![9, 3, 3, 10]] {
            for width in [1, 4] {
                let with = translate(&model, &src, 1, 2, 18, width, 0.6, true);
                let without = translate(&model, &src, 1, 2, 18, width, 0.6, false);
                assert_eq!(with, without, "{encoding:?}, width {width}, source {src:?}");
            }
        }
        // And the logits themselves, step by step.
        let _guard = tch::no_grad_guard();
        let src = Tensor::from_slice(&[3i64, 4, 5, 6]).unsqueeze(0);
        let real = src.ones_like().to_kind(Kind::Bool);
        let memory = model.encode(&src, &real, false);
        let tgt = Tensor::from_slice(&[1i64, 7, 7, 3, 11, 5]).unsqueeze(0);
        let whole = model.decode(&tgt, &memory, &real, false);
        let mut cache = StackCache::default();
        let stepped: Vec<Tensor> =
            (0..6).map(|t| model.decode_cached(&tgt.narrow(1, t, 1), &memory, &real, &mut cache)).collect();
        let worst = max_diff(&Tensor::cat(&stepped, 1), &whole);
        assert!(worst < 1e-4, "{encoding:?}: {worst:e}");
    }
}

#[test]
fn image_completions_are_the_same_with_the_cache_on_the_grid() {
    let _serial = common::serial();
    let _turn = exclusive();
    for (i, (encoding, globals)) in
        [(PositionEncoding::Learned, 0), (PositionEncoding::Bias2d, 0), (PositionEncoding::Rope, 2)]
            .into_iter()
            .enumerate()
    {
        let grid = 5;
        let mut transformer = TransformerSpec::small(32, 2, 2, grid * grid);
        transformer.pre_ln = true;
        transformer.position = PositionSpec::of(encoding);
        transformer.attention.pattern.global_tokens = globals;
        if globals > 0 {
            transformer.attention.pattern.window = Some(3);
        }
        let spec =
            ImageGptSpec { image: Image { size: grid, channels: 1, classes: 4, patch: 1 }, palette: 6, transformer };
        tch::manual_seed(80 + i as i64);
        let vs = nn::VarStore::new(Device::Cpu);
        let model = ImageGpt::new(&vs.root(), &spec);
        sharpen(&vs);
        let tokens = Tensor::randint(6, [3, grid * grid], (Kind::Int64, Device::Cpu));
        let with = model.complete(&tokens, 7, true, true);
        let without = model.complete(&tokens, 7, true, false);
        assert!(with.equal(&without), "{encoding:?}: completions differ");
        assert!(with.narrow(1, 0, 7).equal(&tokens.narrow(1, 0, 7)), "the kept pixels stay");
        tch::manual_seed(5);
        let sampled = model.complete(&tokens, 7, false, true);
        tch::manual_seed(5);
        assert!(sampled.equal(&model.complete(&tokens, 7, false, false)), "{encoding:?}: sampled completions differ");
    }
}
