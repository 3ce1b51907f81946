//! The encoder–decoder: the Annotated Transformer's copy task (greedy and beam decoding must return the
//! source exactly), the length penalty, cross-attention's reach, and corpus BLEU against sacreBLEU.
mod common;
use ablate::models::seq2seq::{bleu, length_penalty, tokenize_13a, translate, PairBatch, Seq2Seq, Seq2SeqSpec};
use ablate::recipe::TrainConfig;
use ablate::train::distributed::BatchShard;
use ablate::train::{optimise, Evaluation, Objective};
use tch::{nn, Device, Kind, Tensor};

const PAD: i64 = 0;
const BOS: i64 = 1;
const EOS: i64 = 2;
/// Symbols 3..=11: the Annotated Transformer's copy task has 11 ids; we add <bos>/<eos> around its symbols.
const VOCAB: i64 = 12;
const LENGTH: i64 = 10;

struct Copy<'a> {
    model: &'a Seq2Seq,
    batch: i64,
}

fn copy_batch(symbols: &Tensor) -> PairBatch {
    let b = symbols.size()[0];
    let bos = Tensor::full([b, 1], BOS, (Kind::Int64, Device::Cpu));
    let eos = Tensor::full([b, 1], EOS, (Kind::Int64, Device::Cpu));
    PairBatch {
        src: symbols.shallow_clone(),
        src_real: symbols.ones_like().to_kind(Kind::Bool),
        tgt_in: Tensor::cat(&[&bos, symbols], 1),
        tgt_out: Tensor::cat(&[symbols, &eos], 1),
    }
}

impl Objective for Copy<'_> {
    fn training_loss(&self, shard: &BatchShard) -> Tensor {
        let symbols = Tensor::randint_low(3, VOCAB, [shard.global(self.batch), LENGTH], (Kind::Int64, Device::Cpu));
        let [symbols] = shard.take([symbols]);
        self.model.loss(&copy_batch(&symbols), 0.1, PAD, true).0
    }

    fn evaluate(&self, _step: i64) -> anyhow::Result<Evaluation> {
        Ok(Evaluation::default())
    }

    fn test(&self) -> anyhow::Result<Evaluation> {
        Ok(Evaluation::default())
    }
}

#[test]
fn a_trained_model_copies_its_source_exactly_with_greedy_and_beam_decoding() {
    let _serial = common::serial();
    tch::manual_seed(0);
    let mut vs = nn::VarStore::new(Device::Cpu);
    let model = Seq2Seq::new(&vs.root(), &Seq2SeqSpec::small(VOCAB));
    let t = TrainConfig {
        steps: 400,
        batch_size: 32,
        lr: 3e-3,
        min_lr: 1e-4,
        warmup_steps: 40,
        eval_interval: 1000,
        log_interval: 1000,
        ..Default::default()
    };
    let run = optimise(&t, &Copy { model: &model, batch: 32 }, &mut vs, Device::Cpu, &mut |_, _| {}, None).unwrap();
    assert!(run.last_loss < 0.6, "label-smoothed loss {}", run.last_loss);
    tch::manual_seed(99);
    let tests = Tensor::randint_low(3, VOCAB, [20, LENGTH], (Kind::Int64, Device::Cpu));
    for i in 0..20 {
        let src = Vec::<i64>::try_from(tests.get(i)).unwrap();
        assert_eq!(translate(&model, &src, BOS, EOS, 20, 1, 0.0, true), src, "greedy, source {i}");
        assert_eq!(translate(&model, &src, BOS, EOS, 20, 4, 0.6, true), src, "beam 4, source {i}");
    }
}

#[test]
fn decoder_outputs_depend_on_the_source_only_through_cross_attention_and_never_on_padding() {
    let _serial = common::serial();
    tch::manual_seed(1);
    let vs = nn::VarStore::new(Device::Cpu);
    let model = Seq2Seq::new(&vs.root(), &Seq2SeqSpec::small(VOCAB));
    let tgt = Tensor::from_slice(&[BOS, 5, 6, 7]).unsqueeze(0);
    let logits_for = |src: &[i64], real: &[bool]| {
        let s = Tensor::from_slice(src).unsqueeze(0);
        let r = Tensor::from_slice(real).unsqueeze(0);
        tch::no_grad(|| model.decode(&tgt, &model.encode(&s, &r, false), &r, false))
    };
    let a = logits_for(&[3, 4, 5, PAD, PAD], &[true, true, true, false, false]);
    // Whatever sits in padded positions, nothing changes.
    let b = logits_for(&[3, 4, 5, 9, 11], &[true, true, true, false, false]);
    assert!((&a - &b).abs().max().double_value(&[]) < 1e-5);
    // A different real source token changes the decoder's outputs (it reads the encoder).
    let c = logits_for(&[3, 4, 6, PAD, PAD], &[true, true, true, false, false]);
    assert!((&a - &c).abs().max().double_value(&[]) > 1e-4);
    // Decoder-only layers (no cross-attention) cannot see the source at all.
    let vs2 = nn::VarStore::new(Device::Cpu);
    let blind = Seq2Seq::new(&vs2.root(), &Seq2SeqSpec { cross_attention_layers: 0, ..Seq2SeqSpec::small(VOCAB) });
    let run = |src: &[i64]| {
        let s = Tensor::from_slice(src).unsqueeze(0);
        let r = s.ones_like().to_kind(Kind::Bool);
        tch::no_grad(|| blind.decode(&tgt, &blind.encode(&s, &r, false), &r, false))
    };
    assert!((run(&[3, 4, 5]) - run(&[9, 10, 11])).abs().max().double_value(&[]) == 0.0);
}

