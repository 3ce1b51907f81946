//! A trained decoder, BERT, ViT, Swin or DaViT in the layouts researchers' tools read: Hugging Face's GPT-2,
//! OPT, Llama, Mistral and Qwen3 (`model.safetensors`, `config.json`, the tokenizer), BERT (`BertForMaskedLM`),
//! ViT (`ViTForImageClassification`), ImageGPT (`ImageGPTForCausalImageModeling`), timm's
//! `SwinTransformer` and `DaVit`, so that `transformers` (and
//! TransformerLens through it) or timm opens an ablate run. Each layout expresses a set of settings exactly; a model with a setting its
//! layout cannot express is refused in one line naming the key and the layout, never written as a silently
//! different model. `tests/interop.rs` loads every export of every knob row with the real library and
//! compares its logits with ablate's own (`docs/interop.md`).
//!
//! The layouts, the plainest first:
//! - `gpt2`: pre-LN with a final LayerNorm, learned absolute positions (a sinusoidal table or none is
//!   written as the table it is), LayerNorm, a two-matrix FFN, biases (zeros where ablate has none), heads
//!   of d_model / heads; GPT-2 stores its projections as `Conv1D`, the transpose of a linear layer's weight.
//! - `opt`: OPT's decoder, which also has post-LN layers (`do_layer_norm_before: false`, no final norm) and
//!   pre-LN without a final norm; its learned position table starts two rows late (OPT's offset).
//! - `llama`: pre-LN with RMSNorm, RoPE (Hugging Face's rotate-half layout, which is ablate's), a gated FFN
//!   (SwiGLU or GeGLU), grouped-query attention and any head width; FFN biases or none (`mlp_bias`).
//! - `mistral`: Llama's without any bias, one causal sliding window for every layer (ablate's window of w
//!   neighbours is `transformers`' `sliding_window: w + 1`, which counts the query).
//! - `qwen3`: Llama's without FFN biases, QK-norm (RMSNorm over each head's features, before RoPE), and per
//!   layer a sliding window or full attention (`layer_types`: ablate's `layer_patterns`).
//! - `bert` (kind bert, masked-LM pre-training): post-LN, learned positions (or the table sinusoids or none
//!   are), segment embeddings, the embedding LayerNorm, GELU (transformers' MLM head applies the FFN's
//!   nonlinearity, ablate's is GELU), the MLM head's bias under both names `transformers` ties.
//! - `vit` (kind vit): pre-LN with a final LayerNorm, a stride-p convolution for the patches, a `<cls>` token
//!   the classifier reads, a learned table over `<cls>` and the patches (sinusoids or none as the table they
//!   are), a two-matrix FFN.
//! - `swin` (kind swin): timm's `SwinTransformer` state dict and a timm `config.json` (its architecture and
//!   the arguments that rebuild it): pre-LN blocks, exact GELU, the relative bias per window offset (a zero
//!   table for none), shifted windows, patch merging (timm's at the start of a stage, ablate's at the end of
//!   the one before), any head width.
//! - `davit` (kind davit): timm's `DaVit` (`head_norm_first`, so the final norm precedes the pooling as
//!   ablate's does): spatial and channel blocks in timm's pairs, the depthwise position convolutions (zeros
//!   for none), a 7×7 stride-4 stem, heads of d_model / heads.
//! - `imagegpt` (kind image_gpt): GPT-2's layout with ImageGPT's RMSNorm (`ImageGPTLayerNorm`: no centring, no
//!   bias), so ablate's `norm: rms_norm`; the head without the start token's row.
//!
//! The encoder-decoder (translate), the sequence classifier and the CNN have no layout here: refused in one
//! line naming the kind.
use anyhow::{bail, Context, Result};
use serde_json::json;
use std::collections::HashMap;
use std::path::Path;
use tch::{Device, Kind, Tensor};

use crate::recipe::{Config, Kind as RunKind};

mod timm;
use crate::transformer::spec::{
    AbsoluteAt, Activation, Combine, Norm, OutputGate, PositionEncoding, QkNorm, Scale, Scoring, TransformerSpec,
};
use timm::{davit_to_timm, swin_to_timm, timm_refusal};

/// A Hugging Face model layout an ablate model can be written in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Layout {
    Gpt2,
    Opt,
    Llama,
    Mistral,
    Qwen3,
    Bert,
    Vit,
    Swin,
    Davit,
    ImageGpt,
}

impl Layout {
    pub const ALL: [Layout; 10] = [
        Layout::Gpt2,
        Layout::Opt,
        Layout::Llama,
        Layout::Mistral,
        Layout::Qwen3,
        Layout::Bert,
        Layout::Vit,
        Layout::Swin,
        Layout::Davit,
        Layout::ImageGpt,
    ];
    /// The decoder layouts (kind lm), the plainest first.
    pub const DECODERS: [Layout; 5] = [Layout::Gpt2, Layout::Opt, Layout::Llama, Layout::Mistral, Layout::Qwen3];

    pub fn name(self) -> &'static str {
        match self {
            Layout::Gpt2 => "gpt2",
            Layout::Opt => "opt",
            Layout::Llama => "llama",
            Layout::Mistral => "mistral",
            Layout::Qwen3 => "qwen3",
            Layout::Bert => "bert",
            Layout::Vit => "vit",
            Layout::Swin => "swin",
            Layout::Davit => "davit",
            Layout::ImageGpt => "imagegpt",
        }
    }

    /// The kind of run whose models the layout holds.
    pub fn kind(self) -> RunKind {
        match self {
            Layout::Vit => RunKind::Vit,
            Layout::Swin => RunKind::Swin,
            Layout::Davit => RunKind::Davit,
            Layout::ImageGpt => RunKind::ImageGpt,
            Layout::Bert => RunKind::Bert,
            _ => RunKind::Lm,
        }
    }

    /// The layout named `name` (`gpt2`, `opt`, `llama`, ...).
    pub fn parse(name: &str) -> std::result::Result<Layout, String> {
        Layout::ALL.into_iter().find(|l| l.name() == name).ok_or_else(|| {
            format!("unknown layout `{name}`: expected one of auto, {}", Layout::ALL.map(Layout::name).join(", "))
        })
    }

    /// The library that loads it, as `ablate export --to` names it: `hf` (transformers) or `timm`.
    pub fn library(self) -> &'static str {
        match self {
            Layout::Swin | Layout::Davit => "timm",
            _ => "hf",
        }
    }

    /// The `transformers` class (or timm's model) that loads it.
    pub fn class(self) -> &'static str {
        match self {
            Layout::Gpt2 => "GPT2LMHeadModel",
            Layout::Opt => "OPTForCausalLM",
            Layout::Llama => "LlamaForCausalLM",
            Layout::Mistral => "MistralForCausalLM",
            Layout::Qwen3 => "Qwen3ForCausalLM",
            Layout::Bert => "BertForMaskedLM",
            Layout::Vit => "ViTForImageClassification",
            Layout::Swin => "timm SwinTransformer",
            Layout::Davit => "timm DaVit",
            Layout::ImageGpt => "ImageGPTForCausalImageModeling",
        }
    }
}

