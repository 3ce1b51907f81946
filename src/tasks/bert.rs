//! kind bert: BERT (UDL §12.6) trained by masked-LM pre-training on the corpus (§12.6.1), then fine-tuning
//! a head on a labelled task (§12.6.2), each phase through the shared optimisation loop.
//!
//! Masked LM: windows of the corpus become `<cls> tokens <sep>`; `mask_fraction` of the ordinary tokens are
//! chosen, and (with the 80/10/10 rule) 80% of those become `<mask>`, 10% a random token, 10% stay. The
//! loss is cross-entropy at the chosen positions only. The MLM head is BERT's: dense + GELU + LayerNorm,
//! then the word embedding matrix (shared; `transformer.tie_embeddings: false` gives it its own) plus a bias.
//!
//! Next-token prediction (`objective: next_token`) is the same encoder and head with causal attention, each
//! position predicting the following token: the GPT objective, for comparing data efficiency. Its
//! fine-tuning stays causal (Devlin et al. 2019's left-to-right ablation): the sequence head reads the last
//! real token, the only one that has seen the whole text.
//!
//! Sequence classification: `<cls> text <sep>` padded to the block; the head reads BERT's pooled `<cls>`
//! state. Two classes use one logit with sigmoid / binary cross-entropy, more use softmax / cross-entropy.
//! Metrics: accuracy and F1 of the positive class. Token classification: a linear layer on every hidden
//! state, cross-entropy over the scored tokens; token accuracy and F1 over the punctuation marks. Span
//! prediction: start and end logits over the passage; exact match and F1 (the tasks: `corpus_tasks`).
use crate::transformer::layers::softcap;
use anyhow::{bail, Context, Result};
use std::path::Path;
use std::time::Instant;
use tch::nn::{self, Module};
use tch::{Device, Kind, Tensor};

use super::{Built, DataCache, RunContext, Task, Trained};
use crate::data::corpus_tasks::{
    locate_examples, mark_f1, punctuation_examples, span_scores, word_pieces, Labelled, Passage, SpanExamples,
    Specials, PUNCTUATION_CLASSES,
};
use crate::data::spam::spam_inputs;
use crate::data::{Dataset, HeldOut, TextData, IGNORE};
use crate::metrics::{self, Metric};
use crate::models::bert::{Bert as Encoder, BertInputs, BertSpec};
use crate::recipe::{BertConfig, BertTask, Config, PretrainObjective};
use crate::train::distributed::{self, sum_over_share, BatchShard};
use crate::train::{optimise, optimise_phase, Evaluation, Objective, Optimised, StateFile};
use crate::transformer::layers::Pass;

pub struct Bert;

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

/// BERT's MLM head: dense + GELU + LayerNorm, then logits against the word embeddings (tied) or its own
/// output matrix, plus a bias.
struct MlmHead {
    dense: nn::Linear,
    norm: nn::LayerNorm,
    /// `None` when tied to the word embeddings.
    decoder: Option<Tensor>,
    bias: Tensor,
    /// `transformer.logit_softcap`.
    softcap: Option<f64>,
}

impl MlmHead {
    fn new(vs: &nn::Path, spec: &BertSpec) -> Self {
        let d = spec.transformer.d_model;
        Self {
            dense: nn::linear(vs / "dense", d, d, Default::default()),
            norm: nn::layer_norm(
                vs / "norm",
                vec![d],
                nn::LayerNormConfig { eps: spec.norm_eps, ..Default::default() },
            ),
            decoder: (!spec.transformer.tie_embeddings)
                .then(|| vs.var("decoder", &[spec.vocab_size, d], nn::Init::Randn { mean: 0.0, stdev: 0.02 })),
            bias: vs.zeros("bias", &[spec.vocab_size]),
            softcap: spec.transformer.logit_softcap,
        }
    }

    fn logits(&self, hidden: &Tensor, words: &Tensor) -> Tensor {
        let out = self.decoder.as_ref().unwrap_or(words);
        let logits = self.norm.forward(&self.dense.forward(hidden).gelu("none")).matmul(&out.tr()) + &self.bias;
        softcap(logits, self.softcap)
    }
}

/// The encoder with its MLM head. With a causal encoder (`bert.causal`) the same model is a next-token
/// predictor: attention sees only earlier tokens, and the targets (see [`next_token_targets`]) are the following tokens. With
/// `nsp` it also classifies whether a pair's second segment follows its first (BERT's next-sentence head:
/// a linear layer on the pooled `<cls>` state).
pub struct MaskedLm {
    pub bert: Encoder,
    head: MlmHead,
    pub nsp: Option<nn::Linear>,
}

/// The two losses of a masked-LM + next-sentence batch, with what scoring needs.
pub struct PairLoss {
    pub mlm: Tensor,
    pub mlm_logits: Tensor,
    pub mlm_targets: Tensor,
    pub nsp: Tensor,
    /// (B, 2): not-next, next.
    pub nsp_logits: Tensor,
}

impl MaskedLm {
    pub fn new(vs: &nn::Path, spec: &BertSpec) -> Self {
        Self { bert: Encoder::new(&(vs / "bert"), spec), head: MlmHead::new(&(vs / "mlm"), spec), nsp: None }
    }

    /// Logits (B, N, V) of the head at every position of `inputs` (B, N).
    pub fn logits(&self, inputs: &Tensor, train: bool) -> Tensor {
        let hidden = self.bert.forward(inputs, BertInputs::default(), train);
        self.head.logits(&hidden, self.bert.word_embeddings())
    }

    /// Mean cross-entropy over the predicted positions, their logits (M, V) and their targets (M).
    pub fn loss(&self, inputs: &Tensor, targets: &Tensor, train: bool) -> (Tensor, Tensor, Tensor) {
        let hidden = self.bert.forward(inputs, BertInputs::default(), train);
        self.predicted_loss(&hidden, targets)
    }

    /// The head runs on the chosen positions only (15% of them): the others have no loss, so their logits
    /// would be wasted work — the vocabulary projection is the head's largest matmul.
    fn predicted_loss(&self, hidden: &Tensor, targets: &Tensor) -> (Tensor, Tensor, Tensor) {
        let d = hidden.size()[2];
        let flat_targets = targets.reshape([-1]);
        let chosen = flat_targets.ne(IGNORE).nonzero().squeeze_dim(1);
        let picked = hidden.reshape([-1, d]).index_select(0, &chosen);
        let targets = flat_targets.index_select(0, &chosen);
        let logits = self.head.logits(&picked, self.bert.word_embeddings()).to_kind(Kind::Float);
        (logits.cross_entropy_for_logits(&targets), logits, targets)
    }

