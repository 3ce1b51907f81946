//! Running an expanded recipe: load every data set and check every run before training anything, skip runs
//! already in `runs.csv`, train the rest with a progress bar, then draw the plots from the CSV files.
use anyhow::{Context, Result};
use indicatif::{ProgressBar, ProgressStyle};
use std::collections::{BTreeMap, HashMap};
use std::path::Path;
use tch::Device;

use crate::bert_tasks::train_bert;
use crate::checkpoint::file_stem;
use crate::data::Dataset;
use crate::images::ImageTask;
use crate::plot::{line_chart, mean_std, variant_curves, Axes, Series};
use crate::recipe::Recipe;
use crate::results::{read_curves, read_runs, write_atomically, ResultsDir};
use crate::scale::Shard;
use crate::train::{train_resumable, StateFile};
use crate::translate::{train_translator, TranslationData};
use crate::vision::classify::train_classifier;
use crate::vision::imagegpt::train_image_gpt;

pub struct SweepOptions<'a> {
    pub out: &'a Path,
    pub device: Device,
    pub force: bool,
    pub quiet: bool,
    /// Train only this deterministic slice of the runs, into `<out>/shards/<i>-of-<n>/`; `ablate merge`
    /// (or the worker pool) then combines the shards into `<out>`.
    pub shard: Option<Shard>,
}

/// Which tokenised text a language run reads: its data config, and the checkpoint it fine-tunes from
/// (whose vocabulary it must use).
fn text_key(config: &crate::config::Config, results_root: &Path) -> Result<String> {
    let checkpoint = config.bert.as_ref().and_then(|b| b.init_from_path(results_root));
    Ok(format!("{}{checkpoint:?}", serde_yaml::to_string(&config.data)?))
}

/// The corpus tokenised by the vocabulary a checkpoint was pre-trained with, not a freshly trained one: the
/// checkpoint's embedding rows belong to its token ids. The run's data config must name the same
/// vocabulary, so the recipe says what is used.
fn pretrained_vocabulary_data(data: &crate::config::DataConfig, checkpoint: &Path) -> Result<Dataset> {
    let (pretrained, tokenizer) = crate::checkpoint::load_description(checkpoint)
        .with_context(|| format!("bert.init_from: {}", checkpoint.display()))?;
    let vocabulary = |d: &crate::config::DataConfig| {
        let size = d.vocab_size.map(|n| format!(", vocab_size {n}")).unwrap_or_default();
        let path = d.tokenizer_path.as_ref().map(|p| format!(", tokenizer_path {p}")).unwrap_or_default();
        format!("data.tokenizer {}{size}{path}", serde_yaml::to_string(&d.tokenizer).unwrap_or_default().trim())
    };
    let (theirs, ours) = (vocabulary(&pretrained.data), vocabulary(data));
    if theirs != ours {
        anyhow::bail!(
            "bert.init_from: {} was pre-trained with {theirs}, this run has {ours}: fine-tuning reuses the checkpoint's vocabulary, so set the same",
            checkpoint.display()
        );
    }
    let text = crate::data::load_text(data)?;
    Ok(Dataset::Text(crate::data::TextData::from_text_with_tokenizer(&text, data, tokenizer)?))
}