/// The keys of the Transformer section that [`refusal`] and the layouts' tables know: each is mapped by a
/// layout or refused by name. A key not listed here (a knob added after the layouts were written) is
/// refused by every layout whenever a run sets it away from its default (`recipe::columns` leaves a key
/// out at its silent default), so a new mechanism is never exported as a silently different model. Map
/// a new knob by listing it here with its correspondence and its refusals.
const KNOWN_KEYS: &[&str] = &[
    "activation",
    "attention.bias",
    "attention.differential",
    "attention.dropout",
    "attention.implementation",
    "attention.kv_heads",
    "attention.layer_patterns",
    "attention.output_gate",
    "attention.pattern.dilation",
    "attention.pattern.global_every",
    "attention.pattern.global_tokens",
    "attention.pattern.window_schedule",
    "attention.pattern.window",
    "attention.qk_dim",
    "attention.qk_norm",
    "attention.scale",
    "attention.scoring",
    "attention.softcap",
    "block_size",
    "d_model",
    "dropout",
    "ffn_bias",
    "ffn_hidden",
    "final_norm",
    "head_dim",
    "heads",
    "layers",
    "logit_softcap",
    "mup_base_width",
    "norm",
    "output_init",
    "parallel",
    "parametrisation",
    "pe",
    "position.at",
    "position.combine",
    "position.concat_dim",
    "position.rope_fraction",
    "position.rope_theta",
    "position.shaw_max_distance",
    "position.t5_buckets",
    "position.t5_max_distance",
    "pre_ln",
    "residual",
    "scale_embeddings",
    "tie_embeddings",
    "unet_skips",
    "value_embeddings",
    "value_residual",
];

/// The first setting of `cfg` that `layout` cannot express, as `key=value: why` (None: it expresses all).
pub fn refusal(layout: Layout, cfg: &Config) -> Option<String> {
    if cfg.kind != layout.kind() {
        return Some(format!("kind={}: the {} layout holds kind {} models", cfg.kind, layout.name(), layout.kind()));
    }
    let name = layout.name();
    let unknown = crate::recipe::columns(cfg)
        .into_iter()
        .find(|(key, _)| key.strip_prefix("transformer.").is_some_and(|rest| !KNOWN_KEYS.contains(&rest)));
    if let Some((key, value)) = unknown {
        return Some(format!("{key}={value}: no layout maps this key yet, so the {name} layout does not express it"));
    }
    let t = cfg.transformer_spec();
    let a = &t.attention;
    let p = &t.position;
    let no =
        |key: &str, value: String, why: &str| Some(format!("transformer.{key}={value}: {why} in the {name} layout"));
    // What no layout here expresses.
    if !t.residual {
        return no("residual", "false".into(), "every layer adds its branch to the stream");
    }
    if t.scale_embeddings {
        return no("scale_embeddings", "true".into(), "the token embeddings are not scaled");
    }
    if let Some(c) = t.logit_softcap {
        return no("logit_softcap", c.to_string(), "the logits are not capped");
    }
    if t.mup_width_mult.is_some() {
        return no("parametrisation", "mup".into(), "neither the readout nor the scores are rescaled");
    }
    if t.parallel {
        return no("parallel", "true".into(), "attention and FFN are sequential");
    }
    if t.value_residual {
        return no("value_residual", "true".into(), "values are not mixed across layers");
    }
    if t.value_embeddings > 0 {
        return no("value_embeddings", t.value_embeddings.to_string(), "values have no embedding tables");
    }
    if t.unet_skips {
        return no("unet_skips", "true".into(), "layers have no skip connections");
    }
    if let Some(why) = pattern_refusal(layout, &t) {
        return Some(why);
    }
    if a.scoring != Scoring::Dot {
        return no("attention.scoring", "additive".into(), "scores are dot products");
    }
    match (layout, a.qk_norm) {
        (Layout::Qwen3, QkNorm::RmsNorm) => {}
        (Layout::Qwen3, q) => {
            return no("attention.qk_norm", serde_name(q), "queries and keys are RMS-normalised per head")
        }
        (_, QkNorm::None) => {}
        (_, q) => return no("attention.qk_norm", serde_name(q), "queries and keys are not normalised"),
    }
    if let Some(c) = a.softcap {
        return no("attention.softcap", c.to_string(), "scores are not capped");
    }
    if a.output_gate != OutputGate::None {
        return no("attention.output_gate", serde_name(a.output_gate), "heads are not gated");
    }
    if a.differential.is_some() {
        return no("attention.differential", "true".into(), "each head has one softmax map");
    }
    if a.qk_dim != a.head_dim {
        return no("attention.qk_dim", a.qk_dim.to_string(), "queries and keys are as wide as the values");
    }
    if p.encoding.is_absolute() && p.at != AbsoluteAt::Input {
        return no("position.at", serde_name(p.at), "positions are added to the input once");
    }
    if p.encoding.is_absolute() && p.combine == Combine::Concat {
        return no("position.combine", "concat".into(), "positions are added, not concatenated");
    }
    if matches!(layout, Layout::Swin | Layout::Davit) {
        return timm_refusal(layout, cfg, &t);
    }
    if layout == Layout::Bert {
        let b = cfg.bert();
        if b.task != crate::recipe::BertTask::Pretrain {
            return Some(format!(
                "bert.task={}: the bert layout holds the masked-LM model (pretrain)",
                serde_name(b.task)
            ));
        }
        if b.objective != crate::recipe::PretrainObjective::Masked {
            return Some(format!(
                "bert.objective={}: attention is bidirectional in the bert layout",
                serde_name(b.objective)
            ));
        }
        // transformers' MLM transform applies the FFN's nonlinearity; ablate's is always GELU.
        if t.activation != Activation::Gelu {
            return no(
                "activation",
                serde_name(t.activation),
                "the MLM head's nonlinearity is the FFN's (ablate's is GELU)",
            );
        }
    }
    if layout == Layout::Vit {
        let v = cfg.vision();
        if v.pool != crate::models::spec::Pool::Cls {
            return Some(format!(
                "vision.pool={}: the classifier reads the <cls> token in the vit layout",
                serde_name(v.pool)
            ));
        }
        if v.registers > 0 {
            return Some(format!("vision.registers={}: there are no register tokens in the vit layout", v.registers));
        }
    }
    match layout {
        // Refused above, by timm_refusal.
        Layout::Swin | Layout::Davit => {}
        Layout::Gpt2 | Layout::Opt | Layout::Bert | Layout::Vit | Layout::ImageGpt => {
            // ImageGPT's norm is RMSNorm (its `ImageGPTLayerNorm` neither centres nor has a bias).
            match (layout, t.norm) {
                (Layout::ImageGpt, Norm::RmsNorm) => {}
                (Layout::ImageGpt, n) => return no("norm", serde_name(n), "the norm is RMSNorm"),
                (_, Norm::LayerNorm) => {}
                (_, n) => return no("norm", serde_name(n), "the norm is LayerNorm"),
            }
            if t.activation.is_gated() {
                return no("activation", serde_name(t.activation), "the FFN has two matrices");
            }
            if !matches!(p.encoding, PositionEncoding::Learned | PositionEncoding::Sinusoidal | PositionEncoding::None)
            {
                return no("pe", serde_name(p.encoding), "positions are an absolute table");
            }
            if a.kv_heads != a.heads {
                return no("attention.kv_heads", a.kv_heads.to_string(), "every head has its own keys and values");
            }
            if a.inner() != t.d_model {
                return no("attention.head_dim", a.head_dim.to_string(), "heads are d_model / heads wide");
            }
        }
        Layout::Llama | Layout::Mistral | Layout::Qwen3 => {
            if t.norm != Norm::RmsNorm {
                return no("norm", serde_name(t.norm), "the norm is RMSNorm");
            }
            if !t.activation.is_gated() {
                return no("activation", serde_name(t.activation), "the FFN is gated (swiglu, geglu)");
            }
            if layout != Layout::Llama && t.ffn_bias {
                return no("ffn_bias", "true".into(), "the FFN has no biases");
            }
            if layout == Layout::Mistral && a.bias {
                return no("attention.bias", "true".into(), "the attention projections have no biases");
            }
            if p.encoding != PositionEncoding::Rope {
                return no("pe", serde_name(p.encoding), "positions are RoPE");
            }
            if p.rope_fraction != 1.0 {
                return no("position.rope_fraction", p.rope_fraction.to_string(), "RoPE rotates the whole head");
            }
        }
    }
    match (layout, t.pre_ln, t.final_norm) {
        (Layout::Gpt2 | Layout::Llama | Layout::Mistral | Layout::Qwen3 | Layout::Vit | Layout::ImageGpt, false, _) => {
            no("pre_ln", "false".into(), "layers are pre-LN")
        }
        (
            Layout::Gpt2 | Layout::Llama | Layout::Mistral | Layout::Qwen3 | Layout::Vit | Layout::ImageGpt,
            true,
            false,
        ) => no("final_norm", "false".into(), "the stack ends with a norm"),
        (Layout::Opt, false, true) => no("final_norm", "true".into(), "a post-LN stack has no final norm"),
        (Layout::Bert, true, _) => no("pre_ln", "true".into(), "layers are post-LN"),
        (Layout::Bert, false, true) => no("final_norm", "true".into(), "a post-LN stack has no final norm"),
        _ => match (layout, a.scale) {
            (_, Scale::SqrtDk) | (Layout::Gpt2 | Layout::ImageGpt, Scale::None) => None,
            (_, Scale::None) => no("attention.scale", "none".into(), "scores are scaled by 1/√d_head"),
            (_, Scale::Factor(f)) => no("attention.scale", f.to_string(), "scores are scaled by 1/√d_head"),
        },
    }
}

