//! Malformed and impossible recipes, tried systematically: each must be rejected before training with one
//! line that names the file, the line and the key.
use ablate::recipe::parse;

/// (recipe text, expected line, text the message must contain)
const CASES: &[(&str, usize, &str)] = &[
    ("model:\n  heads: [1, 2\n", 2, "YAML syntax error"),
    ("model:\n\theads: 2\n", 2, "YAML syntax error"),
    ("modle:\n  heads: 2\n", 1, "did you mean `model`"),
    ("model:\n  hedas: 4\n", 2, "did you mean `heads`"),
    ("train:\n  step: 10\n", 2, "did you mean `steps`"),
    ("model:\n  attention:\n    scael: none\n", 3, "did you mean `scale`"),
    ("model:\n  heads: four\n", 2, "model.heads"),
    ("model:\n  d_model: 12.5\n", 2, "model.d_model"),
    ("train:\n  lr: fast\n", 2, "train.lr"),
    ("model:\n  pre_ln: maybe\n", 2, "model.pre_ln"),
    ("model:\n  pe: rotary\n", 2, "rope"),
    ("model:\n  activation: swish\n", 2, "gelu"),
    ("model:\n  attention:\n    implementation: flash\n", 3, "sparse"),
    ("model:\n  attention:\n    scale: -2\n", 3, "sqrt_dk, none, or a positive number"),
    ("model:\n  d_model: 128\n  heads: 5\n", 3, "allowed: 1, 2, 4, 8, 16, 32, 64, 128"),
    ("model:\n  d_model: 96\nsweep:\n  model.heads:\n    - 4\n    - 7\n", 6, "7 heads do not divide d_model 96"),
    ("model:\n  layers: 0\n", 2, "model.layers: must be at least 1"),
    ("model:\n  block_size: -4\n", 2, "model.block_size"),
    ("model:\n  dropout: 1.5\n", 2, "model.dropout: must be in [0, 1)"),
    ("train:\n  lr: -0.001\n", 2, "train.lr: must be a positive number"),
    ("train:\n  min_lr: 0.5\n", 2, "train.min_lr"),
    ("train:\n  beta2: 1.0\n", 2, "train.beta2"),
    ("train:\n  grad_clip: 0\n", 2, "train.grad_clip"),
    ("train:\n  batch_size: 0\n", 2, "train.batch_size"),
    ("train:\n  warmup_steps: -1\n", 2, "train.warmup_steps"),
    ("data:\n  val_fraction: 1.0\n", 2, "data.val_fraction"),
    ("data:\n  path: /definitely/not/here.txt\n", 2, "no such file"),
    ("data:\n  corpus: shakespeare\n", 2, "bible"),
    ("data:\n  task: copy\n  copy_length: 10\n", 1, "2·copy_length = 20"),
    ("data:\n  task: copy\n  copy_symbols: 40\n", 3, "data.copy_symbols"),
    ("model:\n  block_size: 32\n  attention:\n    pattern:\n      window: 32\n", 5, "covers the whole block"),
    ("model:\n  attention:\n    pattern:\n      window: 0\n", 4, "model.attention.pattern.window"),
    ("model:\n  attention:\n    pattern:\n      dilation: 3\n", 4, "a dilation needs a window"),
    ("model:\n  attention:\n    pattern:\n      global_every: 0\n", 4, "global_every"),
    ("model:\n  attention:\n    implementation: sparse\n", 3, "needs a window pattern"),
    ("model:\n  pe: alibi\n  position:\n    at: every_layer\n", 4, "only absolute encodings"),
    ("model:\n  pe: rope\n  position:\n    rope_fraction: 0\n", 4, "rope_fraction"),
    ("model:\n  position:\n    t5_buckets: 2\n", 3, "t5_buckets"),
    ("train:\n  eval_lengths: [2, 1]\n", 2, "train.eval_lengths"),
    ("sweep:\n  model.heads: []\n", 2, "non-empty list"),
    ("sweep:\n  model.heads: 4\n", 2, "non-empty list"),
    ("sweep:\n  model.hedas: [1, 2]\n", 2, "did you mean model.heads?"),
    ("sweep:\n  trian.steps: [1, 2]\n", 2, "did you mean train?"),
    ("sweep:\n  model.heads.x: [1]\n", 2, "is a value, not a section"),
    ("sweep:\n  model.pe:\n    - none\n    - learnt\n", 4, "model.pe"),
    ("seeds: []\n", 1, "seeds: the list is empty"),
    ("seeds: [1, -2]\n", 1, "seeds"),
    ("smoke:\n  train.stpes: 3\n", 2, "did you mean train.steps?"),
    ("unexpected: 1\n", 1, "unknown field `unexpected`"),
    // Found by cargo fuzz: a key with a line break in it must not break the one-line error.
    ("model: {\"hea\\nds\": 4}\n", 1, "unknown field `hea\\nds`"),
    // Also found by cargo fuzz: YAML ends a line at a lone carriage return, and so do the line numbers.
    ("train:\r  lr: fast\r", 2, "train.lr"),
    // Vision: a Swin token grid the window does not tile, a patch that does not divide the image, image data
    // without a model, a model that does not fit the images.
    (
        "vision:\n  arch: swin\n  patch_size: 2\n  dim: 32\n  depths: [2, 2]\n  heads: [2, 4]\n  window: 5\n",
        7,
        "windows that do: 1, 2, 7, 14",
    ),
    ("vision:\n  patch_size: 5\n", 2, "vision.patch_size: 5 does not divide image_size 28"),
    ("data:\n  images:\n    dataset: fashion_mnist\n", 2, "needs a `vision` model section"),
    ("vision:\n  channels: 3\n", 2, "vision.channels: FashionMnist images need 1"),
    ("vision:\n  arch: vit\n  depths: [2, 2]\n  heads: [2, 2]\n", 3, "a ViT has one stage"),
    ("data:\n  images:\n    train_fraction: 0\nvision:\n  arch: vit\n", 3, "must be in (0, 1]"),
    // Found by cargo fuzz: listing the divisors of an absurd width used to take forever.
    ("model:\n  d_model: 1999999999999999\n", 2, "model.d_model: must be at most 1048576"),
    ("vision:\n  image_size: 999999999999\n", 2, "vision.image_size: must be at most 65536"),
    ("sweep:\n  train.seed: [0,1,2,3,4,5,6,7,8,9]\n  train.lr: [1,2,3,4,5,6,7,8,9,10]\n  model.layers: [1,2,3,4,5,6,7,8,9,10]\n  train.steps: [1,2,3,4,5,6,7,8,9,10]\n  train.batch_size: [1,2,3,4,5,6,7,8,9,10]\n  train.warmup_steps: [1,2,3,4,5,6,7,8,9,10]\n", 1, "1000000 runs; at most 100000"),
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
    ("bert:\n  task: spam\n", 1, "use a wordpiece or bpe tokenizer"),
    ("bert:\n  task: qa\n", 2, "expected one of `mlm`, `pretrain`, `spam`, `punctuation`, `locate`"),
    ("bert:\n  objective: electra\n", 2, "expected `masked` or `next_token`"),
    ("data:\n  tokenizer: bpe\n  vocab_size: 300\nbert:\n  task: locate\n  objective: next_token\n", 6, "next_token is for task: pretrain"),
    ("data:\n  tokenizer: bpe\n  vocab_size: 300\nbert:\n  eval_mask_fraction: 0\n", 5, "bert.eval_mask_fraction: must be in (0, 1), got 0"),
    ("data:\n  tokenizer: bpe\n  vocab_size: 300\nbert:\n  mask_fraction: 1.5\n", 5, "bert.mask_fraction"),
    ("data:\n  tokenizer: bpe\n  vocab_size: 300\nbert:\n  pretrain_steps: 5\n", 5, "only with a fine-tuning task"),
    ("data:\n  tokenizer: bpe\n  vocab_size: 300\nbert:\n  init_from: /nonexistent.safetensors\n", 5, "no such checkpoint"),
    // ImageGPT.
    ("vision:\n  arch: image_gpt\n  patch_size: 2\n", 1, "needs its palette section"),
    ("vision:\n  arch: image_gpt\n  patch_size: 2\n  image_gpt:\n    palette: 1\n", 5, "must be in 2..=4096"),
    ("vision:\n  arch: vit\n  image_gpt:\n    palette: 8\n", 3, "only for arch image_gpt"),
    // Translation.
    ("translate:\n  encoder_layers: 2\n", 1, "use bpe or wordpiece"),
    ("data:\n  tokenizer: bpe\n  vocab_size: 300\ntranslate:\n  cross_attention_layers: 3\n", 5, "0..=2 (the decoder's layers), got 3"),
    ("data:\n  tokenizer: bpe\n  vocab_size: 300\ntranslate:\n  pairs: klingon\n", 5, "bible_en_es"),
    ("train:\n  schedule: linear\n", 2, "expected `cosine` or `noam`"),
];

#[test]
fn every_malformed_recipe_gets_one_line_with_file_line_and_key() {
    assert!(CASES.len() >= 30);
    let mut failures = Vec::new();
    for (i, (text, line, needle)) in CASES.iter().enumerate() {
        match parse(text, "bad.yaml", "bad", false) {
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
        .filter(|p| p.extension().is_some_and(|e| e == "yaml") && !ablate::complexity::is_complexity_recipe(p))
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
    std::fs::write(&recipe, "model:\n  d_model: 16\n  layers: 1\n").unwrap();
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