pub fn run_recipe(recipe: &Recipe, opts: &SweepOptions) -> Result<()> {
    // Everything that can fail on input fails here, before the first step: data, block sizes, output dir.
    let mut datasets: HashMap<String, Dataset> = HashMap::new();
    let mut image_sets: HashMap<String, ImageTask> = HashMap::new();
    let mut emails: Option<Vec<crate::labelled::Email>> = None;
    let mut translations: HashMap<String, TranslationData> = HashMap::new();
    // Where `$RESULTS/` checkpoints live: the directory holding this recipe's output directory.
    let results_root = opts.out.parent().map(Path::to_path_buf).unwrap_or_default();
    for run in &recipe.runs {
        let key = serde_yaml::to_string(&run.config.data)?;
        let located = || format!("{}: run `{}`", recipe.file, run.id);
        if let Some(vision) = &run.config.vision {
            if !image_sets.contains_key(&key) {
                let images = run.config.data.images.clone().unwrap_or_default();
                image_sets.insert(key.clone(), ImageTask::load(&images).with_context(located)?);
            }
            image_sets[&key].check_model(vision).with_context(located)?;
            continue;
        }
        if let Some(tr) = &run.config.translate {
            let key = format!("{key}{:?}{}", tr.pairs, run.config.model.block_size);
            if let std::collections::hash_map::Entry::Vacant(slot) = translations.entry(key) {
                let data = TranslationData::load(&run.config.data, tr.pairs, run.config.model.block_size)
                    .with_context(located)?;
                if !opts.quiet {
                    eprintln!(
                        "ablate: {} training and {} held-out pairs, vocabulary {} ({} pairs longer than {} tokens dropped)",
                        data.train.len(),
                        data.test.len(),
                        data.tokenizer.vocab_size(),
                        data.dropped,
                        run.config.model.block_size
                    );
                }
                slot.insert(data);
            }
            continue;
        }
        let init_from = run.config.bert.as_ref().and_then(|b| b.init_from_path(&results_root));
        if let Some(path) = &init_from {
            if !path.is_file() {
                anyhow::bail!(
                    "{}: bert.init_from: no such checkpoint: {} (a $RESULTS/ path is under {}: run the recipe that saves it first)",
                    located(),
                    path.display(),
                    results_root.display()
                );
            }
        }
        let key = text_key(&run.config, &results_root)?;
        if !datasets.contains_key(&key) {
            let data = match &init_from {
                Some(path) => pretrained_vocabulary_data(&run.config.data, path),
                None => Dataset::load(&run.config.data),
            };
            datasets.insert(key.clone(), data.with_context(located)?);
        }
        if run.config.bert.as_ref().is_some_and(|b| b.task == crate::config::BertTask::Spam) && emails.is_none() {
            emails = Some(crate::labelled::spam_assassin().with_context(located)?);
        }
        datasets[&key].check_block_size(run.config.longest_window()).with_context(located)?;
    }
    let results = ResultsDir::create(&match opts.shard {
        Some(shard) => shard.dir(opts.out),
        None => opts.out.to_path_buf(),
    })?;
    if opts.force {
        results.clear()?;
    }
    let mut finished = results.finished()?;
    results.drop_orphan_curves(&finished)?;
    if opts.shard.is_some() && !opts.force && opts.out.join("runs.csv").exists() {
        // Runs already merged into the main results count as finished for every shard.
        finished.extend(ResultsDir { dir: opts.out.to_path_buf() }.finished()?);
    }
    write_resolved(recipe, &results.dir.join("recipe.resolved.yaml"))?;

    let mine: Vec<_> =
        recipe.runs.iter().enumerate().filter(|(i, _)| opts.shard.is_none_or(|s| s.owns(*i))).map(|(_, r)| r).collect();
    let todo: Vec<_> =
        mine.iter().filter(|r| !finished.contains(&(r.id.clone(), r.config_hash.clone()))).copied().collect();
    let skipped = mine.len() - todo.len();
    if !opts.quiet {
        let shard = opts.shard.map(|s| format!(" (shard {s} of the {} runs)", recipe.runs.len())).unwrap_or_default();
        eprintln!(
            "ablate: {} — {} runs{shard} ({} already finished, {} to train) on {:?} -> {}",
            recipe.name,
            mine.len(),
            skipped,
            todo.len(),
            opts.device,
            results.dir.display()
        );
    }
    // Every shard writes the whole recipe's columns, so shards merge.
    let header = crate::results::recipe_header(&recipe.runs);
    let total_steps: u64 = todo.iter().map(|r| r.config.train.steps as u64).sum();
    let bar = if opts.quiet { ProgressBar::hidden() } else { ProgressBar::new(total_steps) };
    bar.set_style(
        ProgressStyle::with_template("{prefix} [{bar:30}] {pos}/{len} steps {msg} ({elapsed} elapsed, eta {eta})")
            .expect("valid template")
            .progress_chars("=> "),
    );
    for (k, run) in todo.iter().enumerate() {
        let data_key = serde_yaml::to_string(&run.config.data)?;
        let text_key = text_key(&run.config, &results_root)?;
        bar.set_prefix(format!("run {}/{} [{}]", skipped + k + 1, mine.len(), run.id));
        let steps = run.config.train.steps;
        let before = bar.position();
        let mut progress = |step: i64, loss: f64| {
            bar.set_position(before + step as u64);
            if step % 10 == 0 || step == steps {
                bar.set_message(format!("step {step}/{steps} loss {loss:.4}"));
            }
        };
        let state = StateFile {
            path: results.dir.join("checkpoints").join(format!("{}.state.safetensors", file_stem(&run.id))),
            config_hash: run.config_hash.clone(),
        };
        let image_gpt = run.config.vision.as_ref().is_some_and(|v| v.arch == crate::vision::Arch::ImageGpt);
        // Each kind of run trains and hands back its weights, and the tokenizer when it has one.
        let (outcome, vs, tokenizer) = if let Some(tr) = &run.config.translate {
            let key = format!("{data_key}{:?}{}", tr.pairs, run.config.model.block_size);
            let trained = train_translator(&run.config, &translations[&key], opts.device, &mut progress, Some(&state))
                .with_context(|| format!("run `{}`", run.id))?;
            (trained.outcome, trained.vs, None)
        } else if run.config.bert.is_some() {
            let Dataset::Text(text) = &datasets[&text_key] else { unreachable!("validated: BERT reads text") };
            // Training reads the checkpoint at its resolved path; the run's id and hash keep `$RESULTS/`.
            let mut config = run.config.clone();
            if let Some(b) = config.bert.as_mut() {
                b.init_from = b.init_from_path(&results_root).map(|p| p.display().to_string());
            }
            let trained = train_bert(&config, text, emails.as_deref(), opts.device, &mut progress, Some(&state))
                .with_context(|| format!("run `{}`", run.id))?;
            (trained.outcome, trained.vs, Some(&text.tokenizer))
        } else if image_gpt {
            let png = results.dir.join("completions").join(format!("{}.png", file_stem(&run.id)));
            let trained = train_image_gpt(
                &run.config,
                &image_sets[&data_key],
                opts.device,
                &mut progress,
                Some(&state),
                Some(&png),
            )
            .with_context(|| format!("run `{}`", run.id))?;
            (trained.outcome, trained.vs, None)
        } else if run.config.vision.is_some() {
            let trained =
                train_classifier(&run.config, &image_sets[&data_key], opts.device, &mut progress, Some(&state))
                    .with_context(|| format!("run `{}`", run.id))?;
            (trained.outcome, trained.vs, None)
        } else {
            let data = &datasets[&text_key];
            let trained = train_resumable(&run.config, data, opts.device, &mut progress, Some(&state))
                .with_context(|| format!("run `{}`", run.id))?;
            (trained.outcome, trained.vs, Some(data.tokenizer()))
        };
        if run.config.train.checkpoint {
            let dir = results.dir.join("checkpoints");
            match tokenizer {
                Some(t) => crate::checkpoint::save(&dir, &run.id, &run.config, t, &vs)?,
                None => crate::checkpoint::save_weights(&dir, &run.id, &run.config, &vs)?,
            };
        }
        results.append(&header, run, &outcome)?;
        if !opts.quiet {
            // indicatif drops println on a hidden bar (stderr not a terminal): print the line directly then.
            let line = if let Some(step) = outcome.diverged_at {
                format!(
                    "  {}: diverged at step {step} (loss {}), recorded; the sweep goes on",
                    run.id, outcome.final_train_loss
                )
            } else {
                let resumed = match outcome.resumed_from {
                    0 => String::new(),
                    k => format!(", resumed from step {k}"),
                };
                let e = &outcome.final_eval;
                // Perplexity means something for a language model only.
                let metrics = match run.config.vision {
                    None if run.config.bert.is_some() => {
                        let (mlm, f1) = (&outcome.extra_metrics[..2], outcome.extra_metrics[2]);
                        let next_token = run
                            .config
                            .bert
                            .as_ref()
                            .is_some_and(|b| b.objective == crate::config::PretrainObjective::NextToken);
                        let pretrained = if next_token {
                            format!("next-token loss {:.4} (acc {:.3})", e.loss, e.accuracy)
                        } else if mlm[0].is_finite() {
                            format!("masked-LM loss {:.4} (acc {:.3})", mlm[0], mlm[1])
                        } else if let Some(path) = run.config.bert.as_ref().and_then(|b| b.init_from.as_deref()) {
                            let name = Path::new(path).file_stem().unwrap_or_default().to_string_lossy();
                            format!("from checkpoint {name}")
                        } else {
                            "no pre-training".to_string()
                        };
                        let exact = match outcome.extra_metrics.get(3) {
                            Some(x) => format!(", exact match {x:.4}"),
                            None => String::new(),
                        };
                        if f1.is_finite() {
                            format!(
                                "{pretrained}; task loss {:.4}, accuracy {:.4}, F1 {f1:.4}{exact}",
                                e.loss, e.accuracy
                            )
                        } else {
                            pretrained
                        }
                    }
                    None if run.config.translate.is_some() => {
                        let beam = run.config.translate.as_ref().map_or(1, |t| t.beam_width);
                        let greedy = match beam {
                            1 => String::new(),
                            k => format!(" (beam {k}; greedy {:.2})", outcome.extra_metrics[2]),
                        };
                        format!(
                            "held-out loss {:.4} (token accuracy {:.3}), BLEU {:.2}{greedy}, exact match {:.3}",
                            e.loss, e.accuracy, outcome.extra_metrics[0], outcome.extra_metrics[1]
                        )
                    }
                    Some(_) if image_gpt => format!(
                        "test {:.4} bits/dim, next-pixel accuracy {:.4}, linear probe accuracy {:.4}",
                        outcome.extra_metrics[0], e.accuracy, outcome.extra_metrics[1]
                    ),
                    Some(_) => format!("test loss {:.4}, accuracy {:.4}", e.loss, e.accuracy),
                    None => format!("val loss {:.4} (ppl {:.2}, acc {:.3})", e.loss, e.loss.exp(), e.accuracy),
                };
                format!(
                    "  {}: {metrics}, {:.0} tokens/s, MFU {:.1}%, {:.1}s{resumed}",
                    run.id,
                    outcome.tokens_per_s,
                    outcome.mfu * 100.0,
                    outcome.wall_s
                )
            };
            if bar.is_hidden() {
                eprintln!("{line}");
            } else {
                bar.println(line);
            }
        }
    }
    bar.finish_and_clear();
    if let Some(shard) = opts.shard {
        if !opts.quiet {
            eprintln!(
                "ablate: shard {shard} done in {}; `ablate merge {}` combines the shards",
                results.dir.display(),
                recipe.file
            );
        }
        return Ok(());
    }
    plot_results(&results.dir, &recipe.sweep_keys, &recipe.name)?;
    if !opts.quiet {
        eprintln!("ablate: wrote {}", results.dir.display());
    }
    Ok(())
}

