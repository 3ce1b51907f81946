//! Per-arm tuning (`tune:`): successive halving on the validation split picks each arm's value, the final
//! seeds train with it, `runs.csv` tells the phases apart, reports read final runs only, and a sweep cut
//! short in either phase resumes to the same results. Shards tune whole arms.
mod common;

use ablate::judge::summary::Pairing;
use ablate::recipe::parse;
use ablate::run::scale::{merge, Shard};
use ablate::run::sweep::{run_recipe, SweepOptions};
use common::{all_runs_without_timings, scratch};
use std::path::Path;
use std::sync::Mutex;
use tch::Device;

/// Tests that compare two trainings bit for bit run one at a time: libtorch's kernels are deterministic
/// for one thread count, and tests training side by side in one process contend for the same OpenMP pool.
static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

/// Two arms (1 and 2 heads), three learning rates of which one is far too small to learn in 24 steps and
/// one far too large: the middle one must win for both arms.
fn recipe_text(dir: &Path, extra: &str) -> String {
    let data = dir.join("corpus.txt");
    std::fs::write(&data, "to be or not to be, that is the question. ".repeat(80)).unwrap();
    format!(
        "kind: lm\ntransformer:\n  d_model: 16\n  layers: 1\n  block_size: 16\ndata:\n  path: {}\ntrain:\n  steps: 24\n  \
         batch_size: 8\n  warmup_steps: 3\n  eval_interval: 8\n  eval_batches: 2\n  log_interval: 4\nsweep:\n  \
         transformer.heads: [1, 2]\nseeds: [0, 1]\ntune:\n  keys:\n    train.lr: [1.0e-7, 1.0e-2, 50.0]\n  seeds: [7]\n{extra}",
        data.display()
    )
}

fn opts(out: &Path, shard: Option<Shard>) -> SweepOptions<'_> {
    SweepOptions { out, device: Device::Cpu, force: false, quiet: true, shard }
}

#[test]
fn each_arm_tunes_on_validation_then_trains_its_final_seeds_with_the_choice() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let dir = scratch("tune-choice");
    let recipe = parse(&recipe_text(&dir, ""), "tune.yaml", "tune", false).unwrap();
    let tuning = recipe.tuning.as_ref().unwrap();
    assert_eq!((tuning.rungs, tuning.candidates.len(), tuning.arms.len()), (1, 3, 2));
    assert_eq!(recipe.planned_runs(), 2 * 3 + 2 * 2, "3 tuning runs and 2 final seeds per arm");
    let out = dir.join("out");
    run_recipe(&recipe, &opts(&out, None)).unwrap();
    let all = ablate::judge::reading::all_runs(&out).unwrap();
    let tune: Vec<_> = all.iter().filter(|r| r["phase"] == "tune").collect();
    let finals: Vec<_> = all.iter().filter(|r| r["phase"] == "final").collect();
    assert_eq!((tune.len(), finals.len()), (6, 4));
    // Tuning runs use the tuning seed and a third of the steps (warm-up scaled alike); finals the full run.
    assert!(tune.iter().all(|r| r["seed"] == "7" && r["train.steps"] == "8" && r["train.warmup_steps"] == "1"));
    assert!(finals.iter().all(|r| r["seed"] != "7" && r["train.steps"] == "24"));
    assert!(finals.iter().all(|r| r["train.lr"] == "0.01"), "{finals:?}");
    // Tuning never reads the test split; every final run does.
    assert!(tune.iter().all(|r| r["test_loss"].is_empty()) && finals.iter().all(|r| !r["test_loss"].is_empty()));
    // The reported rows are the final ones only.
    let reported = ablate::judge::reading::reported_runs(&out).unwrap();
    assert_eq!(reported.len(), 4);
    assert!(reported.iter().all(|r| r["phase"] == "final"));
    let _ = std::fs::remove_dir_all(&dir);
}

/// `runs.csv` and `curves.csv` cut back to their first `keep` runs, as a kill leaves them (a run's row is
/// its commit point; curves of runs without a row are dropped when the sweep resumes).
fn cut_to(out: &Path, keep: usize) {
    let runs = std::fs::read_to_string(out.join("runs.csv")).unwrap();
    let kept: Vec<&str> = runs.lines().take(keep + 1).collect();
    std::fs::write(out.join("runs.csv"), kept.join("\n") + "\n").unwrap();
}

