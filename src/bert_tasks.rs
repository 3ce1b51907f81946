//! Training BERT (the seed's 12.6): masked-LM pre-training on the corpus (12.6.1), then fine-tuning a head
//! on a labelled task (12.6.2), each phase through the shared optimisation loop.
//!
//! Masked LM: windows of the corpus become `<cls> tokens <sep>`; `mask_fraction` of the ordinary tokens are
//! chosen, and (with the 80/10/10 rule) 80% of those become `<mask>`, 10% a random token, 10% stay. The
//! loss is cross-entropy at the chosen positions only. The MLM head is BERT's: dense + GELU + LayerNorm,
//! then the word embedding matrix (shared) plus a bias.
//!
//! Next-token prediction (`objective: next_token`) is the same encoder and head with causal attention, each
//! position predicting the following token: the GPT objective, for comparing data efficiency.
//!
//! Sequence classification: `<cls> text <sep>` padded to the block; the head reads BERT's pooled `<cls>`
//! state. Two classes use one logit with sigmoid / binary cross-entropy, more use softmax / cross-entropy.
//! Metrics: accuracy and F1 of the positive class. Token classification: a linear layer on every hidden
//! state, cross-entropy over the scored tokens; token accuracy and F1 over the punctuation marks. Span
//! prediction: start and end logits over the passage; exact match and F1 (the tasks: `corpus_tasks`).
use anyhow::{bail, Context, Result};
use std::path::Path;
use std::time::Instant;
use tch::nn::{self, Module};
use tch::{Device, Kind, Tensor};

use crate::bert::{Bert, BertConfig};
use crate::config::{BertRunConfig, BertTask, Config, PretrainObjective};
use crate::corpus_tasks::{
    locate_examples, mark_f1, punctuation_examples, span_scores, word_pieces, Passage, SpanExamples,
    PUNCTUATION_CLASSES,
};
use crate::data::{TextData, IGNORE};
use crate::labelled::Email;
use crate::tokenize::{Special, TextTokenizer};
use crate::train::{optimise, CurvePoint, Evaluation, Objective, Progress, RunOutcome, StateFile};

/// The special-token ids the tasks need.
#[derive(Debug, Clone, Copy)]
pub struct Specials {
    pub cls: i64,
    pub sep: i64,
    pub pad: i64,
    pub mask: i64,
    /// Ids below this are special tokens (a trained vocabulary puts them first); never chosen or drawn.
    pub first_ordinary: i64,
}

impl Specials {
    pub fn of(t: &TextTokenizer) -> Result<Self> {
        let get = |s: Special| t.special(s).with_context(|| format!("the tokenizer has no {}", s.token()));
        let ids = [get(Special::Cls)?, get(Special::Sep)?, get(Special::Pad)?, get(Special::Mask)?];
        Ok(Self { cls: ids[0], sep: ids[1], pad: ids[2], mask: ids[3], first_ordinary: Special::ALL.len() as i64 })
    }
}

/// Masked-LM inputs and targets for token ids (B, N): `chosen` positions (B, N) bool — a `fraction` of the
/// positions where `eligible` — are predicted; the 80/10/10 rule (or all `<mask>`) decides their inputs.
/// Targets are the original ids at chosen positions and `IGNORE` elsewhere. Uses libtorch's generator.
pub fn mask_tokens(
    ids: &Tensor,
    eligible: &Tensor,
    fraction: f64,
    replace_rule: bool,
    specials: Specials,
    vocab: i64,
) -> (Tensor, Tensor) {
    let device = ids.device();
    let shape = ids.size();
    let u = Tensor::rand(shape.as_slice(), (Kind::Float, device));
    let chosen = u.lt(fraction).logical_and(eligible);
    let targets = ids.where_self(&chosen, &ids.full_like(IGNORE));
    let mask = ids.full_like(specials.mask);
    let inputs = if replace_rule {
        let r = Tensor::rand(shape.as_slice(), (Kind::Float, device));
        let random = Tensor::randint_low(specials.first_ordinary, vocab, shape.as_slice(), (Kind::Int64, device));
        // r < 0.8: <mask>; 0.8 ≤ r < 0.9: a random ordinary token; r ≥ 0.9: unchanged.
        let replaced = mask.where_self(&r.lt(0.8), &random.where_self(&r.lt(0.9), ids));
        replaced.where_self(&chosen, ids)
    } else {
        mask.where_self(&chosen, ids)
    };
    (inputs, targets)
}

/// BERT's MLM head: dense + GELU + LayerNorm, then logits against the (shared) word embeddings + a bias.
struct MlmHead {
    dense: nn::Linear,
    norm: nn::LayerNorm,
    bias: Tensor,
}

