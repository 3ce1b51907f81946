//! Faults made for real: a torn `runs.csv`, an unreadable state checkpoint, two processes on one directory,
//! SIGTERM, a disk that fills. Each loses nothing that finished, ends with the metrics of an undisturbed run,
//! and says what happened in one line.
mod common;

use common::{runs_without_timings, scratch};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// Two small runs on a text file, with state checkpoints every `every` steps (none but on a signal: `None`).
fn write_recipe(dir: &Path, steps: i64, every: Option<i64>) -> PathBuf {
    let every = every.map_or(String::new(), |k| format!("  checkpoint_every: {k}\n"));
    let data = dir.join("corpus.txt");
    std::fs::write(&data, "what survives a fault is what was written whole. ".repeat(80)).unwrap();
    let recipe = dir.join("faults.yaml");
    std::fs::write(
        &recipe,
        format!(
            "kind: lm\ntransformer:\n  d_model: 32\n  layers: 2\n  heads: 2\n  block_size: 32\ndata:\n  path: {}\n\
             train:\n  steps: {steps}\n  batch_size: 8\n  eval_interval: 50\n  eval_batches: 2\n  log_interval: 10\n\
             {every}sweep:\n  transformer.heads: [1, 2]\n",
            data.display()
        ),
    )
    .unwrap();
    recipe
}

fn ablate(recipe: &Path, out: &Path) -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_ablate"));
    cmd.arg(recipe).arg("--out").arg(out).arg("--device").arg("cpu").arg("--threads").arg("1");
    cmd
}