pub fn write_resolved(recipe: &Recipe, path: &Path) -> Result<()> {
    #[derive(serde::Serialize)]
    struct Resolved<'a> {
        name: &'a str,
        source: &'a str,
        description: Option<&'a str>,
        smoke: bool,
        sweep_keys: &'a [String],
        seeds: &'a [u64],
        base: &'a crate::config::Config,
        runs: Vec<BTreeMap<&'a str, serde_yaml::Value>>,
    }
    let runs = recipe
        .runs
        .iter()
        .map(|r| {
            let mut m = BTreeMap::new();
            m.insert("id", serde_yaml::Value::from(r.id.as_str()));
            m.insert("config_hash", serde_yaml::Value::from(r.config_hash.as_str()));
            m.insert("config", serde_yaml::to_value(&r.config).expect("config serialises"));
            m
        })
        .collect();
    let resolved = Resolved {
        name: &recipe.name,
        source: &recipe.file,
        description: recipe.description.as_deref(),
        smoke: recipe.smoke,
        sweep_keys: &recipe.sweep_keys,
        seeds: &recipe.seeds,
        base: &recipe.base,
        runs,
    };
    write_atomically(path, serde_yaml::to_string(&resolved)?.as_bytes())
}

/// The variants of `runs.csv` in first-seen order, each with its run ids, labelled for legends. Diverged
/// runs keep their curves up to the blow-up; the label says so, so a short line is not mistaken for a crash
/// or a plotting bug.
pub fn variants_of(runs: &[BTreeMap<String, String>]) -> Vec<(String, Vec<String>)> {
    let mut variants: Vec<(String, Vec<String>)> = Vec::new();
    for r in runs {
        let label = r["variant"].clone();
        match variants.iter_mut().find(|v| v.0 == label) {
            Some(v) => v.1.push(r["run_id"].clone()),
            None => variants.push((label, vec![r["run_id"].clone()])),
        }
    }
    for (label, ids) in variants.iter_mut() {
        let steps: Vec<&str> = runs
            .iter()
            .filter(|r| ids.contains(&r["run_id"]))
            .filter_map(|r| r["status"].strip_prefix("diverged at step "))
            .collect();
        if steps.len() == ids.len() && ids.len() == 1 {
            label.push_str(&format!(" (diverged at step {})", steps[0]));
        } else if !steps.is_empty() {
            label.push_str(&format!(" ({} of {} runs diverged)", steps.len(), ids.len()));
        }
    }
    variants
}

