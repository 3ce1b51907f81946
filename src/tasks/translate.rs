//! kind translate: the encoder–decoder (UDL §12.8) trained on sentence pairs: one subword vocabulary for
//! both languages (trained on the training pairs' two sides), batches padded per batch, label-smoothed
//! cross-entropy through the shared optimisation loop, and after training corpus BLEU and exact match of
//! greedy or beam translations of the test pairs.
//!
//! Splits: every 20th pair (in canonical verse order) is the test split; of the others, `data.validation_fraction`
//! evenly spread through them are the validation split (evaluated during training), the rest the training
//! split (which alone trains the vocabulary). Pairs with either side longer than `transformer.block_size`
//! tokens are dropped from every split (the count is printed).
use anyhow::{bail, Context, Result};
use std::time::Instant;
use tch::{nn, Device, Kind, Tensor};

use super::{Built, DataCache, RunContext, Task, Trained};
use crate::data::text::build_tokenizer;
use crate::data::tokenize::{Special, TextTokenizer};
use crate::metrics::{self, Metric};
use crate::models::seq2seq::{bleu, translate, PairBatch, Seq2Seq, Seq2SeqSpec};
use crate::recipe::{Config, DataConfig, PairSet};
use crate::train::distributed::{sum_over_share, BatchShard};
use crate::train::{optimise, Evaluation, Objective};

pub struct Translation;

/// A tokenised sentence pair: source ids, target ids.
pub type Pair = (Vec<i64>, Vec<i64>);

/// Tokenised pairs, split, with the texts of the test ones (BLEU compares detokenised text).
pub struct TranslationData {
    pub tokenizer: TextTokenizer,
    pub train: Vec<Pair>,
    pub validation: Vec<Pair>,
    pub test: Vec<Pair>,
    pub test_text: Vec<(String, String)>,
    pub dropped: usize,
    pub bos: i64,
    pub eos: i64,
    pub pad: i64,
}

impl TranslationData {
    pub fn load(data: &DataConfig, set: PairSet, max_tokens: i64) -> Result<Self> {
        let pairs = match set {
            PairSet::BibleEnEs => crate::data::pairs::bible_en_es()?,
        };
        Self::from_pairs(&pairs, data, max_tokens)
    }

    pub fn from_pairs(pairs: &[(String, String)], data: &DataConfig, max_tokens: i64) -> Result<Self> {
        let (rest, test_pairs): (Vec<_>, Vec<_>) = pairs.iter().enumerate().partition(|(i, _)| i % 20 != 19);
        let (train_idx, validation_idx) = crate::data::carve_validation(rest.len(), data.validation_fraction);
        let pick = |idx: Vec<usize>| -> Vec<(usize, &(String, String))> { idx.into_iter().map(|j| rest[j]).collect() };
        let (train_pairs, validation_pairs) = (pick(train_idx), pick(validation_idx));
        let train_text: String =
            train_pairs.iter().flat_map(|(_, (a, b))| [a.as_str(), "\n", b.as_str(), "\n"]).collect();
        let tokenizer = build_tokenizer(data, &train_text, &train_text)?;
        let get = |s: Special| tokenizer.special(s).with_context(|| format!("the vocabulary has no {}", s.token()));
        let (bos, eos, pad) = (get(Special::Bos)?, get(Special::Eos)?, get(Special::Pad)?);
        // Each tokenised pair keeps its index into `pairs`, to find the held-out texts again.
        let encode = |set: &[(usize, &(String, String))]| -> Result<Vec<(Pair, usize)>> {
            let src: Vec<&str> = set.iter().map(|(_, p)| p.0.as_str()).collect();
            let tgt: Vec<&str> = set.iter().map(|(_, p)| p.1.as_str()).collect();
            let (src, tgt) = (tokenizer.encode_lines(&src)?, tokenizer.encode_lines(&tgt)?);
            Ok(src.into_iter().zip(tgt).zip(set.iter().map(|(i, _)| *i)).collect())
        };
        let fits = |((s, t), _): &(Pair, usize)| {
            !s.is_empty() && !t.is_empty() && s.len() as i64 <= max_tokens && t.len() as i64 <= max_tokens
        };
        let (train_all, validation_all, test_all) =
            (encode(&train_pairs)?, encode(&validation_pairs)?, encode(&test_pairs)?);
        let dropped = train_all.iter().chain(&validation_all).chain(&test_all).filter(|p| !fits(p)).count();
        let kept =
            |all: Vec<(Pair, usize)>| -> Vec<Pair> { all.into_iter().filter(|p| fits(p)).map(|(p, _)| p).collect() };
        let (train, validation) = (kept(train_all), kept(validation_all));
        let test_kept: Vec<_> = test_all.into_iter().filter(|p| fits(p)).collect();
        let test_text = test_kept.iter().map(|(_, i)| pairs[*i].clone()).collect();
        let test = test_kept.into_iter().map(|(p, _)| p).collect();
        if train.is_empty() {
            bail!("no sentence pair fits model.block_size = {max_tokens} tokens");
        }
        if validation.is_empty() {
            bail!("no validation pair fits model.block_size = {max_tokens} tokens (raise data.validation_fraction)");
        }
        Ok(Self { tokenizer, train, validation, test, test_text, dropped, bos, eos, pad })
    }

