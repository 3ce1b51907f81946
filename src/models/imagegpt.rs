//! ImageGPT (UDL §12.10.1; Chen et al. 2020): an image becomes a sequence of pixel tokens — each p×p
//! block's mean colour, quantised to a small palette fitted on the training images — and a causal GPT
//! decoder (the same `Gpt` as the language models, so the same Transformer and attention core) learns to
//! predict each pixel from the ones before it in raster order.
use tch::{nn, Device, Kind, Tensor};

use super::gpt::Gpt;
use super::spec::ImageGptSpec;
use crate::transformer::attention::Grid;
use crate::transformer::layers::{Pass, StackCache};

const KMEANS_ITERATIONS: i64 = 30;

/// Palette colours (K, C) as floats in [0, 255], ordered by brightness: for bins (`kmeans` false) the bin
/// centres, for k-means the cluster centres of the training pixels `pixels` (P, C).
pub fn fit_palette(pixels: &Tensor, size: i64, kmeans_clusters: bool) -> Tensor {
    let pixels = pixels.to_kind(Kind::Float);
    let centres = if kmeans_clusters {
        kmeans(&pixels, size, KMEANS_ITERATIONS).view([size, -1])
    } else {
        (Tensor::arange(size, (Kind::Float, Device::Cpu)) + 0.5) * (256.0 / size as f64)
    };
    let centres = centres.view([size, -1]);
    let order = centres.sum_dim_intlist(1, false, Kind::Float).argsort(0, false);
    centres.index_select(0, &order)
}

/// Lloyd's k-means with k-means++ seeding (libtorch's generator: seed it for a reproducible palette). A
/// cluster that loses all its points keeps its centre.
pub fn kmeans(points: &Tensor, k: i64, iterations: i64) -> Tensor {
    let n = points.size()[0];
    let first = Tensor::randint(n, [1], (Kind::Int64, Device::Cpu));
    let mut centres = points.index_select(0, &first);
    for _ in 1..k {
        let d = nearest_distance(points, &centres);
        // Points identical to a centre have weight 0; when every point is, fall back to uniform picks.
        let weights = if d.sum(Kind::Double).double_value(&[]) > 0.0 { d } else { d.ones_like() };
        let pick = weights.multinomial(1, false);
        centres = Tensor::cat(&[centres, points.index_select(0, &pick)], 0);
    }
    for _ in 0..iterations {
        let assign = squared_distances(points, &centres).argmin(1, false);
        let counts =
            Tensor::zeros([k], (Kind::Float, Device::Cpu)).index_add(0, &assign, &points.ones_like().select(1, 0));
        let sums = Tensor::zeros_like(&centres).index_add(0, &assign, points);
        let moved = sums / counts.clamp_min(1.0).unsqueeze(1);
        centres = moved.where_self(&counts.gt(0.0).unsqueeze(1), &centres);
    }
    centres
}

pub fn squared_distances(points: &Tensor, centres: &Tensor) -> Tensor {
    (points.unsqueeze(1) - centres.unsqueeze(0)).square().sum_dim_intlist(2, false, Kind::Float)
}

fn nearest_distance(points: &Tensor, centres: &Tensor) -> Tensor {
    squared_distances(points, centres).min_dim(1, false).0
}

/// Each p×p block's mean colour: (B, C, H, W) floats in [0, 255] -> (B, C, H/p, W/p).
pub fn downsample(images: &Tensor, p: i64) -> Tensor {
    if p == 1 {
        images.shallow_clone()
    } else {
        images.avg_pool2d([p, p], [p, p], [0, 0], false, true, None::<i64>)
    }
}

pub struct ImageGpt {
    gpt: Gpt,
    /// Palette colours (K, C) in [0, 255]: a buffer saved with the weights (not trained), set from the data.
    pub palette: Tensor,
    pub patch: i64,
    pub grid: i64,
    pub channels: i64,
    /// The start-of-image token: the first input, whose output predicts the first pixel.
    pub start: i64,
}

impl ImageGpt {
    pub fn new(vs: &nn::Path, spec: &ImageGptSpec) -> Self {
        let grid = spec.grid();
        // One token more than the palette: the start-of-image token (never a target), which sits before
        // the pixel grid.
        let lead = 1 + spec.transformer.attention.pattern.global_tokens;
        let on_grid = Some(Grid { side: grid, lead });
        let gpt = Gpt::on_grid(&(vs / "decoder"), &spec.transformer, spec.palette + 1, on_grid);
        let palette = vs.zeros_no_train("palette", &[spec.palette, spec.image.channels]);
        Self { gpt, palette, patch: spec.image.patch, grid, channels: spec.image.channels, start: spec.palette }
    }

