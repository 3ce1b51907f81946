//! Tokenizers, the BERT encoder, and loading a pretrained Hugging Face checkpoint: all-MiniLM-L6-v2's
//! embeddings must equal an independent PyTorch forward pass (tests/reference/bert_reference.py) from the
//! same weights.
use ablate::data::tokenize::{Special, TextTokenizer};
use ablate::models::bert::{Bert, BertInputs, BertSpec};
use ablate::tasks::pretrained::{batch_inputs, load_pretrained, minilm_dir};
use std::process::Command;
use tch::{nn, Device, Kind, Tensor};

const VERSES: &str = "In the beginning, God created the heavens and the earth.\n\
The earth was formless and empty. Darkness was on the surface of the deep.\n\
God's Spirit was hovering over the surface of the waters.\n\
God said, \"Let there be light,\" and there was light.\n\
God saw the light, and saw that it was good. God divided the light from the darkness.\n";

#[test]
fn bpe_reaches_its_vocabulary_size_round_trips_bytes_and_merges_shorten_the_text() {
    let text = VERSES.repeat(20);
    let small = TextTokenizer::train_bpe(&text, 300).unwrap();
    let large = TextTokenizer::train_bpe(&text, 400).unwrap();
    assert_eq!(small.vocab_size(), 300);
    for (i, s) in Special::ALL.iter().enumerate() {
        assert_eq!(small.special(*s), Some(i as i64), "{s:?}");
    }
    // Byte-level: any text, even characters never seen in training, comes back exactly.
    let probe = "The waters — naïve café, 42 × π!\n";
    for t in [&small, &large] {
        assert_eq!(t.decode(&t.encode(probe).unwrap()), probe);
    }
    // More merges, fewer tokens for the same text.
    let n = |t: &TextTokenizer| t.encode(VERSES).unwrap().len();
    assert!(n(&large) < n(&small) && n(&small) < VERSES.len(), "{} {} {}", n(&large), n(&small), VERSES.len());
}

#[test]
fn wordpiece_trains_with_the_special_tokens_and_splits_unseen_words_into_pieces() {
    let t = TextTokenizer::train_wordpiece(&VERSES.repeat(20), 120).unwrap();
    assert!(t.vocab_size() <= 120);
    for s in [Special::Pad, Special::Cls, Special::Sep, Special::Mask, Special::Unk] {
        assert!(t.special(s).is_some(), "{s:?}");
    }
    let ids = t.encode("God divided the waters").unwrap();
    let tokens = t.tokens(&ids);
    // Lower-cased by BERT's normaliser; a word missing from the vocabulary comes out as `##` continuations.
    assert_eq!(tokens[0], "god", "{tokens:?}");
    assert!(tokens.iter().any(|p| p.starts_with("##")), "{tokens:?}");
    assert_eq!(t.decode(&ids), "god divided the waters");
}

#[test]
fn wordpiece_training_gives_the_same_vocabulary_and_ids_every_time() {
    // Real text with many count ties among merges: the stock trainer disagreed with itself here (its
    // continuation pieces were numbered in hash-map order, and ties broken by those numbers).
    let cfg = ablate::recipe::DataConfig { max_chars: Some(60_000), ..Default::default() };
    let text = ablate::data::load_text(&cfg).unwrap();
    let vocab = |t: &TextTokenizer| (0..t.vocab_size()).flat_map(|i| t.tokens(&[i])).collect::<Vec<_>>();
    let first = TextTokenizer::train_wordpiece(&text, 800).unwrap();
    assert_eq!(first.vocab_size(), 800);
    let ids = first.encode(&text).unwrap();
    for _ in 0..4 {
        let again = TextTokenizer::train_wordpiece(&text, 800).unwrap();
        assert_eq!(vocab(&again), vocab(&first));
        assert_eq!(again.encode(&text).unwrap(), ids);
    }
    // Continuation pieces stay ordinary vocabulary, not special tokens: "##e" typed in the text is split
    // like any punctuation and word, never matched whole.
    let tokens = first.tokens(&first.encode("ab ##e").unwrap());
    assert_eq!(tokens.last().map(String::as_str), Some("e"), "{tokens:?}");
    assert!(!tokens.contains(&"##e".to_string()), "{tokens:?}");
    assert!(vocab(&first).iter().filter(|t| t.starts_with("##")).count() > 100);
}

#[test]
fn bert_base_has_the_reference_parameter_count() {
    let vs = nn::VarStore::new(Device::Cpu);
    let _bert = Bert::new(&vs.root(), &BertSpec::base());
    let params: i64 = vs.trainable_variables().iter().map(|t| t.numel() as i64).sum();
    // Hugging Face's BertModel (bert-base-uncased, with its pooler).
    assert_eq!(params, 109_482_240);
}

