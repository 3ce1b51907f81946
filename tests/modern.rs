//! The mechanisms that came after UDL and the Annotated Transformer (QK-norm, gated and squared FFNs,
//! soft-capping, zero and scaled output init, parallel blocks, value residuals and value embeddings, U-net
//! skips), each checked against its closed form or a property that fails without it.
mod common;
use ablate::models::gpt::Gpt;
use ablate::transformer::attention::{explicit_attention, ExtraValues, Mask, MultiHeadAttention, ScoreMap, ScorePath};
use ablate::transformer::layers::{softcap, FeedForward, LayerInit, Placement, StackCache, TransformerLayer};
use ablate::transformer::spec::{
    Activation, AttentionSpec, Implementation, OutputInit, PositionEncoding, PositionSpec, QkNorm, TransformerSpec,
};
use tch::nn::{self, Module};
use tch::{Device, Kind, Tensor};

const CPU: (Kind, Device) = (Kind::Float, Device::Cpu);

fn max_diff(a: &Tensor, b: &Tensor) -> f64 {
    (a - b).abs().max().double_value(&[])
}

/// Every trainable variable of `vs` redrawn at a scale where differences show.
fn randomise(vs: &nn::VarStore, seed: i64) {
    tch::manual_seed(seed);
    tch::no_grad(|| {
        let mut named: Vec<(String, Tensor)> = vs.variables().into_iter().collect();
        named.sort_by(|a, b| a.0.cmp(&b.0));
        for (_, mut p) in named {
            p.copy_(&(Tensor::randn(p.size(), CPU) * 0.3));
        }
    });
}

/// Copies every variable `to` shares (by name and shape) with `from`.
fn copy_shared(from: &nn::VarStore, to: &nn::VarStore) {
    let theirs = from.variables();
    tch::no_grad(|| {
        for (name, mut var) in to.variables() {
            if let Some(t) = theirs.get(&name).filter(|t| t.size() == var.size()) {
                var.copy_(t);
            }
        }
    });
}

/// Sets every variable of `vs` whose name ends with `suffix` to `value`.
fn set_all(vs: &nn::VarStore, suffix: &str, value: &[f32]) -> usize {
    let mut n = 0;
    tch::no_grad(|| {
        for (name, mut var) in vs.variables() {
            if name.ends_with(suffix) {
                var.copy_(&Tensor::from_slice(value).view(var.size().as_slice()));
                n += 1;
            }
        }
    });
    n
}

#[test]
fn qk_norm_makes_the_scores_blind_to_the_scale_of_the_query_and_key_projections() {
    let _serial = common::serial();
    // Under QK-norm the scores depend on each head's q and k directions only: multiplying the Q and K rows of
    // the projection (weights and biases) by 7 leaves the output unchanged. Without it the output moves.
    let d = 16;
    for (qk_norm, invariant) in [(QkNorm::RmsNorm, true), (QkNorm::LayerNorm, true), (QkNorm::None, false)] {
        let spec = AttentionSpec { qk_norm, ..AttentionSpec::standard(d, 4) };
        let vs = nn::VarStore::new(Device::Cpu);
        let m = MultiHeadAttention::plain(vs.root(), d, &spec, 0.02);
        randomise(&vs, 1);
        let x = Tensor::randn([2, 6, d], CPU);
        let before = tch::no_grad(|| m.self_attend(&x, &Mask::causal(), None, false, false).output);
        tch::no_grad(|| {
            for (name, var) in vs.variables() {
                if name.starts_with("qkv.") {
                    let _ = var.narrow(0, 0, 2 * d).g_mul_scalar_(7.0);
                }
            }
        });
        let after = tch::no_grad(|| m.self_attend(&x, &Mask::causal(), None, false, false).output);
        let moved = max_diff(&before, &after);
        assert_eq!(moved < 1e-4, invariant, "{qk_norm:?}: the output moved by {moved}");
    }
}