/// Draws every plot of a results directory from its CSV files.
pub fn plot_results(dir: &Path, sweep_keys: &[String], name: &str) -> Result<()> {
    let runs = read_runs(&dir.join("runs.csv"))?;
    let curves = read_curves(&dir.join("curves.csv"))?;
    let variants = variants_of(&runs);
    let seeds = runs.iter().map(|r| r["seed"].clone()).collect::<std::collections::BTreeSet<_>>().len();
    let band = if seeds > 1 { format!(" (mean ± std over {seeds} seeds)") } else { String::new() };
    let charts = [
        ("val/loss", "val_loss.png", "held-out loss (nats/token)"),
        ("val/accuracy", "val_accuracy.png", "held-out next-token accuracy"),
        ("train/loss", "train_loss.png", "training loss (nats/token)"),
        ("train/grad_norm", "grad_norm.png", "gradient norm (before clipping)"),
        ("val/attn_entropy", "attn_entropy.png", "mean attention entropy (nats)"),
        ("val/attn_max_weight", "attn_max_weight.png", "mean of each row's largest attention weight"),
        ("val/bits_per_dim", "bits_per_dim.png", "test bits per dimension"),
        ("val/f1", "f1.png", "test F1 (spam: the positive class; punctuation: the marks; locate: the spans)"),
        ("val/exact_match", "exact_match.png", "test exact match of the predicted spans"),
        ("val/mlm_loss", "mlm_loss.png", "masked-LM held-out loss (nats/masked token)"),
        ("pretrain_val/mlm_loss", "pretrain_mlm_loss.png", "masked-LM held-out loss during pre-training"),
    ];
    for (metric, file, y_label) in charts {
        let series = variant_curves(&curves, &variants, metric);
        if series.is_empty() {
            continue;
        }
        let title = format!("{name}: {y_label}{band}");
        line_chart(
            &dir.join(file),
            &series,
            &Axes { title: &title, x_label: "step", y_label, x_categories: None, zoom_past_start: true },
        )?;
    }
    // Data efficiency of pre-training objectives: held-out loss against the tokens read and against the
    // tokens that carried loss (the x values differ between variants, so steps cannot stand in).
    let losses = variant_curves(&curves, &variants, "val/loss");
    for (axis, file, x_label) in [
        ("val/tokens_seen", "val_loss_by_tokens_seen.png", "tokens seen"),
        ("val/tokens_predicted", "val_loss_by_tokens_predicted.png", "tokens predicted (carrying loss)"),
    ] {
        let xs = variant_curves(&curves, &variants, axis);
        let series: Vec<Series> = losses
            .iter()
            .filter_map(|y| {
                let x = xs.iter().find(|x| x.label == y.label)?;
                let tokens: BTreeMap<i64, f64> = x.points.iter().map(|&(s, t, _)| (s as i64, t)).collect();
                let points = y.points.iter().filter_map(|&(s, m, sd)| Some((tokens.get(&(s as i64)).copied()?, m, sd)));
                Some(Series { label: y.label.clone(), points: points.collect() })
            })
            .collect();
        if series.is_empty() {
            continue;
        }
        let y_label = "held-out loss of the objective (nats/predicted token)";
        let title = format!("{name}: held-out loss against {x_label}{band}");
        line_chart(
            &dir.join(file),
            &series,
            &Axes { title: &title, x_label, y_label, x_categories: None, zoom_past_start: true },
        )?;
    }
    length_generalisation_chart(dir, name, &runs, &variants, &band)?;
    if let Some(x_key) = sweep_keys.first() {
        for (column, file, y_label) in [
            ("val_loss", "final_val_loss.png", "final held-out loss"),
            ("val_accuracy", "final_val_accuracy.png", "final held-out accuracy"),
            ("bits_per_dim", "final_bits_per_dim.png", "final test bits per dimension"),
            ("probe_accuracy", "final_probe_accuracy.png", "linear-probe test accuracy"),
            ("f1", "final_f1.png", "final test F1"),
            ("exact_match", "final_exact_match.png", "final test exact match"),
            ("mlm_loss", "final_mlm_loss.png", "masked-LM held-out loss after pre-training"),
            ("bleu", "final_bleu.png", "BLEU on held-out pairs"),
            ("bleu_greedy", "final_bleu_greedy.png", "BLEU of greedy decoding (same models)"),
        ] {
            if runs.first().is_none_or(|r| !r.contains_key(column)) {
                continue;
            }
            let series = final_metric_series(&runs, x_key, &sweep_keys[1..], column);
            if series.is_empty() {
                // No run has this metric (e.g. no BERT run of the recipe was pre-trained by masked-LM).
                continue;
            }
            let categories = x_categories(&runs, x_key);
            let title = format!("{name}: {y_label} against {x_key}{band}");
            line_chart(
                &dir.join(file),
                &series,
                &Axes {
                    title: &title,
                    x_label: x_key,
                    y_label,
                    x_categories: Some(&categories),
                    zoom_past_start: false,
                },
            )?;
        }
    }
    Ok(())
}

