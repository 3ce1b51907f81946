//! Generating text from a decoder (UDL §12.7.3): feed the sequence, pick or sample the next token,
//! append it, repeat. Greedy decoding, temperature and top-k sampling, and beam search.
use tch::{Kind, Tensor};

use crate::transformer::layers::StackCache;

/// Anything that gives next-token logits (B, V) for a batch of token sequences (B, N).
pub trait NextToken {
    /// From the whole sequence (cropped to the model's context), recomputed at every call: the reference.
    fn next_token_logits(&self, idx: &Tensor) -> Tensor;

    /// The model's decoding with a KV cache, when it has one.
    fn cached(&self) -> Option<&dyn CachedNextToken> {
        None
    }
}

/// A decoder that keeps its keys and values between steps, so each new token costs one position's work.
pub trait CachedNextToken {
    /// The longest context the model reads (the uncached path crops to it).
    fn context(&self) -> i64;
    /// Logits (B, V) on the CPU after the new tokens `idx` (B, N_new), which follow the positions `cache`
    /// holds (an empty cache: they start the context); `cache` then holds them too.
    fn logits_after(&self, idx: &Tensor, cache: &mut StackCache) -> Tensor;
}

impl NextToken for super::gpt::Gpt {
    fn next_token_logits(&self, idx: &Tensor) -> Tensor {
        super::gpt::Gpt::next_token_logits(self, idx)
    }

    fn cached(&self) -> Option<&dyn CachedNextToken> {
        Some(self)
    }
}

impl CachedNextToken for super::gpt::Gpt {
    fn context(&self) -> i64 {
        self.block_size
    }

    fn logits_after(&self, idx: &Tensor, cache: &mut StackCache) -> Tensor {
        let logits = self.forward_cached(&idx.to_device(self.device()), cache);
        logits.select(1, -1).to_kind(Kind::Float).to_device(tch::Device::Cpu)
    }
}

/// Next-token logits for a batch of growing sequences (equal lengths), from a KV cache when `cached` and the
/// model has one, else from the whole context at every step. Past the context the cache is rebuilt from the
/// cropped context at every step (as the uncached path computes it; a cache that slid past the oldest token
/// would keep what deeper layers computed while they still saw it), so there the cache saves nothing.
pub struct Decoder<'m, M: NextToken + ?Sized> {
    model: &'m M,
    rows: Vec<Vec<i64>>,
    cache: Option<StackCache>,
    /// Row positions `held.0..held.1` are in the cache.
    held: (usize, usize),
}

impl<'m, M: NextToken + ?Sized> Decoder<'m, M> {
    pub fn new(model: &'m M, rows: Vec<Vec<i64>>, cached: bool) -> Self {
        assert!(!rows.is_empty() && rows.iter().all(|r| r.len() == rows[0].len() && !r.is_empty()));
        let cache = (cached && model.cached().is_some()).then(StackCache::default);
        Self { model, rows, cache, held: (0, 0) }
    }

    pub fn rows(&self) -> &[Vec<i64>] {
        &self.rows
    }

    /// Whether the logits come from a KV cache.
    pub fn is_cached(&self) -> bool {
        self.cache.is_some()
    }

    /// Logits (B, V) of the token after every row.
    pub fn logits(&mut self) -> Tensor {
        let len = self.rows[0].len();
        let (Some(cache), Some(model)) = (self.cache.as_mut(), self.model.cached()) else {
            return self.model.next_token_logits(&rows_tensor(&self.rows, 0, len));
        };
        let context = model.context().max(1) as usize;
        let (mut from, held_to) = self.held;
        if len - from > context {
            *cache = StackCache::default();
            from = len - context;
        }
        let feed_from = if cache.is_empty() { from } else { held_to };
        let logits = model.logits_after(&rows_tensor(&self.rows, feed_from, len), cache);
        self.held = (from, len);
        logits
    }

    /// Appends one token to every row.
    pub fn push(&mut self, tokens: &[i64]) {
        assert_eq!(tokens.len(), self.rows.len());
        for (row, &t) in self.rows.iter_mut().zip(tokens) {
            row.push(t);
        }
    }

    /// Keeps the rows `keep` (indices, repeats allowed), in that order: beam search's reordering.
    pub fn select(&mut self, keep: &[usize]) {
        self.rows = keep.iter().map(|&i| self.rows[i].clone()).collect();
        if let Some(cache) = &mut self.cache {
            let index: Vec<i64> = keep.iter().map(|&i| i as i64).collect();
            cache.select_rows(&Tensor::from_slice(&index));
        }
    }
}

/// Columns `from..to` of equal-length rows, as (B, to − from).
fn rows_tensor(rows: &[Vec<i64>], from: usize, to: usize) -> Tensor {
    let flat: Vec<i64> = rows.iter().flat_map(|r| r[from..to].iter().copied()).collect();
    Tensor::from_slice(&flat).view([rows.len() as i64, (to - from) as i64])
}

