//! timm's layouts of ablate's hierarchical vision models: `SwinTransformer` (`swin`) and `DaVit` (`davit`),
//! each a state dict under timm's names and a `config.json` of the architecture and the arguments that
//! `timm.create_model("local-dir:DIR", pretrained=True)` rebuilds it from.
use anyhow::{Context, Result};
use serde_json::json;
use std::collections::HashMap;
use tch::{Device, Kind, Tensor};

use super::{serde_name, Exported, Layout};
use crate::recipe::Config;
use crate::transformer::spec::{Activation, Norm, PositionEncoding, Scale, TransformerSpec};

/// Why timm's `SwinTransformer` (`swin`) or `DaVit` (`davit`) cannot express the `cfg` (None: it can).
/// Both: pre-LN blocks with LayerNorm, an exact-GELU two-matrix FFN of one width ratio, a final norm, every
/// head its own keys and values. Swin: a relative bias per window offset (ablate's `bias_2d`; no encoding is
/// that table at zero), every second block shifted. DaViT: the convolutional position encoding (`conv`; none
/// is its convolution at zero), heads of d_model / heads, a 7×7 stride-4 stem, stages that repeat the block
/// kinds whole, windows no larger than any stage's grid (timm pads a smaller grid; ablate shrinks the window).
pub(super) fn timm_refusal(layout: Layout, cfg: &Config, t: &TransformerSpec) -> Option<String> {
    let name = layout.name();
    let no = |key: &str, value: String, why: &str| Some(format!("{key}={value}: {why} in the {name} layout"));
    let a = &t.attention;
    if t.norm != Norm::LayerNorm {
        return no("transformer.norm", serde_name(t.norm), "the norm is LayerNorm");
    }
    if t.activation != Activation::Gelu {
        return no("transformer.activation", serde_name(t.activation), "the FFN is two matrices around a GELU");
    }
    if a.kv_heads != a.heads {
        return no("transformer.attention.kv_heads", a.kv_heads.to_string(), "every head has its own keys and values");
    }
    if !t.pre_ln {
        return no("transformer.pre_ln", "false".into(), "blocks are pre-LN");
    }
    if !t.final_norm {
        return no("transformer.final_norm", "false".into(), "the last stage ends with a norm");
    }
    if a.scale != Scale::SqrtDk {
        return no("transformer.attention.scale", serde_name(a.scale), "scores are scaled by 1/√d_head");
    }
    // timm's FFN is int(width · mlp_ratio) wide at every stage: ablate's must be that number.
    let spec = cfg.staged_spec();
    let ratio = t.ffn_hidden as f64 / t.d_model as f64;
    for i in 0..spec.stages() {
        let stage = spec.stage(i);
        if (stage.d_model as f64 * ratio) as i64 != stage.ffn_hidden {
            return no(
                "transformer.ffn_hidden",
                t.ffn_hidden.to_string(),
                "the FFN's width is one ratio of the stage's",
            );
        }
    }
    let encoding = t.position.encoding;
    match layout {
        Layout::Swin => {
            if !cfg.vision().shift {
                return no("vision.shift", "false".into(), "every second block shifts its windows");
            }
            if !matches!(encoding, PositionEncoding::Bias2d | PositionEncoding::None) {
                return no("transformer.pe", serde_name(encoding), "positions are a bias per window offset");
            }
        }
        _ => {
            if !matches!(encoding, PositionEncoding::Conv | PositionEncoding::None) {
                return no("transformer.pe", serde_name(encoding), "positions are a depthwise convolution per block");
            }
            if a.inner() != t.d_model {
                return no("transformer.attention.head_dim", a.head_dim.to_string(), "heads are d_model / heads wide");
            }
            if spec.image.patch != 4 {
                return no(
                    "vision.patch_size",
                    spec.image.patch.to_string(),
                    "the stem is a 7×7 convolution of stride 4",
                );
            }
            let kinds = spec.blocks.len() as i64;
            if let Some(d) = spec.depths.iter().find(|d| *d % kinds != 0) {
                return no("vision.depths", d.to_string(), "a stage repeats the block kinds whole");
            }
            if (0..spec.stages()).any(|i| spec.window(i) != spec.window) {
                return no("vision.window", spec.window.to_string(), "a window larger than the grid pads the grid");
            }
        }
    }
    None
}

/// timm's state dict as it is written: ablate's variables, on the CPU in fp32, under timm's names.
struct TimmTensors<'a> {
    weights: &'a HashMap<String, Tensor>,
    out: Vec<(String, Tensor)>,
}

impl<'a> TimmTensors<'a> {
    fn new(weights: &'a HashMap<String, Tensor>) -> Self {
        Self { weights, out: Vec::new() }
    }