fn stderr_of(out: &std::process::Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// The lines of a message that are not the progress lines a run prints.
fn message_lines(log: &str, marker: &str) -> Vec<String> {
    log.lines().filter(|l| l.contains(marker)).map(String::from).collect()
}

#[test]
fn a_torn_runs_csv_loses_only_its_torn_record() {
    let dir = scratch("torn");
    let recipe = write_recipe(&dir, 30, Some(1000));
    let reference = dir.join("reference");
    assert!(ablate(&recipe, &reference).arg("--quiet").status().unwrap().success());
    // A write cut short: the second row loses its end (no line break), as power loss or a full disk leaves it.
    let out = dir.join("out");
    std::fs::create_dir_all(&out).unwrap();
    for f in ["runs.csv", "curves.csv"] {
        std::fs::copy(reference.join(f), out.join(f)).unwrap();
    }
    let text = std::fs::read_to_string(out.join("runs.csv")).unwrap();
    std::fs::write(out.join("runs.csv"), &text[..text.len() - 25]).unwrap();
    let rerun = ablate(&recipe, &out).output().unwrap();
    let log = stderr_of(&rerun);
    assert!(rerun.status.success(), "{log}");
    let said = message_lines(&log, "torn record");
    assert_eq!(said.len(), 1, "{log}");
    assert!(said[0].contains("runs.csv") && said[0].contains(".torn-"), "{log}");
    assert!(log.contains("1 already finished, 1 to train"), "the intact run is kept: {log}");
    // The damaged file is kept, and the re-trained run ends as the undisturbed one did.
    let kept = std::fs::read_dir(&out)
        .unwrap()
        .filter(|e| e.as_ref().unwrap().file_name().to_string_lossy().starts_with("runs.csv.torn-"))
        .count();
    assert_eq!(kept, 1);
    assert_eq!(runs_without_timings(&out), runs_without_timings(&reference));
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn an_unreadable_state_is_set_aside_and_the_run_restarts() {
    let dir = scratch("bad-state");
    let recipe = write_recipe(&dir, 30, Some(10));
    let reference = dir.join("reference");
    assert!(ablate(&recipe, &reference).arg("--quiet").status().unwrap().success());
    // A state file of garbage where the first run's state would be (a safetensors header of absurd size).
    let out = dir.join("out");
    let state = out.join("checkpoints/transformer.heads=1_seed=0.state.safetensors");
    std::fs::create_dir_all(state.parent().unwrap()).unwrap();
    std::fs::write(&state, [0xffu8; 64]).unwrap();
    let rerun = ablate(&recipe, &out).output().unwrap();
    let log = stderr_of(&rerun);
    assert!(rerun.status.success(), "the sweep goes on: {log}");
    let said = message_lines(&log, "set it aside");
    assert_eq!(said.len(), 1, "{log}");
    assert!(
        said[0].starts_with("ablate: warning: resuming from") && said[0].contains("restarted the run from step 0"),
        "{log}"
    );
    let aside: Vec<_> = std::fs::read_dir(state.parent().unwrap())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.contains(".unreadable-"))
        .collect();
    assert_eq!(aside.len(), 1, "renamed, not deleted");
    assert_eq!(runs_without_timings(&out), runs_without_timings(&reference));
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_second_process_on_the_same_directory_is_refused_naming_the_first() {
    let dir = scratch("lock");
    let recipe = write_recipe(&dir, 30, Some(1000));
    let out = dir.join("out");
    std::fs::create_dir_all(&out).unwrap();
    // This test process holds the directory, as a running sweep would.
    let held = ablate::files::DirLock::acquire(&out).unwrap();
    let second = ablate(&recipe, &out).output().unwrap();
    let log = stderr_of(&second);
    assert!(!second.status.success());
    assert_eq!(log.lines().count(), 1, "{log}");
    assert!(
        log.contains("is in use by another ablate process") && log.contains(&format!("(pid {})", std::process::id())),
        "{log}"
    );
    assert!(!out.join("runs.csv").exists());
    // Released, the directory is free again (and a lock left by a dead process is no lock).
    drop(held);
    assert!(ablate(&recipe, &out).arg("--quiet").status().unwrap().success());
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn sigterm_saves_the_state_and_the_rerun_ends_as_an_undisturbed_run() {
    let dir = scratch("sigterm");
    let recipe = write_recipe(&dir, 1500, None);
    let reference = dir.join("reference");
    assert!(ablate(&recipe, &reference).arg("--quiet").status().unwrap().success());
    // Without checkpoint_every no state is saved but on the signal: SIGTERM after a moment of training.
    let out = dir.join("out");
    let mut child = ablate(&recipe, &out).arg("--quiet").stderr(Stdio::piped()).spawn().unwrap();
    let started = Instant::now();
    // The signal handler is installed before the sweep locks its directory: wait for the lock (a loaded
    // machine can take seconds to load libtorch), then for a moment of training.
    while !out.join(".ablate.lock").exists() && started.elapsed() < Duration::from_secs(60) {
        std::thread::sleep(Duration::from_millis(50));
    }
    std::thread::sleep(Duration::from_millis(1000));
    assert!(child.try_wait().unwrap().is_none(), "the run finished before the signal");
    // SAFETY: kill() on our own child's pid.
    unsafe { libc::kill(child.id() as libc::pid_t, libc::SIGTERM) };
    let done = child.wait_with_output().unwrap();
    let log = stderr_of(&done);
    assert_eq!(done.status.code(), Some(75), "{log}");
    assert!(started.elapsed() < Duration::from_secs(60));
    let said = message_lines(&log, "interrupted");
    assert_eq!(said.len(), 1, "{log}");
    assert!(said[0].contains("run the same command to continue"), "{log}");
    let state = said[0].split("saved in ").nth(1).and_then(|rest| rest.split(": run").next()).expect("names the state");
    assert!(Path::new(state).exists(), "the state was saved on the signal: {state}");
    let resumed = ablate(&recipe, &out).output().unwrap();
    let log = stderr_of(&resumed);
    assert!(resumed.status.success() && log.contains("resumed from step"), "{log}");
    assert_eq!(runs_without_timings(&out), runs_without_timings(&reference));
    // The signal's state belonged to a step the finished run has passed: it is gone.
    assert!(!Path::new(state).exists(), "a finished run keeps the state of its interruption: {state}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_full_disk_fails_cleanly_and_leaves_no_temporary_file() {
    let dir = scratch("full-disk");
    let recipe = write_recipe(&dir, 30, Some(10));
    let out = dir.join("out");
    // The file-size limit makes every write past 64 KiB fail as a full disk would (EFBIG; SIGXFSZ ignored):
    // the state checkpoint, well over that, cannot be written.
    let script = format!(
        "trap '' XFSZ; ulimit -f 64; exec '{}' '{}' --out '{}' --device cpu --threads 1 --quiet",
        env!("CARGO_BIN_EXE_ablate"),
        recipe.display(),
        out.display()
    );
    let failed = Command::new("bash").arg("-c").arg(&script).output().unwrap();
    let log = stderr_of(&failed);
    assert!(!failed.status.success());
    assert_eq!(log.lines().count(), 1, "{log}");
    assert!(log.contains("state.safetensors"), "{log}");
    let mut leftovers = Vec::new();
    let mut stack = vec![out.clone()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                stack.push(p);
            } else if p.to_string_lossy().contains(".tmp") {
                leftovers.push(p);
            }
        }
    }
    assert!(leftovers.is_empty(), "temporary files left: {leftovers:?}");
    assert!(ablate::judge::reading::reported_runs(&out).is_err(), "no run finished");
    // With room again, the same command trains everything.
    assert!(ablate(&recipe, &out).arg("--quiet").status().unwrap().success());
    assert_eq!(ablate::judge::reading::reported_runs(&out).unwrap().len(), 2);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_run_that_runs_out_of_memory_is_one_line_and_the_sweep_trains_the_next() {
    let dir = scratch("out-of-memory");
    let data = dir.join("corpus.txt");
    std::fs::write(&data, "an allocation that does not fit is a result, not a crash. ".repeat(2000)).unwrap();
    let recipe = dir.join("oom.yaml");
    // The first variant fits this machine's memory by the estimate (about 11 GB) but not the 4 GB of address
    // space the process is given below: libtorch's allocator fails mid-run, as a GPU's does when the estimate
    // is short. The second is small.
    std::fs::write(
        &recipe,
        format!(
            "kind: lm\ntransformer: {{d_model: 1024, layers: 1, heads: 2, block_size: 512}}\ndata: {{path: {}}}\n\
             train: {{steps: 2, batch_size: 256, eval_interval: 50, eval_batches: 1, log_interval: 1, test_batches: 1}}\n\
             variants:\n  - {{label: big}}\n  - {{label: small, transformer.d_model: 32, train.batch_size: 2}}\n",
            data.display()
        ),
    )
    .unwrap();
    let out = dir.join("out");
    let script = format!(
        "ulimit -v 4000000; exec '{}' '{}' --out '{}' --device cpu --threads 1 --quiet",
        env!("CARGO_BIN_EXE_ablate"),
        recipe.display(),
        out.display()
    );
    let run = Command::new("bash").arg("-c").arg(&script).env("RUST_BACKTRACE", "1").output().unwrap();
    let log = stderr_of(&run);
    // Non-zero (a run is missing), with no panic or backtrace: one line for the run, one at the end.
    assert!(!run.status.success(), "{log}");
    assert!(!log.contains("panicked") && !log.contains("backtrace"), "{log}");
    let lines: Vec<&str> = log.lines().collect();
    assert_eq!(lines.len(), 2, "{log}");
    assert!(
        lines[0].contains("run `variant=big seed=0` ran out of memory on Cpu (estimated about")
            && lines[0].contains("this machine has")
            && lines[0].contains("can't allocate memory"),
        "{log}"
    );
    assert!(lines[1].contains("1 of 2 runs ran out of memory"), "{log}");
    // The next run trained and was recorded; the failed one is in failed.csv, not runs.csv.
    let runs = ablate::judge::reading::reported_runs(&out).unwrap();
    assert_eq!(runs.len(), 1);
    assert_eq!(runs[0]["run_id"], "variant=small seed=0");
    let failed = std::fs::read_to_string(out.join("failed.csv")).unwrap();
    assert!(failed.starts_with("run_id,config_hash,error\n") && failed.contains("variant=big seed=0"), "{failed}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn an_impossible_size_is_refused_before_training_with_the_estimate() {
    let dir = scratch("huge");
    let recipe = write_recipe(&dir, 30, Some(1000));
    let out = dir.join("out");
    for command in [&["check"][..], &[][..]] {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_ablate"));
        cmd.args(command).arg(&recipe).arg("train.batch_size=100000000000");
        if command.is_empty() {
            cmd.arg("--out").arg(&out);
        }
        let refused = cmd.output().unwrap();
        let log = stderr_of(&refused);
        assert_eq!(refused.status.code(), Some(2), "an error, not an abort: {log}");
        assert_eq!(log.lines().count(), 1, "{log}");
        assert!(
            log.contains("needs about") && log.contains("PB to train") && log.contains("lower train.batch_size"),
            "{log}"
        );
    }
    assert!(!out.join("runs.csv").exists());
    let _ = std::fs::remove_dir_all(&dir);
}
