//! `--until-settled`: the second stage's seeds come from the pilot's spread, δ and the plan alone (the same
//! for any observed difference, and for a pilot that looks decided), land on both arms of every comparison
//! (at least two, up to the cap), and a second call trains nothing more; what the flag cannot do is refused
//! before anything is allocated or trained, with one line.
mod common;

use ablate::judge::reading::Results;

use ablate::recipe::parse;
use common::scratch;
use std::path::Path;
use std::process::Command;

fn recipe_text(dir: &Path, delta: f64) -> String {
    let data = dir.join("corpus.txt");
    std::fs::write(&data, "to be or not to be, that is the question. ".repeat(80)).unwrap();
    format!(
        "kind: lm\ntransformer:\n  d_model: 16\n  layers: 1\n  block_size: 16\ndata:\n  path: {}\ntrain:\n  steps: 24\n  lr: 0.01\n  \
         batch_size: 8\n  warmup_steps: 3\n  eval_interval: 8\n  eval_batches: 2\n  log_interval: 4\nsweep:\n  \
         transformer.heads: [1, 2]\nseeds: [0, 1, 2]\ncompare:\n  baseline: heads=1\n  delta:\n    test_loss: {delta}\n    test_accuracy: 0.5\n",
        data.display()
    )
}

/// A pilot's `runs.csv`: `heads=1` at `base` and `heads=2` at `base` plus `differences`, per seed.
fn write_pilot(dir: &Path, base: [f64; 3], differences: [f64; 3]) {
    let mut csv = String::from("run_id,label,seed,config_hash,status,transformer.heads,test_loss,test_accuracy\n");
    for (seed, (b, d)) in base.iter().zip(differences).enumerate() {
        csv.push_str(&format!("transformer.heads=1 seed={seed},heads=1,{seed},x,ok,1,{b},0.5\n"));
        // The accuracies differ by a little, differently per seed: equal differences carry no test.
        let accuracy = 0.5 + [0.001, -0.002, 0.0015][seed];
        csv.push_str(&format!("transformer.heads=2 seed={seed},heads=2,{seed},x,ok,2,{},{accuracy}\n", b + d));
    }
    std::fs::create_dir_all(dir).unwrap();
    std::fs::write(dir.join("runs.csv"), csv).unwrap();
}

#[test]
fn the_seeds_added_read_the_spread_and_delta_never_the_difference() {
    let dir = scratch("settle-rule");
    let recipe = parse(&recipe_text(&dir, 0.01), "settle.yaml", "settle", false).unwrap();
    let base = [2.0, 2.1, 1.9];
    // The same spread of paired differences (sd 0.01) around two different means, both inconclusive.
    let (near, far) = (dir.join("near"), dir.join("far"));
    write_pilot(&near, base, [-0.009, 0.001, 0.011]);
    write_pilot(&far, base, [-0.006, 0.004, 0.014]);
    let targets = |d: &Path| ablate::run::settle::targets(&Results::open(d, &recipe, None).unwrap(), 50).unwrap();
    let (a, b) = (targets(&near), targets(&far));
    assert_eq!(a, b, "the observed difference moved the plan");
    let n = a["heads=1"];
    assert_eq!(a["heads=2"], n, "both arms of the comparison");
    // The plan's number for sd 0.01 and δ 0.01 at the family's level (one comparison: α = 0.05).
    assert_eq!(n, ablate::design::Planner::new(3, 50, 0.05).target(0.01, 0.01));
    // A pilot that already looks decided (a large difference, the same spread) gets the same second stage:
    // no gate on the pilot's verdict.
    let decided = dir.join("decided");
    write_pilot(&decided, base, [-0.509, -0.499, -0.489]);
    assert_eq!(targets(&decided), a, "a decided-looking pilot stopped early");
    // A wider spread asks for more; the cap holds; a tiny one still gets two added seeds.
    let wide = dir.join("wide");
    write_pilot(&wide, base, [-0.018, 0.002, 0.022]);
    assert!(targets(&wide)["heads=1"] > n);
    assert_eq!(ablate::run::settle::targets(&Results::open(&wide, &recipe, None).unwrap(), 5).unwrap()["heads=1"], 5);
    let tight = dir.join("tight");
    write_pilot(&tight, base, [0.0001, 0.0002, 0.0003]);
    assert_eq!(targets(&tight)["heads=1"], 5);
    let _ = std::fs::remove_dir_all(&dir);
}

fn ablate(args: &[&str]) -> (bool, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_ablate")).args(args).output().unwrap();
    (out.status.success(), String::from_utf8_lossy(&out.stderr).to_string())
}

