//! Malformed and impossible recipes, tried systematically: each must be rejected before training with one
//! line that names the file, the line and the key.
use ablate::recipe::parse;

/// (recipe text, expected line, text the message must contain). A text without `kind:` is kind lm (the kind
/// is added after the text, so its lines keep their numbers).
const CASES: &[(&str, usize, &str)] = &[
    ("kind: lm\ntransformer:\n  heads: [1, 2\n", 3, "YAML syntax error"),
    ("transformer:\n\theads: 2\n", 2, "YAML syntax error"),
    ("transfromer:\n  heads: 2\n", 1, "did you mean `transformer`"),
    ("model:\n  heads: 2\n", 1, "the `model` section is now `transformer`"),
    ("transformer:\n  hedas: 4\n", 2, "did you mean `heads`"),
    ("train:\n  step: 10\n", 2, "did you mean `steps`"),
    ("transformer:\n  attention:\n    scael: none\n", 3, "did you mean `scale`"),
    ("transformer:\n  heads: four\n", 2, "transformer.heads"),
    ("transformer:\n  d_model: 12.5\n", 2, "transformer.d_model"),
    ("train:\n  lr: fast\n", 2, "train.lr"),
    ("transformer:\n  pre_ln: maybe\n", 2, "transformer.pre_ln"),
    ("transformer:\n  pe: rotary\n", 2, "rope"),
    ("transformer:\n  activation: swish\n", 2, "gelu"),
    ("transformer:\n  attention:\n    implementation: flash\n", 3, "sparse"),
    ("transformer:\n  attention:\n    scale: -2\n", 3, "sqrt_dk, none, or a positive number"),
    ("transformer:\n  d_model: 128\n  heads: 5\n", 3, "allowed: 1, 2, 4, 8, 16, 32, 64, 128"),
    ("transformer:\n  d_model: 96\nsweep:\n  transformer.heads:\n    - 4\n    - 7\n", 6, "7 heads do not divide d_model 96"),
    ("transformer:\n  head_dim: 0\n", 2, "transformer.head_dim: must be at least 1"),
    ("transformer:\n  layers: 0\n", 2, "transformer.layers: must be at least 1"),
    ("transformer:\n  block_size: -4\n", 2, "transformer.block_size"),
    ("transformer:\n  dropout: 1.5\n", 2, "transformer.dropout: must be in [0, 1)"),
    ("train:\n  lr: -0.001\n", 2, "train.lr: must be a positive number"),
    ("train:\n  min_lr: 0.5\n", 2, "train.min_lr"),
    ("train:\n  beta2: 1.0\n", 2, "train.beta2"),
    ("train:\n  grad_clip: 0\n", 2, "train.grad_clip"),
    ("train:\n  batch_size: 0\n", 2, "train.batch_size"),
    ("train:\n  test_batches: 0\n", 2, "train.test_batches: must be at least 1"),
    ("kind: seq_classify\ntrain:\n  test_batches: 50\n", 3, "reads its whole test split"),
    ("sweep:\n  transformer.heads: [1, 2]\ncompare:\n  baseline: heads=1\n  delta:\n    test_loss: 0\n", 6, "compare.delta.test_loss: the smallest effect that matters must be above 0"),
    ("sweep:\n  transformer.heads: [1, 2]\ncompare:\n  baseline: heads=1\n  delta:\n    test_loss: -0.01\n", 6, "must be above 0, got -0.01"),
    ("sweep:\n  transformer.heads: [1, 2]\ncompare:\n  baseline: heads=1\n  delta:\n    tokens_per_s: 0%\n", 6, "must be above 0, got 0%"),
    ("sweep:\n  transformer.heads: [1, 2]\ncompare:\n  baseline: heads=1\n  delta:\n    test_loss: small\n", 6, "give a number in the metric's unit (0.01) or a share of the reference (5%)"),
    ("sweep:\n  transformer.heads: [1, 2]\ncompare:\n  delta:\n    test_loss: 0.01\n", 3, "name the comparison"),
    ("sweep:\n  transformer.heads: [1, 2]\ncompare:\n  baseline: heads=1\n  ladder: true\n", 5, "a baseline or ladder: true, not both"),
    ("sweep:\n  transformer.heads: [1, 2]\ncompare:\n  baseline: heads=1\n  margin: 0.01\n", 5, "unknown field `margin`"),
    ("train:\n  warmup_steps: -1\n", 2, "train.warmup_steps"),
    ("data:\n  test_fraction: 1.0\n", 2, "data.test_fraction"),
    ("data:\n  path: /definitely/not/here.txt\n", 2, "no such file"),
    ("data:\n  path: /etc\n", 2, "/etc is a directory"),
    ("data:\n  corpus: shakespeare\n", 2, "bible"),
    ("data:\n  task: copy\n  copy_length: 10\n", 1, "2·copy_length = 20"),
    ("data:\n  task: copy\n  copy_symbols: 40\n", 3, "data.copy_symbols"),
    ("data:\n  copy_length: 8\n", 2, "data.copy_length: sets the copy, induction or recall task"),
    ("transformer:\n  block_size: 32\n  attention:\n    pattern:\n      window: 32\n", 5, "covers the whole sequence"),
    ("transformer:\n  attention:\n    pattern:\n      window: 0\n", 4, "transformer.attention.pattern.window"),
    ("transformer:\n  attention:\n    pattern:\n      dilation: 3\n", 4, "set transformer.attention.pattern.window too"),
    ("transformer:\n  attention:\n    pattern:\n      global_every: 0\n", 4, "global_every"),
    ("transformer:\n  attention:\n    implementation: sparse\n", 3, "needs a window pattern"),
    ("transformer:\n  pe: alibi\n  position:\n    at: every_layer\n", 4, "transformer.pe is alibi"),
    ("transformer:\n  pe: rope\n  position:\n    rope_fraction: 0\n", 4, "rope_fraction"),
    ("transformer:\n  position:\n    rope_theta: 500\n", 3, "applies to pe: rope; transformer.pe is learned"),
    ("transformer:\n  pe: t5\n  position:\n    t5_buckets: 2\n", 4, "t5_buckets"),
    ("transformer:\n  pe: bias_2d\n", 2, "bias_2d needs a 2-D token grid; kind lm"),
    ("train:\n  eval_lengths: [2, 1]\n", 2, "train.eval_lengths"),
    ("sweep:\n  transformer.heads: []\n", 2, "non-empty list"),
    ("sweep:\n  transformer.heads: 4\n", 2, "non-empty list"),
    ("sweep:\n  transformer.hedas: [1, 2]\n", 2, "did you mean transformer.heads?"),
    ("sweep:\n  trian.steps: [1, 2]\n", 2, "did you mean train?"),
    ("sweep:\n  transformer.heads.x: [1]\n", 2, "is a value, not a section"),
    ("sweep:\n  transformer.pe:\n    - none\n    - learnt\n", 4, "transformer.pe"),
    ("sweep:\n  kind: [lm, gpt]\n", 2, "kind: unknown variant `gpt`"),
    ("seeds: []\n", 1, "seeds: the list is empty"),
    ("seeds:\n  - 0\n  - 1\n  - 0\n", 4, "seeds: 0 is listed twice"),
    ("sweep:\n  transformer.heads:\n    - 1\n    - 2\n    - 1\n", 5, "sweep.transformer.heads: 1 is listed twice"),
    ("sweep:\n  train.seed: [1, 2]\n", 2, "list the seeds in `seeds:`"),
    ("seeds: [1, -2]\n", 1, "seeds"),
    ("smoke:\n  train.stpes: 3\n", 2, "did you mean train.steps?"),
    ("unexpected: 1\n", 1, "unknown field `unexpected`"),
    ("kind: gpt\n", 1, "unknown variant `gpt`"),
    ("# a recipe that names no kind:\nname: x\n", 1, "kind: missing"),
    ("variants:\n  - {label: a, transformer.heads: 2}\n  - {label: a, transformer.heads: 4}\n", 3, "two variants are labelled `a`"),
    ("variants:\n  - {transformer.hedas: 2}\n", 2, "did you mean transformer.heads?"),
    // Found by cargo fuzz: a key with a line break in it must not break the one-line error.
    ("transformer: {\"hea\\nds\": 4}\n", 1, "unknown field `hea\\nds`"),
    // Also found by cargo fuzz: YAML ends a line at a lone carriage return, and so do the line numbers.
    ("train:\r  lr: fast\r", 2, "train.lr"),
    // Keys a kind does not read are refused, naming the key, the kind and why.
    ("vision:\n  patch_size: 4\n", 2, "vision.patch_size: the vision section is read by kind vit, swin, davit, image_gpt, cnn only; this run is kind lm"),
    ("bert:\n  task: spam\n", 2, "bert.task: the bert section is read by kind bert only; this run is kind lm"),
    ("data:\n  images:\n    dataset: mnist\n", 3, "image data is for the vision kinds; this run is kind lm"),
    ("kind: vit\ntransformer:\n  block_size: 32\n", 3, "transformer.block_size: kind vit reads the image's token grid"),
    ("kind: vit\nvision:\n  window: 5\n", 3, "vision.window: vision.window (2-D attention windows) is read by kind swin, davit only"),
    ("kind: vit\ntransformer:\n  tie_embeddings: true\n", 3, "kind vit predicts classes, not tokens"),
    ("kind: vit\ndata:\n  tokenizer: bpe\n", 3, "kind vit reads images (data.images), not text"),
    ("kind: swin\ntransformer:\n  layers: 4\n", 3, "kind swin sets its depth per stage: set vision.depths"),
    ("kind: swin\ntransformer:\n  attention:\n    pattern:\n      window: 3\n", 5, "kind swin attends inside 2-D windows"),
    ("kind: swin\ntransformer:\n  pe: learned\n  position:\n    at: qk\n", 5, "an absolute encoding enters once, at the input"),
    ("kind: image_gpt\ntransformer:\n  pe: conv\n", 3, "would leak what image_gpt predicts"),
    // New knobs: their values checked before training, at their line.
    ("transformer:\n  attention:\n    kv_heads: 3\n", 3, "3 key/value heads do not divide 4 heads"),
    ("transformer:\n  attention:\n    scoring: additive\n    implementation: fused\n", 3, "additive scores are written out"),
    ("transformer:\n  attention:\n    layer_patterns: [{window: 2}, {window: 64}]\n", 3, "entry 1: window 64 × dilation 1 covers the whole sequence of 64 tokens"),
    ("transformer:\n  attention:\n    pattern: {window: 2}\n    layer_patterns: [{window: 2}]\n", 4, "not also in transformer.attention.pattern"),
    ("transformer:\n  attention:\n    layer_patterns: [{dilation: 2}]\n", 3, "give the layer a window too"),
    ("transformer:\n  layers: 2\n  attention:\n    layer_patterns: [{window: 2}, {}, {window: 4}]\n", 4, "3 entries, but the model's deepest stack has 2 layers: entries 2 and later would never act"),
    ("transformer:\n  norm: group_norm\n", 2, "unknown variant `group_norm`"),
    ("kind: swin\ntransformer:\n  attention:\n    layer_patterns: [{window: 2}]\n", 4, "kind swin attends inside 2-D windows"),
    ("kind: davit\nvision:\n  depths: [1]\n  attention_types: [spatial, channel]\n", 4, "2 block kinds, but the deepest stage has 1 blocks"),
    ("kind: translate\ndata:\n  tokenizer: bpe\n  vocab_size: 300\ntransformer:\n  layers: 3\n", 6, "set translate.encoder_layers and translate.decoder_layers"),
    ("kind: translate\ndata:\n  tokenizer: bpe\n  vocab_size: 300\n  max_chars: 100\n", 5, "reads sentence pairs (translate.pairs), not a corpus"),
    ("kind: translate\ndata:\n  tokenizer: bpe\n  vocab_size: 300\ntranslate:\n  length_penalty: 1.0\n", 6, "translate.beam_width is 1 (greedy)"),
    ("kind: bert\ndata:\n  tokenizer: bpe\n  vocab_size: 300\ntrain:\n  eval_lengths: [2]\n", 6, "length generalisation evaluates a decoder"),
    ("kind: bert\ndata:\n  tokenizer: bpe\n  vocab_size: 300\ntrain:\n  probe_outliers: true\n", 6, "the outlier probe reads a decoder's test batches"),
    ("kind: bert\ndata:\n  tokenizer: bpe\n  vocab_size: 300\ntrain:\n  probe_residual: true\n", 6, "the residual-stream probe reads a decoder's test batches"),
    // Vision: a Swin token grid the window does not tile, a patch that does not divide the image, a model
    // that does not fit the images.
    ("kind: swin\nvision:\n  patch_size: 2\n  depths: [2, 2]\n  window: 5\n", 5, "windows that do: 1, 2, 7, 14"),
    ("kind: vit\nvision:\n  patch_size: 5\n", 3, "vision.patch_size: 5 does not divide image_size 28"),
    ("kind: vit\nvision:\n  channels: 3\n", 3, "vision.channels: FashionMnist images need 1"),
    ("kind: vit\ndata:\n  images:\n    train_fraction: 0\n", 4, "must be in (0, 1]"),
    // Found by cargo fuzz: listing the divisors of an absurd width used to take forever.
    ("transformer:\n  d_model: 1999999999999999\n", 2, "transformer.d_model: must be at most 1048576"),
    ("kind: vit\nvision:\n  image_size: 999999999999\n", 3, "vision.image_size: must be at most 65536"),
    ("sweep:\n  train.min_lr: [0,1,2,3,4,5,6,7,8,9]\n  train.lr: [1,2,3,4,5,6,7,8,9,10]\n  transformer.layers: [1,2,3,4,5,6,7,8,9,10]\n  train.steps: [1,2,3,4,5,6,7,8,9,10]\n  train.batch_size: [1,2,3,4,5,6,7,8,9,10]\n  train.warmup_steps: [1,2,3,4,5,6,7,8,9,10]\n", 1, "1000000 runs; at most 100000"),
    ("train:\n  precision: fp8\n", 2, "`fp32`, `bf16`, `fp16`"),
    ("train:\n  checkpoint_every: 0\n", 2, "train.checkpoint_every: must be at least 1"),
    ("sweep:\n  train.precision: [fp32, half]\n", 2, "train.precision"),
    // Tokenizers.
    ("data:\n  vocab_size: 500\n", 2, "data.vocab_size: a character vocabulary"),
    ("data:\n  tokenizer: bpe\n", 1, "bpe is trained on the corpus to a target size: set data.vocab_size"),
    ("data:\n  tokenizer: bpe\n  vocab_size: 100\n", 3, "263..=1000000"),
    ("data:\n  tokenizer: bpe\n  vocab_size: 300\n  tokenizer_path: v.txt\n", 4, "set data.tokenizer: wordpiece"),
    ("data:\n  tokenizer: wordpiece\n  tokenizer_path: /nonexistent/vocab.txt\n", 3, "no such file"),
    ("data:\n  tokenizer: sentencepiece\n", 2, "`char`, `bpe`, `wordpiece`"),
    // BERT.
    ("kind: bert\nbert:\n  task: spam\n", 1, "use a wordpiece or bpe tokenizer"),
    ("kind: bert\nbert:\n  task: qa\n", 3, "expected one of `mlm`, `pretrain`, `spam`, `punctuation`, `locate`"),
    ("kind: bert\nbert:\n  objective: electra\n", 3, "expected one of `masked`, `masked_nsp`, `next_token`"),
    ("kind: bert\ndata:\n  tokenizer: bpe\n  vocab_size: 300\nbert:\n  task: locate\n  objective: masked_nsp\n", 7, "this fine-tuning run does not pre-train"),
    ("kind: bert\ndata:\n  tokenizer: bpe\n  vocab_size: 300\nbert:\n  eval_mask_fraction: 0\n", 6, "bert.eval_mask_fraction: must be in (0, 1), got 0"),
    ("kind: bert\ndata:\n  tokenizer: bpe\n  vocab_size: 300\nbert:\n  mask_fraction: 1.5\n", 6, "bert.mask_fraction"),
    ("kind: bert\ndata:\n  tokenizer: bpe\n  vocab_size: 300\nbert:\n  pretrain_steps: 5\n", 6, "task: pretrain pre-trains for train.steps"),
    ("kind: bert\ndata:\n  tokenizer: bpe\n  vocab_size: 300\nbert:\n  task: spam\n  pretrain_lr: 0.01\n", 7, "bert.pretrain_steps is 0"),
    ("kind: bert\ndata:\n  tokenizer: bpe\n  vocab_size: 300\nbert:\n  task: spam\n  init_from: /nonexistent.safetensors\n", 7, "no such checkpoint"),
    // ImageGPT.
    ("kind: image_gpt\nimage_gpt:\n  palette: 1\n", 3, "must be in 2..=4096"),
    ("kind: vit\nimage_gpt:\n  palette: 8\n", 3, "the image_gpt section is read by kind image_gpt only"),
    // Translation.
    ("kind: translate\ntranslate:\n  encoder_layers: 2\n", 1, "use bpe or wordpiece"),
    ("kind: translate\ndata:\n  tokenizer: bpe\n  vocab_size: 300\ntranslate:\n  cross_attention_layers: 3\n", 6, "0..=2 (the decoder's layers), got 3"),
    ("kind: translate\ndata:\n  tokenizer: bpe\n  vocab_size: 300\ntranslate:\n  pairs: klingon\n", 6, "bible_en_es"),
    ("train:\n  schedule: linear\n", 2, "expected `cosine` or `noam`"),
    // Sequence classification (the Long Range Arena's tasks).
    ("kind: seq_classify\ntransformer:\n  block_size: 256\nseq_classify:\n  task: pathfinder\n", 3, "task pathfinder gives sequences of 1024 tokens"),
    ("kind: seq_classify\ntransformer:\n  block_size: 500\nseq_classify:\n  min_length: 100\n  max_length: 500\n  pool: cls\n", 3, "500 tokens and the <cls> token: set it to at least 501"),
    ("kind: seq_classify\ntransformer:\n  pe: bias_2d\n", 3, "bias_2d needs a 2-D token grid; kind seq_classify"),
    ("kind: seq_classify\nseq_classify:\n  task: retrieval\n", 3, "expected one of `listops`, `pathfinder`, `pixels`, `bytes`"),
    ("kind: seq_classify\nseq_classify:\n  task: pathfinder\n  min_length: 10\n", 4, "shortest ListOps expression (task listops); seq_classify.task is pathfinder"),
    ("kind: seq_classify\nseq_classify:\n  min_length: 300\n  max_length: 301\n", 4, "must be at least min_length + 2 = 302"),
    ("kind: seq_classify\nseq_classify:\n  task: pathfinder\n  image_size: 4\n", 4, "must be in 8..=256 pixels"),
    ("kind: seq_classify\ndata:\n  corpus: bible\n", 3, "kind seq_classify makes its sequences from the seq_classify section"),
    ("kind: lm\nseq_classify:\n  task: bytes\n", 3, "the seq_classify section is read by kind seq_classify only"),
    // Value embeddings: the first and the last N layers must not overlap; image classifiers have no token ids.
    ("transformer:\n  layers: 3\n  value_embeddings: 2\n", 3, "needs at least 4 layers; transformer.layers is 3"),
    ("kind: translate\ndata:\n  tokenizer: bpe\n  vocab_size: 300\ntranslate:\n  encoder_layers: 4\n  decoder_layers: 1\ntransformer:\n  value_embeddings: 1\n", 9, "the shallower of translate's stacks has 1"),
    ("transformer:\n  value_embeddings: -1\n", 2, "transformer.value_embeddings: must be at least 0"),
    ("kind: vit\ntransformer:\n  value_embeddings: 1\n", 3, "embeds image patches, which have none"),
];

