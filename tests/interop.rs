//! Every trained decoder opens in Hugging Face `transformers` with ablate's own logits (issue 68): for each
//! layout (GPT-2, OPT, Llama) and every row of the knob matrix, a small model with every weight drawn at
//! random is exported by `ablate::tasks::export`, loaded by the pinned PyPI `transformers` in one Python
//! process (`tests/reference/hf_parity.py`), and its logits on the same tokens must equal ablate's to 1e-5
//! relative (fp32), and its greedy continuation ablate's token for token. A row a layout cannot express must
//! be refused in one line naming the key and the layout. The table is `docs/interop.md` (its deviations as
//! measured when it was written; the test holds the accepted and refused rows to it).
//!
//! Needs `transformers` (bin/test installs it into the cache and sets ABLATE_HF_PYTHONPATH) and the torch
//! wheel's Python side (ABLATE_TORCH_PYTHONPATH).
mod common;

use ablate::recipe::parse;
use ablate::tasks::export::{self, Layout};
use ablate::tasks::{task, Built};
use common::knob_rows::{context, knob_value, with_variant, KNOBS};
use std::path::Path;
use tch::{nn, Device, Kind, Tensor};

/// Each layout's base decoder, the knob rows set on top of it; long enough a block for a 32-token greedy
/// continuation of an 8-token prompt.
fn base(layout: Layout) -> &'static str {
    match layout {
        Layout::Gpt2 => "kind: lm\ntransformer: {d_model: 32, layers: 2, heads: 4, block_size: 40, pre_ln: true}\n",
        // ablate's own default decoder (post-LN) without its final norm, which OPT's post-LN stack lacks.
        Layout::Opt => "kind: lm\ntransformer: {d_model: 32, layers: 2, heads: 4, block_size: 40, final_norm: false}\n",
        Layout::Llama => {
            "kind: lm\ntransformer: {d_model: 32, layers: 2, heads: 4, block_size: 40, pre_ln: true, norm: rms_norm, \
             pe: rope, activation: swiglu, attention: {bias: false}}\n"
        }
        // Llama's base without any bias, each token attending to itself and its four predecessors.
        Layout::Mistral => {
            "kind: lm\ntransformer: {d_model: 32, layers: 2, heads: 4, block_size: 40, pre_ln: true, norm: rms_norm, \
             pe: rope, activation: swiglu, ffn_bias: false, attention: {bias: false, pattern: {window: 4}}}\n"
        }
        // Llama's base with QK-norm (RMSNorm over each head's features, before RoPE) and no FFN biases.
        Layout::Qwen3 => {
            "kind: lm\ntransformer: {d_model: 32, layers: 2, heads: 4, block_size: 40, pre_ln: true, norm: rms_norm, \
             pe: rope, activation: swiglu, ffn_bias: false, attention: {bias: false, qk_norm: rms_norm}}\n"
        }
        // ablate's BERT (post-LN, learned positions, the MLM head tied to the word embeddings).
        Layout::Bert => {
            "kind: bert\ntransformer: {d_model: 32, layers: 2, heads: 4, block_size: 40}\ndata: {tokenizer: wordpiece, vocab_size: 50}\n"
        }
        // ablate's ViT (pre-LN, learned positions, a <cls> token) on 28×28 grey images in 4×4 patches.
        Layout::Vit => "kind: vit\ntransformer: {d_model: 32, layers: 2, heads: 4}\n",
        // ablate's Swin (two stages of two blocks, 7×7 windows over a 14×14 grid of 2×2 patches, the 2-D bias).
        Layout::Swin => "kind: swin\n",
        // ablate's DaViT (a spatial and a channel block per stage, convolutional positions) in timm's 7×7
        // stride-4 stem, 4×4 windows (the 7×7 grid padded to 8×8, as both pad it).
        Layout::Davit => "kind: davit\nvision: {patch_size: 4, window: 4}\n",
        // ablate's ImageGPT (pre-LN, learned positions) with ImageGPT's norm, RMSNorm.
        Layout::ImageGpt => "kind: image_gpt\ntransformer: {d_model: 32, layers: 2, heads: 4, norm: rms_norm}\n",
    }
}

const VOCAB: i64 = 50;
const PROMPT: [i64; 8] = [3, 14, 15, 9, 26, 5, 35, 8];

fn recipe(layout: Layout, settings: &[(String, String)]) -> String {
    with_variant(base(layout), settings)
}

/// The run's model with every parameter drawn at random (so that zero biases and unit gains count too).
fn random_model(cfg: &ablate::recipe::Config) -> (nn::VarStore, Box<dyn Built>) {
    tch::manual_seed(7);
    let vs = nn::VarStore::new(Device::Cpu);
    let model = task(cfg.kind).build(cfg, &vs.root(), VOCAB);
    tch::no_grad(|| {
        let mut vars: Vec<(String, Tensor)> = vs.variables().into_iter().collect();
        vars.sort_by(|a, b| a.0.cmp(&b.0));
        for (_, mut var) in vars {
            var.copy_(&(Tensor::randn(var.size(), (Kind::Float, Device::Cpu)) * 0.3));
        }
    });
    (vs, model)
}

/// One row of the table: the knob, the layout, and what happened.
struct Row {
    knob: String,
    /// A flipped boolean's value in this layout.
    flipped: Option<String>,
    layout: Layout,
    /// Exported under this directory, or the line that refused it.
    outcome: Result<std::path::PathBuf, String>,
    logits: Vec<f32>,
    greedy: Vec<i64>,
}

fn python(script: &Path, manifest: &Path) -> String {
    python_with(&[], script, manifest)
}

