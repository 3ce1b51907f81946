//! Properties of the attention core and the Transformer layer (UDL §12.2–12.4), not snapshots.
mod common;
use ablate::models::gpt::Gpt;
use ablate::transformer::attention::{
    explicit_attention, fused_attention, Grid, Mask, MultiHeadAttention, ScoreMap, ScorePath,
};
use ablate::transformer::layers::{LayerInit, Placement, TransformerLayer};
use ablate::transformer::spec::{
    Activation, AttentionSpec, Implementation, OutputGate, PositionEncoding, PositionSpec, Scale, TransformerSpec,
};
use tch::{nn, Device, Kind, Tensor};

fn max_abs_diff(a: &Tensor, b: &Tensor) -> f64 {
    (a - b).abs().max().double_value(&[])
}

fn mha(d: i64, heads: i64, scale: Scale, implementation: Implementation) -> (nn::VarStore, MultiHeadAttention) {
    mha_with(d, AttentionSpec { scale, implementation, ..AttentionSpec::standard(d, heads) })
}

fn mha_with(d: i64, spec: AttentionSpec) -> (nn::VarStore, MultiHeadAttention) {
    let vs = nn::VarStore::new(Device::Cpu);
    let m = MultiHeadAttention::plain(vs.root(), d, &spec, 0.02);
    // Larger weights than the training init, so the softmax is far from uniform and differences show.
    tch::no_grad(|| {
        for mut p in vs.trainable_variables() {
            p.copy_(&(Tensor::randn(p.size(), (Kind::Float, Device::Cpu)) * 0.3));
        }
    });
    (vs, m)
}

#[test]
fn attention_rows_sum_to_one_and_masked_keys_get_zero_weight() {
    let _serial = common::serial();
    tch::manual_seed(0);
    let (_vs, m) = mha(16, 4, Scale::SqrtDk, Implementation::Explicit);
    let x = Tensor::randn([3, 7, 16], (Kind::Float, Device::Cpu));
    let keep = Tensor::from_slice(&[1i64, 1, 1, 1, 1, 0, 0]).to_kind(Kind::Bool).unsqueeze(0).repeat([3, 1]);
    let mask = Mask { causal: true, key_padding: Some(&keep), offset: 0, bias: None };
    let w = m.self_attend(&x, &mask, None, false, true).weights.unwrap();
    assert_eq!(w.size(), vec![3, 4, 7, 7]);
    let row_sums = w.sum_dim_intlist(-1, false, Kind::Float);
    assert!(max_abs_diff(&row_sums, &row_sums.ones_like()) < 1e-5);
    assert!(w.min().double_value(&[]) >= 0.0);
    // Future keys (j > i) and padded keys (j >= 5) receive exactly zero weight.
    for i in 0..7 {
        for j in 0..7 {
            if j > i || j >= 5 {
                assert_eq!(w.select(2, i).select(2, j).abs().max().double_value(&[]), 0.0, "query {i} key {j}");
            }
        }
    }
}

#[test]
fn without_position_encoding_permuting_the_input_permutes_the_output() {
    let _serial = common::serial();
    tch::manual_seed(1);
    let (_vs, m) = mha(24, 3, Scale::SqrtDk, Implementation::Auto);
    let x = Tensor::randn([2, 9, 24], (Kind::Float, Device::Cpu));
    let perm = Tensor::from_slice(&[4i64, 0, 8, 2, 7, 1, 3, 6, 5]);
    let y = m.self_attend(&x, &Mask::default(), None, false, false).output;
    let y_of_permuted = m.self_attend(&x.index_select(1, &perm), &Mask::default(), None, false, false).output;
    assert!(max_abs_diff(&y.index_select(1, &perm), &y_of_permuted) < 1e-5);
}

fn small_gpt(pe: PositionEncoding, pre_ln: bool, implementation: Implementation) -> (nn::VarStore, Gpt) {
    let mut spec = TransformerSpec::small(32, 2, 4, 16);
    spec.position = PositionSpec::of(pe);
    spec.pre_ln = pre_ln;
    spec.attention.implementation = implementation;
    let vs = nn::VarStore::new(Device::Cpu);
    let gpt = Gpt::new(&vs.root(), &spec, 20);
    (vs, gpt)
}

