//! Every knob of the Transformer section on every kind of model: setting it changes the model's output on
//! a fixed input, or the recipe is refused with one line naming the key and the kind. Nothing is silently
//! ignored. The refusals are listed below and must stay exactly those (each argued in the README).
mod common;
use ablate::recipe::{parse, Kind};
use ablate::tasks::{task, Built};
use ablate::transformer::attention::path_counts;
use common::knob_rows::{context, knob_value, with_variant, KNOBS};
use tch::{nn, Device, Kind as DType, Tensor};

/// A small model of each kind (data settings only where the kind's validation needs them).
fn base(kind: Kind) -> &'static str {
    match kind {
        Kind::Lm => "kind: lm\ntransformer: {d_model: 32, layers: 2, heads: 4, block_size: 16}\n",
        Kind::Bert => {
            "kind: bert\ntransformer: {d_model: 32, layers: 2, heads: 4, block_size: 16}\ndata: {tokenizer: wordpiece, vocab_size: 100}\n"
        }
        Kind::Translate => {
            "kind: translate\ntransformer: {d_model: 32, heads: 4, block_size: 16}\ndata: {tokenizer: bpe, vocab_size: 300}\n"
        }
        Kind::Vit => "kind: vit\ntransformer: {d_model: 32, layers: 2, heads: 4}\nvision: {patch_size: 7}\n",
        Kind::Swin => "kind: swin\ntransformer: {d_model: 16, heads: 2}\nvision: {patch_size: 2, depths: [1, 1], window: 7}\n",
        Kind::Davit => "kind: davit\ntransformer: {d_model: 16, heads: 2}\nvision: {patch_size: 2, depths: [2, 1], window: 7}\n",
        Kind::ImageGpt => {
            "kind: image_gpt\ntransformer: {d_model: 32, layers: 2, heads: 4}\nvision: {patch_size: 4}\nimage_gpt: {palette: 8}\n"
        }
        Kind::Cnn => "kind: cnn\ncnn: {channels: [4, 8]}\n",
        Kind::SeqClassify => {
            "kind: seq_classify\ntransformer: {d_model: 32, layers: 2, heads: 4, block_size: 16}\nseq_classify: {task: listops, min_length: 8, max_length: 16}\n"
        }
    }
}

/// Knobs that act on the initial weights only: the matrix compares the models as they initialise
/// themselves, not with every weight redrawn.
const INITIALISATION: &[&str] = &["transformer.output_init"];

