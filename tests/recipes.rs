//! Recipe loading, sweep expansion, error reporting and the result files of a (tiny) real run.
use ablate::judge::summary::Pairing;
use ablate::recipe::{parse, parse_with, Overrides, Recipe, RecipeError};
use ablate::run::sweep::{run_recipe, SweepOptions};
use std::path::PathBuf;
use tch::Device;

/// `text` as a recipe of kind lm (the kind is added after the text, so the lines keep their numbers).
fn load(text: &str) -> Result<Recipe, RecipeError> {
    parse(&lm(text), "test.yaml", "test", false)
}

fn lm(text: &str) -> String {
    if text.contains("kind:") {
        text.to_string()
    } else {
        format!("{text}kind: lm\n")
    }
}

fn error(text: &str) -> RecipeError {
    load(text).expect_err("the recipe should be rejected")
}

#[test]
fn a_sweep_expands_to_the_grid_times_the_seeds() {
    let r =
        load("transformer:\n  d_model: 64\nsweep:\n  transformer.heads: [1, 2, 4]\n  transformer.pe: [none, learned]\nseeds: [0, 1]\n")
            .unwrap();
    assert_eq!(r.runs.len(), 12);
    assert_eq!(r.sweep_keys, vec!["transformer.heads", "transformer.pe"]);
    let ids: std::collections::HashSet<_> = r.runs.iter().map(|x| x.id.clone()).collect();
    assert_eq!(ids.len(), 12);
    let first = &r.runs[0];
    assert_eq!(first.id, "transformer.heads=1 transformer.pe=none seed=0");
    assert_eq!(first.label, "heads=1 pe=none");
    assert_eq!(first.config.transformer.heads, 1);
    assert_eq!(first.config.transformer.d_model, 64);
    assert_eq!(r.runs[11].config.transformer.heads, 4);
    assert_eq!(r.runs[11].config.train.seed, 1);
    // Distinct configs hash differently; the same config hashes the same.
    assert_ne!(r.runs[0].config_hash, r.runs[1].config_hash);
    assert_eq!(
        load("sweep:\n  transformer.heads: [2]\n").unwrap().runs[0].config_hash,
        load("transformer:\n  heads: 2\n").unwrap().runs[0].config_hash
    );
    // Writing a default down computes the same run: same hash. Anything the run reads that differs does not.
    let hash = |text: &str| load(text).unwrap().runs[0].config_hash.clone();
    assert_eq!(hash("transformer:\n  pe: learned\n"), hash("train:\n  steps: 2000\n"));
    assert_ne!(hash("transformer:\n  pe: rope\n"), hash("transformer:\n  pe: learned\n"));
    assert_ne!(hash("train:\n  seed: 3\n"), hash("train:\n  seed: 0\n"));
}

#[test]
fn smoke_shrinks_runs_but_keeps_the_sweep_shape() {
    let text =
        "transformer:\n  layers: 6\ntrain:\n  steps: 5000\nsweep:\n  train.batch_size: [8, 32]\nseeds: [0, 1, 2]\n";
    let full = parse(&lm(text), "t.yaml", "t", false).unwrap();
    let smoke = parse(&lm(text), "t.yaml", "t", true).unwrap();
    // Every sweep point, with the first two of the three seeds.
    assert_eq!((full.runs.len(), smoke.runs.len()), (6, 4));
    assert_eq!(smoke.seeds, [0, 1]);
    assert!(smoke.runs.iter().all(|r| r.config.train.steps <= 6 && r.config.transformer.layers <= 2));
    // A swept key keeps its values even when smoke would otherwise shrink it.
    let sizes: Vec<i64> = smoke.runs.iter().map(|r| r.config.train.batch_size).collect();
    assert_eq!(sizes, vec![8, 8, 32, 32]);
    // Value embeddings keep the layers their tables need.
    let text = "transformer:\n  layers: 6\n  value_embeddings: 2\n";
    assert_eq!(parse(&lm(text), "t.yaml", "t", true).unwrap().runs[0].config.transformer.layers, 4);
}

