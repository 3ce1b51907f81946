//! Relative position schemes (UDL §12.3.1 "relative position encodings"; the Annotated Transformer
//! notes' Shaw, T5, ALiBi and RoPE). Each depends only on the offset i − j between a query at position i and a
//! key at position j, never on i or j themselves:
//! - Shaw et al. 2018: a learned vector a_{clip(j−i)} per clipped offset; score += q_i · a_{clip(j−i)} (the
//!   keys-side term; the paper's values-side term added little and is left out);
//! - T5: a learned scalar per head for each log-spaced bucket of the offset (causal or bidirectional buckets);
//! - ALiBi: a fixed per-head penalty −m_h·|i−j| with the paper's geometric slopes;
//! - RoPE: rotate pairs of q and k coordinates by angles proportional to the position, so q_i·k_j depends on
//!   i − j only;
//! - the 2-D bias (Swin's relative position bias): a learned scalar per head for each 2-D offset
//!   (Δrow, Δcol) between two tokens of a grid.
//!
//! The 1-D score biases take a tensor of offsets `dist = i − j` laid out like the score matrix, so the same
//! code serves dense scores (N_q, N_k) and the blocked layouts of the sparse kernels.
use tch::{nn, Kind, Tensor};

use crate::transformer::spec::{PositionEncoding, PositionSpec};

/// Where the tokens of a 2-D scheme sit: after `lead` tokens without a grid position (a `<cls>` token,
/// global tokens, ImageGPT's start token), a `side` × `side` grid in row-major order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Grid {
    pub side: i64,
    pub lead: i64,
}

#[derive(Debug)]
pub enum Relative {
    None,
    Shaw { table: Tensor, max_distance: i64 },
    T5 { table: Tensor, buckets: i64, max_distance: i64 },
    Alibi { slopes: Tensor },
    Rope { inv_freq: Tensor, rotated: i64 },
    Bias2d { table: Tensor, grid: Grid },
}

impl Relative {
    /// The scheme of `cfg` for heads of `head_dim` dimensions; `grid` is required by the 2-D bias.
    pub fn new(vs: &nn::Path, cfg: &PositionSpec, heads: i64, head_dim: i64, grid: Option<Grid>) -> Self {
        match cfg.encoding {
            PositionEncoding::Shaw => Relative::Shaw {
                table: vs.var(
                    "shaw_keys",
                    &[2 * cfg.shaw_max_distance + 1, head_dim],
                    nn::Init::Randn { mean: 0.0, stdev: 0.02 },
                ),
                max_distance: cfg.shaw_max_distance,
            },
            PositionEncoding::T5 => Relative::T5 {
                table: vs.var("t5_bias", &[cfg.t5_buckets, heads], nn::Init::Const(0.0)),
                buckets: cfg.t5_buckets,
                max_distance: cfg.t5_max_distance,
            },
            PositionEncoding::Alibi => Relative::Alibi {
                slopes: Tensor::from_slice(&alibi_slopes(heads)).to_kind(Kind::Float).to(vs.device()),
            },
            PositionEncoding::Rope => {
                let rotated = rope_dims(head_dim, cfg.rope_fraction);
                let exponents = Tensor::arange_start_step(0, rotated, 2, (Kind::Float, vs.device())) / rotated as f64;
                let inv_freq = Tensor::from(cfg.rope_theta as f32).to(vs.device()).pow(&exponents).reciprocal();
                Relative::Rope { inv_freq, rotated }
            }
            PositionEncoding::Bias2d => {
                let grid = grid.expect("the 2-D bias needs the token grid (validated: image models only)");
                let span = 2 * grid.side - 1;
                let table = vs.var(
                    "relative_position_bias_table",
                    &[span * span, heads],
                    nn::Init::Randn { mean: 0.0, stdev: 0.02 },
                );
                Relative::Bias2d { table, grid }
            }
            PositionEncoding::None
            | PositionEncoding::Sinusoidal
            | PositionEncoding::Learned
            | PositionEncoding::Conv => Relative::None,
        }
    }

    /// The learned values [`Self::new`] creates: Shaw's and the 2-D bias's tables, T5's buckets (ALiBi's
    /// slopes and RoPE's frequencies are fixed).
    pub fn parameters(cfg: &PositionSpec, heads: i64, head_dim: i64, grid: Option<Grid>) -> i64 {
        match cfg.encoding {
            PositionEncoding::Shaw => (2 * cfg.shaw_max_distance + 1) * head_dim,
            PositionEncoding::T5 => cfg.t5_buckets * heads,
            PositionEncoding::Bias2d => grid.map_or(0, |g| (2 * g.side - 1) * (2 * g.side - 1) * heads),
            _ => 0,
        }
    }

