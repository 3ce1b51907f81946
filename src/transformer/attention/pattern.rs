//! Sparse attention patterns (UDL §12.9: convolutional and dilated windows, selected tokens that attend
//! globally, extra global tokens) and their truly sparse kernel.
//!
//! A pattern allows query i to see key j when any part allows it:
//! - `window` w with `dilation` d: |i − j| ≤ w·d and d divides i − j (the token itself always);
//! - global positions: the first `global_tokens` positions (extra learned tokens a model prepends) and every
//!   `global_every`-th position after them (e.g. the first token of each block) attend to all and are attended
//!   by all.
//!
//! A causal model intersects this with j ≤ i. No window and no selected positions means dense attention.
//!
//! Two implementations compute the same thing. Mask-based: the allowed matrix becomes a −∞ bias on the full
//! N×N scores (simple, O(N²) time and memory whatever the pattern). Sparse (`sliding_window_attention`): the
//! sequence is cut into blocks of w queries that each score only their own and neighbouring blocks of keys
//! (the dilation is handled by regrouping positions by their residue mod d first), plus a column per global
//! key and a dense row per global query: time and memory grow with N·(w + globals), not N².
use tch::{Kind, Tensor};

use super::relative::Relative;
use super::ScorePath;
use crate::transformer::spec::Pattern;

/// Finite stand-in for −∞ in the sparse kernel's scores of `kind`: padded query rows have no valid key, and a
/// finite value keeps their (discarded) softmax free of NaN, which would otherwise leak into the backward
/// pass. −1e9 overflows half precision (largest finite 65504), so fp16 scores take −3e4: still zero after
/// the softmax's exp, and with room left for a score or bias added to it without reaching −∞.
fn masked(kind: Kind) -> f64 {
    match kind {
        Kind::Half => -3.0e4,
        _ => -1e9,
    }
}

/// The largest intermediate the kernel builds at once (see the chunking in `sliding_window_attention`).
const CHUNK_BYTES: i64 = 16 << 20;

/// [`Pattern::global_positions`] as an index tensor built on `device` (the first `global_tokens` positions,
/// then every `global_every`-th), with no copy from the host: a pageable host-to-device copy in every layer's
/// forward would wait for the GPU's queue each time.
fn global_index(pattern: &Pattern, n: i64, device: tch::Device) -> Tensor {
    let g = pattern.global_tokens.min(n);
    let first = Tensor::arange(g, (Kind::Int64, device));
    match pattern.global_every {
        Some(every) if g < n => Tensor::cat(&[first, Tensor::arange_start_step(g, n, every, (Kind::Int64, device))], 0),
        _ => first,
    }
}

/// (N, N) boolean: true where query i may attend to key j under `pattern`; `None` for dense non-causal
/// attention.
pub fn allowed(pattern: &Pattern, n: i64, causal: bool, device: tch::Device) -> Option<Tensor> {
    let i = Tensor::arange(n, (Kind::Int64, device)).view([n, 1]);
    let j = Tensor::arange(n, (Kind::Int64, device)).view([1, n]);
    let dist = &i - &j;
    let mut allowed = if pattern.is_dense() {
        if !causal {
            return None;
        }
        dist.ones_like().to_kind(Kind::Bool)
    } else {
        let w = pattern.window.unwrap_or(0);
        let d = pattern.dilation;
        let mut band = dist.abs().le(w * d).logical_and(&dist.remainder(d).eq(0));
        let globals = pattern.global_positions(n);
        if !globals.is_empty() {
            let g = Tensor::zeros([n], (Kind::Bool, device)).index_fill(0, &global_index(pattern, n, device), 1);
            band = band.logical_or(&g.view([n, 1])).logical_or(&g.view([1, n]));
        }
        band
    };
    if causal {
        allowed = allowed.logical_and(&dist.ge(0));
    }
    Some(allowed)
}

