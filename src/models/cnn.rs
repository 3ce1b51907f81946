//! The convolutional baseline (UDL §12.10.2's comparison: a convolution's locality and weight sharing are
//! a prior about images that a ViT has to learn from data). Each stage is a k×k convolution with "same"
//! padding, BatchNorm and ReLU; 2×2 max-pooling halves the map between stages; the last map is averaged
//! over its positions and a linear layer gives the classes. No attention: it sits beside the Transformer
//! models and trains through the same classification loop.
use tch::nn::{self, Module, ModuleT};
use tch::{Kind, Tensor};

use super::spec::CnnSpec;
use super::ImageClassifier;

pub struct Cnn {
    stages: Vec<(nn::Conv2D, nn::BatchNorm)>,
    head: nn::Linear,
}

impl Cnn {
    pub fn new(vs: &nn::Path, spec: &CnnSpec) -> Self {
        let conv = nn::ConvConfig { padding: spec.kernel / 2, bias: false, ..Default::default() };
        let mut inputs = spec.image.channels;
        let mut stages = Vec::new();
        for (i, &c) in spec.channels.iter().enumerate() {
            let stage = vs / "stages" / i;
            stages.push((
                nn::conv2d(&stage / "conv", inputs, c, spec.kernel, conv),
                nn::batch_norm2d(&stage / "norm", c, Default::default()),
            ));
            inputs = c;
        }
        Self { stages, head: nn::linear(vs / "head", inputs, spec.image.classes, Default::default()) }
    }

    /// The last stage's feature map (B, C, H', W') of images (B, C_in, H, W).
    pub fn feature_map(&self, images: &Tensor, train: bool) -> Tensor {
        let mut x = images.shallow_clone();
        for (i, (conv, norm)) in self.stages.iter().enumerate() {
            if i > 0 {
                x = x.max_pool2d([2, 2], [2, 2], [0, 0], [1, 1], false);
            }
            x = norm.forward_t(&conv.forward(&x), train).relu();
        }
        x
    }
}

impl ImageClassifier for Cnn {
    fn classify(&self, images: &Tensor, train: bool, _want_weights: bool) -> (Tensor, Vec<Tensor>) {
        let pooled = self.feature_map(images, train).mean_dim([2i64, 3].as_slice(), false, Kind::Float);
        (self.head.forward(&pooled), Vec::new())
    }

    fn head(&self) -> &nn::Linear {
        &self.head
    }
}
