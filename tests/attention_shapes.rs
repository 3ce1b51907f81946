//! The shapes of an attention unit (`transformer.attention.kv_heads`, `qk_dim`, `scoring`): multi-query
//! and grouped-query attention, queries and keys narrower or wider than the values, and Bahdanau's additive
//! scores, each written out head by head with plain matmuls and compared with the attention core.
mod common;
use ablate::models::gpt::Gpt;
use ablate::transformer::attention::{Mask, MultiHeadAttention};
use ablate::transformer::layers::StackCache;
use ablate::transformer::spec::{AttentionSpec, Implementation, Pattern, Scoring, TransformerSpec};
use tch::{nn, Device, Kind, Tensor};

fn max_abs_diff(a: &Tensor, b: &Tensor) -> f64 {
    (a - b).abs().max().double_value(&[])
}

fn unit(d: i64, spec: &AttentionSpec) -> (nn::VarStore, MultiHeadAttention) {
    let vs = nn::VarStore::new(Device::Cpu);
    let m = MultiHeadAttention::plain(vs.root(), d, spec, 0.02);
    tch::no_grad(|| {
        for mut p in vs.trainable_variables() {
            p.copy_(&(Tensor::randn(p.size(), (Kind::Float, Device::Cpu)) * 0.3));
        }
    });
    (vs, m)
}

/// UDL's MhSa written out: query head h uses key/value head h / (H / H_kv); the stacked projection's rows
/// are H·qk_dim queries, H_kv·qk_dim keys, H_kv·head_dim values.
fn written_out(vs: &nn::VarStore, spec: &AttentionSpec, x: &Tensor, causal: bool) -> Tensor {
    let vars = vs.variables();
    let (w, b) = (&vars["qkv.weight"], &vars["qkv.bias"]);
    let (wo, bo) = (&vars["out.weight"], &vars["out.bias"]);
    let (h_q, h_kv, dq, dv) = (spec.heads, spec.kv_heads, spec.qk_dim, spec.head_dim);
    assert_eq!(w.size()[0], h_q * dq + h_kv * dq + h_kv * dv);
    let rows = |start: i64, n: i64| x.matmul(&w.narrow(0, start, n).tr()) + b.narrow(0, start, n);
    let n = x.size()[1];
    let mut outs = Vec::new();
    for h in 0..h_q {
        let g = h / (h_q / h_kv);
        let q = rows(h * dq, dq);
        let k = rows(h_q * dq + g * dq, dq);
        let v = rows(h_q * dq + h_kv * dq + g * dv, dv);
        let mut scores = match spec.scoring {
            Scoring::Dot => q.matmul(&k.transpose(-2, -1)),
            Scoring::Additive => {
                let a = vars["score_vector"].get(h);
                (q.unsqueeze(2) + k.unsqueeze(1)).tanh().matmul(&a)
            }
        } / (dq as f64).sqrt();
        if causal {
            let future = Tensor::ones([n, n], (Kind::Bool, Device::Cpu)).triu(1);
            scores = scores.masked_fill(&future, f64::NEG_INFINITY);
        }
        outs.push(scores.softmax(-1, Kind::Float).matmul(&v));
    }
    Tensor::cat(&outs, -1).matmul(&wo.tr()) + bo
}

#[test]
fn grouped_query_and_unequal_widths_match_attention_written_out_head_by_head() {
    let _serial = common::serial();
    tch::manual_seed(1);
    let d = 16;
    for (heads, kv_heads, qk_dim, head_dim) in [(4, 4, 4, 4), (4, 1, 4, 4), (4, 2, 4, 4), (4, 2, 3, 5), (2, 2, 8, 2)] {
        for implementation in [Implementation::Fused, Implementation::Explicit] {
            for causal in [false, true] {
                let spec =
                    AttentionSpec { kv_heads, qk_dim, head_dim, implementation, ..AttentionSpec::standard(d, heads) };
                let (vs, m) = unit(d, &spec);
                let x = Tensor::randn([2, 6, d], (Kind::Float, Device::Cpu));
                let mask = Mask { causal, ..Mask::default() };
                let got = m.self_attend(&x, &mask, None, false, false).output;
                let expected = written_out(&vs, &spec, &x, causal);
                let what =
                    format!("H {heads} H_kv {kv_heads} qk {qk_dim} v {head_dim} {implementation:?} causal {causal}");
                assert!(max_abs_diff(&got, &expected) < 1e-5, "{what}");
            }
        }
    }
}

