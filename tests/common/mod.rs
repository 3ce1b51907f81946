//! Helpers shared by integration tests that run whole sweeps.
// Each test binary uses some of these helpers, not all.
#![allow(dead_code)]
use std::path::{Path, PathBuf};

pub mod knob_rows;

/// libtorch has one random generator per process and the tests of a file run on parallel threads: a test whose
/// numbers depend on its seed (two trainings compared step for step) holds this while it seeds and draws, so
/// that no other test draws in between. `train` holds it for the whole run; a test must not hold it across a
/// call of `train` (it is not re-entrant).
pub fn generator() -> std::sync::MutexGuard<'static, ()> {
    static GENERATOR: std::sync::Mutex<()> = std::sync::Mutex::new(());
    GENERATOR.lock().unwrap_or_else(|e| e.into_inner())
}

/// The lock a test file holds in every test whose numbers depend on libtorch's one generator, for the whole
/// test: its tests then run one at a time, so none draws between another's seed and its draws. It is not
/// [`generator`], which `train` takes, so such a test may call `train` (each test binary has its own).
pub fn serial() -> std::sync::MutexGuard<'static, ()> {
    static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

/// A fresh, empty scratch directory for one test (named after the test and this process).
pub fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("ablate-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// Every reported `runs.csv` row of `out` (tuning runs aside) without its timing columns: what two runs of
/// the same config must agree on.
pub fn runs_without_timings(out: &Path) -> Vec<Vec<(String, String)>> {
    without_timings(ablate::judge::reading::reported_runs(out).unwrap())
}

/// Every `runs.csv` row of `out`, tuning runs included, without its timing columns.
pub fn all_runs_without_timings(out: &Path) -> Vec<Vec<(String, String)>> {
    without_timings(ablate::judge::reading::all_runs(out).unwrap())
}

fn without_timings(rows: Vec<std::collections::BTreeMap<String, String>>) -> Vec<Vec<(String, String)>> {
    let timing = ["wall_s", "tokens_per_s", "model_tflops", "mfu", "peak_memory_mb"];
    rows.into_iter().map(|r| r.into_iter().filter(|(k, _)| !timing.contains(&k.as_str())).collect()).collect()
}

/// The first run of a recipe given as text.
pub fn config(text: &str) -> ablate::recipe::Config {
    ablate::recipe::parse(text, "test.yaml", "test", false).unwrap_or_else(|e| panic!("{e}")).runs[0].config.clone()
}

/// A UTF-8 file holding `text`, for a recipe's `data.path`.
pub fn corpus_file(name: &str, text: &str) -> PathBuf {
    let path = std::env::temp_dir().join(format!("ablate-corpus-{name}-{}.txt", std::process::id()));
    std::fs::write(&path, text).unwrap();
    path
}

/// Trains one run on the CPU through its task (as the sweep does, without result files), with the data
/// cache it read.
pub fn train(cfg: &ablate::recipe::Config) -> (ablate::tasks::Trained, ablate::tasks::DataCache) {
    train_in(cfg, &std::env::temp_dir())
}

/// `train`, with the files a kind writes besides the CSVs (ImageGPT's completion grid) under `out`.
pub fn train_in(cfg: &ablate::recipe::Config, out: &Path) -> (ablate::tasks::Trained, ablate::tasks::DataCache) {
    let _generator = generator();
    let task = ablate::tasks::task(cfg.kind);
    let mut data = ablate::tasks::DataCache::new(out, true);
    task.prepare(cfg, &mut data).unwrap();
    let ctx = ablate::tasks::RunContext {
        device: tch::Device::Cpu,
        progress: &mut |_, _| {},
        state: None,
        out,
        stem: "test",
    };
    (task.train(cfg, &data, ctx).unwrap(), data)
}

/// The trained model of `train`, rebuilt with its weights.
pub fn trained_model(
    cfg: &ablate::recipe::Config,
    trained: &ablate::tasks::Trained,
    data: &ablate::tasks::DataCache,
) -> (tch::nn::VarStore, Box<dyn ablate::tasks::Built>) {
    let task = ablate::tasks::task(cfg.kind);
    let mut vs = tch::nn::VarStore::new(tch::Device::Cpu);
    let model = task.build(cfg, &vs.root(), task.vocab(cfg, data).unwrap());
    vs.copy(&trained.vs).unwrap();
    (vs, model)
}

/// Rewrites `runs.csv` as an older ablate wrote it: without `column`, and with only its first `keep` rows
/// finished.
pub fn runs_csv_before_column(runs: &Path, column: &str, keep: usize) {
    let mut reader = csv::Reader::from_path(runs).unwrap();
    let header = reader.headers().unwrap().clone();
    let dropped = header.iter().position(|c| c == column).expect("the column exists");
    let without = |r: &csv::StringRecord| -> Vec<String> {
        r.iter().enumerate().filter(|(i, _)| *i != dropped).map(|(_, v)| v.to_string()).collect()
    };
    let rows: Vec<csv::StringRecord> = reader.records().take(keep).map(|r| r.unwrap()).collect();
    let mut writer = csv::Writer::from_path(runs).unwrap();
    writer.write_record(without(&header)).unwrap();
    for r in &rows {
        writer.write_record(without(r)).unwrap();
    }
    writer.flush().unwrap();
}

/// Every `.rs` file under `dir`, at any depth (the source tests read `src/` with it).
pub fn rust_files(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut dirs = vec![dir.to_path_buf()];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                dirs.push(path);
            } else if path.extension().is_some_and(|e| e == "rs") {
                out.push(path);
            }
        }
    }
    out
}