impl MlmHead {
    fn new(vs: &nn::Path, cfg: &BertConfig) -> Self {
        Self {
            dense: nn::linear(vs / "dense", cfg.hidden, cfg.hidden, Default::default()),
            norm: nn::layer_norm(
                vs / "norm",
                vec![cfg.hidden],
                nn::LayerNormConfig { eps: cfg.norm_eps, ..Default::default() },
            ),
            bias: vs.zeros("bias", &[cfg.vocab_size]),
        }
    }

    fn logits(&self, hidden: &Tensor, words: &Tensor) -> Tensor {
        self.norm.forward(&self.dense.forward(hidden).gelu("none")).matmul(&words.tr()) + &self.bias
    }
}

/// The encoder with its MLM head. With `causal` set the same model is a next-token predictor: attention
/// sees only earlier tokens, and the targets (see [`next_token_targets`]) are the following tokens.
pub struct MaskedLm {
    pub bert: Bert,
    head: MlmHead,
    pub causal: bool,
}

impl MaskedLm {
    pub fn new(vs: &nn::Path, cfg: &BertConfig) -> Self {
        Self { bert: Bert::new(&(vs / "bert"), cfg), head: MlmHead::new(&(vs / "mlm"), cfg), causal: false }
    }

    /// Mean cross-entropy over the predicted positions, their logits (M, V) and their targets (M). The head
    /// runs on the chosen positions only (15% of them): the others have no loss, so their logits would be
    /// wasted work — the vocabulary projection is the head's largest matmul.
    pub fn loss(&self, inputs: &Tensor, targets: &Tensor, train: bool) -> (Tensor, Tensor, Tensor) {
        let hidden = self.bert.forward_with(inputs, None, None, self.causal, train);
        let d = hidden.size()[2];
        let flat_targets = targets.reshape([-1]);
        let chosen = flat_targets.ne(IGNORE).nonzero().squeeze_dim(1);
        let picked = hidden.reshape([-1, d]).index_select(0, &chosen);
        let targets = flat_targets.index_select(0, &chosen);
        let logits = self.head.logits(&picked, self.bert.word_embeddings()).to_kind(Kind::Float);
        (logits.cross_entropy_for_logits(&targets), logits, targets)
    }
}

/// Windows of `block − 2` corpus tokens, framed as `<cls> … <sep>`.
fn framed_windows(ids: &Tensor, starts: &Tensor, block: i64, s: Specials) -> Tensor {
    let inner = block - 2;
    let offsets = Tensor::arange(inner, (Kind::Int64, Device::Cpu));
    let idx = starts.unsqueeze(1) + offsets.unsqueeze(0);
    let rows = ids.index_select(0, &idx.view([-1])).view([starts.size()[0], inner]);
    let b = starts.size()[0];
    let cls = Tensor::full([b, 1], s.cls, (Kind::Int64, Device::Cpu));
    let sep = Tensor::full([b, 1], s.sep, (Kind::Int64, Device::Cpu));
    Tensor::cat(&[cls, rows, sep], 1)
}

/// Next-token targets of windows (B, N): position i predicts token i + 1; the last position and special
/// targets (the closing `<sep>`) are `IGNORE`, so both objectives predict ordinary tokens only.
pub fn next_token_targets(windows: &Tensor, first_ordinary: i64) -> Tensor {
    let n = windows.size()[1];
    let next = Tensor::cat(&[windows.narrow(1, 1, n - 1), windows.narrow(1, 0, 1).full_like(IGNORE)], 1);
    next.where_self(&next.ge(first_ordinary), &next.full_like(IGNORE))
}

/// Pre-training on the corpus: masked-LM, or next-token prediction with the same encoder and head.
struct Pretraining<'a> {
    model: &'a MaskedLm,
    data: &'a TextData,
    /// Fixed held-out (inputs, targets): the masking is drawn once, so every evaluation scores the same.
    val: Vec<(Tensor, Tensor)>,
    cfg: &'a BertRunConfig,
    specials: Specials,
    vocab: i64,
    batch: i64,
    block: i64,
    device: Device,
}

impl Pretraining<'_> {
    /// Inputs and targets of windows, masking `fraction` of the tokens for the masked objective.
    fn inputs_and_targets(&self, windows: &Tensor, fraction: f64) -> (Tensor, Tensor) {
        let (x, y) = match self.cfg.objective {
            PretrainObjective::Masked => {
                let eligible = windows.ge(self.specials.first_ordinary);
                mask_tokens(windows, &eligible, fraction, self.cfg.replace_rule, self.specials, self.vocab)
            }
            PretrainObjective::NextToken => {
                (windows.shallow_clone(), next_token_targets(windows, self.specials.first_ordinary))
            }
        };
        (x.to_device(self.device), y.to_device(self.device))
    }

    /// Tokens that carry loss per window: the chosen fraction of the ordinary ones, or all of them.
    fn predicted_per_window(&self) -> f64 {
        let ordinary = (self.block - 2) as f64;
        match self.cfg.objective {
            PretrainObjective::Masked => ordinary * self.cfg.mask_fraction,
            PretrainObjective::NextToken => ordinary,
        }
    }
}