/// Runs `script` on `manifest` with transformers and torch on its path, after the directories `first`.
fn python_with(first: &[String], script: &Path, manifest: &Path) -> String {
    let torch = std::env::var("ABLATE_TORCH_PYTHONPATH")
        .expect("ABLATE_TORCH_PYTHONPATH names the torch wheel's Python side (bin/test sets it)");
    let hf = std::env::var("ABLATE_HF_PYTHONPATH")
        .expect("ABLATE_HF_PYTHONPATH names PyPI's transformers (bin/test installs it and sets it)");
    let path: Vec<String> = first.iter().cloned().chain([hf, torch]).collect();
    let out = std::process::Command::new("python3")
        .arg(script)
        .arg(manifest)
        .env("PYTHONPATH", path.join(":"))
        .env("HF_HUB_OFFLINE", "1")
        .env("TRANSFORMERS_VERBOSITY", "error")
        .output()
        .expect("python3");
    let said = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "the transformers side failed:\n{said}");
    said
}

/// Greedy continuations of `PROMPT` that fit the block.
fn new_tokens(block: i64) -> usize {
    (block - PROMPT.len() as i64).clamp(0, 32) as usize
}

#[test]
fn every_knob_row_a_layout_accepts_opens_in_transformers_with_ablates_logits_or_is_refused_in_one_line() {
    let _serial = common::serial();
    let dir = tempfile::tempdir().unwrap();
    let mut rows: Vec<Row> = Vec::new();
    let mut entries = Vec::new();
    for layout in Layout::ALL {
        let defaults = parse(&recipe(layout, &[]), "base.yaml", "base", false).unwrap().runs[0].config.clone();
        assert_eq!(export::refusal(layout, &defaults), None, "{} refuses its own base", layout.name());
        let knobs = std::iter::once(("(the base)", None, "")).chain(KNOBS.iter().copied());
        for (i, (key, value, extra)) in knobs.enumerate() {
            let mut settings = context(extra);
            // A boolean row flips the layout's base, so its value is the layout's own: said in the cell.
            let (knob, flipped) = match (i, value) {
                (0, _) => (key.to_string(), None),
                (_, Some(v)) => (format!("{key}={v}"), None),
                (_, None) => (format!("{key} (the base's value flipped)"), Some(knob_value(key, None, &defaults))),
            };
            if i > 0 {
                settings.push((key.to_string(), knob_value(key, value, &defaults)));
            }
            let knob = if extra.is_empty() { knob } else { format!("{knob} (with {extra})") };
            let cfg = match parse(&recipe(layout, &settings), "row.yaml", "row", false) {
                Ok(r) => r.runs[0].config.clone(),
                // ablate refuses the decoder itself (a 2-D scheme, say): not a row of this table.
                Err(_) => continue,
            };
            if let Some(why) = export::refusal(layout, &cfg) {
                assert!(!why.contains('\n') && why.contains(layout.name()), "{why}");
                rows.push(Row { knob, flipped, layout, outcome: Err(why), logits: Vec::new(), greedy: Vec::new() });
                continue;
            }
            let (vs, model) = random_model(&cfg);
            let out = dir.path().join(format!("{}-{i}", layout.name()));
            let (logits, greedy) = match model.gpt() {
                Some(gpt) => {
                    let block = cfg.transformer.block_size;
                    let ids = Tensor::from_slice(&(0..2 * block).map(|j| (j * 7 + 3) % VOCAB).collect::<Vec<_>>())
                        .view([2, block]);
                    let logits: Vec<f32> =
                        tch::no_grad(|| Vec::try_from(gpt.forward(&ids, false).reshape([-1]))).unwrap();
                    let n = new_tokens(block);
                    let sequence = ablate::models::decode::generate(
                        model.decoder().expect("a decoder"),
                        &PROMPT,
                        n,
                        ablate::models::decode::Decoding::Greedy,
                        true,
                    );
                    entries.push(serde_json::json!({
                        "dir": out, "ids": Vec::<Vec<i64>>::try_from(&ids).unwrap(), "prompt": PROMPT, "new_tokens": n,
                    }));
                    (logits, sequence[sequence.len() - n..].to_vec())
                }
                // BERT: its masked-LM logits on the fixed example tokens.
                None if cfg.kind == ablate::recipe::Kind::Bert => {
                    let block = cfg.transformer.block_size;
                    let ids = ablate::tasks::example_tokens(2, block, VOCAB, Device::Cpu);
                    let logits: Vec<f32> =
                        tch::no_grad(|| Vec::try_from(model.forward_example(2, false, Device::Cpu).reshape([-1])))
                            .unwrap();
                    entries.push(serde_json::json!({
                        "dir": out, "ids": Vec::<Vec<i64>>::try_from(&ids).unwrap(), "masked": true,
                    }));
                    (logits, Vec::new())
                }
                // ImageGPT: its next-pixel logits over the palette after the start token and the example pixels.
                None if cfg.kind == ablate::recipe::Kind::ImageGpt => {
                    let spec = cfg.image_gpt_spec();
                    let (pixels, palette) = (spec.grid().pow(2), spec.palette);
                    let tokens = ablate::tasks::example_tokens(2, pixels, palette, Device::Cpu);
                    let start = Tensor::full([2, 1], palette, (Kind::Int64, Device::Cpu));
                    let ids = Tensor::cat(&[start, tokens.narrow(1, 0, pixels - 1)], 1);
                    let logits: Vec<f32> =
                        tch::no_grad(|| Vec::try_from(model.forward_example(2, false, Device::Cpu).reshape([-1])))
                            .unwrap();
                    entries.push(serde_json::json!({
                        "dir": out, "ids": Vec::<Vec<i64>>::try_from(&ids).unwrap(), "imagegpt": true,
                    }));
                    (logits, Vec::new())
                }
                // An image classifier: its class scores on the fixed example images every model of a shape reads.
                None => {
                    let image = cfg.image();
                    let images = ablate::tasks::example_images(2, image.channels, image.size, Device::Cpu);
                    let logits: Vec<f32> =
                        tch::no_grad(|| Vec::try_from(model.forward_example(2, false, Device::Cpu).reshape([-1])))
                            .unwrap();
                    entries.push(serde_json::json!({
                        "dir": out, "images": Vec::<f32>::try_from(images.reshape([-1])).unwrap(), "shape": images.size(),
                        "timm": matches!(layout, Layout::Swin | Layout::Davit),
                    }));
                    (logits, Vec::new())
                }
            };
            let exported = export::convert(layout, &cfg, &vs.variables(), VOCAB).unwrap();
            export::write(&out, &exported).unwrap();
            rows.push(Row { knob, flipped, layout, outcome: Ok(out), logits, greedy });
        }
    }
    let manifest = dir.path().join("manifest.json");
    std::fs::write(&manifest, serde_json::to_string(&entries).unwrap()).unwrap();
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/reference/hf_parity.py");
    let timm = std::env::var("ABLATE_TIMM_PYTHONPATH")
        .expect("ABLATE_TIMM_PYTHONPATH names PyPI's timm (bin/test installs it and sets it)");
    python_with(&[timm], &script, &manifest);

    let mut failures = Vec::new();
    let mut table = Vec::new();
    for row in &rows {
        let cell = match &row.outcome {
            Err(why) => format!("refused: {}", why.split_once(": ").map_or(why.as_str(), |(_, w)| w)),
            Ok(out) => {
                let theirs: serde_json::Value =
                    serde_json::from_str(&std::fs::read_to_string(out.join("parity.json")).unwrap()).unwrap();
                let logits: Vec<f32> =
                    theirs["logits"].as_array().unwrap().iter().map(|v| v.as_f64().unwrap() as f32).collect();
                let greedy: Vec<i64> =
                    theirs["greedy"].as_array().unwrap().iter().map(|v| v.as_i64().unwrap()).collect();
                let scale = row.logits.iter().fold(0f32, |m, v| m.max(v.abs())).max(1e-12);
                let deviation = row.logits.iter().zip(&logits).fold(0f32, |m, (a, b)| m.max((a - b).abs())) / scale;
                if logits.len() != row.logits.len() || deviation.is_nan() || deviation > 1e-5 {
                    failures.push(format!(
                        "{} {}: logits deviate by {deviation:.2e} relative",
                        row.layout.name(),
                        row.knob
                    ));
                }
                if greedy != row.greedy {
                    failures.push(format!(
                        "{} {}: greedy continuation {:?} in transformers, {:?} in ablate",
                        row.layout.name(),
                        row.knob,
                        greedy,
                        row.greedy
                    ));
                }
                format!("{deviation:.1e}")
            }
        };
        let cell = match &row.flipped {
            Some(v) => format!("{cell} (set to {v})"),
            None => cell,
        };
        table.push((row.knob.clone(), row.layout, cell));
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    check_or_write_doc(&table);
}

/// `docs/interop.md`: the table, one row per knob, one column per layout. The measured deviations vary in
/// their last digits between CPUs, so the test holds the committed file's accepted and refused cells to
/// this run's and rewrites the file only with ABLATE_WRITE_DOCS=1.
fn check_or_write_doc(table: &[(String, Layout, String)]) {
    let mut knobs: Vec<&str> = Vec::new();
    for (knob, _, _) in table {
        if !knobs.contains(&knob.as_str()) {
            knobs.push(knob);
        }
    }
    let cell = |knob: &str, layout: Layout| {
        table
            .iter()
            .find(|(k, l, _)| k == knob && *l == layout)
            .map_or("— (ablate refuses this model)".to_string(), |(_, _, c)| c.clone())
    };
    let mut doc = String::from(
        "# Opening ablate's models in other tools\n\n\
         Generated by `ABLATE_WRITE_DOCS=1 cargo test --release --test interop`: do not edit by hand; the test fails \
         when a cell's outcome (a deviation or a refusal) differs from this file's.\n\n\
         `ablate export` writes a trained decoder in a Hugging Face layout (`--layout auto` takes the first that \
         expresses the model exactly, in this order): `gpt2` (`GPT2LMHeadModel`), `opt` (`OPTForCausalLM`, which \
         also has post-LN layers), `llama` (`LlamaForCausalLM`), `mistral` (`MistralForCausalLM`: no biases, one \
         sliding window for every layer) or `qwen3` (`Qwen3ForCausalLM`: QK-norm, and a sliding window or full \
         attention per layer); a BERT pre-trained by masked LM (kind bert) in \
         `bert` (`BertForMaskedLM`, its masked-LM logits compared); an ImageGPT (kind image_gpt) in `imagegpt` \
         (`ImageGPTForCausalImageModeling`, its next-pixel logits after the start token compared); a ViT (kind vit) in `vit` \
         (`ViTForImageClassification`, whose class scores are compared on the same images); a Swin (kind swin) in \
         `swin`, timm's `SwinTransformer`, and a DaViT (kind davit) in `davit`, timm's `DaVit` (each its state dict and a `config.json` of its architecture and arguments, \
         which `timm.create_model(\"local-dir:DIR\", pretrained=True)` rebuilds; the pinned timm 1.0.31 loads it). For each layout, a small decoder (d_model 32, two \
         layers, four heads, every weight drawn at random) is built with its base settings and then with each row of \
         the knob matrix (`tests/common/knob_rows.rs`) set on top; every export is loaded by the pinned \
         `transformers` (5.25.0) and its fp32 logits on the same tokens compared with ablate's: each cell is the \
         largest absolute difference over the largest absolute logit (the test requires at most 1e-5), and the greedy \
         continuation of an 8-token prompt (32 tokens, fewer where the block is shorter) must be the same token for \
         token. A setting the layout cannot express is refused in one line, never written as another model.\n\n\
         The bases: gpt2 is pre-LN with learned positions, LayerNorm and GELU; opt is ablate's default decoder \
         (post-LN) without its final LayerNorm (a post-LN stack ending in a second norm, ablate's default, has no \
         layout here and is refused: train with `transformer.final_norm: false` or pre-LN to export); llama is pre-LN with RMSNorm, RoPE, SwiGLU and no attention biases; \
         mistral is llama's without FFN biases, each token attending to itself and its 4 predecessors (ablate's \
         `pattern.window: 4`, transformers' `sliding_window: 5`, which counts the query); qwen3 is llama's without \
         FFN biases and with `attention.qk_norm: rms_norm` (a gain over each head's features, before RoPE); bert is \
         ablate's default BERT (post-LN, learned positions, the MLM head tied to the word embeddings); vit is \
         ablate's default ViT (pre-LN, learned positions, a `<cls>` token the classifier reads) at d_model 32 on 28×28 \
         grey images in 4×4 patches; swin is ablate's default Swin (two stages of two pre-LN blocks, d_model 32 and \
         2 heads doubling per stage, 7×7 windows shifted every second block over a 14×14 grid of 2×2 patches of \
         28×28 grey images, a relative bias per window offset, patch merging; ablate merges at the end of a \
         stage, timm at the start of the next, the same weights); davit is ablate's default DaViT (a spatial and a \
         channel block per stage, each with its two depthwise position convolutions) with timm's 7×7 stride-4 stem \
         (`vision.patch_size: 4`) and 4×4 windows (`vision.window: 4`; the 7×7 grid is padded to 8×8 by both, and \
         timm pads a grid smaller than the window where ablate shrinks the window, so that is refused); imagegpt is \
         ablate's default ImageGPT (pre-LN, learned positions, a start token after the palette) with \
         `transformer.norm: rms_norm`, since ImageGPT's `ImageGPTLayerNorm` neither centres nor has a bias (its \
         head has no row for the start token, never a target: ablate's last row is dropped). The encoder-decoder \
         (kind translate), the sequence classifier and the CNN have no layout and are refused in one line naming \
         the kind. A cell marked \"ablate refuses this model\" is a knob the kind does not read. \
         Shown failing: Llama's gate and up projections swapped (0.88 relative at the base), BERT's two LayerNorm \
         gains of a layer swapped (0.44), ViT's (0.38), Mistral's window written as ablate's width (no query \
         counted: 0.79 at the base), Qwen3's query and key norms swapped (0.095), Swin's two LayerNorm gains of a block swapped (0.49), DaViT's two position convolutions of a block \
         swapped (0.15), ImageGPT's head written without its first row instead of its last, the start token's \
         (1.37). The \
         deviations were measured on the CPU that wrote this file; other CPUs differ in the last digits.\n\n",
    );
    let names: Vec<&str> = Layout::ALL.iter().map(|l| l.name()).collect();
    doc.push_str(&format!("| knob | {} |\n|---|{}\n", names.join(" | "), "---|".repeat(names.len())));
    for knob in &knobs {
        let cells: Vec<String> = Layout::ALL.iter().map(|&l| cell(knob, l)).collect();
        doc.push_str(&format!("| `{knob}` | {} |\n", cells.join(" | ")));
    }
    doc.push_str(
        "\n## The other direction: `ablate import` and `train.init_from`\n\n\
         `ablate import DIR` reads a Hugging Face decoder directory in one of the five decoder layouts and writes the recipe \
         whose transformer section is its model, with `train.init_from: DIR`; a run of it starts from the \
         checkpoint's weights. Before training, the run's model is checked against `config.json` key by key and the \
         data's token ids against the checkpoint's `tokenizer.json` (one line naming the first difference). Both \
         directions walk one table of correspondences (`export::links`). A config ablate does not compute exactly \
         is refused in one line naming its key: GPT-2's tanh GELU (`gelu_new`, the default of real GPT-2 \
         checkpoints), a LayerNorm or RMSNorm ε other than 1e-5, layer-dependent score scaling, cross-attention, RoPE \
         scaling, another model type. Llama's `mlp_bias` is `transformer.ffn_bias`; Mistral's `sliding_window` and \
         Qwen3's `layer_types` become `pattern.window` or `layer_patterns`, one narrower. One departure, the same \
         function: OPT's two position rows before position 0, which only padded positions read, are not kept.\n\n\
         `a_transformers_checkpoint_reads_into_ablate_with_its_logits_and_exports_back_bit_for_bit`: eight checkpoints \
         that `transformers` builds and saves by itself (`tests/reference/hf_make.py`, every parameter drawn at \
         random; GPT-2 tied and untied with unscaled scores and ReLU, OPT post-LN and pre-LN, Llama with GQA and no \
         biases and with MQA, biases, GeGLU, tied embeddings and θ = 500000, Mistral with GQA and a sliding window of \
         5, Qwen3 with QK-norm, attention biases and its second layer sliding) are read into ablate: its logits equal \
         transformers' to at most 4.3e-7 relative (0 for GPT-2, the first Llama, Mistral and Qwen3), ablate's export of the loaded \
         model gives back every tensor of the file bit for bit, and reading that export again gives ablate's \
         tensors bit for bit; `gelu_new` and ε = 1e-6 are refused, and a run with two heads against a four-head \
         checkpoint is refused naming the key. Shown failing with Llama's gate and up projections swapped in the \
         table: 0.55 relative. `ablate_import_starts_a_run_from_a_transformers_checkpoint_and_export_gives_it_back` \
         does it from the command line (import, a run, export).\n\n\
         ## TransformerLens\n\n\
         `an_exported_decoder_opens_in_transformer_lens_with_ablates_attention_patterns`: a GPT-2- and a Llama-layout \
         export open in the pinned TransformerLens (4.3.0, whose `TransformerBridge` wraps the transformers model; \
         `TransformerBridge.boot_transformers(DIR, hf_model=model, tokenizer=tokenizer)`), `run_with_cache` runs, \
         and every head's attention pattern of every layer (`blocks.L.attn.hook_pattern`) equals ablate's own maps \
         (what `ablate attention` draws): at most 1.8e-7 (GPT-2) and 0 (Llama) apart, the logits within 1e-5 \
         relative. Shown failing with Llama's query and key projections swapped: 0.18. OPT is not tested: \
         TransformerLens 4.3.0's OPT adapter fails inside transformers 5.25.0's OPT attention before any output.\n",
    );
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/interop.md");
    if std::env::var_os("ABLATE_WRITE_DOCS").is_some() {
        std::fs::write(&path, &doc).unwrap();
        return;
    }
    // A cell's outcome: refused (with its words) or accepted (a number).
    let outcome = |line: &str| -> String {
        line.split(" | ")
            .map(|c| c.trim().trim_end_matches('|').trim())
            .map(|c| match c.split_once(' ').map_or((c, ""), |(first, rest)| (first, rest)) {
                (number, rest) if number.parse::<f64>().is_ok() => format!("accepted {rest}"),
                _ => c.to_string(),
            })
            .collect::<Vec<_>>()
            .join(" | ")
    };
    let committed = std::fs::read_to_string(&path).unwrap_or_default();
    let rows = |text: &str| -> Vec<String> { text.lines().filter(|l| l.starts_with("| `")).map(outcome).collect() };
    assert_eq!(
        rows(&committed),
        rows(&doc),
        "docs/interop.md is not this run's table: regenerate it with ABLATE_WRITE_DOCS=1 cargo test --release --test interop"
    );
}

/// `ablate export` from a results directory: a trained pre-LN decoder is written with its tokenizer and
/// model card, `transformers` loads it and its tokenizer gives ablate's ids; ablate's default decoder (post-LN
/// with a final norm) is refused in one line naming each layout's reason.
#[test]
fn ablate_export_writes_a_run_that_transformers_loads_with_its_tokenizer() {
    let dir = tempfile::tempdir().unwrap();
    let corpus = dir.path().join("corpus.txt");
    std::fs::write(&corpus, "a small corpus, exported whole.\n".repeat(200)).unwrap();
    let recipe = |name: &str, extra: &str| {
        let path = dir.path().join(format!("{name}.yaml"));
        std::fs::write(
            &path,
            format!(
                "kind: lm\ntransformer: {{d_model: 32, layers: 2, heads: 4, block_size: 16{extra}}}\ndata: {{path: {}}}\n\
                 train: {{steps: 3, batch_size: 4, eval_interval: 3, eval_batches: 1, test_batches: 1, checkpoint: true}}\nseeds: [0]\n",
                corpus.display()
            ),
        )
        .unwrap();
        path
    };
    let ablate = |args: &[&std::ffi::OsStr]| {
        std::process::Command::new(env!("CARGO_BIN_EXE_ablate")).args(args).output().unwrap()
    };
    let os = |s: &str| std::ffi::OsString::from(s);
    for (name, extra) in [("pre", ", pre_ln: true"), ("default", "")] {
        let out = dir.path().join(name);
        let done = ablate(&[
            recipe(name, extra).as_os_str(),
            &os("--quiet"),
            &os("--threads"),
            &os("1"),
            &os("--out"),
            out.as_os_str(),
        ]);
        assert!(done.status.success(), "{}", String::from_utf8_lossy(&done.stderr));
    }
    let exported = dir.path().join("exported");
    let run = |name: &str| {
        ablate(&[
            &os("export"),
            dir.path().join(name).as_os_str(),
            &os("--run"),
            &os("seed=0"),
            &os("--out"),
            exported.as_os_str(),
        ])
    };
    let refused = run("default");
    let said = String::from_utf8_lossy(&refused.stderr).trim().to_string();
    assert!(!refused.status.success());
    assert!(
        said.lines().count() == 1
            && said.contains("no Hugging Face layout expresses this model")
            && said.contains("opt layout"),
        "{said}"
    );
    let done = run("pre");
    assert!(done.status.success(), "{}", String::from_utf8_lossy(&done.stderr));
    for f in ["model.safetensors", "config.json", "tokenizer.json", "README.md"] {
        assert!(exported.join(f).exists(), "no {f}");
    }
    let card = std::fs::read_to_string(exported.join("README.md")).unwrap();
    assert!(card.contains("gpt2 layout") && card.contains("test_loss"), "{card}");
    // ablate's ids for a text: the character vocabulary stored beside the checkpoint, in id order.
    let meta: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.path().join("pre/checkpoints/seed=0.json")).unwrap())
            .unwrap();
    let vocabulary: Vec<char> = meta["vocabulary"].as_str().unwrap().chars().collect();
    let text = "a corpus, whole.\n";
    let ids: Vec<usize> = text.chars().map(|c| vocabulary.iter().position(|&v| v == c).unwrap()).collect();
    let script = format!(
        "import json\nfrom transformers import AutoModelForCausalLM, PreTrainedTokenizerFast\n\
         m = AutoModelForCausalLM.from_pretrained({dir:?})\n\
         t = PreTrainedTokenizerFast(tokenizer_file={dir:?} + '/tokenizer.json')\n\
         ids = t({text:?})['input_ids']\n\
         print(json.dumps({{'ids': ids, 'decoded': t.decode(ids), 'class': type(m).__name__}}))\n",
        dir = exported.display().to_string(),
    );
    let path = dir.path().join("load.py");
    std::fs::write(&path, script).unwrap();
    let said = python_script(&path);
    let line = said.lines().find(|l| l.starts_with("{\"ids\"")).unwrap_or_else(|| panic!("no result: {said}"));
    let got: serde_json::Value = serde_json::from_str(line).unwrap_or_else(|e| panic!("{e}: {said}"));
    assert_eq!(got["class"], "GPT2LMHeadModel");
    assert_eq!(got["ids"], serde_json::json!(ids));
    assert_eq!(got["decoded"], text);
}

