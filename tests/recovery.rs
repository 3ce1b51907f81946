//! Checkpoints, recovery, reproducibility and mixed precision: a killed run resumes and finishes exactly as
//! an uninterrupted one; the same recipe and seed give identical metrics; autocast really lowers precision.
mod common;

use ablate::recipe::Precision;
use ablate::train::optim::AdamW;
use common::{runs_without_timings, scratch};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};
use tch::{nn, Device, Kind, Tensor};

/// Training in this process sets libtorch's process-wide math modes at the start of every run: the tests
/// that train here, or read the modes, take turns.
static IN_PROCESS: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn in_process() -> std::sync::MutexGuard<'static, ()> {
    IN_PROCESS.lock().unwrap_or_else(|e| e.into_inner())
}

/// A recipe of two runs on a small text file, long enough to kill mid-way.
fn write_recipe(dir: &Path, steps: i64) -> PathBuf {
    let data = dir.join("corpus.txt");
    std::fs::write(&data, "a stitch in time saves nine; many hands make light work. ".repeat(80)).unwrap();
    let recipe = dir.join("resume.yaml");
    std::fs::write(
        &recipe,
        format!(
            "kind: lm\ntransformer:\n  d_model: 32\n  layers: 2\n  heads: 2\n  block_size: 32\n  dropout: 0.1\ndata:\n  \
             path: {}\ntrain:\n  steps: {steps}\n  batch_size: 8\n  eval_interval: 50\n  eval_batches: 2\n  \
             log_interval: 10\n  checkpoint_every: 20\nsweep:\n  transformer.heads: [1, 2]\n",
            data.display()
        ),
    )
    .unwrap();
    recipe
}

fn ablate(recipe: &Path, out: &Path) -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_ablate"));
    cmd.arg(recipe).arg("--out").arg(out).arg("--device").arg("cpu");
    cmd
}