impl Objective for Pretraining<'_> {
    fn training_loss(&self) -> Tensor {
        let n = self.data.train.numel() as i64;
        let starts = Tensor::randint(n - self.block, [self.batch], (Kind::Int64, Device::Cpu));
        let windows = framed_windows(&self.data.train, &starts, self.block, self.specials);
        let (x, y) = self.inputs_and_targets(&windows, self.cfg.mask_fraction);
        self.model.loss(&x, &y, true).0
    }

    fn evaluate(&self, step: i64, curves: &mut Vec<CurvePoint>) -> Evaluation {
        let _guard = tch::no_grad_guard();
        let (mut loss, mut correct, mut count) = (0.0, 0.0, 0.0);
        for (x, y) in &self.val {
            let (l, logits, targets) = self.model.loss(x, y, false);
            let n = targets.size()[0] as f64;
            loss += l.double_value(&[]) * n;
            let right = logits.argmax(-1, false).eq_tensor(&targets);
            correct += right.to_kind(Kind::Float).sum(Kind::Float).double_value(&[]);
            count += n;
        }
        let e = Evaluation { loss: loss / count, accuracy: correct / count };
        e.record(step, curves);
        if self.cfg.objective == PretrainObjective::Masked {
            curves.push(CurvePoint::new(step, "val", "mlm_loss", e.loss));
            curves.push(CurvePoint::new(step, "val", "mlm_accuracy", e.accuracy));
        }
        // The data-efficiency axes: tokens read, and tokens that carried loss (the expected count).
        let windows = (step * self.batch) as f64;
        curves.push(CurvePoint::new(step, "val", "tokens_seen", windows * self.block as f64));
        curves.push(CurvePoint::new(step, "val", "tokens_predicted", windows * self.predicted_per_window()));
        e
    }
}

/// Labelled rows as model inputs: ids and padding (N, block); labels (N) for a sequence task, or (N, block)
/// with `IGNORE` at unscored tokens for a token task.
pub struct Labelled {
    pub ids: Tensor,
    pub padding: Tensor,
    pub labels: Tensor,
}

impl Labelled {
    pub fn len(&self) -> i64 {
        self.ids.size()[0]
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Rows `idx` on `device`.
    fn rows(&self, idx: &Tensor, device: Device) -> Self {
        let pick = |t: &Tensor| t.index_select(0, idx).to_device(device);
        Self { ids: pick(&self.ids), padding: pick(&self.padding), labels: pick(&self.labels) }
    }
}

/// `<cls> text <sep>` rows padded (or cut) to `block`.
pub fn encode_labelled(tokenizer: &TextTokenizer, texts: &[&str], labels: &[i64], block: i64) -> Result<Labelled> {
    let s = Specials::of(tokenizer)?;
    let encoded = tokenizer.encode_lines(texts)?;
    let mut ids = Vec::with_capacity(texts.len() * block as usize);
    let mut real = Vec::with_capacity(ids.capacity());
    for tokens in encoded {
        let n = tokens.len().min(block as usize - 2);
        let row: Vec<i64> =
            std::iter::once(s.cls).chain(tokens[..n].iter().copied()).chain(std::iter::once(s.sep)).collect();
        real.extend((0..block as usize).map(|j| j < row.len()));
        ids.extend(row.iter().copied().chain(std::iter::repeat(s.pad)).take(block as usize));
    }
    let n = texts.len() as i64;
    Ok(Labelled {
        ids: Tensor::from_slice(&ids).view([n, block]),
        padding: Tensor::from_slice(&real).view([n, block]),
        labels: Tensor::from_slice(labels),
    })
}

/// The SpamAssassin split as (train, test) inputs; label 1 is spam.
pub fn spam_inputs(emails: &[Email], tokenizer: &TextTokenizer, block: i64) -> Result<(Labelled, Labelled)> {
    let split = |test: bool| {
        let chosen: Vec<&Email> = emails.iter().filter(|e| e.test == test).collect();
        let texts: Vec<&str> = chosen.iter().map(|e| e.text.as_str()).collect();
        let labels: Vec<i64> = chosen.iter().map(|e| i64::from(e.spam)).collect();
        encode_labelled(tokenizer, &texts, &labels, block)
    };
    Ok((split(false)?, split(true)?))
}

/// A sequence classifier: BERT's pooled `<cls>` state, dropout, a linear layer (one logit for two classes).
pub struct SequenceClassifier {
    head: nn::Linear,
    classes: i64,
    dropout: f64,
}

impl SequenceClassifier {
    pub fn new(vs: &nn::Path, hidden: i64, classes: i64, dropout: f64) -> Self {
        let outputs = if classes == 2 { 1 } else { classes };
        Self { head: nn::linear(vs / "classifier", hidden, outputs, Default::default()), classes, dropout }
    }