#[test]
fn qk_norm_normalises_each_heads_queries_to_unit_rms_before_the_dot_product() {
    let _serial = common::serial();
    // With unit gains, RMS-normalised queries and keys of width d_k score at most d_k (Cauchy–Schwarz); with a
    // scale of 1 and one key equal to the query direction, the weights follow from the closed form.
    let d = 8;
    let spec = AttentionSpec {
        qk_norm: QkNorm::RmsNorm,
        scale: ablate::transformer::spec::Scale::None,
        implementation: Implementation::Explicit,
        bias: false,
        ..AttentionSpec::standard(d, 1)
    };
    let vs = nn::VarStore::new(Device::Cpu);
    let m = MultiHeadAttention::plain(vs.root(), d, &spec, 0.02);
    // Identity projections: q = k = v = x.
    tch::no_grad(|| {
        for (name, mut var) in vs.variables() {
            if name == "qkv.weight" {
                var.copy_(&Tensor::cat(&[Tensor::eye(d, CPU), Tensor::eye(d, CPU), Tensor::eye(d, CPU)], 0));
            }
        }
    });
    // Two tokens: 10·e₀ and 0.1·e₁ (very different norms, orthogonal directions).
    let x = Tensor::zeros([1, 2, d], CPU);
    tch::no_grad(|| {
        let _ = x.get(0).get(0).get(0).fill_(10.0);
        let _ = x.get(0).get(1).get(1).fill_(0.1);
    });
    let w = tch::no_grad(|| m.self_attend(&x, &Mask::default(), None, false, true).weights.unwrap());
    // Normalised, each token is √d times a unit vector: its score with itself is d, with the other 0.
    let expected = 1.0 / (1.0 + (-(d as f64)).exp());
    for i in 0..2 {
        assert!((w.double_value(&[0, 0, i, i]) - expected).abs() < 1e-4, "{w}");
    }
}

#[test]
fn soft_capped_scores_follow_the_closed_form_and_stay_within_the_cap() {
    let _serial = common::serial();
    let (q, k, v) = (
        Tensor::randn([2, 3, 5, 4], CPU) * 3.0,
        Tensor::randn([2, 3, 7, 4], CPU) * 3.0,
        Tensor::randn([2, 3, 7, 4], CPU),
    );
    let (scale, cap) = (0.5, 2.0);
    let (out, w) = explicit_attention(&q, &k, &v, None, &ScorePath::eval(ScoreMap { scale, softcap: Some(cap) }));
    let scores = (q.matmul(&k.transpose(-2, -1)) * scale / cap).tanh() * cap;
    let expected_w = scores.softmax(-1, Kind::Float);
    assert!(max_diff(&w, &expected_w) < 1e-6);
    assert!(max_diff(&out, &expected_w.matmul(&v)) < 1e-5);
    // The largest weight ratio within a row is bounded by e^(2·cap).
    let ratio = (w.amax(-1, false) / w.amin(-1, false)).max().double_value(&[]);
    assert!(ratio <= (2.0 * cap).exp() + 1e-3, "ratio {ratio}");
    // softcap itself: identity near 0, bounded by the cap, odd.
    let z = Tensor::from_slice(&[-1000.0f32, -0.01, 0.0, 0.01, 1000.0]);
    let c = softcap(z.shallow_clone(), Some(30.0));
    assert!((c.double_value(&[4]) - 30.0).abs() < 1e-3 && (c.double_value(&[0]) + 30.0).abs() < 1e-3);
    assert!((c.double_value(&[3]) - 0.01).abs() < 1e-7);
    assert_eq!(softcap(z.shallow_clone(), None).double_value(&[4]), 1000.0);
}

