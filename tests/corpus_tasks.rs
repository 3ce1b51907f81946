//! The corpus-generated fine-tuning tasks (punctuation restoration, phrase location), their heads and
//! metrics, and the next-token objective on the BERT encoder.
use ablate::data::corpus_tasks::{
    choose_phrase, encode_words, locate_examples, mark_f1, normalise, punctuation_examples, span_scores, strip_mark,
    word_pieces, Specials,
};
use ablate::data::tokenize::TextTokenizer;
use ablate::data::IGNORE;
use ablate::models::bert::{Bert, BertInputs, BertSpec};
use ablate::tasks::bert::{next_token_targets, SpanPredictor};
use ablate::transformer::spec::TransformerSpec;
use tch::{nn, Device, Kind, Tensor};

mod common;

/// The first 300,000 characters of the Bible: enough lines for real tokenizers, quick to train on.
fn bible_start() -> String {
    let cfg = ablate::recipe::DataConfig { max_chars: Some(300_000), ..Default::default() };
    ablate::data::load_text(&cfg).unwrap()
}

#[test]
fn marks_are_stripped_and_classified_with_closing_quotes_kept() {
    let _serial = common::serial();
    let cases = [
        ("said,", "said", 1),
        ("light,”", "light”", 1),
        ("earth.", "earth", 2),
        ("Lord?”", "Lord”", 4),
        ("this:", "this", 3),
        ("him;", "him", 3),
        ("“Hello!", "“Hello", 5),
        ("what?!", "what", 4),
        ("end...", "end", 2),
        ("God", "God", 0),
        ("3:16", "3:16", 0),
        ("—", "—", 0),
        ("...", "...", 0),
    ];
    for (word, bare, class) in cases {
        assert_eq!(strip_mark(word), (bare.to_string(), class), "{word}");
    }
}

#[test]
fn words_encoded_one_by_one_give_the_tokens_of_the_whole_line() {
    let _serial = common::serial();
    let text = bible_start();
    let pieces: Vec<Vec<String>> =
        word_pieces(&text).into_iter().take(400).map(|w| w.into_iter().map(String::from).collect()).collect();
    for tokenizer in
        [TextTokenizer::train_bpe(&text, 1000).unwrap(), TextTokenizer::train_wordpiece(&text, 1000).unwrap()]
    {
        let encoded = encode_words(&tokenizer, &pieces).unwrap();
        for (words, tokens) in pieces.iter().zip(&encoded) {
            let whole = tokenizer.encode(&words.join(" ")).unwrap();
            assert_eq!(tokens.concat(), whole, "{}", words.join(" "));
        }
    }
}

#[test]
fn punctuation_rows_label_each_word_s_last_token_with_the_mark_that_followed_it() {
    let _serial = common::serial();
    let text = bible_start();
    let t = TextTokenizer::train_wordpiece(&text, 1000).unwrap();
    let s = Specials::of(&t).unwrap();
    let line = "In the beginning, God created the heavens and the earth. Now the earth was formless!";
    let words: Vec<&str> = line.split(' ').collect();
    let x = punctuation_examples(&t, std::slice::from_ref(&words), 48, s).unwrap();
    let ids = Vec::<i64>::try_from(x.ids.get(0)).unwrap();
    let labels = Vec::<i64>::try_from(x.labels.get(0)).unwrap();
    let real = Vec::<bool>::try_from(x.padding.get(0)).unwrap();
    let n = real.iter().filter(|&&r| r).count();
    assert_eq!((ids[0], ids[n - 1]), (s.cls, s.sep));
    // The input is the line without its marks.
    let bare = "In the beginning God created the heavens and the earth Now the earth was formless";
    assert_eq!(&ids[1..n - 1], t.encode(bare).unwrap().as_slice());
    // One scored token per word, in order, with the mark after it (none 0, comma 1, full stop 2, ! 5).
    let scored: Vec<i64> = labels.iter().copied().filter(|&l| l != IGNORE).collect();
    assert_eq!(scored, vec![0, 0, 1, 0, 0, 0, 0, 0, 0, 2, 0, 0, 0, 0, 5]);
    // Each scored token is the last token of its word.
    let per_word = encode_words(&t, &[bare.split(' ').map(String::from).collect()]).unwrap().remove(0);
    let mut last = Vec::new();
    let mut at = 1;
    for w in &per_word {
        at += w.len();
        last.push(at - 1);
    }
    let labelled: Vec<usize> = (0..labels.len()).filter(|&i| labels[i] != IGNORE).collect();
    assert_eq!(labelled, last);

    // A block too short for the line keeps whole words only, and still ends with <sep>.
    let short = punctuation_examples(&t, &[words], 8, s).unwrap();
    let ids = Vec::<i64>::try_from(short.ids.get(0)).unwrap();
    let labels = Vec::<i64>::try_from(short.labels.get(0)).unwrap();
    let n = Vec::<bool>::try_from(short.padding.get(0)).unwrap().iter().filter(|&&r| r).count();
    assert_eq!(ids[n - 1], s.sep);
    assert!(labels.iter().skip(n).all(|&l| l == IGNORE));
}

