//! The recipe's `transformer:` section as the plain settings every model is built from.
use super::schema::{Config, Kind, LayerPatternConfig, PatternConfig, PositionConfig};
use crate::models::spec::{Image, ImageGptSpec, StagedSpec, VitSpec};
use crate::transformer::spec::{AttentionSpec, Pattern, PositionEncoding, PositionSpec, TransformerSpec};

impl PatternConfig {
    /// The stack's pattern: a layer's keys (window, dilation, selected positions) and the global tokens.
    pub fn spec(&self) -> Pattern {
        let layer =
            LayerPatternConfig { window: self.window, dilation: self.dilation, global_every: self.global_every };
        let window_schedule = self.window_schedule.iter().map(|&[until, w]| (until, w)).collect();
        Pattern { window_schedule, ..layer.spec(self.global_tokens) }
    }
}

impl LayerPatternConfig {
    /// This layer's pattern, with the stack's global tokens.
    pub fn spec(&self, global_tokens: i64) -> Pattern {
        Pattern {
            window: self.window,
            dilation: self.dilation,
            global_every: self.global_every,
            global_tokens,
            window_schedule: Vec::new(),
        }
    }
}

impl PositionConfig {
    pub fn spec(&self, encoding: PositionEncoding) -> PositionSpec {
        PositionSpec {
            encoding,
            at: self.at,
            combine: self.combine,
            concat_dim: self.concat_dim.unwrap_or(0),
            rope_theta: self.rope_theta,
            rope_fraction: self.rope_fraction,
            shaw_max_distance: self.shaw_max_distance,
            t5_buckets: self.t5_buckets,
            t5_max_distance: self.t5_max_distance,
        }
    }
}

impl Config {
    /// The run's Transformer, every default resolved.
    pub fn transformer_spec(&self) -> TransformerSpec {
        let t = &self.transformer;
        let a = &t.attention;
        TransformerSpec {
            d_model: t.d_model,
            layers: t.layers,
            ffn_hidden: t.ffn_hidden(),
            activation: t.activation,
            ffn_bias: t.ffn_bias,
            pre_ln: t.pre_ln,
            norm: t.norm,
            residual: t.residual,
            final_norm: self.final_norm(),
            dropout: t.dropout,
            attention: AttentionSpec {
                heads: t.heads,
                head_dim: t.head_dim(),
                kv_heads: t.kv_heads(),
                qk_dim: t.qk_dim(),
                scoring: a.scoring,
                scale: a.scale,
                implementation: a.implementation,
                dropout: a.dropout,
                bias: a.bias,
                pattern: a.pattern.spec(),
                qk_norm: a.qk_norm,
                softcap: a.softcap,
                output_gate: a.output_gate,
                differential: a.differential.then_some(0),
                sink: a.sink,
                init_std: 0.02 / t.mup_width_mult().unwrap_or(1.0).sqrt(),
            },
            position: t.position.spec(t.pe),
            block_size: t.block_size,
            tie_embeddings: t.tie_embeddings,
            layer_patterns: a.layer_patterns.iter().map(|l| l.spec(a.pattern.global_tokens)).collect(),
            scale_embeddings: t.scale_embeddings,
            logit_softcap: t.logit_softcap,
            output_init: t.output_init,
            parallel: t.parallel,
            value_residual: t.value_residual,
            value_embeddings: t.value_embeddings,
            unet_skips: t.unet_skips,
            mup_width_mult: t.mup_width_mult(),
        }
        .with_mup_attention_scale()
    }
}

trait MupScale {
    fn with_mup_attention_scale(self) -> Self;
}

impl MupScale for TransformerSpec {
    /// Under muP the scores scale as 1/d_head: √(d_base)/d_head, d_base the head width at the base width, so
    /// that the scale is 1/√d_head there.
    fn with_mup_attention_scale(mut self) -> Self {
        if let Some(m) = self.mup_width_mult {
            let d = self.attention.qk_dim as f64;
            self.attention.scale = crate::transformer::spec::Scale::Factor((d / m).sqrt() / d);
        }
        self
    }
}

impl Config {
    /// A vision run's images and patches.
    pub fn image(&self) -> Image {
        let v = self.vision();
        Image { size: v.image_size, channels: v.channels, classes: v.classes, patch: v.patch_size }
    }

    /// A vision run's Transformer: its sequence is the patch grid (plus a `<cls>` token for ViT).
    fn vision_transformer(&self) -> TransformerSpec {
        let mut t = self.transformer_spec();
        let grid = self.vision().grid(self.kind);
        t.block_size =
            grid * grid + i64::from(self.kind == Kind::Vit && self.vision().pool == crate::models::spec::Pool::Cls);
        t
    }

    /// A ViT run's model: its registers join the global tokens of every layer's pattern.
    pub fn vit_spec(&self) -> VitSpec {
        let registers = self.vision().registers;
        let mut transformer = self.vision_transformer();
        transformer.attention.pattern.global_tokens += registers;
        for p in &mut transformer.layer_patterns {
            p.global_tokens += registers;
        }
        VitSpec { image: self.image(), pool: self.vision().pool, transformer, registers }
    }

    /// The convolutional baseline's structure.
    pub fn cnn_spec(&self) -> crate::models::spec::CnnSpec {
        let c = self.cnn();
        crate::models::spec::CnnSpec { image: self.image(), channels: c.channels.clone(), kernel: c.kernel }
    }

    /// Swin's or DaViT's structure.
    pub fn staged_spec(&self) -> StagedSpec {
        let v = self.vision();
        StagedSpec {
            image: self.image(),
            depths: v.depths.clone(),
            window: v.window,
            shift: v.shift,
            blocks: if self.kind == Kind::Davit { v.attention_types.clone() } else { Vec::new() },
            transformer: self.transformer_spec(),
            round_grid_up: self.kind == Kind::Davit,
        }
    }

    pub fn image_gpt_spec(&self) -> ImageGptSpec {
        ImageGptSpec { image: self.image(), palette: self.image_gpt().palette, transformer: self.vision_transformer() }
    }
}
