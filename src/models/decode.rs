//! Generating text from a decoder (UDL §12.7.3): feed the sequence, pick or sample the next token,
//! append it, repeat. Greedy decoding, temperature and top-k sampling, and beam search.
use tch::{Kind, Tensor};

/// Anything that gives next-token logits (B, V) for a batch of token sequences (B, N).
pub trait NextToken {
    fn next_token_logits(&self, idx: &Tensor) -> Tensor;
}

impl NextToken for super::gpt::Gpt {
    fn next_token_logits(&self, idx: &Tensor) -> Tensor {
        super::gpt::Gpt::next_token_logits(self, idx)
    }
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

/// Extends `prompt` by `new_tokens` tokens. Sampling draws from libtorch's generator (seed it with
/// `tch::manual_seed` for reproducible samples).
pub fn generate(model: &(impl NextToken + ?Sized), prompt: &[i64], new_tokens: usize, decoding: Decoding) -> Vec<i64> {
    let _guard = tch::no_grad_guard();
    match decoding {
        Decoding::Greedy => extend(model, prompt, new_tokens, |logits| logits.argmax(-1, false)),
        Decoding::Sample { temperature, top_k } => {
            extend(model, prompt, new_tokens, |logits| sample_next(logits, temperature, top_k))
        }
        Decoding::Beam { width } => beam_search(model, prompt, new_tokens, width),
    }
}

fn extend(
    model: &(impl NextToken + ?Sized),
    prompt: &[i64],
    new_tokens: usize,
    pick: impl Fn(&Tensor) -> Tensor,
) -> Vec<i64> {
    let mut seq = prompt.to_vec();
    for _ in 0..new_tokens {
        let idx = Tensor::from_slice(&seq).unsqueeze(0);
        let logits = model.next_token_logits(&idx);
        seq.push(pick(&logits).int64_value(&[0]));
    }
    seq
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

fn beam_search(model: &(impl NextToken + ?Sized), prompt: &[i64], new_tokens: usize, width: usize) -> Vec<i64> {
    assert!(width >= 1, "beam width must be at least 1");
    // (sequence, total log-probability of the generated part)
    let mut beams: Vec<(Vec<i64>, f64)> = vec![(prompt.to_vec(), 0.0)];
    for _ in 0..new_tokens {
        let rows: Vec<Tensor> = beams.iter().map(|(s, _)| Tensor::from_slice(s)).collect();
        let idx = Tensor::stack(&rows, 0);
        let log_probs = model.next_token_logits(&idx).log_softmax(-1, Kind::Float);
        let scores: Vec<f64> = beams.iter().map(|(_, score)| *score).collect();
        beams = ranked_continuations(&log_probs, &scores, width)
            .into_iter()
            .take(width)
            .map(|(b, id, score)| {
                let mut s = beams[b].0.clone();
                s.push(id);
                (s, score)
            })
            .collect();
    }
    beams.swap_remove(0).0
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
    let mut seq = prompt.to_vec();
    let mut total = 0.0;
    for &t in continuation {
        let logits = model.next_token_logits(&Tensor::from_slice(&seq).unsqueeze(0));
        total += logits.log_softmax(-1, Kind::Float).double_value(&[0, t]);
        seq.push(t);
    }
    total
}