    /// The 2-D bias over the scores of the last `n_q` of `n_k` tokens, (1, H, N_q, N_k); `None` for the
    /// other schemes. Pairs with a token off the grid (before it, or past it) get no bias.
    pub fn grid_bias(&self, n_q: i64, n_k: i64) -> Option<Tensor> {
        let Relative::Bias2d { table, grid } = self else { return None };
        let (side, device) = (grid.side, table.device());
        let span = 2 * side - 1;
        let p = Tensor::arange(n_k, (Kind::Int64, device)) - grid.lead;
        let on_grid = p.ge(0).logical_and(&p.lt(side * side));
        let (row, col) = (p.floor_divide_scalar(side), p.remainder(side));
        let query = |t: &Tensor| t.narrow(0, n_k - n_q, n_q).view([n_q, 1]);
        let key = |t: &Tensor| t.view([1, n_k]);
        let index = (query(&row) - key(&row) + side - 1) * span + (query(&col) - key(&col) + side - 1);
        // Row span² of the padded table is zero: the bias of pairs off the grid.
        let index = index.where_self(&query(&on_grid).logical_and(&key(&on_grid)), &index.full_like(span * span));
        let padded = Tensor::cat(&[table, &table.zeros_like().narrow(0, 0, 1)], 0);
        let heads = table.size()[1];
        Some(padded.index_select(0, &index.view([-1])).view([n_q, n_k, heads]).permute([2, 0, 1]).unsqueeze(0))
    }

    pub fn is_none(&self) -> bool {
        matches!(self, Relative::None)
    }

    /// Rotates q or k (B, H, N, d) whose tokens sit at positions `start..start+N` (RoPE); identity otherwise.
    pub fn rotate(&self, x: &Tensor, start: i64) -> Tensor {
        let Relative::Rope { inv_freq, rotated } = self else { return x.shallow_clone() };
        let n = x.size()[2];
        let pos = Tensor::arange_start(start, start + n, (Kind::Float, x.device()));
        let angles = pos.unsqueeze(1) * inv_freq.unsqueeze(0); // (N, rotated/2)
        let (cos, sin) = (angles.cos().to_kind(x.kind()), angles.sin().to_kind(x.kind()));
        let half = rotated / 2;
        let x1 = x.narrow(-1, 0, half);
        let x2 = x.narrow(-1, half, half);
        let rest = x.narrow(-1, *rotated, x.size()[3] - rotated);
        Tensor::cat(&[&x1 * &cos - &x2 * &sin, &x1 * &sin + &x2 * &cos, rest], -1)
    }

    /// Whether [`Relative::score_bias`] adds anything to the scores (ALiBi, T5, Shaw do; RoPE rotates q and k
    /// before they are scored, and the 2-D table reaches attention as a mask bias instead).
    pub fn biases_scores(&self) -> bool {
        !matches!(self, Relative::None | Relative::Rope { .. } | Relative::Bias2d { .. })
    }