    /// Masked-LM and next-sentence losses of segment pairs `inputs` (B, N) with their `segments` (B, N) and
    /// whether each second segment follows its first, `follows` (B) int64 1 / 0. Needs the `nsp` head.
    pub fn pair_loss(
        &self,
        inputs: &Tensor,
        segments: &Tensor,
        targets: &Tensor,
        follows: &Tensor,
        train: bool,
    ) -> PairLoss {
        let nsp_head = self.nsp.as_ref().expect("pair_loss needs the next-sentence head");
        let hidden = self.bert.forward(inputs, BertInputs { segments: Some(segments), ..Default::default() }, train);
        let (mlm, mlm_logits, mlm_targets) = self.predicted_loss(&hidden, targets);
        let nsp_logits = capped(&self.bert, nsp_head.forward(&self.bert.pooled(&hidden))).to_kind(Kind::Float);
        let nsp = nsp_logits.cross_entropy_for_logits(follows);
        PairLoss { mlm, mlm_logits, mlm_targets, nsp, nsp_logits }
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

/// Lengths of a pair's two segments in a block: `<cls> A <sep> B <sep>` with A the shorter half.
pub fn segment_lengths(block: i64) -> (i64, i64) {
    let inner = block - 3;
    (inner / 2, inner - inner / 2)
}

/// BERT's next-sentence pairs from the corpus `ids`: `<cls> A <sep> B <sep>` filling `block` positions,
/// A read from each of `starts`, B from where A ends when `follows` (bool) is true, else from
/// `random_starts`. Returns the token ids (B, N) and the segment ids (B, N): 0 through the first `<sep>`,
/// 1 after it. (BERT cuts at sentence boundaries of documents; here a segment is a span of the corpus.)
pub fn sentence_pairs(
    ids: &Tensor,
    starts: &Tensor,
    random_starts: &Tensor,
    follows: &Tensor,
    block: i64,
    s: Specials,
) -> (Tensor, Tensor) {
    let (first, second) = segment_lengths(block);
    let b = starts.size()[0];
    let span = |from: &Tensor, len: i64| {
        let idx = from.unsqueeze(1) + Tensor::arange(len, (Kind::Int64, Device::Cpu)).unsqueeze(0);
        ids.index_select(0, &idx.view([-1])).view([b, len])
    };
    let second_starts = (starts + first).where_self(follows, random_starts);
    let special = |id: i64| Tensor::full([b, 1], id, (Kind::Int64, Device::Cpu));
    let tokens = Tensor::cat(
        &[special(s.cls), span(starts, first), special(s.sep), span(&second_starts, second), special(s.sep)],
        1,
    );
    let segments = Tensor::cat(
        &[
            Tensor::zeros([b, first + 2], (Kind::Int64, Device::Cpu)),
            Tensor::ones([b, second + 1], (Kind::Int64, Device::Cpu)),
        ],
        1,
    );
    (tokens, segments)
}

/// Next-token targets of windows (B, N): position i predicts token i + 1; the last position and special
/// targets (the closing `<sep>`) are `IGNORE`, so both objectives predict ordinary tokens only.
pub fn next_token_targets(windows: &Tensor, first_ordinary: i64) -> Tensor {
    let n = windows.size()[1];
    let next = Tensor::cat(&[windows.narrow(1, 1, n - 1), windows.narrow(1, 0, 1).full_like(IGNORE)], 1);
    next.where_self(&next.ge(first_ordinary), &next.full_like(IGNORE))
}

/// A batch of pre-training: inputs (B, N), targets (B, N) (`IGNORE` where nothing is predicted), and for
/// next-sentence prediction the segment ids (B, N) and whether each second segment follows (B, int64).
pub struct PretrainBatch {
    inputs: Tensor,
    targets: Tensor,
    pairs: Option<(Tensor, Tensor)>,
}

/// Pre-training on the corpus: masked-LM (on single windows, or on segment pairs with next-sentence
/// prediction), or next-token prediction with the same encoder and head.
struct Pretraining<'a> {
    model: &'a MaskedLm,
    data: &'a TextData,
    /// Fixed batches of the validation and of the test split: the masking (and the pairing) is drawn once,
    /// so every evaluation scores the same.
    validation: Vec<PretrainBatch>,
    test: Vec<PretrainBatch>,
    cfg: &'a BertConfig,
    specials: Specials,
    vocab: i64,
    batch: i64,
    block: i64,
    device: Device,
}

impl Pretraining<'_> {
    /// `count` examples of `ids` read from `starts` (next-sentence pairs take their random second segments
    /// from `random_starts`, where `follows` is false), with `fraction` of the tokens masked.
    fn batch(
        &self,
        ids: &Tensor,
        starts: &Tensor,
        random_starts: &Tensor,
        follows: &Tensor,
        fraction: f64,
    ) -> PretrainBatch {
        let (windows, segments) = match self.cfg.objective {
            PretrainObjective::MaskedNsp => {
                let (w, s) = sentence_pairs(ids, starts, random_starts, follows, self.block, self.specials);
                (w, Some(s))
            }
            _ => (framed_windows(ids, starts, self.block, self.specials), None),
        };
        let (x, y) = match self.cfg.objective {
            PretrainObjective::Masked | PretrainObjective::MaskedNsp => {
                let eligible = windows.ge(self.specials.first_ordinary);
                mask_tokens(&windows, &eligible, fraction, self.cfg.replace_rule, self.specials, self.vocab)
            }
            PretrainObjective::NextToken => {
                (windows.shallow_clone(), next_token_targets(&windows, self.specials.first_ordinary))
            }
        };
        let on_device = |t: &Tensor| crate::data::to_device_async(t, self.device);
        let pairs = segments.map(|s| (on_device(&s), on_device(&follows.to_kind(Kind::Int64))));
        PretrainBatch { inputs: on_device(&x), targets: on_device(&y), pairs }
    }

    /// Corpus tokens an example reads from its start (a pair's second segment may come from elsewhere).
    fn example_span(&self) -> i64 {
        match self.cfg.objective {
            PretrainObjective::MaskedNsp => self.block - 3,
            _ => self.block - 2,
        }
    }

    /// The fixed held-out batches: `count` examples evenly spaced over `ids`, in batches of `batch`, half
    /// of the pairs (alternately) with a random second segment.
    fn held_out(&self, ids: &Tensor, count: i64, batch: i64, fraction: f64) -> Vec<PretrainBatch> {
        let span = ids.numel() as i64 - self.example_span();
        let starts: Vec<i64> = (0..count).map(|i| i * span / count.max(1)).collect();
        let follows: Vec<bool> = (0..count).map(|i| i % 2 == 0).collect();
        let (starts, follows) = (Tensor::from_slice(&starts), Tensor::from_slice(&follows));
        let (_, second) = segment_lengths(self.block);
        let random = Tensor::randint(ids.numel() as i64 - second, [count], (Kind::Int64, Device::Cpu));
        let chunk = |t: &Tensor| t.split(batch, 0);
        let (starts, random, follows) = (chunk(&starts), chunk(&random), chunk(&follows));
        (0..starts.len()).map(|i| self.batch(ids, &starts[i], &random[i], &follows[i], fraction)).collect()
    }

