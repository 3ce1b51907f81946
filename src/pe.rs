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
            PositionEncoding::None => AbsolutePositions::None,
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

    /// Adds Π for positions 0..N to `x` (B, N, D).
    pub fn add_to(&self, x: &Tensor) -> Tensor {
        let n = x.size()[1];
        match self {
            AbsolutePositions::None => x.shallow_clone(),
            AbsolutePositions::Sinusoidal(t) | AbsolutePositions::Learned(t) => x + t.narrow(0, 0, n),
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