/// Runs a Python script with transformers and torch on its path; its output.
fn python_script(script: &Path) -> String {
    python(script, Path::new(""))
}

/// One checkpoint `transformers` builds by itself for the import test: its model type, its config, and
/// whether ablate reads it (else the word the one-line refusal names).
struct Foreign {
    name: &'static str,
    model_type: &'static str,
    config: serde_json::Value,
    refused_naming: Option<&'static str>,
}

fn foreign_checkpoints() -> Vec<Foreign> {
    use serde_json::json;
    let gpt2 = |extra: serde_json::Value| {
        let mut c = json!({"vocab_size": VOCAB, "n_embd": 32, "n_layer": 2, "n_head": 4, "n_positions": 40,
                           "activation_function": "gelu"});
        c.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
        c
    };
    let opt = |extra: serde_json::Value| {
        let mut c = json!({"vocab_size": VOCAB, "hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 4,
                           "ffn_dim": 64, "max_position_embeddings": 40});
        c.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
        c
    };
    let llama = |extra: serde_json::Value| {
        let mut c = json!({"vocab_size": VOCAB, "hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 4,
                           "num_key_value_heads": 2, "intermediate_size": 48, "max_position_embeddings": 40,
                           "rms_norm_eps": 1e-5});
        c.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
        c
    };
    let read = |name, model_type, config| Foreign { name, model_type, config, refused_naming: None };
    vec![
        read("gpt2, tied", "gpt2", gpt2(json!({}))),
        read(
            "gpt2, untied, unscaled scores, relu",
            "gpt2",
            gpt2(json!({"tie_word_embeddings": false, "scale_attn_weights": false, "activation_function": "relu"})),
        ),
        read("opt, post-LN", "opt", opt(json!({"do_layer_norm_before": false}))),
        read("opt, pre-LN, untied", "opt", opt(json!({"tie_word_embeddings": false}))),
        read("llama, GQA, no biases", "llama", llama(json!({}))),
        read("mistral, GQA, a sliding window of 5", "mistral", llama(json!({"sliding_window": 5}))),
        read(
            "qwen3, QK-norm, biases, layer 1 sliding",
            "qwen3",
            llama(json!({"head_dim": 8, "attention_bias": true, "use_sliding_window": true, "sliding_window": 6,
                         "max_window_layers": 1})),
        ),
        read(
            "llama, MQA, biases, GeGLU, tied, θ=500000",
            "llama",
            llama(
                json!({"num_key_value_heads": 1, "attention_bias": true, "mlp_bias": true, "hidden_act": "gelu", "tie_word_embeddings": true, "rope_theta": 500000.0}),
            ),
        ),
        Foreign {
            name: "gpt2's tanh GELU",
            model_type: "gpt2",
            config: gpt2(json!({"activation_function": "gelu_new"})),
            refused_naming: Some("activation_function"),
        },
        Foreign {
            name: "llama's ε 1e-6",
            model_type: "llama",
            config: llama(json!({"rms_norm_eps": 1e-6})),
            refused_naming: Some("rms_norm_eps"),
        },
    ]
}

