//! Head importance and pruning (Michel et al. 2019): removing a head is multiplying its output by 0 before
//! the heads are mixed, which is the same as zeroing its columns of the output projection; a head that
//! contributes nothing has importance 0; the pruning curve starts at the full model and ends with every head
//! removed; the model is whole again afterwards.
mod common;
use ablate::models::gpt::Gpt;
use ablate::run::heads::head_importance;
use ablate::transformer::attention::{Mask, MultiHeadAttention};
use ablate::transformer::spec::{AttentionSpec, TransformerSpec};
use tch::{nn, Device, Kind, Tensor};

fn max_abs_diff(a: &Tensor, b: &Tensor) -> f64 {
    (a - b).abs().max().double_value(&[])
}

/// Zeroes columns `h·d_v .. (h+1)·d_v` of every attention output projection named `…{layer}…attn.out.weight`.
fn zero_head(vs: &nn::VarStore, layer: usize, head: i64, head_dim: i64) {
    tch::no_grad(|| {
        let name = format!("layers.{layer}.attn.out.weight");
        let w = vs.variables()[&name].shallow_clone();
        let _ = w.narrow(1, head * head_dim, head_dim).zero_();
    });
}

#[test]
fn removing_a_head_equals_zeroing_its_columns_of_the_output_projection() {
    let _serial = common::serial();
    tch::manual_seed(0);
    let spec = AttentionSpec { kv_heads: 2, ..AttentionSpec::standard(16, 4) };
    let vs = nn::VarStore::new(Device::Cpu);
    let m = MultiHeadAttention::plain(vs.root(), 16, &spec, 0.3);
    let x = Tensor::randn([2, 5, 16], (Kind::Float, Device::Cpu));
    let full = m.self_attend(&x, &Mask::causal(), None, false, false).output;
    m.set_head_mask(Some(Tensor::from_slice(&[1.0f32, 0.0, 1.0, 1.0])));
    let masked = m.self_attend(&x, &Mask::causal(), None, false, false).output;
    m.set_head_mask(None);
    assert!(max_abs_diff(&full, &m.self_attend(&x, &Mask::causal(), None, false, false).output) < 1e-7);
    tch::no_grad(|| {
        let w = vs.variables()["out.weight"].shallow_clone();
        let _ = w.narrow(1, 4, 4).zero_();
    });
    let zeroed = m.self_attend(&x, &Mask::causal(), None, false, false).output;
    assert!(max_abs_diff(&masked, &zeroed) < 1e-6);
    assert!(max_abs_diff(&masked, &full) > 1e-4);
}

#[test]
fn a_silent_head_has_importance_zero_and_the_pruning_curve_runs_from_the_whole_model_to_no_heads() {
    let _serial = common::serial();
    tch::manual_seed(1);
    let mut spec = TransformerSpec::small(16, 2, 4, 8);
    spec.pre_ln = true;
    let vs = nn::VarStore::new(Device::Cpu);
    let gpt = Gpt::new(&vs.root(), &spec, 11);
    tch::no_grad(|| {
        for mut p in vs.trainable_variables() {
            p.copy_(&(Tensor::randn(p.size(), (Kind::Float, Device::Cpu)) * 0.3));
        }
    });
    zero_head(&vs, 1, 2, 4);
    let idx = Tensor::randint(11, [3, 9], (Kind::Int64, Device::Cpu));
    let batches = vec![(idx.narrow(1, 0, 8), idx.narrow(1, 1, 8))];
    let before = tch::no_grad(|| gpt.forward(&batches[0].0, false));
    let r = tch::no_grad(|| head_importance(&gpt, &batches)).unwrap();
    let after = tch::no_grad(|| gpt.forward(&batches[0].0, false));
    assert!(max_abs_diff(&after, &before) < 1e-7, "every head is back afterwards");
    assert_eq!(r.delta.len(), 2);
    assert_eq!(r.delta[1].len(), 4);
    assert!(r.delta[1][2].abs() < 1e-6, "a head whose output is never read matters not: {}", r.delta[1][2]);
    assert!(r.delta.iter().flatten().any(|d| d.abs() > 1e-3), "the other heads matter");
    assert_eq!(r.pruning.len(), 9);
    assert_eq!(r.pruning[0], (0, r.base_loss));
    // Removal order is by importance, and the first removal costs what that head's importance says.
    let first = r.order[0];
    assert!(r.order.windows(2).all(|w| r.delta[w[0].0][w[0].1] <= r.delta[w[1].0][w[1].1]));
    assert!((r.pruning[1].1 - (r.base_loss + r.delta[first.0][first.1])).abs() < 1e-6);
    // With every head removed, the loss is that of the model whose attention outputs only their bias.
    for layer in 0..2 {
        for head in 0..4 {
            zero_head(&vs, layer, head, 4);
        }
    }
    let (no_heads, _) = ablate::tasks::lm::evaluate(&gpt, &batches).unwrap();
    assert!((r.pruning[8].1 - no_heads).abs() < 1e-5);
}