/// The refusals: (kind, key, value or "" for any): where a knob cannot act, argued in the README.
const REFUSED: &[(Kind, &str, &str)] = &[
    // The encoder–decoder's depth is two numbers.
    (Kind::Translate, "transformer.layers", ""),
    // Text is one-dimensional.
    (Kind::Lm, "transformer.pe", "bias_2d"),
    (Kind::Lm, "transformer.pe", "conv"),
    (Kind::Bert, "transformer.pe", "bias_2d"),
    (Kind::Bert, "transformer.pe", "conv"),
    (Kind::Translate, "transformer.pe", "bias_2d"),
    (Kind::Translate, "transformer.pe", "conv"),
    (Kind::SeqClassify, "transformer.pe", "bias_2d"),
    (Kind::SeqClassify, "transformer.pe", "conv"),
    // A 3×3 convolution would read the pixels ImageGPT predicts.
    (Kind::ImageGpt, "transformer.pe", "conv"),
    // Image models read their grid, not a text window; classifiers have no output vocabulary.
    (Kind::Vit, "transformer.block_size", ""),
    (Kind::Swin, "transformer.block_size", ""),
    (Kind::Davit, "transformer.block_size", ""),
    (Kind::ImageGpt, "transformer.block_size", ""),
    (Kind::Vit, "transformer.tie_embeddings", ""),
    (Kind::Swin, "transformer.tie_embeddings", ""),
    (Kind::Davit, "transformer.tie_embeddings", ""),
    (Kind::SeqClassify, "transformer.tie_embeddings", ""),
    // Hierarchical models: depth per stage, 2-D windows instead of 1-D patterns, stages that change width.
    (Kind::Swin, "transformer.layers", ""),
    (Kind::Davit, "transformer.layers", ""),
    (Kind::Swin, "transformer.attention.pattern.window", ""),
    (Kind::Davit, "transformer.attention.pattern.window", ""),
    (Kind::Swin, "transformer.attention.pattern.dilation", ""),
    (Kind::Davit, "transformer.attention.pattern.dilation", ""),
    (Kind::Swin, "transformer.attention.pattern.global_every", ""),
    (Kind::Davit, "transformer.attention.pattern.global_every", ""),
    (Kind::Swin, "transformer.attention.pattern.global_tokens", ""),
    (Kind::Davit, "transformer.attention.pattern.global_tokens", ""),
    (Kind::Swin, "transformer.attention.layer_patterns", ""),
    (Kind::Davit, "transformer.attention.layer_patterns", ""),
    (Kind::Swin, "transformer.attention.implementation", "sparse"),
    (Kind::Davit, "transformer.attention.implementation", "sparse"),
    // A LayerNorm of the patch embedding comes first in Swin and DaViT, and cancels a scale.
    (Kind::Swin, "transformer.scale_embeddings", ""),
    (Kind::Davit, "transformer.scale_embeddings", ""),
    (Kind::Swin, "transformer.position.at", ""),
    (Kind::Davit, "transformer.position.at", ""),
    // Concatenated positions narrow the token embeddings: built for the decoders and ViT; BERT and the
    // encoder–decoder sum (and tie) their embeddings, Swin and DaViT normalise their patch embedding.
    (Kind::Bert, "transformer.position.combine", ""),
    (Kind::Translate, "transformer.position.combine", ""),
    (Kind::Swin, "transformer.position.combine", ""),
    (Kind::Davit, "transformer.position.combine", ""),
    (Kind::Bert, "transformer.position.concat_dim", ""),
    (Kind::Translate, "transformer.position.concat_dim", ""),
    (Kind::Swin, "transformer.position.concat_dim", ""),
    (Kind::Davit, "transformer.position.concat_dim", ""),
    // Parallel blocks join self-attention and the FFN; the encoder–decoder's decoder cross-attends between.
    (Kind::Translate, "transformer.parallel", ""),
    // Hierarchical models change width between stages and act between a block's branches.
    (Kind::Swin, "transformer.parallel", ""),
    (Kind::Davit, "transformer.parallel", ""),
    // Value embeddings are looked up by token id; image classifiers embed patches.
    (Kind::Vit, "transformer.value_embeddings", ""),
    (Kind::Swin, "transformer.value_embeddings", ""),
    (Kind::Davit, "transformer.value_embeddings", ""),
    (Kind::Swin, "transformer.value_residual", ""),
    (Kind::Davit, "transformer.value_residual", ""),
    (Kind::Swin, "transformer.unet_skips", ""),
    (Kind::Davit, "transformer.unet_skips", ""),
    (Kind::Swin, "transformer.attention.pattern.window_schedule", ""),
    (Kind::Davit, "transformer.attention.pattern.window_schedule", ""),
    // muP's readout multiplier and per-layer rates are built for the decoder's LM head.
    (Kind::Bert, "transformer.parametrisation", ""),
    (Kind::Translate, "transformer.parametrisation", ""),
    (Kind::Vit, "transformer.parametrisation", ""),
    (Kind::Swin, "transformer.parametrisation", ""),
    (Kind::Davit, "transformer.parametrisation", ""),
    (Kind::ImageGpt, "transformer.parametrisation", ""),
    (Kind::SeqClassify, "transformer.parametrisation", ""),
    (Kind::Bert, "transformer.mup_base_width", ""),
    (Kind::Translate, "transformer.mup_base_width", ""),
    (Kind::Vit, "transformer.mup_base_width", ""),
    (Kind::Swin, "transformer.mup_base_width", ""),
    (Kind::Davit, "transformer.mup_base_width", ""),
    (Kind::ImageGpt, "transformer.mup_base_width", ""),
    (Kind::SeqClassify, "transformer.mup_base_width", ""),
    // DaViT's channel blocks score over tokens: no halves of q and k to difference.
    (Kind::Davit, "transformer.attention.differential", ""),
];

fn refused_expected(kind: Kind, key: &str, value: &str) -> bool {
    // The convolutional baseline has no Transformer: its whole section is refused.
    kind == Kind::Cnn || REFUSED.iter().any(|&(k, rk, rv)| k == kind && rk == key && (rv.is_empty() || rv == value))
}

