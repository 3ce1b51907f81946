//! Muon (`train.optimizer: muon`): its update against PyTorch's own `torch.optim.Muon`, the Newton–Schulz
//! iteration's singular values against the band its coefficients promise, and which parameters it takes.
mod common;
use ablate::train::optim::{is_hidden_matrix, newton_schulz, AdamW, Muon};
use std::io::Write;
use std::process::{Command, Stdio};
use tch::{Device, Kind, Tensor};

const CPU: (Kind, Device) = (Kind::Float, Device::Cpu);

/// Singular values of a matrix, as the square roots of A·Aᵀ's (or Aᵀ·A's) eigenvalues, in float64 (the CPU
/// build's `linalg_svdvals` refuses tch's required driver argument).
fn singular_values(a: &Tensor) -> Tensor {
    let a = a.to_kind(Kind::Double);
    let gram = if a.size()[0] <= a.size()[1] { a.matmul(&a.tr()) } else { a.tr().matmul(&a) };
    Tensor::linalg_eigvalsh(&gram, "L").clamp_min(0.0).sqrt()
}

fn values(t: &Tensor) -> Vec<f32> {
    Vec::<f32>::try_from(t.reshape([-1])).unwrap()
}

/// Runs `script` with PyTorch (the pinned wheel's Python side) on `input`, returning its stdout.
fn python(script: &str, input: &str) -> String {
    let site = std::env::var("ABLATE_TORCH_PYTHONPATH")
        .ok()
        .or_else(|| std::env::var("LIBTORCH").ok().map(|l| format!("{l}/..")))
        .expect("ABLATE_TORCH_PYTHONPATH or LIBTORCH names the torch wheel (bin/test sets both)");
    let mut child = Command::new("python3")
        .args(["-c", script])
        .env("PYTHONPATH", site)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("python3");
    child.stdin.take().unwrap().write_all(input.as_bytes()).unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8(out.stdout).unwrap()
}

const REFERENCE: &str = r#"
import json, sys, torch
data = json.load(sys.stdin)
out = []
for case in data:
    rows, cols = case["shape"]
    p = torch.nn.Parameter(torch.tensor(case["param"]).view(rows, cols))
    opt = torch.optim.Muon([p], lr=case["lr"], weight_decay=case["wd"], momentum=case["momentum"],
                           adjust_lr_fn="match_rms_adamw")
    for g in case["grads"]:
        p.grad = torch.tensor(g).view(rows, cols)
        opt.step()
    out.append(p.detach().reshape(-1).tolist())
print(json.dumps(out))
"#;

#[test]
fn three_muon_steps_equal_torch_optim_muon_on_the_same_tensors() {
    let _serial = common::serial();
    tch::manual_seed(0);
    let (lr, wd, momentum) = (0.02, 0.1, 0.9);
    let mut cases = Vec::new();
    let mut ours = Vec::new();
    for (rows, cols) in [(8i64, 12i64), (12, 8), (10, 10)] {
        let param = Tensor::randn([rows, cols], CPU) * 0.5;
        let grads: Vec<Tensor> = (0..3).map(|_| Tensor::randn([rows, cols], CPU)).collect();
        cases.push(serde_json::json!({
            "shape": [rows, cols], "param": values(&param), "lr": lr, "wd": wd, "momentum": momentum,
            "grads": grads.iter().map(values).collect::<Vec<_>>(),
        }));
        let p = param.copy().set_requires_grad(true);
        let muon = Muon { momentum, ..Muon::default() };
        let mut opt = AdamW::with_muon(vec![p.shallow_clone()], &[true], muon, 0.9, 0.99, wd);
        for g in &grads {
            opt.step_with(vec![g.copy()], lr, None, 1.0);
        }
        ours.push(values(&p.detach()));
    }
    let theirs: Vec<Vec<f32>> =
        serde_json::from_str(&python(REFERENCE, &serde_json::Value::from(cases).to_string())).unwrap();
    for (case, (a, b)) in ours.iter().zip(&theirs).enumerate() {
        let diff = a.iter().zip(b).map(|(x, y)| (x - y).abs()).fold(0.0f32, f32::max);
        assert!(diff < 1e-6, "case {case}: max difference {diff}");
    }
}