#[test]
fn location_rows_ask_for_a_phrase_that_occurs_once_and_the_answer_span_spells_it() {
    let _serial = common::serial();
    let text = bible_start();
    for t in [TextTokenizer::train_bpe(&text, 1000).unwrap(), TextTokenizer::train_wordpiece(&text, 1000).unwrap()] {
        let s = Specials::of(&t).unwrap();
        let pieces = word_pieces(&text).into_iter().take(300).collect::<Vec<_>>();
        let x = locate_examples(&t, &pieces, 96, s, 7).unwrap();
        let rows = x.start.size()[0] as usize;
        assert!(rows > 200, "only {rows} of 300 passages have a usable phrase");
        for r in 0..rows {
            let ids = Vec::<i64>::try_from(x.ids.get(r as i64)).unwrap();
            let seg = Vec::<i64>::try_from(x.segments.get(r as i64)).unwrap();
            let ctx = Vec::<bool>::try_from(x.context.get(r as i64)).unwrap();
            let (start, end) = (x.start.int64_value(&[r as i64]) as usize, x.end.int64_value(&[r as i64]) as usize);
            let first_sep = ids.iter().position(|&i| i == s.sep).unwrap();
            assert_eq!(ids[0], s.cls);
            assert!(seg[..=first_sep].iter().all(|&g| g == 0), "question and its <sep> are segment A");
            assert_eq!(seg[first_sep + 1], 1, "the passage is segment B");
            assert!(!ctx[..=first_sep].iter().any(|&c| c), "answers lie in the passage");
            assert!(start > first_sep && start <= end && ctx[start] && ctx[end]);
            // The answer tokens decode to the question, up to case and punctuation.
            let norm = |text: &str| normalise(text).replace([' ', '\'', '’'], "");
            let answer = t.decode(&ids[start..=end]);
            assert_eq!(norm(&answer), norm(&x.questions[r]), "row {r}: {answer:?} vs {:?}", x.questions[r]);
        }
        // The questions are 2 to 5 passage words (a word joined by a dash normalises to two), every length
        // occurs, and the choice does not depend on anything but the key.
        let lengths: Vec<usize> = x.questions.iter().map(|q| q.split(' ').count()).collect();
        assert!(lengths.iter().all(|&n| n >= 2));
        assert!((2..=5).all(|n| lengths.contains(&n)));
        let again = locate_examples(&t, &pieces, 96, s, 7).unwrap();
        assert_eq!(again.questions, x.questions);
    }
    // A phrase is only asked about when it occurs once.
    let words: Vec<String> = "a b a b a b".split(' ').map(String::from).collect();
    let chosen: Vec<Option<(usize, usize)>> = (0..50).map(|key| choose_phrase(&words, key)).collect();
    for &(start, len) in chosen.iter().flatten() {
        let phrase = &words[start..start + len];
        assert_eq!(words.windows(len).filter(|w| w == &phrase).count(), 1);
        assert!(len >= 4, "every phrase of 2 or 3 words of a b a b a b repeats");
    }
    assert!(chosen.iter().any(Option::is_some) && chosen.iter().any(Option::is_none));
}

#[test]
fn span_scores_and_mark_f1_match_hand_counts() {
    let _serial = common::serial();
    // Exact; half overlap (predicted 2 tokens, gold 4, share 2: P 1, R 1/2, F1 2/3); disjoint.
    let (exact, f1) = span_scores(&[(3, 5), (10, 11), (20, 21)], &[(3, 5), (10, 13), (30, 31)]);
    assert!((exact - 1.0 / 3.0).abs() < 1e-12);
    assert!((f1 - (1.0 + 2.0 / 3.0) / 3.0).abs() < 1e-12);
    // Marks: gold , . none none ! ; predicted , , none . ! → tp 2 (the first , and !), 4 predicted, 3 gold.
    let labels = Tensor::from_slice(&[1i64, 2, 0, 0, 5, IGNORE]);
    let predicted = Tensor::from_slice(&[1i64, 1, 0, 2, 5, 3]);
    assert!((mark_f1(&predicted, &labels) - 2.0 * 2.0 / (4.0 + 3.0)).abs() < 1e-12);
}

