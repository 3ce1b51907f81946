//! The normalisations and residual connections of `transformer.norm` / `transformer.residual` (UDL §12.4),
//! against their closed forms and their defining properties.
mod common;
use ablate::models::gpt::Gpt;
use ablate::transformer::layers::{NormLayer, Residual};
use ablate::transformer::spec::{Norm, TransformerSpec};
use tch::nn::OptimizerConfig;
use tch::{nn, Device, Kind, Tensor};

fn max_abs_diff(a: &Tensor, b: &Tensor) -> f64 {
    (a - b).abs().max().double_value(&[])
}

/// A norm of `kind` over 8 features with a random gain (and bias) so that the affine part counts.
fn norm(kind: Norm) -> (nn::VarStore, NormLayer) {
    tch::manual_seed(3);
    let vs = nn::VarStore::new(Device::Cpu);
    let n = NormLayer::new(vs.root() / "n", 8, kind, 1e-5).expect("a norm");
    tch::no_grad(|| {
        for mut p in vs.trainable_variables() {
            p.copy_(&(Tensor::randn(p.size(), (Kind::Float, Device::Cpu)) * 0.5 + 1.0));
        }
    });
    (vs, n)
}

fn var(vs: &nn::VarStore, name: &str) -> Tensor {
    vs.variables()[name].shallow_clone()
}

#[test]
fn layer_norm_and_rms_norm_match_their_closed_forms_per_token() {
    let _serial = common::serial();
    let x = Tensor::randn([2, 5, 8], (Kind::Float, Device::Cpu)) * 3.0 + 1.5;
    let (vs, layer) = norm(Norm::LayerNorm);
    let mean = x.mean_dim(-1, true, Kind::Float);
    let var_ = (&x - &mean).square().mean_dim(-1, true, Kind::Float);
    let expected = (&x - &mean) / (var_ + 1e-5).sqrt() * var(&vs, "n.weight") + var(&vs, "n.bias");
    assert!(max_abs_diff(&layer.forward(&x, true), &expected) < 1e-4);

    let (vs, rms) = norm(Norm::RmsNorm);
    assert_eq!(vs.variables().len(), 1, "RMSNorm has a gain and no bias");
    let expected = &x / (x.square().mean_dim(-1, true, Kind::Float) + 1e-5).sqrt() * var(&vs, "n.weight");
    let got = rms.forward(&x, true);
    assert!(max_abs_diff(&got, &expected) < 1e-4);
    // No centring: a token's mean survives, unlike LayerNorm's.
    let token_means = (&got / var(&vs, "n.weight")).mean_dim(-1, false, Kind::Float);
    assert!(token_means.abs().max().double_value(&[]) > 0.1);
}

#[test]
fn batch_norm_normalises_each_feature_over_the_batch_while_training_and_uses_running_statistics_after() {
    let _serial = common::serial();
    let (vs, batch) = norm(Norm::BatchNorm);
    tch::no_grad(|| {
        // Gain 1 and bias 0 so the output is the normalised input itself.
        let _ = var(&vs, "n.weight").fill_(1.0);
        let _ = var(&vs, "n.bias").fill_(0.0);
    });
    let x = Tensor::randn([4, 6, 8], (Kind::Float, Device::Cpu)) * 2.0 + 3.0;
    let y = batch.forward(&x, true);
    assert_eq!(y.size(), x.size());
    let flat = y.reshape([-1, 8]);
    assert!(flat.mean_dim(0, false, Kind::Float).abs().max().double_value(&[]) < 1e-5);
    let biased_var = flat.square().mean_dim(0, false, Kind::Float);
    assert!(max_abs_diff(&biased_var, &biased_var.ones_like()) < 1e-3);
    // While training a token's output depends on the other rows of the batch; at evaluation it does not.
    let other = x.copy();
    let _ = other.narrow(0, 1, 3).fill_(10.0);
    let changed = batch.forward(&other, true);
    assert!(max_abs_diff(&changed.narrow(0, 0, 1), &batch.forward(&x, true).narrow(0, 0, 1)) > 0.1);
    let eval_a = batch.forward(&x, false);
    let eval_b = batch.forward(&other, false);
    assert!(max_abs_diff(&eval_a.narrow(0, 0, 1), &eval_b.narrow(0, 0, 1)) < 1e-6);
    // The running mean moved from 0 towards the batches' means by PyTorch's momentum (0.1) each call.
    let running = var(&vs, "n.running_mean");
    assert!(running.mean(Kind::Float).double_value(&[]) > 0.5, "running mean {running:?}");
}

