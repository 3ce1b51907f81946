//! kind lm: a GPT decoder (UDL §12.7) trained by next-token prediction on a text corpus or on the copy task;
//! evaluated during training on fixed validation batches, and once at the end on fixed test batches (and,
//! with `train.eval_lengths`, on longer test windows than it trained on), with attention probes when asked
//! and a sample at the end.
use anyhow::{Context, Result};
use std::borrow::Cow;
use std::time::Instant;
use tch::{nn, Device, Kind as DType, Tensor};

use super::{Built, DataCache, RunContext, Task, Trained};
use crate::data::{Dataset, HeldOut, IGNORE};
use crate::metrics::{self, Metric};
use crate::models::decode::{generate, Decoding, NextToken};
use crate::models::gpt::Gpt;
use crate::recipe::{Config, Task as DataTask};
use crate::train::distributed::{sum_over_share, BatchShard};
use crate::train::{optimise, precision, Evaluation, Objective};
use crate::transformer::layers::Pass;

pub struct LanguageModel;

/// The data a run reads: its data section (the copy task or a corpus with its tokenizer).
fn data_key(cfg: &Config) -> String {
    serde_yaml::to_string(&cfg.data).unwrap_or_default()
}

/// The Hugging Face checkpoint a run starts from (`train.init_from`), if any.
fn init_checkpoint(cfg: &Config) -> Result<Option<super::import::HfCheckpoint>> {
    cfg.train.init_from.as_deref().map(|dir| super::import::read(std::path::Path::new(dir))).transpose()
}

/// Mean loss and accuracy of `model` over held-out batches (targets `IGNORE` are not scored); in a
/// data-parallel group each rank scores its share of the batches.
pub fn evaluate(model: &Gpt, batches: &[(Tensor, Tensor)]) -> Result<(f64, f64)> {
    let _guard = tch::no_grad_guard();
    let [loss, correct, count] = sum_over_share(batches, |(x, y)| {
        let (logits, l) = model.loss(x, y, false);
        let scored = y.ne(IGNORE);
        let right = logits.argmax(-1, false).eq_tensor(y).logical_and(&scored);
        [
            l.double_value(&[]),
            right.to_kind(DType::Float).sum(DType::Float).double_value(&[]),
            scored.to_kind(DType::Float).sum(DType::Float).double_value(&[]),
        ]
    })?;
    Ok((loss / batches.len() as f64, correct / count))
}

/// Loss per unit of text, independent of the tokenizer, so that models over different tokenizers (char,
/// BPE, WordPiece) compare on the same text: nats per character, and bits per UTF-8 byte (the unit of
/// byte-level and compression results).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct TextLoss {
    pub nats_per_char: f64,
    pub bits_per_byte: f64,
}

/// [`TextLoss`] over `batches`: the nats of every target token over the characters and the UTF-8 bytes
/// those tokens spell. Each window's text is its decoded targets (WordPiece's decoding re-spaces words, so
/// its count is the text as the tokenizer normalised it).
pub fn text_loss(
    model: &Gpt,
    batches: &[(Tensor, Tensor)],
    tokenizer: &crate::data::tokenize::TextTokenizer,
) -> TextLoss {
    let _guard = tch::no_grad_guard();
    let (mut nats, mut chars, mut bytes) = (0.0, 0usize, 0usize);
    for (x, y) in batches {
        let (_, mean) = model.loss(x, y, false);
        nats += mean.double_value(&[]) * y.numel() as f64;
        for row in 0..y.size()[0] {
            let ids = Vec::<i64>::try_from(y.get(row).to_device(Device::Cpu)).expect("int64 targets");
            let text = tokenizer.decode(&ids);
            chars += text.chars().count();
            bytes += text.len();
        }
    }
    TextLoss {
        nats_per_char: nats / chars.max(1) as f64,
        bits_per_byte: nats / std::f64::consts::LN_2 / bytes.max(1) as f64,
    }
}

/// Next-token prediction: batches from the corpus (or the copy task), evaluation on fixed validation
/// batches, and once on fixed test batches.
struct NextTokenObjective<'a> {
    model: &'a Gpt,
    data: &'a Dataset,
    validation: Vec<(Tensor, Tensor)>,
    test: Vec<(Tensor, Tensor)>,
    batch: i64,
    block: i64,
    device: Device,
    probe_attention: bool,
}

