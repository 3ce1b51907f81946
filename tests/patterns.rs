//! Sparse attention patterns (UDL §12.9): the truly sparse kernel equals its mask-based twin, a window
//! covering the whole sequence is dense attention, and no token ever receives weight from outside its pattern.
mod common;
use ablate::transformer::attention::{pattern::allowed, Mask, MultiHeadAttention};
use ablate::transformer::layers::Pass;
use ablate::transformer::spec::{
    AttentionSpec, Implementation, Pattern as PatternConfig, PositionEncoding, PositionSpec,
};
use tch::{nn, Device, Kind, Tensor};

fn attention(
    pattern: &PatternConfig,
    implementation: Implementation,
    pe: PositionEncoding,
) -> (nn::VarStore, MultiHeadAttention) {
    let vs = nn::VarStore::new(Device::Cpu);
    let spec = AttentionSpec { implementation, pattern: pattern.clone(), ..AttentionSpec::standard(16, 2) };
    let position = PositionSpec { shaw_max_distance: 3, t5_buckets: 8, t5_max_distance: 16, ..PositionSpec::of(pe) };
    let m = MultiHeadAttention::new(vs.root(), 16, &spec, &position, None, 0.02);
    (vs, m)
}

/// Weights larger than the training init, so the softmax is far from uniform and differences show.
fn randomise(vs: &nn::VarStore) {
    tch::no_grad(|| {
        for mut p in vs.trainable_variables() {
            p.copy_(&(Tensor::randn(p.size(), (Kind::Float, Device::Cpu)) * 0.4));
        }
    });
}

/// The same weights in a sparse-kernel unit and an explicit (mask-based) unit.
fn twins(pattern: &PatternConfig, pe: PositionEncoding) -> (nn::VarStore, MultiHeadAttention, MultiHeadAttention) {
    let (vs_a, sparse) = attention(pattern, Implementation::Sparse, pe);
    let (mut vs_b, masked) = attention(pattern, Implementation::Explicit, pe);
    randomise(&vs_a);
    vs_b.copy(&vs_a).unwrap();
    (vs_a, sparse, masked)
}

fn pattern(window: Option<i64>, dilation: i64, global_every: Option<i64>, global_tokens: i64) -> PatternConfig {
    PatternConfig { window, dilation, global_every, global_tokens, window_schedule: Vec::new() }
}

/// Brute-force definition of the pattern, written independently of the library's tensor code.
fn allowed_by_definition(p: &PatternConfig, n: i64, causal: bool, i: i64, j: i64) -> bool {
    if causal && j > i {
        return false;
    }
    if p.window.is_none() && p.global_every.is_none() {
        return true;
    }
    let global = |x: i64| {
        x < p.global_tokens || p.global_every.is_some_and(|e| x >= p.global_tokens && (x - p.global_tokens) % e == 0)
    };
    let in_window = p.window.is_some_and(|w| (i - j).abs() <= w * p.dilation && (i - j) % p.dilation == 0);
    let _ = n;
    i == j || in_window || global(i) || global(j)
}

#[test]
fn the_sparse_kernel_equals_its_mask_based_twin() {
    let _serial = common::serial();
    let cases = [
        (pattern(Some(2), 1, None, 0), 13),
        (pattern(Some(3), 1, None, 0), 12),
        (pattern(Some(2), 3, None, 0), 17),
        (pattern(Some(1), 2, None, 0), 8),
        (pattern(Some(2), 1, Some(5), 0), 14),
        (pattern(Some(2), 2, None, 2), 15),
        (pattern(Some(1), 1, Some(4), 1), 11),
        (pattern(Some(5), 1, None, 0), 4),
    ];
    let pes = [
        PositionEncoding::None,
        PositionEncoding::Alibi,
        PositionEncoding::T5,
        PositionEncoding::Shaw,
        PositionEncoding::Rope,
    ];
    for (p, n) in cases {
        for causal in [false, true] {
            for pe in pes {
                tch::manual_seed(20);
                let (_vs, sparse, masked) = twins(&p, pe);
                let x = Tensor::randn([2, n, 16], (Kind::Float, Device::Cpu));
                let mask = Mask { causal, key_padding: None, offset: 0, bias: None };
                let a = sparse.self_attend(&x, &mask, None, false, false).output;
                let b = masked.self_attend(&x, &mask, None, false, false).output;
                let diff = (&a - &b).abs().max().double_value(&[]);
                assert!(diff < 1e-5, "{p:?} n={n} causal={causal} {pe:?}: sparse and mask-based differ by {diff}");
            }
        }
    }
}