/// Distinct values of `key` in `runs.csv`, in first-seen order (the x positions of the final-metric plot).
fn x_categories(runs: &[BTreeMap<String, String>], key: &str) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for r in runs {
        if let Some(v) = r.get(key).or_else(|| r.get("variant")) {
            if !out.contains(v) {
                out.push(v.clone());
            }
        }
    }
    out
}

/// One series per combination of the other swept keys: the final `column` against the first swept key.
fn final_metric_series(
    runs: &[BTreeMap<String, String>],
    x_key: &str,
    other_keys: &[String],
    column: &str,
) -> Vec<Series> {
    let cats = x_categories(runs, x_key);
    let mut groups: Vec<(String, BTreeMap<usize, Vec<f64>>)> = Vec::new();
    for r in runs {
        let label = if other_keys.is_empty() {
            column.to_string()
        } else {
            other_keys
                .iter()
                .map(|k| {
                    format!("{}={}", k.rsplit('.').next().unwrap_or(k), r.get(k).map(String::as_str).unwrap_or(""))
                })
                .collect::<Vec<_>>()
                .join(" ")
        };
        // A swept section (e.g. `model.attention`) has no column of its own: its variant label stands in.
        let x = r.get(x_key).or_else(|| r.get("variant"));
        let (Some(x), Some(Ok(v))) = (x, r.get(column).map(|v| v.parse::<f64>())) else { continue };
        let xi = cats.iter().position(|c| c == x).expect("category listed");
        let idx = match groups.iter().position(|g| g.0 == label) {
            Some(i) => i,
            None => {
                groups.push((label, BTreeMap::new()));
                groups.len() - 1
            }
        };
        groups[idx].1.entry(xi).or_default().push(v);
    }
    groups
        .into_iter()
        .map(|(label, by_x)| Series {
            label,
            points: by_x
                .into_iter()
                .map(|(x, vs)| {
                    let (m, sd) = mean_std(&vs);
                    (x as f64, m, sd)
                })
                .collect(),
        })
        .collect()
}

