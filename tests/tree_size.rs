//! The repository travels to a GPU machine as a copy of its working tree (tracked files and untracked ones git
//! does not ignore), which receives at most 64 MiB together with what is carried beside it (the binary, the
//! data; `bin/gpu-prepare`, which refuses more than 60). The tree's share is at most 44 MiB (with the binary's
//! 3.8 and the data's 3.4, about 51 of the 60), and the committed charts stay in their compact
//! encoding (an indexed PNG, `run::plot::canvas::recompress_png`); generated reports (`index.html`) and
//! TensorBoard event files are written on demand by `ablate plot`, never committed.
use std::path::{Path, PathBuf};
use std::process::Command;

const TREE_LIMIT_MIB: f64 = 44.0;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// Every file that would travel: tracked, or untracked and not ignored.
fn travelling_files() -> Vec<PathBuf> {
    let out = Command::new("git")
        .args(["ls-files", "-z", "--cached", "--others", "--exclude-standard"])
        .current_dir(root())
        .output()
        .expect("git runs (the tree's size is measured from its file list)");
    assert!(out.status.success(), "git ls-files failed: {}", String::from_utf8_lossy(&out.stderr));
    out.stdout
        .split(|&b| b == 0)
        .filter(|p| !p.is_empty())
        .map(|p| PathBuf::from(String::from_utf8_lossy(p).to_string()))
        .collect()
}

fn size(path: &Path) -> u64 {
    // A tracked file deleted in the working tree does not travel.
    std::fs::metadata(root().join(path)).map(|m| m.len()).unwrap_or(0)
}

#[test]
fn the_tree_that_travels_to_a_gpu_machine_stays_within_its_share() {
    let files = travelling_files();
    let total: u64 = files.iter().map(|f| size(f)).sum();
    let mib = total as f64 / 1048576.0;
    if mib > TREE_LIMIT_MIB {
        let mut by_folder = std::collections::BTreeMap::<String, u64>::new();
        for f in &files {
            let folder = f.components().take(2).map(|c| c.as_os_str().to_string_lossy()).collect::<Vec<_>>().join("/");
            *by_folder.entry(folder).or_default() += size(f);
        }
        let mut largest: Vec<(String, u64)> = by_folder.into_iter().collect();
        largest.sort_by_key(|entry| std::cmp::Reverse(entry.1));
        let list: Vec<String> =
            largest.iter().take(8).map(|(f, n)| format!("{f} {:.1} MiB", *n as f64 / 1048576.0)).collect();
        panic!(
            "the working tree that travels to a GPU machine is {mib:.1} MiB, over its {TREE_LIMIT_MIB} MiB \
             (largest: {})",
            list.join(", ")
        );
    }
}

#[test]
fn generated_reports_and_event_files_are_not_committed() {
    let generated: Vec<PathBuf> = travelling_files()
        .into_iter()
        .filter(|f| {
            f.file_name().is_some_and(|n| n == "index.html")
                || f.components().any(|c| c.as_os_str() == "tensorboard")
                || f.file_name().is_some_and(|n| n.to_string_lossy().starts_with("events.out.tfevents"))
        })
        .collect();
    assert!(
        generated.is_empty(),
        "{} generated files would be committed (`ablate plot` writes them on demand; .gitignore lists them): {:?}",
        generated.len(),
        &generated[..generated.len().min(5)]
    );
}

/// Every committed chart is an indexed PNG. `ABLATE_BLESS=1` re-encodes the ones that are not (a chart drawn
/// before the compact encoding, or copied in from elsewhere) with the encoder every chart goes through.
/// ImageGPT's completion grids are pictures of samples, kept lossless.
#[test]
fn committed_charts_are_indexed_pngs() {
    let charts: Vec<PathBuf> = travelling_files()
        .into_iter()
        .filter(|f| f.starts_with("results") && f.extension().is_some_and(|e| e == "png"))
        .filter(|f| !f.components().any(|c| c.as_os_str() == "completions"))
        .collect();
    assert!(!charts.is_empty(), "no committed chart found under results/");
    let bless = std::env::var_os("ABLATE_BLESS").is_some();
    let mut wide = Vec::new();
    for chart in &charts {
        let path = root().join(chart);
        let Ok(bytes) = std::fs::read(&path) else { continue };
        assert_eq!(&bytes[1..4], b"PNG", "{} is not a PNG", chart.display());
        // IHDR's colour type byte; 3 is indexed.
        if bytes[25] != 3 {
            if bless {
                ablate::judge::plot::canvas::recompress_png(&path).unwrap();
            } else {
                wide.push(chart.display().to_string());
            }
        }
    }
    assert!(
        wide.is_empty(),
        "{} committed charts are not indexed PNGs (re-encode them with `ABLATE_BLESS=1 bin/cargo test --release \
         --test tree_size`): {:?}",
        wide.len(),
        &wide[..wide.len().min(5)]
    );
}