#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Decoding {
    Greedy,
    /// Sample from softmax(logits / temperature), restricted to the `top_k` most likely tokens when set.
    Sample {
        temperature: f64,
        top_k: Option<i64>,
    },
    /// Keep the `width` most likely partial sequences; return the most likely full one.
    Beam {
        width: usize,
    },
}

/// Extends `prompt` by `new_tokens` tokens, with the model's KV cache when `cached` (the same tokens, faster).
/// Sampling draws from libtorch's generator (seed it with `tch::manual_seed` for reproducible samples).
pub fn generate(
    model: &(impl NextToken + ?Sized),
    prompt: &[i64],
    new_tokens: usize,
    decoding: Decoding,
    cached: bool,
) -> Vec<i64> {
    let _guard = tch::no_grad_guard();
    let decoder = Decoder::new(model, vec![prompt.to_vec()], cached);
    match decoding {
        Decoding::Greedy => extend(decoder, new_tokens, |logits| logits.argmax(-1, false)),
        Decoding::Sample { temperature, top_k } => {
            extend(decoder, new_tokens, |logits| sample_next(logits, temperature, top_k))
        }
        Decoding::Beam { width } => beam_search(decoder, new_tokens, width),
    }
}

fn extend<M: NextToken + ?Sized>(
    mut decoder: Decoder<M>,
    new_tokens: usize,
    pick: impl Fn(&Tensor) -> Tensor,
) -> Vec<i64> {
    for _ in 0..new_tokens {
        let logits = decoder.logits();
        decoder.push(&[pick(&logits).int64_value(&[0])]);
    }
    decoder.rows.swap_remove(0)
}

/// One sampled token id per row of `logits` (B, V). With `top_k`, only the k most likely ids can come out:
/// the draw is over the top-k values, then mapped back through their indices to real token ids.
pub fn sample_next(logits: &Tensor, temperature: f64, top_k: Option<i64>) -> Tensor {
    assert!(temperature > 0.0, "temperature must be positive");
    let scaled = logits.to_kind(Kind::Float) / temperature;
    match top_k {
        Some(k) => {
            let k = k.min(scaled.size()[1]);
            let (values, indices) = scaled.topk(k, -1, true, true);
            let choice = values.softmax(-1, Kind::Float).multinomial(1, false); // index into the top-k list
            indices.gather(-1, &choice, false).squeeze_dim(-1)
        }
        None => scaled.softmax(-1, Kind::Float).multinomial(1, false).squeeze_dim(-1),
    }
}

fn beam_search<M: NextToken + ?Sized>(mut decoder: Decoder<M>, new_tokens: usize, width: usize) -> Vec<i64> {
    assert!(width >= 1, "beam width must be at least 1");
    // Total log-probability of each beam's generated part; the decoder holds the beams' sequences.
    let mut scores: Vec<f64> = vec![0.0];
    for _ in 0..new_tokens {
        let log_probs = decoder.logits().log_softmax(-1, Kind::Float);
        let best: Vec<(usize, i64, f64)> =
            ranked_continuations(&log_probs, &scores, width).into_iter().take(width).collect();
        decoder.select(&best.iter().map(|&(b, _, _)| b).collect::<Vec<_>>());
        decoder.push(&best.iter().map(|&(_, id, _)| id).collect::<Vec<_>>());
        scores = best.iter().map(|&(_, _, score)| score).collect();
    }
    decoder.rows.swap_remove(0)
}

/// One beam-search step: each beam's `width` most likely next tokens (of `log_probs` (B, V), one row per
/// beam), as (beam, token, beam score + token log-probability), best first. Ties go to the earlier beam and
/// the more likely token, so width 1 is greedy.
pub fn ranked_continuations(log_probs: &Tensor, scores: &[f64], width: usize) -> Vec<(usize, i64, f64)> {
    let k = width.min(log_probs.size()[1] as usize);
    let (top_lp, top_id) = log_probs.topk(k as i64, -1, true, true);
    let top_lp = Vec::<f64>::try_from(top_lp.to_kind(Kind::Double).view([-1])).expect("log-probabilities");
    let top_id = Vec::<i64>::try_from(top_id.view([-1])).expect("token ids");
    let mut candidates: Vec<(usize, i64, f64)> = Vec::with_capacity(scores.len() * k);
    for (b, score) in scores.iter().enumerate() {
        for j in 0..k {
            candidates.push((b, top_id[b * k + j], score + top_lp[b * k + j]));
        }
    }
    // A stable sort keeps the (beam, rank) order among equal scores.
    candidates.sort_by(|a, b| b.2.total_cmp(&a.2));
    candidates
}

/// The total log-probability the model gives to `continuation` after `prompt`.
pub fn sequence_log_prob(model: &(impl NextToken + ?Sized), prompt: &[i64], continuation: &[i64]) -> f64 {
    let _guard = tch::no_grad_guard();
    let mut decoder = Decoder::new(model, vec![prompt.to_vec()], true);
    let mut total = 0.0;
    for &t in continuation {
        total += decoder.logits().log_softmax(-1, Kind::Float).double_value(&[0, t]);
        decoder.push(&[t]);
    }
    total
}
