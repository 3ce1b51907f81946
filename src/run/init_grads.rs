//! Gradient norms at initialisation, layer by layer (`ablate init-grads`): Xiong et al. 2020 ("On Layer
//! Normalization in the Transformer Architecture", §3.2 and Figure 3) show that at initialisation a post-LN
//! Transformer's gradients grow with the layer's depth (largest next to the output), which is why Adam at a
//! full rate from the first step needs warm-up, while a pre-LN one's stay level. For a decoder (kind lm) the
//! run's model is built as training builds it, seeded with its seed, and the norm of each layer's gradient
//! (every parameter of the layer, and its FFN's weight matrices alone, Xiong et al.'s statistic) is averaged
//! over a few training batches.
use anyhow::{ensure, Result};
use tch::{nn, Device, Kind};

use crate::data::text::Dataset;
use crate::models::gpt::Gpt;
use crate::recipe::{Config, Kind as RunKind};

/// One layer's mean gradient norms at initialisation.
#[derive(Debug, Clone, PartialEq)]
pub struct LayerGradient {
    pub layer: i64,
    /// The norm of the gradient of every parameter of the layer together.
    pub layer_norm: f64,
    /// The norm of the gradient of the FFN's weight matrices (up, gate, down) together.
    pub ffn_norm: f64,
}

/// The norm of a set of gradients taken together: the square root of their summed squares.
fn joint_norm<'a>(grads: impl Iterator<Item = &'a tch::Tensor>) -> f64 {
    grads.map(|g| g.square().sum(Kind::Double).double_value(&[])).sum::<f64>().sqrt()
}

/// The layer a variable belongs to (`layers.<i>.…`), if any.
fn layer_of(name: &str) -> Option<i64> {
    name.strip_prefix("layers.")?.split('.').next()?.parse().ok()
}

/// Whether a variable is one of an FFN's weight matrices.
fn is_ffn_weight(name: &str) -> bool {
    [".ffn.up.weight", ".ffn.gate.weight", ".ffn.down.weight"].iter().any(|s| name.ends_with(s))
}

/// Per layer of `cfg`'s decoder, its gradient norms at initialisation averaged over `batches` training
/// batches of the run's batch size (drawn with the run's seed, as its first steps would be).
pub fn init_gradients(cfg: &Config, batches: i64) -> Result<Vec<LayerGradient>> {
    ensure!(cfg.kind == RunKind::Lm, "`ablate init-grads` reads a decoder (kind lm); this run is kind {}", cfg.kind);
    ensure!(batches >= 1, "--batches: at least 1");
    let data = Dataset::load(&cfg.data)?;
    let block = cfg.transformer.block_size;
    data.check_block_size(block)?;
    tch::manual_seed(cfg.train.seed as i64);
    let vs = nn::VarStore::new(Device::Cpu);
    let model = Gpt::new(&vs.root(), &cfg.transformer_spec(), data.tokenizer().vocab_size());
    // In name order: the norms sum squares in a fixed order, so a seed gives the same digits every time.
    let variables: std::collections::BTreeMap<String, tch::Tensor> = vs.variables().into_iter().collect();
    let layers = cfg.transformer.layers;
    let mut sums = vec![(0.0, 0.0); layers as usize];
    for _ in 0..batches {
        let (x, y) = data.train_batch(cfg.train.batch_size, block, Device::Cpu);
        for v in variables.values() {
            let mut grad = v.grad();
            if grad.defined() {
                let _ = grad.zero_();
            }
        }
        let (_, loss) = model.loss(&x, &y, false);
        loss.backward();
        for (i, sum) in sums.iter_mut().enumerate() {
            let in_layer: Vec<(&String, tch::Tensor)> = variables
                .iter()
                .filter(|(name, _)| layer_of(name) == Some(i as i64))
                .map(|(name, v)| (name, v.grad()))
                .filter(|(_, g)| g.defined())
                .collect();
            sum.0 += joint_norm(in_layer.iter().map(|(_, g)| g));
            sum.1 += joint_norm(in_layer.iter().filter(|(name, _)| is_ffn_weight(name)).map(|(_, g)| g));
        }
    }
    Ok(sums
        .into_iter()
        .enumerate()
        .map(|(i, (layer, ffn))| LayerGradient {
            layer: i as i64,
            layer_norm: layer / batches as f64,
            ffn_norm: ffn / batches as f64,
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn variables_are_assigned_to_their_layer_and_the_ffn_weights_picked_out() {
        assert_eq!(layer_of("layers.11.ffn.up.weight"), Some(11));
        assert_eq!(layer_of("token_embedding.weight"), None);
        assert!(is_ffn_weight("layers.0.ffn.down.weight") && !is_ffn_weight("layers.0.ffn.down.bias"));
        let (a, b) = (tch::Tensor::from_slice(&[3.0f32]), tch::Tensor::from_slice(&[4.0f32]));
        assert!((joint_norm([&a, &b].into_iter()) - 5.0).abs() < 1e-12);
    }
}