#[test]
fn causal_outputs_do_not_depend_on_future_tokens() {
    let _serial = common::serial();
    for pe in [PositionEncoding::None, PositionEncoding::Sinusoidal, PositionEncoding::Learned] {
        for implementation in [Implementation::Fused, Implementation::Explicit] {
            tch::manual_seed(2);
            let (_vs, gpt) = small_gpt(pe, false, implementation);
            let a = Tensor::from_slice(&[1i64, 5, 7, 2, 9, 3, 3, 8, 0, 4]).unsqueeze(0);
            let b = a.copy();
            b.narrow(1, 6, 4).copy_(&Tensor::from_slice(&[11i64, 12, 13, 14]).unsqueeze(0));
            let la = gpt.forward(&a, false);
            let lb = gpt.forward(&b, false);
            assert!(max_abs_diff(&la.narrow(1, 0, 6), &lb.narrow(1, 0, 6)) < 1e-5, "{pe:?} {implementation:?}");
            assert!(max_abs_diff(&la.narrow(1, 6, 4), &lb.narrow(1, 6, 4)) > 1e-4, "later positions must change");
        }
    }
}

#[test]
fn fused_and_explicit_paths_agree_on_every_mask_and_scale() {
    let _serial = common::serial();
    tch::manual_seed(3);
    let opts = (Kind::Float, Device::Cpu);
    let (b, h, n_q, n_k, d) = (2, 3, 5, 8, 6);
    let q = Tensor::randn([b, h, n_q, d], opts);
    let k = Tensor::randn([b, h, n_k, d], opts);
    let v = Tensor::randn([b, h, n_k, d], opts);
    let keep =
        Tensor::from_slice(&[1i64, 1, 1, 1, 1, 1, 0, 0, 1, 1, 1, 0, 0, 0, 0, 0]).view([2, 8]).to_kind(Kind::Bool);
    let q_sq = Tensor::randn([b, h, n_k, d], opts);
    for scale in [1.0 / (d as f64).sqrt(), 1.0, 0.37] {
        let cases: Vec<(&str, &Tensor, Mask)> = vec![
            ("none", &q, Mask::default()),
            ("padding", &q, Mask { causal: false, key_padding: Some(&keep), offset: 0, bias: None }),
            ("causal, fewer queries than keys", &q, Mask::causal()),
            ("causal square", &q_sq, Mask::causal()),
            ("causal + padding", &q_sq, Mask { causal: true, key_padding: Some(&keep), offset: 0, bias: None }),
        ];
        for (name, q, mask) in cases {
            let bias = mask.additive_bias(q.size()[2], n_k, Device::Cpu, Kind::Float);
            let (explicit, _) = explicit_attention(q, &k, &v, bias.as_ref(), &ScorePath::eval(ScoreMap::scaled(scale)));
            let fused = fused_attention(q, &k, &v, bias.as_ref(), false, &ScorePath::eval(ScoreMap::scaled(scale)));
            let diff = max_abs_diff(&explicit, &fused);
            assert!(diff < 1e-5, "{name}, scale {scale}: max difference {diff}");
        }
    }
}