#[test]
fn attention_with_a_soft_cap_takes_the_explicit_path_even_when_auto() {
    let _serial = common::serial();
    let d = 16;
    let spec = AttentionSpec { softcap: Some(1.0), ..AttentionSpec::standard(d, 4) };
    let vs = nn::VarStore::new(Device::Cpu);
    let m = MultiHeadAttention::plain(vs.root(), d, &spec, 0.02);
    let before = ablate::transformer::attention::path_counts();
    let _ = tch::no_grad(|| m.self_attend(&Tensor::randn([1, 4, d], CPU), &Mask::causal(), None, false, false));
    let after = ablate::transformer::attention::path_counts();
    assert_eq!((after[0] - before[0], after[1] - before[1]), (0, 1));
}

#[test]
fn capped_output_logits_are_the_uncapped_ones_through_cap_tanh() {
    let _serial = common::serial();
    let mut spec = TransformerSpec::small(16, 2, 2, 8);
    let plain = nn::VarStore::new(Device::Cpu);
    let a = Gpt::new(&plain.root(), &spec, 11);
    randomise(&plain, 3);
    spec.logit_softcap = Some(0.5);
    let capped_vs = nn::VarStore::new(Device::Cpu);
    let b = Gpt::new(&capped_vs.root(), &spec, 11);
    copy_shared(&plain, &capped_vs);
    let idx = Tensor::randint(11, [2, 8], (Kind::Int64, Device::Cpu));
    let (za, zb) = tch::no_grad(|| (a.forward(&idx, false), b.forward(&idx, false)));
    assert!(za.abs().max().double_value(&[]) > 0.5, "the test needs logits beyond the cap");
    assert!(max_diff(&zb, &((&za / 0.5).tanh() * 0.5)) < 1e-5);
}

#[test]
fn the_feed_forward_variants_compute_their_formulas() {
    let _serial = common::serial();
    let (d, hidden) = (6, 10);
    let x = Tensor::randn([3, d], CPU);
    for activation in [Activation::Relu, Activation::Gelu, Activation::Relu2, Activation::Swiglu, Activation::Geglu] {
        let vs = nn::VarStore::new(Device::Cpu);
        let ffn = FeedForward::new(vs.root(), d, hidden, activation, 0.02);
        randomise(&vs, 5);
        let vars = vs.variables();
        let lin = |name: &str| x.linear(&vars[&format!("{name}.weight")], Some(&vars[&format!("{name}.bias")]));
        let h = lin("up");
        let h = match activation {
            Activation::Relu => h.relu(),
            Activation::Gelu => h.gelu("none"),
            Activation::Relu2 => h.relu() * h.relu(),
            Activation::Swiglu => &h * h.sigmoid() * lin("gate"),
            Activation::Geglu => h.gelu("none") * lin("gate"),
        };
        let expected = h.linear(&vars["down.weight"], Some(&vars["down.bias"]));
        let got = tch::no_grad(|| ffn.forward(&x));
        assert!(max_diff(&got, &expected) < 1e-5, "{activation:?}");
        assert_eq!(vars.contains_key("gate.weight"), activation.is_gated(), "{activation:?}");
    }
}

#[test]
fn a_gated_ffn_at_its_default_width_has_the_parameters_of_a_4d_ffn() {
    let _serial = common::serial();
    // round(8·D/3) hidden units in three matrices against 4·D in two: equal up to the rounding (and biases).
    for d in [64i64, 96, 128, 200] {
        let cfg = |activation: &str| {
            ablate::recipe::parse(
                &format!("kind: lm\ntransformer: {{d_model: {d}, heads: 4, activation: {activation}}}\n"),
                "a.yaml",
                "a",
                false,
            )
            .unwrap()
            .runs[0]
                .config
                .transformer
                .ffn_hidden
                .unwrap()
        };
        let (plain, gated) = (cfg("gelu"), cfg("swiglu"));
        assert_eq!(plain, 4 * d);
        let (weights_plain, weights_gated) = (2 * d * plain, 3 * d * gated);
        assert!((weights_gated - weights_plain).abs() <= 3 * d, "d {d}: {weights_gated} vs {weights_plain}");
    }
}

