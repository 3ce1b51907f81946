//! BERT's training tasks: masking statistics of the 80/10/10 rule, the classification metrics, the
//! SpamAssassin data, and a tiny end-to-end pre-train + fine-tune.
use ablate::data::corpus_tasks::{encode_labelled, Specials};
use ablate::data::tokenize::TextTokenizer;
use ablate::data::IGNORE;
use ablate::tasks::bert::{build_model, f1_score, mask_tokens, TaskHead};
use tch::{Device, Kind, Tensor};

mod common;

const SPECIALS: Specials = Specials { cls: 3, sep: 4, pad: 0, mask: 5, first_ordinary: 7 };

#[test]
fn masking_chooses_the_fraction_of_ordinary_tokens_and_follows_the_80_10_10_rule() {
    let _serial = common::serial();
    tch::manual_seed(0);
    let vocab = 1000;
    let ids = Tensor::randint_low(7, vocab, [400, 128], (Kind::Int64, Device::Cpu));
    // The first column is <cls>: never eligible.
    let _ = ids.narrow(1, 0, 1).fill_(SPECIALS.cls);
    let eligible = ids.ge(SPECIALS.first_ordinary);
    let (inputs, targets) = mask_tokens(&ids, &eligible, 0.15, true, SPECIALS, vocab);
    let chosen = targets.ne(IGNORE);
    let count = |t: &Tensor| t.to_kind(Kind::Float).sum(Kind::Float).double_value(&[]);
    let n_eligible = count(&eligible);
    let n_chosen = count(&chosen);
    // 50,800 eligible tokens: the chosen fraction is 0.15 within a few standard errors (0.0016).
    assert!((n_chosen / n_eligible - 0.15).abs() < 0.008, "{}", n_chosen / n_eligible);
    assert_eq!(count(&chosen.narrow(1, 0, 1)), 0.0, "<cls> is never chosen");
    // Targets are the original ids where chosen.
    assert!(targets.masked_select(&chosen).equal(&ids.masked_select(&chosen)));
    // Unchosen inputs are untouched.
    assert!(inputs.masked_select(&chosen.logical_not()).equal(&ids.masked_select(&chosen.logical_not())));
    let masked = count(&inputs.eq(SPECIALS.mask).logical_and(&chosen)) / n_chosen;
    let kept = count(&inputs.eq_tensor(&ids).logical_and(&chosen)) / n_chosen;
    // Random replacements land on the original id 1 time in 993: "kept" is 10% plus that sliver.
    assert!((masked - 0.8).abs() < 0.02, "masked {masked}");
    assert!((kept - 0.1).abs() < 0.015, "kept {kept}");
    let random = 1.0 - masked - kept;
    assert!((random - 0.1).abs() < 0.015, "random {random}");
    // Random replacements are ordinary tokens.
    let replaced = inputs.masked_select(&chosen.logical_and(&inputs.ne(SPECIALS.mask)));
    assert!(replaced.min().int64_value(&[]) >= SPECIALS.first_ordinary);

    let (all_mask, _) = mask_tokens(&ids, &eligible, 0.15, false, SPECIALS, vocab);
    let chosen_inputs = all_mask.masked_select(&all_mask.ne_tensor(&ids));
    assert!(
        chosen_inputs.eq(SPECIALS.mask).all().int64_value(&[]) == 1,
        "without the rule every chosen token is <mask>"
    );
}

#[test]
fn f1_matches_its_definition_on_a_hand_counted_case() {
    let _serial = common::serial();
    let predicted = Tensor::from_slice(&[1i64, 1, 0, 0, 1, 0]);
    let labels = Tensor::from_slice(&[1i64, 0, 1, 0, 1, 0]);
    // tp 2, fp 1, fn 1: precision 2/3, recall 2/3, F1 2/3.
    assert!((f1_score(&predicted, &labels) - 2.0 / 3.0).abs() < 1e-12);
    assert_eq!(
        f1_score(&Tensor::zeros([3], (Kind::Int64, Device::Cpu)), &Tensor::ones([3], (Kind::Int64, Device::Cpu))),
        0.0
    );
}