    /// Tokens that carry masked-LM or next-token loss per example: the chosen fraction of the ordinary
    /// ones, or all of them.
    fn predicted_per_window(&self) -> f64 {
        predicted_per_example(self.cfg, self.block)
    }
}

/// Tokens that carry the pre-training head's loss per example of `block` tokens.
fn predicted_per_example(b: &BertConfig, block: i64) -> f64 {
    match b.objective {
        PretrainObjective::Masked => (block - 2) as f64 * b.mask_fraction,
        PretrainObjective::MaskedNsp => (block - 3) as f64 * b.mask_fraction,
        PretrainObjective::NextToken => (block - 2) as f64,
    }
}

impl Objective for Pretraining<'_> {
    fn training_loss(&self, shard: &BatchShard) -> Tensor {
        let n = self.data.train.numel() as i64;
        let g = shard.global(self.batch);
        let starts = Tensor::randint(n - self.example_span(), [g], (Kind::Int64, Device::Cpu));
        let (random, follows) = if self.cfg.objective == PretrainObjective::MaskedNsp {
            let (_, second) = segment_lengths(self.block);
            let random = Tensor::randint(n - second, [g], (Kind::Int64, Device::Cpu));
            (random, Tensor::rand([g], (Kind::Float, Device::Cpu)).lt(0.5))
        } else {
            (starts.shallow_clone(), starts.ones_like().to_kind(Kind::Bool))
        };
        let batch = self.batch(&self.data.train, &starts, &random, &follows, self.cfg.mask_fraction);
        match batch.pairs {
            Some((segments, follows)) => {
                let [x, y, s, f] = shard.take([batch.inputs, batch.targets, segments, follows]);
                let l = self.model.pair_loss(&x, &s, &y, &f, true);
                l.mlm + l.nsp
            }
            None => {
                let [x, y] = shard.take([batch.inputs, batch.targets]);
                self.model.loss(&x, &y, true).0
            }
        }
    }

    fn evaluate(&self, step: i64) -> Result<Evaluation> {
        let e = self.score(&self.validation)?;
        // The data-efficiency axes: tokens read, and tokens that carried loss (the expected count), by all
        // data-parallel processes.
        let windows = (step * self.batch * distributed::world_size()) as f64;
        Ok(e.with("val/tokens_seen", windows * self.block as f64)
            .with("val/tokens_predicted", windows * self.predicted_per_window()))
    }

    fn test(&self) -> Result<Evaluation> {
        self.score(&self.test)
    }
}

impl Pretraining<'_> {
    /// The objective's loss and accuracy (and next-sentence scores) over held-out `batches`.
    fn score(&self, batches: &[PretrainBatch]) -> Result<Evaluation> {
        let _guard = tch::no_grad_guard();
        let count = |t: &Tensor| t.to_kind(Kind::Float).sum(Kind::Float).double_value(&[]);
        let [loss, correct, predicted, nsp_loss, nsp_correct, pairs] = sum_over_share(batches, |b| {
            let (l, logits, targets, nsp) = match &b.pairs {
                Some((segments, follows)) => {
                    let p = self.model.pair_loss(&b.inputs, segments, &b.targets, follows, false);
                    let pairs = follows.size()[0] as f64;
                    let right = count(&p.nsp_logits.argmax(-1, false).eq_tensor(follows));
                    (p.mlm, p.mlm_logits, p.mlm_targets, [p.nsp.double_value(&[]) * pairs, right, pairs])
                }
                None => {
                    let (l, logits, targets) = self.model.loss(&b.inputs, &b.targets, false);
                    (l, logits, targets, [0.0; 3])
                }
            };
            let n = targets.size()[0] as f64;
            let right = count(&logits.argmax(-1, false).eq_tensor(&targets));
            [l.double_value(&[]) * n, right, n, nsp[0], nsp[1], nsp[2]]
        })?;
        let (loss, accuracy) = (loss / predicted, correct / predicted);
        let mut e = Evaluation::default().with("val/loss", loss).with("val/accuracy", accuracy);
        if self.cfg.objective.masks() {
            e = e.with("val/mlm_loss", loss).with("val/mlm_accuracy", accuracy);
        }
        if pairs > 0.0 {
            e = e.with("val/nsp_loss", nsp_loss / pairs).with("val/nsp_accuracy", nsp_correct / pairs);
        }
        Ok(e)
    }
}

/// A head's logits soft-capped as `transformer.logit_softcap` says.
fn capped(bert: &Encoder, logits: Tensor) -> Tensor {
    softcap(logits, bert.spec.transformer.logit_softcap)
}

/// A sequence classifier: BERT's pooled `<cls>` state, dropout, a linear layer (one logit for two classes).
/// On a causal encoder it pools the last real token's state instead, the only one that has seen the whole
/// text (GPT's choice; a causal `<cls>` sees only itself).
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
    pub fn logits(&self, bert: &Encoder, ids: &Tensor, padding: &Tensor, train: bool) -> Tensor {
        let hidden = bert.forward(ids, BertInputs::padded(padding), train);
        let pooled = if bert.causal { bert.pooled_last(&hidden, padding) } else { bert.pooled(&hidden) };
        let logits = capped(bert, self.head.forward(&pooled.dropout(self.dropout, train))).to_kind(Kind::Float);
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

/// Token classification: a linear layer over every final hidden state (per-token softmax). On a causal
/// encoder a token's state has seen only the tokens before it.
pub struct TokenClassifier {
    head: nn::Linear,
    dropout: f64,
}

impl TokenClassifier {
    pub fn new(vs: &nn::Path, hidden: i64, classes: i64, dropout: f64) -> Self {
        Self { head: nn::linear(vs / "tagger", hidden, classes, Default::default()), dropout }
    }

    /// Logits (B, N, C).
    pub fn logits(&self, bert: &Encoder, ids: &Tensor, padding: &Tensor, train: bool) -> Tensor {
        let hidden = bert.forward(ids, BertInputs::padded(padding), train);
        capped(bert, self.head.forward(&hidden.dropout(self.dropout, train))).to_kind(Kind::Float)
    }

    /// Mean cross-entropy over the scored tokens (labels not `IGNORE`).
    pub fn loss(logits: &Tensor, labels: &Tensor) -> Tensor {
        let c = logits.size()[2];
        logits.view([-1, c]).cross_entropy_loss::<Tensor>(&labels.view([-1]), None, tch::Reduction::Mean, IGNORE, 0.0)
    }
}

/// Span prediction (BERT's SQuAD head): one start and one end logit per token, softmax over the passage.
/// On a causal encoder a passage token has seen the question (which comes first) and the passage up to
/// itself.
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
    pub fn logits(&self, bert: &Encoder, x: &SpanExamples, train: bool) -> (Tensor, Tensor) {
        let hidden = bert.forward(&x.ids, BertInputs { segments: Some(&x.segments), padding: Some(&x.padding) }, train);
        let both = capped(bert, self.head.forward(&hidden)).to_kind(Kind::Float);
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

/// Training examples split into training and validation rows ([`crate::data::carve_validation`]).
fn validation_rows(n: i64, fraction: f64) -> (Tensor, Tensor) {
    let (train, validation) = crate::data::carve_validation(n as usize, fraction);
    let rows = |v: Vec<usize>| Tensor::from_slice(&v.into_iter().map(|i| i as i64).collect::<Vec<_>>());
    (rows(train), rows(validation))
}

/// The held-out splits of a fine-tuning task.
struct HeldOutRows<'a, T> {
    validation: &'a T,
    test: &'a T,
}

impl<'a, T> HeldOutRows<'a, T> {
    fn get(&self, split: HeldOut) -> &'a T {
        match split {
            HeldOut::Validation => self.validation,
            HeldOut::Test => self.test,
        }
    }
}