/// `text` with `kind: lm` added after it when it names no kind (its lines keep their numbers).
fn with_kind(text: &str) -> String {
    if text.contains("kind:") {
        text.to_string()
    } else {
        format!("{text}kind: lm\n")
    }
}

#[test]
fn every_malformed_recipe_gets_one_line_with_file_line_and_key() {
    assert!(CASES.len() >= 30);
    let mut failures = Vec::new();
    for (i, (text, line, needle)) in CASES.iter().enumerate() {
        match parse(&with_kind(text), "bad.yaml", "bad", false) {
            Ok(_) => failures.push(format!("case {i}: accepted\n{text}")),
            Err(e) => {
                let shown = e.to_string();
                if e.line != *line || !shown.contains(needle) || shown.contains('\n') {
                    failures.push(format!("case {i}: got `{shown}`, wanted line {line} and `{needle}`"));
                }
                if !shown.starts_with(&format!("bad.yaml:{}: ", e.line)) {
                    failures.push(format!("case {i}: `{shown}` does not start with bad.yaml:{}:", e.line));
                }
            }
        }
    }
    assert!(failures.is_empty(), "{} of {} cases wrong:\n{}", failures.len(), CASES.len(), failures.join("\n"));
}

/// A small deterministic mutation fuzzer: shipped recipes with characters replaced, inserted or deleted and
/// lines dropped or duplicated. The loader must never panic, and every rejection is one line with file:line.
#[test]
fn mutated_recipes_never_panic_the_loader() {
    let dir = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("recipes");
    let mut seeds: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|e| e == "yaml") && !ablate::run::complexity::is_complexity_recipe(p))
        .map(|p| std::fs::read_to_string(p).unwrap())
        .collect();
    seeds.sort();
    let alphabet: Vec<char> = "abcdehilmnoprstuwxyz_.:-[]{},'\"#|>&*!%@ \n\t0123456789".chars().collect();
    let mut state: u64 = 0x0bad_5eed;
    let mut next = move |bound: usize| {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        (state % bound as u64) as usize
    };
    let (mut accepted, mut rejected) = (0, 0);
    for round in 0..3000 {
        let mut text: Vec<char> = seeds[round % seeds.len()].chars().collect();
        for _ in 0..1 + next(4) {
            let at = next(text.len().max(1));
            match next(5) {
                0 if !text.is_empty() => {
                    let last = text.len() - 1;
                    text[at.min(last)] = alphabet[next(alphabet.len())];
                }
                1 => text.insert(at.min(text.len()), alphabet[next(alphabet.len())]),
                2 if !text.is_empty() => {
                    text.remove(at.min(text.len() - 1));
                }
                _ => {
                    let s: String = text.iter().collect();
                    let mut lines: Vec<&str> = s.lines().collect();
                    if !lines.is_empty() {
                        let l = next(lines.len());
                        if next(2) == 0 {
                            lines.remove(l);
                        } else {
                            lines.insert(l, lines[l]);
                        }
                    }
                    text = (lines.join("\n") + "\n").chars().collect();
                }
            }
        }
        let text: String = text.into_iter().collect();
        let outcome = std::panic::catch_unwind(|| parse(&text, "fuzz.yaml", "fuzz", round % 2 == 0));
        match outcome {
            Err(_) => panic!("the loader panicked on:\n{text}"),
            Ok(Ok(_)) => accepted += 1,
            Ok(Err(e)) => {
                let shown = e.to_string();
                assert!(shown.starts_with("fuzz.yaml:") && !shown.contains('\n'), "not one located line: {shown:?}");
                assert!(
                    e.line >= 1 && e.line <= text.lines().count().max(1),
                    "line {} outside the file: {shown}",
                    e.line
                );
                rejected += 1;
            }
        }
    }
    // Both outcomes happen, so the mutations are neither all harmless nor all fatal.
    assert!(accepted > 100 && rejected > 100, "accepted {accepted}, rejected {rejected}");
}