impl Objective for NextTokenObjective<'_> {
    fn training_loss(&self, shard: &BatchShard) -> Tensor {
        let (x, y) = self.data.train_batch(shard.global(self.batch), self.block, self.device);
        let [x, y] = shard.take([x, y]);
        self.model.loss(&x, &y, true).1
    }

    fn evaluate(&self, _step: i64) -> Result<Evaluation> {
        let (loss, accuracy) = evaluate(self.model, &self.validation)?;
        let e = Evaluation::default().with("val/loss", loss).with("val/accuracy", accuracy);
        if !self.probe_attention {
            return Ok(e);
        }
        let weights =
            tch::no_grad(|| self.model.forward_with_weights(&self.validation[0].0, Pass::eval().with_weights()).1);
        Ok(super::probe(e, &weights))
    }

    fn test(&self) -> Result<Evaluation> {
        let (loss, accuracy) = evaluate(self.model, &self.test)?;
        Ok(Evaluation::default().with("val/loss", loss).with("val/accuracy", accuracy))
    }
}

/// Training FLOPs per token (forward + backward, the usual 3× forward): 6 per weight of every matrix a token
/// passes through, plus attention's scores and weighted sums per query–key pair (`pair_macs`: 12·layers·T·(H·d_head) for
/// ordinary heads, more where a mechanism adds pairs of its own), counted dense as PaLM's and
/// nanoGPT's MFU do (a sparse pattern's savings show as a higher tokens/s, not as more FLOPs).
pub fn train_flops_per_token(cfg: &Config, params: i64, vocab: i64) -> f64 {
    let t = cfg.transformer_spec();
    // Lookup tables cost no multiply-adds: the token embedding (unless it doubles as the LM head) and an
    // absolute learned position table.
    let mut lookups = if t.tie_embeddings { 0 } else { vocab * t.d_model };
    if t.position.encoding == crate::transformer::spec::PositionEncoding::Learned {
        lookups += t.block_size * t.d_model;
    }
    let matmul_params = (params - lookups) as f64;
    // Attention: per query–key pair the scores and the weighted sum of values (`pair_macs`, each MAC 2 FLOPs,
    // training 3× the forward): Kaplan et al.'s 12·L·T·d_attn for ordinary heads, and a mechanism's own
    // pairs where it has more (differential attention's second weighted sum, qk_dim other than head_dim).
    6.0 * matmul_params + 6.0 * (t.layers * t.block_size * t.attention.pair_macs()) as f64
}

/// Kaplan et al. (2020)'s N: the trainable parameters outside every vocabulary table (the token embedding, an
/// untied LM head, value-embedding tables) and the absolute position table, the count their L(N) law is
/// fitted against (`ablate fit --minus` is not enough when the width, and so the tables, change per run).
pub fn non_embedding_parameters(vs: &nn::VarStore) -> i64 {
    const TABLES: [&str; 4] = ["token_embedding.", "lm_head.", "position.", "value_embeddings."];
    vs.variables()
        .iter()
        .filter(|(name, v)| v.requires_grad() && !TABLES.iter().any(|t| name.starts_with(t)))
        .map(|(_, v)| v.numel() as i64)
        .sum()
}

struct BuiltGpt {
    model: Gpt,
    vocab: i64,
}

impl Built for BuiltGpt {
    fn forward_example(&self, batch: i64, train: bool, device: tch::Device) -> Tensor {
        let idx = super::example_tokens(batch, self.model.block_size, self.vocab, device);
        self.model.forward(&idx, train)
    }

    fn attention_on_tokens(&self, ids: &Tensor) -> Option<Vec<Tensor>> {
        Some(self.model.forward_with_weights(ids, Pass::eval().with_weights()).1)
    }

    fn decoder(&self) -> Option<&dyn NextToken> {
        Some(&self.model)
    }

    fn gpt(&self) -> Option<&Gpt> {
        Some(&self.model)
    }
}