    /// Logits: (B) for two classes, (B, C) otherwise.
    pub fn logits(&self, bert: &Bert, ids: &Tensor, padding: &Tensor, train: bool) -> Tensor {
        let hidden = bert.forward(ids, None, Some(padding), train);
        let logits = self.head.forward(&bert.pooled(&hidden).dropout(self.dropout, train)).to_kind(Kind::Float);
        if self.classes == 2 {
            logits.squeeze_dim(-1)
        } else {
            logits
        }
    }

    /// Sigmoid + binary cross-entropy for two classes, softmax + cross-entropy for more.
    pub fn loss(&self, logits: &Tensor, labels: &Tensor) -> Tensor {
        if self.classes == 2 {
            logits.binary_cross_entropy_with_logits::<Tensor>(
                &labels.to_kind(Kind::Float),
                None,
                None,
                tch::Reduction::Mean,
            )
        } else {
            logits.cross_entropy_for_logits(labels)
        }
    }

    pub fn predict(&self, logits: &Tensor) -> Tensor {
        if self.classes == 2 {
            logits.gt(0.0).to_kind(Kind::Int64)
        } else {
            logits.argmax(-1, false)
        }
    }
}

/// Token classification: a linear layer over every final hidden state (per-token softmax).
pub struct TokenClassifier {
    head: nn::Linear,
    dropout: f64,
}

impl TokenClassifier {
    pub fn new(vs: &nn::Path, hidden: i64, classes: i64, dropout: f64) -> Self {
        Self { head: nn::linear(vs / "tagger", hidden, classes, Default::default()), dropout }
    }

    /// Logits (B, N, C).
    pub fn logits(&self, bert: &Bert, ids: &Tensor, padding: &Tensor, train: bool) -> Tensor {
        let hidden = bert.forward(ids, None, Some(padding), train);
        self.head.forward(&hidden.dropout(self.dropout, train)).to_kind(Kind::Float)
    }

    /// Mean cross-entropy over the scored tokens (labels not `IGNORE`).
    pub fn loss(logits: &Tensor, labels: &Tensor) -> Tensor {
        let c = logits.size()[2];
        logits.view([-1, c]).cross_entropy_loss::<Tensor>(&labels.view([-1]), None, tch::Reduction::Mean, IGNORE, 0.0)
    }
}

/// Span prediction (BERT's SQuAD head): one start and one end logit per token, softmax over the passage.
pub struct SpanPredictor {
    head: nn::Linear,
    /// The longest answer considered when decoding, in tokens.
    pub max_tokens: i64,
}

impl SpanPredictor {
    pub fn new(vs: &nn::Path, hidden: i64, max_tokens: i64) -> Self {
        Self { head: nn::linear(vs / "span", hidden, 2, Default::default()), max_tokens }
    }

    /// Start and end logits (B, N), −∞ outside the passage (`context`).
    pub fn logits(&self, bert: &Bert, x: &SpanBatch, train: bool) -> (Tensor, Tensor) {
        let hidden = bert.forward(&x.ids, Some(&x.segments), Some(&x.padding), train);
        let both = self.head.forward(&hidden).to_kind(Kind::Float);
        let outside = x.context.logical_not();
        let pick = |i: i64| both.select(2, i).masked_fill(&outside, f64::NEG_INFINITY);
        (pick(0), pick(1))
    }

    /// The mean of the start and end cross-entropies.
    pub fn loss(start_logits: &Tensor, end_logits: &Tensor, start: &Tensor, end: &Tensor) -> Tensor {
        (start_logits.cross_entropy_for_logits(start) + end_logits.cross_entropy_for_logits(end)) / 2.0
    }