/// Held-out loss at the training length and at every `train.eval_lengths` multiple, one line per variant
/// (a variant whose position table cannot read a length has no point there).
fn length_generalisation_chart(
    dir: &Path,
    name: &str,
    runs: &[BTreeMap<String, String>],
    variants: &[(String, Vec<String>)],
    band: &str,
) -> Result<()> {
    let Some(first) = runs.first() else { return Ok(()) };
    let mut columns = vec![("1".to_string(), "val_loss".to_string())];
    columns.extend(
        first
            .keys()
            .filter_map(|k| k.strip_prefix("val_loss_x").map(|m| (m.to_string(), k.clone())))
            .collect::<Vec<_>>(),
    );
    if columns.len() == 1 {
        return Ok(());
    }
    columns.sort_by_key(|(m, _)| m.parse::<i64>().unwrap_or(0));
    let block = first.get("model.block_size").cloned().unwrap_or_default();
    let categories: Vec<String> = columns
        .iter()
        .map(|(m, _)| format!("{m}× ({} tokens)", m.parse::<i64>().unwrap_or(1) * block.parse::<i64>().unwrap_or(0)))
        .collect();
    let series: Vec<Series> = variants
        .iter()
        .filter_map(|(label, ids)| {
            let points: Vec<(f64, f64, f64)> = columns
                .iter()
                .enumerate()
                .filter_map(|(x, (_, col))| {
                    let values: Vec<f64> = runs
                        .iter()
                        .filter(|r| ids.contains(&r["run_id"]))
                        .filter_map(|r| r.get(col).and_then(|v| v.parse::<f64>().ok()))
                        .collect();
                    (!values.is_empty()).then(|| {
                        let (m, sd) = mean_std(&values);
                        (x as f64, m, sd)
                    })
                })
                .collect();
            (!points.is_empty()).then(|| Series { label: label.clone(), points })
        })
        .collect();
    let title = format!("{name}: held-out loss at longer sequences than trained on{band}");
    line_chart(
        &dir.join("length_generalisation.png"),
        &series,
        &Axes {
            title: &title,
            x_label: "evaluation length (multiple of the training block)",
            y_label: "held-out loss",
            x_categories: Some(&categories),
            zoom_past_start: false,
        },
    )
}

