//! Position encodings that are not part of attention: the absolute ones (UDL §12.3.1), a matrix Π added to
//! the token embeddings, either the hand-designed sinusoids of Vaswani et al. or a learned table; and the
//! convolutional one of image grids (a depthwise 3×3 convolution added before a block). Relative schemes act
//! on the attention scores and live with the attention core instead.
use tch::nn::{self, Module};
use tch::{Device, Kind, Tensor};

use super::spec::PositionEncoding;

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
            | PositionEncoding::Rope
            | PositionEncoding::Bias2d
            | PositionEncoding::Conv => AbsolutePositions::None,
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

    /// The same encoding sharing its table (an encoder–decoder's two stacks read one).
    pub fn shallow_clone(&self) -> Self {
        match self {
            AbsolutePositions::None => AbsolutePositions::None,
            AbsolutePositions::Sinusoidal(t) => AbsolutePositions::Sinusoidal(t.shallow_clone()),
            AbsolutePositions::Learned(t) => AbsolutePositions::Learned(t.shallow_clone()),
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

/// DaViT's (and CPVT's) convolutional position encoding: tokens plus a depthwise 3×3 convolution (with bias)
/// of their grid, so each token learns where it is from its neighbours.
pub struct ConvPosEnc {
    conv: nn::Conv2D,
}

impl ConvPosEnc {
    pub fn new(vs: nn::Path, dim: i64) -> Self {
        let cfg = nn::ConvConfig { padding: 1, groups: dim, ..Default::default() };
        Self { conv: nn::conv2d(vs / "proj", dim, dim, 3, cfg) }
    }

    /// x: (B, grid², C), or (B, lead + grid², C) whose first `lead` tokens (a `<cls>` token) pass through.
    pub fn forward(&self, x: &Tensor, grid: i64, lead: i64) -> Tensor {
        let (b, n, c) = x.size3().unwrap();
        let tokens = x.narrow(1, lead, n - lead);
        let feat = tokens.transpose(1, 2).reshape([b, c, grid, grid]);
        let moved = self.conv.forward(&feat).flatten(2, -1).transpose(1, 2).view([b, n - lead, c]);
        if lead == 0 {
            x + moved
        } else {
            Tensor::cat(&[x.narrow(1, 0, lead), tokens + moved], 1)
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