    /// ablate's `ours` as timm's `theirs`.
    fn copy(&mut self, theirs: String, ours: &str) -> Result<()> {
        let w = self.weights.get(ours).with_context(|| format!("the checkpoint has no `{ours}`"))?;
        self.out.push((theirs, w.detach().to_device(Device::Cpu).to_kind(Kind::Float)));
        Ok(())
    }

    /// ablate's `ours` as timm's `theirs`, or zeros of `shape` where ablate was built without it (a bias, a 2-D
    /// bias table, a position convolution): timm's module at zero computes what ablate's absence does.
    fn copy_or_zeros(&mut self, theirs: String, ours: &str, shape: &[i64]) -> Result<()> {
        if self.weights.contains_key(ours) {
            return self.copy(theirs, ours);
        }
        self.out.push((theirs, Tensor::zeros(shape, (Kind::Float, Device::Cpu))));
        Ok(())
    }

    /// Top-level variables, renamed.
    fn rename(&mut self, pairs: &[(&str, &str)]) -> Result<()> {
        pairs.iter().try_for_each(|(ours, theirs)| self.copy(theirs.to_string(), ours))
    }

    /// One pre-LN block of `stage`, named by `ours` and `theirs`: the norms, the attention's projections, the
    /// FFN (timm's proj and FFN biases always exist; its qkv bias is `qkv_bias`).
    fn block(
        &mut self,
        stage: &TransformerSpec,
        ours: impl Fn(&str) -> String,
        theirs: impl Fn(&str) -> String,
    ) -> Result<()> {
        for (o, th) in [
            ("norm1.weight", "norm1.weight"),
            ("norm1.bias", "norm1.bias"),
            ("attn.qkv.weight", "attn.qkv.weight"),
            ("attn.out.weight", "attn.proj.weight"),
            ("norm2.weight", "norm2.weight"),
            ("norm2.bias", "norm2.bias"),
            ("mlp.up.weight", "mlp.fc1.weight"),
            ("mlp.down.weight", "mlp.fc2.weight"),
        ] {
            self.copy(theirs(th), &ours(o))?;
        }
        if stage.attention.bias {
            self.copy(theirs("attn.qkv.bias"), &ours("attn.qkv.bias"))?;
        }
        let d = stage.d_model;
        self.copy_or_zeros(theirs("attn.proj.bias"), &ours("attn.out.bias"), &[d])?;
        self.copy_or_zeros(theirs("mlp.fc1.bias"), &ours("mlp.up.bias"), &[stage.ffn_hidden])?;
        self.copy_or_zeros(theirs("mlp.fc2.bias"), &ours("mlp.down.bias"), &[d])
    }

    fn exported(self, layout: Layout, config: serde_json::Value) -> Exported {
        Exported { layout, config, tensors: self.out.into_iter().map(|(n, w)| (n, w.contiguous())).collect() }
    }
}

/// timm's `config.json` of the staged `cfg`: `architecture` rebuilt from `model_args`, with the image and the
/// classes (no normalisation: the export reads images as ablate does).
fn timm_config(cfg: &Config, architecture: &str, model_args: serde_json::Value) -> serde_json::Value {
    let spec = cfg.staged_spec();
    let (image, classes) = (cfg.image(), cfg.vision().classes);
    json!({
        "architecture": architecture,
        "num_classes": classes,
        "num_features": spec.stage(spec.stages() - 1).d_model,
        "model_args": model_args,
        "pretrained_cfg": {
            "input_size": [image.channels, image.size, image.size], "num_classes": classes,
            "mean": vec![0.0; image.channels as usize], "std": vec![1.0; image.channels as usize],
            "interpolation": "bilinear", "crop_pct": 1.0,
        },
    })
}