/// Why `layout` cannot express the stack's attention patterns (None: it can). Mistral's one sliding window
/// for every layer and Qwen3's per-layer choice between a sliding window and full attention are ablate's
/// causal window of `w` neighbours (`transformers`' `sliding_window` is w + 1, the query counted); every
/// other layout attends densely.
fn pattern_refusal(layout: Layout, t: &TransformerSpec) -> Option<String> {
    let name = layout.name();
    let no =
        |key: &str, value: String, why: &str| Some(format!("transformer.{key}={value}: {why} in the {name} layout"));
    let windowed = matches!(layout, Layout::Mistral | Layout::Qwen3);
    if !t.layer_patterns.is_empty() && layout != Layout::Qwen3 {
        return no("attention.layer_patterns", "[…]".into(), "every layer attends alike");
    }
    for i in 0..t.layers {
        let p = t.for_layer(i).attention.pattern;
        let key = |leaf: &str| match t.layer_patterns.is_empty() {
            true => format!("attention.pattern.{leaf}"),
            false => "attention.layer_patterns".into(),
        };
        if p.global_tokens > 0 {
            return no(&key("global_tokens"), p.global_tokens.to_string(), "there are no global tokens");
        }
        if let Some(g) = p.global_every {
            return no(&key("global_every"), g.to_string(), "no position is global");
        }
        if let Some(w) = p.window {
            if !windowed {
                return no(&key("window"), w.to_string(), "attention is dense");
            }
            if p.dilation != 1 {
                return no(&key("dilation"), p.dilation.to_string(), "a window is contiguous");
            }
        }
    }
    let mut widths: Vec<i64> = layer_windows(t).into_iter().flatten().collect();
    widths.sort_unstable();
    widths.dedup();
    (widths.len() > 1).then(|| {
        format!("transformer.attention.layer_patterns=[…]: the windowed layers share one width in the {name} layout")
    })
}

/// Each layer's causal window (None: dense).
fn layer_windows(t: &TransformerSpec) -> Vec<Option<i64>> {
    (0..t.layers).map(|i| t.for_layer(i).attention.pattern.window).collect()
}

/// The plainest layout that expresses `cfg` exactly, or one line naming why each refuses.
pub fn choose(cfg: &Config) -> std::result::Result<Layout, String> {
    let mut why = Vec::new();
    for layout in Layout::ALL.into_iter().filter(|l| l.kind() == cfg.kind) {
        match refusal(layout, cfg) {
            None => return Ok(layout),
            Some(line) => why.push(line),
        }
    }
    if why.is_empty() {
        let held: Vec<String> = Layout::ALL.iter().map(|l| format!("{} ({})", l.name(), l.kind())).collect();
        return Err(format!("kind {} has no Hugging Face layout here; the layouts: {}", cfg.kind, held.join(", ")));
    }
    Err(format!("no Hugging Face layout expresses this model: {}", why.join("; ")))
}