#[test]
fn additive_scores_match_bahdanau_written_out_and_differ_from_dot_products() {
    let _serial = common::serial();
    tch::manual_seed(2);
    let d = 12;
    for (kv_heads, qk_dim) in [(3, 4), (1, 6)] {
        let spec = AttentionSpec { kv_heads, qk_dim, scoring: Scoring::Additive, ..AttentionSpec::standard(d, 3) };
        let (vs, m) = unit(d, &spec);
        assert_eq!(vs.variables()["score_vector"].size(), vec![3, qk_dim]);
        let x = Tensor::randn([2, 5, d], (Kind::Float, Device::Cpu));
        for causal in [false, true] {
            let a = m.self_attend(&x, &Mask { causal, ..Mask::default() }, None, false, true);
            assert!(max_abs_diff(&a.output, &written_out(&vs, &spec, &x, causal)) < 1e-5);
            let rows = a.weights.unwrap().sum_dim_intlist(-1, false, Kind::Float);
            assert!(max_abs_diff(&rows, &rows.ones_like()) < 1e-5);
        }
        let dot = AttentionSpec { scoring: Scoring::Dot, ..spec.clone() };
        assert!(max_abs_diff(&written_out(&vs, &spec, &x, false), &written_out(&vs, &dot, &x, false)) > 1e-3);
    }
}

#[test]
fn the_sparse_kernel_agrees_with_the_mask_for_grouped_queries_and_unequal_widths() {
    let _serial = common::serial();
    tch::manual_seed(3);
    let d = 16;
    let pattern = Pattern { window: Some(3), dilation: 2, global_every: Some(7), ..Pattern::dense() };
    for causal in [false, true] {
        let shape = AttentionSpec {
            kv_heads: 2,
            qk_dim: 6,
            head_dim: 3,
            pattern: pattern.clone(),
            ..AttentionSpec::standard(d, 4)
        };
        let explicit = AttentionSpec { implementation: Implementation::Explicit, ..shape.clone() };
        let sparse = AttentionSpec { implementation: Implementation::Sparse, ..shape };
        tch::manual_seed(4);
        let vs = nn::VarStore::new(Device::Cpu);
        let pos = ablate::transformer::spec::PositionSpec::of(ablate::transformer::spec::PositionEncoding::Alibi);
        let a = MultiHeadAttention::new(vs.root() / "a", d, &explicit, &pos, None, 0.3);
        let b = MultiHeadAttention::new(vs.root() / "b", d, &sparse, &pos, None, 0.3);
        tch::no_grad(|| {
            let vars = vs.variables();
            for (name, mut t) in
                vars.iter().filter(|(n, _)| n.starts_with("b.")).map(|(n, t)| (n.clone(), t.shallow_clone()))
            {
                t.copy_(&vars[&name.replacen("b.", "a.", 1)]);
            }
        });
        let x = Tensor::randn([2, 23, d], (Kind::Float, Device::Cpu));
        let mask = Mask { causal, ..Mask::default() };
        let (ya, yb) =
            (a.self_attend(&x, &mask, None, false, false).output, b.self_attend(&x, &mask, None, false, false).output);
        assert!(max_abs_diff(&ya, &yb) < 1e-5, "causal {causal}");
    }
}