#[test]
fn until_settled_adds_seeds_to_both_arms_up_to_the_cap_and_a_second_call_trains_nothing() {
    let dir = scratch("settle-run");
    let path = dir.join("settle.yaml");
    // δ tiny: any spread asks for more seeds than the cap of 5.
    std::fs::write(&path, recipe_text(&dir, 1e-6)).unwrap();
    let out = dir.join("out");
    let (p, o) = (path.to_str().unwrap(), out.to_str().unwrap());
    let (ok, err) = ablate(&[p, "--out", o, "--device", "cpu", "--quiet", "--until-settled", "--max-seeds", "5"]);
    assert!(ok, "{err}");
    let rows = ablate::judge::reading::reported_runs(&out).unwrap();
    for label in ["heads=1", "heads=2"] {
        let mut seeds: Vec<u64> =
            rows.iter().filter(|r| r["label"] == label).map(|r| r["seed"].parse().unwrap()).collect();
        seeds.sort();
        assert_eq!(seeds, [0, 1, 2, 3, 4], "{label}");
    }
    // The plan is recorded as the pilot's (this directory was fresh), and the block says so.
    let recipe = ablate::recipe::load(&path, false).unwrap();
    let mut planned = recipe.clone();
    planned.compare.as_mut().unwrap().max_seeds = Some(5);
    let block = ablate::judge::verdicts::block(&Results::open(&out, &planned, None).unwrap(), "test").unwrap();
    assert!(block.contains("at most 5 seeds per arm") && block.contains("fixed before the pilot"), "{block}");
    assert!(block.contains("inverse-normal combination"), "{block}");
    let before = std::fs::read_to_string(out.join("runs.csv")).unwrap();
    let (ok, err) = ablate(&[p, "--out", o, "--device", "cpu", "--until-settled", "--max-seeds", "5"]);
    assert!(ok, "{err}");
    assert_eq!(std::fs::read_to_string(out.join("runs.csv")).unwrap(), before, "nothing retrained");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn what_until_settled_cannot_do_is_refused_before_training_with_one_line() {
    let dir = scratch("settle-refuse");
    let path = dir.join("settle.yaml");
    let text = recipe_text(&dir, 0.01);
    std::fs::write(&path, &text).unwrap();
    let out = dir.join("out");
    let (p, o) = (path.to_str().unwrap(), out.to_str().unwrap());
    for cap in ["2", "4", "99999999999"] {
        let (ok, err) = ablate(&[p, "--out", o, "--device", "cpu", "--until-settled", "--max-seeds", cap]);
        assert!(
            !ok && err.trim().lines().count() == 1
                && err.contains(&format!("a cap of {cap} seeds per arm is no second stage")),
            "{cap}: {err}"
        );
    }
    let (ok, err) = ablate(&[p, "--out", o, "--device", "cpu", "--until-settled"]);
    assert!(!ok && err.trim().lines().count() == 1 && err.contains("add `compare.max_seeds: N`"), "{err}");
    // A cap the run limit cannot hold is refused before the seed pool is built (15 arms × 10,000 seeds).
    let (ok, err) = ablate(&[
        p,
        "--out",
        o,
        "--device",
        "cpu",
        "--until-settled",
        "--max-seeds",
        "10000",
        "--sweep",
        "transformer.heads=1,2,4,8,16",
        "--sweep",
        "transformer.layers=1,2,3",
    ]);
    assert!(
        !ok && err.trim().lines().count() == 1 && err.contains("expands the recipe's 15 final runs per seed"),
        "{err}"
    );
    let planned = dir.join("planned.yaml");
    std::fs::write(&planned, text.replace("compare:\n", "compare:\n  max_seeds: 6\n")).unwrap();
    let (ok, err) =
        ablate(&[planned.to_str().unwrap(), "--out", o, "--device", "cpu", "--until-settled", "--max-seeds", "5"]);
    assert!(!ok && err.trim().lines().count() == 1 && err.contains("differs from the recipe's plan"), "{err}");
    let too_few = dir.join("few.yaml");
    std::fs::write(&too_few, text.replace("compare:\n", "compare:\n  max_seeds: 4\n")).unwrap();
    let (ok, err) = ablate(&[too_few.to_str().unwrap(), "--out", o, "--device", "cpu"]);
    assert!(!ok && err.trim().lines().count() == 1 && err.contains("compare.max_seeds: 4 seeds per arm"), "{err}");
    let primary = dir.join("primary.yaml");
    std::fs::write(&primary, text.replace("compare:\n", "compare:\n  primary: tokens_per_s\n")).unwrap();
    let (ok, err) = ablate(&[primary.to_str().unwrap(), "--out", o, "--device", "cpu"]);
    assert!(!ok && err.trim().lines().count() == 1 && err.contains("compare.primary: `tokens_per_s`"), "{err}");
    let no_compare = dir.join("plain.yaml");
    std::fs::write(&no_compare, &text[..text.find("compare:").unwrap()]).unwrap();
    let (ok, err) = ablate(&[no_compare.to_str().unwrap(), "--out", o, "--device", "cpu", "--until-settled"]);
    assert!(!ok && err.trim().lines().count() == 1 && err.contains("add a `compare:` section"), "{err}");
    let bad_metric = dir.join("bad.yaml");
    std::fs::write(&bad_metric, text.replace("test_accuracy: 0.5", "test_bleu: 0.5")).unwrap();
    let (ok, err) = ablate(&[bad_metric.to_str().unwrap(), "--out", o, "--device", "cpu"]);
    assert!(
        !ok && err.trim().lines().count() == 1 && err.contains("compare.delta.test_bleu: no headline metric"),
        "{err}"
    );
    let bad_baseline = dir.join("base.yaml");
    std::fs::write(&bad_baseline, text.replace("baseline: heads=1", "baseline: heads=3")).unwrap();
    let (ok, err) = ablate(&[bad_baseline.to_str().unwrap(), "--out", o, "--device", "cpu"]);
    assert!(!ok && err.trim().lines().count() == 1 && err.contains("compare.baseline"), "{err}");
    assert!(!out.join("runs.csv").exists(), "nothing trained");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn predictions_are_set_against_the_verdicts_and_one_edited_after_the_run_is_marked_post_hoc() {
    let dir = scratch("predict");
    let with = |expect: &str| {
        let text = recipe_text(&dir, 0.01).replace(
            "compare:\n  baseline: heads=1\n",
            &format!(
                "compare:\n  baseline: heads=1\n  predict:\n    - {{comparison: heads=2, metric: test_loss, expect: {expect}, source: 'a paper, Table 1', role: test}}\n    - {{comparison: heads=2, metric: test_accuracy, expect: equivalent, source: the same paper, role: control}}\n"
            ),
        );
        parse(&text, "predict.yaml", "predict", false).unwrap()
    };
    let recipe = with("better");
    ablate::judge::summary::check_compare(&recipe).unwrap();
    let out = dir.join("out");
    // heads=2 clearly lower in loss (better), the accuracies equal (equivalent within 0.5).
    write_pilot(&out, [2.0, 2.1, 1.9], [-0.30, -0.31, -0.29]);
    ablate::run::results::write_resolved(&recipe, &out.join("recipe.resolved.yaml")).unwrap();
    let block = ablate::judge::verdicts::block(&Results::open(&out, &recipe, None).unwrap(), "test").unwrap();
    let row = |metric: &str| {
        block
            .lines()
            .find(|l| l.starts_with("| heads=2 | ") && l.contains(&format!(" | {metric} | ")))
            .unwrap()
            .to_string()
    };
    assert!(row("test_loss").ends_with("| reproduced |"), "{block}");
    assert!(row("test_accuracy").ends_with("| consistent |"), "{block}");
    assert!(!block.contains("post hoc"), "{block}");
    assert!(block.trim_end().ends_with(ablate::judge::verdicts::END), "{block}");
    // These rows predate the recorded plan: the block says the plan was set after the pilot. A plan recorded
    // when a fresh directory's pilot started, then changed in the recipe, is named as the pilot's.
    assert!(block.contains("**set after the pilot** (its runs predate recorded plans)"), "{block}");
    // Where no plan was recorded, the recipe may date it from its git history (`compare.plan_written_after`);
    // beside a recorded plan the key is refused in one line.
    let mut dated = recipe.clone();
    dated.compare.as_mut().unwrap().plan_written_after = Some(ablate::recipe::compare::PlanWrittenAfter::SecondStage);
    let dated_block = ablate::judge::verdicts::block(&Results::open(&out, &dated, None).unwrap(), "test").unwrap();
    assert!(dated_block.contains("**set after the second stage's results** (its runs predate"), "{dated_block}");
    let fresh = dir.join("fresh");
    std::fs::create_dir_all(&fresh).unwrap();
    ablate::run::results::write_resolved(&recipe, &fresh.join("recipe.resolved.yaml")).unwrap();
    write_pilot(&fresh, [2.0, 2.1, 1.9], [-0.30, -0.31, -0.29]);
    let same = ablate::judge::verdicts::block(&Results::open(&fresh, &recipe, None).unwrap(), "test").unwrap();
    assert!(same.contains("fixed before the pilot"), "{same}");
    let refused = ablate::judge::verdicts::block(&Results::open(&fresh, &dated, None).unwrap(), "test").unwrap_err();
    assert!(refused.to_string().contains("compare.plan_written_after: these results record the plan"), "{refused}");
    let mut replanned = recipe.clone();
    replanned.compare.as_mut().unwrap().max_seeds = Some(7);
    let after = ablate::judge::verdicts::block(&Results::open(&fresh, &replanned, None).unwrap(), "test").unwrap();
    assert!(after.contains("**set after the pilot**, which started under: at most 3 seeds per arm"), "{after}");
    assert!(after.contains("incomplete"), "a planned second stage that has not run decides nothing: {after}");
    // The same results judged against a prediction changed afterwards: its outcome is marked post hoc.
    let edited = with("worse");
    let block = ablate::judge::verdicts::block(&Results::open(&out, &edited, None).unwrap(), "test").unwrap();
    let loss = block.lines().find(|l| l.starts_with("| heads=2 | test | test_loss | worse")).unwrap();
    assert!(loss.contains("not reproduced (the opposite direction) (post hoc"), "{loss}");
    assert!(block.contains("1 of 2 prediction(s) differ from those recorded"), "{block}");
    // A role given after the run (here the accuracy's, control when the run recorded test) is marked, and is
    // not post hoc: the claim is the one the results ran against.
    let mut recorded_as_test = recipe.clone();
    recorded_as_test.compare.as_mut().unwrap().predict[1].role = Some(ablate::recipe::compare::Role::Test);
    let fresh_roles = dir.join("roles");
    std::fs::create_dir_all(&fresh_roles).unwrap();
    ablate::run::results::write_resolved(&recorded_as_test, &fresh_roles.join("recipe.resolved.yaml")).unwrap();
    write_pilot(&fresh_roles, [2.0, 2.1, 1.9], [-0.30, -0.31, -0.29]);
    let block = ablate::judge::verdicts::block(&Results::open(&fresh_roles, &recipe, None).unwrap(), "test").unwrap();
    let accuracy = block.lines().find(|l| l.starts_with("| heads=2 | control | test_accuracy")).unwrap();
    assert!(accuracy.ends_with("| consistent (its role given after the run) |"), "{accuracy}");
    assert!(!block.contains("post hoc"), "{block}");
    // A prediction must name a variant and a headline metric, and give its source and its role.
    let text = recipe_text(&dir, 0.01);
    for (bad, expected) in [
        (
            "{comparison: heads=3, metric: test_loss, expect: better, source: x, role: test}",
            "compare.predict.0.comparison: no variant `heads=3`",
        ),
        (
            "{comparison: heads=2, metric: val_loss, expect: better, source: x, role: test}",
            "compare.predict.0.metric: no headline metric `val_loss`",
        ),
        (
            "{comparison: heads=2, metric: test_loss, expect: better, source: '', role: test}",
            "say where the prediction comes from",
        ),
        ("{comparison: heads=2, metric: test_loss, expect: larger, source: x, role: test}", "expect"),
        ("{comparison: heads=2, metric: test_loss, expect: better, source: x}", "role"),
        ("{comparison: heads=2, metric: test_loss, expect: better, source: x, role: probe}", "control"),
    ] {
        let t = text.replace(
            "compare:\n  baseline: heads=1\n",
            &format!("compare:\n  baseline: heads=1\n  predict:\n    - {bad}\n"),
        );
        let err = match parse(&t, "p.yaml", "p", false) {
            Err(e) => e.to_string(),
            Ok(r) => ablate::judge::summary::check_compare(&r).unwrap_err().to_string(),
        };
        assert!(err.contains(expected) && err.lines().count() == 1, "{bad}: {err}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// `common::runs_without_timings` by run id: one process appends the added seeds' rows in the order they
/// finish, a merge writes them in the recipe's.
fn untimed(dir: &Path) -> Vec<Vec<(String, String)>> {
    let mut rows = common::runs_without_timings(dir);
    let id = |row: &Vec<(String, String)>| row.iter().find(|(k, _)| k == "run_id").map(|(_, v)| v.clone());
    rows.sort_by_key(id);
    rows
}

/// Whether two `runs.csv` cells agree: equal text, or numbers within a relative 1e-5. Another process
/// (a worker or a shard, each with its own thread pool and allocator) may sum a float32 loss in another
/// order, which moved the sixth decimal of a perplexity on a 2-core AMD EPYC (5.430925 against 5.430926);
/// another seed, run or plan differs by orders of magnitude more.
fn same_cell(p: &(String, String), q: &(String, String)) -> bool {
    let close = |x: &str, y: &str| match (x.parse::<f64>(), y.parse::<f64>()) {
        (Ok(x), Ok(y)) => (x - y).abs() <= 1e-5 * x.abs().max(y.abs()).max(1.0),
        _ => false,
    };
    p.0 == q.0 && (p.1 == q.1 || close(&p.1, &q.1))
}

/// Fails naming the first cells where `dir`'s rows differ from `reference`'s (timings aside).
fn assert_same_rows(dir: &Path, reference: &Path, what: &str) {
    let (a, b) = (untimed(dir), untimed(reference));
    let differing: Vec<String> = a
        .iter()
        .zip(&b)
        .flat_map(|(x, y)| x.iter().zip(y).filter(|(p, q)| !same_cell(p, q)).map(|(p, q)| format!("{p:?} vs {q:?}")))
        .take(5)
        .collect();
    let same_shape = a.len() == b.len() && a.iter().zip(&b).all(|(x, y)| x.len() == y.len());
    assert!(
        same_shape && differing.is_empty(),
        "{what} trained other rows than one process: {} vs {} rows; {differing:?}",
        a.len(),
        b.len()
    );
}

#[test]
fn until_settled_on_a_worker_pool_and_on_shards_trains_what_one_process_trains() {
    let dir = scratch("settle-scale");
    let path = dir.join("settle.yaml");
    std::fs::write(&path, recipe_text(&dir, 1e-6)).unwrap();
    let p = path.to_str().unwrap();
    let settle = ["--device", "cpu", "--quiet", "--threads", "1", "--until-settled", "--max-seeds", "5"];
    let run = |out: &Path, extra: &[&str]| {
        let mut args = vec![p, "--out", out.to_str().unwrap()];
        args.extend(settle);
        args.extend(extra);
        ablate(&args)
    };
    let (local, pool, shards) = (dir.join("local"), dir.join("pool"), dir.join("shards"));
    let (ok, err) = run(&local, &[]);
    assert!(ok, "{err}");
    assert_eq!(untimed(&local).len(), 10, "both arms raised to the cap of 5 seeds");
    let (ok, err) = run(&pool, &["--workers", "2"]);
    assert!(ok, "{err}");
    assert_same_rows(&pool, &local, "the worker pool");
    // Called again (as after an interruption), the pool's pilot pass meets its shards' added seeds: kept,
    // nothing retrained.
    let before = untimed(&pool);
    let (ok, err) = run(&pool, &["--workers", "2"]);
    assert!(ok, "a second call to the pool: {err}");
    assert_eq!(untimed(&pool), before, "nothing retrained");
    // By hand, as the Slurm scripts do: the pilot's shards, their merge, the added seeds' shards, the merge.
    let merge = |extra: &[&str]| {
        let mut args = vec!["merge", p, "--out", shards.to_str().unwrap()];
        args.extend(extra);
        ablate(&args)
    };
    let (ok, err) = run(&shards, &["--shard", "0/2"]);
    assert!(!ok && err.trim().lines().count() == 1 && err.contains("add --settle-phase pilot"), "{err}");
    for phase in ["pilot", "added"] {
        for shard in ["0/2", "1/2"] {
            let (ok, err) = run(&shards, &["--shard", shard, "--settle-phase", phase]);
            assert!(ok, "{phase} {shard}: {err}");
        }
        let (ok, err) = merge(&["--until-settled", "--max-seeds", "5"]);
        assert!(ok, "{phase}: {err}");
    }
    assert_same_rows(&shards, &local, "the shards merged by hand");
    // A plain merge would drop the added seeds: refused, naming the flags.
    let (ok, err) = merge(&[]);
    assert!(!ok && err.trim().lines().count() == 1 && err.contains("--until-settled --max-seeds 5"), "{err}");
    assert_eq!(untimed(&shards).len(), 10);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn the_second_scale_settles_on_its_own_pilot_and_its_pilot_pass_trains_only_the_recipes_seeds() {
    let dir = scratch("settle-second");
    let text = |delta: f64| recipe_text(&dir, delta) + "scale_check:\n  transformer.d_model: 8\n";
    // Targets: each scale from its own pilot rows, so a narrow spread at the second scale asks for fewer.
    let recipe = parse(&text(0.01), "settle.yaml", "settle", false).unwrap();
    let csvs = dir.join("csvs");
    write_pilot(&csvs, [2.0, 2.1, 1.9], [-0.018, 0.002, 0.022]);
    write_pilot(&csvs.join("scale_check"), [2.0, 2.1, 1.9], [-0.009, 0.001, 0.011]);
    let results = Results::open(&csvs, &recipe, None).unwrap();
    let main = ablate::run::settle::targets(&results, 50).unwrap();
    let second = ablate::run::settle::second_scale_targets(&results, 50).unwrap();
    assert_eq!(second["heads=1"], ablate::design::Planner::new(3, 50, 0.05).target(0.01, 0.01));
    assert!(main["heads=1"] > second["heads=1"], "{main:?} {second:?}");
    let main_only = dir.join("main-only");
    write_pilot(&main_only, [2.0, 2.1, 1.9], [-0.018, 0.002, 0.022]);
    let before_its_pilot = Results::open(&main_only, &recipe, None).unwrap();
    assert!(ablate::run::settle::second_scale_targets(&before_its_pilot, 50).unwrap().is_empty());

    // A δ so wide that three seeds settle every comparison: each scale still gets the two added seeds its
    // second stage is tested on, and no more.
    let path = dir.join("settle.yaml");
    std::fs::write(&path, text(10.0).replace("test_accuracy: 0.5", "test_accuracy: 10.0")).unwrap();
    let out = dir.join("wide");
    let args = |out: &Path| {
        [
            path.to_str().unwrap(),
            "--out",
            out.to_str().unwrap(),
            "--device",
            "cpu",
            "--until-settled",
            "--max-seeds",
            "6",
        ]
        .map(String::from)
    };
    let (ok, err) = ablate(&args(&out).iter().map(String::as_str).collect::<Vec<_>>());
    assert!(ok, "{err}");
    let seeds = |csv: &Path| -> Vec<u64> {
        let mut s: Vec<u64> = ablate::judge::reading::reported_runs(csv.parent().unwrap())
            .unwrap()
            .iter()
            .map(|r| r["seed"].parse().unwrap())
            .collect();
        s.sort();
        s.dedup();
        s
    };
    assert_eq!(seeds(&out.join("runs.csv")), [0, 1, 2, 3, 4], "{err}");
    assert_eq!(seeds(&out.join("scale_check/runs.csv")), [0, 1, 2, 3, 4], "{err}");
    // δ tiny: both scales raised above the floor, up to the cap (a spread of exactly 0, as when the two arms
    // train identically at this size, plans the floor: nothing to plan from).
    std::fs::write(&path, text(1e-6)).unwrap();
    let out = dir.join("tiny");
    let (ok, err) = ablate(&args(&out).iter().map(String::as_str).collect::<Vec<_>>());
    assert!(ok, "{err}");
    for csv in [out.join("runs.csv"), out.join("scale_check/runs.csv")] {
        let s = seeds(&csv);
        assert!(s.len() >= 5 && s.len() <= 6 && s[..5] == [0, 1, 2, 3, 4], "{s:?} {err}");
    }
    assert!(err.contains("(second scale): "), "{err}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
/// The worker-pool comparison's cell rule: a float32 summation-order difference in the last printed digit
/// agrees; a different number, column or label does not.
fn rows_agree_up_to_the_last_float32_digit_and_no_further() {
    let cell = |k: &str, v: &str| (k.to_string(), v.to_string());
    assert!(same_cell(&cell("test_perplexity", "5.430926"), &cell("test_perplexity", "5.430925")));
    assert!(same_cell(&cell("variant", "a"), &cell("variant", "a")));
    assert!(!same_cell(&cell("test_perplexity", "5.430926"), &cell("test_perplexity", "5.4310")));
    assert!(!same_cell(&cell("test_loss", "0.5"), &cell("test_accuracy", "0.5")));
    assert!(!same_cell(&cell("variant", "a"), &cell("variant", "b")));
}

/// A detail column (the test loss at k× the block) is judged once the recipe's `compare` names it, and
/// only then: naming it is the recipe asking for a verdict on it.
#[test]
fn a_detail_metric_named_by_compare_is_judged() {
    let base = "kind: lm\ntransformer: {d_model: 16, layers: 1, heads: 2, block_size: 16}\ntrain: {eval_lengths: [2, 8]}\nsweep:\n  transformer.pe: [alibi, rope]\nseeds: [0, 1]\ncompare:\n  baseline: pe=alibi\n";
    let judged = |text: &str| -> Vec<String> {
        let recipe = parse(text, "le.yaml", "le", false).unwrap();
        ablate::judge::summary::check_compare(&recipe).unwrap();
        ablate::tasks::recipe_metrics(&recipe)
            .iter()
            .filter(|m| m.headline)
            .filter_map(|m| m.column_name().map(String::from))
            .filter(|c| c.starts_with("test_loss_x"))
            .collect()
    };
    assert!(judged(base).is_empty(), "a detail column stays out of the verdicts unless named");
    let predicted = format!(
        "{base}  predict:\n    - {{comparison: pe=rope, metric: test_loss_x8, expect: worse, source: a paper, role: control}}\n"
    );
    assert_eq!(judged(&predicted), ["test_loss_x8"]);
    assert_eq!(judged(&format!("{base}  primary: test_loss_x2\n")), ["test_loss_x2"]);
    assert_eq!(judged(&format!("{base}  delta: {{test_loss_x8: 0.1}}\n")), ["test_loss_x8"]);
    let labels: Vec<&str> = ablate::tasks::recipe_metrics(&parse(base, "le.yaml", "le", false).unwrap())
        .iter()
        .filter(|m| m.column_name().is_some_and(|c| c.starts_with("test_loss_x")))
        .map(|m| m.label)
        .collect();
    assert_eq!(labels, ["test loss at 2× the block", "test loss at 8× the block"]);
}

/// An interaction (a prediction's `versus:`): the verdict block judges (A − A's reference) − (B − B's
/// reference) per seed of the recipe's own, hand-computed here: contrasts 0.40, 0.43, 0.37 (mean 0.40, sd
/// 0.03, t = 23.1 on 2 degrees of freedom, interval 0.40 ± 4.303 · 0.03/√3 = [0.3255, 0.4745]), worse by
/// more than δ = 0.1; a seed outside the recipe's (added for the plain comparisons) is left out. A `versus`
/// that names no variant is refused in one line.
#[test]
fn an_interaction_is_judged_on_the_contrast_of_two_comparisons() {
    let dir = scratch("interaction");
    let data = dir.join("corpus.txt");
    std::fs::write(&data, "to be or not to be, that is the question. ".repeat(80)).unwrap();
    let text = |versus: &str| {
        format!(
            "kind: lm\ntransformer: {{d_model: 16, block_size: 16}}\ndata: {{path: {}}}\nsweep:\n  transformer.heads: [1, 2]\n  transformer.layers: [1, 2]\nseeds: [0, 1, 2]\ncompare:\n  baseline: heads=1\n  delta: {{test_loss: 0.1}}\n  predict:\n    - {{comparison: heads=2 layers=2, versus: {versus}, metric: test_loss, expect: worse_beyond_delta, source: a paper, role: control}}\n",
            data.display()
        )
    };
    let recipe = parse(&text("heads=2 layers=1"), "i.yaml", "i", false).unwrap();
    ablate::judge::summary::check_compare(&recipe).unwrap();
    let mut csv = String::from(
        "run_id,label,seed,config_hash,status,transformer.heads,transformer.layers,test_loss,test_accuracy\n",
    );
    let (effect_1, effect_2) = ([0.10, 0.12, 0.08, 0.0], [0.50, 0.55, 0.45, -5.0]);
    for seed in 0..4 {
        let base = 2.0 + 0.1 * seed as f64;
        for (layers, effect) in [(1, effect_1[seed]), (2, effect_2[seed])] {
            for (heads, loss) in [(1, base + layers as f64), (2, base + layers as f64 + effect)] {
                csv.push_str(&format!(
                    "transformer.heads={heads} transformer.layers={layers} seed={seed},heads={heads} layers={layers},{seed},x,ok,{heads},{layers},{loss},0.5\n"
                ));
            }
        }
    }
    let out = dir.join("out");
    std::fs::create_dir_all(&out).unwrap();
    std::fs::write(out.join("runs.csv"), csv).unwrap();
    let block = ablate::judge::verdicts::block(&Results::open(&out, &recipe, None).unwrap(), "test").unwrap();
    let row = block
        .lines()
        .find(|l| l.starts_with("| (heads=2 layers=2 − heads=1 layers=2) − (heads=2 layers=1 − heads=1 layers=1) |"))
        .unwrap_or_else(|| panic!("{block}"));
    assert!(row.contains("| interaction | +0.4000 [+0.3255, +0.4745] |"), "{row}");
    assert!(row.ends_with("| worse, by more than 0.1 |"), "{row}");
    let predicted = block.lines().find(|l| l.contains("(interaction) | control |")).unwrap();
    assert!(
        predicted.ends_with("| reproduced (post hoc: not the prediction these results ran against) |"),
        "{predicted}"
    );
    let bad = parse(&text("heads=3 layers=1"), "i.yaml", "i", false).unwrap();
    let err = ablate::judge::summary::check_compare(&bad).unwrap_err().to_string();
    assert!(
        err.contains("compare.predict.0.versus: no variant `heads=3 layers=1`") && err.lines().count() == 1,
        "{err}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// `compare.sensitivity` names a swept key of at least three numeric levels, or the recipe is refused in
/// one line before anything trains.
#[test]
fn a_sensitivity_names_a_swept_numeric_key() {
    let dir = scratch("sensitivity");
    let text = |sweep: &str, key: &str| {
        format!(
            "kind: lm\ntransformer: {{d_model: 16, block_size: 16}}\nsweep:\n{sweep}seeds: [0, 1]\ncompare:\n  baseline: heads=1\n  sensitivity: {key}\n"
        )
    };
    let grid = "  transformer.heads: [1, 2]\n  train.lr: [0.001, 0.01, 0.1]\n";
    for (sweep, key, expected) in [
        (grid, "train.steps", "compare.sensitivity: `train.steps` is not a swept key"),
        (
            "  transformer.heads: [1, 2]\n  train.lr: [0.001, 0.01]\n",
            "lr",
            "has 2 level(s); a sensitivity needs at least 3",
        ),
    ] {
        let recipe = parse(&text(sweep, key), "s.yaml", "s", false).unwrap();
        let err = ablate::judge::summary::check_compare(&recipe).unwrap_err().to_string();
        assert!(err.contains(expected) && err.lines().count() == 1, "{err}");
    }
    for key in ["train.lr", "lr"] {
        ablate::judge::summary::check_compare(&parse(&text(grid, key), "s.yaml", "s", false).unwrap()).unwrap();
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// The sensitivity section of a verdict block, by hand on a fixture: every run of `runs.csv` counts, a
/// second stage's seed (2, not among the recipe's 0 and 1) included; a run above its step-0 loss (5.0
/// against 4.0) and a diverged one (no test loss) count as that loss. Arm heads=1: level means 2.1, 1.9 and
/// (4 + 4 + 3.4)/3 = 3.8, best 1e-2, sensitivity (0.2 + 0 + 1.9)/3 = 0.7; the interval from SciPy's
/// `stats.t.ppf(0.975, 3.5901)` on the variance terms (1/9, 4/9, 1/9) · s²/3: [0.4694, 0.9306]. Arm heads=2
/// is flat (every level 2.0): 0, and −0.7 against heads=1.
#[test]
fn the_sensitivity_section_reads_every_run_and_caps_at_the_initial_loss() {
    let dir = scratch("sensitivity-section");
    let text = "kind: lm\ntransformer: {d_model: 16, block_size: 16}\nsweep:\n  transformer.heads: [1, 2]\n  train.lr: [0.001, 0.01, 0.1]\nseeds: [0, 1]\ncompare:\n  baseline: heads=1\n  sensitivity: train.lr\n";
    let recipe = parse(text, "s.yaml", "s", false).unwrap();
    let losses = |heads: u32, lr: &str| -> [&str; 3] {
        match (heads, lr) {
            (1, "0.001") => ["2.0", "2.2", "2.1"],
            (1, "0.01") => ["1.8", "1.9", "2.0"],
            (1, _) => ["5.0", "", "3.4"],
            _ => ["2.0", "2.0", "2.0"],
        }
    };
    let (mut runs, mut curves) = (
        String::from("run_id,label,seed,config_hash,status,transformer.heads,train.lr,test_loss,test_accuracy\n"),
        String::from("run_id,step,split,metric,value\n"),
    );
    for heads in [1, 2] {
        for lr in ["0.001", "0.01", "0.1"] {
            for (seed, loss) in losses(heads, lr).iter().enumerate() {
                let id = format!("transformer.heads={heads} train.lr={lr} seed={seed}");
                let status = if loss.is_empty() { "diverged at step 3" } else { "ok" };
                runs.push_str(&format!("{id},heads={heads} lr={lr},{seed},x,{status},{heads},{lr},{loss},0.5\n"));
                curves.push_str(&format!("{id},0,val,loss,4.0\n"));
            }
        }
    }
    let out = dir.join("out");
    std::fs::create_dir_all(&out).unwrap();
    std::fs::write(out.join("runs.csv"), runs).unwrap();
    std::fs::write(out.join("curves.csv"), curves).unwrap();
    let section = ablate::judge::sensitivity::section(&Results::open(&out, &recipe, None).unwrap(), "test_loss")
        .unwrap()
        .unwrap();
    assert!(section.contains("| heads=1 | 3 (9) | lr=0.01 | 1.9000 | 0.7000 [0.4694, 0.9306] |"), "{section}");
    assert!(section.contains("| heads=2 | 3 (9) | lr=0.001 | 2.0000 | 0.0000 [0.0000, 0.0000] |"), "{section}");
    assert!(section.contains("| heads=2 | -0.7000 [-0.9306, -0.4694] |"), "{section}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// A fixed design written as `max_seeds` equal to the recipe's seeds stays valid when `--smoke` keeps two of
/// them: the plan is checked against the recipe's seeds (the smoke run of recipes/mup_transfer.yaml).
#[test]
fn a_fixed_design_survives_the_smoke_runs_fewer_seeds() {
    let text = "kind: lm\ntransformer: {d_model: 16, block_size: 16}\nsweep:\n  transformer.heads: [1, 2]\nseeds: [0, 1, 2]\ncompare:\n  baseline: heads=1\n  max_seeds: 3\n";
    let full = parse(text, "f.yaml", "f", false).unwrap();
    assert_eq!(full.seeds.len(), 3);
    let smoke = parse(text, "f.yaml", "f", true).unwrap();
    assert_eq!(smoke.seeds.len(), 2);
    assert!(!smoke.compare.as_ref().unwrap().two_stage(smoke.seeds.len()), "a smoke run adds no second stage");
    let wrong = text.replace("max_seeds: 3", "max_seeds: 4");
    let err = parse(&wrong, "f.yaml", "f", true).unwrap_err().to_string();
    assert!(err.contains("compare.max_seeds: 4 seeds per arm is not a plan for 3 seeds"), "{err}");
}

/// A directory trained by shards (a worker pool) is first recorded at the merge, after its pilot: its plan is
/// the one a shard recorded when it started training pilot seeds, never one recorded by a shard that only
/// added seeds later (that was no evidence the plan came before the pilot), and the verdict block says so.
#[test]
fn a_sharded_pilot_keeps_the_plan_its_shards_recorded() {
    use ablate::run::results::write_resolved;
    let dir = scratch("settle-shard-plan");
    let recipe = parse(&recipe_text(&dir, 0.01), "settle.yaml", "settle", false).unwrap();
    for (shard, seed_offset) in [("0-of-2", 0), ("1-of-2", 0)] {
        let shard_dir = dir.join("merged").join("shards").join(shard);
        std::fs::create_dir_all(&shard_dir).unwrap();
        // Each shard records its plan when it starts (no runs yet), then trains pilot seeds.
        write_resolved(&recipe, &shard_dir.join("recipe.resolved.yaml")).unwrap();
        write_pilot(&shard_dir, [2.0, 2.1, 1.9], [0.01 + seed_offset as f64, 0.0, 0.0]);
    }
    let merged = dir.join("merged");
    write_pilot(&merged, [2.0, 2.1, 1.9], [0.01, 0.0, 0.0]);
    write_resolved(&recipe, &merged.join("recipe.resolved.yaml")).unwrap();
    assert!(ablate::judge::reading::recorded(&merged).pilot_plan.is_some(), "the shards' pilot plan was not taken");
    let block = ablate::judge::verdicts::block(&Results::open(&merged, &recipe, None).unwrap(), "test").unwrap();
    assert!(block.contains("fixed before the pilot"), "{block}");
    // Shards that trained only added seeds (5 and 6): their record is not the pilot's.
    let late = dir.join("late");
    let shard_dir = late.join("shards").join("0-of-2");
    std::fs::create_dir_all(&shard_dir).unwrap();
    write_resolved(&recipe, &shard_dir.join("recipe.resolved.yaml")).unwrap();
    let added = "run_id,label,seed,config_hash,status,transformer.heads,test_loss,test_accuracy\n\
                 a,heads=1,5,x,ok,1,2.0,0.5\nb,heads=2,6,x,ok,2,2.0,0.5\n";
    std::fs::write(shard_dir.join("runs.csv"), added).unwrap();
    write_pilot(&late, [2.0, 2.1, 1.9], [0.01, 0.0, 0.0]);
    write_resolved(&recipe, &late.join("recipe.resolved.yaml")).unwrap();
    assert!(ablate::judge::reading::recorded(&late).pilot_plan.is_none());
}