/// Attention sinks written out by hand: w_ij = exp(l_ij) / (Σ_j' exp(l_ij') + exp(s_h)), out_i = Σ_j w_ij v_j,
/// with l = q·k·scale + mask; the explicit path, the fused kernel (its sink a zero key with the logit as
/// its mask column, under every mask, and its own causal mask written out) and their gradients with respect
/// to the sink logits agree with it.
#[test]
fn attention_sinks_join_every_softmax_with_a_zero_value_in_every_implementation() {
    let _serial = common::serial();
    tch::manual_seed(31);
    let opts = (Kind::Double, Device::Cpu);
    let (b, h, n, d) = (2, 3, 5, 4);
    let (q, k, v) =
        (Tensor::randn([b, h, n, d], opts), Tensor::randn([b, h, n, d], opts), Tensor::randn([b, h, n, d], opts));
    let scale = 0.6;
    let keep = Tensor::from_slice(&[1i64, 1, 1, 0, 0, 1, 1, 1, 1, 1]).view([2, 5]).to_kind(Kind::Bool);
    let cases = [
        ("none", Mask::default()),
        ("padding", Mask { causal: false, key_padding: Some(&keep), offset: 0, bias: None }),
        ("causal", Mask::causal()),
    ];
    for (name, mask) in cases {
        let sink = Tensor::from_slice(&[-1.0f64, 0.5, 2.0]).set_requires_grad(true);
        let bias = mask.additive_bias(n, n, Device::Cpu, Kind::Double);
        // By hand, one row at a time.
        let logits = q.matmul(&k.transpose(-2, -1)) * scale
            + bias.as_ref().map_or(Tensor::zeros([1], opts), |b| b.shallow_clone());
        let e = logits.exp();
        let denominator = e.sum_dim_intlist(-1, true, Kind::Double) + sink.exp().view([1, h, 1, 1]);
        let by_hand_weights = &e / denominator;
        let by_hand = by_hand_weights.matmul(&v);
        let path = ScorePath::eval(ScoreMap::scaled(scale)).with_sink(Some(&sink));
        let (explicit, weights) = explicit_attention(&q, &k, &v, bias.as_ref(), &path);
        assert!(max_abs_diff(&weights, &by_hand_weights) < 1e-12, "{name}: the weights");
        let row_sums = weights.sum_dim_intlist(-1, false, Kind::Double);
        assert!(row_sums.max().double_value(&[]) < 1.0 - 1e-3, "{name}: the sink takes a share of every row");
        assert!(max_abs_diff(&explicit, &by_hand) < 1e-12, "{name}: explicit");
        let fused = fused_attention(&q, &k, &v, bias.as_ref(), false, &path);
        assert!(max_abs_diff(&fused, &by_hand) < 1e-10, "{name}: fused");
        // The gradient reaches the sink through both, equal to the hand-written one's.
        let grad = |out: &Tensor| {
            let g = Tensor::run_backward(&[out.sum(Kind::Double)], &[&sink], false, false);
            g[0].shallow_clone()
        };
        let (g_hand, g_explicit, g_fused) = (grad(&by_hand), grad(&explicit), grad(&fused));
        assert!(g_hand.abs().sum(Kind::Double).double_value(&[]) > 1e-3, "{name}: a gradient to follow");
        assert!(max_abs_diff(&g_explicit, &g_hand) < 1e-10, "{name}: explicit's sink gradient");
        assert!(max_abs_diff(&g_fused, &g_hand) < 1e-10, "{name}: fused's sink gradient");
        if mask.causal && mask.key_padding.is_none() {
            // The kernel's own causal mask cannot stretch over the sink's column: the path writes it out.
            let own_causal = fused_attention(&q, &k, &v, None, true, &path);
            assert!(max_abs_diff(&own_causal, &by_hand) < 1e-10, "the kernel's causal call with a sink");
        }
    }
    // A sink whose logit dwarfs every score takes all the weight: the heads' outputs vanish.
    let path = ScorePath::eval(ScoreMap::scaled(scale)).with_sink(Some(&Tensor::from_slice(&[60.0f64, 60.0, 60.0])));
    assert!(explicit_attention(&q, &k, &v, None, &path).0.abs().max().double_value(&[]) < 1e-12);
}

#[test]
fn module_level_fused_and_explicit_agree_for_self_and_cross_attention() {
    let _serial = common::serial();
    tch::manual_seed(4);
    let (vs_a, fused) = mha(32, 4, Scale::SqrtDk, Implementation::Fused);
    let (mut vs_b, explicit) = mha(32, 4, Scale::SqrtDk, Implementation::Explicit);
    vs_b.copy(&vs_a).unwrap();
    let x = Tensor::randn([2, 6, 32], (Kind::Float, Device::Cpu));
    let memory = Tensor::randn([2, 9, 32], (Kind::Float, Device::Cpu));
    let a = fused.self_attend(&x, &Mask::causal(), None, false, false).output;
    let b = explicit.self_attend(&x, &Mask::causal(), None, false, false).output;
    assert!(max_abs_diff(&a, &b) < 1e-5);
    let a = fused.cross_attend(&x, &memory, &Mask::default(), false, false).output;
    let b = explicit.cross_attend(&x, &memory, &Mask::default(), false, false).output;
    assert!(max_abs_diff(&a, &b) < 1e-5);
    assert_eq!(a.size(), vec![2, 6, 32]);
}