/// A setting as a recipe spells it (its serde name).
fn serde_name(value: impl serde::Serialize + std::fmt::Debug) -> String {
    serde_json::to_value(&value).ok().and_then(|v| v.as_str().map(String::from)).unwrap_or_else(|| format!("{value:?}"))
}

/// `transformers`' name of an FFN nonlinearity (its `ACT2FN`): exact GELU is `gelu`, squared ReLU `relu2`.
fn hf_activation(a: Activation) -> &'static str {
    match a {
        Activation::Relu => "relu",
        Activation::Gelu | Activation::Geglu => "gelu",
        Activation::Relu2 => "relu2",
        Activation::Swiglu => "silu",
    }
}

/// A model in a Hugging Face layout: its `config.json` and its tensors under the layout's names.
pub struct Exported {
    pub layout: Layout,
    pub config: serde_json::Value,
    pub tensors: Vec<(String, Tensor)>,
}

/// How one of ablate's tensors becomes one or more of a layout's, and back.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) enum Op {
    /// The same tensor under another name.
    Same,
    /// GPT-2's `Conv1D` stores (in, out), the transpose of a linear layer's (out, in).
    Transpose,
    /// ablate's fused projection is the layout's separate ones stacked by rows (Q, K, V).
    Stack,
    /// OPT's learned position table starts this many rows late (its `OPTLearnedPositionalEmbedding`).
    Offset(i64),
    /// ViT's position table has a leading batch dimension of one.
    Batch,
    /// One tensor the layout stores under several names (BERT's tied MLM bias).
    Copies,
    /// The matrix without its last row (ImageGPT's head, which never predicts the start token).
    DropLastRow,
}

/// One correspondence between ablate's variables and a layout's tensors.
#[derive(Debug, Clone)]
pub(super) struct Link {
    pub(super) ours: String,
    pub(super) theirs: Vec<String>,
    pub(super) op: Op,
    /// The tensor's shape when it may be missing on one side and then means zeros: a bias ablate was built
    /// without is written as zeros in a layout that always has one, and a layout's missing bias (Llama's
    /// `mlp_bias: false`) is read as ablate's zero bias.
    pub(super) zero_if_absent: Option<Vec<i64>>,
}

