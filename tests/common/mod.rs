//! Helpers shared by integration tests that run whole sweeps.
// Each test binary uses some of these helpers, not all.
#![allow(dead_code)]
use std::path::{Path, PathBuf};

/// A fresh, empty scratch directory for one test (named after the test and this process).
pub fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("ablate-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// Every `runs.csv` row of `out` without its timing columns: what two runs of the same config must agree on.
pub fn runs_without_timings(out: &Path) -> Vec<Vec<(String, String)>> {
    let timing = ["wall_s", "tokens_per_s", "model_tflops", "mfu"];
    ablate::results::read_runs(&out.join("runs.csv"))
        .unwrap()
        .into_iter()
        .map(|r| r.into_iter().filter(|(k, _)| !timing.contains(&k.as_str())).collect())
        .collect()
}