impl Task for LanguageModel {
    fn metrics(&self, cfg: &Config) -> Vec<Metric> {
        let (loss, accuracy) = match cfg.data.task {
            DataTask::Copy => ("test loss on the copy", "test accuracy on the copy"),
            DataTask::Induction => ("test loss on the repeat", "test accuracy on the repeat"),
            DataTask::Recall => ("test loss on the recalled values", "test recall accuracy"),
            DataTask::Text => ("test loss", "test next-token accuracy"),
        };
        let mut m = vec![
            Metric::both("test_loss", "val/loss", loss, "nats/token", false),
            Metric::column("test_perplexity", "test perplexity", "", false).detail().no_charts(),
            Metric::column("test_loss_per_char", "test loss per character", "nats/char", false).detail(),
            Metric::column("test_bits_per_byte", "test bits per UTF-8 byte", "bits/byte", false).detail(),
            Metric::both("test_accuracy", "val/accuracy", accuracy, "", true),
        ];
        for k in &cfg.train.eval_lengths {
            let owned = |name: String| Some(Cow::Owned(name));
            // Drawn together by the length-generalisation chart.
            let base = Metric::column("", "", "", false).detail().no_charts();
            m.push(Metric {
                column: owned(format!("test_loss_x{k}")),
                label: length_label("test loss", *k),
                unit: "nats/token",
                ..base.clone()
            });
            m.push(Metric {
                column: owned(format!("test_accuracy_x{k}")),
                label: length_label("test accuracy", *k),
                higher_is_better: true,
                ..base
            });
        }
        if cfg.train.probe_outliers {
            m.extend(metrics::outlier_probes());
        }
        if cfg.train.probe_residual {
            m.extend(metrics::residual_probes());
        }
        if cfg.train.probe_attention {
            m.extend(metrics::attention_probes());
        }
        m.extend(metrics::optimisation("nats/token"));
        m.extend(metrics::cost("tokens/s", cfg.train.world_size));
        m.push(
            Metric::column("params_non_embedding", "parameters outside the vocabulary and position tables", "", false)
                .digits(0)
                .csv(0)
                .detail()
                .no_charts(),
        );
        m
    }

    fn prepare(&self, cfg: &Config, data: &mut DataCache) -> Result<()> {
        let set = DataCache::get_or_load(&mut data.text, data_key(cfg), || Dataset::load(&cfg.data))?;
        set.check_block_size(cfg.longest_window())?;
        if let Some(checkpoint) = init_checkpoint(cfg)? {
            let vocab = set.tokenizer().vocab_size();
            checkpoint.check_matches(cfg, vocab).context("train.init_from")?;
            if let Dataset::Text(_) = set {
                checkpoint.check_vocabulary(set.tokenizer()).context("train.init_from")?;
            }
        }
        Ok(())
    }

    fn vocab(&self, cfg: &Config, data: &DataCache) -> Result<i64> {
        Ok(DataCache::loaded(&data.text, &data_key(cfg))?.tokenizer().vocab_size())
    }

    fn build(&self, cfg: &Config, vs: &nn::Path, vocab: i64) -> Box<dyn Built> {
        Box::new(BuiltGpt { model: Gpt::new(vs, &cfg.transformer_spec(), vocab), vocab })
    }

    fn forward_flops(&self, cfg: &Config, params: i64, vocab: i64) -> (f64, String) {
        let block = cfg.transformer.block_size;
        (train_flops_per_token(cfg, params, vocab) / 3.0 * block as f64, format!("sequence of {block} tokens"))
    }

    fn tokens_per_example(&self, cfg: &Config, _data: &DataCache) -> Result<f64> {
        Ok(cfg.transformer.block_size as f64)
    }

    fn frequency_level(&self, cfg: &Config, data: &DataCache) -> Result<Option<f64>> {
        Ok(DataCache::loaded(&data.text, &data_key(cfg))?.frequency_level())
    }

