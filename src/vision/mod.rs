//! Vision Transformers (the seed's 12.10): ViT, Swin and DaViT, built from the same attention core as the
//! language models. Each model file reads top to bottom against its paper and timm's reference code; the
//! named presets reproduce timm's parameter counts exactly (tested), and the small presets fit this
//! machine's 28×28 grey images.
use serde::{Deserialize, Serialize};

use crate::config::{divisors, Invalid, PositionEncoding};

pub mod classify;
pub mod davit;
pub mod imagegpt;
pub mod swin;
pub mod vit;

#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum Arch {
    /// One global attention over all patches (Dosovitskiy et al. 2021).
    Vit,
    /// Attention inside non-overlapping windows, shifted on alternate layers, with patch merging between
    /// stages (Liu et al. 2021).
    Swin,
    /// Window attention alternating with channel group attention (Ding et al. 2022).
    Davit,
    /// A causal decoder over the pixels of a quantised, downsampled image, trained to predict the next
    /// pixel (Chen et al. 2020); classification by a linear probe on its features.
    ImageGpt,
}

/// ImageGPT's colour quantiser.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum Quantiser {
    /// k-means clusters of the training pixels' colours (iGPT's palette).
    Kmeans,
    /// Equal-width intensity bins over [0, 255] (grey images only).
    Bins,
}

/// ImageGPT's palette, probe and sample grid.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct ImageGptConfig {
    /// Number of palette colours: the pixel vocabulary (the model also has one start-of-image token).
    pub palette: i64,
    pub quantiser: Quantiser,
    /// Training images whose mean final embeddings fit the linear probe (evaluated on the test images).
    pub probe_images: i64,
    /// Test images whose lower halves are sampled for the completion grid (the first of each class, then
    /// the next ones), and samples drawn per image.
    pub completions: i64,
    pub samples_per_completion: i64,
}

impl Default for ImageGptConfig {
    fn default() -> Self {
        Self {
            palette: 16,
            quantiser: Quantiser::Kmeans,
            probe_images: 10_000,
            completions: 10,
            samples_per_completion: 4,
        }
    }
}

/// How a ViT turns its tokens into one vector for the head.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum Pool {
    /// A learned `<cls>` token prepended to the patches; the head reads its final state.
    Cls,
    /// The mean of the patch tokens' final states.
    Mean,
}

/// DaViT's two kinds of block.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum BlockKind {
    /// Window attention over tokens.
    Spatial,
    /// Channel group attention: tokens attend over channels.
    Channel,
}

/// One vision model. Stage widths double from `dim` for Swin and DaViT (ViT has one stage).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct VisionConfig {
    pub arch: Arch,
    pub image_size: i64,
    pub channels: i64,
    pub classes: i64,
    /// Side of a square patch: the stride of the patch embedding.
    pub patch_size: i64,
    /// Token width of the first stage.
    pub dim: i64,
    /// Blocks per stage (DaViT: block j of a stage is of kind `attention_types[j mod len]`, so DaViT-T's
    /// "1, 1, 3, 1" spatial + channel pairs are depths 2, 2, 6, 2).
    pub depths: Vec<i64>,
    /// Attention heads per stage.
    pub heads: Vec<i64>,
    /// Side of the attention window in tokens (Swin, DaViT spatial blocks).
    pub window: i64,
    /// Swin: shift the windows by half a window on every second block.
    pub shift: bool,
    /// ViT: `cls` token or mean pooling.
    pub pool: Pool,
    /// ViT: position encoding of the patch sequence (any of the attention core's; `learned` as in the paper).
    pub pe: PositionEncoding,
    /// DaViT: the block kinds, cycled through each stage's blocks.
    pub attention_types: Vec<BlockKind>,
    /// FFN hidden size as a multiple of the token width.
    pub mlp_ratio: f64,
    pub dropout: f64,
    /// ImageGPT only (and then required): `patch_size` is the downsampling factor (each p×p block's mean
    /// colour becomes one pixel token), and this section sets the palette.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub image_gpt: Option<ImageGptConfig>,
}

impl Default for VisionConfig {
    fn default() -> Self {
        preset("vit_fmnist").expect("the default preset exists")
    }
}

/// Named presets: the paper sizes (224×224 RGB, 1000 classes; parameter counts equal timm's) and small
/// ones for 28×28 grey images with 10 classes.
pub const PRESETS: &[&str] = &[
    "vit_tiny_patch16_224",
    "vit_small_patch16_224",
    "vit_base_patch16_224",
    "swin_tiny_patch4_window7_224",
    "davit_tiny",
    "vit_fmnist",
    "swin_fmnist",
    "davit_fmnist",
    "image_gpt_fmnist",
];