#[test]
fn the_minilm_tokenizer_gives_berts_uncased_ids_from_tokenizer_json_and_from_vocab_txt() {
    let dir = minilm_dir().unwrap();
    for file in ["tokenizer.json", "vocab.txt"] {
        let t = TextTokenizer::load(&dir.join(file)).unwrap();
        assert_eq!(t.vocab_size(), 30522, "{file}");
        // bert-base-uncased's well-known ids.
        assert_eq!(t.encode("Hello, world!").unwrap(), vec![7592, 1010, 2088, 999], "{file}");
        assert_eq!(
            [Special::Pad, Special::Unk, Special::Cls, Special::Sep, Special::Mask].map(|s| t.special(s).unwrap()),
            [0, 100, 101, 102, 103],
            "{file}"
        );
    }
}

fn reference(dir: &std::path::Path, ids: &Tensor, mask: &Tensor) -> (Tensor, Tensor) {
    let libtorch = std::env::var("LIBTORCH").expect("LIBTORCH names the torch wheel's torch/ directory");
    let site = std::path::Path::new(&libtorch).parent().unwrap().to_path_buf();
    let to_rows = |t: &Tensor| -> Vec<Vec<i64>> { Vec::<Vec<i64>>::try_from(t.to_kind(Kind::Int64)).unwrap() };
    let request = serde_json::json!({ "ids": to_rows(ids), "mask": to_rows(mask) }).to_string();
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/reference/bert_reference.py");
    let mut child = Command::new("python3")
        .arg(script)
        .arg(dir)
        .env("PYTHONPATH", &site)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    use std::io::Write;
    child.stdin.take().unwrap().write_all(request.as_bytes()).unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "the PyTorch reference failed");
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let floats = |v: &serde_json::Value| -> Vec<f32> {
        fn walk(v: &serde_json::Value, out: &mut Vec<f32>) {
            match v {
                serde_json::Value::Array(a) => a.iter().for_each(|x| walk(x, out)),
                x => out.push(x.as_f64().unwrap() as f32),
            }
        }
        let mut out = Vec::new();
        walk(v, &mut out);
        out
    };
    let (b, n) = ids.size2().unwrap();
    let hidden = Tensor::from_slice(&floats(&v["hidden"])).view([b, n, -1]);
    let mean = Tensor::from_slice(&floats(&v["mean"])).view([b, -1]);
    (hidden, mean)
}

#[test]
fn minilm_hidden_states_and_mean_pooled_embeddings_match_pytorch_to_1e_5() {
    let dir = minilm_dir().unwrap();
    let pretrained = load_pretrained(&dir, Device::Cpu).unwrap();
    // Different lengths, so the shorter rows are padded and the padding mask matters.
    let texts = [
        "A man is playing a guitar.",
        "The quick brown fox jumps over the lazy dog, twice, before breakfast.",
        "Transformers!",
    ];
    let (ids, mask) = batch_inputs(&pretrained.tokenizer, &texts, 512).unwrap();
    let hidden = tch::no_grad(|| pretrained.model.forward(&ids, BertInputs::padded(&mask), false));
    let (ref_hidden, ref_mean) = reference(&dir, &ids, &mask);
    // Compare only real tokens: padded positions' states are never used.
    let m = mask.unsqueeze(-1).to_kind(Kind::Float);
    let diff = ((&hidden - &ref_hidden) * &m).abs().max().double_value(&[]);
    println!("hidden states: largest difference {diff:e}");
    assert!(diff < 1e-5, "hidden states differ by {diff}");
    let ours = pretrained.embed(&texts, false).unwrap();
    let diff = (&ours - &ref_mean).abs().max().double_value(&[]);
    println!("mean-pooled embeddings: largest difference {diff:e}");
    assert!(diff < 1e-5, "mean-pooled embeddings differ by {diff}");
    // Padding changes nothing: each text alone gives the same embedding as in the batch.
    for (i, t) in texts.iter().enumerate() {
        let alone = pretrained.embed(&[t], false).unwrap();
        let diff = (alone.get(0) - ours.get(i as i64)).abs().max().double_value(&[]);
        assert!(diff < 1e-5, "text {i} alone differs by {diff}");
    }
}

#[test]
fn ablate_embed_prints_unit_vectors_whose_similarities_follow_meaning() {
    let out = Command::new(env!("CARGO_BIN_EXE_ablate"))
        .args(["embed", "A man is playing a guitar.", "Someone plays the guitar.", "The stock market fell sharply."])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let rows: Vec<Vec<f64>> =
        String::from_utf8(out.stdout).unwrap().lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert_eq!(rows.len(), 3);
    let dot = |a: &[f64], b: &[f64]| a.iter().zip(b).map(|(x, y)| x * y).sum::<f64>();
    for r in &rows {
        assert_eq!(r.len(), 384);
        assert!((dot(r, r) - 1.0).abs() < 1e-5, "all-MiniLM-L6-v2's pipeline normalises");
    }
    let (same, different) = (dot(&rows[0], &rows[1]), dot(&rows[0], &rows[2]));
    assert!(same > 0.5 && different < 0.2, "paraphrase {same}, unrelated {different}");
}