/// Attention under a windowed pattern (plus its global positions), computed block by block.
/// q, k, v: (B, H, N, d) self-attention inputs (q and k already rotated for RoPE); the result is (B, H, N, d)
/// and equals the mask-based computation of the same pattern.
pub fn sliding_window_attention(q: &Tensor, k: &Tensor, v: &Tensor, pattern: &Pattern, rules: &ScoreRules) -> Tensor {
    windowed(q, k, v, pattern, rules, CHUNK_BYTES, true)
}

/// How a call scores and weighs keys beyond q·k: causality, the one score-to-probability path (scale, soft
/// cap, softmax, dropout: [`ScorePath`]), the relative position scheme and the keys that are padding.
#[derive(Clone)]
pub struct ScoreRules<'a> {
    pub causal: bool,
    pub path: ScorePath,
    pub relative: &'a Relative,
    /// (B, N) boolean, true where the key is a real token: no query sees a padding key other than itself
    /// (a padding query keeps its own position, so that no row of scores is empty; its output is discarded).
    pub key_padding: Option<&'a Tensor>,
}

/// (B, 1, d, blocks, 1, span·w) boolean, true where a key of a block's span is padding (positions outside
/// the sequence are already invalid in the geometry's mask, and count as real here).
fn padding_blocks(real: &Tensor, geometry: &Blocks) -> Tensor {
    let Blocks { n, w, d, m, m_pad, span, pad_right, .. } = *geometry;
    let b = real.size()[0];
    let padding = real.logical_not().to_kind(Kind::Float).view([b, 1, n, 1]);
    regroup_rows(&padding, n, d, m, m_pad)
        .constant_pad_nd([0, 0, w, pad_right])
        .unfold(3, span * w, w) // (B, 1, d, blocks, 1, span·w)
        .gt(0.5)
}

/// (B, 1, N_q, N_k) boolean, true where query `rows` (positions) may not see key j because it is padding
/// (its own position excepted).
pub(super) fn padding_of_rows(real: &Tensor, rows: &Tensor) -> Tensor {
    let (b, n) = (real.size()[0], real.size()[1]);
    let j = Tensor::arange(n, (Kind::Int64, real.device())).view([1, n]);
    let own = rows.view([-1, 1]).eq_tensor(&j); // (N_q, N)
    real.logical_not().view([b, 1, 1, n]).logical_and(&own.logical_not().unsqueeze(0).unsqueeze(0))
}

