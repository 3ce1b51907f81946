//! Equal-budget comparisons (`train.budget`): a run ends at its budget of tokens, FLOPs or seconds instead
//! of at `train.steps`, its cosine schedule follows the budget to its end, and `runs.csv` records the budget
//! and the steps reached. Budgets that cannot work are refused before training.
mod common;

use ablate::recipe::{parse, warmup_cosine};
use ablate::run::sweep::{run_recipe, SweepOptions};
use common::scratch;
use std::path::Path;
use tch::Device;

/// A tiny character model: batch 8 of 16-token windows, so one step reads 128 tokens.
fn recipe_text(dir: &Path, budget: &str) -> String {
    let data = dir.join("corpus.txt");
    std::fs::write(&data, "a budget ends the run where it is spent. ".repeat(80)).unwrap();
    format!(
        "kind: lm\ntransformer:\n  d_model: 16\n  layers: 1\n  heads: 2\n  block_size: 16\ndata:\n  path: {}\ntrain:\n  \
         batch_size: 8\n  lr: 3.0e-3\n  min_lr: 3.0e-4\n  warmup_steps: 2\n  eval_interval: 5\n  eval_batches: 1\n  \
         log_interval: 1\n  budget: {budget}\n",
        data.display()
    )
}

fn train(
    dir: &Path,
    budget: &str,
) -> (Vec<std::collections::BTreeMap<String, String>>, ablate::judge::reading::Curves) {
    let recipe = parse(&recipe_text(dir, budget), "budget.yaml", "budget", false).unwrap();
    let out = dir.join("out");
    let opts = SweepOptions { out: &out, device: Device::Cpu, force: true, quiet: true, shard: None };
    run_recipe(&recipe, &opts).unwrap();
    (ablate::judge::reading::reported_runs(&out).unwrap(), ablate::judge::reading::curves_of(&out).unwrap())
}

/// The learning rates the run recorded, by step.
fn lrs(curves: &ablate::judge::reading::Curves) -> Vec<(i64, f64)> {
    curves.values().next().unwrap()["train/lr"].iter().map(|&(s, v)| (s, v)).collect()
}

#[test]
fn a_tokens_budget_buys_whole_steps_and_the_schedule_ends_with_it() {
    let dir = scratch("budget-tokens");
    // 20 steps of 128 tokens, and part of a 21st that is not taken.
    let (runs, curves) = train(&dir, "{tokens: 2600}");
    let r = &runs[0];
    assert_eq!(r["steps"], "20");
    assert_eq!(r["train.budget.tokens"], "2600.0");
    assert!(!r.contains_key("train.steps"), "the budget, not train.steps, ends the run");
    // The learning rate is the cosine schedule over the 20 steps the budget buys (step k records the rate
    // of step k − 1, 0-based).
    for (step, lr) in lrs(&curves) {
        let expected = warmup_cosine(step - 1, 2, 20, 3e-3, 3e-4);
        // curves.csv keeps six decimals.
        assert!((lr - expected).abs() < 1e-6, "step {step}: {lr} against {expected}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_flops_budget_divides_by_the_kinds_own_training_flops_per_step() {
    let dir = scratch("budget-flops");
    let recipe = parse(&recipe_text(&dir, "{tokens: 1}"), "budget.yaml", "budget", false).unwrap();
    let cfg = &recipe.runs[0].config;
    // The model's FLOPs per step as its MFU counts them: per token, times 16 tokens, times 8 examples.
    // The vocabulary: the corpus's distinct characters.
    let vocab = "a budget ends the run where it is spent. ".chars().collect::<std::collections::BTreeSet<_>>().len();
    let params = ablate::tasks::parameter_count(cfg, vocab as i64);
    let per_step = ablate::tasks::lm::train_flops_per_token(cfg, params, vocab as i64) * 16.0 * 8.0;
    let budget = per_step * 12.5;
    let (runs, _) = train(&dir, &format!("{{flops: {budget}}}"));
    assert_eq!(runs[0]["steps"], "12");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_seconds_budget_stops_by_elapsed_time_and_decays_by_its_fraction() {
    let dir = scratch("budget-seconds");
    let (runs, curves) = train(&dir, "{seconds: 0.4}");
    let steps: i64 = runs[0]["steps"].parse().unwrap();
    assert!(steps > 2, "{steps} steps in 0.4 s");
    let run = curves.values().next().unwrap();
    let fractions = &run["train/budget_fraction"];
    assert_eq!(fractions.last().unwrap(), &(steps, 1.0), "the last step is the one that spent the budget");
    assert!(fractions[..fractions.len() - 1].iter().all(|&(_, f)| f < 1.0));
    // After the warm-up, each rate is the cosine at the fraction of the budget spent before its step.
    for window in fractions.windows(2).skip(2) {
        let (before, (step, _)) = (window[0].1, window[1]);
        let lr = lrs(&curves).iter().find(|(s, _)| *s == step).unwrap().1;
        let expected = 3e-4 + 0.5 * (1.0 + (std::f64::consts::PI * before).cos()) * (3e-3 - 3e-4);
        // Six decimals in curves.csv, of the rate and of the fraction it follows.
        assert!((lr - expected).abs() < 1e-5, "step {step}: {lr} against {expected}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn budgets_that_cannot_work_are_refused_in_one_line_before_training() {
    let dir = scratch("budget-refusals");
    let refused_at_load = |text: &str, expected: &str| {
        let e = parse(text, "budget.yaml", "budget", false).unwrap_err().to_string();
        assert!(e.contains(expected) && e.lines().count() == 1, "{e}");
    };
    let base = recipe_text(&dir, "{tokens: 2600}");
    refused_at_load(
        &base.replace("  batch_size: 8\n", "  steps: 50\n  batch_size: 8\n"),
        "train.steps: train.budget ends the run instead",
    );
    refused_at_load(&recipe_text(&dir, "{tokens: -5}"), "train.budget: must be a positive number");
    refused_at_load(&recipe_text(&dir, "{litres: 5}"), "litres");
    // No step fits 100 tokens (a step reads 128); 300 tokens buy 2 steps, no more than the warm-up.
    for (budget, expected) in [("{tokens: 100}", "buy no step"), ("{tokens: 300}", "no more than train.warmup_steps")] {
        let recipe = parse(&recipe_text(&dir, budget), "budget.yaml", "budget", false).unwrap();
        let out = dir.join("refused");
        let opts = SweepOptions { out: &out, device: Device::Cpu, force: true, quiet: true, shard: None };
        let e = format!("{:#}", run_recipe(&recipe, &opts).unwrap_err());
        assert!(e.contains(expected), "{e}");
        assert!(!out.join("runs.csv").exists(), "nothing trained");
    }
    let _ = std::fs::remove_dir_all(&dir);
}