    /// Mean tokens of a training pair (source, target and its `<eos>`), over the first 1,000.
    pub fn tokens_per_pair(&self) -> f64 {
        let tokens: usize = self.train.iter().take(1000).map(|(s, t)| s.len() + t.len() + 1).sum();
        tokens as f64 / self.train.len().clamp(1, 1000) as f64
    }

    /// Pairs as a padded batch: sources (B, S) with their mask, decoder inputs `<bos> t` and outputs `t <eos>`
    /// (B, T), padding with `<pad>` (which the loss ignores).
    pub fn batch(&self, pairs: &[&Pair], device: Device) -> PairBatch {
        let s_len = pairs.iter().map(|p| p.0.len()).max().unwrap_or(1);
        let t_len = pairs.iter().map(|p| p.1.len()).max().unwrap_or(0) + 1;
        let (mut src, mut real, mut tgt_in, mut tgt_out) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
        for (s, t) in pairs.iter().map(|p| (&p.0, &p.1)) {
            src.extend(s.iter().copied().chain(std::iter::repeat(self.pad)).take(s_len));
            real.extend((0..s_len).map(|j| j < s.len()));
            let input = std::iter::once(self.bos).chain(t.iter().copied());
            tgt_in.extend(input.chain(std::iter::repeat(self.pad)).take(t_len));
            let output = t.iter().copied().chain(std::iter::once(self.eos));
            tgt_out.extend(output.chain(std::iter::repeat(self.pad)).take(t_len));
        }
        let b = pairs.len() as i64;
        let t = |v: &[i64], n: usize| crate::data::to_device_async(&Tensor::from_slice(v).view([b, n as i64]), device);
        PairBatch {
            src: t(&src, s_len),
            src_real: crate::data::to_device_async(&Tensor::from_slice(&real).view([b, s_len as i64]), device),
            tgt_in: t(&tgt_in, t_len),
            tgt_out: t(&tgt_out, t_len),
        }
    }
}

struct Translating<'a> {
    model: &'a Seq2Seq,
    data: &'a TranslationData,
    /// Fixed batches of the validation and of the test pairs.
    validation: Vec<PairBatch>,
    test: Vec<PairBatch>,
    smoothing: f64,
    batch: i64,
    device: Device,
}