/// Every correspondence of the decoder `t` in `layout` (positions a table computes, not a variable, are
/// written apart by [`convert`]).
pub(super) fn links(layout: Layout, t: &TransformerSpec) -> Vec<Link> {
    let a = &t.attention;
    let [wq, wk, wv] = a.projection_widths();
    let (d, ffn) = (t.d_model, t.ffn_hidden);
    let mut out = Vec::new();
    let mut link = |ours: String, theirs: Vec<String>, op: Op, zero: Option<Vec<i64>>| {
        out.push(Link { ours, theirs, op, zero_if_absent: zero })
    };
    let one = |name: String| vec![name];
    let three = |f: &dyn Fn(&str) -> String| ["q_proj", "k_proj", "v_proj"].iter().map(|r| f(r)).collect::<Vec<_>>();
    // ablate's ViT keeps its blocks under `blocks`, its decoders under `layers`.
    let stack = match layout {
        Layout::Vit => "blocks",
        Layout::Bert => "bert.layers",
        Layout::ImageGpt => "decoder.layers",
        _ => "layers",
    };
    for i in 0..t.layers {
        let l = |rest: &str| format!("{stack}.{i}.{rest}");
        match layout {
            Layout::Swin | Layout::Davit => {}
            Layout::Gpt2 | Layout::ImageGpt => {
                let h = |rest: &str| format!("transformer.h.{i}.{rest}");
                link(l("norm_attn.weight"), one(h("ln_1.weight")), Op::Same, None);
                if layout == Layout::Gpt2 {
                    link(l("norm_attn.bias"), one(h("ln_1.bias")), Op::Same, None);
                    link(l("norm_ffn.bias"), one(h("ln_2.bias")), Op::Same, None);
                }
                link(l("attn.qkv.weight"), one(h("attn.c_attn.weight")), Op::Transpose, None);
                link(l("attn.qkv.bias"), one(h("attn.c_attn.bias")), Op::Same, Some(vec![wq + wk + wv]));
                link(l("attn.out.weight"), one(h("attn.c_proj.weight")), Op::Transpose, None);
                link(l("attn.out.bias"), one(h("attn.c_proj.bias")), Op::Same, Some(vec![d]));
                link(l("norm_ffn.weight"), one(h("ln_2.weight")), Op::Same, None);
                link(l("ffn.up.weight"), one(h("mlp.c_fc.weight")), Op::Transpose, None);
                link(l("ffn.up.bias"), one(h("mlp.c_fc.bias")), Op::Same, Some(vec![ffn]));
                link(l("ffn.down.weight"), one(h("mlp.c_proj.weight")), Op::Transpose, None);
                link(l("ffn.down.bias"), one(h("mlp.c_proj.bias")), Op::Same, Some(vec![d]));
            }
            Layout::Opt => {
                let h = |rest: &str| format!("model.decoder.layers.{i}.{rest}");
                let attn = |part: &str| three(&|role| h(&format!("self_attn.{role}.{part}")));
                link(l("attn.qkv.weight"), attn("weight"), Op::Stack, None);
                link(l("attn.qkv.bias"), attn("bias"), Op::Stack, Some(vec![wq + wk + wv]));
                link(l("attn.out.weight"), one(h("self_attn.out_proj.weight")), Op::Same, None);
                link(l("attn.out.bias"), one(h("self_attn.out_proj.bias")), Op::Same, Some(vec![d]));
                link(l("norm_attn.weight"), one(h("self_attn_layer_norm.weight")), Op::Same, None);
                link(l("norm_attn.bias"), one(h("self_attn_layer_norm.bias")), Op::Same, None);
                link(l("ffn.up.weight"), one(h("fc1.weight")), Op::Same, None);
                link(l("ffn.up.bias"), one(h("fc1.bias")), Op::Same, Some(vec![ffn]));
                link(l("ffn.down.weight"), one(h("fc2.weight")), Op::Same, None);
                link(l("ffn.down.bias"), one(h("fc2.bias")), Op::Same, Some(vec![d]));
                link(l("norm_ffn.weight"), one(h("final_layer_norm.weight")), Op::Same, None);
                link(l("norm_ffn.bias"), one(h("final_layer_norm.bias")), Op::Same, None);
            }
            Layout::Llama | Layout::Mistral | Layout::Qwen3 => {
                let h = |rest: &str| format!("model.layers.{i}.{rest}");
                let attn = |part: &str| three(&|role| h(&format!("self_attn.{role}.{part}")));
                link(l("attn.qkv.weight"), attn("weight"), Op::Stack, None);
                if a.bias {
                    link(l("attn.qkv.bias"), attn("bias"), Op::Stack, None);
                    link(l("attn.out.bias"), one(h("self_attn.o_proj.bias")), Op::Same, None);
                }
                link(l("attn.out.weight"), one(h("self_attn.o_proj.weight")), Op::Same, None);
                if layout == Layout::Qwen3 {
                    link(l("attn.q_norm.weight"), one(h("self_attn.q_norm.weight")), Op::Same, None);
                    link(l("attn.k_norm.weight"), one(h("self_attn.k_norm.weight")), Op::Same, None);
                }
                // ablate's gated FFN is down(act(up x) ⊙ gate x); Llama's down(act(gate_proj x) ⊙ up_proj x).
                link(l("ffn.up.weight"), one(h("mlp.gate_proj.weight")), Op::Same, None);
                link(l("ffn.gate.weight"), one(h("mlp.up_proj.weight")), Op::Same, None);
                link(l("ffn.down.weight"), one(h("mlp.down_proj.weight")), Op::Same, None);
                if t.ffn_bias {
                    link(l("ffn.up.bias"), one(h("mlp.gate_proj.bias")), Op::Same, None);
                    link(l("ffn.gate.bias"), one(h("mlp.up_proj.bias")), Op::Same, None);
                    link(l("ffn.down.bias"), one(h("mlp.down_proj.bias")), Op::Same, None);
                }
                link(l("norm_attn.weight"), one(h("input_layernorm.weight")), Op::Same, None);
                link(l("norm_ffn.weight"), one(h("post_attention_layernorm.weight")), Op::Same, None);
            }
            Layout::Bert => {
                let h = |rest: &str| format!("bert.encoder.layer.{i}.{rest}");
                let attn = |part: &str| {
                    ["query", "key", "value"]
                        .iter()
                        .map(|r| h(&format!("attention.self.{r}.{part}")))
                        .collect::<Vec<_>>()
                };
                link(l("attn.qkv.weight"), attn("weight"), Op::Stack, None);
                link(l("attn.qkv.bias"), attn("bias"), Op::Stack, Some(vec![wq + wk + wv]));
                link(l("attn.out.weight"), one(h("attention.output.dense.weight")), Op::Same, None);
                link(l("attn.out.bias"), one(h("attention.output.dense.bias")), Op::Same, Some(vec![d]));
                link(l("norm_attn.weight"), one(h("attention.output.LayerNorm.weight")), Op::Same, None);
                link(l("norm_attn.bias"), one(h("attention.output.LayerNorm.bias")), Op::Same, None);
                link(l("ffn.up.weight"), one(h("intermediate.dense.weight")), Op::Same, None);
                link(l("ffn.up.bias"), one(h("intermediate.dense.bias")), Op::Same, Some(vec![ffn]));
                link(l("ffn.down.weight"), one(h("output.dense.weight")), Op::Same, None);
                link(l("ffn.down.bias"), one(h("output.dense.bias")), Op::Same, Some(vec![d]));
                link(l("norm_ffn.weight"), one(h("output.LayerNorm.weight")), Op::Same, None);
                link(l("norm_ffn.bias"), one(h("output.LayerNorm.bias")), Op::Same, None);
            }
            Layout::Vit => {
                let h = |rest: &str| format!("vit.layers.{i}.{rest}");
                let attn = |part: &str| three(&|role| h(&format!("attention.{role}.{part}")));
                link(l("attn.qkv.weight"), attn("weight"), Op::Stack, None);
                if a.bias {
                    link(l("attn.qkv.bias"), attn("bias"), Op::Stack, None);
                }
                link(l("attn.out.weight"), one(h("attention.o_proj.weight")), Op::Same, None);
                link(l("attn.out.bias"), one(h("attention.o_proj.bias")), Op::Same, Some(vec![d]));
                link(l("norm_attn.weight"), one(h("layernorm_before.weight")), Op::Same, None);
                link(l("norm_attn.bias"), one(h("layernorm_before.bias")), Op::Same, None);
                link(l("norm_ffn.weight"), one(h("layernorm_after.weight")), Op::Same, None);
                link(l("norm_ffn.bias"), one(h("layernorm_after.bias")), Op::Same, None);
                link(l("ffn.up.weight"), one(h("mlp.fc1.weight")), Op::Same, None);
                link(l("ffn.up.bias"), one(h("mlp.fc1.bias")), Op::Same, Some(vec![ffn]));
                link(l("ffn.down.weight"), one(h("mlp.fc2.weight")), Op::Same, None);
                link(l("ffn.down.bias"), one(h("mlp.fc2.bias")), Op::Same, Some(vec![d]));
            }
        }
    }
    let learned = t.position.encoding == PositionEncoding::Learned;
    let final_norm = |suffix: &str| format!("final_norm.{suffix}");
    match layout {
        // timm's names are written by swin_to_timm, stage by stage.
        Layout::Swin | Layout::Davit => return out,
        // ImageGPT's head has no row for its start token, which is never a target.
        Layout::ImageGpt => {
            let e = |rest: &str| vec![format!("transformer.{rest}")];
            link("decoder.token_embedding.weight".into(), e("wte.weight"), Op::Same, None);
            if learned {
                link("decoder.position.table".into(), e("wpe.weight"), Op::Same, None);
            }
            link("decoder.final_norm.weight".into(), e("ln_f.weight"), Op::Same, None);
            let head = if t.tie_embeddings { "decoder.token_embedding.weight" } else { "decoder.lm_head.weight" };
            link(head.into(), one("lm_head.weight".into()), Op::DropLastRow, None);
            return out;
        }
        Layout::Gpt2 => {
            link("token_embedding.weight".into(), one("transformer.wte.weight".into()), Op::Same, None);
            if learned {
                link("position.table".into(), one("transformer.wpe.weight".into()), Op::Same, None);
            }
            link(final_norm("weight"), one("transformer.ln_f.weight".into()), Op::Same, None);
            link(final_norm("bias"), one("transformer.ln_f.bias".into()), Op::Same, None);
        }
        Layout::Opt => {
            link("token_embedding.weight".into(), one("model.decoder.embed_tokens.weight".into()), Op::Same, None);
            if learned {
                let name = one("model.decoder.embed_positions.weight".into());
                link("position.table".into(), name, Op::Offset(OPT_POSITION_OFFSET), None);
            }
            if t.final_norm {
                link(final_norm("weight"), one("model.decoder.final_layer_norm.weight".into()), Op::Same, None);
                link(final_norm("bias"), one("model.decoder.final_layer_norm.bias".into()), Op::Same, None);
            }
        }
        Layout::Llama | Layout::Mistral | Layout::Qwen3 => {
            link("token_embedding.weight".into(), one("model.embed_tokens.weight".into()), Op::Same, None);
            link(final_norm("weight"), one("model.norm.weight".into()), Op::Same, None);
        }
        Layout::Bert => {
            let e = |rest: &str| vec![format!("bert.embeddings.{rest}")];
            link("bert.word_embedding.weight".into(), e("word_embeddings.weight"), Op::Same, None);
            link("bert.segment_embedding.weight".into(), e("token_type_embeddings.weight"), Op::Same, None);
            if learned {
                link("bert.position.table".into(), e("position_embeddings.weight"), Op::Same, None);
            }
            link("bert.embedding_norm.weight".into(), e("LayerNorm.weight"), Op::Same, None);
            link("bert.embedding_norm.bias".into(), e("LayerNorm.bias"), Op::Same, None);
            let p = |rest: &str| vec![format!("cls.predictions.{rest}")];
            link("mlm.dense.weight".into(), p("transform.dense.weight"), Op::Same, None);
            link("mlm.dense.bias".into(), p("transform.dense.bias"), Op::Same, None);
            link("mlm.norm.weight".into(), p("transform.LayerNorm.weight"), Op::Same, None);
            link("mlm.norm.bias".into(), p("transform.LayerNorm.bias"), Op::Same, None);
            // One bias, stored under both of the names `transformers` ties together.
            link("mlm.bias".into(), [p("bias"), p("decoder.bias")].concat(), Op::Copies, None);
            if !t.tie_embeddings {
                link("mlm.decoder".into(), p("decoder.weight"), Op::Same, None);
            }
            return out;
        }
        Layout::Vit => {
            let e = |rest: &str| vec![format!("vit.embeddings.{rest}")];
            link("patch_embed.weight".into(), e("patch_embeddings.projection.weight"), Op::Same, None);
            link("patch_embed.bias".into(), e("patch_embeddings.projection.bias"), Op::Same, None);
            link("cls_token".into(), e("cls_token"), Op::Same, None);
            if learned {
                link("pos_embed.table".into(), e("position_embeddings"), Op::Batch, None);
            }
            link("norm.weight".into(), one("vit.layernorm.weight".into()), Op::Same, None);
            link("norm.bias".into(), one("vit.layernorm.bias".into()), Op::Same, None);
            link("head.weight".into(), one("classifier.weight".into()), Op::Same, None);
            link("head.bias".into(), one("classifier.bias".into()), Op::Same, None);
            return out;
        }
    }
    if !t.tie_embeddings {
        link("lm_head.weight".into(), one("lm_head.weight".into()), Op::Same, None);
    }
    out
}