#[test]
fn the_length_penalty_is_gnmts() {
    let _serial = common::serial();
    assert_eq!(length_penalty(1, 0.0), 1.0);
    assert!((length_penalty(1, 1.0) - 1.0).abs() < 1e-12);
    assert!((length_penalty(7, 0.6) - 2.0f64.powf(0.6)).abs() < 1e-12);
}

#[test]
fn bleu_matches_sacrebleu_and_its_13a_tokens() {
    let _serial = common::serial();
    // Reference values from sacreBLEU 2.6.0 (`sacrebleu.corpus_bleu(hyps, [refs]).score`, default 13a
    // tokens and exp smoothing), computed once on these sentences.
    let s = |v: &[&str]| v.iter().map(|x| x.to_string()).collect::<Vec<_>>();
    let cases = [
        (
            s(&["The dog bit the man.", "It wasn't surprising.", "The man had just bitten him."]),
            s(&["The dog bit the man.", "It was not unexpected.", "The man bit him first."]),
            45.06750632106114,
        ),
        (
            s(&[
                "In the beginning, God created the heavens and the earth.",
                "The price is 3.50 dollars -- or 4,000 yen!",
                "a b c",
            ]),
            s(&[
                "In the beginning God created the heaven and the earth.",
                "The price is 3.50 dollars, or 4,000 yen.",
                "a b c d e",
            ]),
            45.62866179886638,
        ),
        (s(&["the cat sat on a mat today"]), s(&["the cat is on the mat"]), 15.619699684601283),
        (s(&["one two three four"]), s(&["four three two one"]), 22.59005009024613),
    ];
    for (hyps, refs, expected) in &cases {
        let got = bleu(hyps, refs);
        assert!((got - expected).abs() < 1e-9, "{got} vs sacreBLEU {expected} on {hyps:?}");
    }
    assert!((bleu(&s(&["a b c d e"]), &s(&["a b c d e"])) - 100.0).abs() < 1e-9);
    assert_eq!(
        tokenize_13a("The price is 3.50 dollars -- or 4,000 yen! (e.g. 1-2) it's").join(" "),
        "The price is 3.50 dollars -- or 4,000 yen ! ( e . g . 1 - 2 ) it's"
    );
}

#[test]
fn english_spanish_bible_pairs_align_by_verse() {
    let _serial = common::serial();
    let pairs = ablate::data::pairs::bible_en_es().unwrap();
    // The anchors' count with pysword: 31,077 aligned verses.
    assert!((30_000..=31_200).contains(&pairs.len()), "{} pairs", pairs.len());
    let (en, es) = &pairs[0];
    assert!(en.starts_with("In the beginning, God created"), "{en}");
    assert!(es.to_lowercase().contains("principio") && es.contains("Dios"), "{es}");
    assert!(pairs.iter().all(|(e, s)| !e.contains('\t') && !s.contains('\t') && !s.contains('\u{FFFD}')));
}

#[test]
fn translation_batches_pad_per_batch_and_frame_targets_with_bos_and_eos() {
    let _serial = common::serial();
    let pairs: Vec<(String, String)> = (0..200)
        .map(|i| (format!("the {i} cats sleep"), format!("los {i} gatos duermen")))
        .chain(std::iter::once(("a very long sentence ".repeat(20), "una frase".to_string())))
        .collect();
    let data_cfg = ablate::recipe::DataConfig {
        tokenizer: ablate::recipe::Tokenizer::Bpe,
        vocab_size: Some(300),
        ..Default::default()
    };
    let data = ablate::tasks::translate::TranslationData::from_pairs(&pairs, &data_cfg, 16).unwrap();
    // Every 20th pair is the test split, a tenth of the rest validation; the over-long one is dropped.
    assert_eq!(data.test.len(), 10);
    assert_eq!(data.validation.len(), 19);
    assert_eq!(data.train.len() + data.validation.len() + data.test.len() + data.dropped, 201);
    assert_eq!(data.dropped, 1);
    let b = data.batch(&[&data.train[0], &data.train[1]], Device::Cpu);
    let (s0, t0) = &data.train[0];
    let row = |t: &Tensor, i: i64| Vec::<i64>::try_from(t.get(i)).unwrap();
    assert_eq!(row(&b.tgt_in, 0)[0], data.bos);
    assert_eq!(&row(&b.tgt_in, 0)[1..=t0.len()], &t0[..]);
    assert_eq!(&row(&b.tgt_out, 0)[..t0.len()], &t0[..]);
    assert_eq!(row(&b.tgt_out, 0)[t0.len()], data.eos);
    assert_eq!(b.src.size()[1] as usize, data.train[0].0.len().max(data.train[1].0.len()));
    let real = Vec::<bool>::try_from(b.src_real.get(0)).unwrap();
    assert_eq!(real.iter().filter(|&&r| r).count(), s0.len());
    assert_eq!(data.test_text[0].1, "los 19 gatos duermen");
}

#[test]
fn noam_peaks_at_the_end_of_warm_up_then_falls_as_the_inverse_square_root() {
    let _serial = common::serial();
    let t = TrainConfig { lr: 1e-3, warmup_steps: 100, schedule: ablate::recipe::Schedule::Noam, ..Default::default() };
    // Steps are 0-based: step 99 is the 100th update.
    assert!((t.lr_at(49) - 0.5e-3).abs() < 1e-15);
    assert!((t.lr_at(99) - 1e-3).abs() < 1e-15);
    assert!((t.lr_at(399) - 0.5e-3).abs() < 1e-15);
    assert!((t.lr_at(9999) - 1e-4).abs() < 1e-15);
}