    /// The best span (start ≤ end, at most `max_tokens` long) of each row by start + end logit.
    pub fn best_spans(&self, start_logits: &Tensor, end_logits: &Tensor) -> Vec<(i64, i64)> {
        let n = start_logits.size()[1];
        let scores = start_logits.unsqueeze(2) + end_logits.unsqueeze(1);
        let i = Tensor::arange(n, (Kind::Int64, scores.device()));
        let length = i.unsqueeze(0) - i.unsqueeze(1);
        let allowed = length.ge(0).logical_and(&length.lt(self.max_tokens));
        let best = scores.masked_fill(&allowed.logical_not(), f64::NEG_INFINITY).view([-1, n * n]).argmax(-1, false);
        Vec::<i64>::try_from(best.to_device(Device::Cpu)).unwrap_or_default().iter().map(|b| (b / n, b % n)).collect()
    }
}

/// A batch of span rows on the device, with their answers' start and end positions.
pub struct SpanBatch {
    pub ids: Tensor,
    pub segments: Tensor,
    pub padding: Tensor,
    pub context: Tensor,
    pub start: Tensor,
    pub end: Tensor,
}

impl SpanBatch {
    fn rows(x: &SpanExamples, idx: &Tensor, device: Device) -> Self {
        let pick = |t: &Tensor| t.index_select(0, idx).to_device(device);
        Self {
            ids: pick(&x.ids),
            segments: pick(&x.segments),
            padding: pick(&x.padding),
            context: pick(&x.context),
            start: pick(&x.start),
            end: pick(&x.end),
        }
    }
}

/// F1 of class 1 from predictions and labels (0 when nothing is predicted or present as class 1).
pub fn f1_score(predicted: &Tensor, labels: &Tensor) -> f64 {
    let p = predicted.eq(1);
    let l = labels.eq(1);
    let count = |t: Tensor| t.to_kind(Kind::Float).sum(Kind::Float).double_value(&[]);
    let tp = count(p.logical_and(&l));
    let (fp, fn_) = (count(p.logical_and(&l.logical_not())), count(p.logical_not().logical_and(&l)));
    if tp == 0.0 {
        0.0
    } else {
        2.0 * tp / (2.0 * tp + fp + fn_)
    }
}

/// Test rows per evaluation batch.
const EVAL_BATCH: i64 = 128;

/// `batch` random row indices out of `n` (libtorch's generator, seeded per step by the loop).
fn random_rows(n: i64, batch: i64) -> Tensor {
    Tensor::randint(n, [batch], (Kind::Int64, Device::Cpu))
}

/// The indices of `n` test rows, in evaluation batches.
fn eval_batches(n: i64) -> impl Iterator<Item = Tensor> {
    (0..n)
        .step_by(EVAL_BATCH as usize)
        .map(move |start| Tensor::arange_start(start, (start + EVAL_BATCH).min(n), (Kind::Int64, Device::Cpu)))
}

struct Classification<'a> {
    bert: &'a Bert,
    classifier: &'a SequenceClassifier,
    train: &'a Labelled,
    test: &'a Labelled,
    batch: i64,
    device: Device,
    scores: &'a TaskScores,
}

impl Objective for Classification<'_> {
    fn training_loss(&self) -> Tensor {
        let b = self.train.rows(&random_rows(self.train.len(), self.batch), self.device);
        let logits = self.classifier.logits(self.bert, &b.ids, &b.padding, true);
        self.classifier.loss(&logits, &b.labels)
    }

    fn evaluate(&self, step: i64, curves: &mut Vec<CurvePoint>) -> Evaluation {
        let _guard = tch::no_grad_guard();
        let n = self.test.len();
        let (mut loss, mut predictions) = (0.0, Vec::new());
        for idx in eval_batches(n) {
            let b = self.test.rows(&idx, self.device);
            let logits = self.classifier.logits(self.bert, &b.ids, &b.padding, false);
            loss += self.classifier.loss(&logits, &b.labels).double_value(&[]) * idx.size()[0] as f64;
            predictions.push(self.classifier.predict(&logits).to_device(Device::Cpu));
        }
        let predicted = Tensor::cat(&predictions, 0);
        let accuracy = predicted.eq_tensor(&self.test.labels).to_kind(Kind::Float).mean(Kind::Float).double_value(&[]);
        let f1 = f1_score(&predicted, &self.test.labels);
        self.scores.f1.set(f1);
        let e = Evaluation { loss: loss / n as f64, accuracy };
        e.record(step, curves);
        curves.push(CurvePoint::new(step, "val", "f1", f1));
        e
    }
}

/// What a fine-tuning evaluation found besides loss and accuracy (read after the last one).
#[derive(Default)]
struct TaskScores {
    f1: std::cell::Cell<f64>,
    exact_match: std::cell::Cell<f64>,
}

/// Punctuation restoration: token classification of the corpus's words.
struct Tagging<'a> {
    bert: &'a Bert,
    tagger: &'a TokenClassifier,
    train: &'a Labelled,
    test: &'a Labelled,
    batch: i64,
    device: Device,
    scores: &'a TaskScores,
}

