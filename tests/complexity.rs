//! The complexity benchmark's arithmetic and a real (tiny) run through child processes.
use ablate::recipe::{Implementation, PatternConfig};
use ablate::run::complexity::{analytic_flops, loglog_slope, ComplexityRecipe, Pass, PointSpec};
use std::path::Path;

#[test]
fn the_fitted_slope_recovers_the_exponent_of_a_power_law() {
    let quadratic: Vec<(f64, f64)> = [128.0, 256.0, 512.0, 1024.0].iter().map(|&n: &f64| (n, 3.0 * n * n)).collect();
    assert!((loglog_slope(&quadratic).unwrap() - 2.0).abs() < 1e-9);
    let linear: Vec<(f64, f64)> = [10.0, 100.0, 1000.0].iter().map(|&n: &f64| (n, 0.5 * n)).collect();
    assert!((loglog_slope(&linear).unwrap() - 1.0).abs() < 1e-9);
    assert!(loglog_slope(&[(1.0, 1.0)]).is_none());
}

fn point(n: i64, implementation: Implementation, window: Option<i64>) -> PointSpec {
    PointSpec {
        n,
        d_model: 64,
        heads: 4,
        batch: 1,
        causal: false,
        pattern: PatternConfig { window, ..Default::default() },
        implementation,
        pass: Pass::Forward,
        repeats: 1,
        warmup: 0,
        model: None,
    }
}

#[test]
fn analytic_flops_grow_quadratically_for_masks_and_linearly_for_the_sparse_kernel() {
    let ratio = |imp, w| analytic_flops(&point(8192, imp, w)) / analytic_flops(&point(4096, imp, w));
    // Attention dominates at these lengths: doubling N nearly quadruples mask-based work...
    assert!(ratio(Implementation::Fused, Some(16)) > 3.5);
    // ...and exactly doubles the sparse kernel's.
    assert!((ratio(Implementation::Sparse, Some(16)) - 2.0).abs() < 1e-9);
    let fb = PointSpec { pass: Pass::ForwardBackward, ..point(1024, Implementation::Fused, None) };
    assert!((analytic_flops(&fb) / analytic_flops(&point(1024, Implementation::Fused, None)) - 3.0).abs() < 1e-9);
}

#[test]
fn a_variant_may_be_causal_in_a_bidirectional_benchmark_and_fused_dense_then_counts_half_the_scores() {
    let recipe: ComplexityRecipe = serde_yaml::from_str(
        "complexity:\n  lengths: [64]\n  d_model: 32\n  heads: 2\n  passes: [forward]\n  variants:\n    - {label: both ways, implementation: fused}\n    - {label: causal, implementation: fused, causal: true}\n    - {label: causal explicit, implementation: explicit, causal: true}\n",
    )
    .unwrap();
    let c = &recipe.complexity;
    c.validate().unwrap();
    let points: Vec<PointSpec> = c.variants.iter().map(|v| c.point(v, Pass::Forward, 4096)).collect();
    assert_eq!(points.iter().map(|p| p.causal).collect::<Vec<_>>(), vec![false, true, true]);
    let projections = |p: &PointSpec| 2.0 * (p.batch * p.n * p.d_model * 4 * p.d_model) as f64;
    let attention = |p: &PointSpec| analytic_flops(p) - projections(p);
    // The fused kernel's causal path computes about half of the scores; the explicit path computes them all.
    let half = attention(&points[1]) / attention(&points[0]);
    assert!((half - 0.5).abs() < 1e-3, "{half}");
    assert_eq!(attention(&points[2]), attention(&points[0]));
    // A vision preset attends both ways: `causal` there is refused, at its variant.
    let vision: ComplexityRecipe = serde_yaml::from_str(
        "complexity:\n  lengths: [32]\n  passes: [forward]\n  variants:\n    - {label: vit, preset: vit_tiny_patch16_224, causal: true}\n",
    )
    .unwrap();
    let (key, message) = vision.complexity.validate().unwrap_err();
    assert_eq!(key, "complexity.variants.0");
    assert!(message.contains("causal"), "{message}");
}

#[test]
fn a_tiny_complexity_run_writes_points_slopes_and_plots() {
    let recipe: ComplexityRecipe = serde_yaml::from_str(
        "complexity:\n  lengths: [32, 64, 128]\n  d_model: 32\n  heads: 2\n  passes: [forward, forward_backward]\n  repeats: 1\n  warmup: 0\n  variants:\n    - {label: dense, implementation: fused}\n    - {label: window, implementation: sparse, pattern: {window: 4}}\n",
    )
    .unwrap();
    recipe.complexity.validate().unwrap();
    let out = std::env::temp_dir().join(format!("ablate-complexity-{}", std::process::id()));
    ablate::run::complexity::run(&recipe, Path::new(env!("CARGO_BIN_EXE_ablate")), &out, "cpu", true).unwrap();
    let points = std::fs::read_to_string(out.join("points.csv")).unwrap();
    assert_eq!(points.lines().count(), 1 + 2 * 2 * 3);
    let mut reader = csv::Reader::from_path(out.join("points.csv")).unwrap();
    for row in reader.records() {
        let row = row.unwrap();
        assert_eq!(&row[12], "ok", "{row:?}");
        let peak: f64 = row[15].parse().unwrap();
        assert!(peak > 10.0, "peak resident memory is real, got {peak} MB");
    }
    for f in ["slopes.csv", "time_forward.png", "memory_forward_backward.png"] {
        assert!(out.join(f).exists(), "{f}");
    }
    let _ = std::fs::remove_dir_all(out);
}

