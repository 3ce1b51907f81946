//! Scaling out: shards, the local worker pool and the Slurm scripts give the results of one process.
mod common;

use ablate::recipe::parse;
use ablate::run::scale::{merge, write_slurm_data_parallel_script, write_slurm_scripts, Shard, SlurmPlan};
use ablate::run::sweep::{run_recipe, SweepOptions};
use common::{runs_without_timings, scratch};
use std::path::Path;
use std::process::Command;
use tch::Device;

fn recipe_text(dir: &Path) -> String {
    let data = dir.join("corpus.txt");
    std::fs::write(&data, "to be or not to be, that is the question. ".repeat(60)).unwrap();
    format!(
        "kind: lm\ntransformer:\n  d_model: 16\n  layers: 1\n  block_size: 16\ndata:\n  path: {}\ntrain:\n  steps: 8\n  batch_size: 4\n  \
         eval_interval: 4\n  eval_batches: 2\n  log_interval: 2\nsweep:\n  transformer.heads: [1, 2, 4]\nseeds: [0, 1]\n",
        data.display()
    )
}

#[test]
fn shards_merged_in_any_order_equal_a_single_run() {
    // Trains in this process: libtorch's one generator must not be shared with the other such test.
    let _serial = common::serial();
    let dir = scratch("shards");
    let recipe = parse(&recipe_text(&dir), "shards.yaml", "shards", false).unwrap();
    let single = dir.join("single");
    let opts = |out, shard| SweepOptions { out, device: Device::Cpu, force: false, quiet: true, shard };
    run_recipe(&recipe, &opts(&single, None)).unwrap();

    let sharded = dir.join("sharded");
    // Shard 2 first, then merge early: a partial merge reports what is missing and keeps recipe order.
    run_recipe(&recipe, &opts(&sharded, Some(Shard { index: 2, count: 3 }))).unwrap();
    assert_eq!(merge(&recipe, &sharded, true).unwrap(), (2, 4));
    for index in [0, 1] {
        run_recipe(&recipe, &opts(&sharded, Some(Shard { index, count: 3 }))).unwrap();
    }
    assert_eq!(merge(&recipe, &sharded, true).unwrap(), (6, 0));
    assert_eq!(runs_without_timings(&sharded), runs_without_timings(&single));
    for f in ["curves.csv", "samples.txt"] {
        assert_eq!(std::fs::read_to_string(sharded.join(f)).unwrap(), std::fs::read_to_string(single.join(f)).unwrap());
    }
    assert!(sharded.join("val_loss.png").exists());
    // Merging again changes nothing; a shard re-run trains nothing already merged.
    assert_eq!(merge(&recipe, &sharded, true).unwrap(), (6, 0));
    let before = std::fs::read_to_string(sharded.join("shards/0-of-3/runs.csv")).unwrap();
    run_recipe(&recipe, &opts(&sharded, Some(Shard { index: 0, count: 3 }))).unwrap();
    assert_eq!(std::fs::read_to_string(sharded.join("shards/0-of-3/runs.csv")).unwrap(), before);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_pool_of_cpu_workers_writes_what_one_process_writes() {
    let dir = scratch("workers");
    let recipe = dir.join("pool.yaml");
    std::fs::write(&recipe, recipe_text(&dir)).unwrap();
    let run = |out: &str, extra: &[&str]| {
        let status = Command::new(env!("CARGO_BIN_EXE_ablate"))
            .arg(&recipe)
            .args(["--device", "cpu", "--quiet", "--out"])
            .arg(dir.join(out))
            .args(extra)
            .status()
            .unwrap();
        assert!(status.success());
    };
    run("one", &["--threads", "1"]);
    run("pool", &["--devices", "cpu,cpu", "--threads", "1"]);
    assert_eq!(runs_without_timings(&dir.join("pool")), runs_without_timings(&dir.join("one")));
    assert!(dir.join("pool/shards/1-of-2/runs.csv").exists());
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_cpu_worker_takes_the_cores_a_finished_worker_leaves_and_trains_the_same() {
    let cores = std::thread::available_parallelism().unwrap().get();
    if cores < 2 {
        eprintln!("skipped: one core, nothing to hand over");
        return;
    }
    let dir = scratch("workers-share");
    let recipe = dir.join("share.yaml");
    // Round-robin gives worker 0 the first and the long third run, worker 1 the short second one: worker 1
    // is done while worker 0 has most of its long run ahead. The long run is seconds long on an idle fast
    // core (800 steps took 1.4 s, which a finishing worker's exit could outlast, and the hand-over was missed).
    let text = recipe_text(&dir).replace("transformer.heads: [1, 2, 4]", "train.steps: [8, 9, 4000]");
    std::fs::write(&recipe, text.replace("seeds: [0, 1]", "seeds: [0]")).unwrap();
    let run = |out: &str, extra: &[&str]| {
        let done = Command::new(env!("CARGO_BIN_EXE_ablate"))
            .arg(&recipe)
            .args(["--device", "cpu", "--threads", "1", "--out"])
            .arg(dir.join(out))
            .args(extra)
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&done.stderr).to_string();
        assert!(done.status.success(), "{stderr}");
        stderr
    };
    run("one", &["--quiet"]);
    let pool = run("pool", &["--devices", "cpu,cpu"]);
    let handed = pool
        .lines()
        .find(|l| l.starts_with("[worker 0] ablate: a worker of the pool finished"))
        .unwrap_or_else(|| panic!("worker 0 never took worker 1's core:\n{pool}"));
    assert!(handed.contains("training on with 2 threads"), "{handed}");
    assert!(!pool.contains("[worker 1] ablate: a worker of the pool finished"), "{pool}");
    // Its numbers are those of one process with one thread; the hand-over files are gone.
    assert_eq!(runs_without_timings(&dir.join("pool")), runs_without_timings(&dir.join("one")));
    let left: Vec<_> = std::fs::read_dir(dir.join("pool/shards")).unwrap().map(|e| e.unwrap().file_name()).collect();
    assert_eq!(left.len(), 2, "{left:?}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn workers_auto_times_the_splits_of_the_cores_and_trains_what_one_process_trains() {
    let dir = scratch("workers-auto");
    let recipe = dir.join("auto.yaml");
    std::fs::write(&recipe, recipe_text(&dir)).unwrap();
    let one = Command::new(env!("CARGO_BIN_EXE_ablate"))
        .arg(&recipe)
        .args(["--device", "cpu", "--quiet", "--threads", "1", "--out"])
        .arg(dir.join("one"))
        .status()
        .unwrap();
    assert!(one.success());
    let auto = Command::new(env!("CARGO_BIN_EXE_ablate"))
        .arg(&recipe)
        .args(["--device", "cpu", "--workers", "auto", "--out"])
        .arg(dir.join("auto"))
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&auto.stderr);
    assert!(auto.status.success(), "{stderr}");
    // One line names every split it timed (1 worker with all the cores is always a candidate) and the choice.
    let cores = std::thread::available_parallelism().unwrap().get();
    let line = stderr.lines().find(|l| l.contains("--workers auto on")).expect("the probe's line");
    assert!(line.contains(&format!("1 x {cores} thread(s)")), "{line}");
    assert!(line.contains("tokens/s") && line.contains(" -> "), "{line}");
    assert_eq!(runs_without_timings(&dir.join("auto")), runs_without_timings(&dir.join("one")));
    // Not on a GPU: that is what --devices is for.
    let gpu = Command::new(env!("CARGO_BIN_EXE_ablate"))
        .arg(&recipe)
        .args(["--device", "cuda", "--workers", "auto", "--out"])
        .arg(dir.join("gpu"))
        .output()
        .unwrap();
    assert!(!gpu.status.success());
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn the_slurm_scripts_run_one_shard_per_array_task_then_merge() {
    let dir = scratch("slurm");
    let recipe = parse(&recipe_text(&dir), "s.yaml", "s", true).unwrap();
    let out = dir.join("out");
    let plan = SlurmPlan {
        recipe_path: &dir.join("s.yaml"),
        out: &out,
        shards: 4,
        smoke: true,
        device: "cuda",
        cpus_per_task: 8,
        gpus_per_task: 1,
        partition: Some("gpu"),
        time: Some("01:00:00"),
        until_settled: None,
    };
    let submit = write_slurm_scripts(&recipe, &plan).unwrap();
    let array = std::fs::read_to_string(out.join("slurm/array.sbatch")).unwrap();
    for needle in [
        "#SBATCH --array=0-3",
        "#SBATCH --cpus-per-task=8",
        "#SBATCH --gpus-per-task=1",
        "#SBATCH --partition=gpu",
        "#SBATCH --time=01:00:00",
        "--shard \"$SLURM_ARRAY_TASK_ID/4\"",
        "--device cuda",
        "--smoke",
    ] {
        assert!(array.contains(needle), "missing {needle} in\n{array}");
    }
    let merge = std::fs::read_to_string(out.join("slurm/merge.sbatch")).unwrap();
    assert!(merge.contains(" merge ") && merge.contains("--smoke"), "{merge}");
    let submit = std::fs::read_to_string(submit).unwrap();
    assert!(submit.contains("--dependency=afterok:"), "{submit}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn slurm_scripts_for_gpus_are_written_on_a_login_node_without_one() {
    // The submitting node often has no GPU: `--device cuda` is checked for its spelling only there.
    let dir = scratch("slurm-login");
    std::fs::write(dir.join("s.yaml"), recipe_text(&dir)).unwrap();
    let out = dir.join("out");
    let run = |device: &str| {
        Command::new(env!("CARGO_BIN_EXE_ablate"))
            .args(["slurm"])
            .arg(dir.join("s.yaml"))
            .args(["--smoke", "--shards", "2", "--gpus-per-task", "1", "--device", device, "--out"])
            .arg(&out)
            .output()
            .unwrap()
    };
    let ok = run("cuda");
    assert!(ok.status.success(), "{}", String::from_utf8_lossy(&ok.stderr));
    let array = std::fs::read_to_string(out.join("slurm/array.sbatch")).unwrap();
    assert!(array.contains("--device cuda") && array.contains("#SBATCH --gpus-per-task=1"), "{array}");
    let bad = run("gpu0");
    let err = String::from_utf8_lossy(&bad.stderr);
    assert!(!bad.status.success() && err.contains("--device gpu0: unknown device"), "{err}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn the_data_parallel_slurm_job_starts_every_rank_with_srun_and_requeues_when_stopped() {
    let dir = scratch("slurm-ddp");
    let text = recipe_text(&dir);
    let overrides = ablate::recipe::Overrides::parse(&["train.world_size=8".to_string()], &[], None).unwrap();
    std::fs::write(dir.join("s.yaml"), &text).unwrap();
    let recipe = ablate::recipe::load_with(&dir.join("s.yaml"), true, &overrides).unwrap();
    let out = dir.join("out");
    let plan = SlurmPlan {
        recipe_path: &dir.join("s.yaml"),
        out: &out,
        shards: 1,
        smoke: true,
        device: "cuda",
        cpus_per_task: 8,
        gpus_per_task: 1,
        partition: None,
        time: None,
        until_settled: None,
    };
    let submit = write_slurm_data_parallel_script(&recipe, &plan, 2, 4).unwrap();
    let job = std::fs::read_to_string(out.join("slurm/ddp.sbatch")).unwrap();
    for needle in [
        "#SBATCH --nodes=2",
        "#SBATCH --ntasks-per-node=4",
        "#SBATCH --gpus-per-task=1",
        "#SBATCH --signal=B:TERM@120",
        "srun --kill-on-bad-exit=1 ",
        "'train.world_size=8'",
        "--device cuda",
        "export MASTER_PORT=",
        "scontrol requeue \"$SLURM_JOB_ID\"",
    ] {
        assert!(job.contains(needle), "missing {needle} in\n{job}");
    }
    assert!(!job.contains("--shard"), "{job}");
    let submit = std::fs::read_to_string(submit).unwrap();
    assert!(submit.contains("sbatch --parsable ddp.sbatch"), "{submit}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_merge_over_a_directory_from_before_a_column_was_added_keeps_its_rows_under_the_wider_header() {
    // Trains in this process: libtorch's one generator must not be shared with the other such test.
    let _serial = common::serial();
    let dir = scratch("shards-widen");
    let recipe = parse(&recipe_text(&dir), "shards.yaml", "shards", false).unwrap();
    let out = dir.join("out");
    let opts = |out, shard| SweepOptions { out, device: Device::Cpu, force: false, quiet: true, shard };
    run_recipe(&recipe, &opts(&out, None)).unwrap();
    let single = runs_without_timings(&out);
    // The main directory as an older ablate wrote it: no params_non_embedding column, and its last two runs
    // unfinished.
    let runs = out.join("runs.csv");
    common::runs_csv_before_column(&runs, "params_non_embedding", 4);
    // The shards train those two under today's header; the merge widens the older rows.
    for index in 0..3 {
        run_recipe(&recipe, &opts(&out, Some(Shard { index, count: 3 }))).unwrap();
    }
    assert_eq!(merge(&recipe, &out, true).unwrap(), (6, 0));
    let merged = ablate::judge::reading::reported_runs(&out).unwrap();
    let filled: Vec<bool> = merged.iter().map(|r| !r["params_non_embedding"].is_empty()).collect();
    assert_eq!(
        filled.iter().filter(|&&f| f).count(),
        2,
        "the shard's rows fill the column, the older rows leave it empty"
    );
    let strip = |rows: Vec<Vec<(String, String)>>| -> Vec<Vec<(String, String)>> {
        rows.into_iter().map(|r| r.into_iter().filter(|(k, _)| k != "params_non_embedding").collect()).collect()
    };
    assert_eq!(strip(runs_without_timings(&out)), strip(single), "every other value kept");
    let _ = std::fs::remove_dir_all(&dir);
}