impl Objective for Translating<'_> {
    fn training_loss(&self, shard: &BatchShard) -> Tensor {
        let global = shard.global(self.batch);
        let idx = Tensor::randint(self.data.train.len() as i64, [global], (Kind::Int64, Device::Cpu));
        let [idx] = shard.take([idx]);
        let picked: Vec<&Pair> =
            Vec::<i64>::try_from(idx).unwrap_or_default().iter().map(|&i| &self.data.train[i as usize]).collect();
        self.model.loss(&self.data.batch(&picked, self.device), self.smoothing, self.data.pad, true).0
    }

    fn evaluate(&self, _step: i64) -> Result<Evaluation> {
        self.score(&self.validation)
    }

    fn test(&self) -> Result<Evaluation> {
        self.score(&self.test)
    }
}

impl Translating<'_> {
    /// Bits per UTF-8 byte of the target sentences of `batches`: the nats of every target token (the
    /// closing `<eos>` included) over the bytes of the decoded targets, each counted with one byte for its
    /// end (a line break), so tokenizers compare on the same text.
    fn bits_per_byte(&self, batches: &[PairBatch]) -> f64 {
        let _guard = tch::no_grad_guard();
        let (mut nats, mut bytes) = (0.0, 0usize);
        for b in batches {
            let (l, _) = self.model.loss(b, 0.0, self.data.pad, false);
            let scored = b.tgt_out.ne(self.data.pad);
            nats += l.double_value(&[]) * scored.to_kind(Kind::Float).sum(Kind::Float).double_value(&[]);
            for row in 0..b.tgt_out.size()[0] {
                let ids: Vec<i64> = Vec::<i64>::try_from(b.tgt_out.get(row).to_device(Device::Cpu))
                    .unwrap_or_default()
                    .into_iter()
                    .filter(|&id| id != self.data.pad && id != self.data.eos)
                    .collect();
                bytes += self.data.tokenizer.decode(&ids).len() + 1;
            }
        }
        nats / std::f64::consts::LN_2 / bytes.max(1) as f64
    }

    /// Loss and target-token accuracy over held-out `batches`.
    fn score(&self, batches: &[PairBatch]) -> Result<Evaluation> {
        let _guard = tch::no_grad_guard();
        let [loss, correct, count] = sum_over_share(batches, |b| {
            // Held-out loss without smoothing: the model's real cross-entropy.
            let (l, logits) = self.model.loss(b, 0.0, self.data.pad, false);
            let scored = b.tgt_out.ne(self.data.pad);
            let n = scored.to_kind(Kind::Float).sum(Kind::Float).double_value(&[]);
            let right = logits.argmax(-1, false).eq_tensor(&b.tgt_out).logical_and(&scored);
            [l.double_value(&[]) * n, right.to_kind(Kind::Float).sum(Kind::Float).double_value(&[]), n]
        })?;
        Ok(Evaluation::default().with("val/loss", loss / count).with("val/accuracy", correct / count))
    }
}

/// The encoder–decoder a translation run's config describes, over a shared vocabulary of `vocab` tokens.
pub fn model_spec(cfg: &Config, vocab: i64) -> Seq2SeqSpec {
    let tr = cfg.translate();
    let mut transformer = cfg.transformer_spec();
    // The decoder reads `<bos>` and the target: one position more than the longest sentence.
    transformer.block_size += 1;
    Seq2SeqSpec {
        src_vocab: vocab,
        tgt_vocab: vocab,
        encoder_layers: tr.encoder_layers,
        decoder_layers: tr.decoder_layers,
        cross_attention_layers: tr.cross_attention_layers.unwrap_or(tr.decoder_layers),
        shared_embeddings: tr.shared_embeddings,
        transformer,
    }
}

/// The pairs a run reads: its tokenizer settings, the pair set, the validation share and the longest
/// sentence kept.
fn pairs_key(cfg: &Config) -> String {
    let d = &cfg.data;
    format!(
        "{:?}{:?}{:?}{:?}{}{}",
        d.tokenizer,
        d.vocab_size,
        d.tokenizer_path,
        cfg.translate().pairs,
        d.validation_fraction,
        cfg.transformer.block_size
    )
}

struct BuiltSeq2Seq {
    model: Seq2Seq,
    vocab: i64,
}