struct Classification<'a> {
    bert: &'a Encoder,
    classifier: &'a SequenceClassifier,
    train: &'a Labelled,
    held_out: HeldOutRows<'a, Labelled>,
    batch: i64,
    device: Device,
}

impl Objective for Classification<'_> {
    fn training_loss(&self, shard: &BatchShard) -> Tensor {
        let [rows] = shard.take([random_rows(self.train.len(), shard.global(self.batch))]);
        let b = self.train.rows(&rows, self.device);
        let logits = self.classifier.logits(self.bert, &b.ids, &b.padding, true);
        self.classifier.loss(&logits, &b.labels)
    }

    fn evaluate(&self, _step: i64) -> Result<Evaluation> {
        self.score(self.held_out.get(HeldOut::Validation))
    }

    fn test(&self) -> Result<Evaluation> {
        self.score(self.held_out.get(HeldOut::Test))
    }
}

impl Classification<'_> {
    // Every rank scores the whole set (F1 needs every prediction), so all agree without a reduction.
    fn score(&self, set: &Labelled) -> Result<Evaluation> {
        let _guard = tch::no_grad_guard();
        let n = set.len();
        let (mut loss, mut predictions) = (0.0, Vec::new());
        for idx in eval_batches(n) {
            let b = set.rows(&idx, self.device);
            let logits = self.classifier.logits(self.bert, &b.ids, &b.padding, false);
            loss += self.classifier.loss(&logits, &b.labels).double_value(&[]) * idx.size()[0] as f64;
            predictions.push(self.classifier.predict(&logits).to_device(Device::Cpu));
        }
        let predicted = Tensor::cat(&predictions, 0);
        let accuracy = predicted.eq_tensor(&set.labels).to_kind(Kind::Float).mean(Kind::Float).double_value(&[]);
        let f1 = f1_score(&predicted, &set.labels);
        Ok(Evaluation::default().with("val/loss", loss / n as f64).with("val/accuracy", accuracy).with("val/f1", f1))
    }
}

/// Punctuation restoration: token classification of the corpus's words.
struct Tagging<'a> {
    bert: &'a Encoder,
    tagger: &'a TokenClassifier,
    train: &'a Labelled,
    held_out: HeldOutRows<'a, Labelled>,
    batch: i64,
    device: Device,
}

impl Objective for Tagging<'_> {
    fn training_loss(&self, shard: &BatchShard) -> Tensor {
        let [rows] = shard.take([random_rows(self.train.len(), shard.global(self.batch))]);
        let b = self.train.rows(&rows, self.device);
        let logits = self.tagger.logits(self.bert, &b.ids, &b.padding, true);
        TokenClassifier::loss(&logits, &b.labels)
    }

    fn evaluate(&self, _step: i64) -> Result<Evaluation> {
        self.score(self.held_out.get(HeldOut::Validation))
    }

    fn test(&self) -> Result<Evaluation> {
        self.score(self.held_out.get(HeldOut::Test))
    }
}

impl Tagging<'_> {
    // Every rank scores the whole set (F1 needs every prediction), so all agree without a reduction.
    fn score(&self, set: &Labelled) -> Result<Evaluation> {
        let _guard = tch::no_grad_guard();
        let (mut loss, mut scored, mut predictions) = (0.0, 0.0, Vec::new());
        for idx in eval_batches(set.len()) {
            let b = set.rows(&idx, self.device);
            let logits = self.tagger.logits(self.bert, &b.ids, &b.padding, false);
            let count = b.labels.ne(IGNORE).sum(Kind::Float).double_value(&[]);
            loss += TokenClassifier::loss(&logits, &b.labels).double_value(&[]) * count;
            scored += count;
            predictions.push(logits.argmax(-1, false).to_device(Device::Cpu));
        }
        let predicted = Tensor::cat(&predictions, 0);
        let labels = &set.labels;
        let mask = labels.ne(IGNORE);
        let right = predicted.eq_tensor(labels).logical_and(&mask).sum(Kind::Float).double_value(&[]);
        let f1 = mark_f1(&predicted, labels);
        Ok(Evaluation::default()
            .with("val/loss", loss / scored.max(1.0))
            .with("val/accuracy", right / scored.max(1.0))
            .with("val/f1", f1))
    }
}

/// Phrase location: span prediction over a passage.
struct Locating<'a> {
    bert: &'a Encoder,
    span: &'a SpanPredictor,
    train: &'a SpanExamples,
    held_out: HeldOutRows<'a, SpanExamples>,
    batch: i64,
    device: Device,
}

impl Objective for Locating<'_> {
    fn training_loss(&self, shard: &BatchShard) -> Tensor {
        let [rows] = shard.take([random_rows(self.train.ids.size()[0], shard.global(self.batch))]);
        let b = self.train.rows(&rows, self.device);
        let (s, e) = self.span.logits(self.bert, &b, true);
        SpanPredictor::loss(&s, &e, &b.start, &b.end)
    }

    fn evaluate(&self, _step: i64) -> Result<Evaluation> {
        self.score(self.held_out.get(HeldOut::Validation))
    }

    fn test(&self) -> Result<Evaluation> {
        self.score(self.held_out.get(HeldOut::Test))
    }
}