/// A pre-LN layer of `spec` with random weights (seeded) and its variables.
fn layer(spec: &TransformerSpec, seed: i64, at: Placement) -> (nn::VarStore, TransformerLayer) {
    let vs = nn::VarStore::new(Device::Cpu);
    let l = TransformerLayer::new(vs.root(), spec, false, LayerInit::default(), None, at);
    randomise(&vs, seed);
    (vs, l)
}

fn pre_ln(d: i64) -> TransformerSpec {
    let mut spec = TransformerSpec::small(d, 1, 2, 8);
    spec.pre_ln = true;
    spec.position = PositionSpec::of(PositionEncoding::None);
    spec
}

fn run(l: &TransformerLayer, x: &Tensor) -> Tensor {
    tch::no_grad(|| l.forward(x, &Mask::causal(), None, None, Default::default(), false, false).output)
}

#[test]
fn a_parallel_block_adds_two_branches_that_read_the_same_input() {
    let _serial = common::serial();
    // x + attn(LN x) + ffn(LN x): the change a block makes is the sum of the changes each branch makes
    // alone (the other's output projection zeroed). A sequential block fails this: its FFN reads x + attn.
    let d = 12;
    let x = Tensor::randn([2, 5, d], CPU);
    for parallel in [true, false] {
        let mut spec = pre_ln(d);
        spec.parallel = parallel;
        let at = Placement { index: 0, count: 1 };
        let (vs, both) = layer(&spec, 9, at);
        let (vs_attn, attn_only) = layer(&spec, 9, at);
        let (vs_ffn, ffn_only) = layer(&spec, 9, at);
        for v in [&vs_attn, &vs_ffn] {
            copy_shared(&vs, v);
        }
        tch::no_grad(|| {
            for (name, mut var) in vs_attn.variables() {
                if name.starts_with("ffn.down") {
                    let _ = var.zero_();
                }
            }
            for (name, mut var) in vs_ffn.variables() {
                if name.starts_with("attn.out") {
                    let _ = var.zero_();
                }
            }
        });
        let sum_of_changes = (run(&attn_only, &x) - &x) + (run(&ffn_only, &x) - &x);
        let additive = max_diff(&(run(&both, &x) - &x), &sum_of_changes) < 1e-5;
        assert_eq!(additive, parallel, "parallel {parallel}");
        assert_eq!(vs.variables().keys().any(|k| k.starts_with("norm_ffn")), !parallel);
    }
}

#[test]
fn zero_output_init_makes_every_pre_ln_block_the_identity_and_scaled_init_shrinks_by_depth() {
    let _serial = common::serial();
    let d = 32;
    let mut spec = pre_ln(d);
    spec.output_init = OutputInit::Zero;
    let vs = nn::VarStore::new(Device::Cpu);
    let l =
        TransformerLayer::new(vs.root(), &spec, false, LayerInit::default(), None, Placement { index: 0, count: 1 });
    let x = Tensor::randn([2, 5, d], CPU);
    assert!(max_diff(&run(&l, &x), &x) < 1e-7);
    // Scaled: the residual-writing projections start with std 0.02/√(2·layers); the others keep 0.02.
    spec.output_init = OutputInit::Scaled;
    spec.layers = 8;
    spec.ffn_hidden = 512;
    tch::manual_seed(0);
    let vs = nn::VarStore::new(Device::Cpu);
    let _l =
        TransformerLayer::new(vs.root(), &spec, false, LayerInit::default(), None, Placement { index: 0, count: 8 });
    let vars = vs.variables();
    let std = |name: &str| vars[name].std(true).double_value(&[]);
    let expected = 0.02 / 16f64.sqrt();
    for name in ["ffn.down.weight", "attn.out.weight"] {
        assert!((std(name) / expected - 1.0).abs() < 0.1, "{name}: {} vs {expected}", std(name));
    }
    assert!((std("ffn.up.weight") / 0.02 - 1.0).abs() < 0.05);
}