/// [`sliding_window_attention`] with the chunk budget as a parameter (the tests shrink it to force chunks),
/// and whether blocks may go through libtorch's fused attention (`fused`; the tests compare both ways).
fn windowed(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    pattern: &Pattern,
    rules: &ScoreRules,
    chunk_bytes: i64,
    fused: bool,
) -> Tensor {
    let ScoreRules { causal, ref path, relative, key_padding } = *rules;
    let (b, h, n, dh) = q.size4().unwrap();
    let globals = pattern.global_positions(n);
    let geometry = Blocks::new(pattern, n, causal);
    let dropping = path.train && path.dropout > 0.0;
    if fused && globals.is_empty() && !relative.biases_scores() && !dropping && path.fused_cannot().is_none() {
        return windowed_fused(q, k, v, &geometry, path, key_padding, chunk_bytes);
    }
    let Blocks { w, d, m, blocks, m_pad, span, pad_right, .. } = geometry;
    let dv = v.size()[3];
    let device = q.device();
    let kind = q.kind();
    let regroup = |t: &Tensor| regroup_rows(t, n, d, m, m_pad);
    let (qg, kg, vg) = (regroup(q), regroup(k), regroup(v));
    let unfold = |t: &Tensor| -> Tensor {
        t.constant_pad_nd([0, 0, w, pad_right]).unfold(3, span * w, w).transpose(-1, -2)
        // (B, H, d, blocks, span·w, dh)
    };
    let (k_blocks, v_blocks) = (unfold(&kg), unfold(&vg));
    let q_blocks = qg.view([b, h, d, blocks, w, dh]);

    let (steps, invalid) = geometry.mask(device);
    // Padding keys, except each query's own position (offset 0), join the invalid pairs: (B, 1, d, blocks,
    // w, span·w).
    let invalid = match key_padding {
        Some(real) => padding_blocks(real, &geometry).logical_and(&steps.ne(0)).logical_or(&invalid),
        None => invalid,
    };

    let g_idx = global_index(pattern, n, device);
    let g = globals.len() as i64;
    let global_keys = (!globals.is_empty()).then(|| {
        let (g_scores, v_glob) = global_key_scores(q, k, v, &g_idx, &geometry, rules);
        (regroup(&g_scores).view([b, h, d, blocks, w, g]), v_glob.view([b, h, 1, 1, g, dv]))
    });

    // The blocks go through in chunks whose largest intermediate (the scores, or the keys gathered for a
    // matmul) stays under `chunk_bytes`: glibc serves every allocation over 32 MB with a fresh mmap that is
    // page-faulted in on every call, which made the forward at 16K tokens 4× the time at 8K.
    // Pieces of one `split` rather than a `narrow` each, so that backward concatenates their gradients once
    // instead of sending each chunk's back as a zero-filled tensor of the whole input (see `windowed_fused`).
    let sizes = geometry.chunk_sizes(b * h, w.max(dh).max(dv), kind, chunk_bytes);
    let (q_chunks, k_chunks, v_chunks) = (
        q_blocks.split_with_sizes(&sizes, 3),
        k_blocks.split_with_sizes(&sizes, 3),
        v_blocks.split_with_sizes(&sizes, 3),
    );
    let g_chunks = global_keys.as_ref().map(|(g_scores, _)| g_scores.split_with_sizes(&sizes, 3));
    // The block axis: 1 of (d, blocks, …), 3 of (B, 1, d, blocks, …) once padding is in.
    let invalid_chunks = invalid.split_with_sizes(&sizes, invalid.dim() as i64 - 3);
    let outs: Vec<Tensor> = (0..sizes.len())
        .map(|i| {
            let (qb, kb, vb) = (&q_chunks[i], &k_chunks[i], &v_chunks[i]);
            let bias = relative.score_bias(qb, &(&steps * d), causal, path.map.scale);
            let scores = path.logits(qb.matmul(&kb.transpose(-1, -2)), bias.as_ref()); // (B, H, d, cb, w, span·w)
            let scores = scores.masked_fill(&invalid_chunks[i], masked(kind));
            match (&global_keys, &g_chunks) {
                (Some((_, v_glob)), Some(g_chunks)) => {
                    // One softmax over the block's keys and the global keys together.
                    let joint = path.dropped(&path.probabilities(&Tensor::cat(&[&scores, &g_chunks[i]], -1)));
                    joint.narrow(-1, 0, span * w).matmul(vb) + joint.narrow(-1, span * w, g).matmul(v_glob)
                }
                _ => path.attend(&scores, vb).0,
            }
        })
        .collect();
    let out = if outs.len() == 1 { outs[0].shallow_clone() } else { Tensor::cat(&outs, 3) };
    // Back to positions: (B, H, d, blocks·w, dv) -> (B, H, m, d, dv) -> (B, H, N, dv).
    let out = out.view([b, h, d, m_pad, dv]).narrow(3, 0, m).transpose(2, 3).contiguous().view([b, h, m * d, dv]);
    let mut out = out.narrow(2, 0, n);
    if !globals.is_empty() {
        out = out.index_copy(2, &g_idx, &global_rows(q, k, v, &g_idx, rules));
    }
    out
}