impl Locating<'_> {
    // Every rank scores the whole set (F1 needs every prediction), so all agree without a reduction.
    fn score(&self, set: &SpanExamples) -> Result<Evaluation> {
        let _guard = tch::no_grad_guard();
        let n = set.ids.size()[0];
        let (mut loss, mut predicted) = (0.0, Vec::new());
        for idx in eval_batches(n) {
            let b = set.rows(&idx, self.device);
            let (s, e) = self.span.logits(self.bert, &b, false);
            let l = SpanPredictor::loss(&s, &e, &b.start, &b.end);
            loss += l.double_value(&[]) * idx.size()[0] as f64;
            predicted.extend(self.span.best_spans(&s, &e));
        }
        let starts = Vec::<i64>::try_from(&set.start).unwrap_or_default();
        let ends = Vec::<i64>::try_from(&set.end).unwrap_or_default();
        let gold: Vec<(i64, i64)> = starts.into_iter().zip(ends).collect();
        let (exact, f1) = span_scores(&predicted, &gold);
        Ok(Evaluation::default()
            .with("val/loss", loss / n.max(1) as f64)
            .with("val/accuracy", exact)
            .with("val/f1", f1)
            .with("val/exact_match", exact))
    }
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
    let b = cfg.bert();
    let spec = BertSpec::new(cfg.transformer_spec(), vocab);
    let mut mlm = MaskedLm::new(vs, &spec);
    // Left to right at fine-tuning too, as Devlin et al. (2019, §5.1) ran their "LTR & No NSP" ablation:
    // a bidirectional fine-tune of a causal encoder would mix the objective with a train/test mismatch.
    mlm.bert.causal = b.objective == PretrainObjective::NextToken;
    if b.pretrains() && b.objective == PretrainObjective::MaskedNsp {
        mlm.nsp = Some(nn::linear(vs / "nsp", spec.transformer.d_model, 2, Default::default()));
    }
    let (task, hidden, dropout) = (vs / "task", spec.transformer.d_model, spec.transformer.dropout);
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
    let (train, test) = crate::data::split_text(&text, cfg.data.test_fraction);
    let own = |t: &str| -> Vec<Passage> {
        word_pieces(t).into_iter().map(|w| w.into_iter().map(str::to_string).collect()).collect()
    };
    let test = own(test);
    let step = (test.len() / TASK_TEST_ROWS).max(1);
    Ok((own(train), test.into_iter().step_by(step).take(TASK_TEST_ROWS).collect()))
}

/// Which tokenised text a run reads: its data config, and the checkpoint it fine-tunes from (whose
/// vocabulary it must use).
fn text_key(cfg: &Config, results_root: &Path) -> String {
    let checkpoint = cfg.bert().init_from_path(results_root);
    format!("{}{checkpoint:?}", serde_yaml::to_string(&cfg.data).unwrap_or_default())
}

/// The corpus tokenised by the vocabulary a checkpoint was pre-trained with, not a freshly trained one: the
/// checkpoint's embedding rows belong to its token ids. The run's data config must name the same
/// vocabulary, so the recipe says what is used.
fn pretrained_vocabulary_data(data: &crate::recipe::DataConfig, checkpoint: &Path) -> Result<Dataset> {
    let (pretrained, tokenizer) = super::checkpoint::load_description(checkpoint)
        .with_context(|| format!("bert.init_from: {}", checkpoint.display()))?;
    let tokenizer =
        tokenizer.with_context(|| format!("bert.init_from: {} holds no vocabulary", checkpoint.display()))?;
    let vocabulary = |d: &crate::recipe::DataConfig| {
        let size = d.vocab_size.map(|n| format!(", vocab_size {n}")).unwrap_or_default();
        let path = d.tokenizer_path.as_ref().map(|p| format!(", tokenizer_path {p}")).unwrap_or_default();
        format!("data.tokenizer {}{size}{path}", serde_yaml::to_string(&d.tokenizer).unwrap_or_default().trim())
    };
    let (theirs, ours) = (vocabulary(&pretrained.data), vocabulary(data));
    if theirs != ours {
        bail!(
            "bert.init_from: {} was pre-trained with {theirs}, this run has {ours}: fine-tuning reuses the checkpoint's vocabulary, so set the same",
            checkpoint.display()
        );
    }
    let text = crate::data::load_text(data)?;
    Ok(Dataset::Text(TextData::from_text_with_tokenizer(&text, data, tokenizer)?))
}

struct BuiltBert {
    mlm: MaskedLm,
    vocab: i64,
    block: i64,
}

impl Built for BuiltBert {
    fn forward_example(&self, batch: i64, train: bool, device: Device) -> Tensor {
        self.mlm.logits(&super::example_tokens(batch, self.block, self.vocab, device), train)
    }

    fn attention_on_tokens(&self, ids: &Tensor) -> Option<Vec<Tensor>> {
        Some(self.mlm.bert.forward_with(ids, BertInputs::default(), Pass::eval().with_weights()).1)
    }
}

