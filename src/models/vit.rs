//! ViT (Dosovitskiy et al. 2021; UDL §12.10.2): cut the image into p×p patches, embed each with one
//! learned linear map (a stride-p convolution), prepend a `<cls>` token or pool at the end, and run the
//! Transformer over the patch sequence (pre-LN, full attention, learned positions in the paper; every knob
//! of the run's Transformer acts here: a 1-D scheme over the patches' raster order, the 2-D bias or the
//! convolutional encoding over their grid). Normalise, classify.
use tch::nn::{self, Module};
use tch::{Kind, Tensor};

use super::spec::{Pool, VitSpec};
use super::ImageClassifier;
use crate::transformer::attention::{Grid, Mask};
use crate::transformer::layers::{self, GlobalTokens, LayerInit, Pass, Stack};
use crate::transformer::positions::{AbsolutePositions, ConvPosEnc};
use crate::transformer::spec::PositionEncoding;

pub struct Vit {
    patch_embed: nn::Conv2D,
    cls: Option<Tensor>,
    stack: Stack,
    head: nn::Linear,
    pool: Pool,
    /// `transformer.logit_softcap`.
    logit_softcap: Option<f64>,
}

impl Vit {
    pub fn new(vs: &nn::Path, spec: &VitSpec) -> Self {
        let t = &spec.transformer;
        let d = t.d_model;
        let grid = spec.grid();
        let cls_tokens = i64::from(spec.pool == Pool::Cls);
        let conv = nn::ConvConfig { stride: spec.image.patch, ..Default::default() };
        // With concatenated positions the patches (and `<cls>`) take D − P dimensions and the table the rest.
        let width = t.token_width();
        let patch_embed = nn::conv2d(vs / "patch_embed", spec.image.channels, width, spec.image.patch, conv);
        let cls = (spec.pool == Pool::Cls).then(|| vs.var("cls_token", &[1, 1, width], nn::Init::Const(0.0)));
        let tokens = grid * grid + cls_tokens;
        let positions = AbsolutePositions::new(vs / "pos_embed", t.position.encoding, tokens, t.position_width());
        let globals = t.attention.pattern.global_tokens;
        let on_grid = Grid { side: grid, lead: globals + cls_tokens };
        let layers = layers::layers(&(vs / "blocks"), t, t.layers, |_| false, LayerInit::default(), Some(on_grid));
        let conv_positions = (t.position.encoding == PositionEncoding::Conv).then(|| {
            let convs = (0..t.layers).map(|i| ConvPosEnc::new(vs / "cpe" / i, d)).collect();
            (convs, Grid { side: grid, lead: cls_tokens })
        });
        let final_norm = layers::final_norm(vs / "norm", d, t, 1e-5);
        let stack = Stack::new(t, positions, GlobalTokens::new(vs, globals, d), layers, final_norm)
            .with_conv_positions(conv_positions);
        Self {
            patch_embed,
            cls,
            stack,
            head: nn::linear(vs / "head", d, spec.image.classes, Default::default()),
            pool: spec.pool,
            logit_softcap: t.logit_softcap,
        }
    }

    /// The high-norm artefact registers remove (Darcet et al. 2024): per image, the largest norm of a patch
    /// token in the last layer's output (before the final norm, which would equalise them) over the median
    /// patch token's; the mean over `images`. About 1–2 without outliers, far above with them.
    pub fn token_norm_ratio(&self, images: &Tensor) -> f64 {
        let _guard = tch::no_grad_guard();
        let x = self.tokens(images);
        let (out, _) = self.stack.forward(&x, &Mask::default(), None, Pass::eval().before_final_norm());
        // The patches follow the <cls> token, if any (the stack drops the registers from its output).
        let lead = i64::from(self.cls.is_some());
        let n = x.size()[1] - lead;
        let norms = out.narrow(1, lead, n).to_kind(Kind::Float).square().sum_dim_intlist(-1, false, Kind::Float).sqrt();
        let (median, _) = norms.median_dim(1, false);
        (norms.amax(1, false) / median).mean(Kind::Float).double_value(&[])
    }

    /// Final token states (B, N, D) and, when asked, every layer's attention weights (B, H, N, N).
    pub fn features(&self, images: &Tensor, train: bool, want_weights: bool) -> (Tensor, Vec<Tensor>) {
        let x = self.tokens(images);
        self.stack.forward(&x, &Mask::default(), None, Pass::new(train).with_weights_if(want_weights))
    }

    /// The stack's input: the embedded patches (B, grid², D), after the `<cls>` token when pooling reads it.
    fn tokens(&self, images: &Tensor) -> Tensor {
        let patches = self.patch_embed.forward(images).flatten(2, -1).transpose(1, 2);
        let b = patches.size()[0];
        match &self.cls {
            Some(cls) => Tensor::cat(&[cls.expand([b, -1, -1], false), patches], 1),
            None => patches,
        }
    }
}

impl ImageClassifier for Vit {
    fn classify(&self, images: &Tensor, train: bool, want_weights: bool) -> (Tensor, Vec<Tensor>) {
        let (x, weights) = self.features(images, train, want_weights);
        let pooled = match self.pool {
            Pool::Cls => x.select(1, 0),
            Pool::Mean => x.mean_dim(1, false, Kind::Float),
        };
        (layers::softcap(self.head.forward(&pooled), self.logit_softcap), weights)
    }

    fn head(&self) -> &nn::Linear {
        &self.head
    }

    fn token_norm_ratio(&self, images: &Tensor) -> Option<f64> {
        Some(Vit::token_norm_ratio(self, images))
    }
}