/// The range of the quintic p(x) = a·x + b·x³ + c·x⁵ iterated `steps` times over [lo, 1]: where Newton–Schulz
/// sends singular values that start in [lo, 1] (after normalising by the Frobenius norm, all are ≤ 1).
fn band(muon: &Muon, lo: f64) -> (f64, f64) {
    let (a, b, c) = muon.coefficients;
    let (mut min, mut max) = (f64::INFINITY, 0.0f64);
    for i in 0..=20_000 {
        let mut x = lo + (1.0 - lo) * i as f64 / 20_000.0;
        for _ in 0..muon.ns_steps {
            x = a * x + b * x.powi(3) + c * x.powi(5);
        }
        (min, max) = (min.min(x), max.max(x));
    }
    (min, max)
}

#[test]
fn newton_schulz_singular_values_lie_in_the_band_its_coefficients_promise() {
    let _serial = common::serial();
    let muon = Muon::default();
    tch::manual_seed(1);
    for (rows, cols) in [(16i64, 64i64), (64, 16), (32, 32), (48, 40)] {
        let g = Tensor::randn([rows, cols], CPU);
        let s = singular_values(&g);
        // The smallest normalised singular value sets where the band starts.
        let lo = s.min().double_value(&[]) / g.norm().double_value(&[]);
        let (low, high) = band(&muon, lo);
        let out = newton_schulz(&g, &muon);
        assert_eq!(out.size(), g.size());
        let sv = singular_values(&out);
        let (got_min, got_max) = (sv.min().double_value(&[]), sv.max().double_value(&[]));
        // bfloat16 arithmetic (2⁻⁸ relative per operation) moves the smallest singular values most: up to
        // about 7% after five iterations in these cases.
        assert!(
            got_min >= low * 0.9 && got_max <= high * 1.05,
            "{rows}×{cols}: [{got_min}, {got_max}] vs [{low}, {high}]"
        );
        // Keller Jordan's description of these coefficients: singular values end near Uniform(0.5, 1.5).
        assert!(got_min > 0.5 && got_max < 1.5, "{rows}×{cols}: [{got_min}, {got_max}]");
    }
}

#[test]
fn muon_takes_the_hidden_layers_matrices_and_adamw_the_rest() {
    let _serial = common::serial();
    let cfg = ablate::recipe::parse(
        "kind: lm\ntransformer: {d_model: 16, layers: 2, heads: 2, block_size: 8, activation: swiglu, value_residual: true, value_embeddings: 1, attention: {qk_norm: rms_norm}}\ntrain: {optimizer: muon}\n",
        "a.yaml",
        "a",
        false,
    )
    .unwrap()
    .runs[0]
        .config
        .clone();
    let vs = tch::nn::VarStore::new(Device::Cpu);
    let _model = ablate::tasks::task(cfg.kind).build(&cfg, &vs.root(), 30);
    let mut muon: Vec<String> =
        vs.variables().into_iter().filter(|(n, t)| is_hidden_matrix(n, &t.size())).map(|(n, _)| n).collect();
    muon.sort();
    let expected: Vec<String> = (0..2)
        .flat_map(|i| {
            ["attn.out.weight", "attn.qkv.weight", "ffn.down.weight", "ffn.gate.weight", "ffn.up.weight"]
                .map(|p| format!("layers.{i}.{p}"))
        })
        .collect();
    // Value embeddings' tables (2-D, but embeddings) and every learned mixing scalar stay with AdamW.
    assert!(vs.variables().contains_key("value_embeddings.0.weight"));
    assert_eq!(muon, expected);
    // Training with it moves every parameter (both groups update).
    let opt_params = ablate::train::optimiser(&cfg.train, &vs);
    assert_eq!(opt_params.num_params(), vs.trainable_variables().iter().map(|t| t.numel() as i64).sum::<i64>());
}