#[test]
fn unknown_keys_name_the_line_and_suggest_the_intended_key() {
    let e = error("transformer:\n  d_model: 64\n  hedas: 4\n");
    assert_eq!(e.line, 3, "{e}");
    assert!(e.message.contains("hedas") && e.message.contains("did you mean `heads`"), "{e}");
    assert!(e.to_string().starts_with("test.yaml:3: "), "{e}");

    let e = error("transformer:\n  heads: 2\nsweep:\n  transformer.hedas: [1, 2]\n");
    assert_eq!(e.line, 4, "{e}");
    assert!(e.message.contains("did you mean transformer.heads?"), "{e}");
    assert!(e.message.contains("d_model"), "lists the allowed keys: {e}");

    let e = error("transfromer:\n  heads: 2\n");
    assert_eq!(e.line, 1, "{e}");
    assert!(e.message.contains("did you mean `transformer`"), "{e}");

    // The section's old name says where it went.
    let e = error("model:\n  heads: 2\n");
    assert_eq!(e.line, 1, "{e}");
    assert!(e.message.contains("the `model` section is now `transformer`"), "{e}");
}

#[test]
fn wrong_types_and_bad_enum_values_name_the_line_and_the_allowed_values() {
    let e = error("transformer:\n  heads: four\n");
    assert_eq!(e.line, 2, "{e}");
    assert!(e.message.contains("transformer.heads"), "{e}");

    let e = error("transformer:\n  pe: rotary-ish\n");
    assert_eq!(e.line, 2, "{e}");
    assert!(e.message.contains("none") && e.message.contains("sinusoidal") && e.message.contains("learned"), "{e}");

    let e = error("transformer:\n  attention:\n    scale: sqrt\n");
    assert_eq!(e.line, 3, "{e}");
    assert!(e.message.contains("sqrt_dk"), "{e}");

    // A bad value inside a sweep list points at that value's line.
    let e = error("sweep:\n  transformer.pe:\n    - none\n    - learnt\n");
    assert_eq!(e.line, 4, "{e}");
}

#[test]
fn impossible_combinations_point_at_the_sweep_value_that_causes_them() {
    let e = error("transformer:\n  d_model: 96\nsweep:\n  transformer.heads:\n    - 2\n    - 5\n");
    assert_eq!(e.line, 6, "{e}");
    assert!(e.message.contains("allowed: 1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 96"), "{e}");

    let e = error("transformer:\n  d_model: 100\n  heads: 8\n");
    assert_eq!(e.line, 3, "{e}");

    let e = error("train:\n  lr: -0.1\n");
    assert_eq!(e.line, 2, "{e}");
    assert!(e.message.contains("train.lr"), "{e}");

    let e = error("data:\n  path: /no/such/file.txt\n");
    assert_eq!(e.line, 2, "{e}");
    assert!(e.message.contains("no such file"), "{e}");
}

#[test]
fn malformed_sweeps_and_yaml_are_reported_with_their_line() {
    let e = error("sweep:\n  transformer.heads: []\n");
    assert_eq!(e.line, 2, "{e}");
    assert!(e.message.contains("non-empty list"), "{e}");

    let e = error("sweep:\n  transformer.heads: 4\n");
    assert!(e.message.contains("non-empty list"), "{e}");

    let e = error("transformer:\n  heads: [1, 2\n");
    assert!(e.message.contains("YAML syntax error"), "{e}");
    assert!(e.line >= 2, "{e}");

    let e = error("seeds: []\n");
    assert_eq!(e.line, 1, "{e}");

    let e = error("sweep:\n  transformer.heads.x: [1]\n");
    assert!(e.message.contains("is a value, not a section"), "{e}");
}

#[test]
fn every_shipped_recipe_loads_and_expands() {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("recipes");
    let mut count = 0;
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|e| e == "yaml") {
            if ablate::run::complexity::is_complexity_recipe(&path) {
                ablate::run::complexity::load(&path, false).unwrap_or_else(|e| panic!("{e}"));
            } else {
                let r = ablate::recipe::load(&path, false).unwrap_or_else(|e| panic!("{e}"));
                assert!(!r.runs.is_empty());
            }
            count += 1;
        }
    }
    assert!(count >= 2);
}

fn tiny_recipe(dir: &std::path::Path) -> String {
    let text: String = "In the beginning was the word, and the word was with the text. ".repeat(120);
    let data = dir.join("corpus.txt");
    std::fs::write(&data, text).unwrap();
    format!(
        "kind: lm\ntransformer:\n  d_model: 16\n  layers: 1\n  block_size: 16\ndata:\n  path: {}\ntrain:\n  steps: 6\n  batch_size: 4\n  eval_interval: 3\n  eval_batches: 2\n  log_interval: 2\n  probe_attention: true\nsweep:\n  transformer.heads: [1, 2]\nseeds: [0, 1]\n",
        data.display()
    )
}