/// Rows OPT's learned position table holds before position 0.
const OPT_POSITION_OFFSET: i64 = 2;

/// The weights of a decoder (its VarStore's variables by name) in `layout`, with the config that describes
/// them; refused in one line when the layout cannot express the model.
pub fn convert(layout: Layout, cfg: &Config, weights: &HashMap<String, Tensor>, vocab: i64) -> Result<Exported> {
    if let Some(why) = refusal(layout, cfg) {
        bail!("ablate export: {why}");
    }
    match layout {
        Layout::Swin => return swin_to_timm(cfg, weights),
        Layout::Davit => return davit_to_timm(cfg, weights),
        _ => {}
    }
    // ImageGPT's sequence is the start token and the pixels: its block is the grid's.
    let (t, vocab) = match layout {
        Layout::ImageGpt => (cfg.image_gpt_spec().transformer, cfg.image_gpt().palette + 1),
        _ => (cfg.transformer_spec(), vocab),
    };
    let zeros = |shape: &[i64]| Tensor::zeros(shape, (Kind::Float, Device::Cpu));
    let mut out: Vec<(String, Tensor)> = Vec::new();
    for link in links(layout, &t) {
        let ours = match (weights.get(&link.ours), &link.zero_if_absent) {
            (Some(w), _) => w.detach().to_device(Device::Cpu).to_kind(Kind::Float),
            (None, Some(shape)) => zeros(shape),
            (None, None) => bail!("the checkpoint has no `{}`", link.ours),
        };
        let theirs: Vec<Tensor> = match link.op {
            Op::Same => vec![ours],
            Op::Transpose => vec![ours.tr()],
            Op::Stack => ours.split_with_sizes(t.attention.projection_widths(), 0),
            Op::Offset(rows) => vec![Tensor::cat(&[zeros(&[rows, ours.size()[1]]), ours], 0)],
            Op::Batch => vec![ours.unsqueeze(0)],
            Op::Copies => link.theirs.iter().map(|_| ours.shallow_clone()).collect(),
            Op::DropLastRow => vec![ours.narrow(0, 0, ours.size()[0] - 1)],
        };
        out.extend(link.theirs.into_iter().zip(theirs).map(|(name, w)| (name, w.contiguous())));
    }
    // A sinusoidal table, or none, is written as the learned table it equals.
    let rotary = matches!(layout, Layout::Llama | Layout::Mistral | Layout::Qwen3);
    if !rotary && t.position.encoding != PositionEncoding::Learned {
        // ViT's table covers the <cls> token and the patches.
        let rows = match layout {
            Layout::Vit => cfg.vit_spec().grid().pow(2) + 1,
            _ => t.block_size,
        };
        let table = match t.position.encoding {
            PositionEncoding::Sinusoidal => {
                crate::transformer::positions::sinusoidal_table(rows, t.d_model, Device::Cpu)
            }
            _ => zeros(&[rows, t.d_model]),
        };
        out.push(match layout {
            Layout::Gpt2 | Layout::ImageGpt => ("transformer.wpe.weight".into(), table),
            Layout::Bert => ("bert.embeddings.position_embeddings.weight".into(), table),
            Layout::Vit => ("vit.embeddings.position_embeddings".into(), table.unsqueeze(0)),
            _ => {
                let padded = Tensor::cat(&[zeros(&[OPT_POSITION_OFFSET, t.d_model]), table], 0);
                ("model.decoder.embed_positions.weight".into(), padded)
            }
        });
    }
    let mut config = hf_config(layout, &t, vocab);
    if layout == Layout::Vit {
        let (image, classes) = (cfg.image(), cfg.vision().classes);
        let labels: serde_json::Map<String, serde_json::Value> =
            (0..classes).map(|c| (c.to_string(), json!(c.to_string()))).collect();
        let ids: serde_json::Map<String, serde_json::Value> = (0..classes).map(|c| (c.to_string(), json!(c))).collect();
        let extra = json!({"image_size": image.size, "patch_size": image.patch, "num_channels": image.channels,
                           "id2label": labels, "label2id": ids});
        config.as_object_mut().expect("a JSON object").extend(extra.as_object().expect("a JSON object").clone());
    }
    Ok(Exported { layout, config, tensors: out })
}