/// A small decoder of `spec` with random weights, and its variables.
fn decoder(spec: &TransformerSpec, seed: i64) -> (nn::VarStore, Gpt) {
    let vs = nn::VarStore::new(Device::Cpu);
    let gpt = Gpt::new(&vs.root(), spec, 13);
    randomise(&vs, seed);
    (vs, gpt)
}

#[test]
fn value_residual_at_weights_one_and_zero_is_the_plain_model_and_acts_otherwise() {
    let _serial = common::serial();
    let mut spec = TransformerSpec::small(16, 3, 2, 8);
    let (vs_plain, plain) = decoder(&spec, 21);
    spec.value_residual = true;
    let (vs_mixed, mixed) = decoder(&spec, 22);
    copy_shared(&vs_plain, &vs_mixed);
    // Layers 1 and 2 mix; layer 0 has nothing to mix with.
    assert_eq!(set_all(&vs_mixed, "value_mix", &[1.0, 0.0]), 2);
    let idx = Tensor::randint(13, [2, 8], (Kind::Int64, Device::Cpu));
    let z = |m: &Gpt| tch::no_grad(|| m.forward(&idx, false));
    assert!(max_diff(&z(&plain), &z(&mixed)) < 1e-5);
    // Only the first layer's values: layer 2's output then changes with layer 0's value projection alone.
    set_all(&vs_mixed, "value_mix", &[0.0, 1.0]);
    assert!(max_diff(&z(&plain), &z(&mixed)) > 1e-3);
}

#[test]
fn value_embeddings_mix_token_rows_into_the_first_and_last_layers_values() {
    let _serial = common::serial();
    let reads =
        |count, tables| (0..count).map(|i| Placement { index: i, count }.value_table(tables)).collect::<Vec<_>>();
    assert_eq!(reads(6, 2), [Some(0), Some(1), None, None, Some(0), Some(1)]);
    assert_eq!(reads(4, 2), [Some(0), Some(1), Some(0), Some(1)]);
    assert_eq!(reads(3, 0), [None, None, None]);

    // One unit: the values it attends with are μ₁·v + μ₂·e, v its own projection.
    let mut attention = AttentionSpec::standard(16, 4);
    attention.kv_heads = 2;
    let vs = nn::VarStore::new(Device::Cpu);
    let unit = MultiHeadAttention::new(
        vs.root() / "attn",
        16,
        &attention,
        &PositionSpec::of(PositionEncoding::None),
        None,
        0.02,
    )
    .with_embedding_mix(&(vs.root() / "attn"));
    assert_eq!(set_all(&vs, "embedding_mix", &[0.3, 0.7]), 1);
    let (x, e) = (Tensor::randn([2, 5, 16], CPU), Tensor::randn([2, 5, 8], CPU));
    let values =
        |extra: ExtraValues| tch::no_grad(|| unit.self_attend_mixed(&x, &Mask::causal(), None, extra, false, false).1);
    let own = values(ExtraValues::default());
    let mixed = values(ExtraValues { first: None, embedding: Some(&e) });
    assert!(max_diff(&mixed, &(&own * 0.3 + &e * 0.7)) < 1e-6);

    // A decoder with 2 tables over 5 layers: layers 0, 1, 3 and 4 mix (the middle one does not), each table
    // one row per token of the values' width (2 key/value heads of 4 dims).
    let mut spec = TransformerSpec::small(16, 5, 4, 8);
    spec.attention.kv_heads = 2;
    let (vs_plain, plain) = decoder(&spec, 71);
    spec.value_embeddings = 2;
    let (vs_ve, with) = decoder(&spec, 72);
    copy_shared(&vs_plain, &vs_ve);
    let vars = vs_ve.variables();
    assert_eq!(vars["value_embeddings.1.weight"].size(), [13, 8]);
    assert!(!vars.contains_key("value_embeddings.2.weight") && !vars.contains_key("layers.2.attn.embedding_mix"));
    assert_eq!(set_all(&vs_ve, "embedding_mix", &[1.0, 0.0]), 4);
    let idx = Tensor::from_slice(&[1i64, 2, 3, 1, 2, 3, 4, 5]).view([1, 8]);
    let z = |m: &Gpt| tch::no_grad(|| m.forward(&idx, false));
    assert!(max_diff(&z(&plain), &z(&with)) < 1e-5, "at (1, 0) the tables are out");
    set_all(&vs_ve, "embedding_mix", &[1.0, 1.0]);
    let before = z(&with);
    assert!(max_diff(&z(&plain), &before) > 1e-3);
    // Rows are looked up by token: a token the sequence lacks changes nothing, one it has changes the output
    // from its first occurrence on (causal), not before.
    let table = vars["value_embeddings.0.weight"].shallow_clone();
    tch::no_grad(|| table.get(9).copy_(&Tensor::ones([8], CPU)));
    assert!(max_diff(&before, &z(&with)) < 1e-6);
    tch::no_grad(|| table.get(4).copy_(&Tensor::ones([8], CPU)));
    let after = z(&with);
    assert!(max_diff(&before.narrow(1, 0, 6), &after.narrow(1, 0, 6)) < 1e-6);
    assert!(max_diff(&before.narrow(1, 6, 2), &after.narrow(1, 6, 2)) > 1e-3);
}