#[test]
fn muons_momentum_is_saved_and_restored_with_the_optimiser_state() {
    let _serial = common::serial();
    // A checkpoint holds (m, v, step): Muon's momentum lives in m, so a restored optimiser continues exactly.
    tch::manual_seed(2);
    let make = |p: &Tensor, b: &Tensor| {
        AdamW::with_muon(vec![p.shallow_clone(), b.shallow_clone()], &[true, false], Muon::default(), 0.9, 0.99, 0.1)
    };
    let (w, b) = (Tensor::randn([6, 9], CPU), Tensor::randn([9], CPU));
    let grads: Vec<(Tensor, Tensor)> = (0..4).map(|_| (Tensor::randn([6, 9], CPU), Tensor::randn([9], CPU))).collect();
    let (w1, b1) = (w.copy(), b.copy());
    let mut straight = make(&w1, &b1);
    for (gw, gb) in &grads {
        straight.step_with(vec![gw.copy(), gb.copy()], 0.01, None, 1.0);
    }
    let (w2, b2) = (w.copy(), b.copy());
    let mut first = make(&w2, &b2);
    for (gw, gb) in &grads[..2] {
        first.step_with(vec![gw.copy(), gb.copy()], 0.01, None, 1.0);
    }
    let (m, v, step) = first.state();
    assert!(m.narrow(0, 0, 54).abs().sum(Kind::Float).double_value(&[]) > 0.0, "Muon's momentum is in m");
    let (w3, b3) = (w2.copy(), b2.copy());
    let mut resumed = make(&w3, &b3);
    resumed.restore(&m.copy(), &v.copy(), step).unwrap();
    for (gw, gb) in &grads[2..] {
        resumed.step_with(vec![gw.copy(), gb.copy()], 0.01, None, 1.0);
    }
    assert_eq!(values(&w3), values(&w1));
    assert_eq!(values(&b3), values(&b1));
}

/// Weight decay follows each tensor's declared role (`optim::declared_role`), not its shape alone: after one
/// step with zero gradients (Adam's update is 0), every matrix, kernel and the <cls> token (1 × 1 × D) shrink
/// by 1 − lr·λ, and every declared vector (biases, norm gains, mixing weights) stays as it was. A ViT with a
/// convolutional patch embedding and a <cls> token, and a decoder with value residuals and QK-norm.
#[test]
fn weight_decay_follows_the_declared_role() {
    use ablate::train::optim::{declared_role, Declared};
    let _serial = common::serial();
    for text in [
        "kind: vit\ntransformer: {d_model: 16, layers: 1, heads: 2}\nvision: {patch_size: 7, pool: cls}\ntrain: {weight_decay: 0.5}\n",
        "kind: lm\ntransformer: {d_model: 16, layers: 2, heads: 2, block_size: 8, value_residual: true, attention: {qk_norm: layer_norm}}\ntrain: {weight_decay: 0.5}\n",
    ] {
        let cfg = ablate::recipe::parse(text, "d.yaml", "d", false).unwrap().runs[0].config.clone();
        let vs = tch::nn::VarStore::new(Device::Cpu);
        let _model = ablate::tasks::task(cfg.kind).build(&cfg, &vs.root(), 30);
        let before: Vec<(String, Tensor, Option<Declared>)> = vs
            .variables()
            .into_iter()
            .filter(|(_, t)| t.requires_grad())
            .map(|(n, t)| {
                let role = declared_role(&n, &t.size());
                (n, t.copy(), role)
            })
            .collect();
        assert!(before.iter().any(|(_, t, r)| t.dim() == 1 && *r == Some(Declared::Vector)));
        let mut opt = ablate::train::optimiser(&cfg.train, &vs);
        let zeros: Vec<Tensor> = opt.grads().iter().map(|g| g.zeros_like()).collect();
        opt.step_with(zeros, 0.1, None, 1.0);
        let after = vs.variables();
        for (name, was, role) in &before {
            let now = &after[name];
            let factor = if *role == Some(Declared::Vector) { 1.0 } else { 1.0 - 0.1 * 0.5 };
            let expected = was * factor;
            let gap = (now - &expected).abs().max().double_value(&[]);
            assert!(gap < 1e-6, "{name} ({role:?}, {}-D): off by {gap}", was.dim());
            assert!(role.is_some(), "{name} has no declared role");
        }
        if text.contains("kind: vit") {
            assert_eq!(before.iter().find(|(n, ..)| n == "cls_token").and_then(|b| b.2), Some(Declared::Decayed));
        }
    }
}
