//! BERT's next-sentence prediction (`bert.objective: masked_nsp`): how the segment pairs are built, that
//! the head learns a task only the pairing can teach, and a whole run through the recipe loop.
use ablate::data::corpus_tasks::Specials;
use ablate::models::bert::BertSpec;
use ablate::tasks::bert::{mask_tokens, segment_lengths, sentence_pairs, MaskedLm};
use ablate::transformer::spec::TransformerSpec;
use tch::nn::{self, OptimizerConfig};
use tch::{Device, Kind, Tensor};

mod common;

const SPECIALS: Specials = Specials { cls: 3, sep: 4, pad: 0, mask: 5, first_ordinary: 7 };

fn row(t: &Tensor, i: i64) -> Vec<i64> {
    Vec::<i64>::try_from(t.get(i)).unwrap()
}

#[test]
fn pairs_are_cls_a_sep_b_sep_with_b_following_a_or_taken_from_elsewhere() {
    let _serial = common::serial();
    let block = 20;
    let (first, second) = segment_lengths(block);
    assert_eq!((first, second), (8, 9));
    // A corpus whose token at position p is 7 + p, so every span says where it came from.
    let corpus = Tensor::arange(1000, (Kind::Int64, Device::Cpu)) + 7;
    let starts = Tensor::from_slice(&[10i64, 500]);
    let random = Tensor::from_slice(&[300i64, 42]);
    let follows = Tensor::from_slice(&[true, false]);
    let (tokens, segments) = sentence_pairs(&corpus, &starts, &random, &follows, block, SPECIALS);
    assert_eq!(tokens.size(), [2, block]);
    let span = |from: i64, len: i64| (from..from + len).map(|p| p + 7).collect::<Vec<_>>();
    let expected = |a: i64, b: i64| {
        let mut r = vec![SPECIALS.cls];
        r.extend(span(a, first));
        r.push(SPECIALS.sep);
        r.extend(span(b, second));
        r.push(SPECIALS.sep);
        r
    };
    // The first pair's B starts where its A ends; the second's comes from its random start.
    assert_eq!(row(&tokens, 0), expected(10, 10 + first));
    assert_eq!(row(&tokens, 1), expected(500, 42));
    let mut segment = vec![0i64; (first + 2) as usize];
    segment.extend(vec![1i64; (second + 1) as usize]);
    assert_eq!(row(&segments, 0), segment);
    assert_eq!(row(&segments, 1), segment);
}

/// A corpus of 64-token documents that alternate between two topics, each with its own five tokens: a
/// continuation almost always keeps A's topic, a random second segment keeps it half the time. Nothing
/// about a segment alone says whether it follows, so only comparing the two segments can beat chance:
/// predicting "follows" exactly when the topics agree is right 3 times in 4.
fn topic_corpus(len: i64) -> Tensor {
    let position = Tensor::arange(len, (Kind::Int64, Device::Cpu));
    let topic = position.divide_scalar_mode(64, "floor").remainder(2);
    let word = Tensor::randint(5, [len], (Kind::Int64, Device::Cpu));
    topic * 5 + word + SPECIALS.first_ordinary
}

fn pair_batch(corpus: &Tensor, batch: i64, block: i64) -> (Tensor, Tensor, Tensor, Tensor) {
    let n = corpus.size()[0];
    let (_, second) = segment_lengths(block);
    let starts = Tensor::randint(n - block, [batch], (Kind::Int64, Device::Cpu));
    let random = Tensor::randint(n - second, [batch], (Kind::Int64, Device::Cpu));
    let follows = Tensor::rand([batch], (Kind::Float, Device::Cpu)).lt(0.5);
    let (tokens, segments) = sentence_pairs(corpus, &starts, &random, &follows, block, SPECIALS);
    let eligible = tokens.ge(SPECIALS.first_ordinary);
    let (inputs, targets) = mask_tokens(&tokens, &eligible, 0.15, true, SPECIALS, 17);
    (inputs, segments, targets, follows.to_kind(Kind::Int64))
}