pub fn preset(name: &str) -> Option<VisionConfig> {
    let imagenet = |arch, patch_size, dim, depths: &[i64], heads: &[i64]| VisionConfig {
        arch,
        image_size: 224,
        channels: 3,
        classes: 1000,
        patch_size,
        dim,
        depths: depths.to_vec(),
        heads: heads.to_vec(),
        window: 7,
        shift: true,
        pool: Pool::Cls,
        pe: PositionEncoding::Learned,
        attention_types: vec![BlockKind::Spatial, BlockKind::Channel],
        mlp_ratio: 4.0,
        dropout: 0.0,
        image_gpt: None,
    };
    let small = |arch, patch_size, dim, depths: &[i64], heads: &[i64], window| VisionConfig {
        image_size: 28,
        channels: 1,
        classes: 10,
        window,
        ..imagenet(arch, patch_size, dim, depths, heads)
    };
    Some(match name {
        "vit_tiny_patch16_224" => imagenet(Arch::Vit, 16, 192, &[12], &[3]),
        "vit_small_patch16_224" => imagenet(Arch::Vit, 16, 384, &[12], &[6]),
        "vit_base_patch16_224" => imagenet(Arch::Vit, 16, 768, &[12], &[12]),
        "swin_tiny_patch4_window7_224" => imagenet(Arch::Swin, 4, 96, &[2, 2, 6, 2], &[3, 6, 12, 24]),
        "davit_tiny" => imagenet(Arch::Davit, 4, 96, &[2, 2, 6, 2], &[3, 6, 12, 24]),
        // 28×28 → 7×7 patches of 4×4: 49 tokens.
        "vit_fmnist" => small(Arch::Vit, 4, 64, &[4], &[4], 7),
        // 28×28 → 14×14 tokens of 2×2, windows of 7, merged once to 7×7.
        "swin_fmnist" => small(Arch::Swin, 2, 32, &[2, 2], &[2, 4], 7),
        "davit_fmnist" => small(Arch::Davit, 2, 32, &[2, 2], &[2, 4], 7),
        // 28×28 averaged over 2×2 blocks → 14×14 pixels: 196 tokens of a 16-colour palette.
        "image_gpt_fmnist" => {
            VisionConfig { image_gpt: Some(ImageGptConfig::default()), ..small(Arch::ImageGpt, 2, 64, &[4], &[4], 7) }
        }
        _ => return None,
    })
}

fn invalid(key: &'static str, message: impl Into<String>) -> Invalid {
    Invalid { key, message: message.into() }
}

impl ImageGptConfig {
    fn validate(&self, channels: i64) -> Result<(), Invalid> {
        if !(2..=4096).contains(&self.palette) {
            return Err(invalid(
                "vision.image_gpt.palette",
                format!("must be in 2..=4096 colours, got {}", self.palette),
            ));
        }
        if self.quantiser == Quantiser::Bins && channels != 1 {
            return Err(invalid(
                "vision.image_gpt.quantiser",
                format!("bins quantise grey intensities; {channels}-channel images need kmeans"),
            ));
        }
        for (key, v, min) in [
            ("vision.image_gpt.probe_images", self.probe_images, 10),
            ("vision.image_gpt.completions", self.completions, 0),
            ("vision.image_gpt.samples_per_completion", self.samples_per_completion, 1),
        ] {
            if v < min || v > 1_000_000 {
                return Err(invalid(key, format!("must be in {min}..=1000000, got {v}")));
            }
        }
        Ok(())
    }
}

impl VisionConfig {
    pub fn stages(&self) -> usize {
        self.depths.len()
    }

    /// Token width of stage `i` (doubling per stage after the first for Swin and DaViT).
    pub fn stage_dim(&self, i: usize) -> i64 {
        match self.arch {
            Arch::Vit | Arch::ImageGpt => self.dim,
            Arch::Swin | Arch::Davit => self.dim << i,
        }
    }

    /// Side of the token grid at stage `i`.
    pub fn stage_grid(&self, i: usize) -> i64 {
        let first = match self.arch {
            Arch::Davit => (self.image_size + self.patch_size - 1) / self.patch_size,
            _ => self.image_size / self.patch_size,
        };
        (0..i).fold(first, |g, _| (g + 1) / 2)
    }