impl Objective for Tagging<'_> {
    fn training_loss(&self) -> Tensor {
        let b = self.train.rows(&random_rows(self.train.len(), self.batch), self.device);
        let logits = self.tagger.logits(self.bert, &b.ids, &b.padding, true);
        TokenClassifier::loss(&logits, &b.labels)
    }

    fn evaluate(&self, step: i64, curves: &mut Vec<CurvePoint>) -> Evaluation {
        let _guard = tch::no_grad_guard();
        let (mut loss, mut scored, mut predictions) = (0.0, 0.0, Vec::new());
        for idx in eval_batches(self.test.len()) {
            let b = self.test.rows(&idx, self.device);
            let logits = self.tagger.logits(self.bert, &b.ids, &b.padding, false);
            let count = b.labels.ne(IGNORE).sum(Kind::Float).double_value(&[]);
            loss += TokenClassifier::loss(&logits, &b.labels).double_value(&[]) * count;
            scored += count;
            predictions.push(logits.argmax(-1, false).to_device(Device::Cpu));
        }
        let predicted = Tensor::cat(&predictions, 0);
        let labels = &self.test.labels;
        let mask = labels.ne(IGNORE);
        let right = predicted.eq_tensor(labels).logical_and(&mask).sum(Kind::Float).double_value(&[]);
        let f1 = mark_f1(&predicted, labels);
        self.scores.f1.set(f1);
        let e = Evaluation { loss: loss / scored.max(1.0), accuracy: right / scored.max(1.0) };
        e.record(step, curves);
        curves.push(CurvePoint::new(step, "val", "f1", f1));
        e
    }
}

/// Phrase location: span prediction over a passage.
struct Locating<'a> {
    bert: &'a Bert,
    span: &'a SpanPredictor,
    train: &'a SpanExamples,
    test: &'a SpanExamples,
    batch: i64,
    device: Device,
    scores: &'a TaskScores,
}

impl Objective for Locating<'_> {
    fn training_loss(&self) -> Tensor {
        let b = SpanBatch::rows(self.train, &random_rows(self.train.ids.size()[0], self.batch), self.device);
        let (s, e) = self.span.logits(self.bert, &b, true);
        SpanPredictor::loss(&s, &e, &b.start, &b.end)
    }

    fn evaluate(&self, step: i64, curves: &mut Vec<CurvePoint>) -> Evaluation {
        let _guard = tch::no_grad_guard();
        let n = self.test.ids.size()[0];
        let (mut loss, mut predicted) = (0.0, Vec::new());
        for idx in eval_batches(n) {
            let b = SpanBatch::rows(self.test, &idx, self.device);
            let (s, e) = self.span.logits(self.bert, &b, false);
            let l = SpanPredictor::loss(&s, &e, &b.start, &b.end);
            loss += l.double_value(&[]) * idx.size()[0] as f64;
            predicted.extend(self.span.best_spans(&s, &e));
        }
        let starts = Vec::<i64>::try_from(&self.test.start).unwrap_or_default();
        let ends = Vec::<i64>::try_from(&self.test.end).unwrap_or_default();
        let gold: Vec<(i64, i64)> = starts.into_iter().zip(ends).collect();
        let (exact, f1) = span_scores(&predicted, &gold);
        self.scores.f1.set(f1);
        self.scores.exact_match.set(exact);
        let e = Evaluation { loss: loss / n.max(1) as f64, accuracy: exact };
        e.record(step, curves);
        curves.push(CurvePoint::new(step, "val", "f1", f1));
        curves.push(CurvePoint::new(step, "val", "exact_match", exact));
        e
    }
}

/// A finished BERT run.
pub struct TrainedBert {
    pub outcome: RunOutcome,
    pub vs: nn::VarStore,
}

/// The state file of a run's pre-training phase, next to the run's own.
fn pretrain_state(state: Option<&StateFile>) -> Option<StateFile> {
    state.map(|s| StateFile {
        path: s.path.with_file_name(
            s.path.file_name().map(|n| n.to_string_lossy().replace(".state.", ".pretrain.state.")).unwrap_or_default(),
        ),
        config_hash: s.config_hash.clone(),
    })
}

/// Copies a checkpoint's encoder weights (`bert.*`, and the MLM head when present) into `vs`.
pub fn init_from(vs: &nn::VarStore, path: &Path) -> Result<()> {
    let stored: std::collections::HashMap<String, Tensor> = Tensor::read_safetensors(path)
        .with_context(|| format!("bert.init_from: reading {}", path.display()))?
        .into_iter()
        .collect();
    // In name order, so a mismatch is reported the same way every time (the store's map has no order).
    let variables: std::collections::BTreeMap<String, Tensor> = vs.variables().into_iter().collect();
    tch::no_grad(|| -> Result<()> {
        for (name, mut var) in variables {
            if !(name.starts_with("bert.") || name.starts_with("mlm.")) {
                continue;
            }
            let saved = stored.get(&name).with_context(|| {
                format!(
                    "bert.init_from: {} has no {name}: was it saved by a BERT run of the same model?",
                    path.display()
                )
            })?;
            if saved.size() != var.size() {
                bail!(
                    "bert.init_from: {name} is {:?} in {}, this run's model needs {:?}",
                    saved.size(),
                    path.display(),
                    var.size()
                );
            }
            var.copy_(saved);
        }
        Ok(())
    })
}