#[test]
fn a_killed_run_resumes_from_its_checkpoint_and_finishes_as_if_uninterrupted() {
    let dir = scratch("resume");
    let recipe = write_recipe(&dir, 400);
    let reference = dir.join("reference");
    assert!(ablate(&recipe, &reference).arg("--quiet").status().unwrap().success());

    // Kill the second sweep (SIGKILL: no clean-up of any kind) once its first state checkpoint exists.
    let out = dir.join("killed");
    let state = out.join("checkpoints/transformer.heads=1_seed=0.state.safetensors");
    let mut child = ablate(&recipe, &out).arg("--quiet").stderr(Stdio::null()).spawn().unwrap();
    let started = Instant::now();
    while !state.exists() {
        assert!(started.elapsed() < Duration::from_secs(60), "no checkpoint appeared");
        assert!(child.try_wait().unwrap().is_none(), "the run finished before it could be killed");
        std::thread::sleep(Duration::from_millis(1));
    }
    child.kill().unwrap();
    child.wait().unwrap();
    assert!(!out.join("runs.csv").exists(), "killed before any run finished");

    let resumed = ablate(&recipe, &out).output().unwrap();
    assert!(resumed.status.success(), "{}", String::from_utf8_lossy(&resumed.stderr));
    let log = String::from_utf8_lossy(&resumed.stderr);
    assert!(log.contains("resumed from step"), "{log}");
    // Bit-identical metrics and curves: weights, optimiser moments, schedule and randomness all restored.
    assert_eq!(runs_without_timings(&out), runs_without_timings(&reference));
    assert_eq!(
        ablate::judge::reading::curves_of(&out).unwrap(),
        ablate::judge::reading::curves_of(&reference).unwrap()
    );
    // The final state stays (for continuing or inspecting the run); a re-run trains nothing.
    assert!(state.exists());
    let again = ablate(&recipe, &out).output().unwrap();
    assert!(String::from_utf8_lossy(&again.stderr).contains("2 already finished, 0 to train"));
    // --force starts over: it must not continue from the kept states.
    let forced = ablate(&recipe, &out).arg("--force").output().unwrap();
    let log = String::from_utf8_lossy(&forced.stderr);
    assert!(log.contains("0 already finished, 2 to train") && !log.contains("resumed"), "{log}");
    assert_eq!(runs_without_timings(&out), runs_without_timings(&reference));
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn the_same_recipe_and_seed_give_identical_metrics_twice() {
    let dir = scratch("repro");
    let recipe = write_recipe(&dir, 60);
    for out in ["first", "second"] {
        assert!(ablate(&recipe, &dir.join(out)).arg("--quiet").status().unwrap().success());
    }
    let (a, b) = (runs_without_timings(&dir.join("first")), runs_without_timings(&dir.join("second")));
    assert_eq!(a.len(), 2);
    assert_eq!(a, b);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_bert_run_that_trains_its_wordpiece_vocabulary_gives_identical_metrics_in_two_processes() {
    // Each process seeds its hash maps afresh: with the stock WordPiece trainer the two vocabularies, and so
    // every loss, differed. A resumed run trains its vocabulary again, so resuming relies on this too.
    let dir = scratch("repro-wordpiece");
    let recipe = dir.join("wordpiece.yaml");
    std::fs::write(
        &recipe,
        "kind: bert\ntransformer:\n  d_model: 32\n  layers: 1\n  heads: 2\n  block_size: 32\n  dropout: 0.0\n\
         data:\n  max_chars: 200000\n  tokenizer: wordpiece\n  vocab_size: 600\n\
         train:\n  steps: 20\n  batch_size: 8\n  eval_interval: 10\n  eval_batches: 2\nbert:\n  task: pretrain\n",
    )
    .unwrap();
    for out in ["first", "second"] {
        let run = ablate(&recipe, &dir.join(out)).arg("--quiet").output().unwrap();
        assert!(run.status.success(), "{}", String::from_utf8_lossy(&run.stderr));
    }
    let (a, b) = (dir.join("first"), dir.join("second"));
    assert_eq!(runs_without_timings(&a), runs_without_timings(&b));
    assert_eq!(ablate::judge::reading::curves_of(&a).unwrap(), ablate::judge::reading::curves_of(&b).unwrap());
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn autocast_runs_matmuls_in_bfloat16_only_while_the_guard_lives() {
    let a = Tensor::randn([8, 8], (Kind::Float, Device::Cpu));
    {
        let _guard = ablate::train::precision::autocast(Precision::Bf16, Device::Cpu);
        assert_eq!(a.matmul(&a).kind(), Kind::BFloat16);
        // Losses stay in float32 under autocast.
        let logits = a.matmul(&a);
        let target = Tensor::zeros([8], (Kind::Int64, Device::Cpu));
        assert_eq!(logits.cross_entropy_for_logits(&target).kind(), Kind::Float);
    }
    assert_eq!(a.matmul(&a).kind(), Kind::Float);
    assert!(ablate::train::precision::autocast(Precision::Fp32, Device::Cpu).is_none());
}

#[test]
fn bf16_training_follows_fp32_training_closely() {
    let _turn = in_process();
    let corpus = common::corpus_file("bf16", &"the quick brown fox jumps over the lazy dog. ".repeat(40));
    let loss = |precision: &str| {
        let cfg = common::config(&format!(
            "kind: lm\ntransformer: {{d_model: 32, layers: 2, heads: 2, block_size: 32}}\ndata: {{path: {}}}\ntrain: {{steps: 60, batch_size: 8, lr: 3.0e-3, warmup_steps: 5, eval_interval: 60, eval_batches: 2, precision: {precision}}}\n",
            corpus.display()
        ));
        let (run, _) = common::train(&cfg);
        // Master weights stay float32 whatever the arithmetic.
        assert!(run.vs.trainable_variables().iter().all(|p| p.kind() == Kind::Float));
        run.outcome.get("test_loss")
    };
    let (fp32, bf16) = (loss("fp32"), loss("bf16"));
    assert!(fp32 < 2.5, "fp32 learned: {fp32}");
    assert!((fp32 - bf16).abs() < 0.1 * fp32, "fp32 {fp32} vs bf16 {bf16}");
    assert_ne!(fp32, bf16, "bf16 must actually change the arithmetic");
}

#[test]
fn a_scaled_gradient_that_overflows_skips_the_update() {
    let vs = nn::VarStore::new(Device::Cpu);
    let w = vs.root().var("w", &[4], nn::Init::Const(1.0));
    let mut opt = AdamW::new(vs.trainable_variables(), 0.9, 0.99, 0.0);
    // d/dw of sum(w * [inf, 1, 1, 1]) overflows.
    let scale = Tensor::from_slice(&[f32::INFINITY, 1.0, 1.0, 1.0]);
    opt.zero_grad();
    (&w * &scale).sum(Kind::Float).backward();
    let report = opt.step(0.1, None, 1024.0);
    assert!(!report.applied);
    assert_eq!(Vec::<f32>::try_from(&w).unwrap(), vec![1.0; 4]);
    assert_eq!(opt.steps_taken(), 0);
    // A finite scaled gradient is unscaled before the update: the same step as an unscaled one.
    opt.zero_grad();
    (&w * 1024.0).sum(Kind::Float).backward();
    let report = opt.step(0.1, None, 1024.0);
    assert!(report.applied && (report.grad_norm() - 2.0).abs() < 1e-6, "{report:?}");
}

#[test]
fn train_deterministic_sets_libtorchs_modes_and_a_cpu_run_under_it_repeats_the_plain_one_bit_for_bit() {
    let _turn = in_process();
    // On the CPU ablate's runs already repeat bit for bit; the setting turns on libtorch's check (an op
    // without a deterministic implementation would stop the run), which the modes read back show, and the
    // numbers stay those of the plain run. TF32 is a CUDA mode: set off here, read back off.
    let dir = scratch("deterministic");
    let corpus = common::corpus_file("deterministic", &"the cat sat on the mat. ".repeat(60));
    let text = |extra: &str| {
        format!(
            "kind: lm\ntransformer:\n  d_model: 16\n  layers: 1\n  heads: 2\n  block_size: 16\ndata:\n  path: {}\n\
             train:\n  steps: 6\n  batch_size: 4\n  eval_interval: 6\n  eval_batches: 1\n  log_interval: 1\n{extra}",
            corpus.display()
        )
    };
    let plain = common::config(&text(""));
    let strict = common::config(&text("  deterministic: true\n"));
    let (a, _) = common::train(&plain);
    assert_eq!(ablate::train::native::math_modes(), (false, false, false));
    let (b, _) = common::train(&strict);
    assert_eq!(ablate::train::native::math_modes(), (false, false, true));
    // libtorch's legacy TF32 getters (which libtorch_cuda and torch.backends call) agree with the new
    // per-op API ablate sets, both ways: a disagreement makes them throw "mix of the legacy and new APIs".
    assert_eq!(ablate::train::native::legacy_tf32().unwrap(), (false, false));
    ablate::train::native::set_math_modes(true, false).unwrap();
    assert_eq!(ablate::train::native::math_modes(), (true, true, false));
    assert_eq!(ablate::train::native::legacy_tf32().unwrap(), (true, true));
    ablate::train::native::set_math_modes(false, false).unwrap();
    assert_eq!(ablate::train::native::legacy_tf32().unwrap(), (false, false));
    let bits = |t: &ablate::tasks::Trained| {
        let mut v: Vec<u64> = t.outcome.curves.iter().map(|c| c.value.to_bits()).collect();
        v.push(t.outcome.metrics["test_loss"].to_bits());
        v
    };
    assert_eq!(bits(&a), bits(&b), "the deterministic run's curves differ from the plain run's");
    // Recorded when on (it changes which kernels may run), silent at its default (older results keep
    // their hashes).
    assert_ne!(ablate::recipe::config_hash(&plain), ablate::recipe::config_hash(&strict));
    let _ = std::fs::remove_dir_all(dir);
}

/// A one-layer decoder of two steps on a small corpus with `setting` added under `train:`, run by the binary
/// into `<scratch name>/out`: the scratch directory and what the process returned.
fn run_tiny_decoder_with(name: &str, setting: &str) -> (PathBuf, std::process::Output) {
    let dir = scratch(name);
    let corpus = common::corpus_file(name, &"the cat sat on the mat. ".repeat(60));
    let recipe = dir.join(format!("{name}.yaml"));
    std::fs::write(
        &recipe,
        format!(
            "kind: lm\ntransformer:\n  d_model: 16\n  layers: 1\n  heads: 2\n  block_size: 16\ndata:\n  path: {}\n\
             train:\n  steps: 2\n  batch_size: 2\n  {setting}\n",
            corpus.display()
        ),
    )
    .unwrap();
    let out = ablate(&recipe, &dir.join("out")).output().unwrap();
    (dir, out)
}

#[test]
fn train_tf32_is_refused_on_the_cpu_before_any_run_starts() {
    let (dir, out) = run_tiny_decoder_with("tf32", "tf32: true");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{err}");
    assert!(err.contains("sets train.tf32") && err.contains("on the CPU, where it would do nothing"), "{err}");
    assert_eq!(err.trim().lines().count(), 1, "{err}");
    assert!(!dir.join("out/runs.csv").exists());
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn fp16_on_a_cpu_without_vector_half_arithmetic_is_refused_before_any_run_starts() {
    let (dir, out) = run_tiny_decoder_with("fp16", "precision: fp16");
    let err = String::from_utf8_lossy(&out.stderr);
    match ablate::train::precision::cpu_fp16_refusal() {
        Some(lacks) => {
            assert!(!out.status.success(), "{err}");
            assert!(err.contains("sets train.precision fp16, but") && err.contains(&lacks), "{err}");
            assert_eq!(err.trim().lines().count(), 1, "{err}");
            assert!(!dir.join("out/runs.csv").exists());
        }
        // A CPU with vector half arithmetic trains it.
        None => assert!(out.status.success() && dir.join("out/runs.csv").exists(), "{err}"),
    }
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn a_runs_csv_from_before_a_column_was_added_is_widened_when_a_run_is_appended_and_a_foreign_one_is_refused() {
    let _serial = in_process();
    let dir = scratch("widen");
    let recipe = write_recipe(&dir, 20);
    let out = dir.join("out");
    assert!(ablate(&recipe, &out).arg("--quiet").status().unwrap().success());
    let runs = out.join("runs.csv");
    let finished = ablate::judge::reading::all_runs(&out).unwrap();
    // An older ablate's file: no params_non_embedding column, and only the first run finished.
    common::runs_csv_before_column(&runs, "params_non_embedding", 1);

    let resumed = ablate(&recipe, &out).output().unwrap();
    let log = String::from_utf8_lossy(&resumed.stderr);
    assert!(resumed.status.success(), "{log}");
    assert!(log.contains("1 already finished, 1 to train"), "{log}");
    assert!(log.contains("predates the column(s) params_non_embedding"), "{log}");
    let rows = ablate::judge::reading::all_runs(&out).unwrap();
    assert_eq!(rows.len(), 2);
    assert_eq!(rows[0]["params_non_embedding"], "", "the old row gets the new column empty");
    assert_eq!(rows[1]["params_non_embedding"], finished[1]["params_non_embedding"], "the new row fills it");
    for column in ["run_id", "test_loss", "train_loss"] {
        assert_eq!(rows[0][column], finished[0][column], "{column} kept");
    }

    // A column the recipe does not write is a different recipe: refused, the file untouched.
    let renamed = std::fs::read_to_string(&runs).unwrap().replacen("test_loss", "test_losses", 1);
    let keep_one: String = renamed.lines().take(2).map(|l| l.to_string() + "\n").collect();
    std::fs::write(&runs, &keep_one).unwrap();
    let refused = ablate(&recipe, &out).output().unwrap();
    assert!(!refused.status.success());
    assert!(String::from_utf8_lossy(&refused.stderr).contains("written by a different version of this recipe"));
    assert_eq!(std::fs::read_to_string(&runs).unwrap(), keep_one);
    let _ = std::fs::remove_dir_all(&dir);
}