#[test]
fn norm_none_builds_nothing() {
    let _serial = common::serial();
    let vs = nn::VarStore::new(Device::Cpu);
    assert!(NormLayer::new(vs.root(), 8, Norm::None, 1e-5).is_none());
    assert!(vs.variables().is_empty());
}

/// One branch `f(h) = 2h + 1` under `spec`'s norm placement and residual setting.
fn branch(spec: &TransformerSpec, x: &Tensor) -> (Tensor, Tensor) {
    let vs = nn::VarStore::new(Device::Cpu);
    let r = Residual::new(vs.root() / "r", 8, spec, 1e-5);
    let layer = NormLayer::new(vs.root() / "check", 8, spec.norm, 1e-5);
    let normed = |y: &Tensor| layer.as_ref().map_or(y.shallow_clone(), |n| n.forward(y, false));
    let f = |h: &Tensor| h * 2.0 + 1.0;
    let out = r.forward(x, false, f);
    let expected = match (spec.pre_ln, spec.residual) {
        (true, true) => x + f(&normed(x)),
        (true, false) => f(&normed(x)),
        (false, true) => normed(&(x + f(x))),
        (false, false) => normed(&f(x)),
    };
    (out, expected)
}

#[test]
fn residual_branches_follow_pre_and_post_ln_with_and_without_the_skip_connection() {
    let _serial = common::serial();
    let x = Tensor::randn([2, 3, 8], (Kind::Float, Device::Cpu));
    for norm in [Norm::LayerNorm, Norm::RmsNorm, Norm::None] {
        for pre_ln in [false, true] {
            for residual in [false, true] {
                let mut spec = TransformerSpec::small(8, 1, 2, 4);
                spec.norm = norm;
                spec.pre_ln = pre_ln;
                spec.residual = residual;
                let (out, expected) = branch(&spec, &x);
                assert!(max_abs_diff(&out, &expected) < 1e-5, "{norm:?} pre_ln={pre_ln} residual={residual}");
            }
        }
    }
    // Without a norm, pre- and post-LN are the same x + f(x).
    let mut spec = TransformerSpec::small(8, 1, 2, 4);
    spec.norm = Norm::None;
    let (post, _) = branch(&spec, &x);
    spec.pre_ln = true;
    let (pre, _) = branch(&spec, &x);
    assert!(max_abs_diff(&post, &pre) < 1e-6);
    assert!(max_abs_diff(&post, &(&x * 3.0 + 1.0)) < 1e-6);
}

#[test]
fn every_norm_trains_a_gpt_and_the_final_norm_follows_the_kind() {
    let _serial = common::serial();
    for norm in [Norm::LayerNorm, Norm::RmsNorm, Norm::BatchNorm, Norm::None] {
        tch::manual_seed(0);
        let mut spec = TransformerSpec::small(16, 2, 2, 8);
        spec.norm = norm;
        spec.pre_ln = true;
        let vs = nn::VarStore::new(Device::Cpu);
        let gpt = Gpt::new(&vs.root(), &spec, 11);
        let names: Vec<String> = vs.variables().into_keys().collect();
        let final_norm = names.iter().filter(|n| n.starts_with("final_norm")).count();
        let expected = match norm {
            Norm::LayerNorm => 2,
            Norm::RmsNorm => 1,
            Norm::BatchNorm => 4,
            Norm::None => 0,
        };
        assert_eq!(final_norm, expected, "{norm:?}: {names:?}");
        let idx = Tensor::randint(11, [4, 8], (Kind::Int64, Device::Cpu));
        let mut opt = nn::Adam::default().build(&vs, 1e-2).expect("adam");
        let loss = |train: bool| {
            let logits = gpt.forward(&idx.narrow(1, 0, 7), train);
            logits.view([-1, 11]).cross_entropy_for_logits(&idx.narrow(1, 1, 7).reshape([-1]))
        };
        let before = tch::no_grad(|| loss(false)).double_value(&[]);
        for _ in 0..30 {
            let l = loss(true);
            opt.backward_step(&l);
        }
        let after = tch::no_grad(|| loss(false)).double_value(&[]);
        assert!(after < before - 0.3, "{norm:?}: {before} -> {after}");
    }
}

