//! ablate: train Transformer variants from YAML recipes and measure what each mechanism buys.
//!
//! The layers, each importing only those below it:
//! - `transformer` — the core: attention, position encodings, layers, built from the plain settings of
//!   `transformer::spec`;
//! - `models` — one file per architecture over the core (GPT, BERT, encoder–decoder, ViT, Swin, DaViT,
//!   ImageGPT), structural settings in `models::spec`;
//! - `data` — corpora, image sets, sentence pairs, tokenizers, batches;
//! - `train` — the optimisation loop every kind shares (AdamW, schedules, precision, resumable state);
//! - `tasks` — one per kind of run: its data, model, objective, evaluation, FLOPs and named metrics;
//! - `judge` — the one reading of a results directory and what is made of it: summaries, verdicts, plots,
//!   TensorBoard, the HTML report, reproduction;
//! - `run` — the sweep and its result files, settling, tuning, scale-out and benchmarks;
//! - `recipe` — the schema (the config structs), validation, which keys each kind reads, expansion; with
//!   `metrics`, the names every layer above the core reads; below them `stats`, the intervals and tests of
//!   the tables, over it `design`, the two-stage design that adds seeds, and over both `ceg`, what a
//!   mechanism is worth in compute (`tests/layers.rs` has the
//!   exact order). These, and the two `spec` modules, need no libtorch: `cargo build --no-default-features`
//!   builds just them.
pub mod ceg;
pub mod design;
pub mod metrics;
pub mod models;
pub mod recipe;
pub mod stats;
pub mod transformer;

#[cfg(feature = "torch")]
pub mod data;
#[cfg(feature = "torch")]
pub mod files;
#[cfg(feature = "torch")]
pub mod judge;
#[cfg(feature = "torch")]
pub mod run;
#[cfg(feature = "torch")]
pub mod tasks;
#[cfg(feature = "torch")]
pub mod train;

/// A `--device` as spelled: `auto`, `cpu`, `cuda` (= `cuda:0`) or `cuda:N`, before asking whether that
/// device exists here (a Slurm script is written on a login node that has no GPU).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DeviceSpec {
    Auto,
    Cpu,
    Cuda(usize),
}

/// The spelling of a `--device`, checked without looking for the device.
pub fn device_spec(spec: &str) -> Result<DeviceSpec, String> {
    match spec {
        "auto" => Ok(DeviceSpec::Auto),
        "cpu" => Ok(DeviceSpec::Cpu),
        "cuda" => Ok(DeviceSpec::Cuda(0)),
        s => match s.strip_prefix("cuda:").and_then(|i| i.parse().ok()) {
            Some(i) => Ok(DeviceSpec::Cuda(i)),
            None => Err(format!("--device {spec}: unknown device; allowed: auto, cpu, cuda, cuda:N")),
        },
    }
}

/// The NVIDIA kernel driver's version from the text of `/proc/driver/nvidia/version` ("NVRM version: NVIDIA
/// UNIX x86_64 Kernel Module  580.65.06  Sun Jul 27 ..."): the first token after "Kernel Module" made of
/// digits and dots.
pub fn nvidia_driver_version(proc_text: &str) -> Option<String> {
    let line = proc_text.lines().find(|l| l.starts_with("NVRM version"))?;
    let after = line.split_once("Kernel Module").map(|(_, rest)| rest).unwrap_or(line);
    after
        .split_whitespace()
        .find(|t| t.contains('.') && t.chars().all(|c| c.is_ascii_digit() || c == '.'))
        .map(str::to_string)
}

/// Why CUDA is not usable here, when an NVIDIA driver is installed (`driver`: its version): the pinned
/// torch 2.11.0 wheel is built for CUDA 13, which needs driver R580 or newer. None without a driver.
pub fn cuda_unusable_hint(driver: Option<&str>) -> Option<String> {
    let driver = driver?;
    let major: Option<u32> = driver.split('.').next().and_then(|m| m.parse().ok());
    let why = match major {
        Some(m) if m < 580 => format!(
            "driver {driver} is older than R580, which the pinned CUDA 13 build of torch 2.11.0 needs: update the \
             driver, or build against a CUDA 12 torch (ABLATE_TORCH_INDEX_URL, see docs/scaling.md \"On a GPU\")"
        ),
        _ => format!(
            "driver {driver} is present, but libtorch found no usable GPU (check CUDA_VISIBLE_DEVICES and \
             nvidia-smi; see docs/scaling.md \"On a GPU\")"
        ),
    };
    Some(format!("an NVIDIA driver is installed but CUDA is not usable: {why}"))
}