#[test]
fn cross_attention_reads_keys_and_values_from_the_other_sequence() {
    let _serial = common::serial();
    tch::manual_seed(5);
    let (_vs, m) = mha(16, 2, Scale::SqrtDk, Implementation::Explicit);
    let x = Tensor::randn([1, 4, 16], (Kind::Float, Device::Cpu));
    let memory = Tensor::randn([1, 7, 16], (Kind::Float, Device::Cpu));
    let keep = Tensor::from_slice(&[1i64, 1, 1, 1, 1, 0, 0]).to_kind(Kind::Bool).unsqueeze(0);
    let mask = Mask { causal: false, key_padding: Some(&keep), offset: 0, bias: None };
    let out = m.cross_attend(&x, &memory, &mask, false, true);
    assert_eq!(out.weights.as_ref().unwrap().size(), vec![1, 2, 4, 7]);
    // Changing the memory changes the output; changing only padded memory positions does not.
    let other = m.cross_attend(&x, &Tensor::randn([1, 7, 16], (Kind::Float, Device::Cpu)), &mask, false, false);
    assert!(max_abs_diff(&out.output, &other.output) > 1e-3);
    let padded_changed = memory.copy();
    padded_changed.narrow(1, 5, 2).copy_(&Tensor::randn([1, 2, 16], (Kind::Float, Device::Cpu)));
    let same = m.cross_attend(&x, &padded_changed, &mask, false, false);
    assert!(max_abs_diff(&out.output, &same.output) < 1e-6);
}

#[test]
fn scaling_by_sqrt_dq_matches_the_closed_form() {
    let _serial = common::serial();
    // One head, D_q = 4, two keys. Scores kᵀq = [4, 0]; divided by sqrt(4) = 2 they are [2, 0].
    let q = Tensor::from_slice(&[1.0f32, 1.0, 1.0, 1.0]).view([1, 1, 1, 4]);
    let k = Tensor::from_slice(&[1.0f32, 1.0, 1.0, 1.0, 1.0, -1.0, 1.0, -1.0]).view([1, 1, 2, 4]);
    let v = Tensor::from_slice(&[10.0f32, 0.0, 0.0, 0.0, 0.0, 10.0, 0.0, 0.0]).view([1, 1, 2, 4]);
    let expected_w0 = 1.0 / (1.0 + (-2.0f64).exp()); // softmax([2, 0])[0]
    for (scale, w0) in [(0.5, expected_w0), (1.0, 1.0 / (1.0 + (-4.0f64).exp()))] {
        let (out, w) = explicit_attention(&q, &k, &v, None, &ScorePath::eval(ScoreMap::scaled(scale)));
        assert!((w.double_value(&[0, 0, 0, 0]) - w0).abs() < 1e-6);
        assert!((out.double_value(&[0, 0, 0, 0]) - 10.0 * w0).abs() < 1e-5);
        assert!((out.double_value(&[0, 0, 0, 1]) - 10.0 * (1.0 - w0)).abs() < 1e-5);
        let fused = fused_attention(&q, &k, &v, None, false, &ScorePath::eval(ScoreMap::scaled(scale)));
        assert!(max_abs_diff(&out, &fused) < 1e-5);
    }
    // The module's `sqrt_dk` knob is exactly 1/sqrt(head size).
    assert_eq!(Scale::SqrtDk.factor(4), 0.5);
}

#[test]
fn multi_head_attention_equals_per_head_attention_concatenated_then_projected() {
    let _serial = common::serial();
    // UDL's MhSa[X] = Ω_c [Sa_1[X]; …; Sa_H[X]], written out head by head with plain matmuls; heads of
    // D/H dimensions, and heads whose concatenation is wider than D (transformer.head_dim).
    tch::manual_seed(6);
    let (d, heads) = (12, 3);
    for hd in [d / heads, 7] {
        let (vs, m) = mha_with(d, AttentionSpec { head_dim: hd, qk_dim: hd, ..AttentionSpec::standard(d, heads) });
        let vars = vs.variables();
        let x = Tensor::randn([1, 5, d], (Kind::Float, Device::Cpu));
        let (w, b) = (&vars["qkv.weight"], &vars["qkv.bias"]);
        let (wo, bo) = (&vars["out.weight"], &vars["out.bias"]);
        assert_eq!(w.size(), vec![3 * heads * hd, d]);
        assert_eq!(wo.size(), vec![d, heads * hd]);
        let mut outs = Vec::new();
        for h in 0..heads {
            let proj = |part: i64| {
                let rows = part * heads * hd + h * hd;
                x.matmul(&w.narrow(0, rows, hd).tr()) + b.narrow(0, rows, hd)
            };
            let (qh, kh, vh) = (proj(0), proj(1), proj(2));
            let a = (qh.matmul(&kh.transpose(-2, -1)) / (hd as f64).sqrt()).softmax(-1, Kind::Float);
            outs.push(a.matmul(&vh));
        }
        let expected = Tensor::cat(&outs, -1).matmul(&wo.tr()) + bo;
        let got = m.self_attend(&x, &Mask::default(), None, false, false).output;
        assert!(max_abs_diff(&expected, &got) < 1e-5, "head_dim {hd}");
    }
}