/// `config.json` of `layout` for the decoder `t` over `vocab` tokens.
pub(super) fn hf_config(layout: Layout, t: &TransformerSpec, vocab: i64) -> serde_json::Value {
    let a = &t.attention;
    // No special tokens: ablate's vocabularies have none of GPT-2's or Llama's ids.
    let common = json!({
        "architectures": [layout.class()],
        "vocab_size": vocab,
        "tie_word_embeddings": t.tie_embeddings,
        "bos_token_id": null,
        "eos_token_id": null,
        "pad_token_id": null,
        "torch_dtype": "float32",
    });
    let specific = match layout {
        Layout::Swin | Layout::Davit => json!({}),
        Layout::ImageGpt => json!({
            "model_type": "imagegpt",
            "n_embd": t.d_model,
            "n_layer": t.layers,
            "n_head": a.heads,
            "n_inner": t.ffn_hidden,
            "n_positions": t.block_size,
            "activation_function": hf_activation(t.activation),
            "layer_norm_epsilon": 1e-5,
            "resid_pdrop": t.dropout,
            "embd_pdrop": t.dropout,
            "attn_pdrop": a.dropout,
            "scale_attn_weights": a.scale == Scale::SqrtDk,
            // The head is its own matrix (the embedding's rows but the start token's, when ablate ties them).
            "tie_word_embeddings": false,
        }),
        Layout::Gpt2 => json!({
            "model_type": "gpt2",
            "n_embd": t.d_model,
            "n_layer": t.layers,
            "n_head": a.heads,
            "n_inner": t.ffn_hidden,
            "n_positions": t.block_size,
            "n_ctx": t.block_size,
            "activation_function": hf_activation(t.activation),
            "layer_norm_epsilon": 1e-5,
            "resid_pdrop": t.dropout,
            "embd_pdrop": t.dropout,
            "attn_pdrop": a.dropout,
            "scale_attn_weights": a.scale == Scale::SqrtDk,
        }),
        Layout::Opt => json!({
            "model_type": "opt",
            "hidden_size": t.d_model,
            "word_embed_proj_dim": t.d_model,
            "num_hidden_layers": t.layers,
            "num_attention_heads": a.heads,
            "ffn_dim": t.ffn_hidden,
            "max_position_embeddings": t.block_size,
            "activation_function": hf_activation(t.activation),
            "do_layer_norm_before": t.pre_ln,
            "_remove_final_layer_norm": t.pre_ln && !t.final_norm,
            "enable_bias": true,
            "layer_norm_elementwise_affine": true,
            "dropout": t.dropout,
            "attention_dropout": a.dropout,
        }),
        Layout::Bert => json!({
            "model_type": "bert",
            "hidden_size": t.d_model,
            "num_hidden_layers": t.layers,
            "num_attention_heads": a.heads,
            "intermediate_size": t.ffn_hidden,
            "hidden_act": hf_activation(t.activation),
            "max_position_embeddings": t.block_size,
            "type_vocab_size": 2,
            "layer_norm_eps": 1e-12,
            "position_embedding_type": "absolute",
            "hidden_dropout_prob": t.dropout,
            "attention_probs_dropout_prob": a.dropout,
        }),
        Layout::Vit => json!({
            "model_type": "vit",
            "hidden_size": t.d_model,
            "num_hidden_layers": t.layers,
            "num_attention_heads": a.heads,
            "intermediate_size": t.ffn_hidden,
            "hidden_act": hf_activation(t.activation),
            "layer_norm_eps": 1e-5,
            "qkv_bias": a.bias,
            "hidden_dropout_prob": t.dropout,
            "attention_probs_dropout_prob": a.dropout,
        }),
        Layout::Llama | Layout::Mistral | Layout::Qwen3 => json!({
            "model_type": layout.name(),
            "hidden_size": t.d_model,
            "num_hidden_layers": t.layers,
            "num_attention_heads": a.heads,
            "num_key_value_heads": a.kv_heads,
            "head_dim": a.head_dim,
            "intermediate_size": t.ffn_hidden,
            "max_position_embeddings": t.block_size,
            "hidden_act": hf_activation(t.activation),
            "rms_norm_eps": 1e-5,
            "rope_parameters": {"rope_type": "default", "rope_theta": t.position.rope_theta},
            "attention_bias": a.bias,
            "mlp_bias": t.ffn_bias,
            "attention_dropout": a.dropout,
        }),
    };
    let mut config = common;
    let (Some(c), Some(s)) = (config.as_object_mut(), specific.as_object()) else { unreachable!("JSON objects") };
    c.extend(s.clone());
    // transformers' sliding_window counts the query itself; ablate's window counts its neighbours.
    let windows = layer_windows(t);
    let width = windows.iter().flatten().next().map(|w| w + 1);
    match layout {
        Layout::Mistral => {
            c.insert("sliding_window".into(), json!(width));
        }
        Layout::Qwen3 => {
            let types: Vec<&str> =
                windows.iter().map(|w| if w.is_some() { "sliding_attention" } else { "full_attention" }).collect();
            c.insert("use_sliding_window".into(), json!(width.is_some()));
            c.insert("sliding_window".into(), json!(width));
            c.insert("layer_types".into(), json!(types));
        }
        _ => {}
    }
    config
}

/// Writes `model.safetensors` (with the `{"format": "pt"}` metadata `transformers` asks for) and
/// `config.json` into `dir`, each through a temporary file and a rename.
pub fn write(dir: &Path, exported: &Exported) -> Result<()> {
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let data: Vec<(String, Vec<u8>, Vec<usize>)> = exported
        .tensors
        .iter()
        .map(|(name, t)| {
            let values = Vec::<f32>::try_from(t.reshape([-1])).expect("a float tensor");
            let bytes = values.iter().flat_map(|v| v.to_le_bytes()).collect();
            (name.clone(), bytes, t.size().iter().map(|&d| d as usize).collect())
        })
        .collect();
    let views = data
        .iter()
        .map(|(name, bytes, shape)| {
            let view = safetensors::tensor::TensorView::new(safetensors::Dtype::F32, shape.clone(), bytes)
                .map_err(|e| anyhow::anyhow!("{name}: {e}"))?;
            Ok((name.as_str(), view))
        })
        .collect::<Result<Vec<_>>>()?;
    let metadata = Some(HashMap::from([("format".to_string(), "pt".to_string())]));
    let bytes = safetensors::serialize(views, &metadata).map_err(|e| anyhow::anyhow!("serialising: {e}"))?;
    crate::files::write_atomically(&dir.join("model.safetensors"), &bytes)?;
    let config = serde_json::to_string_pretty(&exported.config)?;
    crate::files::write_atomically(&dir.join("config.json"), config.as_bytes())?;
    Ok(())
}