#[test]
fn a_run_writes_tidy_csvs_and_plots_and_a_rerun_skips_finished_runs() {
    let dir = std::env::temp_dir().join(format!("ablate-recipe-test-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let recipe = parse(&tiny_recipe(&dir), "tiny.yaml", "tiny", false).unwrap();
    let out = dir.join("out");
    let opts = SweepOptions { out: &out, device: Device::Cpu, force: false, quiet: true, shard: None };
    run_recipe(&recipe, &opts).unwrap();
    let runs = ablate::judge::reading::reported_runs(&out).unwrap();
    assert_eq!(runs.len(), 4);
    for r in &runs {
        // Every resolved config value is a column, next to the parameter count and the final metrics.
        for col in [
            "transformer.heads",
            "transformer.d_model",
            "train.lr",
            "data.path",
            "params",
            "test_loss",
            "test_perplexity",
            "tokens_per_s",
            "wall_s",
        ] {
            assert!(r.contains_key(col), "missing column {col}");
        }
        let loss: f64 = r["test_loss"].parse().unwrap();
        let ppl: f64 = r["test_perplexity"].parse().unwrap();
        assert!((loss.exp() - ppl).abs() < 1e-3 * ppl);
    }
    let curves = ablate::judge::reading::curves_of(&out).unwrap();
    let first = &curves["transformer.heads=1 seed=0"];
    assert_eq!(first["val/loss"].iter().map(|p| p.0).collect::<Vec<_>>(), vec![0, 3, 6]);
    assert!(first.contains_key("val/attn_entropy") && first.contains_key("train/grad_norm"));
    for png in ["val_loss.png", "final_test_loss.png", "attn_entropy.png"] {
        let bytes = std::fs::read(out.join(png)).unwrap();
        assert_eq!(&bytes[1..4], b"PNG", "{png}");
    }
    assert!(out.join("recipe.resolved.yaml").exists());

    // Same seed, same config: identical metrics (CPU determinism), and a re-run trains nothing.
    assert_eq!(runs[0]["test_loss"], ablate::judge::reading::reported_runs(&out).unwrap()[0]["test_loss"]);
    let before = std::fs::read_to_string(out.join("curves.csv")).unwrap();
    run_recipe(&recipe, &opts).unwrap();
    assert_eq!(std::fs::read_to_string(out.join("curves.csv")).unwrap(), before);
    assert_eq!(ablate::judge::reading::reported_runs(&out).unwrap().len(), 4);

    // A run killed before its row was written leaves orphan curve rows: they are dropped, the run redone.
    let runs_text = std::fs::read_to_string(out.join("runs.csv")).unwrap();
    let kept: Vec<&str> = runs_text.lines().take(4).collect(); // header + 3 runs
    std::fs::write(out.join("runs.csv"), kept.join("\n") + "\n").unwrap();
    run_recipe(&recipe, &opts).unwrap();
    let rerun = ablate::judge::reading::reported_runs(&out).unwrap();
    assert_eq!(rerun.len(), 4);
    assert_eq!(rerun[3]["test_loss"], runs[3]["test_loss"], "a re-run of the same seed reproduces its metrics");
    assert_eq!(std::fs::read_to_string(out.join("curves.csv")).unwrap().lines().count(), before.lines().count());

    // The summary: one row per variant, the mean of its seeds' final test loss.
    let table =
        ablate::judge::summary::summary_table(&ablate::judge::reading::Results::open(&out, &recipe, None).unwrap())
            .unwrap();
    let rows: Vec<&str> = table.lines().filter(|l| l.starts_with("| heads=")).collect();
    assert_eq!(rows.len(), 2, "{table}");
    let heads1: Vec<f64> = runs[..2].iter().map(|r| r["test_loss"].parse().unwrap()).collect();
    let mean = (heads1[0] + heads1[1]) / 2.0;
    assert!(rows[0].starts_with(&format!("| heads=1 | 2 | {mean:.4} ± ")), "{table}");
    // With a baseline: the other variant paired with it on both seeds.
    let heads2: Vec<f64> = runs[2..].iter().map(|r| r["test_loss"].parse().unwrap()).collect();
    let difference = (heads2[0] - heads1[0] + heads2[1] - heads1[1]) / 2.0;
    let table = ablate::judge::summary::summary_table(
        &ablate::judge::reading::Results::open(&out, &recipe, Some(Pairing::Baseline("heads=1"))).unwrap(),
    )
    .unwrap();
    assert!(table.contains("Paired against `heads=1`"), "{table}");
    let paired_row = table.lines().find(|l| l.starts_with("| heads=2 | test loss")).expect("paired row");
    assert!(paired_row.contains(&format!("| 2 | {difference:+.4} [")), "{table}");
    for bad in ["heads=3", "nonsense=1", "heads"] {
        let e = ablate::judge::summary::summary_table(
            &ablate::judge::reading::Results::open(&out, &recipe, Some(Pairing::Baseline(bad))).unwrap(),
        )
        .unwrap_err()
        .to_string();
        assert!(e.starts_with(&format!("--baseline {bad}:")) && !e.contains('\n'), "{e}");
    }
    // As a ladder of two rungs: the one step is the same comparison.
    let ladder = ablate::judge::summary::summary_table(
        &ablate::judge::reading::Results::open(&out, &recipe, Some(Pairing::Ladder)).unwrap(),
    )
    .unwrap();
    let step = ladder.lines().find(|l| l.starts_with("| heads=2 vs heads=1 | test loss")).expect("ladder row");
    assert!(step.contains(&format!("| 2 | {difference:+.4} [")), "{ladder}");

    // The directory is the reference for a rerun elsewhere: the same runs reproduce it, and runs with an
    // override are not compared with it (their configuration differs).
    let again = dir.join("again");
    run_recipe(&recipe, &SweepOptions { out: &again, ..opts }).unwrap();
    let verdicts =
        ablate::judge::reproduce::compare(&ablate::judge::reading::Results::open(&again, &recipe, None).unwrap(), &out)
            .unwrap()
            .unwrap();
    assert_eq!(verdicts.len(), 4, "2 variants × held-out loss and perplexity");
    assert!(verdicts.iter().all(|v| v.verdict == "reproduces"), "{verdicts:?}");
    // A reference made before a key existed: without its column it still reproduces while the key is unset
    // (empty), and is stale, naming the key, once the key has a value.
    let without = |column: &str| {
        let old = dir.join(format!("without-{column}"));
        std::fs::create_dir_all(&old).unwrap();
        for f in ["curves.csv", "recipe.resolved.yaml"] {
            std::fs::copy(out.join(f), old.join(f)).unwrap();
        }
        let mut reader = csv::Reader::from_path(out.join("runs.csv")).unwrap();
        let header = reader.headers().unwrap().clone();
        let keep: Vec<usize> = (0..header.len()).filter(|&i| &header[i] != column).collect();
        let mut writer = csv::Writer::from_path(old.join("runs.csv")).unwrap();
        writer.write_record(keep.iter().map(|&i| &header[i])).unwrap();
        for row in reader.records() {
            let row = row.unwrap();
            writer.write_record(keep.iter().map(|&i| &row[i])).unwrap();
        }
        writer.flush().unwrap();
        ablate::judge::reproduce::compare(&ablate::judge::reading::Results::open(&again, &recipe, None).unwrap(), &old)
            .unwrap()
            .unwrap()
    };
    assert_eq!(runs[0]["transformer.attention.pattern.window"], "", "an unset key's column is empty");
    let unset = without("transformer.attention.pattern.window");
    assert!(unset.iter().all(|v| v.verdict == "reproduces"), "{unset:?}");
    let set = without("train.lr");
    assert!(set.iter().all(|v| v.verdict == "stale" && v.rule.contains("predates `train.lr`")), "{set:?}");
    let longer = Overrides::parse(&["train.steps=7".to_string()], &[], Some("0")).unwrap();
    let longer = parse_with(&tiny_recipe(&dir), "tiny.yaml", "tiny", false, &longer).unwrap();
    // Rows of other configurations are never mixed into a directory: refused before training.
    let e = run_recipe(&longer, &opts).unwrap_err().to_string();
    assert!(e.contains("holds run `transformer.heads=1 seed=0` with a different configuration"), "{e}");
    let elsewhere = dir.join("longer");
    run_recipe(&longer, &SweepOptions { out: &elsewhere, ..opts }).unwrap();
    let resolved = std::fs::read_to_string(elsewhere.join("recipe.resolved.yaml")).unwrap();
    assert!(resolved.contains("overrides:\n- train.steps=7\n- --seeds 0\n"), "{resolved}");
    let verdicts = ablate::judge::reproduce::compare(
        &ablate::judge::reading::Results::open(&elsewhere, &longer, None).unwrap(),
        &out,
    )
    .unwrap()
    .unwrap();
    assert!(
        verdicts.iter().all(|v| v.verdict == "stale"
            && v.rule.contains("train.steps 7 now, 6 in the reference")
            && v.rule.contains("with this command's overrides")
            && v.rule.contains("min of training when it was made")),
        "{verdicts:?}"
    );

    // --force starts over.
    run_recipe(&recipe, &SweepOptions { force: true, ..opts }).unwrap();
    assert_eq!(ablate::judge::reading::reported_runs(&out).unwrap().len(), 4);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn attention_knobs_reject_impossible_combinations_with_their_line() {
    let e = error("transformer:\n  block_size: 32\n  attention:\n    pattern:\n      window: 40\n");
    assert_eq!(e.line, 5, "{e}");
    assert!(e.message.contains("covers the whole sequence"), "{e}");

    let e = error("transformer:\n  attention:\n    implementation: sparse\n");
    assert_eq!(e.line, 3, "{e}");
    assert!(e.message.contains("needs a window pattern"), "{e}");

    let e = error("transformer:\n  pe: rope\n  position:\n    at: qk\n");
    assert_eq!(e.line, 4, "{e}");
    assert!(e.message.contains("an absolute encoding") && e.message.contains("transformer.pe is rope"), "{e}");

    let e = error("transformer:\n  block_size: 40\ndata:\n  task: copy\n  copy_length: 16\n");
    assert_eq!(e.line, 2, "{e}");
    assert!(e.message.contains("2·copy_length = 32"), "{e}");

    let e = error("train:\n  eval_lengths: [1]\n");
    assert!(e.message.contains("train.eval_lengths"), "{e}");

    let e = error("transformer:\n  attention:\n    pattern:\n      dilation: 2\n");
    assert!(e.message.contains("set transformer.attention.pattern.window too"), "{e}");

    let e = error("transformer:\n  pe: rotary\n");
    assert_eq!(e.line, 2, "{e}");
    assert!(e.message.contains("rope") && e.message.contains("alibi"), "{e}");
}

#[test]
fn a_swept_section_replaces_the_whole_section_and_labels_read_plainly() {
    let r = load("sweep:\n  transformer.attention:\n    - {implementation: fused}\n    - {implementation: sparse, pattern: {window: 8}}\n").unwrap();
    assert_eq!(r.runs.len(), 2);
    assert_eq!(r.runs[1].config.transformer.attention.pattern.window, Some(8));
    assert_eq!(r.runs[1].config.transformer.attention.pattern.dilation, 1, "unset fields take their defaults");
    assert_eq!(r.runs[1].label, "attention={implementation:sparse,pattern:{window:8}}");
}

/// `ablate stale` run in `root` (a tree of recipes/ and results/): its exit status, table and error line.
fn stale_in(root: &std::path::Path) -> (bool, String, String) {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_ablate")).arg("stale").current_dir(root).output().unwrap();
    (out.status.success(), String::from_utf8_lossy(&out.stdout).into(), String::from_utf8_lossy(&out.stderr).into())
}

#[test]
fn ablate_stale_fails_on_a_stale_reference_and_on_a_retirement_that_does_not_hold() {
    // A fixture tree: the shipped heads recipe and its committed runs.csv, then edits a change would make.
    let repo = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let root = std::env::temp_dir().join(format!("ablate-stale-test-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&root);
    for dir in ["recipes", "results/heads"] {
        std::fs::create_dir_all(root.join(dir)).unwrap();
    }
    let recipe = std::fs::read_to_string(repo.join("recipes/heads.yaml")).unwrap();
    std::fs::copy(repo.join("results/heads/runs.csv"), root.join("results/heads/runs.csv")).unwrap();
    let write = |name: &str, text: &str| std::fs::write(root.join(format!("recipes/{name}.yaml")), text).unwrap();

    write("heads", &recipe);
    let (ok, table, _) = stale_in(&root);
    assert!(ok && table.contains("| `recipes/heads.yaml` | `results/heads` | current |"), "{table}");

    // The model's training changed under the reference: stale, and the command fails naming it.
    assert!(recipe.contains("  steps: 1500\n"));
    write("heads", &recipe.replace("  steps: 1500\n", "  steps: 1400\n"));
    let (ok, table, err) = stale_in(&root);
    assert!(!ok && table.contains("**stale**") && table.contains("train.steps"), "{table}");
    assert!(err.contains("1 reference(s) not current: results/heads is stale"), "{err}");

    // Retired while its results are still committed, and with a successor that is no shipped recipe.
    let retired = format!("{recipe}retired:\n  reason: answered elsewhere\n  successors: [heads_again]\n");
    write("heads", &retired);
    let (ok, _, err) = stale_in(&root);
    assert!(!ok && err.contains("results/heads is still committed"), "{err}");
    assert!(err.contains("its successor heads_again is not a shipped recipe"), "{err}");

    // Retired properly: its results gone, its successor a recipe with a current reference.
    std::fs::rename(root.join("results/heads"), root.join("results/heads_again")).unwrap();
    write("heads_again", &recipe.replace("name: heads\n", "name: heads_again\n"));
    let (ok, table, err) = stale_in(&root);
    assert!(ok, "{err}");
    assert!(table.contains("**retired** → [heads_again](heads_again/README.md): answered elsewhere"), "{table}");
    assert!(table.contains("| `recipes/heads_again.yaml` | `results/heads_again` | current |"), "{table}");

    // Two references that predate one key (its column absent, as when a knob is added whose default was
    // meant to change nothing): the failure names the key and the line to add.
    let without_column = |dir: &str| {
        let path = root.join(dir).join("runs.csv");
        let mut reader = csv::Reader::from_path(repo.join("results/heads/runs.csv")).unwrap();
        let header = reader.headers().unwrap().clone();
        let drop = header.iter().position(|h| h == "train.grad_clip").expect("a recorded column");
        let mut writer = csv::Writer::from_path(&path).unwrap();
        writer.write_record(header.iter().enumerate().filter(|(i, _)| *i != drop).map(|(_, h)| h)).unwrap();
        for row in reader.records() {
            let row = row.unwrap();
            writer.write_record(row.iter().enumerate().filter(|(i, _)| *i != drop).map(|(_, v)| v)).unwrap();
        }
        writer.flush().unwrap();
    };
    write("heads", &recipe);
    std::fs::create_dir_all(root.join("results/heads")).unwrap();
    without_column("results/heads");
    without_column("results/heads_again");
    let (ok, _, err) = stale_in(&root);
    assert!(!ok && err.contains("2 reference(s) predate `train.grad_clip`"), "{err}");
    assert!(err.contains("`silent_default` in src/recipe/reads.rs (`\"train.grad_clip\" =>"), "{err}");
    std::fs::remove_dir_all(root.join("results/heads")).unwrap();
    std::fs::copy(repo.join("results/heads/runs.csv"), root.join("results/heads_again/runs.csv")).unwrap();
    write("heads", &retired);

    // A successor whose own reference is stale does not hold a retirement up.
    write(
        "heads_again",
        &recipe.replace("name: heads\n", "name: heads_again\n").replace("  steps: 1500\n", "  steps: 1400\n"),
    );
    let (ok, _, err) = stale_in(&root);
    assert!(!ok && err.contains("its successor heads_again has no current reference"), "{err}");
    std::fs::remove_dir_all(&root).unwrap();
}

#[test]
fn a_retirement_names_its_reason_and_successors_by_name() {
    let ok = load("retired:\n  reason: answered by heads\n  successors: [heads]\n").unwrap();
    assert_eq!(ok.retired.as_ref().map(|r| r.successors.clone()), Some(vec!["heads".to_string()]));
    let e = error("retired:\n  reason: answered by heads\n  successors: [recipes/heads.yaml]\n");
    assert!(e.to_string().contains("is not a recipe name"), "{e}");
    assert_eq!(e.line, 3, "{e}");
    let e = error("retired:\n  reason: \" \"\n");
    assert!(e.to_string().contains("say why"), "{e}");
    let e = error("retired:\n  why: no\n");
    assert!(e.to_string().contains("why"), "{e}");
}