#[test]
fn the_2d_bias_adds_one_learned_scalar_per_head_and_grid_offset_and_none_off_the_grid() {
    let _serial = common::serial();
    // A 3×3 grid after one leading token (a <cls>): the bias of tokens i, j on the grid is the table row of
    // their offset (Δrow + 2)·5 + (Δcol + 2); pairs with the leading token get none.
    tch::manual_seed(9);
    let (side, lead, heads, d) = (3, 1, 2, 8);
    let vs = nn::VarStore::new(Device::Cpu);
    let m = MultiHeadAttention::new(
        vs.root(),
        d,
        &AttentionSpec { implementation: Implementation::Explicit, ..AttentionSpec::standard(d, heads) },
        &PositionSpec::of(PositionEncoding::Bias2d),
        Some(Grid { side, lead }),
        0.02,
    );
    let mut table = vs.variables()["relative_position_bias_table"].shallow_clone();
    tch::no_grad(|| table.copy_(&Tensor::randn([25, heads], (Kind::Float, Device::Cpu))));
    // With Q = K = 0 every score is its bias: the weights are softmax(bias) row by row.
    tch::no_grad(|| {
        for (name, mut t) in vs.variables() {
            if name.starts_with("qkv") {
                let _ = t.zero_();
            }
        }
    });
    let n = lead + side * side;
    let x = Tensor::randn([1, n, d], (Kind::Float, Device::Cpu));
    let w = m.self_attend(&x, &Mask::default(), None, false, true).weights.unwrap();
    let mut bias = vec![vec![vec![0.0f64; n as usize]; n as usize]; heads as usize];
    for h in 0..heads {
        for i in lead..n {
            for j in lead..n {
                let (a, b) = (i - lead, j - lead);
                let row = (a / side - b / side + side - 1) * (2 * side - 1) + (a % side - b % side + side - 1);
                bias[h as usize][i as usize][j as usize] = table.double_value(&[row, h]);
            }
        }
    }
    for (h, rows) in bias.iter().enumerate() {
        for (i, row) in rows.iter().enumerate() {
            let z: f64 = row.iter().map(|b| b.exp()).sum();
            for (j, b) in row.iter().enumerate() {
                let got = w.double_value(&[0, h as i64, i as i64, j as i64]);
                assert!((b.exp() / z - got).abs() < 1e-5, "head {h} query {i} key {j}: {got} vs {}", b.exp() / z);
            }
        }
    }
}

#[test]
fn post_ln_and_pre_ln_layers_normalise_where_udl_says() {
    let _serial = common::serial();
    // Post-LN: the layer's output is a LayerNorm output, so every token has mean 0 and variance 1.
    tch::manual_seed(7);
    let layer_for = |pre_ln: bool| {
        let vs = nn::VarStore::new(Device::Cpu);
        let mut spec = TransformerSpec::small(16, 1, 4, 16);
        spec.ffn_hidden = 32;
        spec.activation = Activation::Relu;
        spec.pre_ln = pre_ln;
        spec.position = PositionSpec::of(PositionEncoding::None);
        let l = TransformerLayer::new(
            vs.root(),
            &spec,
            false,
            LayerInit::default(),
            None,
            Placement { index: 0, count: 1 },
        );
        (vs, l)
    };
    let x = Tensor::randn([2, 5, 16], (Kind::Float, Device::Cpu)) * 3.0 + 1.0;
    let (_vs, post) = layer_for(false);
    let y = post.forward(&x, &Mask::default(), None, None, Default::default(), false, false).output;
    let mean = y.mean_dim(-1, false, Kind::Float);
    let var = y.var_dim(-1, false, false);
    assert!(mean.abs().max().double_value(&[]) < 1e-5);
    assert!((var - 1.0).abs().max().double_value(&[]) < 1e-3);
    // Pre-LN keeps the residual stream un-normalised: the input's scale and offset survive.
    let (_vs2, pre) = layer_for(true);
    let y = pre.forward(&x, &Mask::default(), None, None, Default::default(), false, false).output;
    assert!(y.mean(Kind::Float).double_value(&[]) > 0.5);
}