/// Writes `tokenizer.json`, which Hugging Face's `tokenizers` (and `PreTrainedTokenizerFast`) load: a
/// subword tokenizer as it is; a character vocabulary as a word-level model over single characters (each
/// character its own piece, joined back without spaces by the `Fuse` decoder), with the ids ablate gives.
pub fn write_tokenizer(dir: &Path, tokenizer: &crate::data::tokenize::TextTokenizer) -> Result<()> {
    let json = match tokenizer.to_saved()? {
        ("char", characters) => {
            let vocab: serde_json::Map<String, serde_json::Value> =
                characters.chars().enumerate().map(|(i, c)| (c.to_string(), json!(i))).collect();
            let unknown = characters.chars().next().map(String::from).unwrap_or_default();
            serde_json::to_string_pretty(&json!({
                "version": "1.0",
                "truncation": null,
                "padding": null,
                "added_tokens": [],
                "normalizer": null,
                "pre_tokenizer": {"type": "Split", "pattern": {"Regex": "[\\s\\S]"}, "behavior": "Isolated", "invert": false},
                "post_processor": null,
                "decoder": {"type": "Fuse"},
                "model": {"type": "WordLevel", "vocab": vocab, "unk_token": unknown},
            }))?
        }
        (_, json) => json,
    };
    crate::files::write_atomically(&dir.join("tokenizer.json"), json.as_bytes())
}

/// Writes `README.md`, the model card: where the model comes from (recipe, run, commit), its test metrics,
/// the layout and how to open it.
pub fn write_card(dir: &Path, layout: Layout, source: &str, run_id: &str, metrics: &[(String, String)]) -> Result<()> {
    let library = if layout.library() == "timm" { "timm" } else { "transformers" };
    let mut card = format!(
        "---\nlibrary_name: {library}\ntags: [ablate]\n---\n# {run_id}\n\nTrained by ablate ({source}); exported by \
         `ablate export` in the {} layout (`{}`).\n\n",
        layout.name(),
        layout.class()
    );
    if !metrics.is_empty() {
        card.push_str("| metric | value |\n|---|---|\n");
        for (k, v) in metrics {
            card.push_str(&format!("| {k} | {v} |\n"));
        }
        card.push('\n');
    }
    card.push_str(match layout.kind() {
        RunKind::ImageGpt => {
            "```python\nfrom transformers import ImageGPTForCausalImageModeling\nmodel = \
             ImageGPTForCausalImageModeling.from_pretrained(\"DIR\")  # pixel tokens of ablate's palette\n```\n"
        }
        RunKind::Swin | RunKind::Davit => {
            "```python\nimport timm\nmodel = timm.create_model(\"local-dir:DIR\", pretrained=True)  # images as ablate \
             reads them\n```\n"
        }
        RunKind::Lm => {
            "```python\nfrom transformers import AutoModelForCausalLM, PreTrainedTokenizerFast\nmodel = \
             AutoModelForCausalLM.from_pretrained(\"DIR\")\ntokenizer = PreTrainedTokenizerFast(tokenizer_file=\"DIR/tokenizer.json\")\n```\n"
        }
        RunKind::Bert => {
            "```python\nfrom transformers import AutoModelForMaskedLM, PreTrainedTokenizerFast\nmodel = \
             AutoModelForMaskedLM.from_pretrained(\"DIR\")\ntokenizer = PreTrainedTokenizerFast(tokenizer_file=\"DIR/tokenizer.json\")\n```\n"
        }
        _ => {
            "```python\nfrom transformers import AutoModelForImageClassification\nmodel = \
             AutoModelForImageClassification.from_pretrained(\"DIR\")  # pixel_values as ablate reads its images\n```\n"
        }
    });
    crate::files::write_atomically(&dir.join("README.md"), card.as_bytes())
}

#[cfg(test)]
mod tests {
    use super::{choose, KNOWN_KEYS};

    /// A kind no layout holds (the encoder-decoder, the sequence classifier, the CNN) is refused in one line
    /// naming the kind, and each kind with layouts gets one of its own.
    #[test]
    fn every_kind_gets_a_layout_of_its_own_or_one_line_naming_it() {
        for (kind, extra, layout) in [
            ("lm", "transformer: {pre_ln: true}", Some("gpt2")),
            ("bert", "data: {tokenizer: wordpiece, vocab_size: 50}", Some("bert")),
            ("vit", "", Some("vit")),
            ("swin", "", Some("swin")),
            ("davit", "vision: {patch_size: 4, window: 4}", Some("davit")),
            ("image_gpt", "transformer: {norm: rms_norm}", Some("imagegpt")),
            ("translate", "data: {tokenizer: bpe, vocab_size: 300}", None),
            ("seq_classify", "", None),
            ("cnn", "", None),
        ] {
            let text = format!("kind: {kind}\n{extra}\n");
            let cfg = crate::recipe::parse(&text, "k.yaml", "k", false).unwrap().runs[0].config.clone();
            match (choose(&cfg), layout) {
                (Ok(l), Some(name)) => assert_eq!(l.name(), name, "{kind}"),
                (Err(line), None) => assert!(!line.contains('\n') && line.contains(kind), "{kind}: {line}"),
                (got, _) => panic!("{kind}: {:?}", got.map(|l| l.name())),
            }
        }
    }

    /// A key renamed in the schema but not here would leave its old name listed and its new one refused: every
    /// listed key must be a key of the Transformer section.
    #[test]
    fn every_key_the_layouts_know_is_a_key_of_the_transformer_section() {
        let keys: Vec<String> = crate::recipe::keys::reference().into_iter().map(|k| k.key).collect();
        for known in KNOWN_KEYS {
            let key = format!("transformer.{known}");
            assert!(keys.iter().any(|k| k == &key || k.starts_with(&format!("{key}[]"))), "{key} is not a recipe key");
        }
    }
}