#[test]
fn labelled_inputs_are_cls_text_sep_then_padding_cut_to_the_block() {
    let _serial = common::serial();
    let text = "the cat sat on the mat\nthe dog sat on the log\n".repeat(30);
    let t = TextTokenizer::train_wordpiece(&text, 60).unwrap();
    let s = Specials::of(&t).unwrap();
    let l = encode_labelled(&t, &["the cat sat", &"the dog sat ".repeat(20)], &[0, 1], 8).unwrap();
    assert_eq!(l.ids.size(), vec![2, 8]);
    let row0 = Vec::<i64>::try_from(l.ids.get(0)).unwrap();
    assert_eq!(row0[0], s.cls);
    assert_eq!(row0[4], s.sep);
    assert_eq!(&row0[5..], &[s.pad, s.pad, s.pad]);
    assert_eq!(
        Vec::<bool>::try_from(l.padding.get(0)).unwrap(),
        vec![true, true, true, true, true, false, false, false]
    );
    let row1 = Vec::<i64>::try_from(l.ids.get(1)).unwrap();
    assert_eq!((row1[0], row1[7]), (s.cls, s.sep), "a long text is cut and still ends with <sep>");
    assert_eq!(Vec::<i64>::try_from(&l.labels).unwrap(), vec![0, 1]);
}

#[test]
fn spam_assassin_is_fetched_split_and_stripped_of_headers() {
    let _serial = common::serial();
    let emails = ablate::data::spam::spam_assassin().unwrap();
    assert_eq!(emails.len(), 6_046);
    let spam = emails.iter().filter(|e| e.spam).count();
    assert_eq!(spam, 500 + 1396);
    // Every fifth of each group: 500 + 280 + 50 + 100 + 279.
    assert_eq!(emails.iter().filter(|e| e.test).count(), 1209);
    assert!(emails.iter().all(|e| e.text.chars().count() <= 2000));
    // Every raw email has a Return-Path header; only the 6 that quote a forwarded message keep one.
    assert_eq!(emails.iter().filter(|e| e.text.contains("Return-Path:")).count(), 6);
}