/// The scores (B, H, N, g) of every query against the global keys `g_idx` that its window does not already
/// cover (the rest masked, as are causal futures and padding), and those keys' values (B, H, g, dv).
fn global_key_scores(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    g_idx: &Tensor,
    geometry: &Blocks,
    rules: &ScoreRules,
) -> (Tensor, Tensor) {
    let ScoreRules { causal, ref path, relative, key_padding } = *rules;
    let (b, _, n, _) = q.size4().unwrap();
    let (w, d, g) = (geometry.w, geometry.d, g_idx.size()[0]);
    let (k_glob, v_glob) = (k.index_select(2, g_idx), v.index_select(2, g_idx)); // (B, H, g, dh)
    let i = Tensor::arange(n, (Kind::Int64, q.device())).view([n, 1]);
    let g_dist = &i - g_idx.view([1, g]); // (N, g)
    let bias = relative.score_bias(q, &g_dist, causal, path.map.scale);
    let g_scores = path.logits(q.matmul(&k_glob.transpose(-1, -2)), bias.as_ref()); // (B, H, N, g)
    let in_window = g_dist.abs().le(w * d).logical_and(&g_dist.remainder(d).eq(0));
    let mut g_ok = in_window.logical_not();
    if causal {
        g_ok = g_ok.logical_and(&g_dist.ge(0));
    }
    let mut g_masked = g_ok.logical_not().view([1, 1, n, g]);
    if let Some(real) = key_padding {
        let padded = real.index_select(1, g_idx).logical_not().view([b, 1, 1, g]);
        g_masked = g_masked.logical_or(&padded);
    }
    let fill = masked(g_scores.kind());
    (g_scores.masked_fill(&g_masked, fill), v_glob)
}

/// The outputs (B, H, g, dv) of the global queries `g_idx`: each a dense row over every key (up to itself
/// when causal, real keys only under padding).
fn global_rows(q: &Tensor, k: &Tensor, v: &Tensor, g_idx: &Tensor, rules: &ScoreRules) -> Tensor {
    let ScoreRules { causal, ref path, relative, key_padding } = *rules;
    let n = k.size()[2];
    let q_glob = q.index_select(2, g_idx);
    let j = Tensor::arange(n, (Kind::Int64, q.device())).view([1, n]);
    let row_dist = g_idx.view([-1, 1]) - j; // (g, N)
    let bias = relative.score_bias(&q_glob, &row_dist, causal, path.map.scale);
    let mut rows = path.logits(q_glob.matmul(&k.transpose(-1, -2)), bias.as_ref()); // (B, H, g, N)
    if causal {
        rows = rows.masked_fill(&row_dist.lt(0), masked(rows.kind()));
    }
    if let Some(real) = key_padding {
        rows = rows.masked_fill(&padding_of_rows(real, g_idx), masked(rows.kind()));
    }
    path.attend(&rows, v).0
}

/// How the kernel cuts a sequence of `n` positions. Positions are regrouped by residue mod the dilation
/// `d` (residue r, index s <-> position s·d + r), so that a dilated window is a plain window of `w`
/// neighbours (each side) within each residue class of `m` positions, padded to `blocks` blocks of `w`
/// queries (`m_pad` in all). Each block scores a span of `span` key blocks: the previous one, its own and
/// (non-causal) the next, the keys padded by a block on the left and `pad_right` on the right.
#[derive(Clone, Copy)]
struct Blocks {
    n: i64,
    causal: bool,
    w: i64,
    d: i64,
    m: i64,
    blocks: i64,
    m_pad: i64,
    span: i64,
    pad_right: i64,
}

impl Blocks {
    fn new(pattern: &Pattern, n: i64, causal: bool) -> Self {
        let w = pattern.window.expect("the sparse kernel needs a window");
        let d = pattern.dilation;
        let m = (n + d - 1) / d;
        let blocks = (m + w - 1) / w;
        let (span, pad_right) = if causal { (2, 0) } else { (3, w) };
        Self { n, causal, w, d, m, blocks, m_pad: blocks * w, span, pad_right }
    }

