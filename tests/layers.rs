//! The folders of `src/` are layers, and each imports only the layers below it: the import graph has no
//! cycle. This walks every source file's `crate::…` paths (the CLI's `ablate::…` ones too) and checks each
//! against the order below, so a new import that points up fails here with the file that has it.
mod common;

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

/// Bottom to top. A module may import any module of a lower layer, none of its own layer or above.
const LAYERS: &[&[&str]] = &[
    &["transformer"],
    &["models"],
    &["stats"],
    &["design"],
    &["ceg"],
    &["recipe", "metrics", "files"],
    &["data"],
    &["train"],
    &["tasks"],
    &["judge"],
    &["run"],
    &["cli"],
];

fn layer_of(module: &str) -> Option<usize> {
    LAYERS.iter().position(|layer| layer.contains(&module))
}

/// The top-level modules a file names as `crate::X` or `ablate::X` (comments included: a doc link that
/// points up is a dependency of the reader's understanding too).
fn imports(text: &str, prefix: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    let mut rest = text;
    while let Some(i) = rest.find(prefix) {
        rest = &rest[i + prefix.len()..];
        let name: String = rest.chars().take_while(|c| c.is_ascii_alphanumeric() || *c == '_').collect();
        if !name.is_empty() {
            out.insert(name);
        }
    }
    out
}

/// Which module a file belongs to: its folder under `src/`, or its file name (`files.rs` → `files`).
fn module_of(src: &Path, file: &Path) -> String {
    let relative = file.strip_prefix(src).unwrap();
    let first = relative.components().next().unwrap().as_os_str().to_string_lossy().to_string();
    first.trim_end_matches(".rs").to_string()
}

fn upward_imports() -> Vec<String> {
    let src = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("src");
    let files = common::rust_files(&src);
    let mut wrong = Vec::new();
    for file in files {
        let module = module_of(&src, &file);
        if module == "lib" || module == "main" {
            continue;
        }
        let Some(level) = layer_of(&module) else {
            wrong.push(format!("{}: module `{module}` is in no layer of tests/layers.rs", file.display()));
            continue;
        };
        let text = std::fs::read_to_string(&file).unwrap();
        let prefix = if module == "cli" { "ablate::" } else { "crate::" };
        for target in imports(&text, prefix) {
            match layer_of(&target) {
                Some(l) if target != module && l >= level => {
                    wrong.push(format!("{}: `{module}` imports `{target}`, which is not below it", file.display()))
                }
                _ => {}
            }
        }
    }
    wrong
}

#[test]
fn every_folder_imports_only_the_layers_below_it() {
    let wrong = upward_imports();
    assert!(wrong.is_empty(), "imports against the layering:\n{}", wrong.join("\n"));
}

#[test]
fn the_import_scanner_sees_paths_in_code_and_in_groups() {
    let names = imports("use crate::data::x;\nlet y = crate::models::spec::Image;\n// crate::run", "crate::");
    assert_eq!(names, ["data", "models", "run"].iter().map(|s| s.to_string()).collect());
    assert!(layer_of("transformer") < layer_of("models"));
    assert!(layer_of("tasks") < layer_of("run"));
}

/// The files under `src/` (relative paths) whose code contains `needle`: comments and unit tests left out.
fn files_naming(needle: &str) -> Vec<String> {
    let src = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut out = Vec::new();
    for file in common::rust_files(&src) {
        let text = std::fs::read_to_string(&file).unwrap();
        let code = text.split("#[cfg(test)]").next().unwrap_or_default();
        let code = code.lines().filter(|l| !l.trim_start().starts_with("//")).collect::<Vec<_>>().join("\n");
        if code.contains(needle) {
            out.push(file.strip_prefix(&src).unwrap().display().to_string());
        }
    }
    out.sort();
    out
}

/// A results directory is read in one place: `judge/reading.rs` is the only file that makes a CSV reader
/// (`runs.csv`, `curves.csv` and the side tables are parsed there, and the writer, the shard merge and the
/// benchmarks read through its `table`), and the recipe's metric declarations are derived once per reading
/// (`Results::open`), besides the checks made before any run exists (the `compare:` check, the tuner's
/// choice of direction) — not again by each of summary, verdicts, TensorBoard, plots and reproduction.
#[test]
fn results_files_are_parsed_in_one_place() {
    for reader in ["csv::Reader", "csv::ReaderBuilder"] {
        assert_eq!(files_naming(reader), ["judge/reading.rs"], "`{reader}` outside the one reading of results");
    }
    let deriving: Vec<String> = ["recipe_metrics(", "Declarations::of("]
        .iter()
        .flat_map(|n| files_naming(n))
        .collect::<BTreeSet<_>>()
        .into_iter()
        .collect();
    assert_eq!(
        deriving,
        ["judge/reading.rs", "judge/summary.rs", "run/tune.rs", "tasks/mod.rs"],
        "metric declarations derived outside `Results::open` and the pre-run checks"
    );
}