/// The head a BERT run fine-tunes (none for pre-training alone).
pub enum TaskHead {
    None,
    Sequence(SequenceClassifier),
    Tokens(TokenClassifier),
    Span(SpanPredictor),
}

/// The longest answer the location task decodes, in tokens (5 words rarely take more than 12).
const MAX_ANSWER_TOKENS: i64 = 24;

/// A BERT run's model: the encoder with its pre-training head (causal for `next_token`) and its task head,
/// under `vs` exactly as training builds it (so `ablate describe` counts the same parameters).
pub fn build_model(vs: &nn::Path, cfg: &Config, vocab: i64) -> (MaskedLm, TaskHead) {
    let b = cfg.bert.as_ref().expect("a BERT run");
    let bert_cfg = BertConfig::from_model(&cfg.model, vocab);
    let mut mlm = MaskedLm::new(vs, &bert_cfg);
    mlm.causal = b.objective == PretrainObjective::NextToken;
    let (task, hidden, dropout) = (vs / "task", bert_cfg.hidden, cfg.model.dropout);
    let head = match b.task {
        BertTask::Pretrain => TaskHead::None,
        BertTask::Spam => TaskHead::Sequence(SequenceClassifier::new(&task, hidden, 2, dropout)),
        BertTask::Punctuation => {
            TaskHead::Tokens(TokenClassifier::new(&task, hidden, PUNCTUATION_CLASSES.len() as i64, dropout))
        }
        BertTask::Locate => TaskHead::Span(SpanPredictor::new(&task, hidden, MAX_ANSWER_TOKENS)),
    };
    (mlm, head)
}

/// Fine-tuning examples of the corpus tasks held out like the corpus: this many test rows, evenly spaced.
const TASK_TEST_ROWS: usize = 1024;

/// The corpus's word pieces for the generated tasks, split where `TextData` splits the text.
fn task_pieces(cfg: &Config) -> Result<(Vec<Passage>, Vec<Passage>)> {
    let text = crate::data::load_text(&cfg.data)?;
    let (train, test) = crate::data::split_text(&text, cfg.data.val_fraction);
    let own = |t: &str| -> Vec<Passage> {
        word_pieces(t).into_iter().map(|w| w.into_iter().map(str::to_string).collect()).collect()
    };
    let test = own(test);
    let step = (test.len() / TASK_TEST_ROWS).max(1);
    Ok((own(train), test.into_iter().step_by(step).take(TASK_TEST_ROWS).collect()))
}