/// A recipe of `kind` whose single variant sets `settings` (dotted key, YAML value).
fn recipe(kind: Kind, settings: &[(String, String)]) -> String {
    with_variant(base(kind), settings)
}

/// Builds the run's model with every parameter drawn at random (so that zero-initialised biases and unit
/// norms count), after copying what `from` has under the same name and shape; with `as_initialised`, as the
/// model initialises itself instead (for the knobs that shape the initialisation).
fn build(
    cfg: &ablate::recipe::Config,
    from: Option<&nn::VarStore>,
    as_initialised: bool,
) -> (nn::VarStore, Box<dyn Built>) {
    tch::manual_seed(7);
    let vs = nn::VarStore::new(Device::Cpu);
    let model = task(cfg.kind).build(cfg, &vs.root(), 50);
    if as_initialised {
        return (vs, model);
    }
    tch::no_grad(|| {
        let theirs = from.map(|f| f.variables()).unwrap_or_default();
        let mut names: Vec<(String, Tensor)> = vs.variables().into_iter().collect();
        names.sort_by(|a, b| a.0.cmp(&b.0));
        for (name, mut var) in names {
            match theirs.get(&name).filter(|t| t.size() == var.size()) {
                Some(t) => var.copy_(t),
                None => {
                    let random = Tensor::randn(var.size(), (DType::Float, Device::Cpu)) * 0.3;
                    // A variance must stay positive (BatchNorm's running statistics).
                    let random = if name.ends_with("running_var") { random.abs() + 0.5 } else { random };
                    var.copy_(&random);
                }
            }
        }
    });
    (vs, model)
}

fn output(model: &dyn Built, train: bool) -> Tensor {
    tch::manual_seed(11);
    tch::no_grad(|| model.forward_example(2, train, tch::Device::Cpu))
}

#[test]
fn every_transformer_knob_changes_every_kind_of_model_or_is_refused_with_one_line() {
    let _serial = common::serial();
    let mut matrix = String::new();
    let mut failures = Vec::new();
    for kind in Kind::ALL {
        let defaults = parse(&recipe(kind, &[]), "base.yaml", "base", false).unwrap().runs[0].config.clone();
        for &(key, value, extra) in KNOBS {
            let value = knob_value(key, value, &defaults);
            let shared = context(extra);
            let mut settings = shared.clone();
            settings.push((key.to_string(), value.clone()));
            let what = format!("{kind} {key}={value}");
            // A setting equal to the kind's default would test nothing.
            let a = match parse(&recipe(kind, &shared), "a.yaml", "a", false) {
                Ok(r) => r.runs[0].config.clone(),
                Err(e) => {
                    // The shared context itself is refused (e.g. a 1-D pattern on Swin): so is the knob.
                    assert!(refused_expected(kind, key, &value), "{what}: context refused: {e}");
                    matrix.push_str(&format!("{what}: refused (context)\n"));
                    continue;
                }
            };
            match parse(&recipe(kind, &settings), "b.yaml", "b", false) {
                Err(e) => {
                    let line = e.to_string();
                    assert_eq!(line.lines().count(), 1, "{what}: {line}");
                    if !refused_expected(kind, key, &value) {
                        failures.push(format!("{what}: refused unexpectedly: {line}"));
                    } else if !(line.contains(key) || line.contains(&value)) {
                        failures.push(format!("{what}: the refusal does not name the key: {line}"));
                    }
                    matrix.push_str(&format!("{what}: refused: {line}\n"));
                }
                Ok(r) => {
                    let b = r.runs[0].config.clone();
                    if refused_expected(kind, key, &value) {
                        failures.push(format!("{what}: accepted, but it is listed as refused"));
                        continue;
                    }
                    if a == b {
                        // The kind's own default (Swin's bias_2d, DaViT's conv): the other values test the knob.
                        matrix.push_str(&format!("{what}: the default\n"));
                        continue;
                    }
                    // An initialisation knob acts on the weights the model draws itself.
                    let as_initialised = INITIALISATION.contains(&key);
                    let (vs_a, model_a) = build(&a, None, as_initialised);
                    let (_vs_b, model_b) = build(&b, Some(&vs_a), as_initialised);
                    let train = key.ends_with("dropout");
                    // A window warm-up acts while training: compare the models at training step 0.
                    let warming = key.ends_with("window_schedule");
                    ablate::transformer::attention::set_training_step(warming.then_some(0));
                    let out_a = output(model_a.as_ref(), train);
                    let before = path_counts();
                    let out_b = output(model_b.as_ref(), train);
                    let after = path_counts();
                    ablate::transformer::attention::set_training_step(None);
                    let acts = if key.ends_with("implementation") {
                        // All implementations compute the same numbers: what shows the knob acts is which one ran.
                        let path = if value == "explicit" { 1 } else { 2 };
                        let same =
                            out_a.size() == out_b.size() && (&out_a - &out_b).abs().max().double_value(&[]) < 1e-3;
                        after[path] > before[path] && same
                    } else {
                        out_a.size() != out_b.size() || (&out_a - &out_b).abs().max().double_value(&[]) > 1e-6
                    };
                    if !acts {
                        failures.push(format!("{what}: accepted but the output did not change"));
                    }
                    // A mechanism computed from the wrong tensor often shows as NaN or infinity, which
                    // "different" alone would accept.
                    if out_b.isfinite().all().int64_value(&[]) != 1 {
                        failures.push(format!("{what}: the output is not finite"));
                    }
                    matrix.push_str(&format!("{what}: acts\n"));
                }
            }
        }
    }
    assert!(failures.is_empty(), "{}\n\nmatrix:\n{matrix}", failures.join("\n"));
    // The whole matrix, for `cargo test --test knobs -- --nocapture`.
    println!("{matrix}");
    // Every refusal listed happens (no stale entries).
    for &(kind, key, value) in REFUSED {
        let prefix = format!("{kind} {key}={}", if value.is_empty() { "" } else { value });
        assert!(
            matrix.lines().any(|l| l.starts_with(&prefix) && l.contains("refused")),
            "{kind} {key} {value} is listed as refused but was not tried or not refused\n{matrix}"
        );
    }
}

