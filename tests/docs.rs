//! The documentation is checked like code: the generated references equal what the binary prints, every
//! relative link of the README and of `docs/` points at a file that exists (and an anchor at a heading),
//! and every page of `docs/` is reachable from the README.
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn printed(args: &[&str]) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_ablate")).args(args).output().unwrap();
    assert!(out.status.success(), "ablate {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8(out.stdout).unwrap()
}

/// `file` (under the repository) is exactly what `ablate <command>` prints.
fn assert_generated(file: &str, command: &str) {
    let committed = std::fs::read_to_string(root().join(file)).unwrap_or_default();
    assert!(
        committed == printed(&[command]),
        "{file} differs from `ablate {command}`: regenerate it with `target/release/ablate {command} > {file}`"
    );
}

#[test]
fn docs_cli_md_is_what_the_binary_prints() {
    assert_generated("docs/cli.md", "cli-reference");
}

/// A change that makes a committed reference stale (a new key with no silent default, a changed default, a
/// variant added) fails here until results/stale.md, which the README's recipe table points to, says so.
#[test]
fn results_stale_md_lists_every_stale_reference() {
    let out = Command::new(env!("CARGO_BIN_EXE_ablate")).arg("stale").current_dir(root()).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let committed = std::fs::read_to_string(root().join("results/stale.md")).unwrap_or_default();
    assert!(
        committed == String::from_utf8(out.stdout).unwrap(),
        "results/stale.md differs from `ablate stale`: a committed reference became stale (or fresh); regenerate it with `target/release/ablate stale > results/stale.md`"
    );
}

#[test]
fn docs_keys_md_is_what_the_binary_prints() {
    assert_generated("docs/keys.md", "keys");
}

/// GitHub's anchor of a heading: lower case, punctuation dropped, spaces as hyphens.
fn anchor(heading: &str) -> String {
    heading
        .trim()
        .to_lowercase()
        .chars()
        .filter_map(|c| match c {
            ' ' => Some('-'),
            c if c.is_alphanumeric() || c == '-' || c == '_' => Some(c),
            _ => None,
        })
        .collect()
}

fn anchors(text: &str) -> BTreeSet<String> {
    let mut in_code = false;
    let mut out = BTreeSet::new();
    for line in text.lines() {
        if line.starts_with("```") {
            in_code = !in_code;
        }
        if !in_code && line.starts_with('#') {
            out.insert(anchor(line.trim_start_matches('#')));
        }
    }
    out
}

/// The targets of the Markdown links `[text](target)` of a page, outside code blocks and code spans.
fn links(text: &str) -> Vec<String> {
    let mut in_code = false;
    let mut out = Vec::new();
    for line in text.lines() {
        if line.starts_with("```") {
            in_code = !in_code;
            continue;
        }
        if in_code {
            continue;
        }
        let outside_code: String = line.split('`').step_by(2).collect::<Vec<_>>().join(" ");
        let mut rest = outside_code.as_str();
        while let Some(i) = rest.find("](") {
            rest = &rest[i + 2..];
            if let Some(end) = rest.find(')') {
                out.push(rest[..end].to_string());
                rest = &rest[end..];
            }
        }
    }
    out
}

fn pages() -> Vec<PathBuf> {
    let mut pages = vec![root().join("README.md")];
    let mut docs: Vec<PathBuf> = std::fs::read_dir(root().join("docs"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "md"))
        .collect();
    docs.sort();
    pages.extend(docs);
    pages
}

fn check_link(page: &Path, target: &str) -> Result<Option<PathBuf>, String> {
    if target.starts_with("http://") || target.starts_with("https://") || target.starts_with("mailto:") {
        return Ok(None);
    }
    let (file, fragment) = target.split_once('#').unwrap_or((target, ""));
    let resolved = if file.is_empty() { page.to_path_buf() } else { page.parent().unwrap().join(file) };
    if !resolved.exists() {
        return Err(format!("{}: link to {target}: no such file", page.display()));
    }
    if !fragment.is_empty() && resolved.extension().is_some_and(|e| e == "md") {
        let text = std::fs::read_to_string(&resolved).unwrap();
        if !anchors(&text).contains(fragment) {
            return Err(format!("{}: link to {target}: no heading with that anchor", page.display()));
        }
    }
    Ok(Some(resolved.canonicalize().unwrap()))
}

#[test]
fn every_relative_link_resolves_and_every_docs_page_is_linked_from_the_readme_or_docs() {
    let mut broken = Vec::new();
    let mut reached = BTreeSet::new();
    for page in pages() {
        let text = std::fs::read_to_string(&page).unwrap();
        for target in links(&text) {
            match check_link(&page, &target) {
                Ok(Some(p)) if p != page.canonicalize().unwrap() => {
                    reached.insert(p);
                }
                Ok(_) => {}
                Err(e) => broken.push(e),
            }
        }
    }
    assert!(broken.is_empty(), "broken links:\n{}", broken.join("\n"));
    let readme_links: BTreeSet<PathBuf> = links(&std::fs::read_to_string(root().join("README.md")).unwrap())
        .iter()
        .filter_map(|t| check_link(&root().join("README.md"), t).ok().flatten())
        .collect();
    for page in pages().into_iter().skip(1) {
        let page = page.canonicalize().unwrap();
        assert!(readme_links.contains(&page), "{} is not linked from the README", page.display());
        assert!(reached.contains(&page));
    }
}