#[test]
fn unet_skips_at_weight_zero_are_the_plain_model_and_connect_mirrored_layers() {
    let _serial = common::serial();
    assert_eq!(Placement { index: 3, count: 4 }.mirror(), Some(0));
    assert_eq!(Placement { index: 2, count: 4 }.mirror(), Some(1));
    assert_eq!(Placement { index: 1, count: 4 }.mirror(), None);
    assert_eq!(Placement { index: 1, count: 3 }.mirror(), None, "the middle layer of an odd stack");
    assert_eq!(Placement { index: 2, count: 3 }.mirror(), Some(0));
    let mut spec = TransformerSpec::small(16, 4, 2, 8);
    let (vs_plain, plain) = decoder(&spec, 31);
    spec.unet_skips = true;
    let (vs_skips, skips) = decoder(&spec, 32);
    copy_shared(&vs_plain, &vs_skips);
    assert_eq!(set_all(&vs_skips, "skip_weight", &[0.0]), 2);
    let idx = Tensor::randint(13, [2, 8], (Kind::Int64, Device::Cpu));
    let z = |m: &Gpt| tch::no_grad(|| m.forward(&idx, false));
    assert!(max_diff(&z(&plain), &z(&skips)) < 1e-5);
    set_all(&vs_skips, "skip_weight", &[1.0]);
    assert!(max_diff(&z(&plain), &z(&skips)) > 1e-3);
}

#[test]
fn cached_decoding_equals_the_whole_forward_with_every_new_mechanism_on() {
    let _serial = common::serial();
    let mut spec = TransformerSpec::small(16, 4, 2, 12);
    spec.pre_ln = true;
    spec.position = PositionSpec::of(PositionEncoding::Rope);
    spec.attention.qk_norm = QkNorm::RmsNorm;
    spec.attention.softcap = Some(3.0);
    spec.logit_softcap = Some(5.0);
    spec.activation = Activation::Swiglu;
    spec.parallel = true;
    spec.value_residual = true;
    spec.value_embeddings = 2;
    spec.unet_skips = true;
    let (_vs, model) = decoder(&spec, 41);
    let _guard = tch::no_grad_guard();
    let idx = Tensor::randint(13, [2, 10], (Kind::Int64, Device::Cpu));
    let whole = model.forward(&idx, false);
    let mut cache = StackCache::default();
    let mut parts = vec![model.forward_cached(&idx.narrow(1, 0, 4), &mut cache)];
    for t in 4..10 {
        parts.push(model.forward_cached(&idx.narrow(1, t, 1), &mut cache));
    }
    let stepped = Tensor::cat(&parts, 1);
    assert!(max_diff(&stepped, &whole) < 1e-4, "{}", max_diff(&stepped, &whole));
}