/// The kind's default config and, for each of `rows` the kind accepts, the row's key and its config (the
/// context and the knob set as the matrix sets them; rows the kind refuses left out).
fn accepted_rows(
    kind: Kind,
    rows: &[(&'static str, Option<&str>, &str)],
) -> (ablate::recipe::Config, Vec<(&'static str, ablate::recipe::Config)>) {
    let defaults = parse(&recipe(kind, &[]), "base.yaml", "base", false).unwrap().runs[0].config.clone();
    let accepted = rows
        .iter()
        .filter_map(|&(key, value, extra)| {
            let mut settings = context(extra);
            settings.push((key.to_string(), knob_value(key, value, &defaults)));
            let parsed = parse(&recipe(kind, &settings), "a.yaml", "a", false).ok()?;
            Some((key, parsed.runs[0].config.clone()))
        })
        .collect();
    (defaults, accepted)
}

/// The trainable values a model built under `vs` holds.
fn built_parameters(vs: &nn::VarStore) -> i64 {
    vs.trainable_variables().iter().map(|t| t.numel() as i64).sum()
}

#[test]
fn the_core_counts_the_parameters_it_builds_for_every_knob() {
    let _serial = common::serial();
    // The memory estimate counts a model's parameters from the core's own formulas (`layers_parameters`,
    // `AttentionBlock::parameters`), written beside each constructor: held here to the built stacks, exactly,
    // under every row of the matrix. A weight added to a constructor and not to its count fails here.
    use ablate::transformer::attention::Grid;
    use ablate::transformer::layers::{layers, layers_parameters, AttentionBlock, LayerInit};
    let mut failures = Vec::new();
    let mut checked = 0;
    for kind in [Kind::Lm, Kind::Translate, Kind::Vit, Kind::Swin] {
        let rows: Vec<_> = KNOBS.iter().copied().chain([("transformer.d_model", Some("32"), "")]).collect();
        for (key, cfg) in &accepted_rows(kind, &rows).1 {
            tch::manual_seed(0);
            let vs = nn::VarStore::new(Device::Cpu);
            let (expected, what) = match kind {
                Kind::Swin => {
                    let spec = cfg.staged_spec();
                    let mut count = 0;
                    for i in 0..spec.stages() {
                        let grid = Some(Grid { side: spec.window(i), lead: 0 });
                        let _block = AttentionBlock::new(&(vs.root() / i), &spec.stage(i), grid);
                        count += AttentionBlock::parameters(&spec.stage(i), grid);
                    }
                    (count, "a Swin block per stage")
                }
                _ => {
                    let spec = if kind == Kind::Vit { cfg.vit_spec().transformer } else { cfg.transformer_spec() };
                    let grid = (kind == Kind::Vit).then(|| Grid { side: cfg.vit_spec().grid(), lead: 1 });
                    let cross = |i: i64| kind == Kind::Translate && i % 2 == 1;
                    let _stack = layers(&vs.root(), &spec, spec.layers, cross, LayerInit::default(), grid);
                    (layers_parameters(&spec, spec.layers, cross, grid), "a stack")
                }
            };
            let built = built_parameters(&vs);
            if built != expected {
                failures.push(format!("{kind} {key}: {what} holds {built} parameters, its count says {expected}"));
            }
            // The MACs of the vision models count a layer's matrices per token: as many as it has weights in
            // them (decoder stacks: no cross-attention).
            if kind == Kind::Lm {
                let spec = cfg.transformer_spec();
                let is_matrix = |name: &str| {
                    ["qkv.weight", "out.weight", "output_gate.weight", "up.weight", "gate.weight", "down.weight"]
                        .iter()
                        .any(|m| name.ends_with(m))
                };
                let weights: i64 =
                    vs.variables().iter().filter(|(name, _)| is_matrix(name)).map(|(_, t)| t.numel() as i64).sum();
                let counted = spec.layers * spec.layer_matrix_macs();
                if weights != counted {
                    failures.push(format!(
                        "lm {key}: the layers' matrices hold {weights} weights, the MACs count {counted}"
                    ));
                }
            }
            checked += 1;
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    assert!(checked > 150, "{checked} rows checked");
}

#[test]
fn the_memory_estimate_counts_the_built_model_and_every_knob_that_adds_weights() {
    let _serial = common::serial();
    // The estimate is written from the config before anything is built: its parameter count is held to the
    // built model's within 10% for every kind and row of the matrix, and a knob that adds or removes weights
    // (a gate, a grouped K/V projection, a gated FFN) by more than 1% must move the estimate by what it moves
    // the model (within a quarter, and in the same direction).
    let mut failures = Vec::new();
    let mut table = String::new();
    for kind in Kind::ALL.into_iter().filter(|&k| k != Kind::Cnn) {
        let count = |cfg: &ablate::recipe::Config| -> (f64, f64) {
            tch::manual_seed(0);
            let vs = nn::VarStore::new(Device::Cpu);
            let _model = task(cfg.kind).build(cfg, &vs.root(), 50);
            (built_parameters(&vs) as f64, ablate::tasks::memory::parameters(cfg, 50.0))
        };
        let (defaults, rows) = accepted_rows(kind, KNOBS);
        let (base_built, base_estimate) = count(&defaults);
        for (key, cfg) in &rows {
            let (built, estimate) = count(cfg);
            let what = format!("{kind} {key}");
            table.push_str(&format!("{what}: built {built}, estimate {estimate}\n"));
            if (estimate / built - 1.0).abs() > 0.1 {
                failures.push(format!("{what}: estimate {estimate} against {built} built"));
            }
            let (moved, estimated) = (built - base_built, estimate - base_estimate);
            // Changes below 1% of the model (a final norm's gains, one global token) are below what a memory
            // estimate resolves.
            if moved.abs() > 0.01 * base_built
                && (estimated * moved <= 0.0 || (estimated - moved).abs() > 0.25 * moved.abs())
            {
                failures.push(format!("{what}: the model gains {moved} parameters, the estimate {estimated}"));
            }
        }
    }
    println!("{table}");
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn knobs_added_later_are_recorded_only_away_from_their_defaults_and_may_be_set_back_to_them() {
    let _serial = common::serial();
    // A variant that sets a knob back to the value every earlier run had is accepted; that run's columns
    // and config hash are those of a recipe that never named the knob.
    let text = "kind: lm\ntransformer: {d_model: 32, layers: 2, heads: 4, block_size: 16, scale_embeddings: true, norm: rms_norm}\nvariants:\n  - {label: on}\n  - {label: off, transformer.scale_embeddings: false, transformer.norm: layer_norm, transformer.attention: {kv_heads: 4, qk_dim: 8, scoring: dot}}\n";
    let recipe = parse(text, "a.yaml", "a", false).unwrap();
    let plain = parse(&recipe_text_without_knobs(), "b.yaml", "b", false).unwrap();
    let (on, off) = (&recipe.runs[0], &recipe.runs[1]);
    let keys = |c: &ablate::recipe::Config| -> Vec<String> {
        ablate::recipe::columns(c).into_iter().map(|(k, _)| k).collect()
    };
    assert!(keys(&on.config).contains(&"transformer.scale_embeddings".to_string()));
    assert!(keys(&on.config).contains(&"transformer.norm".to_string()));
    for new in ["scale_embeddings", "norm", "residual", "attention.kv_heads", "attention.qk_dim", "attention.scoring"] {
        assert!(!keys(&off.config).contains(&format!("transformer.{new}")), "{new}");
    }
    assert_eq!(keys(&off.config), keys(&plain.runs[0].config));
    assert_eq!(off.config_hash, plain.runs[0].config_hash);
    assert_ne!(on.config_hash, off.config_hash);
}

fn recipe_text_without_knobs() -> String {
    "kind: lm\ntransformer: {d_model: 32, layers: 2, heads: 4, block_size: 16}\n".into()
}

/// The dotted leaf keys under `prefix` of a serialised config section.
fn leaf_keys(value: &serde_yaml::Value, prefix: &str, out: &mut Vec<String>) {
    match value {
        serde_yaml::Value::Mapping(m) => {
            for (k, v) in m {
                leaf_keys(v, &format!("{prefix}.{}", k.as_str().expect("string keys")), out);
            }
        }
        _ => out.push(prefix.to_string()),
    }
}

/// Keys of the Transformer section tested elsewhere rather than in the matrix, with where: none may be
/// added without a reason.
const TESTED_ELSEWHERE: &[(&str, &str)] = &[];

#[test]
fn every_key_of_the_transformer_section_has_a_row_in_the_knob_matrix() {
    let _serial = common::serial();
    // A knob added to the schema without a row here would pass every test of this file: the list of rows is
    // checked against the schema itself (every kind's defaults, so kind-specific keys count too).
    let mut keys = Vec::new();
    for kind in Kind::ALL {
        let config = serde_yaml::to_value(ablate::recipe::Config::defaults(kind)).unwrap();
        leaf_keys(&config["transformer"], "transformer", &mut keys);
    }
    keys.sort();
    keys.dedup();
    let missing: Vec<&String> = keys
        .iter()
        .filter(|k| !KNOBS.iter().any(|(knob, _, _)| knob == k))
        .filter(|k| !TESTED_ELSEWHERE.iter().any(|(key, _)| key == k))
        .collect();
    assert!(missing.is_empty(), "keys of the transformer section without a knob-matrix row: {missing:?}");
    for (key, _) in TESTED_ELSEWHERE {
        assert!(keys.contains(&key.to_string()), "{key} is listed as tested elsewhere but is not a key");
    }
}

#[test]
fn every_trainable_tensor_of_every_model_has_a_declared_role() {
    let _serial = common::serial();
    // Muon and muP's per-layer rate act on the matrices `optim::HIDDEN_MATRICES` and the attention core's `ROLES` list, by name; every other
    // matrix must be listed in `optim::OTHER_MATRICES`, so that a weight added under a unit does not change
    // optimiser by where it happens to sit. Every kind, every row of the matrix.
    use ablate::train::optim::{declared_role, has_declared_role, is_hidden_matrix};
    let mut undeclared = std::collections::BTreeSet::new();
    let mut hidden = std::collections::BTreeSet::new();
    // Every other trainable tensor (vectors, kernels, tokens) is declared too: its weight decay follows.
    let mut others = std::collections::BTreeSet::new();
    for kind in Kind::ALL {
        for (_, cfg) in accepted_rows(kind, KNOBS).1 {
            let vs = nn::VarStore::new(Device::Cpu);
            let _model = task(kind).build(&cfg, &vs.root(), 50);
            for (name, t) in vs.variables() {
                // Numbers (layer, stage, table) stripped, so one line names a weight of every layer.
                let general: Vec<&str> =
                    name.split('.').map(|p| if p.parse::<i64>().is_ok() { "*" } else { p }).collect();
                let general = general.join(".");
                if t.requires_grad() && declared_role(&name, &t.size()).is_none() {
                    others.insert(format!("{general} ({}-D)", t.dim()));
                }
                if kind == Kind::Cnn {
                    continue;
                }
                if t.requires_grad() && t.dim() == 2 && !has_declared_role(&name) {
                    undeclared.insert(general.clone());
                }
                if is_hidden_matrix(&name, &t.size()) {
                    hidden.insert(general.split('.').rev().take(2).collect::<Vec<_>>().join("<"));
                }
            }
        }
    }
    assert!(undeclared.is_empty(), "matrices with no declared optimiser role: {undeclared:?}");
    assert!(others.is_empty(), "tensors with no declared role: {others:#?}");
    // Every hidden matrix is an attention projection, an output gate or an FFN matrix.
    let units = ["qkv", "out", "output_gate", "up", "gate", "down"];
    assert!(hidden.iter().all(|h| units.iter().any(|u| h == &format!("weight<{u}"))), "{hidden:?}");
    assert_eq!(hidden.len(), units.len(), "{hidden:?}");
}

/// A forward pass in evaluation mode with gradients: the output, and d(mean of its squares)/d(each weight) by
/// name.
fn forward_and_gradients(vs: &nn::VarStore, model: &dyn Built) -> (Tensor, Vec<(String, Tensor)>) {
    tch::manual_seed(11);
    let out = model.forward_example(2, false, Device::Cpu);
    out.to_kind(DType::Float).square().mean(DType::Float).backward();
    let mut grads: Vec<(String, Tensor)> = vs
        .variables()
        .into_iter()
        .filter(|(_, t)| t.requires_grad())
        .map(|(n, t)| {
            let g = t.grad();
            (n, if g.defined() { g.copy() } else { t.zeros_like() })
        })
        .collect();
    grads.sort_by(|a, b| a.0.cmp(&b.0));
    (out.detach(), grads)
}

/// How far two implementations may differ, relative to the larger of 1 and the largest value: float32
/// summation in another order (the largest seen is 1.5e-4, a ViT gradient without norms, whose values grow).
const TOLERANCE: f64 = 5e-4;

/// The largest difference between two tensors, relative to the larger of 1 and the first's largest value.
fn relative_gap(a: &Tensor, b: &Tensor) -> f64 {
    if a.size() != b.size() {
        return f64::INFINITY;
    }
    let scale = a.abs().max().double_value(&[]).max(1.0);
    (a - b).abs().max().double_value(&[]) / scale
}

/// The implementation-agreement matrix: for every row of the knob matrix a kind accepts (the knob and its
/// context), each attention implementation computes the same model: libtorch's fused kernel and the explicit
/// path agree in the output and in every weight's gradient; with a sliding window added (`pattern.window:
/// 2`, where the row sets no window of its own), the sparse kernel agrees with the explicit path; and for
/// the decoder, cached decoding gives the logits of the whole-context pass at every step. A combination the
/// loader refuses is listed with its one line; nothing else may differ by more than [`TOLERANCE`]. A decoder
/// (causal) and a ViT (bidirectional). `-- --nocapture` prints the matrix.
#[test]
fn every_knob_agrees_across_attention_implementations_or_is_refused() {
    use ablate::models::decode::Decoder;
    let _serial = common::serial();
    let mut matrix = String::new();
    let mut failures = Vec::new();
    // (knob, kernel) where the kernel asked for did not run, the call taking the explicit route instead.
    let mut routed = std::collections::BTreeSet::new();
    for kind in [Kind::Lm, Kind::Vit] {
        let defaults = parse(&recipe(kind, &[]), "base.yaml", "base", false).unwrap().runs[0].config.clone();
        for &(key, value, extra) in KNOBS.iter().filter(|(k, ..)| !k.ends_with("implementation")) {
            let value = knob_value(key, value, &defaults);
            let mut row = context(extra);
            row.push((key.to_string(), value.clone()));
            let what = format!("{kind} {key}={value}");
            if parse(&recipe(kind, &row), "r.yaml", "r", false).is_err() {
                continue; // The knob matrix lists the kind's refusals.
            }
            let sets_window = row.iter().any(|(k, _)| k.ends_with("pattern.window") || k.ends_with("layer_patterns"));
            let window: Vec<(String, String)> = if sets_window {
                Vec::new()
            } else {
                vec![("transformer.attention.pattern.window".into(), "2".into())]
            };
            let with = |extra: &[(String, String)], implementation: &str| {
                let mut s = row.clone();
                s.extend(extra.iter().cloned());
                s.push(("transformer.attention.implementation".into(), implementation.into()));
                parse(&recipe(kind, &s), "i.yaml", "i", false).map(|r| r.runs[0].config.clone())
            };
            for (pair, extra_settings) in [(("fused", "explicit"), Vec::new()), (("sparse", "explicit"), window)] {
                let (a, b) = (with(&extra_settings, pair.0), with(&extra_settings, pair.1));
                let label = format!("{what}: {} vs {}", pair.0, pair.1);
                let (a, b) = match (a, b) {
                    (Ok(a), Ok(b)) => (a, b),
                    (Err(e), _) | (_, Err(e)) => {
                        let line = e.to_string();
                        if line.lines().count() != 1 {
                            failures.push(format!("{label}: refused in more than one line: {line}"));
                        }
                        matrix.push_str(&format!("{label}: refused: {line}\n"));
                        continue;
                    }
                };
                let (vs_a, model_a) = build(&a, None, false);
                let (vs_b, model_b) = build(&b, Some(&vs_a), false);
                let kernel = if pair.0 == "fused" { 0 } else { 2 };
                let before = ablate::transformer::attention::path_counts()[kernel];
                let (out_a, grads_a) = forward_and_gradients(&vs_a, model_a.as_ref());
                let ran = ablate::transformer::attention::path_counts()[kernel] > before;
                if !ran {
                    routed.insert((key.to_string(), pair.0));
                }
                let (out_b, grads_b) = forward_and_gradients(&vs_b, model_b.as_ref());
                let mut worst = relative_gap(&out_a, &out_b);
                for ((name, ga), (_, gb)) in grads_a.iter().zip(&grads_b) {
                    let gap = relative_gap(ga, gb);
                    if gap > TOLERANCE {
                        failures.push(format!("{label}: the gradient of {name} differs by {gap:.2e}"));
                    }
                    worst = worst.max(gap);
                }
                if relative_gap(&out_a, &out_b) > TOLERANCE {
                    failures.push(format!("{label}: the output differs by {:.2e}", relative_gap(&out_a, &out_b)));
                }
                let route = if ran { "" } else { ", through the explicit route" };
                matrix.push_str(&format!("{label}: agree (largest relative gap {worst:.1e}){route}\n"));
            }
            if kind == Kind::Lm {
                let cfg = parse(&recipe(kind, &row), "r.yaml", "r", false).unwrap().runs[0].config.clone();
                let (_vs, model) = build(&cfg, None, false);
                let gpt = model.gpt().expect("a decoder");
                let prompts = vec![vec![1, 5, 2, 7, 3], vec![4, 4, 9, 0, 12]];
                let _guard = tch::no_grad_guard();
                let mut cached = Decoder::new(gpt, prompts.clone(), true);
                let mut plain = Decoder::new(gpt, prompts, false);
                if !cached.is_cached() {
                    matrix.push_str(&format!("{what}: cached decoding: recomputes the context (no cache for it)\n"));
                    continue;
                }
                let mut worst = 0.0f64;
                for _ in 0..6 {
                    let (x, y) = (cached.logits(), plain.logits());
                    worst = worst.max(relative_gap(&y, &x));
                    let next = Vec::<i64>::try_from(y.argmax(-1, false)).unwrap();
                    cached.push(&next);
                    plain.push(&next);
                }
                if worst > TOLERANCE {
                    failures.push(format!("{what}: cached decoding differs by {worst:.2e}"));
                }
                matrix.push_str(&format!("{what}: cached decoding agrees (largest relative gap {worst:.1e})\n"));
            }
        }
    }
    println!("{matrix}");
    assert!(failures.is_empty(), "{}\n\nmatrix:\n{matrix}", failures.join("\n"));
    // A kernel asked for by name either runs or the recipe is refused (additive scores for either kernel, a
    // soft cap for the fused one: `ScorePath::fused_cannot`): never a silent explicit route, which would make
    // its row of this matrix compare the explicit path with itself.
    let routed: Vec<(String, &str)> = routed.into_iter().collect();
    assert!(routed.is_empty(), "kernels that fell back to the explicit route: {routed:?}\n\nmatrix:\n{matrix}");
}