    /// The additive score bias for offsets `dist` (i − j) laid out as the trailing dims of the scores; `q` is the
    /// (already rotated) query tensor in the matching layout (B, H, …, d) with the same leading `…` as `dist`
    /// minus its last dim. `scale` is the factor applied to q·k (Shaw's term is part of the dot product).
    /// Returns a tensor broadcastable to the scores (B, H, …, K), or `None` for schemes without a bias.
    pub fn score_bias(&self, q: &Tensor, dist: &Tensor, causal: bool, scale: f64) -> Option<Tensor> {
        if !self.biases_scores() {
            return None;
        }
        // Views dist-shaped tensors as (1, H?, 1…, dist…) so they broadcast against (B, H, …, K): `extra` counts
        // the query layout dims that `dist` does not cover (the block dims of the sparse kernel).
        let extra = q.dim() as i64 - 2 - dist.dim() as i64;
        let lead = |heads: i64| -> Vec<i64> {
            let mut shape = vec![1, heads];
            shape.extend(std::iter::repeat_n(1, extra.max(0) as usize));
            shape
        };
        match self {
            Relative::None | Relative::Rope { .. } | Relative::Bias2d { .. } => None,
            Relative::Alibi { slopes } => {
                let mut slope_shape = lead(slopes.size()[0]);
                slope_shape.extend(std::iter::repeat_n(1, dist.dim()));
                let dist_shape: Vec<i64> = lead(1).into_iter().chain(dist.size()).collect();
                let penalty = slopes.to_kind(q.kind()).view(slope_shape.as_slice())
                    * dist.abs().to_kind(q.kind()).view(dist_shape.as_slice());
                Some(-penalty)
            }
            Relative::T5 { table, buckets, max_distance } => {
                let b = t5_bucket(dist, !causal, *buckets, *max_distance);
                let h = table.size()[1];
                // (dist…, H) -> (H, dist…) -> (1, H, 1…, dist…)
                let values = Tensor::embedding(table, &b, -1, false, false).to_kind(q.kind());
                let perm: Vec<i64> = std::iter::once(dist.dim() as i64).chain(0..dist.dim() as i64).collect();
                let shape: Vec<i64> = lead(h).into_iter().chain(dist.size()).collect();
                Some(values.permute(perm.as_slice()).contiguous().view(shape.as_slice()))
            }
            Relative::Shaw { table, max_distance } => {
                // q·a_{clip(j−i)}: project q on every offset's vector, then pick each score's offset.
                let qa = q.matmul(&table.to_kind(q.kind()).tr()) * scale; // (B, H, …, 2c+1)
                let idx = (-dist).clamp(-*max_distance, *max_distance) + *max_distance;
                let mut target = qa.size();
                let k = *dist.size().last().unwrap();
                *target.last_mut().unwrap() = k;
                Some(qa.gather(-1, &idx.expand(target.as_slice(), false), false))
            }
        }
    }
}

/// How many of a head's `head_dim` coordinates RoPE rotates: the fraction, rounded down to an even number.
pub fn rope_dims(head_dim: i64, fraction: f64) -> i64 {
    (((head_dim as f64) * fraction) as i64 / 2 * 2).max(2).min(head_dim / 2 * 2)
}

/// ALiBi's head slopes (Press et al. 2022): for H a power of two, the geometric sequence starting at
/// 2^(−8/H) with that ratio; otherwise the slopes of the nearest lower power of two followed by every other
/// slope of the next power of two.
pub fn alibi_slopes(heads: i64) -> Vec<f64> {
    fn power_of_two(n: i64) -> Vec<f64> {
        let start = 2f64.powf(-8.0 / n as f64);
        (1..=n).map(|i| start.powi(i as i32)).collect()
    }
    let lower = 1i64 << (63 - heads.leading_zeros() as i64);
    if lower == heads {
        return power_of_two(heads);
    }
    let mut slopes = power_of_two(lower);
    slopes.extend(power_of_two(2 * lower).into_iter().step_by(2).take((heads - lower) as usize));
    slopes
}

/// T5's bucket of an offset `dist` = i − j (query minus key): exact buckets for small offsets, logarithmic
/// ones up to `max_distance`, the last bucket beyond. Bidirectional buckets split the range by direction.
pub fn t5_bucket(dist: &Tensor, bidirectional: bool, buckets: i64, max_distance: i64) -> Tensor {
    let (mut n_buckets, mut base, n) = (buckets, dist.zeros_like(), dist.shallow_clone());
    let n = if bidirectional {
        n_buckets /= 2;
        // Keys after the query (dist < 0) use the upper half.
        base = dist.lt(0).to_kind(Kind::Int64) * n_buckets;
        n.abs()
    } else {
        n.clamp_min(0)
    };
    let max_exact = n_buckets / 2;
    let is_small = n.lt(max_exact);
    let large = (n.to_kind(Kind::Float).clamp_min(1.0) / max_exact as f64).log()
        / ((max_distance as f64) / max_exact as f64).ln()
        * (n_buckets - max_exact) as f64;
    let large = (large.to_kind(Kind::Int64) + max_exact).clamp_max(n_buckets - 1);
    base + n.where_self(&is_small, &large)
}

/// For a w × w grid in row-major order: the index of the 2-D offset (Δrow, Δcol) between cells i and j,
/// (Δrow + w − 1)·(2w − 1) + (Δcol + w − 1), as an (w², w²) int64 tensor.
pub fn grid_offset_index(window: i64) -> Tensor {
    let n = window * window;
    let span = 2 * window - 1;
    let index: Vec<i64> = (0..n)
        .flat_map(|i| {
            (0..n).map(move |j| {
                let (dr, dc) = (i / window - j / window, i % window - j % window);
                (dr + window - 1) * span + (dc + window - 1)
            })
        })
        .collect();
    Tensor::from_slice(&index).view([n, n])
}