/// (B, N) real-token flags for sequences of `lengths` real tokens followed by padding.
fn real_tokens(lengths: &[i64], n: i64) -> Tensor {
    let j = Tensor::arange(n, (Kind::Int64, Device::Cpu)).view([1, n]);
    j.lt_tensor(&Tensor::from_slice(lengths).view([-1, 1]))
}

#[test]
fn with_padding_the_sparse_kernel_equals_its_twin_and_real_tokens_ignore_the_padding() {
    let _serial = common::serial();
    // Windows whose padding queries have no real key in reach (window 2 over 9 padding positions), dilated,
    // with global positions and tokens; the fused block path (no score bias) and the explicit one (ALiBi).
    let cases = [
        (pattern(Some(2), 1, None, 0), 21, vec![12, 5, 21]),
        (pattern(Some(2), 3, None, 0), 23, vec![7, 23, 1]),
        (pattern(Some(3), 1, Some(6), 0), 19, vec![10, 3, 19]),
        (pattern(Some(2), 2, None, 2), 17, vec![9, 17, 4]),
    ];
    for (p, n, lengths) in cases {
        for pe in [PositionEncoding::None, PositionEncoding::Alibi, PositionEncoding::Rope] {
            tch::manual_seed(24);
            let (_vs, sparse, masked) = twins(&p, pe);
            let real = real_tokens(&lengths, n);
            let mask = Mask { causal: false, key_padding: Some(&real), offset: 0, bias: None };
            let x = Tensor::randn([3, n, 16], (Kind::Float, Device::Cpu));
            let run = |m: &MultiHeadAttention, x: &Tensor| {
                let xi = x.copy().set_requires_grad(true);
                let out = m.self_attend(&xi, &mask, None, false, false).output;
                (&out * out.ones_like().cumsum(1, Kind::Float)).sum(Kind::Float).backward();
                (out, xi.grad())
            };
            let ((a, grad_a), (b, grad_b)) = (run(&sparse, &x), run(&masked, &x));
            assert_eq!(a.isnan().any().int64_value(&[]), 0, "{p:?} {pe:?}: NaN in the sparse kernel's output");
            let diff = (&a - &b).abs().max().double_value(&[]);
            assert!(diff < 1e-5, "{p:?} {pe:?}: sparse and mask-based differ by {diff} under padding");
            // Relative to the gradients' size: the position-weighted sum makes them large.
            let scale = grad_b.abs().max().double_value(&[]);
            let diff = (&grad_a - &grad_b).abs().max().double_value(&[]) / scale;
            assert!(diff < 1e-5, "{p:?} {pe:?}: gradients differ by {diff} of their largest under padding");
            // New values at the padding positions change no real token's output.
            let pad = real.logical_not().unsqueeze(-1).to_kind(Kind::Float);
            let x2 = &x + Tensor::randn([3, n, 16], (Kind::Float, Device::Cpu)) * &pad * 5.0;
            for m in [&sparse, &masked] {
                let (c, _) = run(m, &x2);
                let moved = ((&c - &a) * real.unsqueeze(-1).to_kind(Kind::Float)).abs().max().double_value(&[]);
                assert!(moved < 1e-5, "{p:?} {pe:?}: padding moved a real token's output by {moved}");
            }
        }
    }
}