#[test]
fn scaled_embeddings_are_the_token_embeddings_times_sqrt_d_before_the_positions() {
    let _serial = common::serial();
    // Scaling on, against a copy without it whose token table is multiplied by √d: the two agree only if the
    // scale multiplies the tokens and not the positions added after.
    let d = 16;
    let mut spec = TransformerSpec::small(d, 2, 2, 8);
    let build = |spec: &TransformerSpec| {
        tch::manual_seed(4);
        let vs = nn::VarStore::new(Device::Cpu);
        let gpt = Gpt::new(&vs.root(), spec, 11);
        (vs, gpt)
    };
    let (_vs_plain, plain) = build(&spec);
    spec.scale_embeddings = true;
    let (vs_scaled, scaled) = build(&spec);
    let (vs_copy, copy) = build(&TransformerSpec { scale_embeddings: false, ..spec.clone() });
    tch::no_grad(|| {
        let mut table = vs_copy.variables()["token_embedding.weight"].shallow_clone();
        table.copy_(&(vs_scaled.variables()["token_embedding.weight"].shallow_clone() * (d as f64).sqrt()));
    });
    let idx = Tensor::randint(11, [2, 8], (Kind::Int64, Device::Cpu));
    let (a, b, c) =
        tch::no_grad(|| (scaled.forward(&idx, false), copy.forward(&idx, false), plain.forward(&idx, false)));
    assert!(max_abs_diff(&a, &b) < 1e-4);
    assert!(max_abs_diff(&a, &c) > 1e-3, "the scale acts");
    // The cached decoder scales the same way.
    let mut cache = ablate::transformer::layers::StackCache::default();
    let steps: Vec<Tensor> =
        tch::no_grad(|| (0..8).map(|i| scaled.forward_cached(&idx.narrow(1, i, 1), &mut cache)).collect());
    assert!(max_abs_diff(&a, &Tensor::cat(&steps, 1)) < 1e-4);
}

/// `ablate init-grads` (Xiong et al. 2020's Figure 3 statistic): per layer of each run's decoder, finite
/// positive gradient norms at initialisation, the FFN weights' never above their whole layer's, and the
/// same numbers from the same seed (the model and the batches are drawn as training draws them).
#[test]
fn gradient_norms_at_initialisation_come_per_layer_and_repeat_for_a_seed() {
    let corpus = common::corpus_file("init-grads", &"the quick brown fox jumps over the lazy dog. ".repeat(80));
    let text = format!(
        "kind: lm\ntransformer: {{d_model: 16, layers: 3, heads: 2, block_size: 16, pre_ln: false}}\n\
         data: {{path: {}}}\ntrain: {{steps: 2, batch_size: 4}}\n",
        corpus.display()
    );
    let recipe = ablate::recipe::parse(&text, "g.yaml", "g", false).unwrap();
    let cfg = &recipe.runs[0].config;
    let grads = ablate::run::init_grads::init_gradients(cfg, 2).unwrap();
    assert_eq!(grads.iter().map(|g| g.layer).collect::<Vec<_>>(), [0, 1, 2]);
    for g in &grads {
        assert!(g.layer_norm.is_finite() && g.ffn_norm > 0.0 && g.ffn_norm <= g.layer_norm, "{g:?}");
    }
    assert_eq!(ablate::run::init_grads::init_gradients(cfg, 2).unwrap(), grads, "the same seed, the same norms");
    let mut other = cfg.clone();
    other.train.seed += 1;
    assert_ne!(ablate::run::init_grads::init_gradients(&other, 2).unwrap(), grads, "another seed, another draw");
    let mut kind = cfg.clone();
    kind.kind = ablate::recipe::Kind::Bert;
    let err = ablate::run::init_grads::init_gradients(&kind, 2).unwrap_err().to_string();
    assert!(err.contains("kind lm"), "{err}");
    let _ = std::fs::remove_file(corpus);
}