impl Task for Bert {
    fn metrics(&self, cfg: &Config) -> Vec<Metric> {
        let b = cfg.bert();
        let mut m = match (b.task, b.objective) {
            (BertTask::Pretrain, PretrainObjective::Masked) => vec![
                Metric::both("test_loss", "val/loss", "test masked-LM loss", "nats/masked token", false),
                Metric::both("test_accuracy", "val/accuracy", "test masked-token accuracy", "", true),
                Metric::both("test_mlm_loss", "val/mlm_loss", "test masked-LM loss", "nats/masked token", false)
                    .detail(),
                Metric::both("test_mlm_accuracy", "val/mlm_accuracy", "test masked-token accuracy", "", true)
                    .detail()
                    .no_charts(),
            ],
            (BertTask::Pretrain, PretrainObjective::MaskedNsp) => vec![
                Metric::both(
                    "test_loss",
                    "val/loss",
                    "test masked-LM loss (on segment pairs)",
                    "nats/masked token",
                    false,
                ),
                Metric::both("test_accuracy", "val/accuracy", "test masked-token accuracy", "", true),
                Metric::both("test_mlm_loss", "val/mlm_loss", "test masked-LM loss", "nats/masked token", false)
                    .detail(),
                Metric::both("test_mlm_accuracy", "val/mlm_accuracy", "test masked-token accuracy", "", true)
                    .detail()
                    .no_charts(),
                Metric::both("test_nsp_loss", "val/nsp_loss", "test next-sentence loss", "nats/pair", false).detail(),
                Metric::both("test_nsp_accuracy", "val/nsp_accuracy", "test next-sentence accuracy", "", true),
            ],
            (BertTask::Pretrain, PretrainObjective::NextToken) => vec![
                Metric::both("test_loss", "val/loss", "test next-token loss", "nats/token", false),
                Metric::both("test_accuracy", "val/accuracy", "test next-token accuracy", "", true),
            ],
            (task, _) => {
                let (accuracy, f1) = match task {
                    BertTask::Spam => ("test accuracy", "test F1 of the spam class"),
                    BertTask::Punctuation => ("test token accuracy", "test F1 over the punctuation marks"),
                    _ => ("test exact match of the spans", "test F1 of the predicted spans (token overlap)"),
                };
                let mut m = vec![
                    Metric::both("test_loss", "val/loss", "test loss of the task head", "nats/example", false).detail(),
                    Metric::both("test_accuracy", "val/accuracy", accuracy, "", true),
                    Metric::both("test_f1", "val/f1", f1, "", true),
                ];
                if task == BertTask::Locate {
                    m.push(
                        Metric::both("test_exact_match", "val/exact_match", "test exact match of the spans", "", true)
                            .detail(),
                    );
                }
                if b.pretrain_steps > 0 {
                    m.push(Metric::column(
                        "test_mlm_loss",
                        "test masked-LM loss after pre-training",
                        "nats/masked token",
                        false,
                    ));
                    m.push(
                        Metric::column("test_mlm_accuracy", "test masked-token accuracy after pre-training", "", true)
                            .detail()
                            .no_charts(),
                    );
                    m.push(Metric::curve(
                        "pretrain_val/mlm_loss",
                        "validation masked-LM loss during pre-training",
                        "nats/masked token",
                        false,
                    ));
                    if b.objective == PretrainObjective::MaskedNsp {
                        m.push(Metric::column(
                            "test_nsp_accuracy",
                            "test next-sentence accuracy after pre-training",
                            "",
                            true,
                        ));
                        m.push(Metric::curve(
                            "pretrain_val/nsp_accuracy",
                            "validation next-sentence accuracy during pre-training",
                            "",
                            true,
                        ));
                    }
                }
                m
            }
        };
        if b.task == BertTask::Pretrain {
            // The x axes of the data-efficiency charts.
            m.push(Metric::curve("val/tokens_seen", "tokens seen", "tokens", true).no_charts());
            m.push(
                Metric::curve("val/tokens_predicted", "tokens predicted (carrying loss)", "tokens", true).no_charts(),
            );
        }
        m.extend(metrics::optimisation(if b.task == BertTask::Pretrain {
            "nats/predicted token"
        } else {
            "nats/example"
        }));
        m.extend(metrics::cost("tokens/s", cfg.train.world_size));
        m
    }

    fn prepare(&self, cfg: &Config, data: &mut DataCache) -> Result<()> {
        let init_from = cfg.bert().init_from_path(&data.results_root);
        if let Some(path) = &init_from {
            if !path.is_file() {
                bail!(
                    "bert.init_from: no such checkpoint: {} (a $RESULTS/ path is under {}: run the recipe that saves it first)",
                    path.display(),
                    data.results_root.display()
                );
            }
        }
        let key = text_key(cfg, &data.results_root);
        let set = DataCache::get_or_load(&mut data.text, key.clone(), || match &init_from {
            Some(path) => pretrained_vocabulary_data(&cfg.data, path),
            None => Dataset::load(&cfg.data),
        })?;
        set.check_block_size(cfg.longest_window())?;
        if cfg.bert().task == BertTask::Spam && data.emails.is_none() {
            data.emails = Some(crate::data::spam::spam_assassin()?);
        }
        // More labelled examples than the task's training split holds is refused here, before any run of
        // the sweep trains: spam's split is one row per training email; the corpus tasks' are built to count.
        let b = cfg.bert();
        match (b.labelled_examples, b.task, data.emails.as_deref()) {
            (None, _, _) | (_, BertTask::Pretrain, _) => {}
            (Some(n), BertTask::Spam, Some(emails)) => {
                let training = emails.iter().filter(|e| !e.test).count();
                let rows = crate::data::carve_validation(training, cfg.data.validation_fraction).0.len();
                labelled_subset(rows as i64, Some(n), cfg.train.seed, b.task)?;
            }
            _ => {
                let Dataset::Text(text) = DataCache::loaded(&data.text, &key)? else {
                    bail!("kind bert reads text (data.task: text)")
                };
                let specials = Specials::of(&text.tokenizer)?;
                TaskSplits::make(&TaskExamples { cfg, data: text, emails: data.emails.as_deref(), specials })?;
            }
        }
        Ok(())
    }

    fn vocab(&self, cfg: &Config, data: &DataCache) -> Result<i64> {
        Ok(DataCache::loaded(&data.text, &text_key(cfg, &data.results_root))?.tokenizer().vocab_size())
    }

    fn build(&self, cfg: &Config, vs: &nn::Path, vocab: i64) -> Box<dyn Built> {
        // The task head's variables are made in `vs` (a checkpoint's names then match); what a built model
        // is asked for reads the encoder and its masked-LM head only.
        let (mlm, _task_head) = build_model(vs, cfg, vocab);
        Box::new(BuiltBert { mlm, vocab, block: cfg.transformer.block_size })
    }

    fn forward_flops(&self, cfg: &Config, params: i64, vocab: i64) -> (f64, String) {
        let block = cfg.transformer.block_size;
        let per_token = encoder_flops_per_token(cfg, params, vocab) + head_flops_per_token(cfg, vocab);
        (per_token / 3.0 * block as f64, format!("sequence of {block} tokens"))
    }

    fn tokens_per_example(&self, cfg: &Config, _data: &DataCache) -> Result<f64> {
        Ok(cfg.transformer.block_size as f64)
    }

    /// Pre-training's loss is per predicted token, each a text token (masked ones drawn uniformly among the
    /// text's, or every next one): the test split's frequency level applies to both objectives.
    fn frequency_level(&self, cfg: &Config, data: &DataCache) -> Result<Option<f64>> {
        if cfg.bert().task != BertTask::Pretrain {
            return Ok(None);
        }
        Ok(DataCache::loaded(&data.text, &text_key(cfg, &data.results_root))?.frequency_level())
    }

    fn train(&self, cfg: &Config, data: &DataCache, ctx: RunContext) -> Result<Trained> {
        let Dataset::Text(text) = DataCache::loaded(&data.text, &text_key(cfg, &data.results_root))? else {
            bail!("kind bert reads text (data.task: text)")
        };
        let emails = data.emails.as_deref();
        train_bert(self, cfg, text, emails, &data.results_root, ctx)
    }
}