#[test]
fn the_link_checker_finds_a_broken_link_and_a_missing_anchor() {
    let readme = root().join("README.md");
    assert!(check_link(&readme, "docs/no-such-page.md").is_err());
    assert!(check_link(&readme, "README.md#no-such-heading").is_err());
    assert_eq!(anchor(" Recipes and keys"), "recipes-and-keys");
    assert_eq!(links("see [a](b.md) and `[c](d.md)`"), vec!["b.md".to_string()]);
}

/// The generated index of `docs/testing.md`: every test file with the first paragraph of its module doc
/// and its tests, by name.
fn test_index() -> String {
    let mut files: Vec<PathBuf> = std::fs::read_dir(root().join("tests"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "rs"))
        .collect();
    files.sort();
    let mut out = String::new();
    for file in files {
        let text = std::fs::read_to_string(&file).unwrap();
        let doc: Vec<&str> = text
            .lines()
            .take_while(|l| l.starts_with("//!"))
            .map(|l| l.trim_start_matches("//!").trim())
            .take_while(|l| !l.is_empty())
            .collect();
        let mut tests = Vec::new();
        let mut lines = text.lines().peekable();
        while let Some(line) = lines.next() {
            if line.trim() == "#[test]" {
                let next = lines.find(|l| l.trim_start().starts_with("fn ")).unwrap_or_default();
                let name = next.trim_start().trim_start_matches("fn ").split('(').next().unwrap_or_default();
                tests.push(name.replace('_', " "));
            }
        }
        let name = file.file_name().unwrap().to_string_lossy().to_string();
        out.push_str(&format!("\n### `tests/{name}` ({} tests)\n\n{}\n\n", tests.len(), doc.join(" ")));
        for t in tests {
            out.push_str(&format!("- {t}\n"));
        }
    }
    out
}

#[test]
fn docs_testing_md_indexes_every_test_file_and_test() {
    let path = root().join("docs/testing.md");
    let text = std::fs::read_to_string(&path).unwrap();
    let marker = "<!-- generated: test index -->\n";
    let start = text.find(marker).expect("docs/testing.md has the generated index's marker") + marker.len();
    if std::env::var_os("ABLATE_BLESS").is_some() {
        std::fs::write(&path, format!("{}{}", &text[..start], test_index())).unwrap();
        return;
    }
    assert!(
        text[start..] == test_index(),
        "docs/testing.md's test index differs from tests/: regenerate it with `ABLATE_BLESS=1 cargo test --release --test docs`"
    );
}

/// A committed verdict block's command, split into words (double quotes keep a baseline with spaces whole).
fn words(command: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut word = String::new();
    let mut quoted = false;
    for c in command.chars() {
        match c {
            '"' => quoted = !quoted,
            ' ' if !quoted => {
                if !word.is_empty() {
                    out.push(std::mem::take(&mut word));
                }
            }
            c => word.push(c),
        }
    }
    if !word.is_empty() {
        out.push(word);
    }
    out
}

/// The verdict block of a results README as its marker's command writes it from today's CSVs.
fn regenerated(command: &str) -> String {
    use ablate::run::summary::Pairing;
    let w = words(command);
    assert!(w.len() >= 5 && w[0] == "ablate" && w[1] == "summary" && w[3] == "--out", "{command}");
    let recipe = ablate::recipe::load(&root().join(&w[2]), false).unwrap_or_else(|e| panic!("{command}: {e}"));
    let baseline = w.iter().position(|a| a == "--baseline").map(|i| w[i + 1].clone());
    let pairing = match (&baseline, w.iter().any(|a| a == "--ladder")) {
        (Some(b), _) => Some(Pairing::Baseline(b.as_str())),
        (None, true) => Some(Pairing::Ladder),
        (None, false) => None,
    };
    ablate::run::verdicts::block(&root().join(&w[4]), &recipe, pairing, command)
        .unwrap_or_else(|e| panic!("{command}: {e:#}"))
}

/// Every results directory that holds comparisons (a `runs.csv` of two or more variants) carries a verdict
/// block, and every committed block is what its command writes from the CSVs today: prose may explain a
/// verdict, but the verdicts themselves are never typed by hand.
#[test]
fn every_results_readme_carries_the_verdicts_its_csvs_give() {
    let mut missing = Vec::new();
    let mut checked = 0;
    for entry in std::fs::read_dir(root().join("results")).unwrap() {
        let dir = entry.unwrap().path();
        let readme = std::fs::read_to_string(dir.join("README.md")).unwrap_or_default();
        match ablate::run::verdicts::committed(&readme) {
            Some((block, command)) => {
                assert!(
                    block == regenerated(&command),
                    "{}: the verdict block differs from what its command writes today: run `target/release/{command}`",
                    dir.display()
                );
                checked += 1;
            }
            None => {
                let runs = ablate::run::results::read_runs(&dir.join("runs.csv")).ok();
                if runs.is_some_and(|r| ablate::run::results::variants_of(&r).len() >= 2) {
                    missing.push(dir.file_name().unwrap().to_string_lossy().to_string());
                }
            }
        }
    }
    missing.sort();
    assert!(missing.is_empty(), "results directories without a verdict block: {missing:?}");
    assert!(checked > 0);
}