    /// The window actually used at stage `i`: a window larger than the grid shrinks to the grid (and then
    /// Swin does not shift), as in timm.
    pub fn stage_window(&self, i: usize) -> i64 {
        self.window.min(self.stage_grid(i))
    }

    pub fn ffn_hidden(&self, dim: i64) -> i64 {
        (dim as f64 * self.mlp_ratio).round() as i64
    }

    /// Every impossible combination, with the key to fix and the values that would work.
    pub fn validate(&self) -> Result<(), Invalid> {
        for (key, v) in [
            ("vision.image_size", self.image_size),
            ("vision.channels", self.channels),
            ("vision.classes", self.classes),
            ("vision.patch_size", self.patch_size),
            ("vision.dim", self.dim),
            ("vision.window", self.window),
        ] {
            if v < 1 {
                return Err(invalid(key, format!("must be at least 1, got {v}")));
            }
        }
        for (key, v, max) in [("vision.image_size", self.image_size, 1 << 16), ("vision.dim", self.dim, 1 << 16)] {
            if v > max {
                return Err(invalid(key, format!("must be at most {max}, got {v}")));
            }
        }
        if self.depths.len() > 16 {
            return Err(invalid("vision.depths", format!("at most 16 stages, got {}", self.depths.len())));
        }
        if self.depths.is_empty() || self.depths.iter().any(|&d| d < 1) {
            return Err(invalid("vision.depths", format!("one positive block count per stage, got {:?}", self.depths)));
        }
        if self.heads.len() != self.depths.len() {
            return Err(invalid(
                "vision.heads",
                format!(
                    "one head count per stage: {} stages (depths) but {} head counts",
                    self.depths.len(),
                    self.heads.len()
                ),
            ));
        }
        if matches!(self.arch, Arch::Vit | Arch::ImageGpt) && self.stages() != 1 {
            let model = if self.arch == Arch::Vit { "a ViT" } else { "an ImageGPT" };
            return Err(invalid("vision.depths", format!("{model} has one stage: give one depth, e.g. [12]")));
        }
        match (&self.image_gpt, self.arch) {
            (None, Arch::ImageGpt) => {
                return Err(invalid(
                    "vision.image_gpt",
                    "arch image_gpt needs its palette section, e.g. image_gpt: {palette: 16}",
                ))
            }
            (Some(_), Arch::Vit | Arch::Swin | Arch::Davit) => {
                return Err(invalid("vision.image_gpt", format!("only for arch image_gpt, not {:?}", self.arch)))
            }
            (Some(g), _) => g.validate(self.channels)?,
            (None, _) => {}
        }
        if self.arch != Arch::Davit && self.image_size % self.patch_size != 0 {
            return Err(invalid(
                "vision.patch_size",
                format!(
                    "{} does not divide image_size {}; allowed: {}",
                    self.patch_size,
                    self.image_size,
                    divisors(self.image_size)
                ),
            ));
        }
        for i in 0..self.stages() {
            let (dim, heads) = (self.stage_dim(i), self.heads[i]);
            if heads < 1 || dim % heads != 0 {
                return Err(invalid("vision.heads", format!("stage {i}: {heads} heads do not divide its width {dim}")));
            }
            let grid = self.stage_grid(i);
            if self.arch == Arch::Swin {
                let w = self.stage_window(i);
                if grid % w != 0 {
                    return Err(invalid(
                        "vision.window",
                        format!(
                            "stage {i}'s token grid is {grid}×{grid}, which windows of {w} do not tile; windows that do: {}",
                            divisors(grid)
                        ),
                    ));
                }
                if i + 1 < self.stages() && grid % 2 != 0 {
                    return Err(invalid(
                        "vision.depths",
                        format!("patch merging after stage {i} needs an even token grid, got {grid}×{grid}"),
                    ));
                }
            }
        }
        if self.arch == Arch::Davit && self.attention_types.is_empty() {
            return Err(invalid("vision.attention_types", "give at least one of spatial, channel"));
        }
        if self.mlp_ratio.is_nan() || self.mlp_ratio <= 0.0 {
            return Err(invalid("vision.mlp_ratio", format!("must be positive, got {}", self.mlp_ratio)));
        }
        if !(0.0..1.0).contains(&self.dropout) {
            return Err(invalid("vision.dropout", format!("must be in [0, 1), got {}", self.dropout)));
        }
        Ok(())
    }

