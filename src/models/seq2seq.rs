//! The encoder–decoder Transformer (UDL §12.8; Vaswani et al. and *The Annotated Transformer*): an
//! encoder of bidirectional layers over the source, a decoder of causal self-attention layers that also
//! cross-attend to the encoder's output (queries from the decoder, keys and values from the encoder),
//! embeddings scaled by √d, shared or separate source/target embeddings, a linear generator (or the target
//! embedding, tied). Both stacks are the shared `Stack` of `TransformerLayer`s on the attention core.
//!
//! Decoding is greedy or beam search with GNMT's length penalty; quality is corpus BLEU (`bleu`).
use tch::nn::{self, Module};
use tch::{Device, Kind, Tensor};

use crate::transformer::attention::Mask;
use crate::transformer::layers::{self, GlobalTokens, LayerInit, Pass, Stack, StackCache, ValueEmbeddings};
use crate::transformer::positions::AbsolutePositions;
use crate::transformer::spec::{PositionEncoding, PositionSpec, TransformerSpec};

/// The encoder–decoder: two stacks of the same Transformer settings over a shared vocabulary.
#[derive(Debug, Clone, PartialEq)]
pub struct Seq2SeqSpec {
    pub src_vocab: i64,
    pub tgt_vocab: i64,
    pub encoder_layers: i64,
    pub decoder_layers: i64,
    /// How many of the decoder's layers (the last ones) cross-attend to the encoder; the rest are
    /// decoder-only layers. Equal to `decoder_layers` in the standard model.
    pub cross_attention_layers: i64,
    /// One embedding matrix for source and target (needs one vocabulary).
    pub shared_embeddings: bool,
    /// `tie_embeddings`: the generator reads the target embedding matrix; `block_size`: the longest
    /// sequence either stack reads.
    pub transformer: TransformerSpec,
}

impl Seq2SeqSpec {
    /// The Annotated Transformer's copy-task model, shrunk: 2 + 2 layers, width 64, sinusoidal positions.
    pub fn small(vocab: i64) -> Self {
        let mut t = TransformerSpec::small(64, 2, 4, 128);
        t.ffn_hidden = 128;
        t.activation = crate::transformer::spec::Activation::Relu;
        t.position = PositionSpec::of(PositionEncoding::Sinusoidal);
        t.final_norm = false;
        Self {
            src_vocab: vocab,
            tgt_vocab: vocab,
            encoder_layers: 2,
            decoder_layers: 2,
            cross_attention_layers: 2,
            shared_embeddings: false,
            transformer: t,
        }
    }
}

pub struct Seq2Seq {
    src_embedding: nn::Embedding,
    tgt_embedding: Option<nn::Embedding>,
    encoder: Stack,
    decoder: Stack,
    generator: Option<nn::Linear>,
    scale: f64,
    pub spec: Seq2SeqSpec,
}

impl Seq2Seq {
    pub fn new(vs: &nn::Path, spec: &Seq2SeqSpec) -> Self {
        let t = &spec.transformer;
        let d = t.d_model;
        let emb = nn::EmbeddingConfig { ws_init: nn::Init::Randn { mean: 0.0, stdev: 0.02 }, ..Default::default() };
        let init = LayerInit::default();
        let first_cross = spec.decoder_layers - spec.cross_attention_layers;
        let src_embedding = nn::embedding(vs / "src_embedding", spec.src_vocab, d, emb);
        let tgt_embedding =
            (!spec.shared_embeddings).then(|| nn::embedding(vs / "tgt_embedding", spec.tgt_vocab, d, emb));
        // One position table for both stacks.
        let positions = AbsolutePositions::new(vs / "position", t.position.encoding, t.block_size, d);
        let encoder_layers = layers::layers(&(vs / "encoder"), t, spec.encoder_layers, |_| false, init, None);
        let decoder_layers =
            layers::layers(&(vs / "decoder"), t, spec.decoder_layers, |i| i >= first_cross, init, None);
        // Summed embeddings: the recipe refuses concatenated positions for this kind.
        let stack = |positions, layers, name: &str, globals: &str| {
            let global_tokens = GlobalTokens::new(&(vs / globals), t.attention.pattern.global_tokens, d);
            Stack::new(t, positions, global_tokens, layers, layers::final_norm(vs / name, d, t, 1e-5))
        };
        let encoder = stack(positions.shallow_clone(), encoder_layers, "encoder_norm", "encoder_tokens");
        let decoder = stack(positions, decoder_layers, "decoder_norm", "decoder_tokens");
        let generator = (!t.tie_embeddings).then(|| {
            nn::linear(vs / "generator", d, spec.tgt_vocab, nn::LinearConfig { bias: false, ..Default::default() })
        });
        // Each stack looks up its own tables, by the ids of the sequence it reads.
        let encoder =
            encoder.with_value_embeddings(ValueEmbeddings::new(&(vs / "encoder_value_embeddings"), t, spec.src_vocab));
        let decoder =
            decoder.with_value_embeddings(ValueEmbeddings::new(&(vs / "decoder_value_embeddings"), t, spec.tgt_vocab));
        Self { src_embedding, tgt_embedding, encoder, decoder, generator, scale: (d as f64).sqrt(), spec: spec.clone() }
    }