#[test]
fn the_kv_cache_of_a_grouped_query_model_holds_one_entry_per_key_value_head_and_decodes_exactly() {
    let _serial = common::serial();
    for (kv_heads, qk_dim, scoring) in [(1, 8, Scoring::Dot), (2, 4, Scoring::Dot), (2, 8, Scoring::Additive)] {
        tch::manual_seed(5);
        let mut spec = TransformerSpec::small(32, 2, 4, 12);
        spec.pre_ln = true;
        spec.attention.kv_heads = kv_heads;
        spec.attention.qk_dim = qk_dim;
        spec.attention.scoring = scoring;
        let vs = nn::VarStore::new(Device::Cpu);
        let gpt = Gpt::new(&vs.root(), &spec, 17);
        let idx = Tensor::randint(17, [2, 10], (Kind::Int64, Device::Cpu));
        let full = tch::no_grad(|| gpt.forward(&idx, false));
        let mut cache = StackCache::default();
        let steps: Vec<Tensor> =
            tch::no_grad(|| (0..10).map(|i| gpt.forward_cached(&idx.narrow(1, i, 1), &mut cache)).collect());
        let cached = Tensor::cat(&steps, 1);
        assert!(max_abs_diff(&full, &cached) < 1e-4, "H_kv {kv_heads} qk {qk_dim} {scoring:?}");
        assert_eq!(cache.len(), 10);
        // Per layer: batch 2 × 10 positions × H_kv heads × (qk_dim keys + 8 values).
        assert_eq!(cache.elements(), 2 * (2 * 10 * kv_heads * (qk_dim + 8)));
    }
}

/// The outlier probe's largest attention logit: with recording on, each self-attention call records
/// max |q·k| / √qk_dim over the pairs its mask lets a query see (Wortsman et al. 2023's statistic), the same
/// as the scores written out head by head (grouped keys, a causal mask hiding larger future scores), and
/// nothing when recording is off.
#[test]
fn the_largest_attention_logit_is_the_written_out_one() {
    use ablate::transformer::attention::{record_attention_logits, take_attention_logits};
    let _serial = common::serial();
    tch::manual_seed(2);
    let (d, heads, kv_heads, dq) = (12, 4, 2, 5);
    let spec = AttentionSpec { kv_heads, qk_dim: dq, ..AttentionSpec::standard(d, heads) };
    let (vs, m) = unit(d, &spec);
    let x = Tensor::randn([2, 6, d], (Kind::Float, Device::Cpu));
    let vars = vs.variables();
    let (w, b) = (&vars["qkv.weight"], &vars["qkv.bias"]);
    let rows = |start: i64, n: i64| x.matmul(&w.narrow(0, start, n).tr()) + b.narrow(0, start, n);
    let mut seen = Vec::new();
    for causal in [false, true] {
        let mut expected = 0.0f64;
        for h in 0..heads {
            let g = h / (heads / kv_heads);
            let scores =
                (rows(h * dq, dq).matmul(&rows(heads * dq + g * dq, dq).transpose(-2, -1)) / (dq as f64).sqrt()).abs();
            let scores = if causal { scores.tril(0) } else { scores };
            expected = expected.max(scores.max().double_value(&[]));
        }
        let _ = m.self_attend(&x, &Mask { causal, ..Mask::default() }, None, false, false);
        assert!(take_attention_logits().is_empty(), "nothing is recorded unless asked");
        record_attention_logits(true);
        let _ = m.self_attend(&x, &Mask { causal, ..Mask::default() }, None, false, false);
        let got = take_attention_logits();
        record_attention_logits(false);
        assert_eq!(got.len(), 1);
        assert!((got[0] - expected).abs() < 1e-4 * expected.max(1.0), "causal {causal}: {} vs {expected}", got[0]);
        seen.push(expected);
    }
    assert!(seen[0] > seen[1], "the mask must hide the largest score for the causal case to test it: {seen:?}");
}