#[test]
fn a_tuned_sweep_cut_short_in_either_phase_resumes_to_the_same_results() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let dir = scratch("tune-resume");
    let recipe = parse(&recipe_text(&dir, ""), "tune.yaml", "tune", false).unwrap();
    let reference = dir.join("reference");
    run_recipe(&recipe, &opts(&reference, None)).unwrap();
    // After 4 rows the sweep is inside the tuning rung; after 8 inside the final runs.
    for keep in [4, 8] {
        let out = dir.join(format!("cut{keep}"));
        std::fs::create_dir_all(&out).unwrap();
        for f in ["runs.csv", "curves.csv"] {
            std::fs::copy(reference.join(f), out.join(f)).unwrap();
        }
        cut_to(&out, keep);
        run_recipe(&recipe, &opts(&out, None)).unwrap();
        assert_eq!(all_runs_without_timings(&out), all_runs_without_timings(&reference), "cut after {keep} runs");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn shards_tune_whole_arms_and_merge_to_a_single_run() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let dir = scratch("tune-shards");
    let recipe = parse(&recipe_text(&dir, ""), "tune.yaml", "tune", false).unwrap();
    let single = dir.join("single");
    run_recipe(&recipe, &opts(&single, None)).unwrap();
    let sharded = dir.join("sharded");
    for index in [1, 0] {
        run_recipe(&recipe, &opts(&sharded, Some(Shard { index, count: 2 }))).unwrap();
    }
    assert_eq!(merge(&recipe, &sharded, true).unwrap(), (10, 0));
    let sorted = |out: &Path| {
        let mut rows = all_runs_without_timings(out);
        rows.sort();
        rows
    };
    assert_eq!(sorted(&sharded), sorted(&single));
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_tuned_recipe_is_refused_before_training_when_its_plan_cannot_work() {
    let dir = scratch("tune-refusals");
    let base = recipe_text(&dir, "");
    let refuse = |text: &str, expected: &str| {
        let err = parse(text, "tune.yaml", "tune", false).unwrap_err().to_string();
        assert!(err.contains(expected), "{err}");
        assert_eq!(err.lines().count(), 1, "{err}");
    };
    refuse(&base.replace("seeds: [7]", "seeds: [1]"), "tune.seeds: 1 is also a final seed");
    refuse(&base.replace("train.lr: [1.0e-7, 1.0e-2, 50.0]", "train.lr: []"), "the candidate list is empty");
    refuse(
        &base.replace("train.lr: [1.0e-7, 1.0e-2, 50.0]", "transformer.heads: [1, 4]"),
        "transformer.heads is also swept",
    );
    refuse(&base.replace("train.lr: [1.0e-7, 1.0e-2, 50.0]", "train.lr: [fast]"), "train.lr");
    refuse(&format!("{base}  eta: 1\n"), "tune.eta: must be at least 2");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_scale_check_reruns_the_tuned_comparison_at_a_second_width_and_the_summary_sets_the_effects_side_by_side() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let dir = scratch("tune-scale-check");
    let text = recipe_text(&dir, "scale_check:\n  transformer.d_model: 32\n")
        .replace("seeds: [0, 1]\ntune", "seeds: [0, 1, 2]\ntune");
    let recipe = parse(&text, "tune.yaml", "tune", false).unwrap();
    let (check, settings) = recipe.scale_check.as_ref().unwrap();
    assert_eq!(settings, &vec!["transformer.d_model=32".to_string()]);
    assert!(check.runs.iter().all(|r| r.config.transformer.d_model == 32));
    assert!(check.tuning.is_some(), "each arm is tuned again at the second scale");
    let out = dir.join("out");
    run_recipe(&recipe, &opts(&out, None)).unwrap();
    let second = ablate::judge::reading::reported_runs(&out.join("scale_check")).unwrap();
    assert_eq!(second.len(), 6);
    assert!(second.iter().all(|r| r["transformer.d_model"] == "32" && r["phase"] == "final"));
    let table = ablate::judge::summary::summary_table(
        &ablate::judge::reading::Results::open(&out, &recipe, Some(Pairing::Baseline("heads=1"))).unwrap(),
    )
    .unwrap();
    assert!(table.contains("At the second scale (transformer.d_model=32)"), "{table}");
    assert!(table.contains("Verdicts at both scales"), "{table}");
    let row = table
        .lines()
        .find(|l| l.starts_with("| heads=2 | test loss") && l.matches(" | ").count() == 4)
        .expect("a row of the across-scales table");
    let across = row.trim_end_matches(" |").rsplit(" | ").next().unwrap();
    let verdicts = ["holds at both", "one scale only", "sign differs", "inconclusive at both"];
    assert!(verdicts.contains(&across), "{row}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_scale_check_that_cannot_work_is_refused_in_one_line() {
    let dir = scratch("tune-scale-refusals");
    for (extra, expected) in [
        ("scale_check:\n  transformer.heads: 4\n", "scale_check.transformer.heads: transformer.heads is swept"),
        ("scale_check:\n  transformer.d_model: 31\n", "scale_check: "),
        ("scale_check:\n  transformer.widht: 30\n", "widht"),
    ] {
        let e = parse(&recipe_text(&dir, extra), "tune.yaml", "tune", false).unwrap_err().to_string();
        assert!(e.contains(expected) && e.lines().count() == 1, "{e}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// A tiny tuned recipe of every kind, shrunk as `--smoke` shrinks: its tuning rows carry no test metric of
/// any kind (a tuning run reads validation only) and its final rows carry the kind's test metrics.
#[test]
fn tuning_runs_of_every_kind_read_no_test_split() {
    use ablate::recipe::Kind;
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let dir = scratch("tune-no-test");
    for kind in Kind::ALL {
        let base = match kind {
            Kind::Lm => "kind: lm\ntransformer: {d_model: 16, layers: 1, heads: 2, block_size: 16, pe: rope}\ntrain: {eval_lengths: [2]}\n",
            Kind::Bert => "kind: bert\ntransformer: {d_model: 16, layers: 1, heads: 2, block_size: 16}\ndata: {tokenizer: wordpiece, vocab_size: 100}\nbert: {task: spam, pretrain_steps: 2}\n",
            Kind::Translate => "kind: translate\ntransformer: {d_model: 16, heads: 2, block_size: 64}\ndata: {tokenizer: bpe, vocab_size: 300}\ntranslate: {encoder_layers: 1, decoder_layers: 1, eval_sentences: 4}\n",
            Kind::Vit => "kind: vit\ntransformer: {d_model: 16, layers: 1, heads: 2}\nvision: {patch_size: 7}\n",
            Kind::Swin => "kind: swin\ntransformer: {d_model: 16, heads: 2}\nvision: {patch_size: 2, depths: [1, 1], window: 7}\n",
            Kind::Davit => "kind: davit\ntransformer: {d_model: 16, heads: 2}\nvision: {patch_size: 2, depths: [2, 1], window: 7}\n",
            Kind::ImageGpt => "kind: image_gpt\ntransformer: {d_model: 16, layers: 1, heads: 2}\nvision: {patch_size: 4}\nimage_gpt: {palette: 8}\n",
            Kind::Cnn => "kind: cnn\ncnn: {channels: [4, 8]}\n",
            Kind::SeqClassify => "kind: seq_classify\ntransformer: {d_model: 16, layers: 1, heads: 2, block_size: 16}\nseq_classify: {task: listops, min_length: 8, max_length: 16}\n",
        };
        let text = format!("{base}seeds: [0]\ntune:\n  keys:\n    train.lr: [1.0e-3, 3.0e-3]\n  seeds: [7]\n");
        let recipe = parse(&text, "tuned.yaml", "tuned", true).unwrap_or_else(|e| panic!("{kind}: {e}"));
        let out = dir.join(kind.to_string());
        run_recipe(&recipe, &opts(&out, None)).unwrap_or_else(|e| panic!("{kind}: {e:#}"));
        let all = ablate::judge::reading::all_runs(&out).unwrap();
        let test_columns: Vec<&String> = all[0].keys().filter(|c| c.starts_with("test_")).collect();
        assert!(!test_columns.is_empty(), "{kind}");
        for row in &all {
            let filled: Vec<&&String> = test_columns.iter().filter(|c| !row[c.as_str()].is_empty()).collect();
            match row["phase"].as_str() {
                "tune" => assert!(filled.is_empty(), "{kind}: a tuning row carries {filled:?}"),
                "final" => assert!(
                    filled.len() == test_columns.len(),
                    "{kind}: a final row leaves {:?} empty",
                    test_columns.iter().filter(|c| row[c.as_str()].is_empty()).collect::<Vec<_>>()
                ),
                other => panic!("{kind}: phase {other}"),
            }
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
}