    fn train(&self, cfg: &Config, data: &DataCache, ctx: RunContext) -> Result<Trained> {
        let data = DataCache::loaded(&data.text, &data_key(cfg))?;
        let (t, device) = (&cfg.train, ctx.device);
        let block = cfg.transformer.block_size;
        let vocab = data.tokenizer().vocab_size();
        tch::manual_seed(t.seed as i64);
        let started = Instant::now();
        let mut vs = nn::VarStore::new(device);
        let model = Gpt::new(&vs.root(), &cfg.transformer_spec(), vocab);
        if let Some(checkpoint) = init_checkpoint(cfg)? {
            checkpoint.load_into(&vs, cfg).context("train.init_from")?;
        }
        let objective = NextTokenObjective {
            model: &model,
            data,
            validation: data.held_out_batches(HeldOut::Validation, t.eval_batches, t.global_batch(), block, device),
            test: data.held_out_batches(
                HeldOut::Test,
                data.test_batches(t.test_batches(), t.global_batch(), block),
                t.global_batch(),
                block,
                device,
            ),
            batch: t.batch_size,
            block,
            device,
            probe_attention: t.probe_attention,
        };
        let run = optimise(t, &objective, &mut vs, device, ctx.progress, ctx.state)?;
        let tokens_per_s = (run.steps_done * t.global_batch() * block) as f64 / run.train_time.max(1e-9);
        let model_flops = tokens_per_s * train_flops_per_token(cfg, run.params, vocab);
        let _autocast = precision::autocast(t.precision, device);
        // Length generalisation: the same number of test tokens, in windows k times longer. A learned
        // position table cannot read them: those cells stay empty.
        // A tuning run reads no test split: not the longer windows, not the per-character loss.
        let reads_test = !t.skip_test && run.diverged_at.is_none();
        let lengths: Vec<(i64, (f64, f64))> = t
            .eval_lengths
            .iter()
            .filter(|_| !t.skip_test)
            .map(|&k| {
                let (long, batch) = (block * k, (t.global_batch() / k).max(1));
                let scores = match model.covers(long) {
                    true => {
                        evaluate(&model, &data.held_out_batches(HeldOut::Test, t.eval_batches, batch, long, device))?
                    }
                    false => (f64::NAN, f64::NAN),
                };
                Ok((k, scores))
            })
            .collect::<Result<_>>()?;
        tch::manual_seed(t.seed as i64);
        let (prompt, new_tokens) = data.sample_prompt();
        let decoding = match data {
            Dataset::Text(_) => Decoding::Sample { temperature: 0.8, top_k: Some(10) },
            Dataset::Copy(_) => Decoding::Greedy,
        };
        let sample = match run.diverged_at {
            None => data.tokenizer().decode(&generate(&model, &prompt, new_tokens, decoding, true)),
            Some(step) => format!("(no sample: training diverged at step {step})"),
        };
        let outliers = (t.probe_outliers && reads_test).then(|| outlier_probe(&model, &objective.test));
        let residual = (t.probe_residual && reads_test)
            .then(|| residual_probe(&model, &objective.test, &delimiter_ids(data.tokenizer())));
        drop(_autocast);
        let per_text = match data {
            Dataset::Text(_) if reads_test => Some(text_loss(&model, &objective.test, data.tokenizer())),
            _ => None,
        };
        let mut outcome = run.into_outcome(started, tokens_per_s, model_flops, device, t.precision, &self.metrics(cfg));
        outcome.set("test_perplexity", outcome.get("test_loss").exp());
        outcome.set("params_non_embedding", non_embedding_parameters(&vs) as f64);
        outcome.set("test_loss_per_char", per_text.map_or(f64::NAN, |l| l.nats_per_char));
        outcome.set("test_bits_per_byte", per_text.map_or(f64::NAN, |l| l.bits_per_byte));
        if let Some((peak_ratio, kurtosis, logit)) = outliers {
            outcome.set("attn_out_peak_ratio", peak_ratio);
            outcome.set("attn_out_kurtosis", kurtosis);
            outcome.set("attn_logit_max", logit);
        }
        if let Some(r) = residual {
            outcome.set("resid_peak_ratio", r.peak_ratio);
            outcome.set("resid_kurtosis", r.kurtosis);
            outcome.set("attn_first_token_mass", r.first_token_mass);
            outcome.set("attn_delimiter_mass", r.delimiter_mass);
        }
        for (k, (loss, accuracy)) in lengths {
            outcome.set(&format!("test_loss_x{k}"), loss);
            outcome.set(&format!("test_accuracy_x{k}"), accuracy);
        }
        outcome.sample = sample;
        Ok(Trained { outcome, vs, tokenizer: Some(data.tokenizer().clone()) })
    }
}