#[test]
fn the_sparse_kernel_has_the_same_gradients_as_the_mask_based_twin() {
    let _serial = common::serial();
    tch::manual_seed(21);
    let p = pattern(Some(2), 2, Some(6), 1);
    let (_vs, sparse, masked) = twins(&p, PositionEncoding::Alibi);
    let x = Tensor::randn([1, 19, 16], (Kind::Float, Device::Cpu));
    let grad = |m: &MultiHeadAttention| {
        let xi = x.copy().set_requires_grad(true);
        let out = m.self_attend(&xi, &Mask::causal(), None, true, false).output;
        (&out * out.ones_like().cumsum(1, Kind::Float)).sum(Kind::Float).backward();
        xi.grad()
    };
    let diff = (grad(&sparse) - grad(&masked)).abs().max().double_value(&[]);
    assert!(diff < 1e-4, "gradients differ by {diff}");
}

#[test]
fn a_window_that_covers_the_sequence_is_dense_attention() {
    let _serial = common::serial();
    tch::manual_seed(22);
    let n = 9;
    for causal in [false, true] {
        let (vs_dense, dense) = attention(&PatternConfig::dense(), Implementation::Explicit, PositionEncoding::None);
        randomise(&vs_dense);
        let x = Tensor::randn([2, n, 16], (Kind::Float, Device::Cpu));
        let mask = Mask { causal, key_padding: None, offset: 0, bias: None };
        let expected = dense.self_attend(&x, &mask, None, false, false).output;
        for implementation in [Implementation::Explicit, Implementation::Sparse] {
            let (mut vs, wide) = attention(&pattern(Some(n), 1, None, 0), implementation, PositionEncoding::None);
            vs.copy(&vs_dense).unwrap();
            let got = wide.self_attend(&x, &mask, None, false, false).output;
            let diff = (&got - &expected).abs().max().double_value(&[]);
            assert!(diff < 1e-5, "{implementation:?} causal={causal}: {diff}");
        }
    }
}

#[test]
fn no_token_receives_weight_from_outside_its_pattern() {
    let _serial = common::serial();
    tch::manual_seed(23);
    let n = 16;
    for p in [
        pattern(Some(2), 1, None, 0),
        pattern(Some(2), 3, None, 0),
        pattern(Some(1), 1, Some(5), 2),
        pattern(None, 1, Some(4), 0),
    ] {
        for causal in [false, true] {
            let (vs, m) = attention(&p, Implementation::Explicit, PositionEncoding::Alibi);
            randomise(&vs);
            let x = Tensor::randn([1, n, 16], (Kind::Float, Device::Cpu));
            let w = m
                .self_attend(&x, &Mask { causal, key_padding: None, offset: 0, bias: None }, None, false, true)
                .weights
                .unwrap();
            let library = allowed(&p, n, causal, Device::Cpu).unwrap();
            for i in 0..n {
                for j in 0..n {
                    let ok = allowed_by_definition(&p, n, causal, i, j);
                    assert_eq!(library.int64_value(&[i, j]) == 1, ok, "{p:?} causal={causal}: allowed({i}, {j})");
                    let weight = w.select(2, i).select(2, j).abs().max().double_value(&[]);
                    if !ok {
                        assert_eq!(weight, 0.0, "{p:?} causal={causal}: query {i} took weight {weight} from key {j}");
                    } else {
                        assert!(weight > 0.0, "{p:?} causal={causal}: query {i} ignores allowed key {j}");
                    }
                }
            }
        }
    }
}