/// Sets gated attention's W_g to zero and b_g to `bias` (one value per gate), so every gate is σ(bias).
fn set_gate(vs: &nn::VarStore, bias: &Tensor) {
    tch::no_grad(|| {
        let mut vars = vs.variables();
        let _ = vars.get_mut("output_gate.weight").unwrap().zero_();
        vars.get_mut("output_gate.bias").unwrap().copy_(bias);
    });
}

#[test]
fn the_output_gate_scales_each_heads_output_by_a_sigmoid_of_the_query_input() {
    let _serial = common::serial();
    // Gated attention (Qiu et al. 2025): out = Ω_c (concat_h(head_h) ⊙ σ(X W_g + b_g)) + β_c. With W_g = 0
    // the gates are σ(b_g): wide open (b_g = 30) the unit is the ungated one with the same weights; shut
    // (−30) the output is the output projection's bias alone; a headwise gate shut on one head is that head
    // removed (the head mask); and with W_g ≠ 0 the gate follows the input, computed here by hand.
    let (d, heads) = (16, 4);
    let x = Tensor::randn([2, 5, d], (Kind::Float, Device::Cpu));
    let mask = Mask::causal();
    tch::manual_seed(3);
    let (plain_vs, plain) = mha_with(d, AttentionSpec::standard(d, heads));
    let reference = plain.self_attend(&x, &mask, None, false, false).output;
    for gate in [OutputGate::Headwise, OutputGate::Elementwise] {
        let spec = AttentionSpec { output_gate: gate, ..AttentionSpec::standard(d, heads) };
        let (vs, gated) = mha_with(d, spec);
        // qkv and out from the ungated unit; the gate keeps its own.
        tch::no_grad(|| {
            let mut mine = vs.variables();
            for (name, t) in plain_vs.variables() {
                mine.get_mut(&name).unwrap().copy_(&t);
            }
        });
        let width = if gate == OutputGate::Headwise { heads } else { d };
        set_gate(&vs, &Tensor::full([width], 30.0, (Kind::Float, Device::Cpu)));
        let open = gated.self_attend(&x, &mask, None, false, false).output;
        assert!(max_abs_diff(&open, &reference) < 1e-6, "{gate:?}: an open gate changes the unit");
        set_gate(&vs, &Tensor::full([width], -30.0, (Kind::Float, Device::Cpu)));
        let shut = gated.self_attend(&x, &mask, None, false, false).output;
        let out_bias = vs.variables()["out.bias"].view([1, 1, d]).expand_as(&shut);
        assert!(max_abs_diff(&shut, &out_bias) < 1e-6, "{gate:?}: a shut gate lets something through");
        if gate == OutputGate::Headwise {
            let one_shut = Tensor::from_slice(&[30.0f32, -30.0, 30.0, 30.0]);
            set_gate(&vs, &one_shut);
            let gated_out = gated.self_attend(&x, &mask, None, false, false).output;
            plain.set_head_mask(Some(Tensor::from_slice(&[1.0f32, 0.0, 1.0, 1.0])));
            let masked = plain.self_attend(&x, &mask, None, false, false).output;
            plain.set_head_mask(None);
            assert!(max_abs_diff(&gated_out, &masked) < 1e-6, "a headwise gate shut on head 1 is not head 1 removed");
        }
        // A gate that reads the input: by hand, from the open unit's merged heads.
        tch::no_grad(|| {
            let mut vars = vs.variables();
            vars.get_mut("output_gate.weight")
                .unwrap()
                .copy_(&(Tensor::randn([width, d], (Kind::Float, Device::Cpu)) * 0.5));
            vars.get_mut("output_gate.bias")
                .unwrap()
                .copy_(&(Tensor::randn([width], (Kind::Float, Device::Cpu)) * 0.5));
        });
        let vars = vs.variables();
        let g = x.linear(&vars["output_gate.weight"], Some(&vars["output_gate.bias"])).sigmoid();
        let g = if gate == OutputGate::Headwise { g.repeat_interleave_self_int(d / heads, -1, None) } else { g };
        // The merged heads of the ungated unit: its output before Ω_c, recovered by solving Ω_c's map.
        let (w_o, b_o) = (&vars["out.weight"], &vars["out.bias"]);
        let merged = (&reference - b_o).matmul(&w_o.pinverse(1e-10).tr());
        let expected = (merged * g).linear(w_o, Some(b_o));
        let got = gated.self_attend(&x, &mask, None, false, false).output;
        assert!(max_abs_diff(&got, &expected) < 1e-4, "{gate:?}: gated output differs from σ(XW_g + b_g) ⊙ heads");
    }
}

