//! ViT (Dosovitskiy et al. 2021; the seed's 12.10.2): cut the image into p×p patches, embed each with one
//! learned linear map (a stride-p convolution), prepend a `<cls>` token or pool at the end, add a position
//! encoding, run pre-LN Transformer layers with full (non-causal) attention, normalise, classify.
use tch::nn::{self, Module};
use tch::{Kind, Tensor};

use super::{Pool, VisionConfig};
use crate::attention::Mask;
use crate::config::{Activation, AttentionConfig, PositionConfig, PositionEncoding};
use crate::layers::{LayerConfig, TransformerLayer};
use crate::pe::sinusoidal_table;

pub struct Vit {
    patch_embed: nn::Conv2D,
    cls: Option<Tensor>,
    /// Absolute position encoding added to every token (learned table or fixed sinusoids); relative
    /// schemes live in the attention core instead.
    positions: Option<Tensor>,
    layers: Vec<TransformerLayer>,
    norm: nn::LayerNorm,
    head: nn::Linear,
    pool: Pool,
}

impl Vit {
    pub fn new(vs: &nn::Path, cfg: &VisionConfig) -> Self {
        let d = cfg.dim;
        let grid = cfg.stage_grid(0);
        let tokens = grid * grid + i64::from(cfg.pool == Pool::Cls);
        let conv = nn::ConvConfig { stride: cfg.patch_size, ..Default::default() };
        let patch_embed = nn::conv2d(vs / "patch_embed", cfg.channels, d, cfg.patch_size, conv);
        let cls = (cfg.pool == Pool::Cls).then(|| vs.var("cls_token", &[1, 1, d], nn::Init::Const(0.0)));
        let positions = match cfg.pe {
            PositionEncoding::Learned => {
                Some(vs.var("pos_embed", &[1, tokens, d], nn::Init::Randn { mean: 0.0, stdev: 0.02 }))
            }
            PositionEncoding::Sinusoidal => Some(sinusoidal_table(tokens, d, vs.device()).unsqueeze(0)),
            _ => None,
        };
        let attention = AttentionConfig::default();
        let position = PositionConfig::default();
        let layer = LayerConfig {
            d_model: d,
            heads: cfg.heads[0],
            ffn_hidden: cfg.ffn_hidden(d),
            activation: Activation::Gelu,
            pre_ln: true,
            dropout: cfg.dropout,
            attention: &attention,
            pe: cfg.pe,
            position: &position,
            cross_attention: false,
            residual_init_std: 0.02,
            norm_eps: 1e-5,
        };
        let layers = (0..cfg.depths[0]).map(|i| TransformerLayer::new(vs / "blocks" / i, &layer)).collect();
        Self {
            patch_embed,
            cls,
            positions,
            layers,
            norm: nn::layer_norm(vs / "norm", vec![d], Default::default()),
            head: nn::linear(vs / "head", d, cfg.classes, Default::default()),
            pool: cfg.pool,
        }
    }

    /// Final token states (B, N, D) and, when asked, every layer's attention weights (B, H, N, N).
    pub fn features(&self, images: &Tensor, train: bool, want_weights: bool) -> (Tensor, Vec<Tensor>) {
        let patches = self.patch_embed.forward(images).flatten(2, -1).transpose(1, 2);
        let b = patches.size()[0];
        let mut x = match &self.cls {
            Some(cls) => Tensor::cat(&[cls.expand([b, -1, -1], false), patches], 1),
            None => patches,
        };
        if let Some(p) = &self.positions {
            x += p;
        }
        let mut weights = Vec::new();
        for layer in &self.layers {
            let out = layer.forward(&x, &Mask::default(), None, None, train, want_weights);
            weights.extend(out.self_weights);
            x = out.output;
        }
        (self.norm.forward(&x), weights)
    }

    pub fn forward(&self, images: &Tensor, train: bool) -> Tensor {
        let (x, _) = self.features(images, train, false);
        let pooled = match self.pool {
            Pool::Cls => x.select(1, 0),
            Pool::Mean => x.mean_dim(1, false, Kind::Float),
        };
        self.head.forward(&pooled)
    }
}