impl Built for BuiltSeq2Seq {
    fn forward_example(&self, batch: i64, train: bool, device: Device) -> Tensor {
        let n = (self.model.spec.transformer.block_size - 1).min(16);
        let src = super::example_tokens(batch, n, self.vocab, device);
        let tgt = super::example_tokens(batch, n, self.vocab, device).flip([1]);
        let real = src.ones_like().to_kind(Kind::Bool);
        let memory = self.model.encode(&src, &real, train);
        self.model.decode(&tgt, &memory, &real, train)
    }
}

impl Task for Translation {
    fn metrics(&self, cfg: &Config) -> Vec<Metric> {
        let mut m = vec![
            Metric::both("test_loss", "val/loss", "test loss", "nats/target token", false),
            Metric::both("test_accuracy", "val/accuracy", "test target-token accuracy", "", true),
            Metric::column("test_bits_per_byte", "test bits per UTF-8 byte of the targets", "bits/byte", false)
                .detail(),
            Metric::column("test_bleu", "test BLEU", "", true).digits(2),
            Metric::column("test_exact_match", "test exact-match rate", "", true),
        ];
        if cfg.translate().beam_width > 1 {
            m.push(
                Metric::column("test_bleu_greedy", "test BLEU of greedy decoding (same models)", "", true).digits(2),
            );
        }
        m.extend(metrics::optimisation("nats/target token, label-smoothed"));
        m.extend(metrics::cost("tokens/s", cfg.train.world_size));
        m
    }

    fn prepare(&self, cfg: &Config, data: &mut DataCache) -> Result<()> {
        let quiet = data.quiet;
        DataCache::get_or_load(&mut data.pairs, pairs_key(cfg), || {
            let block = cfg.transformer.block_size;
            let pairs = TranslationData::load(&cfg.data, cfg.translate().pairs, block)?;
            if !quiet {
                eprintln!(
                    "ablate: {} training, {} validation and {} test pairs, vocabulary {} ({} pairs longer than {block} tokens dropped)",
                    pairs.train.len(),
                    pairs.validation.len(),
                    pairs.test.len(),
                    pairs.tokenizer.vocab_size(),
                    pairs.dropped,
                );
            }
            Ok(pairs)
        })?;
        Ok(())
    }

    fn vocab(&self, cfg: &Config, data: &DataCache) -> Result<i64> {
        Ok(DataCache::loaded(&data.pairs, &pairs_key(cfg))?.tokenizer.vocab_size())
    }

    fn build(&self, cfg: &Config, vs: &nn::Path, vocab: i64) -> Box<dyn Built> {
        Box::new(BuiltSeq2Seq { model: Seq2Seq::new(vs, &model_spec(cfg, vocab)), vocab })
    }

    fn forward_flops(&self, _cfg: &Config, _params: i64, _vocab: i64) -> (f64, String) {
        (f64::NAN, "(translation: FLOPs depend on sentence lengths)".into())
    }

    fn tokens_per_example(&self, cfg: &Config, data: &DataCache) -> Result<f64> {
        Ok(DataCache::loaded(&data.pairs, &pairs_key(cfg))?.tokens_per_pair())
    }