#[test]
fn differential_attention_is_the_difference_of_two_softmax_maps_written_out() {
    let _serial = common::serial();
    // Ye et al. 2024, eqs. (1)–(3): each head's queries and keys in halves (Q₁, Q₂), (K₁, K₂) of d = qk_dim/2;
    // A = softmax(Q₁K₁ᵀ/√d) − λ·softmax(Q₂K₂ᵀ/√d), λ = exp(λ_q1·λ_k1) − exp(λ_q2·λ_k2) + λ_init, λ_init =
    // 0.8 − 0.6·exp(−0.3·depth); the head's output RMSNorm(A V)·(1 − λ_init); then the output projection.
    // Written out here from the unit's own weights, causal, at depth 3; the weights it returns are A, whose
    // rows sum to 1 − λ.
    let (d, heads, n, batch) = (16, 2, 6, 2);
    let spec = AttentionSpec {
        differential: Some(3),
        implementation: Implementation::Explicit,
        ..AttentionSpec::standard(d, heads)
    };
    let (vs, unit) = mha_with(d, spec);
    let x = Tensor::randn([batch, n, d], (Kind::Float, Device::Cpu));
    let attended = unit.self_attend(&x, &Mask::causal(), None, false, true);
    let vars = vs.variables();
    let qkv = x.linear(&vars["qkv.weight"], Some(&vars["qkv.bias"]));
    let per_head = |i: i64| qkv.narrow(-1, i * d, d).view([batch, n, heads, d / heads]).transpose(1, 2);
    let (q, k, v) = (per_head(0), per_head(1), per_head(2));
    let half = d / heads / 2;
    let lambda_init = 0.8 - 0.6 * (-0.9f64).exp();
    let l = vars["diff_lambda"].view([4, half]);
    let dot = |a: i64, b: i64| (l.get(a) * l.get(b)).sum(Kind::Float).exp().double_value(&[]);
    let lambda = dot(0, 1) - dot(2, 3) + lambda_init;
    let hidden = Tensor::ones([n, n], (Kind::Bool, Device::Cpu)).triu(1);
    let map = |i: i64| {
        let scores = q.narrow(-1, i * half, half).matmul(&k.narrow(-1, i * half, half).transpose(-2, -1));
        (scores / (half as f64).sqrt()).masked_fill(&hidden, f64::NEG_INFINITY).softmax(-1, Kind::Float)
    };
    let a = map(0) - map(1) * lambda;
    let heads_out = a.matmul(&v);
    let rms = (heads_out.pow_tensor_scalar(2).mean_dim(-1, true, Kind::Float) + 1e-5).sqrt();
    let normed = &heads_out / rms * &vars["diff_norm.weight"] * (1.0 - lambda_init);
    let by_hand = normed.transpose(1, 2).reshape([batch, n, d]).linear(&vars["out.weight"], Some(&vars["out.bias"]));
    assert!(max_abs_diff(&attended.output, &by_hand) < 1e-5, "the unit is not the written-out differential attention");
    let weights = attended.weights.expect("asked for");
    assert!(max_abs_diff(&weights, &a) < 1e-6, "the weights are not A₁ − λ·A₂");
    let rows = weights.sum_dim_intlist(-1, false, Kind::Float);
    assert!(max_abs_diff(&rows, &rows.full_like(1.0 - lambda)) < 1e-5, "a row does not sum to 1 − λ");
    // The two maps differ (λ is not zero and the halves are not equal), so the difference is no softmax.
    assert!(lambda.abs() > 0.05 && max_abs_diff(&map(0), &map(1)) > 1e-3);
}