    /// The encoder's output (B, S, D) for source ids (B, S) whose real tokens are `src_real` (B, S).
    pub fn encode(&self, src: &Tensor, src_real: &Tensor, train: bool) -> Tensor {
        let x = self.src_embedding.forward(src) * self.scale;
        let mask = Mask { causal: false, key_padding: Some(src_real), offset: 0, bias: None };
        self.encoder.forward(&x, &mask, None, Pass::new(train).with_tokens(src)).0
    }

    /// Next-token logits (B, T, V) for target inputs (B, T) given the encoder's `memory`.
    pub fn decode(&self, tgt: &Tensor, memory: &Tensor, src_real: &Tensor, train: bool) -> Tensor {
        let table = self.tgt_embedding.as_ref().unwrap_or(&self.src_embedding);
        let x = table.forward(tgt) * self.scale;
        let memory_mask = Mask { causal: false, key_padding: Some(src_real), offset: 0, bias: None };
        let pass = Pass::new(train).with_tokens(tgt);
        let (x, _) = self.decoder.forward(&x, &Mask::causal(), Some((memory, &memory_mask)), pass);
        self.generate(&x, table)
    }

    /// The generator's logits of decoder states `x`, soft-capped as `transformer.logit_softcap` says.
    fn generate(&self, x: &Tensor, table: &nn::Embedding) -> Tensor {
        let logits = match &self.generator {
            Some(g) => g.forward(x),
            None => x.matmul(&table.ws.tr()),
        };
        layers::softcap(logits, self.spec.transformer.logit_softcap)
    }

    /// [`Seq2Seq::decode`] for the new target tokens `tgt` (B, N_new) after the positions `cache` holds (its
    /// self-attention keys and values, and its projection of `memory`), in evaluation mode.
    pub fn decode_cached(&self, tgt: &Tensor, memory: &Tensor, src_real: &Tensor, cache: &mut StackCache) -> Tensor {
        let table = self.tgt_embedding.as_ref().unwrap_or(&self.src_embedding);
        let x = table.forward(tgt) * self.scale;
        let memory_mask = Mask { causal: false, key_padding: Some(src_real), offset: 0, bias: None };
        let pass = Pass::cached(cache).with_tokens(tgt);
        let (x, _) = self.decoder.forward(&x, &Mask::causal(), Some((memory, &memory_mask)), pass);
        self.generate(&x, table)
    }

    /// Cross-entropy of predicting a batch's `tgt_out` from its `tgt_in`, ignoring `ignore` targets, with
    /// label smoothing ε (the target gets 1 − ε, the rest of the vocabulary shares ε).
    pub fn loss(&self, batch: &PairBatch, smoothing: f64, ignore: i64, train: bool) -> (Tensor, Tensor) {
        let memory = self.encode(&batch.src, &batch.src_real, train);
        let logits = self.decode(&batch.tgt_in, &memory, &batch.src_real, train).to_kind(Kind::Float);
        let v = logits.size()[2];
        let loss = logits.view([-1, v]).cross_entropy_loss::<Tensor>(
            &batch.tgt_out.reshape([-1]),
            None,
            tch::Reduction::Mean,
            ignore,
            smoothing,
        );
        (loss, logits)
    }
}