    fn train(&self, cfg: &Config, data: &DataCache, ctx: RunContext) -> Result<Trained> {
        let data = DataCache::loaded(&data.pairs, &pairs_key(cfg))?;
        let (tr, t, device) = (cfg.translate(), &cfg.train, ctx.device);
        let d_model = cfg.transformer.d_model;
        let started = Instant::now();
        let vocab = data.tokenizer.vocab_size();
        tch::manual_seed(t.seed as i64);
        let mut vs = nn::VarStore::new(device);
        let model = Seq2Seq::new(&vs.root(), &model_spec(cfg, vocab));
        let batches = |pairs: &[Pair], count: i64| -> Vec<PairBatch> {
            let picked: Vec<&Pair> = pairs.iter().take(count.saturating_mul(t.global_batch()) as usize).collect();
            picked.chunks(t.global_batch() as usize).map(|c| data.batch(c, device)).collect()
        };
        let (validation, test) = (batches(&data.validation, t.eval_batches), batches(&data.test, t.test_batches()));
        let objective = Translating {
            model: &model,
            data,
            validation,
            test,
            smoothing: tr.label_smoothing,
            batch: t.batch_size,
            device,
        };
        let run = optimise(t, &objective, &mut vs, device, ctx.progress, ctx.state)?;
        let tokens_per_pair = data.tokens_per_pair();
        let tokens_per_s = run.steps_done as f64 * t.global_batch() as f64 * tokens_per_pair / run.train_time.max(1e-9);

        let (mut bleu_score, mut exact, mut greedy_bleu, mut sample) = (f64::NAN, f64::NAN, f64::NAN, String::new());
        // A tuning run reads no test split: no decoding of test verses, no test bits per byte.
        let reads_test = !t.skip_test && run.diverged_at.is_none();
        if reads_test {
            let n = (tr.eval_sentences as usize).min(data.test.len());
            let max_len = cfg.transformer.block_size as usize;
            let refs: Vec<String> = data.test_text.iter().take(n).map(|(_, es)| es.clone()).collect();
            let decode_all = |width: i64| -> Vec<String> {
                let decode = |src: &Vec<i64>| {
                    translate(&model, src, data.bos, data.eos, max_len, width as usize, tr.length_penalty, true)
                };
                data.test
                    .iter()
                    .take(n)
                    .map(|(src, _)| data.tokenizer.decode(&decode(src)).trim().to_string())
                    .collect()
            };
            let hyps = decode_all(tr.beam_width);
            for (i, hyp) in hyps.iter().enumerate().take(5) {
                let (en, es) = &data.test_text[i];
                sample.push_str(&format!("EN:  {en}\nES:  {es}\nOUT: {hyp}\n\n"));
            }
            bleu_score = bleu(&hyps, &refs);
            exact = hyps.iter().zip(&refs).filter(|(h, r)| h == r).count() as f64 / n.max(1) as f64;
            // Beam runs also score greedy decoding of the same model: the beam's gain, without retraining.
            greedy_bleu = if tr.beam_width > 1 { bleu(&decode_all(1), &refs) } else { bleu_score };
        }
        // Training FLOPs per token: 6 per matmul weight (embeddings are lookups) plus attention's scores and
        // sums, 12·layers·T·(H·d_head) with T the mean sentence length, over encoder self-, decoder self- and
        // cross-attention layers.
        let params = run.params;
        let inner = cfg.transformer_spec().attention.inner();
        let lookups = vocab * d_model * if tr.shared_embeddings { 1 } else { 2 };
        let cross = tr.cross_attention_layers.unwrap_or(tr.decoder_layers);
        let attention_layers = tr.encoder_layers + tr.decoder_layers + cross;
        let mean_length = tokens_per_pair / 2.0;
        let generator = if cfg.transformer.tie_embeddings { 6.0 * (vocab * d_model) as f64 } else { 0.0 };
        let per_token =
            6.0 * (params - lookups) as f64 + generator + 12.0 * (attention_layers * inner) as f64 * mean_length;
        let model_flops = tokens_per_s * per_token;
        let bits_per_byte = if reads_test { objective.bits_per_byte(&objective.test) } else { f64::NAN };
        let mut outcome = run.into_outcome(started, tokens_per_s, model_flops, device, t.precision, &self.metrics(cfg));
        outcome.set("test_bits_per_byte", bits_per_byte);
        outcome.set("test_bleu", bleu_score);
        outcome.set("test_exact_match", exact);
        if tr.beam_width > 1 {
            outcome.set("test_bleu_greedy", greedy_bleu);
        }
        outcome.sample = sample;
        Ok(Trained { outcome, vs, tokenizer: Some(data.tokenizer.clone()) })
    }
}