#[test]
fn a_point_past_the_memory_limit_is_recorded_and_a_benchmark_that_measured_nothing_is_an_error() {
    // 0.05 GB is below what libtorch itself needs, so every point is killed: each is recorded and the sweep
    // goes on, but a benchmark whose every point failed ends in an error (bin/gpu-check must not read it as ok).
    let recipe: ComplexityRecipe = serde_yaml::from_str(
        "complexity:\n  lengths: [32, 64]\n  d_model: 32\n  heads: 2\n  passes: [forward]\n  repeats: 1\n  memory_limit_gb: 0.05\n  variants:\n    - {label: dense, implementation: fused}\n",
    )
    .unwrap();
    let out = std::env::temp_dir().join(format!("ablate-complexity-oom-{}", std::process::id()));
    let result = ablate::run::complexity::run(&recipe, Path::new(env!("CARGO_BIN_EXE_ablate")), &out, "cpu", true);
    let err = result.unwrap_err().to_string();
    assert!(err.contains("every point failed (first, dense forward N=32: out of memory)"), "{err}");
    assert_eq!(err.lines().count(), 1, "{err}");
    let points = std::fs::read_to_string(out.join("points.csv")).unwrap();
    assert!(points.contains("out_of_memory"), "{points}");
    assert!(points.contains("skipped after a shorter length failed"), "{points}");
    let _ = std::fs::remove_dir_all(out);
}

fn vision_spec(yaml: &str) -> ablate::run::complexity::ComplexitySpec {
    serde_yaml::from_str::<ComplexityRecipe>(yaml).unwrap().complexity
}

#[test]
fn vision_variants_cost_grows_with_the_fourth_power_of_the_side_for_vit_and_the_square_for_windows() {
    let spec = vision_spec(
        "complexity:\n  lengths: [1120, 2240]\n  passes: [forward]\n  variants:\n    - {label: vit, preset: vit_tiny_patch16_224}\n    - {label: swin, preset: swin_tiny_patch4_window7_224}\n",
    );
    spec.validate().unwrap();
    let growth = |i: usize| {
        let v = &spec.variants[i];
        analytic_flops(&spec.point(v, Pass::Forward, 2240)) / analytic_flops(&spec.point(v, Pass::Forward, 1120))
    };
    // Doubling the side quadruples the tokens: global attention's N² term takes ViT towards 16×...
    assert!(growth(0) > 9.0, "ViT {}", growth(0));
    // ...while windows keep the work per token fixed: Swin stays at 4× (the head is all that does not grow).
    assert!((growth(1) - 4.0).abs() < 0.01, "Swin {}", growth(1));
    // A point measures the preset at that resolution.
    let p = spec.point(&spec.variants[1], Pass::ForwardBackward, 448);
    assert_eq!(p.model.as_ref().unwrap().vision().image_size, 448);
    assert!(
        (analytic_flops(&p) / analytic_flops(&spec.point(&spec.variants[1], Pass::Forward, 448)) - 3.0).abs() < 1e-9
    );
}

#[test]
fn vision_variants_are_checked_at_every_resolution_and_not_mixed_with_attention_units() {
    let e = vision_spec("complexity:\n  lengths: [224, 112]\n  passes: [forward]\n  variants:\n    - {label: swin, preset: swin_tiny_patch4_window7_224}\n")
        .validate()
        .unwrap_err()
        .1;
    assert!(e.contains("`swin` at image side 112") && e.contains("vision.depths"), "{e}");
    let e = vision_spec(
        "complexity:\n  lengths: [224]\n  passes: [forward]\n  variants:\n    - {label: x, preset: nope}\n",
    )
    .validate()
    .unwrap_err()
    .1;
    assert!(e.contains("no preset `nope`") && e.contains("vit_tiny_patch16_224"), "{e}");
    let e = vision_spec("complexity:\n  lengths: [224]\n  passes: [forward]\n  variants:\n    - {label: a, preset: vit_tiny_patch16_224}\n    - {label: b, implementation: fused}\n")
        .validate()
        .unwrap_err()
        .1;
    assert!(e.contains("separate recipes"), "{e}");
}

