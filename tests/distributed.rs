//! Data-parallel training on libtorch's c10d (Gloo on the CPU), with real processes on loopback: two ranks
//! with batch B train exactly as one process with batch 2B; a killed rank ends the other with a clear error;
//! ranks with different recipes are refused; a stopped run resumes exactly, and only on as many processes;
//! torchrun launches it.
mod common;

use common::scratch;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

/// A copy-task decoder without dropout (dropout masks are each rank's own draw, so they cannot match one
/// process's), evaluated every 25 steps, logging the loss at every step, saving its weights.
fn write_recipe(dir: &Path, steps: i64, batch: i64, every: Option<i64>) -> PathBuf {
    let path = dir.join("ddp.yaml");
    let checkpoint_every = every.map(|e| format!("  checkpoint_every: {e}\n")).unwrap_or_default();
    std::fs::write(
        &path,
        format!(
            "name: ddp\nkind: lm\ndata:\n  task: copy\ntransformer:\n  d_model: 32\n  layers: 2\n  heads: 2\n  \
             block_size: 32\n  dropout: 0.0\ntrain:\n  steps: {steps}\n  batch_size: {batch}\n  warmup_steps: 5\n  \
             eval_interval: 25\n  eval_batches: 4\n  log_interval: 1\n  checkpoint: true\n{checkpoint_every}"
        ),
    )
    .unwrap();
    path
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

fn ablate(recipe: &Path, out: &Path) -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_ablate"));
    cmd.arg(recipe).arg("--out").arg(out).arg("--device").arg("cpu").arg("--quiet");
    cmd
}

/// `world` ranks as torchrun would start them (its environment, without its agent), each with `extra`
/// arguments of its own.
fn spawn_ranks(recipe: &Path, out: &Path, world: usize, extra: &[&[&str]]) -> Vec<Child> {
    let port = free_port().to_string();
    (0..world)
        .map(|rank| {
            let mut cmd = ablate(recipe, out);
            cmd.args(extra.get(rank).copied().unwrap_or(&[]))
                .env("RANK", rank.to_string())
                .env("LOCAL_RANK", rank.to_string())
                .env("WORLD_SIZE", world.to_string())
                .env("MASTER_ADDR", "127.0.0.1")
                .env("MASTER_PORT", &port)
                .env("OMP_NUM_THREADS", "1")
                .env("ABLATE_DIST_TIMEOUT", "60")
                .stdout(Stdio::piped())
                .stderr(Stdio::piped());
            cmd.spawn().unwrap()
        })
        .collect()
}