#[test]
fn each_layer_keeps_its_own_pattern_and_the_sparse_kernel_agrees_layer_by_layer() {
    let _serial = common::serial();
    use ablate::models::gpt::Gpt;
    use ablate::transformer::spec::TransformerSpec;
    // Layer 0 a window of 2, layer 1 dense, layer 2 (the list repeats) a window of 2 again.
    let n = 12;
    let mut spec = TransformerSpec::small(16, 3, 2, n);
    spec.pre_ln = true;
    spec.layer_patterns = vec![pattern(Some(2), 1, None, 0), PatternConfig::dense()];
    let build = |implementation| {
        tch::manual_seed(8);
        let mut s = spec.clone();
        s.attention.implementation = implementation;
        let vs = nn::VarStore::new(Device::Cpu);
        let gpt = Gpt::new(&vs.root(), &s, 13);
        randomise(&vs);
        (vs, gpt)
    };
    let (vs_explicit, explicit) = build(Implementation::Explicit);
    let idx = Tensor::randint(13, [2, n], (Kind::Int64, Device::Cpu));
    let (_, weights) = tch::no_grad(|| explicit.forward_with_weights(&idx, Pass::eval().with_weights()));
    assert_eq!(weights.len(), 3);
    let window = allowed(&pattern(Some(2), 1, None, 0), n, true, Device::Cpu).unwrap();
    for (layer, w) in weights.iter().enumerate() {
        let outside = w.masked_select(&window.logical_not().expand_as(w)).abs().max().double_value(&[]);
        if layer == 1 {
            assert!(outside > 1e-4, "the dense layer attends beyond the window");
        } else {
            assert!(outside < 1e-12, "layer {layer} keeps its window");
        }
    }
    let (mut vs_sparse, sparse) = build(Implementation::Sparse);
    vs_sparse.copy(&vs_explicit).unwrap();
    let before = ablate::transformer::attention::path_counts();
    let (a, b) = tch::no_grad(|| (explicit.forward(&idx, false), sparse.forward(&idx, false)));
    let after = ablate::transformer::attention::path_counts();
    let (diff, scale) = ((&a - &b).abs().max().double_value(&[]), a.abs().max().double_value(&[]));
    assert!(diff < 1e-4 * scale.max(1.0), "sparse and explicit differ by {diff} (logits up to {scale})");
    assert_eq!(after[2] - before[2], 2, "the two windowed layers ran the sparse kernel");
    assert!(after[0] > before[0], "the dense layer ran the fused kernel");
}

#[test]
fn every_attention_path_and_pattern_runs_in_half_and_bfloat16_and_stays_near_float32() {
    let _serial = common::serial();
    // Under fp16 the scores are Half, whose largest finite value is 65504: a masking constant of −1e9 made
    // `masked_fill` fail ("cannot be converted to type at::Half without overflow"). Every path (fused,
    // explicit, the sparse kernel), dense and windowed with dilation and globals, causal and padded, runs
    // forward and backward in both 16-bit kinds with finite values, close to the same weights in float32.
    let patterns = [pattern(None, 1, None, 0), pattern(Some(2), 1, None, 0), pattern(Some(2), 2, Some(5), 1)];
    let n = 13;
    let real = real_tokens(&[13, 6], n);
    for p in &patterns {
        for implementation in [Implementation::Fused, Implementation::Explicit, Implementation::Sparse] {
            if implementation == Implementation::Sparse && p.window.is_none() {
                continue; // the sparse kernel is for windowed patterns (dense is refused by validation)
            }
            for (causal, padding) in [(false, false), (true, false), (false, true)] {
                tch::manual_seed(31);
                let (vs, m) = attention(p, implementation, PositionEncoding::Alibi);
                randomise(&vs);
                let x = Tensor::randn([2, n, 16], (Kind::Float, Device::Cpu));
                let key_padding = padding.then_some(&real);
                let mask = Mask { causal, key_padding, offset: 0, bias: None };
                let reference = m.self_attend(&x, &mask, None, false, false).output;
                for (kind, tolerance) in [(Kind::Half, 0.02), (Kind::BFloat16, 0.1)] {
                    let (mut low_vs, low) = attention(p, implementation, PositionEncoding::Alibi);
                    low_vs.copy(&vs).unwrap();
                    low_vs.set_kind(kind);
                    let xi = x.to_kind(kind).set_requires_grad(true);
                    let out = low.self_attend(&xi, &mask, None, false, false).output;
                    out.to_kind(Kind::Float).sum(Kind::Float).backward();
                    let what = format!("{p:?} {implementation:?} causal={causal} padding={padding} {kind:?}");
                    let rows = if padding { real.unsqueeze(-1).to_kind(Kind::Float) } else { out.ones_like() };
                    let out = out.to_kind(Kind::Float) * &rows;
                    assert_eq!(out.isfinite().all().int64_value(&[]), 1, "{what}: non-finite output");
                    assert_eq!(xi.grad().isfinite().all().int64_value(&[]), 1, "{what}: non-finite gradient");
                    let diff = (&out - &reference * &rows).abs().max().double_value(&[]);
                    assert!(diff < tolerance, "{what}: {diff} from float32");
                }
            }
        }
    }
}