/// A markdown table of a results directory: per variant, the number of runs (and how many diverged), mean ±
/// std over seeds of the final held-out loss, accuracy and train loss, and mean tokens/s and MFU.
pub fn summary_table(dir: &Path) -> Result<String> {
    let path = dir.join("runs.csv");
    let runs = read_runs(&path).with_context(|| format!("no results to summarise in {}", dir.display()))?;
    let columns = [("val_loss", 4), ("val_accuracy", 4), ("train_loss", 4), ("tokens_per_s", 0), ("mfu", 3)];
    let mut out = String::from(
        "| variant | runs | held-out loss | held-out accuracy | final train loss | tokens/s | MFU |\n|---|---|---|---|---|---|---|\n",
    );
    for (label, ids) in variants_of(&runs) {
        let rows: Vec<_> = runs.iter().filter(|r| ids.contains(&r["run_id"])).collect();
        let mut cells = vec![label, rows.len().to_string()];
        for (i, (column, digits)) in columns.iter().enumerate() {
            let values: Vec<f64> =
                rows.iter().filter_map(|r| r.get(*column).and_then(|v| v.parse::<f64>().ok())).collect();
            cells.push(match values.len() {
                0 => "–".to_string(),
                _ if i >= 3 => format!("{:.digits$}", mean_std(&values).0),
                1 => format!("{:.digits$}", values[0]),
                _ => {
                    let (m, s) = mean_std(&values);
                    format!("{m:.digits$} ± {s:.digits$}")
                }
            });
        }
        out.push_str(&format!("| {} |\n", cells.join(" | ")));
    }
    Ok(out)
}