fn vit_config(extra: &str) -> Result<ablate::recipe::Config, String> {
    let text = format!(
        "kind: vit\ntransformer: {{d_model: 16, layers: 2, heads: 2, pe: none}}\nvision: {{patch_size: 7{extra}}}\n"
    );
    ablate::recipe::parse(&text, "v.yaml", "v", false).map(|r| r.runs[0].config.clone()).map_err(|e| e.to_string())
}

#[test]
fn registers_are_learned_tokens_that_every_patch_sees_and_the_output_drops() {
    let _serial = common::serial();
    use ablate::models::vit::Vit;
    use ablate::models::ImageClassifier;
    let plain = vit_config("").unwrap();
    let with = vit_config(", registers: 3").unwrap();
    let spec = with.vit_spec();
    assert_eq!((spec.registers, spec.transformer.attention.pattern.global_tokens), (3, 3));
    let (vs_a, vs_b) = (nn::VarStore::new(Device::Cpu), nn::VarStore::new(Device::Cpu));
    let (a, b) = (Vit::new(&vs_a.root(), &plain.vit_spec()), Vit::new(&vs_b.root(), &spec));
    randomise(&vs_a, 51);
    copy_shared(&vs_a, &vs_b);
    let count = |vs: &nn::VarStore| vs.trainable_variables().iter().map(|t| t.numel()).sum::<usize>();
    assert_eq!(count(&vs_b) - count(&vs_a), 3 * 16, "three learned tokens of width 16");
    let images = Tensor::randn([2, 1, 28, 28], CPU);
    let ((za, wa), (zb, wb)) = tch::no_grad(|| (a.classify(&images, false, true), b.classify(&images, false, true)));
    // The output keeps the <cls> token and the 16 patches; attention runs over the registers too.
    assert_eq!(a.features(&images, false, false).0.size(), b.features(&images, false, false).0.size());
    assert_eq!((wa[0].size()[3], wb[0].size()[3]), (17, 20));
    assert!(max_diff(&za, &zb) > 1e-4, "the registers change what the <cls> token reads");
    // Registers are ViT's: the windowed models refuse them.
    let swin = "kind: swin\ntransformer: {d_model: 16, heads: 2}\nvision: {patch_size: 2, depths: [1, 1], window: 7, registers: 2}\n";
    let e = ablate::recipe::parse(swin, "s.yaml", "s", false).err().unwrap().to_string();
    assert!(e.contains("vision.registers") && e.lines().count() == 1, "{e}");
}

#[test]
fn the_token_norm_ratio_is_one_when_every_patch_is_alike_and_grows_with_an_outlier() {
    let _serial = common::serial();
    use ablate::models::vit::Vit;
    let cfg = vit_config("").unwrap();
    let vs = nn::VarStore::new(Device::Cpu);
    let vit = Vit::new(&vs.root(), &cfg.vit_spec());
    randomise(&vs, 61);
    // No position encoding and a constant image: every patch token is the same, so is every output.
    let flat = Tensor::ones([2, 1, 28, 28], CPU) * 0.5;
    let ratio = vit.token_norm_ratio(&flat);
    assert!((ratio - 1.0).abs() < 1e-4, "{ratio}");
    // One patch far brighter than the rest stands out in the last layer.
    let spot = flat.copy();
    let _ = spot.narrow(2, 0, 7).narrow(3, 0, 7).fill_(30.0);
    assert!(vit.token_norm_ratio(&spot) > 1.5, "{}", vit.token_norm_ratio(&spot));
}

