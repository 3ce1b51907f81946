//! The model files: each a short reading of its paper (and UDL's equations) over the shared Transformer
//! core, built from plain settings (`spec`, and the core's `TransformerSpec`), knowing nothing of recipes.
pub mod spec;

#[cfg(feature = "torch")]
pub mod bert;
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
pub mod swin;
#[cfg(feature = "torch")]
pub mod vit;

/// An image classifier (ViT, Swin, DaViT; anything that maps images to class logits).
#[cfg(feature = "torch")]
pub trait ImageClassifier {
    /// Class logits (B, classes) of images (B, C, H, W), and every block's attention weights when asked.
    fn classify(&self, images: &tch::Tensor, train: bool, want_weights: bool) -> (tch::Tensor, Vec<tch::Tensor>);
}