/// Training FLOPs per token of the encoder (6 per matmul weight, 12·L·T·(H·d_head) for attention), with
/// the embedding tables as lookups; the vocabulary projection is [`head_flops_per_token`].
fn encoder_flops_per_token(cfg: &Config, params: i64, vocab: i64) -> f64 {
    let t = cfg.transformer_spec();
    let d = t.d_model;
    let mut tables = vocab * d + 2 * d + vocab;
    if t.position.encoding == crate::transformer::spec::PositionEncoding::Learned {
        tables += t.block_size * d;
    }
    if !t.tie_embeddings {
        tables += vocab * d;
    }
    6.0 * (params - tables) as f64 + 12.0 * (t.layers * t.block_size * t.attention.inner()) as f64
}

/// Training FLOPs per token of the pre-training head's vocabulary projection, paid at predicted positions
/// only.
fn head_flops_per_token(cfg: &Config, vocab: i64) -> f64 {
    let (b, t) = (cfg.bert(), &cfg.transformer);
    6.0 * predicted_per_example(b, t.block_size) / t.block_size as f64 * (vocab * t.d_model) as f64
}

/// Trains a BERT run: the pre-training objective on `data` (the whole run for `task: pretrain`, else
/// `pretrain_steps` first), then the task. `emails` are needed for `task: spam`.
fn train_bert(
    task: &Bert,
    cfg: &Config,
    data: &TextData,
    emails: Option<&[crate::data::spam::Email]>,
    results_root: &Path,
    ctx: RunContext,
) -> Result<Trained> {
    let (b, t, device, progress, state) = (cfg.bert(), &cfg.train, ctx.device, ctx.progress, ctx.state);
    let started = Instant::now();
    let specials = Specials::of(&data.tokenizer)?;
    let vocab = data.tokenizer.vocab_size();
    let block = cfg.transformer.block_size;
    if [&data.train, &data.validation, &data.test].iter().any(|split| split.numel() as i64 <= block) {
        bail!("the corpus splits need more than transformer.block_size = {block} tokens");
    }
    tch::manual_seed(t.seed as i64);
    let mut vs = nn::VarStore::new(device);
    let (mlm, head) = build_model(&vs.root(), cfg, vocab);
    if let Some(path) = b.init_from_path(results_root) {
        init_from(&vs, &path)?;
    }
    // Held-out examples, evenly spaced, masked (and paired) once with a fixed seed.
    let mut pretraining = Pretraining {
        model: &mlm,
        data,
        validation: Vec::new(),
        test: Vec::new(),
        cfg: b,
        specials,
        vocab,
        batch: t.batch_size,
        block,
        device,
    };
    let eval_fraction = b.eval_mask_fraction.unwrap_or(b.mask_fraction);
    let (count, batch) = (t.eval_batches * t.global_batch(), t.global_batch());
    tch::manual_seed(0x3a5c);
    // At most as many test examples as the split holds without overlapping (`train.test_batches: all`).
    let test_count = (t.test_batches() * batch).min((data.test.numel() as i64 / pretraining.example_span()).max(1));
    pretraining.test = pretraining.held_out(&data.test, test_count, batch, eval_fraction);
    pretraining.validation = pretraining.held_out(&data.validation, count, batch, eval_fraction);
    tch::manual_seed(t.seed as i64);

    let (mut tokens_seen, mut train_time) = (0i64, 0.0);
    let mut curves = Vec::new();
    let mut pretrained_eval: Option<Evaluation> = None;
    // The fine-tuning phase restarts the peak: the run's is the larger of the two phases'.
    let mut pretraining_peak_mb = f64::NAN;
    let phase_tokens = t.global_batch() * block;
    let mut run = 'phases: {
        if matches!(head, TaskHead::None) {
            break 'phases optimise(t, &pretraining, &mut vs, device, progress, state)?;
        }
        let splits = TaskSplits::make(&TaskExamples { cfg, data, emails, specials })?;
        if b.pretrain_steps > 0 {
            let pre = crate::recipe::TrainConfig { steps: b.pretrain_steps, lr: b.pretrain_lr, ..t.clone() };
            let mut run = optimise_phase("pretrain", &pre, &pretraining, &mut vs, device, state)?;
            if run.diverged_at.is_some() {
                // Recorded like any diverged run (the sweep goes on); there is nothing to fine-tune.
                progress(t.steps, run.last_loss);
                break 'phases run;
            }
            tokens_seen += run.steps_done * phase_tokens;
            train_time += run.train_time;
            curves.append(&mut run.curves);
            pretrained_eval = Some(run.test_eval);
            pretraining_peak_mb = run.peak_memory_mb;
        }
        fine_tune(&splits, cfg, &mlm, &head, &mut vs, Phase { device, progress, state })?
    };
    tokens_seen += run.steps_done * phase_tokens;
    train_time += run.train_time;
    run.peak_memory_mb = run.peak_memory_mb.max(pretraining_peak_mb);
    curves.append(&mut run.curves);
    run.curves = curves;
    let pretraining_only = matches!(head, TaskHead::None);
    let tokens_per_s = tokens_seen as f64 / train_time.max(1e-9);
    // The head's vocabulary projection is paid at the predicted positions of the pre-training tokens only.
    let pretraining_tokens = match (pretraining_only, pretrained_eval.is_some()) {
        (true, _) => tokens_seen,
        (false, true) => b.pretrain_steps * phase_tokens,
        (false, false) => 0,
    };
    let flops = tokens_seen as f64 * encoder_flops_per_token(cfg, run.params, vocab)
        + pretraining_tokens as f64 * head_flops_per_token(cfg, vocab);
    let model_flops = flops / train_time.max(1e-9);
    let metrics = task.metrics(cfg);
    let mut outcome = run.into_outcome(started, tokens_per_s, model_flops, device, t.precision, &metrics);
    // A fine-tuning run's masked-LM columns: its pre-training's test evaluation.
    if let Some(e) = pretrained_eval.filter(|_| b.objective.masks()) {
        outcome.set("test_mlm_loss", e.get("val/mlm_loss"));
        outcome.set("test_mlm_accuracy", e.get("val/mlm_accuracy"));
        if b.objective == PretrainObjective::MaskedNsp {
            outcome.set("test_nsp_accuracy", e.get("val/nsp_accuracy"));
        }
    }
    Ok(Trained { outcome, vs, tokenizer: Some(data.tokenizer.clone()) })
}

/// What a fine-tuning task's examples are made from: the run's config, its corpus and tokenizer, the
/// emails (task spam) and the tokenizer's special tokens.
struct TaskExamples<'a> {
    cfg: &'a Config,
    data: &'a TextData,
    emails: Option<&'a [crate::data::spam::Email]>,
    specials: Specials,
}

/// Where a phase of a run trains: its device, progress callback and resumable state.
struct Phase<'a> {
    device: Device,
    progress: crate::train::Progress<'a>,
    state: Option<&'a StateFile>,
}