/// "test loss at 8× the block": a metric label names its multiple. Labels are `'static`; the few multiples a
/// process meets (`train.eval_lengths` allows 2..=1024) are interned once each, not leaked per call.
fn length_label(what: &'static str, k: i64) -> &'static str {
    use std::collections::HashMap;
    use std::sync::{Mutex, OnceLock};
    static LABELS: OnceLock<Mutex<HashMap<(&'static str, i64), &'static str>>> = OnceLock::new();
    let mut labels = LABELS.get_or_init(Default::default).lock().unwrap_or_else(|e| e.into_inner());
    labels.entry((what, k)).or_insert_with(|| Box::leak(format!("{what} at {k}× the block").into_boxed_str()))
}

/// The outlier probe (`train.probe_outliers`): over the test batches, the largest peak ratio of any
/// self-attention unit's output, the mean of their kurtoses (one per unit and batch), and the largest
/// attention logit of any unit.
fn outlier_probe(model: &Gpt, batches: &[(Tensor, Tensor)]) -> (f64, f64, f64) {
    use crate::transformer::attention::{record_attention_logits, take_attention_logits};
    use crate::transformer::layers::{record_attention_outputs, take_attention_outputs};
    record_attention_outputs(true);
    record_attention_logits(true);
    tch::no_grad(|| batches.iter().for_each(|(x, _)| drop(model.forward(x, false))));
    let stats = take_attention_outputs();
    let logits = take_attention_logits();
    record_attention_outputs(false);
    record_attention_logits(false);
    let peak_ratio = stats.iter().map(|s| s.0).fold(f64::NAN, f64::max);
    let kurtosis = stats.iter().map(|s| s.1).sum::<f64>() / stats.len() as f64;
    (peak_ratio, kurtosis, logits.into_iter().fold(f64::NAN, f64::max))
}

/// The residual-stream probe's four numbers (`train.probe_residual`).
pub struct ResidualProbe {
    pub peak_ratio: f64,
    pub kurtosis: f64,
    pub first_token_mass: f64,
    pub delimiter_mass: f64,
}

/// The ids of a character vocabulary's space and newline (empty for a subword vocabulary, whose tokens
/// carry their spaces inside them).
pub fn delimiter_ids(tokenizer: &crate::data::tokenize::TextTokenizer) -> Vec<i64> {
    match tokenizer {
        crate::data::tokenize::TextTokenizer::Char(c) => {
            [" ", "\n"].iter().filter_map(|d| c.encode(d).ok()).flatten().collect()
        }
        _ => Vec::new(),
    }
}

/// The residual-stream probe over the test batches: the outlier statistics of every layer's output, and the
/// mean attention weight (over layers, heads, batches and every query but the first, which has only the
/// first key) on the first position and on the `delimiters`' positions (NaN without delimiters).
pub fn residual_probe(model: &Gpt, batches: &[(Tensor, Tensor)], delimiters: &[i64]) -> ResidualProbe {
    use crate::transformer::layers::{record_residual_stream, take_residual_stream, Pass};
    let (mut first, mut delimiter, mut rows) = (0.0, 0.0, 0.0);
    record_residual_stream(true);
    tch::no_grad(|| {
        for (x, _) in batches {
            let (_, weights) = model.forward_with_weights(x, Pass::eval().with_weights());
            let n = x.size()[1];
            let is_delimiter = delimiters
                .iter()
                .fold(x.zeros_like().to_kind(DType::Bool), |acc, &d| acc.logical_or(&x.eq(d)))
                .to_kind(DType::Float);
            for w in &weights {
                // w: (B, H, N, N), the queries' weights over the keys; the first query is left out.
                let later = w.narrow(2, 1, n - 1).to_kind(DType::Double);
                first += later.select(3, 0).sum(DType::Double).double_value(&[]);
                let on_delimiters = later.matmul(&is_delimiter.to_kind(DType::Double).unsqueeze(1).unsqueeze(-1));
                delimiter += on_delimiters.sum(DType::Double).double_value(&[]);
                rows += (later.size()[0] * later.size()[1] * later.size()[2]) as f64;
            }
        }
    });
    let stats = take_residual_stream();
    record_residual_stream(false);
    ResidualProbe {
        peak_ratio: stats.iter().map(|s| s.0).fold(f64::NAN, f64::max),
        kurtosis: stats.iter().map(|s| s.1).sum::<f64>() / stats.len() as f64,
        first_token_mass: first / rows,
        delimiter_mass: if delimiters.is_empty() { f64::NAN } else { delimiter / rows },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The FLOPs of a run count a mechanism's own attention pairs: Kaplan et al.'s 12·L·T·d_attn for ordinary
    /// heads, and differential attention's second weighted sum of the values (6·L·T·H·d_head more), so a
    /// compute budget charges each arm what it computes.
    #[test]
    fn attention_flops_count_each_mechanisms_pairs() {
        let config = |extra: &str| {
            let text = format!("kind: lm\ntransformer: {{d_model: 32, layers: 2, heads: 4, block_size: 16{extra}}}\n");
            crate::recipe::parse(&text, "f.yaml", "f", false).unwrap().runs[0].config.clone()
        };
        let (plain, diff) = (config(""), config(", attention: {differential: true}"));
        let params = 10_000;
        let (a, b) = (train_flops_per_token(&plain, params, 50), train_flops_per_token(&diff, params, 50));
        let (l, t, inner) = (2.0, 16.0, 32.0);
        assert!((a - (6.0 * (params - 50 * 32 - 16 * 32) as f64 + 12.0 * l * t * inner)).abs() < 1e-6, "{a}");
        assert!((b - a - 6.0 * l * t * inner).abs() < 1e-6, "{}", b - a);
    }
}