/// A batch of source/target pairs: source ids and their real-token mask (B, S), decoder inputs (`<bos>`
/// then the target) and outputs (the target then `<eos>`), (B, T).
pub struct PairBatch {
    pub src: Tensor,
    pub src_real: Tensor,
    pub tgt_in: Tensor,
    pub tgt_out: Tensor,
}

/// GNMT's length penalty ((5 + length) / 6)^α: beam scores are log-probabilities divided by it, so α > 0
/// stops beams from preferring short outputs.
pub fn length_penalty(length: usize, alpha: f64) -> f64 {
    ((5.0 + length as f64) / 6.0).powf(alpha)
}

/// Decodes one source sequence (ids, no padding) from `bos` until `eos` or `max_len` tokens: greedy when
/// `width` is 1, else beam search: each step keeps the `width` best continuations, a continuation by `eos`
/// finishes a hypothesis, and the finished one with the best log-probability / length penalty wins.
/// Returns the tokens after `bos`, without `eos`. With `cached`, each step feeds only the newest token
/// through a KV cache (the same result).
#[allow(clippy::too_many_arguments)]
pub fn translate(
    model: &Seq2Seq,
    src: &[i64],
    bos: i64,
    eos: i64,
    max_len: usize,
    width: usize,
    alpha: f64,
    cached: bool,
) -> Vec<i64> {
    let _guard = tch::no_grad_guard();
    let device = model.src_embedding.ws.device();
    let src_t = Tensor::from_slice(src).unsqueeze(0).to_device(device);
    let real = src_t.ones_like().to_kind(Kind::Bool);
    let memory = model.encode(&src_t, &real, false);
    // (tokens after bos, total log-probability)
    let mut live: Vec<(Vec<i64>, f64)> = vec![(Vec::new(), 0.0)];
    let mut finished: Vec<(Vec<i64>, f64)> = Vec::new();
    let mut cache = cached.then(StackCache::default);
    for _ in 0..max_len {
        if live.is_empty() {
            break;
        }
        let b = live.len() as i64;
        let mem_real = real.expand([b, -1], false);
        let logits = match &mut cache {
            Some(cache) => {
                let newest: Vec<i64> = live.iter().map(|(s, _)| s.last().copied().unwrap_or(bos)).collect();
                let tgt = Tensor::from_slice(&newest).view([b, 1]).to_device(device);
                model.decode_cached(&tgt, &memory, &mem_real, cache)
            }
            None => {
                let rows: Vec<Tensor> = live
                    .iter()
                    .map(|(s, _)| {
                        Tensor::from_slice(&std::iter::once(bos).chain(s.iter().copied()).collect::<Vec<_>>())
                    })
                    .collect();
                let tgt = Tensor::stack(&rows, 0).to_device(device);
                model.decode(&tgt, &memory.expand([b, -1, -1], false), &mem_real, false)
            }
        };
        let log_probs = logits.select(1, -1).log_softmax(-1, Kind::Float).to_device(Device::Cpu);
        let scores: Vec<f64> = live.iter().map(|(_, score)| *score).collect();
        let mut next = Vec::new();
        let mut parents = Vec::new();
        for (i, id, score) in super::decode::ranked_continuations(&log_probs, &scores, width) {
            if id == eos {
                finished.push((live[i].0.clone(), score));
            } else {
                let mut seq = live[i].0.clone();
                seq.push(id);
                next.push((seq, score));
                parents.push(i as i64);
            }
            if next.len() == width {
                break;
            }
        }
        if let (Some(cache), false) = (&mut cache, next.is_empty()) {
            cache.select_rows(&Tensor::from_slice(&parents));
        }
        live = next;
    }
    // Hypotheses that never produced `eos` compete only when none did.
    if finished.is_empty() {
        finished = live;
    }
    finished
        .into_iter()
        .map(|(s, score)| {
            let ranked = score / length_penalty(s.len() + 1, alpha);
            (s, ranked)
        })
        .max_by(|a, b| a.1.total_cmp(&b.1))
        .map(|(s, _)| s)
        .unwrap_or_default()
}