    /// The offsets and the mask of the blocks: `steps` (w, span·w), query index minus key index within a
    /// residue class, and `invalid` (d, blocks, w, span·w), true where a query may not see a key of its span
    /// (outside the window, after it when causal, or outside the sequence: block padding, a residue class
    /// running past N).
    fn mask(&self, device: tch::Device) -> (Tensor, Tensor) {
        let Self { n, causal, w, d, m, blocks, span, .. } = *self;
        // Offsets in residue steps: query a of block c is at c·w + a, key t of its span at (c − 1)·w + t.
        let a = Tensor::arange(w, (Kind::Int64, device)).view([w, 1]);
        let t = Tensor::arange(span * w, (Kind::Int64, device)).view([1, span * w]);
        let steps = &a + w - &t;
        let mut allowed = steps.abs().le(w);
        if causal {
            allowed = allowed.logical_and(&steps.ge(0));
        }
        let c = Tensor::arange(blocks, (Kind::Int64, device)).view([blocks, 1]);
        let key_index = (&c - 1) * w + Tensor::arange(span * w, (Kind::Int64, device)).view([1, span * w]); // (blocks, span·w)
        let r = Tensor::arange(d, (Kind::Int64, device)).view([d, 1, 1]);
        let key_pos = key_index.unsqueeze(0) * d + &r; // (d, blocks, span·w)
        let key_ok =
            key_index.ge(0).unsqueeze(0).logical_and(&key_index.lt(m).unsqueeze(0)).logical_and(&key_pos.lt(n));
        let invalid = allowed.view([1, 1, w, span * w]).logical_and(&key_ok.unsqueeze(2)).logical_not();
        (steps, invalid)
    }

    /// The number of blocks in each chunk, in order, so that a chunk's largest intermediate stays under
    /// `chunk_bytes` (why: the chunking in `windowed`): `rows` (batch × heads) of `width` numbers per
    /// query–key pair of each block's span.
    fn chunk_sizes(&self, rows: i64, width: i64, kind: Kind, chunk_bytes: i64) -> Vec<i64> {
        let per_block = rows * self.d * self.span * self.w * width * kind.elt_size_in_bytes() as i64;
        let chunk = (chunk_bytes / per_block.max(1)).clamp(1, self.blocks);
        (0..self.blocks).step_by(chunk as usize).map(|c0| chunk.min(self.blocks - c0)).collect()
    }
}