/// A fine-tuning task's examples: training, validation and test rows, made before any training so that
/// what cannot be made (a phrase that fits no block, more labelled examples than the split holds) is
/// refused before pre-training starts.
enum TaskSplits {
    /// Spam classification and punctuation tagging.
    Labelled { train: Labelled, validation: Labelled, test: Labelled },
    /// Phrase location.
    Span { train: SpanExamples, validation: SpanExamples, test: SpanExamples },
}

/// The rows of a training split of `len` rows that a run with `bert.labelled_examples: n` fine-tunes on:
/// `n` of them, drawn with the run's `seed` (a permutation of its own, so the model's initialisation and
/// the batches draw from libtorch's generator as without the key); `None` for all of them.
fn labelled_subset(len: i64, n: Option<i64>, seed: u64, task: BertTask) -> Result<Option<Tensor>> {
    use rand::seq::SliceRandom;
    use rand::SeedableRng;
    let Some(n) = n else { return Ok(None) };
    if n > len {
        bail!(
            "bert.labelled_examples {n}: the {} task's training split holds {len} examples (after its validation rows)",
            serde_yaml::to_string(&task).unwrap_or_default().trim()
        );
    }
    let mut order: Vec<i64> = (0..len).collect();
    order.shuffle(&mut rand_pcg::Pcg64::seed_from_u64(seed ^ 0x1abe_11ed));
    order.truncate(n as usize);
    Ok(Some(Tensor::from_slice(&order)))
}

impl TaskSplits {
    /// `examples`' task split into rows: the test split as the task defines it, validation rows carved
    /// from its training split, and of the rest the `bert.labelled_examples` subset.
    fn make(examples: &TaskExamples) -> Result<Self> {
        let TaskExamples { cfg, data, emails, specials } = *examples;
        let (b, block, fraction) = (cfg.bert(), cfg.transformer.block_size, cfg.data.validation_fraction);
        let subset = |len: i64| labelled_subset(len, b.labelled_examples, cfg.train.seed, b.task);
        let carve = |all: &Labelled| -> Result<(Labelled, Labelled)> {
            let (train, validation) = validation_rows(all.len(), fraction);
            let train = all.rows(&train, Device::Cpu);
            let train = match subset(train.len())? {
                Some(rows) => train.rows(&rows, Device::Cpu),
                None => train,
            };
            Ok((train, all.rows(&validation, Device::Cpu)))
        };
        Ok(match b.task {
            BertTask::Pretrain => bail!("task: pretrain has no labelled examples"),
            BertTask::Spam => {
                let emails = emails.context("task spam needs the SpamAssassin emails")?;
                let (all, test) = spam_inputs(emails, &data.tokenizer, block)?;
                let (train, validation) = carve(&all)?;
                TaskSplits::Labelled { train, validation, test }
            }
            BertTask::Punctuation => {
                let (train, test) = task_pieces(cfg)?;
                let examples = |p: &[Passage]| punctuation_examples(&data.tokenizer, p, block, specials);
                let (all, test) = (examples(&train)?, examples(&test)?);
                let (train, validation) = carve(&all)?;
                TaskSplits::Labelled { train, validation, test }
            }
            BertTask::Locate => {
                let (train, test) = task_pieces(cfg)?;
                let examples = |p: &[Passage], key: u64| locate_examples(&data.tokenizer, p, block, specials, key);
                let (all, test) = (examples(&train, 1)?, examples(&test, 2)?);
                let (train_rows, validation_rows) = validation_rows(all.ids.size()[0], fraction);
                let (train, validation) = (all.rows(&train_rows, Device::Cpu), all.rows(&validation_rows, Device::Cpu));
                if [&train, &validation, &test].iter().any(|split| split.start.numel() == 0) {
                    bail!(
                        "task locate: no passage of the corpus has a phrase that fits transformer.block_size = {block}"
                    );
                }
                let train = match subset(train.ids.size()[0])? {
                    Some(rows) => train.rows(&rows, Device::Cpu),
                    None => train,
                };
                TaskSplits::Span { train, validation, test }
            }
        })
    }
}

/// Fine-tunes `head` (and the encoder under it) on its task's `splits`: spam classification, punctuation
/// tagging or phrase location.
fn fine_tune(
    splits: &TaskSplits,
    cfg: &Config,
    mlm: &MaskedLm,
    head: &TaskHead,
    vs: &mut nn::VarStore,
    phase: Phase,
) -> Result<Optimised> {
    let t = &cfg.train;
    let (bert, batch, device) = (&mlm.bert, t.batch_size, phase.device);
    let (progress, state) = (phase.progress, phase.state);
    match (head, splits) {
        (TaskHead::Sequence(classifier), TaskSplits::Labelled { train, validation, test }) => {
            let held_out = HeldOutRows { validation, test };
            let task = Classification { bert, classifier, train, held_out, batch, device };
            optimise(t, &task, vs, device, progress, state)
        }
        (TaskHead::Tokens(tagger), TaskSplits::Labelled { train, validation, test }) => {
            let held_out = HeldOutRows { validation, test };
            let task = Tagging { bert, tagger, train, held_out, batch, device };
            optimise(t, &task, vs, device, progress, state)
        }
        (TaskHead::Span(span), TaskSplits::Span { train, validation, test }) => {
            let held_out = HeldOutRows { validation, test };
            let task = Locating { bert, span, train, held_out, batch, device };
            optimise(t, &task, vs, device, progress, state)
        }
        _ => unreachable!("TaskSplits::make builds the splits of the head's task"),
    }
}

#[cfg(test)]
mod labelled_subset_tests {
    use super::*;

    #[test]
    fn the_labelled_subset_is_n_distinct_rows_drawn_by_the_seed() {
        let rows = |n, seed| {
            Vec::<i64>::try_from(labelled_subset(100, Some(n), seed, BertTask::Spam).unwrap().unwrap()).unwrap()
        };
        let a = rows(10, 0);
        assert_eq!(a.len(), 10);
        assert!(a.iter().all(|&r| (0..100).contains(&r)));
        assert_eq!(a.iter().collect::<std::collections::HashSet<_>>().len(), 10, "{a:?}");
        assert_eq!(rows(10, 0), a, "the same seed draws the same rows");
        assert_ne!(rows(10, 1), a, "another seed draws others");
        assert_eq!(rows(100, 3).len(), 100);
        assert!(labelled_subset(100, None, 0, BertTask::Spam).unwrap().is_none());
        let e = labelled_subset(100, Some(101), 0, BertTask::Punctuation).unwrap_err().to_string();
        assert!(e.contains("punctuation task's training split holds 100"), "{e}");
    }
}
