//! TensorBoard's own reader sees what the CSV files hold: every curve as scalars, and in the HParams tab
//! one session group per variant with its seeds as sessions and the final metrics of `runs.csv`, each
//! metric's description with its verdicts; in the TEXT tab, the summary's verdict block.
//! Needs PyPI's `tensorboard` (bin/test installs it into the cache and sets ABLATE_TENSORBOARD_PYTHONPATH).
use ablate::recipe::parse;
use ablate::run::sweep::{run_recipe, SweepOptions};
use ablate::tasks::checkpoint::file_stem;
use serde_json::Value;
use std::process::Command;
use tch::Device;

fn close(a: f64, b: f64) -> bool {
    // Event files store scalars as 32-bit floats.
    (a - b).abs() <= 1e-6 * b.abs().max(1.0)
}

#[test]
fn tensorboard_reads_the_same_numbers_as_the_csv() {
    let site = std::env::var("ABLATE_TENSORBOARD_PYTHONPATH")
        .expect("ABLATE_TENSORBOARD_PYTHONPATH names PyPI's tensorboard (bin/test installs it and sets it)");
    let dir = tempfile::tempdir().unwrap();
    let corpus = dir.path().join("corpus.txt");
    std::fs::write(&corpus, "A small corpus of words, read again and again by a tiny model. ".repeat(100)).unwrap();
    let text = format!(
        "kind: lm\ntransformer:\n  d_model: 16\n  layers: 1\n  block_size: 16\ndata:\n  path: {}\ntrain:\n  steps: 6\n  batch_size: 4\n  eval_interval: 3\n  eval_batches: 2\n  log_interval: 2\nsweep:\n  transformer.heads: [1, 2]\n  transformer.pre_ln: [true, false]\nseeds: [0, 1]\ncompare:\n  baseline: transformer.heads=1\n",
        corpus.display()
    );
    let recipe = parse(&text, "tb.yaml", "tb", false).unwrap();
    let out = dir.path().join("out");
    let opts = SweepOptions { out: &out, device: Device::Cpu, force: false, quiet: true, shard: None };
    run_recipe(&recipe, &opts).unwrap();

    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/reference/tensorboard_read.py");
    let reply =
        Command::new("python3").arg(script).arg(out.join("tensorboard")).env("PYTHONPATH", &site).output().unwrap();
    assert!(reply.status.success(), "{}", String::from_utf8_lossy(&reply.stderr));
    let seen: Value = serde_json::from_slice(&reply.stdout).unwrap();

    // Scalars: every curve point of every run, and the final metrics.
    let runs = ablate::judge::reading::reported_runs(&out).unwrap();
    let curves = ablate::judge::reading::curves_of(&out).unwrap();
    assert_eq!(seen["scalars"].as_object().unwrap().len(), runs.len());
    for row in &runs {
        let id = &row["run_id"];
        let scalars = &seen["scalars"][file_stem(id)];
        for (tag, points) in &curves[id] {
            let read: Vec<(i64, f64)> = scalars[tag]
                .as_array()
                .unwrap_or_else(|| panic!("{id}: no scalar {tag}"))
                .iter()
                .map(|p| (p[0].as_i64().unwrap(), p[1].as_f64().unwrap()))
                .collect();
            assert_eq!(read.len(), points.len(), "{id} {tag}");
            for (r, p) in read.iter().zip(points) {
                assert!(r.0 == p.0 && close(r.1, p.1), "{id} {tag}: {r:?} vs {p:?}");
            }
        }
        for tag in ["train/lr", "train/grad_norm", "val/loss"] {
            assert!(scalars[tag].is_array(), "{id}: {tag}");
        }
        let throughput = scalars["final/tokens_per_s"][0][1].as_f64().unwrap();
        assert!(close(throughput, row["tokens_per_s"].parse().unwrap()));
    }

    // HParams: the swept keys as hyper-parameters, one group per variant holding its two seeds.
    let names: Vec<&str> =
        seen["experiment"]["hparamInfos"].as_array().unwrap().iter().map(|h| h["name"].as_str().unwrap()).collect();
    assert_eq!(names.len(), 2);
    assert!(names.contains(&"transformer.heads") && names.contains(&"transformer.pre_ln"));
    let metric_tags: Vec<&str> = seen["experiment"]["metricInfos"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["name"]["tag"].as_str().unwrap())
        .collect();
    assert!(metric_tags.contains(&"final/test_loss"), "{metric_tags:?}");
    // The verdicts (heads=2 against heads=1 within each pre_ln): each metric's in its HParams description,
    // and the summary's verdict block in the TEXT tab, as the text plugin renders it.
    let judged =
        ablate::judge::summary::judgements(&ablate::judge::reading::Results::open(&out, &recipe, None).unwrap())
            .unwrap()
            .expect("the recipe compares");
    let loss_info = seen["experiment"]["metricInfos"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["name"]["tag"] == "final/test_loss")
        .unwrap();
    let description = loss_info["description"].as_str().unwrap();
    let loss_rows: Vec<_> = judged.rows.iter().filter(|r| r.metric.column_name() == Some("test_loss")).collect();
    assert_eq!(loss_rows.len(), 2, "one comparison per level of pre_ln");
    for r in &loss_rows {
        let said = format!("{}: {}", r.comparison, r.judged.verdict.describe(&r.judged.delta_text));
        assert!(description.contains(&said), "{description} lacks {said}");
    }
    let text = seen["texts"]["verdicts"].as_str().expect("a verdicts text");
    assert!(text.contains("comparison(s) of the primary metric"), "{text}");
    assert!(!text.contains("&lt;!--"), "the README's markers stay out of the TEXT tab: {text}");
    for r in &loss_rows {
        assert!(text.contains(&r.comparison), "{text}");
    }
    let groups = seen["session_groups"].as_array().unwrap();
    assert_eq!(groups.len(), 4, "one group per variant");
    for group in groups {
        let label = group["name"].as_str().unwrap();
        let members: Vec<_> = runs.iter().filter(|r| r["label"] == label).collect();
        assert_eq!(members.len(), 2, "{label}");
        let heads: f64 = members[0]["transformer.heads"].parse().unwrap();
        assert_eq!(group["hparams"]["transformer.heads"].as_f64(), Some(heads));
        assert_eq!(group["hparams"]["transformer.pre_ln"].as_bool(), Some(members[0]["transformer.pre_ln"] == "true"));
        let sessions = group["sessions"].as_array().unwrap();
        assert_eq!(sessions.len(), 2);
        for session in sessions {
            let row = members.iter().find(|r| file_stem(&r["run_id"]) == session["name"].as_str().unwrap()).unwrap();
            assert_eq!(session["status"], "STATUS_SUCCESS");
            let loss = session["metricValues"]
                .as_array()
                .unwrap()
                .iter()
                .find(|m| m["name"]["tag"] == "final/test_loss")
                .unwrap()["value"]
                .as_f64()
                .unwrap();
            assert!(close(loss, row["test_loss"].parse().unwrap()), "{label}");
        }
    }
}