    pub fn palette_size(&self) -> i64 {
        self.start
    }

    pub fn set_palette(&mut self, colours: &Tensor) {
        tch::no_grad(|| self.palette.copy_(colours));
    }

    /// Pixel tokens (B, N) of images (B, C, H, W) with values in [0, 255]: each p×p block's mean colour,
    /// then the nearest palette colour, in raster order.
    pub fn tokens(&self, images: &Tensor) -> Tensor {
        let small = downsample(&images.to_kind(Kind::Float).to_device(self.palette.device()), self.patch);
        let (b, c, _, _) = small.size4().unwrap();
        let pixels = small.permute([0, 2, 3, 1]).reshape([-1, c]);
        squared_distances(&pixels, &self.palette).argmin(1, false).view([b, -1])
    }

    /// Images (B, C, g, g) in [0, 255] of pixel tokens (B, N).
    pub fn colours(&self, tokens: &Tensor) -> Tensor {
        let b = tokens.size()[0];
        self.palette
            .index_select(0, &tokens.reshape([-1]).to_device(self.palette.device()))
            .view([b, self.grid, self.grid, self.channels])
            .permute([0, 3, 1, 2])
    }

    /// Logits (B, n+1, K) of pixels 0..=n given the first n pixel tokens (B, n): the decoder reads the start
    /// token followed by the prefix. The start token's own logit is dropped, so the distribution is over
    /// the palette.
    pub fn logits_after(&self, prefix: &Tensor, train: bool) -> Tensor {
        self.gpt.forward(&self.with_start(prefix), train).narrow(2, 0, self.start)
    }

    fn with_start(&self, prefix: &Tensor) -> Tensor {
        let b = prefix.size()[0];
        let start = Tensor::full([b, 1], self.start, (Kind::Int64, prefix.device()));
        Tensor::cat(&[start, prefix.shallow_clone()], 1)
    }

    /// Mean next-pixel cross-entropy (nats per pixel) of tokens (B, N), and the logits.
    pub fn loss(&self, tokens: &Tensor, train: bool) -> (Tensor, Tensor) {
        let n = tokens.size()[1];
        let logits = self.logits_after(&tokens.narrow(1, 0, n - 1), train).to_kind(Kind::Float);
        let loss = logits.reshape([-1, self.start]).cross_entropy_for_logits(&tokens.reshape([-1]));
        (loss, logits)
    }

    /// Probe features (B, D): the mean over positions of the final embeddings of the sequence the model
    /// reads when it predicts the whole image (the start token and all pixels but the last).
    pub fn features(&self, tokens: &Tensor) -> Tensor {
        let n = tokens.size()[1];
        let (hidden, _) = self.gpt.hidden_with_weights(&self.with_start(&tokens.narrow(1, 0, n - 1)), Pass::eval());
        hidden.to_kind(Kind::Float).mean_dim(1, false, Kind::Float)
    }

    /// Completes each image of `tokens` (B, N) after its first `keep` pixels, pixel by pixel: sampled from
    /// the model at temperature 1 (libtorch's generator) or, when `greedy`, its most likely colour. With
    /// `cached`, each pixel costs one position through the decoder's KV cache (the same pixels).
    pub fn complete(&self, tokens: &Tensor, keep: i64, greedy: bool, cached: bool) -> Tensor {
        let _guard = tch::no_grad_guard();
        let n = tokens.size()[1];
        let mut out = tokens.narrow(1, 0, keep);
        let mut cache = StackCache::default();
        let mut fresh = self.with_start(&out);
        for _ in keep..n {
            let logits = if cached {
                let step = self.gpt.forward_cached(&fresh, &mut cache);
                step.select(1, -1).narrow(-1, 0, self.start).to_kind(Kind::Float)
            } else {
                self.logits_after(&out, false).select(1, -1).to_kind(Kind::Float)
            };
            let next =
                if greedy { logits.argmax(-1, true) } else { logits.softmax(-1, Kind::Float).multinomial(1, true) };
            out = Tensor::cat(&[&out, &next], 1);
            fresh = next;
        }
        out
    }
}

impl ImageGpt {
    /// The decoder's attention weights over a batch of pixel tokens (B, N): one (B, H, N, N) per layer.
    pub fn attention_weights(&self, tokens: &Tensor) -> Vec<Tensor> {
        let n = tokens.size()[1];
        self.gpt.hidden_with_weights(&self.with_start(&tokens.narrow(1, 0, n - 1)), Pass::eval().with_weights()).1
    }
}