#[test]
fn a_vision_point_runs_the_model_and_reports_its_time_and_memory() {
    let spec = vision_spec(
        "complexity:\n  lengths: [28, 56]\n  passes: [forward_backward]\n  repeats: 1\n  warmup: 0\n  variants:\n    - {label: vit, preset: vit_fmnist}\n",
    );
    spec.validate().unwrap();
    let r = ablate::run::complexity::measure_point(
        &spec.point(&spec.variants[0], Pass::ForwardBackward, 56),
        tch::Device::Cpu,
    );
    assert!(r.median_ms > 0.0 && r.median_ms.is_finite() && r.min_ms <= r.median_ms, "{r:?}");
    // The working memory is the process peak above the resident memory before the first call (other tests
    // of this binary share the process, so only its sign and bound are certain here).
    assert!(r.working_mb >= 0.0 && r.peak_mb >= r.working_mb && r.peak_mb > 10.0, "{r:?}");
}

#[test]
fn every_kind_builds_its_example_input_on_the_device_it_is_given() {
    // A whole-model complexity point builds the model on the benchmark's device and times
    // `forward_example`: an input made on the CPU fails every point on a GPU (tch has no meta device to
    // show the mismatch here), so the rule is checked in the source.
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("src/tasks");
    let mut seen = 0;
    for entry in std::fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        // A task's helpers in a folder of their own (export's layouts) build no example input.
        if !path.is_file() {
            continue;
        }
        let text = std::fs::read_to_string(&path).unwrap();
        let Some(start) = text.find("fn forward_example(") else { continue };
        let body = &text[start..start + text[start..].find("\n    }\n").unwrap()];
        seen += 1;
        assert!(!body.contains("Device::Cpu"), "{}: forward_example builds on the CPU:\n{body}", path.display());
        assert!(body.contains("device"), "{}: forward_example ignores its device:\n{body}", path.display());
    }
    assert!(seen >= 6, "found forward_example in {seen} task files");
}

#[test]
fn ablate_fit_recovers_a_known_scaling_exponent_from_a_runs_csv_and_draws_it() {
    // Kaplan et al.'s L(N) = (N_c / N)^α_N with α_N = 0.076, five sizes × two seeds with ±0.5% noise, as
    // runs.csv rows of 2 layers; `--minus 1000` removes a fixed embedding count from every size first, and
    // `--where transformer.layers=2` leaves out an 8-layer arm far off the law.
    let dir = std::env::temp_dir().join(format!("ablate-fit-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let mut csv = String::from("run_id,label,seed,status,transformer.layers,params,test_loss\n");
    for (i, n) in [1e4, 3e4, 1e5, 3e5, 1e6].iter().enumerate() {
        for seed in 0..2 {
            let noise = if (i + seed) % 2 == 0 { 1.005 } else { 0.995 };
            let loss = (8.8e13f64 / n).powf(0.076) * noise;
            csv.push_str(&format!("n{i} s{seed},n{i},{seed},ok,2,{},{loss}\n", n + 1000.0));
        }
    }
    csv.push_str("bad,n9,0,diverged at step 3,2,50000,NaN\n");
    csv.push_str("deep s0,deep,0,ok,8,50000,40.0\n");
    std::fs::write(dir.join("runs.csv"), csv).unwrap();
    let fit = |extra: &[&str]| {
        std::process::Command::new(env!("CARGO_BIN_EXE_ablate"))
            .args(["fit", dir.to_str().unwrap(), "--minus", "1000"])
            .args(extra)
            .output()
            .unwrap()
    };
    let everything = String::from_utf8_lossy(&fit(&[]).stdout).to_string();
    assert!(everything.contains("11 runs"), "without --where the 8-layer arm is fitted too: {everything}");
    let wrong = fit(&["--where", "depth=2"]);
    let e = String::from_utf8_lossy(&wrong.stderr);
    assert!(!wrong.status.success() && e.contains("no column `depth`") && e.trim().lines().count() == 1, "{e}");
    let out = fit(&["--where", "transformer.layers=2"]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let number = |after: &str| -> f64 {
        let rest = &text[text.find(after).unwrap_or_else(|| panic!("{after} in {text}")) + after.len()..];
        rest.split(|c: char| !(c.is_ascii_digit() || c == '.')).next().unwrap().parse().unwrap()
    };
    let interval = &text[text.find("interval [").unwrap() + "interval [".len()..text.find(']').unwrap()];
    let (lo, hi) =
        interval.split_once(", ").map(|(a, b)| (a.parse::<f64>().unwrap(), b.parse::<f64>().unwrap())).unwrap();
    let alpha = number("α = ");
    assert!((alpha - 0.076).abs() < 0.003 && lo < 0.076 && 0.076 < hi, "{text}");
    assert!(text.contains("10 runs"), "the diverged run is left out: {text}");
    assert!(dir.join("fit_test_loss_vs_params.png").exists() && dir.join("fit_test_loss_vs_params.csv").exists());
    let _ = std::fs::remove_dir_all(&dir);
}