#[test]
fn the_span_head_decodes_the_best_span_with_start_before_end_and_bounded_length() {
    let _serial = common::serial();
    let vs = nn::VarStore::new(Device::Cpu);
    let head = SpanPredictor::new(&vs.root(), 8, 3);
    let ninf = f64::NEG_INFINITY;
    // Row 0: the best start (4) comes after the best end (1): the best valid pair is start 4, end 5.
    // Row 1: the best pair (0, 6) is longer than 3 tokens: (5, 6) wins among the allowed ones.
    let start = Tensor::from_slice(&[ninf, 0.0, 1.0, 0.0, 5.0, 0.0, 0.0, 9.0, 0.0, 0.0, 0.0, 0.0, 2.0, 0.0])
        .view([2, 7])
        .to_kind(Kind::Float);
    let end = Tensor::from_slice(&[ninf, 6.0, 0.0, 0.0, 0.0, 3.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 8.0])
        .view([2, 7])
        .to_kind(Kind::Float);
    assert_eq!(head.best_spans(&start, &end), vec![(4, 5), (5, 6)]);
    // The loss is the mean of two cross-entropies.
    let (s, e) = (Tensor::from_slice(&[4i64, 5]), Tensor::from_slice(&[5i64, 6]));
    let loss = SpanPredictor::loss(&start, &end, &s, &e).double_value(&[]);
    let want = (start.cross_entropy_for_logits(&s).double_value(&[])
        + end.cross_entropy_for_logits(&e).double_value(&[]))
        / 2.0;
    assert!((loss - want).abs() < 1e-6);
}

#[test]
fn next_token_targets_shift_by_one_and_skip_special_tokens() {
    let _serial = common::serial();
    let windows = Tensor::from_slice(&[3i64, 10, 11, 12, 4]).view([1, 5]);
    let targets = Vec::<i64>::try_from(next_token_targets(&windows, 7).view([-1])).unwrap();
    assert_eq!(targets, vec![10, 11, 12, IGNORE, IGNORE]);
}

#[test]
fn a_causal_encoder_never_reads_later_tokens_and_a_bidirectional_one_does() {
    let _serial = common::serial();
    tch::manual_seed(0);
    let vs = nn::VarStore::new(Device::Cpu);
    let mut bert = Bert::new(&vs.root(), &BertSpec::new(TransformerSpec::small(128, 4, 4, 64), 50));
    let a = Tensor::from_slice(&[3i64, 10, 11, 12, 13, 14]).view([1, 6]);
    let b = Tensor::from_slice(&[3i64, 10, 11, 12, 40, 14]).view([1, 6]);
    let mut diff = |causal: bool| {
        bert.causal = causal;
        let ha = bert.forward(&a, BertInputs::default(), false);
        let hb = bert.forward(&b, BertInputs::default(), false);
        (ha - hb).abs().amax([2], false).view([-1])
    };
    let causal = Vec::<f64>::try_from(diff(true).to_kind(Kind::Double)).unwrap();
    assert!(causal[..4].iter().all(|&d| d == 0.0), "positions before the change are bit-identical: {causal:?}");
    assert!(causal[4] > 1e-3 && causal[5] > 1e-3);
    let both = Vec::<f64>::try_from(diff(false).to_kind(Kind::Double)).unwrap();
    assert!(both[..4].iter().all(|&d| d > 1e-3), "bidirectional attention reads the change: {both:?}");
}

/// A corpus where a word decides the mark after it: `wN` is followed by the mark N mod 6 stands for, so a
/// tagger that reads its own token gets everything right.
fn toy_punctuation_corpus(path: &std::path::Path) {
    let marks = ["", ",", ".", ";", "?", "!"];
    let mut state = 17u64;
    let mut lines = String::new();
    for _ in 0..2000 {
        let words: Vec<String> = (0..12)
            .map(|_| {
                state = state.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                let n = (state >> 33) % 30;
                format!("w{n}{}", marks[(n % 6) as usize])
            })
            .collect();
        lines.push_str(&words.join(" "));
        lines.push('\n');
    }
    std::fs::write(path, lines).unwrap();
}

