//! Normalisations of token features and the soft cap: the pieces both the attention core (QK-norm, capped
//! scores) and the layers (residual branches, final norms, capped logits) use, apart from either.
use tch::nn::{self, Module, ModuleT};
use tch::Tensor;

use super::spec::Norm;

/// One normalisation of the token features (`transformer.norm`), over the last dimension of any shape.
#[derive(Debug)]
pub enum NormLayer {
    Layer(nn::LayerNorm),
    /// x / √(mean(x²) + ε) · g.
    Rms {
        weight: Tensor,
        eps: f64,
    },
    /// Statistics per feature over every token of the batch (running averages at evaluation).
    Batch(nn::BatchNorm),
}

impl NormLayer {
    /// `kind` over `d` features; `None` for `Norm::None`. LayerNorm's parameters are `weight` and `bias`
    /// under `vs` (Hugging Face's names), RMSNorm's `weight`, BatchNorm's also its running statistics.
    pub fn new(vs: nn::Path, d: i64, kind: Norm, eps: f64) -> Option<Self> {
        match kind {
            Norm::LayerNorm => {
                Some(Self::Layer(nn::layer_norm(vs, vec![d], nn::LayerNormConfig { eps, ..Default::default() })))
            }
            Norm::RmsNorm => Some(Self::Rms { weight: vs.var("weight", &[d], nn::Init::Const(1.0)), eps }),
            Norm::BatchNorm => {
                Some(Self::Batch(nn::batch_norm1d(vs, d, nn::BatchNormConfig { eps, ..Default::default() })))
            }
            Norm::None => None,
        }
    }

    /// The learned values [`Self::new`] creates over `d` features (BatchNorm's running statistics are
    /// buffers, not learned).
    pub fn parameters(d: i64, kind: Norm) -> i64 {
        match kind {
            Norm::LayerNorm | Norm::BatchNorm => 2 * d,
            Norm::RmsNorm => d,
            Norm::None => 0,
        }
    }

    /// `train` chooses the batch's statistics over the running ones (BatchNorm only).
    pub fn forward(&self, x: &Tensor, train: bool) -> Tensor {
        match self {
            Self::Layer(norm) => norm.forward(x),
            Self::Rms { weight, eps } => x.rms_norm([weight.size()[0]], Some(weight), Some(*eps)),
            Self::Batch(norm) => {
                // Every token is one sample of the feature statistics: (…, D) -> (tokens, D) and back.
                let shape = x.size();
                let d = *shape.last().expect("a feature dimension");
                norm.forward_t(&x.reshape([-1, d]), train).view(shape.as_slice())
            }
        }
    }
}

/// `cap · tanh(x / cap)`: x unchanged near 0, smoothly bounded by ±cap (Gemma 2's soft-capping); `x` itself
/// without a cap.
pub fn softcap(x: Tensor, cap: Option<f64>) -> Tensor {
    match cap {
        Some(c) => (x / c).tanh() * c,
        None => x,
    }
}