#[test]
fn a_tiny_bert_pretrains_and_then_tells_spam_from_ham() {
    let _serial = common::serial();
    let dir = common::scratch("bert-spam");
    let recipe =
        "kind: bert\ntransformer:\n  d_model: 32\n  layers: 2\n  heads: 2\n  block_size: 64\n  dropout: 0.0\ndata:\n  max_chars: 200000\n  \
         tokenizer: wordpiece\n  vocab_size: 800\ntrain:\n  steps: 200\n  batch_size: 16\n  lr: 1.0e-3\n  warmup_steps: 5\n  \
         eval_interval: 100\n  eval_batches: 2\nbert:\n  task: spam\n  pretrain_steps: 40\n";
    let recipe = ablate::recipe::parse(recipe, "b.yaml", "b", false).unwrap();
    let opts =
        ablate::run::sweep::SweepOptions { out: &dir, device: Device::Cpu, force: false, quiet: true, shard: None };
    ablate::run::sweep::run_recipe(&recipe, &opts).unwrap();
    let runs = ablate::judge::reading::reported_runs(&dir).unwrap();
    let r = &runs[0];
    let get = |k: &str| -> f64 { r[k].parse().unwrap_or_else(|_| panic!("{k} = {:?}", r[k])) };
    // 69% of the test emails are ham: a trivial classifier gets 0.69 and F1 0. 200 steps reach 0.91–0.92
    // and F1 0.87 (seeds 1–4).
    assert!(get("test_accuracy") > 0.85, "accuracy {}", get("test_accuracy"));
    assert!(get("test_f1") > 0.75, "F1 {}", get("test_f1"));
    // Pre-training ran: its held-out masked-LM loss is below the uniform guess, ln 800 = 6.68.
    assert!(get("test_mlm_loss") < 6.5, "masked-LM loss {}", get("test_mlm_loss"));
    let curves = std::fs::read_to_string(dir.join("curves.csv")).unwrap();
    assert!(curves.contains("pretrain_val,mlm_loss") && curves.contains("val,f1"));
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_few_labelled_examples_are_memorised_and_more_than_the_split_holds_is_refused_before_training() {
    let _serial = common::serial();
    // bert.labelled_examples: 4 fine-tunes on four emails, which a tiny BERT memorises (its training loss
    // falls near zero) where the whole split (4,361 training emails after validation) keeps it far above.
    let dir = common::scratch("bert-few-labels");
    let text = |labelled: &str| {
        format!(
            "kind: bert\ntransformer:\n  d_model: 32\n  layers: 2\n  heads: 2\n  block_size: 64\n  dropout: 0.0\ndata:\n  max_chars: 200000\n  \
             tokenizer: wordpiece\n  vocab_size: 800\ntrain:\n  steps: 80\n  batch_size: 16\n  lr: 2.0e-3\n  warmup_steps: 5\n  \
             eval_interval: 80\n  eval_batches: 2\n  log_interval: 10\nbert:\n  task: spam\n{labelled}"
        )
    };
    let train_loss = |labelled: &str, name: &str| -> Result<f64, String> {
        let recipe = ablate::recipe::parse(&text(labelled), "b.yaml", "b", false).map_err(|e| e.to_string())?;
        let out = dir.join(name);
        let opts =
            ablate::run::sweep::SweepOptions { out: &out, device: Device::Cpu, force: false, quiet: true, shard: None };
        ablate::run::sweep::run_recipe(&recipe, &opts).map_err(|e| format!("{e:#}"))?;
        let runs = ablate::judge::reading::reported_runs(&out).unwrap();
        Ok(runs[0]["train_loss"].parse().unwrap())
    };
    let few = train_loss("  labelled_examples: 4\n", "few").unwrap();
    let all = train_loss("", "all").unwrap();
    assert!(few < 0.1 && few < all / 3.0, "four examples: training loss {few}; all of them: {all}");
    let err = train_loss("  labelled_examples: 100000\n", "too-many").unwrap_err();
    assert!(
        err.contains("bert.labelled_examples 100000") && err.contains("holds") && err.lines().count() == 1,
        "{err}"
    );
    assert!(!dir.join("too-many/runs.csv").exists(), "nothing trained");
    let err = train_loss("  labelled_examples: 0\n", "zero").unwrap_err();
    assert!(err.contains("bert.labelled_examples") && err.contains("at least 1"), "{err}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn the_spam_emails_corpus_is_the_training_emails_text_without_labels_or_test_emails() {
    let _serial = common::serial();
    let emails = ablate::data::spam::spam_assassin().unwrap();
    let text = ablate::data::text::spam_training_text(&emails);
    let cfg: ablate::recipe::DataConfig = serde_yaml::from_str("corpus: spam_emails").unwrap();
    assert_eq!(ablate::data::text::load_text(&cfg).unwrap(), text, "data.corpus: spam_emails reads it");
    let (train, test): (Vec<_>, Vec<_>) = emails.iter().partition(|e| !e.test);
    assert!(train.iter().all(|e| text.contains(e.text.trim_end())));
    // A test email whose text is not also a training email's (a few are duplicates across the split).
    let unseen = test.iter().filter(|e| !train.iter().any(|t| t.text == e.text)).count();
    let leaked = test.iter().filter(|e| !train.iter().any(|t| t.text == e.text) && text.contains(e.text.trim_end()));
    assert!(unseen > 1000 && leaked.count() == 0, "{unseen} test emails unseen");
    assert!(text.matches("\n\n").count() >= train.len());
}

/// A tiny BERT of `objective` with `task`'s head, in evaluation mode: (encoder and pre-training head, task head).
fn tiny_model(vs: &tch::nn::VarStore, task: &str, objective: &str) -> (ablate::tasks::bert::MaskedLm, TaskHead) {
    let cfg = common::config(&format!(
        "kind: bert\ntransformer:\n  d_model: 16\n  layers: 2\n  heads: 2\n  block_size: 12\n  dropout: 0.0\n\
         data:\n  tokenizer: wordpiece\n  vocab_size: 300\nbert:\n  task: {task}\n  objective: {objective}\n  pretrain_steps: 1\n"
    ));
    build_model(&vs.root(), &cfg, 40)
}

#[test]
fn left_to_right_fine_tuning_tags_each_token_from_its_left_context_only() {
    let _serial = common::serial();
    tch::manual_seed(3);
    let ids = Tensor::from_slice(&[3i64, 10, 11, 12, 13, 14, 15, 4, 0, 0, 0, 0]).view([1, 12]);
    let padding =
        Tensor::from_slice(&[true, true, true, true, true, true, true, true, false, false, false, false]).view([1, 12]);
    // The same row with token 4 changed.
    let changed = ids.copy();
    let _ = changed.get(0).get(4).fill_(20);
    for (objective, left_only) in [("next_token", true), ("masked", false)] {
        let vs = tch::nn::VarStore::new(Device::Cpu);
        let (mlm, head) = tiny_model(&vs, "punctuation", objective);
        let TaskHead::Tokens(tagger) = head else { panic!("punctuation has a token head") };
        let before = tagger.logits(&mlm.bert, &ids, &padding, false);
        let after = tagger.logits(&mlm.bert, &changed, &padding, false);
        let moved = |from: i64, len: i64| {
            (before.narrow(1, from, len) - after.narrow(1, from, len)).abs().max().double_value(&[])
        };
        // Tokens 0–3 come before the change: a left-to-right tagger's logits there cannot move.
        assert_eq!(moved(0, 4) == 0.0, left_only, "{objective}: tokens before the change moved by {}", moved(0, 4));
        assert!(moved(4, 4) > 1e-6, "{objective}: the changed token and those after it must move");
    }
}

#[test]
fn left_to_right_classification_reads_the_last_real_token() {
    let _serial = common::serial();
    tch::manual_seed(4);
    // Two rows of different lengths: 6 and 9 real tokens.
    let ids = Tensor::from_slice(&[
        3i64, 10, 11, 12, 13, 4, 0, 0, 0, 0, 0, 0, //
        3, 10, 11, 12, 13, 14, 15, 16, 4, 0, 0, 0,
    ])
    .view([2, 12]);
    let lengths = [6i64, 9];
    let padding = Tensor::arange(12, (Kind::Int64, Device::Cpu))
        .unsqueeze(0)
        .lt_tensor(&Tensor::from_slice(&lengths).unsqueeze(1));
    let with = |row: i64, col: i64, id: i64| {
        let t = ids.copy();
        let _ = t.get(row).get(col).fill_(id);
        t
    };
    for (objective, causal) in [("next_token", true), ("masked", false)] {
        let vs = tch::nn::VarStore::new(Device::Cpu);
        let (mlm, head) = tiny_model(&vs, "spam", objective);
        let TaskHead::Sequence(classifier) = head else { panic!("spam has a sequence head") };
        let logits = |x: &Tensor| Vec::<f32>::try_from(classifier.logits(&mlm.bert, x, &padding, false)).unwrap();
        let base = logits(&ids);
        for (row, &len) in lengths.iter().enumerate() {
            let row = row as i64;
            // The last real token (`<sep>`) is what a causal classifier pools: changing it moves that row's
            // logit. A causal `<cls>` would have seen only itself, so the move proves the pooled position.
            let last = logits(&with(row, len - 1, 20));
            assert!((last[row as usize] - base[row as usize]).abs() > 1e-6, "{objective}: row {row}'s last token");
            // A padding position changes nothing, under either objective.
            let pad = logits(&with(row, len, 21));
            assert_eq!(pad, base, "{objective}: row {row}'s padding moved a logit");
        }
        // The other row is never touched.
        assert_eq!(logits(&with(0, 2, 22))[1], base[1]);
        assert_eq!(mlm.bert.causal, causal);
    }
}

/// A sweep over `bert.task` gives `test_f1` two meanings. The summary's per-variant header names both, and
/// every comparison row (paired table, verdicts) names its own variant's: punctuation rows never read "F1 of
/// the spam class". Read from the committed `results/bert_bidirectional` with its recipe.
#[test]
fn a_sweep_over_tasks_names_each_comparison_by_its_own_task_metric() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let text = std::fs::read_to_string(root.join("recipes/bert_bidirectional.yaml")).unwrap();
    let recipe = ablate::recipe::parse(&text, "bert_bidirectional.yaml", "bert_bidirectional", false).unwrap();
    let dir = root.join("results/bert_bidirectional");
    let table =
        ablate::judge::summary::summary_table(&ablate::judge::reading::Results::open(&dir, &recipe, None).unwrap())
            .unwrap();
    let (spam, punctuation) = ("test F1 of the spam class", "test F1 over the punctuation marks");
    let header = table.lines().find(|l| l.starts_with("| variant | n |")).expect("per-variant header");
    assert!(header.contains(&format!("{spam} / {punctuation}")), "{header}");
    let paired: Vec<&str> = table.lines().filter(|l| l.starts_with("| left-to-right task=")).collect();
    assert!(!paired.is_empty(), "{table}");
    for row in paired {
        let task_is_spam = row.starts_with("| left-to-right task=spam ");
        let (own, other) = if task_is_spam { (spam, punctuation) } else { (punctuation, spam) };
        assert!(!row.contains(other), "{row}");
        if row.contains("F1") {
            assert!(row.contains(own), "{row}");
        }
    }
    let judged =
        ablate::judge::summary::judgements(&ablate::judge::reading::Results::open(&dir, &recipe, None).unwrap())
            .unwrap()
            .expect("the recipe compares");
    let f1: Vec<_> = judged.rows.iter().filter(|r| r.metric.column_name() == Some("test_f1")).collect();
    assert_eq!(f1.len(), 2);
    for r in f1 {
        let expected = if r.arms.0.starts_with("left-to-right task=spam") { spam } else { punctuation };
        assert_eq!(r.metric.label, expected, "{}", r.comparison);
    }
}