/// The window kernel through libtorch's fused attention ([`ScorePath::fused`], which adds what the path puts
/// beside the keys), for patterns without global positions, a relative score bias or dropout: each block of w queries is plain attention over its span of keys under an additive
/// mask, computed without materialising the scores, forward and backward. The blocks are the fused kernel's
/// batch and the heads stay its heads, so queries and the output keep the projection's (B, N, H, ·) memory
/// layout: for a contiguous window no copy of either is made.
fn windowed_fused(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    geometry: &Blocks,
    path: &ScorePath,
    key_padding: Option<&Tensor>,
    chunk_bytes: i64,
) -> Tensor {
    let Blocks { n, w, d, m, blocks, m_pad, span, pad_right, .. } = *geometry;
    let (b, h, _, dh) = q.size4().unwrap();
    let dv = v.size()[3];
    let kind = q.kind();
    // (B, H, N, x) -> (B, d, m_pad, H, x): position s·d + r at residue r, index s (views when d = 1 and w
    // divides N).
    let regroup = |t: &Tensor, left: i64, right: i64| {
        let x = t.size()[3];
        let by_position = t.transpose(1, 2);
        let by_position = if m * d > n { by_position.constant_pad_nd([0, 0, 0, 0, 0, m * d - n]) } else { by_position };
        let by_residue = by_position.view([b, m, d, h, x]).transpose(1, 2);
        let right = right + m_pad - m;
        if left + right > 0 {
            by_residue.constant_pad_nd([0, 0, 0, 0, left, right])
        } else {
            by_residue
        }
    };
    let qg = regroup(q, 0, 0);
    // Keys padded by a block on the left (and right, non-causal), as whole blocks: (B, d, blocks + span − 1,
    // w, H, x); a block's span is `span` consecutive ones.
    let key_blocks = |t: &Tensor| regroup(t, w, pad_right).view([b, d, blocks + span - 1, w, h, t.size()[3]]);
    let (kb, vb) = (key_blocks(k), key_blocks(v));
    let (steps, invalid) = geometry.mask(q.device());
    // (B or 1, d, blocks, w, span·w), additive: the geometry's, and padding keys except each query's own
    // position.
    let invalid = match key_padding {
        Some(real) => padding_blocks(real, geometry).squeeze_dim(1).logical_and(&steps.ne(0)).logical_or(&invalid),
        None => invalid.unsqueeze(0),
    };
    let mask = Tensor::zeros(invalid.size(), (kind, q.device())).masked_fill(&invalid, masked(kind));
    // Chunks of blocks keep the gathered keys under `chunk_bytes`. Each chunk's queries and keys are pieces
    // of one `split` of the whole tensors (per span offset, for the keys) rather than a `narrow` each:
    // autograd sends a narrow's gradient back as a zero-filled tensor of the whole input, so per-chunk
    // narrows made the backward pass O(chunks × N); a split's backward is one concatenation.
    let sizes = geometry.chunk_sizes(b * h, dh.max(dv), kind, chunk_bytes);
    let rows: Vec<i64> = sizes.iter().map(|cb| cb * w).collect();
    let q_chunks = qg.split_with_sizes(&rows, 2);
    // Per offset j of a span, key blocks j .. j + blocks, cut into the chunks.
    let shifted = |t: &Tensor| -> Vec<Vec<Tensor>> {
        (0..span).map(|j| t.narrow(2, j, blocks).split_with_sizes(&sizes, 2)).collect()
    };
    let (k_shifted, v_shifted) = (shifted(&kb), shifted(&vb));
    let mask_chunks = mask.split_with_sizes(&sizes, 2);
    let outs: Vec<Tensor> = sizes
        .iter()
        .enumerate()
        .map(|(i, &cb)| {
            let spans = |shifted: &[Vec<Tensor>]| {
                let x = shifted[0][i].size()[5];
                let parts: Vec<&Tensor> = shifted.iter().map(|pieces| &pieces[i]).collect();
                Tensor::cat(&parts, 3).view([b * d * cb, span * w, h, x]).transpose(1, 2)
            };
            let qb = q_chunks[i].reshape([b * d * cb, w, h, dh]).transpose(1, 2);
            let mask = mask_chunks[i].expand([b, d, cb, w, span * w], false).reshape([b * d * cb, 1, w, span * w]);
            let out = path.fused(&qb, &spans(&k_shifted), &spans(&v_shifted), Some(&mask), false);
            // (B·d·cb, H, w, dv), laid out as (B·d·cb, w, H, dv)
            out.transpose(1, 2).reshape([b, d, cb * w, h, dv])
        })
        .collect();
    let out = if outs.len() == 1 { outs[0].shallow_clone() } else { Tensor::cat(&outs, 2) };
    // Back to positions: (B, d, m_pad, H, dv) -> (B, m, d, H, dv) -> (B, N, H, dv) -> (B, H, N, dv).
    let out = out.narrow(2, 0, m).transpose(1, 2).reshape([b, m * d, h, dv]);
    out.narrow(1, 0, n).transpose(1, 2)
}