    /// Analytic multiply-accumulates of one forward pass on one image (convolutions, projections,
    /// attention scores and weighted sums, FFNs, head; norms and softmax left out, as fvcore and timm do).
    pub fn forward_macs(&self) -> f64 {
        let mut macs = 0.0;
        let f = |x: i64| x as f64;
        let block = |n: i64, d: i64, keys: i64| -> f64 {
            // QKV + output projection, QKᵀ and AV over `keys` keys per query, FFN.
            f(n) * f(4 * d * d) + 2.0 * f(n) * f(keys) * f(d) + 2.0 * f(n) * f(d) * f(self.ffn_hidden(d))
        };
        match self.arch {
            Arch::ImageGpt => {
                let grid = self.stage_grid(0);
                let n = grid * grid;
                let vocab = self.image_gpt.as_ref().map_or(0, |g| g.palette) + 1;
                macs += f(self.depths[0]) * block(n, self.dim, n);
                macs += f(n) * f(self.dim * vocab);
            }
            Arch::Vit => {
                let grid = self.stage_grid(0);
                let n = grid * grid + i64::from(self.pool == Pool::Cls);
                macs += f(grid * grid) * f(self.patch_size * self.patch_size * self.channels * self.dim);
                macs += f(self.depths[0]) * block(n, self.dim, n);
                macs += f(self.dim * self.classes);
            }
            Arch::Swin => {
                let g0 = self.stage_grid(0);
                macs += f(g0 * g0) * f(self.patch_size * self.patch_size * self.channels * self.dim);
                for i in 0..self.stages() {
                    let (g, d, w) = (self.stage_grid(i), self.stage_dim(i), self.stage_window(i));
                    macs += f(self.depths[i]) * block(g * g, d, w * w);
                    if i + 1 < self.stages() {
                        macs += f((g / 2) * (g / 2)) * f(4 * d * 2 * d);
                    }
                }
                macs += f(self.stage_dim(self.stages() - 1) * self.classes);
            }
            Arch::Davit => {
                let g0 = self.stage_grid(0);
                let k = 2 * self.patch_size - 1;
                macs += f(g0 * g0) * f(k * k * self.channels * self.dim);
                for i in 0..self.stages() {
                    let (g, d, w) = (self.stage_grid(i), self.stage_dim(i), self.stage_window(i));
                    let n = g * g;
                    if i > 0 {
                        macs += f(n) * f(4 * (d / 2) * d);
                    }
                    for j in 0..self.depths[i] as usize {
                        let cpe = 2.0 * f(n) * f(9 * d);
                        macs += match self.attention_types[j % self.attention_types.len()] {
                            BlockKind::Spatial => cpe + block(n, d, w * w),
                            // Channel attention: C_g × C_g weights per head over N tokens, twice (kᵀv, then ·qᵀ).
                            BlockKind::Channel => cpe + block(n, d, d / self.heads[i]),
                        };
                    }
                }
                macs += f(self.stage_dim(self.stages() - 1) * self.classes);
            }
        }
        macs
    }
}

/// A vision model built from a config.
pub enum VisionModel {
    Vit(vit::Vit),
    Swin(swin::Swin),
    Davit(davit::Davit),
}

impl VisionModel {
    /// A classifier for `cfg` (ImageGPT is a generative model: `imagegpt::ImageGpt`).
    pub fn new(vs: &tch::nn::Path, cfg: &VisionConfig) -> Self {
        match cfg.arch {
            Arch::Vit => VisionModel::Vit(vit::Vit::new(vs, cfg)),
            Arch::Swin => VisionModel::Swin(swin::Swin::new(vs, cfg)),
            Arch::Davit => VisionModel::Davit(davit::Davit::new(vs, cfg)),
            Arch::ImageGpt => unreachable!("ImageGPT runs build imagegpt::ImageGpt"),
        }
    }

    /// Class logits (B, classes) of images (B, C, H, W).
    pub fn forward(&self, images: &tch::Tensor, train: bool) -> tch::Tensor {
        match self {
            VisionModel::Vit(m) => m.forward(images, train),
            VisionModel::Swin(m) => m.forward(images, train),
            VisionModel::Davit(m) => m.forward(images, train),
        }
    }
}

/// Parameter count of a config (builds the model on the CPU).
pub fn parameter_count(cfg: &VisionConfig) -> i64 {
    let vs = tch::nn::VarStore::new(tch::Device::Cpu);
    match cfg.arch {
        Arch::ImageGpt => drop(imagegpt::ImageGpt::new(&vs.root(), cfg)),
        _ => drop(VisionModel::new(&vs.root(), cfg)),
    }
    vs.trainable_variables().iter().map(|t| t.numel() as i64).sum()
}
