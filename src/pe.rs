//! Absolute position encodings (the seed's 12.3.1): a matrix Π added to the token embeddings, either the
//! hand-designed sinusoids of Vaswani et al. or a learned table. Relative schemes act on the attention scores
//! and live with the attention core instead.
use tch::{nn, Device, Kind, Tensor};

use crate::config::PositionEncoding;

pub enum AbsolutePositions {
    None,
    /// Fixed (N_max, D) sinusoid table; not a parameter.
    Sinusoidal(Tensor),
    Learned(Tensor),
}

impl AbsolutePositions {
    pub fn new(vs: nn::Path, kind: PositionEncoding, max_len: i64, d_model: i64) -> Self {
        match kind {
            PositionEncoding::None
            | PositionEncoding::Shaw
            | PositionEncoding::T5
            | PositionEncoding::Alibi
            | PositionEncoding::Rope => AbsolutePositions::None,
            PositionEncoding::Sinusoidal => {
                AbsolutePositions::Sinusoidal(sinusoidal_table(max_len, d_model, vs.device()))
            }
            PositionEncoding::Learned => AbsolutePositions::Learned(vs.var(
                "table",
                &[max_len, d_model],
                nn::Init::Randn { mean: 0.0, stdev: 0.02 },
            )),
        }
    }

    /// Π for positions 0..N, (N, D); `None` without an absolute encoding. Sinusoids extend to any length; a
    /// learned table only covers the lengths it was trained on (see `covers`).
    pub fn table(&self, n: i64) -> Option<Tensor> {
        match self {
            AbsolutePositions::None => None,
            AbsolutePositions::Sinusoidal(t) if n <= t.size()[0] => Some(t.narrow(0, 0, n)),
            AbsolutePositions::Sinusoidal(t) => Some(sinusoidal_table(n, t.size()[1], t.device())),
            AbsolutePositions::Learned(t) => Some(t.narrow(0, 0, n)),
        }
    }

    /// Whether sequences of length `n` can be encoded.
    pub fn covers(&self, n: i64) -> bool {
        match self {
            AbsolutePositions::Learned(t) => n <= t.size()[0],
            _ => true,
        }
    }
}

/// PE(pos, 2i) = sin(pos / 10000^(2i/D)), PE(pos, 2i+1) = cos(pos / 10000^(2i/D)).
pub fn sinusoidal_table(max_len: i64, d_model: i64, device: Device) -> Tensor {
    let pos = Tensor::arange(max_len, (Kind::Float, device)).unsqueeze(1);
    let pair = Tensor::arange_start_step(0, d_model, 2, (Kind::Float, device));
    let inv_freq = (pair * (-(10000f64.ln()) / d_model as f64)).exp();
    let angles = pos * inv_freq.unsqueeze(0); // (N, ceil(D/2))
    let table = Tensor::stack(&[angles.sin(), angles.cos()], 2).view([max_len, -1]);
    table.narrow(1, 0, d_model)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sinusoid_table_matches_the_closed_form() {
        let t = sinusoidal_table(50, 6, Device::Cpu);
        for (pos, i) in [(0i64, 0i64), (3, 1), (49, 2), (17, 0)] {
            let angle = pos as f64 / 10000f64.powf(2.0 * i as f64 / 6.0);
            let s = t.double_value(&[pos, 2 * i]);
            let c = t.double_value(&[pos, 2 * i + 1]);
            assert!((s - angle.sin()).abs() < 1e-5, "sin at pos {pos}, i {i}: {s}");
            assert!((c - angle.cos()).abs() < 1e-5, "cos at pos {pos}, i {i}: {c}");
        }
        // Odd widths keep the first D columns.
        assert_eq!(sinusoidal_table(4, 5, Device::Cpu).size(), vec![4, 5]);
    }
}