#[test]
fn a_tiny_bert_learns_to_restore_punctuation_and_to_locate_phrases() {
    let _serial = common::serial();
    let dir = common::scratch("corpus-tasks");
    std::fs::create_dir_all(&dir).unwrap();
    let corpus = dir.join("toy.txt");
    toy_punctuation_corpus(&corpus);
    let recipe = format!(
        "kind: bert\ntransformer:\n  d_model: 64\n  layers: 2\n  heads: 4\n  block_size: 48\n  dropout: 0.0\n  pe: rope\ndata:\n  path: {}\n  \
         tokenizer: wordpiece\n  vocab_size: 100\ntrain:\n  steps: 600\n  batch_size: 32\n  lr: 2.0e-3\n  warmup_steps: 10\n  \
         eval_interval: 600\n  eval_batches: 2\nbert:\n  task: punctuation\nsweep:\n  bert.task: [punctuation, locate]\n",
        corpus.display()
    );
    let recipe = ablate::recipe::parse(&recipe, "t.yaml", "t", false).unwrap();
    let out = dir.join("out");
    let opts =
        ablate::run::sweep::SweepOptions { out: &out, device: Device::Cpu, force: false, quiet: true, shard: None };
    ablate::run::sweep::run_recipe(&recipe, &opts).unwrap();
    let runs = ablate::judge::reading::reported_runs(&out).unwrap();
    let get = |r: usize, k: &str| -> f64 { runs[r][k].parse().unwrap_or_else(|_| panic!("{k} = {:?}", runs[r][k])) };
    // Punctuation: 25 of the 30 words carry a mark, so always guessing "none" scores 1/6 and F1 0.
    assert!(get(0, "test_accuracy") > 0.95, "token accuracy {}", get(0, "test_accuracy"));
    assert!(get(0, "test_f1") > 0.95, "mark F1 {}", get(0, "test_f1"));
    assert_eq!(runs[0]["test_exact_match"], "", "token classification has no exact match");
    // Location: 12-word passages, 2–5-word questions: a random guess is exact about 1 time in 50; 600 steps
    // reach 0.85 (seed 0).
    assert!(get(1, "test_exact_match") > 0.6, "exact match {}", get(1, "test_exact_match"));
    assert!(get(1, "test_f1") > get(1, "test_exact_match"), "F1 credits partial overlaps");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn fine_tuning_starts_from_a_saved_pretraining_checkpoint_named_in_the_recipe() {
    let _serial = common::serial();
    let dir = common::scratch("init-from");
    let model = "kind: bert\ntransformer:\n  d_model: 32\n  layers: 2\n  heads: 2\n  block_size: 32\n  dropout: 0.0\n";
    let data = "data:\n  max_chars: 100000\n  tokenizer: wordpiece\n  vocab_size: 300\n";
    let pretrain = format!(
        "{model}{data}train:\n  steps: 5\n  batch_size: 4\n  eval_interval: 5\n  eval_batches: 1\n  checkpoint: true\n\
         bert:\n  task: pretrain\n"
    );
    let recipe = ablate::recipe::parse(&pretrain, "p.yaml", "p", false).unwrap();
    let out = dir.join("p");
    let opts =
        ablate::run::sweep::SweepOptions { out: &out, device: Device::Cpu, force: false, quiet: true, shard: None };
    ablate::run::sweep::run_recipe(&recipe, &opts).unwrap();
    let checkpoint = out.join("checkpoints").join("seed=0.safetensors");
    assert!(checkpoint.is_file());

    // A recipe names it relative to the results directory both recipes write into, and fine-tunes from it.
    let train = "train:\n  steps: 2\n  batch_size: 4\n  eval_interval: 2\n  eval_batches: 1\n";
    let from = |path: &str| format!("{model}{data}{train}bert:\n  task: punctuation\n  init_from: {path}\n");
    let chained =
        ablate::recipe::parse(&from("$RESULTS/p/checkpoints/seed=0.safetensors"), "f.yaml", "f", false).unwrap();
    let out = dir.join("f");
    let opts =
        ablate::run::sweep::SweepOptions { out: &out, device: Device::Cpu, force: false, quiet: true, shard: None };
    ablate::run::sweep::run_recipe(&chained, &opts).unwrap();
    assert_eq!(ablate::judge::reading::reported_runs(&out).unwrap()[0]["status"], "ok");
    // It tokenises with the checkpoint's vocabulary, not one trained afresh: fine-tuning on a longer text
    // (where training would give another vocabulary) saves exactly the pre-training tokenizer.
    let longer = from("$RESULTS/p/checkpoints/seed=0.safetensors")
        .replace("max_chars: 100000", "max_chars: 150000")
        .replace("eval_batches: 1\n", "eval_batches: 1\n  checkpoint: true\n");
    let longer = ablate::recipe::parse(&longer, "l.yaml", "l", false).unwrap();
    let out = dir.join("l");
    let opts =
        ablate::run::sweep::SweepOptions { out: &out, device: Device::Cpu, force: false, quiet: true, shard: None };
    ablate::run::sweep::run_recipe(&longer, &opts).unwrap();
    let tokenizer_of = |run_dir: &std::path::Path| {
        let json = std::fs::read_to_string(run_dir.join("checkpoints").join("seed=0.json")).unwrap();
        serde_json::from_str::<serde_json::Value>(&json).unwrap()["subword_tokenizer"].as_str().unwrap().to_string()
    };
    assert!(tokenizer_of(&out) == tokenizer_of(&dir.join("p")), "fine-tuning used the checkpoint's vocabulary");
    let retrained = ablate::data::load_text(&longer.runs[0].config.data)
        .and_then(|text| ablate::data::TextData::from_text_with(&text, &longer.runs[0].config.data))
        .unwrap();
    assert!(retrained.tokenizer.to_saved().unwrap().1 != tokenizer_of(&out), "the longer text trains another");
    // A run that names another vocabulary than the checkpoint's is refused before training, saying both.
    let other = from("$RESULTS/p/checkpoints/seed=0.safetensors").replace("vocab_size: 300", "vocab_size: 400");
    let other = ablate::recipe::parse(&other, "o.yaml", "o", false).unwrap();
    let out = dir.join("o");
    let opts =
        ablate::run::sweep::SweepOptions { out: &out, device: Device::Cpu, force: false, quiet: true, shard: None };
    let err = format!("{:#}", ablate::run::sweep::run_recipe(&other, &opts).unwrap_err());
    assert!(
        err.contains("pre-trained with data.tokenizer wordpiece, vocab_size 300, this run has data.tokenizer wordpiece, vocab_size 400"),
        "{err}"
    );
    assert!(!out.join("runs.csv").exists());
    // A checkpoint that is not there stops the sweep before training, naming the resolved path.
    let missing =
        ablate::recipe::parse(&from("$RESULTS/q/checkpoints/seed=0.safetensors"), "g.yaml", "g", false).unwrap();
    let out = dir.join("g");
    let opts =
        ablate::run::sweep::SweepOptions { out: &out, device: Device::Cpu, force: false, quiet: true, shard: None };
    let err = format!("{:#}", ablate::run::sweep::run_recipe(&missing, &opts).unwrap_err());
    assert!(
        err.contains("bert.init_from: no such checkpoint") && err.contains("q/checkpoints/seed=0.safetensors"),
        "{err}"
    );
    assert!(!out.join("runs.csv").exists());

    let finetune = format!("{model}{data}bert:\n  task: punctuation\n  init_from: {}\n", checkpoint.display());
    let recipe = ablate::recipe::parse(&finetune, "f.yaml", "f", false).unwrap();
    let cfg = &recipe.runs[0].config;
    let vocab = ablate::data::TextData::load(&cfg.data).unwrap().tokenizer.vocab_size();
    tch::manual_seed(1);
    let vs = nn::VarStore::new(Device::Cpu);
    let _model = ablate::tasks::bert::build_model(&vs.root(), cfg, vocab);
    let before: Vec<(String, Tensor)> = vs.variables().into_iter().map(|(k, v)| (k, v.copy())).collect();
    ablate::tasks::bert::init_from(&vs, &checkpoint).unwrap();
    let saved: std::collections::HashMap<String, Tensor> =
        Tensor::read_safetensors(&checkpoint).unwrap().into_iter().collect();
    let now = vs.variables();
    for (name, old) in &before {
        if name.starts_with("bert.") || name.starts_with("mlm.") {
            assert!(now[name].equal(&saved[name]), "{name} was copied from the checkpoint");
        } else {
            assert!(now[name].equal(old), "{name} (the new task head) keeps its fresh weights");
        }
    }
    assert!(before.iter().any(|(n, _)| n.starts_with("task.")), "the punctuation head exists");

    // A model of another shape is refused with the variable and both shapes named.
    let wider = ablate::recipe::parse(&finetune.replace("d_model: 32", "d_model: 48"), "w.yaml", "w", false).unwrap();
    let vs = nn::VarStore::new(Device::Cpu);
    let _model = ablate::tasks::bert::build_model(&vs.root(), &wider.runs[0].config, vocab);
    let err = ablate::tasks::bert::init_from(&vs, &checkpoint).unwrap_err().to_string();
    assert!(err.contains("bert.init_from: bert.") && err.contains("this run's model needs ["), "{err}");
    let _ = std::fs::remove_dir_all(&dir);
}