/// (B, H, N, X) laid out by position -> (B, H, d, m_pad, X) laid out by residue class, as the kernel's blocks.
fn regroup_rows(t: &Tensor, n: i64, d: i64, m: i64, m_pad: i64) -> Tensor {
    let (b, h, _, x) = t.size4().unwrap();
    let padded = t.constant_pad_nd([0, 0, 0, m * d - n]);
    padded.view([b, h, m, d, x]).transpose(2, 3).constant_pad_nd([0, 0, 0, m_pad - m])
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::transformer::attention::ScoreMap;
    use crate::transformer::spec::{PositionEncoding, PositionSpec};

    #[test]
    fn the_global_index_built_on_the_device_lists_the_global_positions() {
        for (global_tokens, global_every, n) in
            [(0, None, 10), (2, None, 10), (3, Some(4), 17), (0, Some(3), 9), (12, Some(2), 10), (1, Some(1), 5)]
        {
            let pattern = Pattern { window: Some(2), global_tokens, global_every, ..Pattern::dense() };
            let index = Vec::<i64>::try_from(global_index(&pattern, n, tch::Device::Cpu)).unwrap();
            assert_eq!(index, pattern.global_positions(n), "{global_tokens} {global_every:?} {n}");
        }
    }

    #[test]
    fn fused_blocks_compute_what_the_explicit_products_compute_forward_and_backward() {
        tch::manual_seed(1);
        let rel = Relative::new(
            &tch::nn::VarStore::new(tch::Device::Cpu).root(),
            &PositionSpec::of(PositionEncoding::None),
            2,
            8,
            None,
        );
        // Lengths that leave padded blocks and residue classes of unequal length; one block per chunk and
        // all blocks in one.
        for (pattern, causal, n, chunk_bytes) in [
            (Pattern { window: Some(3), ..Pattern::dense() }, false, 41, 1 << 40),
            (Pattern { window: Some(3), ..Pattern::dense() }, true, 40, 1),
            (Pattern { window: Some(2), dilation: 3, ..Pattern::dense() }, true, 37, 1 << 40),
            (Pattern { window: Some(4), dilation: 2, ..Pattern::dense() }, false, 29, 1),
        ] {
            let inputs: Vec<Tensor> = (0..3)
                .map(|_| Tensor::randn([2, 2, n, 8], (Kind::Float, tch::Device::Cpu)).set_requires_grad(true))
                .collect();
            let run = |fused| {
                let rules = ScoreRules {
                    causal,
                    path: ScorePath::eval(ScoreMap::scaled(0.35)),
                    relative: &rel,
                    key_padding: None,
                };
                let out = windowed(&inputs[0], &inputs[1], &inputs[2], &pattern, &rules, chunk_bytes, fused);
                let grads = Tensor::run_backward(&[(&out * &out).sum(Kind::Float)], &inputs, false, false);
                (out, grads)
            };
            let ((fused, g_fused), (explicit, g_explicit)) = (run(true), run(false));
            assert!(fused.allclose(&explicit, 1e-5, 1e-5, false), "{pattern:?} causal {causal}");
            for (a, b) in g_fused.iter().zip(&g_explicit) {
                assert!(a.allclose(b, 1e-4, 1e-5, false), "{pattern:?} causal {causal} gradients");
            }
        }
    }

    #[test]
    fn chunked_blocks_compute_what_one_chunk_computes_forward_and_backward() {
        tch::manual_seed(0);
        let relative = |encoding| {
            Relative::new(&tch::nn::VarStore::new(tch::Device::Cpu).root(), &PositionSpec::of(encoding), 2, 8, None)
        };
        for (pattern, causal, encoding) in [
            (Pattern { window: Some(3), ..Pattern::dense() }, false, PositionEncoding::None),
            (Pattern { window: Some(2), dilation: 3, ..Pattern::dense() }, true, PositionEncoding::Alibi),
            (Pattern { window: Some(4), global_every: Some(9), ..Pattern::dense() }, false, PositionEncoding::T5),
        ] {
            let rel = relative(encoding);
            let inputs: Vec<Tensor> = (0..3)
                .map(|_| Tensor::randn([2, 2, 41, 8], (Kind::Float, tch::Device::Cpu)).set_requires_grad(true))
                .collect();
            let run = |chunk_bytes| {
                let rules = ScoreRules {
                    causal,
                    path: ScorePath::eval(ScoreMap::scaled(0.35)),
                    relative: &rel,
                    key_padding: None,
                };
                let out = windowed(&inputs[0], &inputs[1], &inputs[2], &pattern, &rules, chunk_bytes, true);
                let grads = Tensor::run_backward(&[(&out * &out).sum(Kind::Float)], &inputs, false, false);
                (out, grads)
            };
            // One block per chunk against every block in one chunk.
            let ((one, g_one), (many, g_many)) = (run(1 << 40), run(1));
            assert!(one.allclose(&many, 1e-5, 1e-6, false), "{pattern:?}");
            for (a, b) in g_one.iter().zip(&g_many) {
                assert!(a.allclose(b, 1e-5, 1e-6, false), "{pattern:?} gradients");
            }
        }
    }
}