fn nsp_accuracy(model: &MaskedLm, corpus: &Tensor, block: i64) -> f64 {
    let _guard = tch::no_grad_guard();
    let (x, s, y, f) = pair_batch(corpus, 2000, block);
    let loss = model.pair_loss(&x, &s, &y, &f, false);
    loss.nsp_logits.argmax(-1, false).eq_tensor(&f).to_kind(Kind::Float).mean(Kind::Float).double_value(&[])
}

#[test]
fn the_next_sentence_head_learns_to_compare_the_two_segments() {
    let _serial = common::serial();
    tch::manual_seed(0);
    let block = 16;
    let corpus = topic_corpus(20_000);
    let vs = nn::VarStore::new(Device::Cpu);
    let mut spec = TransformerSpec::small(32, 2, 2, block);
    spec.dropout = 0.0;
    let mut model = MaskedLm::new(&(vs.root() / "m"), &BertSpec::new(spec, 17));
    model.nsp = Some(nn::linear(vs.root() / "nsp", 32, 2, Default::default()));
    let before = nsp_accuracy(&model, &corpus, block);
    let mut opt = nn::Adam::default().build(&vs, 3e-3).unwrap();
    for _ in 0..400 {
        let (x, s, y, f) = pair_batch(&corpus, 64, block);
        let loss = model.pair_loss(&x, &s, &y, &f, true);
        opt.backward_step(&(loss.mlm + loss.nsp));
    }
    let after = nsp_accuracy(&model, &corpus, block);
    // Untrained, the head guesses (≈ 0.5); the comparison's ceiling is ≈ 0.75 (0.716–0.734 over seeds 0–3
    // at 400 steps).
    assert!((before - 0.5).abs() < 0.1, "untrained accuracy {before}");
    assert!(after > 0.67, "next-sentence accuracy after training {after} (before {before})");
}

#[test]
fn a_masked_nsp_run_records_both_losses_and_fine_tunes_after_it() {
    let _serial = common::serial();
    let base = "kind: bert\ntransformer:\n  d_model: 32\n  layers: 1\n  heads: 2\n  block_size: 32\n  dropout: 0.0\n\
                data:\n  max_chars: 200000\n  tokenizer: wordpiece\n  vocab_size: 600\n\
                train:\n  steps: 30\n  batch_size: 8\n  warmup_steps: 2\n  eval_interval: 30\n  eval_batches: 2\n";
    let pretrain = common::config(&format!("{base}bert:\n  objective: masked_nsp\n"));
    let (run, _) = common::train(&pretrain);
    let o = &run.outcome;
    // The masked-LM loss is below the uniform guess (ln 600 = 6.40); the next-sentence loss starts at
    // ln 2 = 0.69 and cannot be far from it after 30 steps.
    assert!(o.get("test_loss") < 6.4 && o.get("test_loss") == o.get("test_mlm_loss"), "{:?}", o.metrics);
    assert!((o.get("test_nsp_loss") - 2f64.ln()).abs() < 0.3, "{:?}", o.metrics);
    assert!((0.0..=1.0).contains(&o.get("test_nsp_accuracy")), "{:?}", o.metrics);
    let nsp_params = 32 * 2 + 2;
    let masked = common::train(&common::config(&format!("{base}bert:\n  objective: masked\n"))).0;
    assert_eq!(
        o.get("params") - masked.outcome.get("params"),
        nsp_params as f64,
        "only the next-sentence head is added"
    );

    // Fine-tuning after next-sentence pre-training records the pre-training's accuracy too.
    let finetune =
        common::config(&format!("{base}bert:\n  task: punctuation\n  objective: masked_nsp\n  pretrain_steps: 20\n"));
    let (run, _) = common::train(&finetune);
    assert!((0.0..=1.0).contains(&run.outcome.get("test_nsp_accuracy")), "{:?}", run.outcome.metrics);
    assert!(run.outcome.get("test_accuracy") > 0.0, "{:?}", run.outcome.metrics);
}