/// Waits for every child, killing all if any is still running at `deadline` (then fails).
fn wait_all(children: Vec<Child>, deadline: Duration) -> Vec<Output> {
    let start = Instant::now();
    let mut children = children;
    loop {
        if children.iter_mut().all(|c| c.try_wait().unwrap().is_some()) {
            return children.into_iter().map(|c| c.wait_with_output().unwrap()).collect();
        }
        if start.elapsed() > deadline {
            for c in children.iter_mut() {
                let _ = c.kill();
            }
            panic!("ranks still running after {deadline:?}: a hang");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// Every curve point of a results directory: (step, split, metric) → value.
fn curves(out: &Path) -> BTreeMap<(i64, String, String), f64> {
    let mut reader = csv::Reader::from_path(out.join("curves.csv")).unwrap();
    reader
        .deserialize::<BTreeMap<String, String>>()
        .map(|r| {
            let r = r.unwrap();
            ((r["step"].parse().unwrap(), r["split"].clone(), r["metric"].clone()), r["value"].parse().unwrap())
        })
        .collect()
}

fn weights(out: &Path) -> Vec<(String, tch::Tensor)> {
    let mut w = tch::Tensor::read_safetensors(out.join("checkpoints/seed=0.safetensors")).unwrap();
    w.sort_by(|a, b| a.0.cmp(&b.0));
    w
}

/// The largest relative difference between two sets of curves over the metrics they share (at least one).
fn worst_relative_difference(
    a: &BTreeMap<(i64, String, String), f64>,
    b: &BTreeMap<(i64, String, String), f64>,
    metrics: &[&str],
) -> f64 {
    let mut worst: f64 = 0.0;
    let mut compared = 0;
    for (key, x) in a {
        if metrics.contains(&key.2.as_str()) {
            let y = b.get(key).unwrap_or_else(|| panic!("{key:?} missing"));
            worst = worst.max((x - y).abs() / x.abs().max(1e-12));
            compared += 1;
        }
    }
    assert!(compared > 50, "only {compared} points compared");
    worst
}

#[test]
fn two_ranks_with_batch_b_train_as_one_process_with_batch_2b() {
    let dir = scratch("ddp-equivalence");
    let recipe = write_recipe(&dir, 50, 8, None);
    let one = dir.join("one");
    let status = ablate(&recipe, &one).arg("train.batch_size=16").status().unwrap();
    assert!(status.success());
    let two = dir.join("two");
    let outputs = wait_all(spawn_ranks(&recipe, &two, 2, &[]), Duration::from_secs(120));
    for o in &outputs {
        assert!(o.status.success(), "{}", stderr(o));
    }
    // Both see the same rows of every step (rank r keeps rows r·B..(r+1)·B of the global batch drawn from
    // the shared (seed, step) generator) and evaluate the same held-out batches split between them, so the
    // only difference is float32 summation order: the mean of two half-batch means against one mean, and
    // Gloo's sum of the two gradients. Measured here: at most 4e-6 relative over every curve point; the
    // tolerance is 25 times that, while a single different row of a batch moves the loss by ~1e-2.
    let (a, b) = (curves(&one), curves(&two));
    let worst = worst_relative_difference(&a, &b, &["loss", "accuracy", "grad_norm"]);
    assert!(worst < 1e-4, "curves differ by {worst:e} relative");
    let (wa, wb) = (weights(&one), weights(&two));
    assert_eq!(wa.len(), wb.len());
    for ((na, ta), (nb, tb)) in wa.iter().zip(&wb) {
        assert_eq!(na, nb);
        let diff = (ta - tb).abs().max().double_value(&[]);
        assert!(diff < 1e-4, "{na} differs by {diff}");
    }
    // The run records the launch: per-rank and global batch, processes, the communication share.
    let runs = ablate::judge::reading::reported_runs(&two).unwrap();
    let row = &runs[0];
    assert_eq!(row["train.batch_size"], "8");
    assert_eq!(row["train.world_size"], "2");
    assert_eq!(row["global_batch"], "16");
    let share: f64 = row["comm_share"].parse().unwrap();
    assert!(share > 0.0 && share < 1.0, "comm_share {share}");
    // A single process records neither column; rank 1 wrote nothing and said nothing.
    let single = ablate::judge::reading::reported_runs(&one).unwrap();
    assert!(!single[0].contains_key("train.world_size") && !single[0].contains_key("comm_share"));
    assert_eq!(stderr(&outputs[1]), "");
}

#[test]
fn a_killed_rank_ends_the_other_with_a_clear_error_instead_of_a_hang() {
    let dir = scratch("ddp-kill");
    let recipe = write_recipe(&dir, 1_000_000, 8, None);
    let out = dir.join("out");
    let mut ranks = spawn_ranks(&recipe, &out, 2, &[]);
    // Training has started once rank 0 wrote the resolved recipe (after the rendezvous and the checks).
    let start = Instant::now();
    while !out.join("recipe.resolved.yaml").exists() {
        assert!(start.elapsed() < Duration::from_secs(60), "rank 0 never started");
        std::thread::sleep(Duration::from_millis(50));
    }
    std::thread::sleep(Duration::from_millis(500));
    ranks[1].kill().unwrap();
    let killed = Instant::now();
    let rank0 = ranks.remove(0);
    let outputs = wait_all(vec![rank0], Duration::from_secs(90));
    let log = stderr(&outputs[0]);
    assert_eq!(outputs[0].status.code(), Some(2), "{log}");
    // Gloo sees the closed connection at the next all-reduce, a step's or (on a loaded machine, where the
    // kill can land before step 1) the validation's at step 0: one line naming the step, the rank and the
    // collective.
    let line = log.lines().last().unwrap();
    assert!(line.starts_with("ablate (rank 0 of 2): error: run `seed=0`: step "), "{line}");
    assert!(line.contains("all-reduce across 2 ranks"), "{line}");
    assert_eq!(log.lines().filter(|l| l.contains("error")).count(), 1, "{log}");
    eprintln!("rank 0 ended {:?} after rank 1 was killed", killed.elapsed());
    // Nothing half-written: no runs.csv row for the unfinished run.
    assert!(!out.join("runs.csv").exists());
}

#[test]
fn ranks_with_different_recipes_or_a_lone_process_with_a_world_size_are_refused() {
    let dir = scratch("ddp-mismatch");
    let recipe = write_recipe(&dir, 20, 4, None);
    let out = dir.join("out");
    let outputs = wait_all(spawn_ranks(&recipe, &out, 2, &[&[], &["train.lr=0.002"]]), Duration::from_secs(60));
    for o in &outputs {
        assert_eq!(o.status.code(), Some(2));
        let line = stderr(o).lines().last().unwrap().to_string();
        assert!(line.contains("rank 1 has a different recipe (its runs and their configs) than rank 0"), "{line}");
    }
    assert!(!out.join("runs.csv").exists() && !out.join("recipe.resolved.yaml").exists());
    // The recipe names two processes; one was started.
    let lone = ablate(&recipe, &out).arg("train.world_size=2").output().unwrap();
    assert_eq!(lone.status.code(), Some(2));
    let line = stderr(&lone);
    assert!(line.contains("has train.world_size 2, but this process was launched alone"), "{line}");
}

#[test]
fn a_stopped_data_parallel_run_resumes_exactly_and_only_on_as_many_processes() {
    let dir = scratch("ddp-resume");
    let recipe = write_recipe(&dir, 400, 8, Some(1_000_000));
    let reference = dir.join("reference");
    for o in wait_all(spawn_ranks(&recipe, &reference, 2, &[]), Duration::from_secs(180)) {
        assert!(o.status.success(), "{}", stderr(&o));
    }
    // SIGTERM to rank 1 only: the stop flag rides in the all-reduce, so both stop after the same step and
    // rank 0 saves the state.
    let out = dir.join("out");
    let ranks = spawn_ranks(&recipe, &out, 2, &[]);
    let start = Instant::now();
    while !out.join("recipe.resolved.yaml").exists() {
        assert!(start.elapsed() < Duration::from_secs(60), "rank 0 never started");
        std::thread::sleep(Duration::from_millis(20));
    }
    std::thread::sleep(Duration::from_millis(300));
    // SAFETY: sending a signal to a child process this test started and still owns.
    unsafe { libc::kill(ranks[1].id() as i32, libc::SIGTERM) };
    let stopped = wait_all(ranks, Duration::from_secs(90));
    for o in &stopped {
        assert_eq!(o.status.code(), Some(75), "{}", stderr(o));
    }
    let state = out.join("checkpoints/seed=0.state.safetensors");
    assert!(state.exists());
    // One process cannot continue it: that would change the global batch.
    let lone = ablate(&recipe, &out).output().unwrap();
    assert_eq!(lone.status.code(), Some(2));
    let line = stderr(&lone);
    assert!(line.contains("was saved by a run on 2 processes, and this launch has 1"), "{line}");
    // Two continue it and end where the undisturbed run ended.
    for o in wait_all(spawn_ranks(&recipe, &out, 2, &[]), Duration::from_secs(180)) {
        assert!(o.status.success(), "{}", stderr(&o));
    }
    assert_eq!(curves(&out), curves(&reference));
    let (wa, wb) = (weights(&out), weights(&reference));
    for ((na, ta), (_, tb)) in wa.iter().zip(&wb) {
        assert!(ta.equal(tb), "{na} differs after resuming");
    }
}

#[test]
fn torchrun_launches_ablate_as_its_workers() {
    let site = std::env::var("ABLATE_TORCH_PYTHONPATH")
        .ok()
        .or_else(|| std::env::var("LIBTORCH").ok().map(|l| format!("{l}/..")))
        .expect("ABLATE_TORCH_PYTHONPATH or LIBTORCH names the torch wheel (bin/test sets both)");
    let dir = scratch("ddp-torchrun");
    let recipe = write_recipe(&dir, 20, 4, None);
    let out = dir.join("out");
    let child = Command::new("python3")
        .args(["-m", "torch.distributed.run", "--no-python", "--nproc-per-node", "2", "--master-port"])
        .arg(free_port().to_string())
        .arg(env!("CARGO_BIN_EXE_ablate"))
        .arg(&recipe)
        .args(["--device", "cpu", "--quiet", "--out"])
        .arg(&out)
        .env("PYTHONPATH", site)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let o = &wait_all(vec![child], Duration::from_secs(180))[0];
    assert!(o.status.success(), "{}", stderr(o));
    let runs = ablate::judge::reading::reported_runs(&out).unwrap();
    assert_eq!(runs.len(), 1);
    assert_eq!(runs[0]["train.world_size"], "2");
    assert_eq!(runs[0]["global_batch"], "8");
}

/// A tuned recipe trains its rungs and final runs on two ranks: rank 0 tells the other each pass's runs,
/// and the result is that of one process with twice the batch (the same choices, the same losses).
#[test]
fn a_tuned_recipe_trains_both_phases_data_parallel_as_one_process_with_twice_the_batch() {
    let dir = scratch("ddp-tune");
    let tuned = |steps, batch| {
        let path = write_recipe(&dir, steps, batch, None);
        let text = std::fs::read_to_string(&path).unwrap().replace("  checkpoint: true\n", "");
        let text = format!("{text}seeds: [0]\ntune:\n  keys:\n    train.lr: [1.0e-7, 3.0e-3]\n  seeds: [5]\n");
        std::fs::write(&path, text).unwrap();
        path
    };
    let recipe = tuned(30, 4);
    let out = dir.join("ranks");
    for o in wait_all(spawn_ranks(&recipe, &out, 2, &[]), Duration::from_secs(180)) {
        assert!(o.status.success(), "{}", stderr(&o));
    }
    let single = dir.join("single");
    let recipe = tuned(30, 8);
    let one = ablate(&recipe, &single).env("OMP_NUM_THREADS", "1").output().unwrap();
    assert!(one.status.success(), "{}", stderr(&one));
    let rows = |d: &Path| {
        ablate::judge::reading::all_runs(d)
            .unwrap()
            .into_iter()
            .map(|r| (r["run_id"].clone(), r["phase"].clone(), r["train.lr"].clone(), r["test_loss"].clone()))
            .collect::<Vec<_>>()
    };
    let (two, one) = (rows(&out), rows(&single));
    assert_eq!(two.len(), 3, "two tuning runs and one final: {two:?}");
    assert_eq!(two[2].2, "0.003", "{two:?}");
    let who = |rows: &[(String, String, String, String)]| -> Vec<(String, String, String)> {
        rows.iter().map(|r| (r.0.clone(), r.1.clone(), r.2.clone())).collect()
    };
    assert_eq!(who(&two), who(&one));
    for (a, b) in two.iter().zip(&one) {
        let (a, b): (f64, f64) = (a.3.parse().unwrap_or(f64::NAN), b.3.parse().unwrap_or(f64::NAN));
        assert!((a - b).abs() < 1e-3 || (a.is_nan() && b.is_nan()), "{two:?} against {one:?}");
    }
}