/// Trains a BERT run: the pre-training objective on `data` (the whole run for `task: pretrain`, else
/// `pretrain_steps` first), then the task. `emails` are needed for `task: spam`.
pub fn train_bert(
    cfg: &Config,
    data: &TextData,
    emails: Option<&[Email]>,
    device: Device,
    progress: Progress,
    state: Option<&StateFile>,
) -> Result<TrainedBert> {
    let b = cfg.bert.as_ref().expect("a BERT run");
    let t = &cfg.train;
    let started = Instant::now();
    let specials = Specials::of(&data.tokenizer)?;
    let vocab = data.tokenizer.vocab_size();
    let block = cfg.model.block_size;
    if data.train.numel() as i64 <= block || data.val.numel() as i64 <= block {
        bail!("the corpus splits need more than model.block_size = {block} tokens");
    }
    tch::manual_seed(t.seed as i64);
    let mut vs = nn::VarStore::new(device);
    let (mlm, head) = build_model(&vs.root(), cfg, vocab);
    if let Some(path) = &b.init_from {
        init_from(&vs, Path::new(path))?;
    }
    // Held-out windows, evenly spaced, masked once with a fixed seed.
    tch::manual_seed(0x3a5c);
    let count = t.eval_batches * t.batch_size;
    let span = data.val.numel() as i64 - block;
    let starts: Vec<i64> = (0..count).map(|i| i * span / count.max(1)).collect();
    let val_windows = framed_windows(&data.val, &Tensor::from_slice(&starts), block, specials);
    let mut pretraining =
        Pretraining { model: &mlm, data, val: Vec::new(), cfg: b, specials, vocab, batch: t.batch_size, block, device };
    let eval_fraction = b.eval_mask_fraction.unwrap_or(b.mask_fraction);
    pretraining.val =
        val_windows.split(t.batch_size, 0).iter().map(|w| pretraining.inputs_and_targets(w, eval_fraction)).collect();
    tch::manual_seed(t.seed as i64);

    let (mut tokens_seen, mut train_time) = (0i64, 0.0);
    let mut curves = Vec::new();
    let mut pretrained_eval: Option<Evaluation> = None;
    let phase_tokens = t.batch_size * block;
    let scores = TaskScores::default();
    scores.f1.set(f64::NAN);
    scores.exact_match.set(f64::NAN);
    let mut run = 'phases: {
        if matches!(head, TaskHead::None) {
            break 'phases optimise(t, &pretraining, &mut vs, device, progress, state)?;
        }
        if b.pretrain_steps > 0 {
            let pre = crate::config::TrainConfig { steps: b.pretrain_steps, lr: b.pretrain_lr, ..t.clone() };
            let mut quiet = |_: i64, _: f64| {};
            let mut run = optimise(&pre, &pretraining, &mut vs, device, &mut quiet, pretrain_state(state).as_ref())?;
            for c in run.curves.iter_mut() {
                c.split = format!("pretrain_{}", c.split);
            }
            if run.diverged_at.is_some() {
                // Recorded like any diverged run (the sweep goes on); there is nothing to fine-tune.
                progress(t.steps, run.last_loss);
                break 'phases run;
            }
            tokens_seen += run.steps_done * phase_tokens;
            train_time += run.train_time;
            curves.append(&mut run.curves);
            pretrained_eval = Some(run.final_eval);
        }
        let (bert, batch) = (&mlm.bert, t.batch_size);
        match &head {
            TaskHead::None => unreachable!("pre-training runs returned above"),
            TaskHead::Sequence(classifier) => {
                let emails = emails.context("task spam needs the SpamAssassin emails")?;
                let (train, test) = spam_inputs(emails, &data.tokenizer, block)?;
                let task =
                    Classification { bert, classifier, train: &train, test: &test, batch, device, scores: &scores };
                optimise(t, &task, &mut vs, device, progress, state)?
            }
            TaskHead::Tokens(tagger) => {
                let (train, test) = task_pieces(cfg)?;
                let examples = |p: &[Passage]| punctuation_examples(&data.tokenizer, p, block, specials);
                let (train, test) = (examples(&train)?, examples(&test)?);
                let task = Tagging { bert, tagger, train: &train, test: &test, batch, device, scores: &scores };
                optimise(t, &task, &mut vs, device, progress, state)?
            }
            TaskHead::Span(span) => {
                let (train, test) = task_pieces(cfg)?;
                let examples = |p: &[Passage], key: u64| locate_examples(&data.tokenizer, p, block, specials, key);
                let (train, test) = (examples(&train, 1)?, examples(&test, 2)?);
                if train.start.numel() == 0 || test.start.numel() == 0 {
                    bail!("task locate: no passage of the corpus has a phrase that fits model.block_size = {block}");
                }
                let task = Locating { bert, span, train: &train, test: &test, batch, device, scores: &scores };
                optimise(t, &task, &mut vs, device, progress, state)?
            }
        }
    };
    tokens_seen += run.steps_done * phase_tokens;
    train_time += run.train_time;
    curves.extend(std::mem::take(&mut run.curves));
    let pretrained = pretrained_eval.is_some();
    let pretraining_only = matches!(head, TaskHead::None);
    // The masked-LM columns: the pre-training's last held-out evaluation (a next-token run's is its val_loss).
    let mlm_eval = match (b.objective, pretraining_only) {
        (PretrainObjective::NextToken, _) => None,
        (PretrainObjective::Masked, true) => Some(run.final_eval.clone()),
        (PretrainObjective::Masked, false) => pretrained_eval,
    };
    let tokens_per_s = tokens_seen as f64 / train_time.max(1e-9);
    // Training FLOPs per token as for the decoder (6 per matmul weight, 12·L·T·d for attention), with the
    // embedding tables as lookups and the vocabulary projection paid only at the predicted positions.
    let m = &cfg.model;
    let tables = vocab * m.d_model + block * m.d_model + 2 * m.d_model + vocab;
    let encoder = 6.0 * (run.params - tables) as f64 + 12.0 * (m.layers * block * m.d_model) as f64;
    let head_flops = 6.0 * pretraining.predicted_per_window() / block as f64 * (vocab * m.d_model) as f64;
    let pretraining_tokens = match (pretraining_only, pretrained) {
        (true, _) => tokens_seen,
        (false, true) => b.pretrain_steps * phase_tokens,
        (false, false) => 0,
    };
    let flops = tokens_seen as f64 * encoder + pretraining_tokens as f64 * head_flops;
    let model_flops = flops / train_time.max(1e-9);
    let mut extra_metrics = vec![
        mlm_eval.as_ref().map_or(f64::NAN, |e| e.loss),
        mlm_eval.as_ref().map_or(f64::NAN, |e| e.accuracy),
        scores.f1.get(),
    ];
    if b.task == BertTask::Locate {
        extra_metrics.push(scores.exact_match.get());
    }
    let outcome = RunOutcome {
        curves,
        extra_metrics,
        ..run.into_outcome(started, tokens_per_s, model_flops, device, t.precision)
    };
    Ok(TrainedBert { outcome, vs })
}