/// The weights of a checkpoint file, by name, on the CPU.
fn safetensors(path: &Path) -> std::collections::HashMap<String, Tensor> {
    Tensor::read_safetensors(path).unwrap().into_iter().collect()
}

/// The other direction (issue 68): checkpoints that `transformers` builds and saves by itself, with every
/// parameter drawn at random, read into ablate's decoder through `ablate import`'s reading: ablate's logits
/// equal transformers' to 1e-5 relative, ablate's export of the loaded model gives back every tensor of the
/// file bit for bit (OPT's two rows before position 0, read only at padded positions, which ablate never
/// has, excepted), and reading that export again gives ablate's tensors bit for bit. A config ablate does not
/// compute is refused in one line naming its key, and a run whose model differs is refused naming the key.
#[test]
fn a_transformers_checkpoint_reads_into_ablate_with_its_logits_and_exports_back_bit_for_bit() {
    use ablate::tasks::import;
    let _serial = common::serial();
    let dir = tempfile::tempdir().unwrap();
    let ids: Vec<Vec<i64>> = (0..2).map(|r| (0..40).map(|j| (j * 7 + 3 * r + 1) % VOCAB).collect()).collect();
    let foreign = foreign_checkpoints();
    let manifest: Vec<serde_json::Value> = foreign
        .iter()
        .enumerate()
        .map(|(i, f)| {
            serde_json::json!({"dir": dir.path().join(i.to_string()), "model_type": f.model_type, "config": f.config, "ids": ids, "seed": i})
        })
        .collect();
    let manifest_path = dir.path().join("make.json");
    std::fs::write(&manifest_path, serde_json::to_string(&manifest).unwrap()).unwrap();
    python(&Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/reference/hf_make.py"), &manifest_path);

    let ids = Tensor::from_slice(&ids.concat()).view([2, 40]);
    let mut failures = Vec::new();
    for (i, f) in foreign.iter().enumerate() {
        let source = dir.path().join(i.to_string());
        let checkpoint = import::read(&source).unwrap();
        let section = checkpoint.transformer_section();
        let cfg = section.as_ref().ok().map(|s| {
            parse(&format!("kind: lm\ntransformer: {s}\n"), "import.yaml", "import", false).unwrap().runs[0]
                .config
                .clone()
        });
        let matches = cfg.as_ref().map(|cfg| checkpoint.check_matches(cfg, VOCAB));
        if let Some(key) = f.refused_naming {
            let said = match (section, matches) {
                (Err(e), _) | (_, Some(Err(e))) => e.to_string(),
                _ => String::new(),
            };
            if !(said.contains(key) && said.lines().count() == 1) {
                failures.push(format!("{}: expected one line refusing {key}, got {said:?}", f.name));
            }
            continue;
        }
        let cfg = cfg.unwrap();
        if let Some(Err(e)) = matches {
            failures.push(format!("{}: {e}", f.name));
            continue;
        }
        let vs = nn::VarStore::new(Device::Cpu);
        let model = task(cfg.kind).build(&cfg, &vs.root(), VOCAB);
        checkpoint.load_into(&vs, &cfg).unwrap();
        let ours: Vec<f32> =
            tch::no_grad(|| Vec::try_from(model.gpt().unwrap().forward(&ids, false).reshape([-1]))).unwrap();
        let theirs: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(source.join("parity.json")).unwrap()).unwrap();
        let theirs: Vec<f32> =
            theirs["logits"].as_array().unwrap().iter().map(|v| v.as_f64().unwrap() as f32).collect();
        let scale = theirs.iter().fold(0f32, |m, v| m.max(v.abs()));
        let deviation = ours.iter().zip(&theirs).fold(0f32, |m, (a, b)| m.max((a - b).abs())) / scale;
        if ours.len() != theirs.len() || deviation.is_nan() || deviation > 1e-5 {
            failures.push(format!("{}: ablate's logits deviate from transformers' by {deviation:.2e}", f.name));
        }
        // Back out: every tensor of the file, bit for bit.
        let exported = export::convert(checkpoint.layout, &cfg, &vs.variables(), VOCAB).unwrap();
        let written: std::collections::HashMap<String, Tensor> = exported.tensors.into_iter().collect();
        let file = safetensors(&source.join("model.safetensors"));
        for (name, tensor) in &file {
            let Some(back) = written.get(name) else {
                failures.push(format!("{}: the export lacks {name}", f.name));
                continue;
            };
            let (tensor, back) = match name.as_str() {
                "model.decoder.embed_positions.weight" => (tensor.narrow(0, 2, 40), back.narrow(0, 2, 40)),
                _ => (tensor.shallow_clone(), back.shallow_clone()),
            };
            if !tensor.equal(&back) {
                failures.push(format!("{}: {name} comes back different", f.name));
            }
        }
        for (name, back) in &written {
            if !file.contains_key(name) && back.abs().max().double_value(&[]) != 0.0 {
                failures.push(format!("{}: the export adds {name}, which is not zeros", f.name));
            }
        }
        // And in again: ablate's tensors bit for bit.
        let again_dir = dir.path().join(format!("{i}-again"));
        let exported = export::convert(checkpoint.layout, &cfg, &vs.variables(), VOCAB).unwrap();
        export::write(&again_dir, &exported).unwrap();
        let again = import::read(&again_dir).unwrap();
        assert_eq!(again.transformer_section().unwrap(), checkpoint.transformer_section().unwrap(), "{}", f.name);
        let vs_again = nn::VarStore::new(Device::Cpu);
        let _model = task(cfg.kind).build(&cfg, &vs_again.root(), VOCAB);
        again.load_into(&vs_again, &cfg).unwrap();
        let first = vs.variables();
        for (name, t) in vs_again.variables() {
            if !t.equal(&first[&name]) {
                failures.push(format!("{}: {name} differs after load → export → load", f.name));
            }
        }
        // A run whose model is another: refused naming the key.
        let other = parse(
            &format!("kind: lm\ntransformer: {}\n", {
                let mut s = checkpoint.transformer_section().unwrap();
                s["heads"] = serde_json::json!(2);
                if let Some(a) = s["attention"].as_object_mut() {
                    a.remove("kv_heads");
                }
                if let Some(t) = s.as_object_mut() {
                    t.remove("head_dim");
                }
                s
            }),
            "other.yaml",
            "other",
            false,
        )
        .unwrap()
        .runs[0]
            .config
            .clone();
        let said = checkpoint.check_matches(&other, VOCAB).map(|_| String::new()).unwrap_or_else(|e| e.to_string());
        if !(said.contains("head") && said.lines().count() == 1) {
            failures.push(format!("{}: a two-head run against a four-head checkpoint: {said:?}", f.name));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// `ablate import` and `train.init_from` from the command line: a Llama that `transformers` built and saved
/// becomes a recipe, an ablate run starts from its weights (a learning rate of 1e-30 moves no weight of
/// magnitude above 1e-23 by a bit, so the run's checkpoint is the weights it started from), and `ablate
/// export` of that run gives back every tensor of the file bit for bit. A run whose data has another
/// vocabulary is refused before training, in one line.
#[test]
fn ablate_import_starts_a_run_from_a_transformers_checkpoint_and_export_gives_it_back() {
    let _serial = common::serial();
    let dir = tempfile::tempdir().unwrap();
    let corpus = dir.path().join("corpus.txt");
    // Eleven letters and the newline: a twelve-token character vocabulary.
    std::fs::write(&corpus, "abcdefghijk\nkjihgfedcba\n".repeat(150)).unwrap();
    let source = dir.path().join("llama");
    let manifest = serde_json::json!([{
        "dir": source, "model_type": "llama", "ids": [[0, 1]],
        "config": {"vocab_size": 12, "hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 4,
                   "num_key_value_heads": 2, "intermediate_size": 48, "max_position_embeddings": 16, "rms_norm_eps": 1e-5},
    }]);
    let manifest_path = dir.path().join("make.json");
    std::fs::write(&manifest_path, manifest.to_string()).unwrap();
    python(&Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/reference/hf_make.py"), &manifest_path);

    let ablate = |args: &[&std::ffi::OsStr]| {
        std::process::Command::new(env!("CARGO_BIN_EXE_ablate")).args(args).output().unwrap()
    };
    let os = |s: String| std::ffi::OsString::from(s);
    let recipe = dir.path().join("from_llama.yaml");
    let done = ablate(&[&os("import".into()), source.as_os_str(), &os("--out".into()), recipe.as_os_str()]);
    assert!(done.status.success(), "{}", String::from_utf8_lossy(&done.stderr));
    let text = std::fs::read_to_string(&recipe).unwrap();
    assert!(text.contains("init_from") && text.contains("rms_norm"), "{text}");
    let train = |out: &Path, data: &str| {
        let mut args: Vec<std::ffi::OsString> =
            vec![recipe.clone().into(), os("--quiet".into()), os("--threads".into()), os("1".into())];
        args.extend([os("--out".into()), out.as_os_str().to_owned(), os("--seeds".into()), os("0".into())]);
        for set in [
            data.to_string(),
            "train.steps=1".into(),
            "train.lr=1e-30".into(),
            "train.min_lr=0".into(),
            "train.warmup_steps=0".into(),
            "train.batch_size=2".into(),
            "train.eval_interval=1".into(),
            "train.eval_batches=1".into(),
            "train.test_batches=1".into(),
            "train.checkpoint=true".into(),
        ] {
            args.push(os(set));
        }
        let refs: Vec<&std::ffi::OsStr> = args.iter().map(|a| a.as_os_str()).collect();
        ablate(&refs)
    };
    // Thirteen characters: refused before any run trains.
    let other = dir.path().join("other.txt");
    std::fs::write(&other, "abcdefghijkl\n".repeat(150)).unwrap();
    let refused = train(&dir.path().join("refused"), &format!("data.path={}", other.display()));
    let said = String::from_utf8_lossy(&refused.stderr).to_string();
    assert!(!refused.status.success() && said.contains("vocab_size") && said.contains("init_from"), "{said}");
    assert!(!dir.path().join("refused/runs.csv").exists());

    let out = dir.path().join("run");
    let done = train(&out, &format!("data.path={}", corpus.display()));
    assert!(done.status.success(), "{}", String::from_utf8_lossy(&done.stderr));
    let back = dir.path().join("back");
    let run_id = "seed=0";
    let done = ablate(&[
        &os("export".into()),
        out.as_os_str(),
        &os("--run".into()),
        &os(run_id.into()),
        &os("--out".into()),
        back.as_os_str(),
    ]);
    assert!(done.status.success(), "{}", String::from_utf8_lossy(&done.stderr));
    let (file, exported) =
        (safetensors(&source.join("model.safetensors")), safetensors(&back.join("model.safetensors")));
    for (name, tensor) in &file {
        assert!(exported.get(name).is_some_and(|t| t.equal(tensor)), "{name} does not come back bit for bit");
    }
    // The FFN biases ablate's decoder always has start at zero for a Llama without them and train like any
    // other weight: the step moved them by about the learning rate, and the export writes them.
    for (name, t) in &exported {
        let moved = t.abs().max().double_value(&[]);
        assert!(
            file.contains_key(name) || (name.contains(".mlp.") && name.ends_with(".bias") && moved < 1e-28),
            "the export adds {name} (largest |value| {moved:e})"
        );
    }
}

/// TransformerLens opens an export (issue 68): for the GPT-2 and Llama layouts, a decoder with every weight drawn at random
/// is exported with a character tokenizer, opened by the pinned TransformerLens (`TransformerBridge` over the
/// transformers model, `run_with_cache`), and every head's attention pattern of every layer equals ablate's
/// own maps (what `ablate attention` draws) to 1e-5, its logits ablate's to 1e-5 relative.
#[test]
fn an_exported_decoder_opens_in_transformer_lens_with_ablates_attention_patterns() {
    let _serial = common::serial();
    let lens = std::env::var("ABLATE_TL_PYTHONPATH")
        .expect("ABLATE_TL_PYTHONPATH names PyPI's TransformerLens (bin/test installs it and sets it)");
    let dir = tempfile::tempdir().unwrap();
    // A character per token id: the export's tokenizer.json, which TransformerLens is given.
    let characters: String = (0..VOCAB as u32).map(|i| char::from_u32(0x41 + i).unwrap()).collect();
    let tokenizer = ablate::data::tokenize::TextTokenizer::Char(
        ablate::data::tokenize::CharTokenizer::from_vocabulary(&characters),
    );
    let ids: Vec<i64> = (0..24).map(|j| (j * 11 + 5) % VOCAB).collect();
    let mut ours = Vec::new();
    let mut manifest = Vec::new();
    // OPT is left out: TransformerLens 4.3.0's OPT adapter fails inside transformers 5.25.0's OPT attention
    // (`bsz, tgt_len, _ = hidden_states.size()`: not enough values to unpack), before any comparison.
    for layout in [Layout::Gpt2, Layout::Llama] {
        let cfg = parse(&recipe(layout, &[]), "lens.yaml", "lens", false).unwrap().runs[0].config.clone();
        let (vs, model) = random_model(&cfg);
        let tokens = Tensor::from_slice(&ids).unsqueeze(0);
        let maps = tch::no_grad(|| model.attention_on_tokens(&tokens)).expect("a decoder's maps");
        let maps: Vec<Vec<f32>> = maps.iter().map(|m| Vec::try_from(m.reshape([-1])).unwrap()).collect();
        let logits: Vec<f32> =
            tch::no_grad(|| Vec::try_from(model.gpt().unwrap().forward(&tokens, false).reshape([-1]))).unwrap();
        let out = dir.path().join(layout.name());
        export::write(&out, &export::convert(layout, &cfg, &vs.variables(), VOCAB).unwrap()).unwrap();
        export::write_tokenizer(&out, &tokenizer).unwrap();
        manifest.push(serde_json::json!({"dir": out, "ids": [ids]}));
        ours.push((layout, out, maps, logits));
    }
    let manifest_path = dir.path().join("lens.json");
    std::fs::write(&manifest_path, serde_json::to_string(&manifest).unwrap()).unwrap();
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/reference/tl_patterns.py");
    python_with(&[lens], &script, &manifest_path);
    let mut failures = Vec::new();
    for (layout, out, maps, logits) in ours {
        let theirs: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(out.join("lens.json")).unwrap()).unwrap();
        let floats = |v: &serde_json::Value| -> Vec<f32> {
            v.as_array().unwrap().iter().map(|x| x.as_f64().unwrap() as f32).collect()
        };
        assert_eq!(theirs["class"], "TransformerBridge");
        let patterns: Vec<Vec<f32>> = theirs["patterns"].as_array().unwrap().iter().map(floats).collect();
        assert_eq!(patterns.len(), maps.len(), "{}: layers", layout.name());
        for (layer, (a, b)) in maps.iter().zip(&patterns).enumerate() {
            let deviation = a.iter().zip(b).fold(0f32, |m, (x, y)| m.max((x - y).abs()));
            if a.len() != b.len() || deviation.is_nan() || deviation > 1e-5 {
                failures.push(format!("{} layer {layer}: patterns differ by {deviation:.2e}", layout.name()));
            }
        }
        let lens_logits = floats(&theirs["logits"]);
        let scale = logits.iter().fold(0f32, |m, v| m.max(v.abs()));
        let deviation = logits.iter().zip(&lens_logits).fold(0f32, |m, (a, b)| m.max((a - b).abs())) / scale;
        if lens_logits.len() != logits.len() || deviation.is_nan() || deviation > 1e-5 {
            failures.push(format!("{}: logits differ by {deviation:.2e} relative", layout.name()));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