#[test]
fn a_window_warm_up_uses_each_steps_window_while_training_and_the_final_one_after() {
    let _serial = common::serial();
    use ablate::transformer::attention::set_training_step;
    use ablate::transformer::spec::Pattern;
    let mut spec = TransformerSpec::small(16, 2, 2, 12);
    let with_window = |w: i64, schedule: Vec<(i64, i64)>| {
        let mut s = spec.clone();
        s.attention.pattern = Pattern { window: Some(w), window_schedule: schedule, ..Pattern::dense() };
        s
    };
    let (vs, warm) = decoder(&with_window(8, vec![(5, 2), (9, 4)]), 71);
    let fixed = |w: i64| {
        let (v, m) = decoder(&with_window(w, Vec::new()), 72);
        copy_shared(&vs, &v);
        (v, m)
    };
    let ((_v2, two), (_v4, four), (_v8, eight)) = (fixed(2), fixed(4), fixed(8));
    let idx = Tensor::randint(13, [2, 12], (Kind::Int64, Device::Cpu));
    let z = |m: &Gpt| tch::no_grad(|| m.forward(&idx, false));
    for (step, reference) in
        [(Some(0), &two), (Some(4), &two), (Some(5), &four), (Some(8), &four), (Some(9), &eight), (None, &eight)]
    {
        set_training_step(step);
        assert!(max_diff(&z(&warm), &z(reference)) < 1e-6, "step {step:?}");
    }
    assert!(max_diff(&z(&two), &z(&eight)) > 1e-4, "the windows differ on this input");
    spec.attention.pattern = Pattern::dense();
}

#[test]
fn the_window_in_force_is_recorded_as_a_training_curve() {
    let _serial = common::serial();
    let cfg = ablate::recipe::parse(
        "kind: lm\ntransformer: {d_model: 16, layers: 1, heads: 2, block_size: 16, attention: {pattern: {window: 8, window_schedule: [[4, 2], [8, 4]]}}}\ndata: {max_chars: 20000}\ntrain: {steps: 10, batch_size: 2, log_interval: 1, eval_interval: 5, eval_batches: 1, warmup_steps: 1}\n",
        "w.yaml",
        "w",
        false,
    )
    .unwrap()
    .runs[0]
        .config
        .clone();
    let task = ablate::tasks::task(cfg.kind);
    let out = std::env::temp_dir();
    let mut data = ablate::tasks::DataCache::new(&out, true);
    task.prepare(&cfg, &mut data).unwrap();
    let ctx = ablate::tasks::RunContext {
        device: Device::Cpu,
        progress: &mut |_, _| {},
        state: None,
        out: &out,
        stem: "window",
    };
    let trained = task.train(&cfg, &data, ctx).unwrap();
    let windows: Vec<(i64, f64)> = trained
        .outcome
        .curves
        .iter()
        .filter(|c| c.split == "train" && c.metric == "window")
        .map(|c| (c.step, c.value))
        .collect();
    // Step s (1-based in the curves) trained at 0-based step s − 1.
    let expected: Vec<(i64, f64)> = (1..=10)
        .map(|s| {
            (
                s,
                if s <= 4 {
                    2.0
                } else if s <= 8 {
                    4.0
                } else {
                    8.0
                },
            )
        })
        .collect();
    assert_eq!(windows, expected);
    // Refusals: a schedule without a window to warm up, steps that do not increase.
    for (bad, says) in [
        ("{window_schedule: [[4, 2]]}", "set transformer.attention.pattern.window"),
        ("{window: 8, window_schedule: [[4, 2], [4, 3]]}", "steps must increase"),
    ] {
        let text = format!("kind: lm\ntransformer: {{d_model: 16, layers: 1, heads: 2, block_size: 16, attention: {{pattern: {bad}}}}}\n");
        let e = ablate::recipe::parse(&text, "b.yaml", "b", false).err().unwrap().to_string();
        assert!(e.contains(says) && e.contains("window_schedule") && e.lines().count() == 1, "{e}");
    }
}