/// sacreBLEU's default "13a" tokenisation: punctuation split from words, except inside numbers.
pub fn tokenize_13a(text: &str) -> Vec<String> {
    let mut s = format!(" {text} ");
    for (from, to) in
        [("<skipped>", ""), ("-\n", ""), ("\n", " "), ("&quot;", "\""), ("&amp;", "&"), ("&lt;", "<"), ("&gt;", ">")]
    {
        s = s.replace(from, to);
    }
    let chars: Vec<char> = s.chars().collect();
    let mut out = String::new();
    for (i, &c) in chars.iter().enumerate() {
        let prev = if i > 0 { chars[i - 1] } else { ' ' };
        let next = chars.get(i + 1).copied().unwrap_or(' ');
        let separate = match c {
            // {|}~[\]^_`' and friends, and the ASCII punctuation of 13a's first rule.
            '{' | '|' | '}' | '~' | '[' | '\\' | ']' | '^' | '_' | '`' | '!' | '"' | '#' | '$' | '%' | '&' | '('
            | ')' | '*' | '+' | '/' | ':' | ';' | '<' | '=' | '>' | '?' | '@' => true,
            // Periods and commas split unless between digits; a dash splits after a digit.
            '.' | ',' => !(prev.is_ascii_digit() && next.is_ascii_digit()),
            '-' => prev.is_ascii_digit(),
            _ => false,
        };
        if separate {
            out.push(' ');
            out.push(c);
            out.push(' ');
        } else {
            out.push(c);
        }
    }
    out.split_whitespace().map(str::to_string).collect()
}

/// Corpus-level BLEU (0–100) of hypotheses against one reference each, as sacreBLEU computes it by default:
/// 13a tokens, n-grams up to 4 with clipped counts summed over the corpus, geometric mean of the four
/// precisions (with its "exp" smoothing of orders without a match), brevity penalty exp(1 − r/c) when the
/// hypotheses are shorter.
pub fn bleu(hypotheses: &[String], references: &[String]) -> f64 {
    use std::collections::HashMap;
    let (mut matches, mut totals) = ([0usize; 4], [0usize; 4]);
    let (mut hyp_len, mut ref_len) = (0usize, 0usize);
    for (h, r) in hypotheses.iter().zip(references) {
        let (h, r) = (tokenize_13a(h), tokenize_13a(r));
        hyp_len += h.len();
        ref_len += r.len();
        for n in 1..=4 {
            let grams = |t: &[String]| -> HashMap<Vec<String>, usize> {
                let mut m = HashMap::new();
                for g in t.windows(n) {
                    *m.entry(g.to_vec()).or_insert(0) += 1;
                }
                m
            };
            let (hg, rg) = (grams(&h), grams(&r));
            totals[n - 1] += h.len().saturating_sub(n - 1);
            matches[n - 1] += hg.iter().map(|(g, &c)| c.min(rg.get(g).copied().unwrap_or(0))).sum::<usize>();
        }
    }
    if hyp_len == 0 || totals.contains(&0) {
        return 0.0;
    }
    // sacreBLEU's default "exp" smoothing: the k-th order with no match counts as 1 / (2^k · total).
    let mut smooth = 1.0;
    let log_precision: f64 = (0..4)
        .map(|i| {
            if matches[i] == 0 {
                smooth *= 2.0;
                (1.0 / (smooth * totals[i] as f64)).ln()
            } else {
                (matches[i] as f64 / totals[i] as f64).ln()
            }
        })
        .sum::<f64>()
        / 4.0;
    let brevity = if hyp_len < ref_len { (1.0 - ref_len as f64 / hyp_len as f64).exp() } else { 1.0 };
    100.0 * brevity * log_precision.exp()
}