/// The Swin `cfg`'s variables (`weights`) under timm's `SwinTransformer` names, with timm's `config.json`:
/// the architecture and the arguments that rebuild it (`timm.create_model("local-dir:DIR", pretrained=True)`).
pub(super) fn swin_to_timm(cfg: &Config, weights: &HashMap<String, Tensor>) -> Result<Exported> {
    let spec = cfg.staged_spec();
    let t = &spec.transformer;
    let mut out = TimmTensors::new(weights);
    out.rename(&[
        ("patch_embed.weight", "patch_embed.proj.weight"),
        ("patch_embed.bias", "patch_embed.proj.bias"),
        ("patch_norm.weight", "patch_embed.norm.weight"),
        ("patch_norm.bias", "patch_embed.norm.bias"),
        ("norm.weight", "norm.weight"),
        ("norm.bias", "norm.bias"),
        ("head.weight", "head.fc.weight"),
        ("head.bias", "head.fc.bias"),
    ])?;
    for i in 0..spec.stages() {
        let stage = spec.stage(i);
        let span = 2 * spec.window(i) - 1;
        for j in 0..spec.depths[i] {
            let name = |rest: &str| format!("layers.{i}.blocks.{j}.{rest}");
            out.block(&stage, name, name)?;
            let table = name("attn.relative_position_bias_table");
            out.copy_or_zeros(table.clone(), &table, &[span * span, stage.attention.heads])?;
        }
        // ablate merges patches at the end of a stage, timm at the start of the next.
        if i + 1 < spec.stages() {
            for part in ["norm.weight", "norm.bias", "reduction.weight"] {
                out.copy(format!("layers.{}.downsample.{part}", i + 1), &format!("layers.{i}.downsample.{part}"))?;
            }
        }
    }
    let image = cfg.image();
    let heads: Vec<i64> = (0..spec.stages()).map(|i| spec.stage(i).attention.heads).collect();
    let model_args = json!({
        "img_size": image.size, "patch_size": image.patch, "in_chans": image.channels, "embed_dim": t.d_model,
        "depths": spec.depths, "num_heads": heads, "head_dim": t.attention.head_dim, "window_size": spec.window,
        "mlp_ratio": t.ffn_hidden as f64 / t.d_model as f64, "qkv_bias": t.attention.bias,
        "drop_rate": t.dropout, "proj_drop_rate": t.dropout, "attn_drop_rate": t.attention.dropout,
        "drop_path_rate": 0.0,
    });
    Ok(out.exported(Layout::Swin, timm_config(cfg, "swin_tiny_patch4_window7_224", model_args)))
}

/// The DaViT `cfg`'s variables under timm's `DaVit` names (block j of a stage is timm's pair j / kinds, member
/// j % kinds; the final norm is timm's `norm_pre`, applied before the pooling as ablate does), with timm's
/// `config.json`.
pub(super) fn davit_to_timm(cfg: &Config, weights: &HashMap<String, Tensor>) -> Result<Exported> {
    let spec = cfg.staged_spec();
    let t = &spec.transformer;
    let mut out = TimmTensors::new(weights);
    out.rename(&[
        ("stem.weight", "stem.conv.weight"),
        ("stem.bias", "stem.conv.bias"),
        ("stem_norm.weight", "stem.norm.weight"),
        ("stem_norm.bias", "stem.norm.bias"),
        ("norm.weight", "norm_pre.weight"),
        ("norm.bias", "norm_pre.bias"),
        ("head.weight", "head.fc.weight"),
        ("head.bias", "head.fc.bias"),
    ])?;
    let kinds = spec.blocks.len() as i64;
    for i in 0..spec.stages() {
        let stage = spec.stage(i);
        let d = stage.d_model;
        if i > 0 {
            for (ours, theirs) in [
                ("downsample_norm.weight", "downsample.norm.weight"),
                ("downsample_norm.bias", "downsample.norm.bias"),
                ("downsample.weight", "downsample.conv.weight"),
                ("downsample.bias", "downsample.conv.bias"),
            ] {
                out.copy(format!("stages.{i}.{theirs}"), &format!("stages.{i}.{ours}"))?;
            }
        }
        for j in 0..spec.depths[i] {
            let ours = |rest: &str| format!("stages.{i}.blocks.{j}.{rest}");
            let theirs = |rest: &str| format!("stages.{i}.blocks.{}.{}.{rest}", j / kinds, j % kinds);
            out.block(&stage, ours, theirs)?;
            // The position convolutions ablate was built without (pe none) are timm's at zero.
            for (k, cpe) in ["cpe1", "cpe2"].iter().enumerate() {
                out.copy_or_zeros(
                    theirs(&format!("{cpe}.proj.weight")),
                    &ours(&format!("cpe.{k}.proj.weight")),
                    &[d, 1, 3, 3],
                )?;
                out.copy_or_zeros(theirs(&format!("{cpe}.proj.bias")), &ours(&format!("cpe.{k}.proj.bias")), &[d])?;
            }
        }
    }
    let stages = 0..spec.stages();
    let kind_names: Vec<String> = spec.blocks.iter().map(|k| serde_name(*k)).collect();
    let model_args = json!({
        "in_chans": cfg.image().channels,
        "depths": spec.depths.iter().map(|d| d / kinds).collect::<Vec<_>>(),
        "embed_dims": stages.clone().map(|i| spec.stage(i).d_model).collect::<Vec<_>>(),
        "num_heads": stages.map(|i| spec.stage(i).attention.heads).collect::<Vec<_>>(),
        "window_size": spec.window, "mlp_ratio": t.ffn_hidden as f64 / t.d_model as f64,
        "qkv_bias": t.attention.bias, "attn_types": kind_names, "head_norm_first": true,
        "drop_rate": t.dropout, "drop_path_rate": 0.0,
    });
    Ok(out.exported(Layout::Davit, timm_config(cfg, "davit_tiny", model_args)))
}