#[test]
fn an_unwritable_output_directory_fails_before_training_with_one_line() {
    let dir = std::env::temp_dir().join(format!("ablate-unwritable-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let recipe = dir.join("r.yaml");
    std::fs::write(&recipe, "kind: lm\ntransformer:\n  d_model: 16\n  layers: 1\n").unwrap();
    // A path below a regular file can never be created, whoever runs the test (root included).
    let blocker = dir.join("a-file");
    std::fs::write(&blocker, "").unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_ablate"))
        .arg(&recipe)
        .arg("--out")
        .arg(blocker.join("results"))
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(stderr.contains("cannot create the output directory") && stderr.contains("a-file/results"), "{stderr}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// Every input cargo fuzz kept (`fuzz/corpus/recipe`: the shipped recipes, the crashes it found, and what
/// it learned from): the same checks as the fuzz target, on stable Rust, in every test run.
#[test]
fn the_fuzz_corpus_loads_without_panics_and_with_located_errors() {
    let dir = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("fuzz/corpus/recipe");
    let mut checked = 0;
    for entry in std::fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        let bytes = std::fs::read(&path).unwrap();
        let Some((&flags, rest)) = bytes.split_first() else { continue };
        let Ok(text) = std::str::from_utf8(rest) else { continue };
        let outcome = std::panic::catch_unwind(|| parse(text, "fuzz.yaml", "fuzz", flags & 1 == 1));
        let Ok(result) = outcome else { panic!("the loader panicked on {}", path.display()) };
        if let Err(e) = result {
            let shown = e.to_string();
            let lines = text.replace("\r\n", "\n").replace('\r', "\n").lines().count().max(1);
            assert!(!shown.contains('\n') && shown.starts_with("fuzz.yaml"), "{}: {shown:?}", path.display());
            assert!(e.line <= lines, "{}: line {} of {lines}: {shown}", path.display(), e.line);
        }
        checked += 1;
    }
    assert!(checked >= 6, "only {checked} corpus files");
}

#[test]
fn a_variant_that_replaces_a_section_the_recipe_writes_is_refused_with_the_dotted_form() {
    // `{transformer: {attention: {softcap: 0.5}}}` replaces the whole transformer section: the base's
    // d_model 32 would silently become 128. Refused in one line at the variant's line, naming the lost key
    // and the dotted spelling that means "change one key".
    let text = "kind: lm\ntransformer: {d_model: 32, layers: 2, heads: 4, block_size: 16}\nvariants:\n  - {label: a}\n  - {label: capped, transformer: {attention: {softcap: 0.5}}}\n";
    let err = ablate::recipe::parse(text, "trap.yaml", "trap", false).unwrap_err().to_string();
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.starts_with("trap.yaml:5: transformer: replaces the whole section"), "{err}");
    assert!(
        err.contains("transformer.d_model and 3 more") && err.contains("`transformer.attention.softcap: 0.5`"),
        "{err}"
    );
    // The dotted form is accepted and keeps the base; so is a section that repeats what it keeps, and a
    // section the recipe writes nothing in.
    for ok in [
        "  - {label: capped, transformer.attention.softcap: 0.5}\n",
        "  - {label: capped, transformer: {d_model: 32, layers: 2, heads: 4, block_size: 16, attention: {softcap: 0.5}}}\n",
        "  - {label: capped, transformer.attention: {softcap: 0.5}}\n",
    ] {
        let text = format!("kind: lm\ntransformer: {{d_model: 32, layers: 2, heads: 4, block_size: 16}}\nvariants:\n  - {{label: a}}\n{ok}");
        let recipe = ablate::recipe::parse(&text, "ok.yaml", "ok", false).unwrap_or_else(|e| panic!("{ok}: {e}"));
        assert!(recipe.runs.iter().all(|r| r.config.transformer.d_model == 32), "{ok}");
    }
    // A sweep over whole sections is held to the same rule.
    let sweep = "kind: lm\ntransformer: {d_model: 32, layers: 2, heads: 4, block_size: 16, attention: {pattern: {window: 4}}}\nsweep:\n  transformer.attention: [{softcap: 0.5}, {pattern: {window: 2}}]\n";
    let err = ablate::recipe::parse(sweep, "s.yaml", "s", false).unwrap_err().to_string();
    assert!(
        err.contains("transformer.attention: replaces the whole section")
            && err.contains("transformer.attention.pattern.window"),
        "{err}"
    );
}
