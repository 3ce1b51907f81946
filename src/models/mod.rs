//! The model files: each a short reading of its paper (and UDL's equations) over the shared Transformer
//! core, built from plain settings (`spec`, and the core's `TransformerSpec`), knowing nothing of recipes.
pub mod spec;

#[cfg(feature = "torch")]
pub mod bert;
#[cfg(feature = "torch")]
pub mod cnn;
#[cfg(feature = "torch")]
pub mod davit;
#[cfg(feature = "torch")]
pub mod decode;
#[cfg(feature = "torch")]
pub mod gpt;
#[cfg(feature = "torch")]
pub mod imagegpt;
#[cfg(feature = "torch")]
pub mod seq2seq;
#[cfg(feature = "torch")]
pub mod seq_classifier;
#[cfg(feature = "torch")]
pub mod swin;
#[cfg(feature = "torch")]
pub mod vit;

/// An image classifier (ViT, Swin, DaViT, the CNN baseline; anything that maps images to class logits).
#[cfg(feature = "torch")]
pub trait ImageClassifier {
    /// Class logits (B, classes) of images (B, C, H, W), and every block's attention weights when asked.
    fn classify(&self, images: &tch::Tensor, train: bool, want_weights: bool) -> (tch::Tensor, Vec<tch::Tensor>);

    /// The classification head, for a new head after pre-training on other images (transfer).
    fn head(&self) -> &tch::nn::Linear;

    /// The largest patch token's norm over the median's in the last layer (ViT's register artefact), for
    /// the models that measure it.
    fn token_norm_ratio(&self, _images: &tch::Tensor) -> Option<f64> {
        None
    }
}

/// Draws `linear`'s weights and bias afresh, as `nn::linear` first draws them (uniform in ±1/√fan_in):
/// a new head on a pre-trained body.
#[cfg(feature = "torch")]
pub fn redraw(linear: &tch::nn::Linear) {
    let bound = 1.0 / (linear.ws.size()[1] as f64).sqrt();
    tch::no_grad(|| {
        let _ = linear.ws.shallow_clone().uniform_(-bound, bound);
        if let Some(b) = &linear.bs {
            let _ = b.shallow_clone().uniform_(-bound, bound);
        }
    });
}