#[cfg(feature = "torch")]
fn installed_driver_hint() -> Option<String> {
    if tch::Cuda::is_available() {
        return None;
    }
    let text = std::fs::read_to_string("/proc/driver/nvidia/version").ok()?;
    cuda_unusable_hint(Some(&nvidia_driver_version(&text).unwrap_or_else(|| "of unknown version".into())))
}

/// `auto` (CUDA when available), `cpu`, `cuda` or `cuda:N`. `auto` on a machine whose NVIDIA driver is
/// installed but unusable trains on the CPU and says why in one line on stderr.
#[cfg(feature = "torch")]
pub fn parse_device(spec: &str) -> Result<tch::Device, String> {
    let cuda = |i: usize| {
        if tch::Cuda::is_available() && i < tch::Cuda::device_count() as usize {
            Ok(tch::Device::Cuda(i))
        } else {
            let why = installed_driver_hint().map(|h| format!(" ({h})")).unwrap_or_default();
            Err(format!(
                "--device {spec}: CUDA device {i} is not available (found {} CUDA devices){why}; use --device cpu",
                tch::Cuda::device_count()
            ))
        }
    };
    match device_spec(spec)? {
        DeviceSpec::Auto => {
            if let Some(hint) = installed_driver_hint() {
                static ONCE: std::sync::Once = std::sync::Once::new();
                ONCE.call_once(|| eprintln!("ablate: warning: --device auto trains on the CPU: {hint}"));
            }
            Ok(tch::Device::cuda_if_available())
        }
        DeviceSpec::Cpu => Ok(tch::Device::Cpu),
        DeviceSpec::Cuda(i) => cuda(i),
    }
}

/// This test binary again, running only the test at `test` (its path below the crate) on one thread, its
/// output not captured: a second process on the same code path.
#[cfg(all(test, feature = "torch"))]
pub(crate) fn this_test_again(test: &str) -> std::process::Command {
    let mut cmd = std::process::Command::new(std::env::current_exe().expect("the test binary's path"));
    cmd.args([test, "--exact", "--test-threads=1", "--nocapture"]);
    cmd
}

/// libtorch has one random generator per process, and the library's tests run on parallel threads, most of
/// them drawing from it. A test whose assertions depend on the generator's sequence (seed, then compare draws)
/// calls this with its path below the crate (`module::tests::name`) and its body: the body runs in a child
/// process of the test binary that runs that one test alone, so no other test draws in between.
#[cfg(all(test, feature = "torch"))]
pub(crate) fn alone_in_a_process(test: &str, body: impl FnOnce()) {
    const CHILD: &str = "ABLATE_TEST_ALONE";
    if std::env::var_os(CHILD).is_some() {
        body();
        return;
    }
    let out = this_test_again(test).env(CHILD, test).output().expect("starting the test binary again");
    let said = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "{test}, run alone in its own process, failed:\n{said}");
    // A misspelt path runs no test in the child and would pass: the child must have run exactly this one.
    assert!(said.contains("1 passed"), "{test}: the child process ran no such test:\n{said}");
}

#[cfg(test)]
mod device_tests {
    use super::*;

    #[test]
    fn device_spellings_are_checked_without_a_device() {
        assert_eq!(device_spec("cuda"), Ok(DeviceSpec::Cuda(0)));
        assert_eq!(device_spec("cuda:3"), Ok(DeviceSpec::Cuda(3)));
        assert_eq!(device_spec("auto"), Ok(DeviceSpec::Auto));
        assert!(device_spec("gpu").unwrap_err().contains("allowed: auto, cpu, cuda, cuda:N"));
        assert!(device_spec("cuda:x").is_err());
    }

    #[test]
    fn an_old_driver_is_named_with_the_version_the_wheel_needs() {
        let proc = "NVRM version: NVIDIA UNIX x86_64 Kernel Module  535.104.05  Sat Aug 19 01:15:15 UTC 2023\n\
                    GCC version:  gcc version 12.2.0 (Debian 12.2.0-14)\n";
        assert_eq!(nvidia_driver_version(proc).as_deref(), Some("535.104.05"));
        let open = "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  580.65.06  Release Build\n";
        assert_eq!(nvidia_driver_version(open).as_deref(), Some("580.65.06"));
        let old = cuda_unusable_hint(Some("535.104.05")).unwrap();
        assert!(
            old.contains("driver 535.104.05 is older than R580") && old.contains("ABLATE_TORCH_INDEX_URL"),
            "{old}"
        );
        let new = cuda_unusable_hint(Some("580.65.06")).unwrap();
        assert!(!new.contains("older") && new.contains("CUDA_VISIBLE_DEVICES"), "{new}");
        assert_eq!(cuda_unusable_hint(None), None);
    }
}
