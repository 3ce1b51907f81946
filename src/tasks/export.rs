//! A trained decoder in the layouts researchers' tools read: Hugging Face's GPT-2, OPT and Llama
//! (`model.safetensors`, `config.json`, the tokenizer), so that `transformers` (and TransformerLens through
//! it) opens an ablate run. Each layout expresses a set of settings exactly; a model with a setting its
//! layout cannot express is refused in one line naming the key and the layout, never written as a silently
//! different model. `tests/interop.rs` loads every export of every knob row with the real library and
//! compares its logits with ablate's own (`docs/interop.md`).
//!
//! The three layouts, the plainest first:
//! - `gpt2`: pre-LN with a final LayerNorm, learned absolute positions (a sinusoidal table or none is
//!   written as the table it is), LayerNorm, a two-matrix FFN, biases (zeros where ablate has none), heads
//!   of d_model / heads; GPT-2 stores its projections as `Conv1D`, the transpose of a linear layer's weight.
//! - `opt`: OPT's decoder, which also has post-LN layers (`do_layer_norm_before: false`, no final norm) and
//!   pre-LN without a final norm; its learned position table starts two rows late (OPT's offset).
//! - `llama`: pre-LN with RMSNorm, RoPE (Hugging Face's rotate-half layout, which is ablate's), a gated FFN
//!   (SwiGLU or GeGLU), grouped-query attention and any head width.
use anyhow::{bail, Context, Result};
use serde_json::json;
use std::collections::HashMap;
use std::path::Path;
use tch::{Device, Kind, Tensor};

use crate::recipe::{Config, Kind as RunKind};
use crate::transformer::spec::{
    AbsoluteAt, Activation, Combine, Norm, OutputGate, PositionEncoding, QkNorm, Scale, Scoring, TransformerSpec,
};

/// A Hugging Face model layout an ablate decoder can be written in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Layout {
    Gpt2,
    Opt,
    Llama,
}

impl Layout {
    pub const ALL: [Layout; 3] = [Layout::Gpt2, Layout::Opt, Layout::Llama];

    pub fn name(self) -> &'static str {
        match self {
            Layout::Gpt2 => "gpt2",
            Layout::Opt => "opt",
            Layout::Llama => "llama",
        }
    }

    /// The layout named `name` (`gpt2`, `opt`, `llama`).
    pub fn parse(name: &str) -> std::result::Result<Layout, String> {
        Layout::ALL.into_iter().find(|l| l.name() == name).ok_or_else(|| {
            format!("unknown layout `{name}`: expected one of auto, {}", Layout::ALL.map(Layout::name).join(", "))
        })
    }

    /// The `transformers` class that loads it.
    pub fn class(self) -> &'static str {
        match self {
            Layout::Gpt2 => "GPT2LMHeadModel",
            Layout::Opt => "OPTForCausalLM",
            Layout::Llama => "LlamaForCausalLM",
        }
    }
}

/// The first setting of `cfg` that `layout` cannot express, as `key=value: why` (None: it expresses all).
pub fn refusal(layout: Layout, cfg: &Config) -> Option<String> {
    if cfg.kind != RunKind::Lm {
        return Some(format!("kind={}: only decoders (kind lm) have a Hugging Face layout here", cfg.kind));
    }
    let t = cfg.transformer_spec();
    let a = &t.attention;
    let p = &t.position;
    let name = layout.name();
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
    if !t.layer_patterns.is_empty() {
        return no("attention.layer_patterns", "[…]".into(), "every layer attends densely");
    }
    let pattern = &a.pattern;
    if let Some(w) = pattern.window {
        return no("attention.pattern.window", w.to_string(), "attention is dense");
    }
    if let Some(g) = pattern.global_every {
        return no("attention.pattern.global_every", g.to_string(), "attention is dense");
    }
    if pattern.global_tokens > 0 {
        return no("attention.pattern.global_tokens", pattern.global_tokens.to_string(), "there are no global tokens");
    }
    if a.scoring != Scoring::Dot {
        return no("attention.scoring", "additive".into(), "scores are dot products");
    }
    if a.qk_norm != QkNorm::None {
        return no("attention.qk_norm", serde_name(a.qk_norm), "queries and keys are not normalised");
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
    match layout {
        Layout::Gpt2 | Layout::Opt => {
            if t.norm != Norm::LayerNorm {
                return no("norm", serde_name(t.norm), "the norm is LayerNorm");
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
        Layout::Llama => {
            if t.norm != Norm::RmsNorm {
                return no("norm", serde_name(t.norm), "the norm is RMSNorm");
            }
            if !t.activation.is_gated() {
                return no("activation", serde_name(t.activation), "the FFN is gated (swiglu, geglu)");
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
        (Layout::Gpt2 | Layout::Llama, false, _) => no("pre_ln", "false".into(), "layers are pre-LN"),
        (Layout::Gpt2 | Layout::Llama, true, false) => no("final_norm", "false".into(), "the stack ends with a norm"),
        (Layout::Opt, false, true) => no("final_norm", "true".into(), "a post-LN stack has no final norm"),
        _ => match (layout, a.scale) {
            (_, Scale::SqrtDk) | (Layout::Gpt2, Scale::None) => None,
            (_, Scale::None) => no("attention.scale", "none".into(), "scores are scaled by 1/√d_head"),
            (_, Scale::Factor(f)) => no("attention.scale", f.to_string(), "scores are scaled by 1/√d_head"),
        },
    }
}

/// The plainest layout that expresses `cfg` exactly, or one line naming why each refuses.
pub fn choose(cfg: &Config) -> std::result::Result<Layout, String> {
    let mut why = Vec::new();
    for layout in Layout::ALL {
        match refusal(layout, cfg) {
            None => return Ok(layout),
            Some(line) => why.push(line),
        }
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

/// The weights of a decoder (its VarStore's variables by name) in `layout`, with the config that describes
/// them; refused in one line when the layout cannot express the model.
pub fn convert(layout: Layout, cfg: &Config, weights: &HashMap<String, Tensor>, vocab: i64) -> Result<Exported> {
    if let Some(why) = refusal(layout, cfg) {
        bail!("ablate export: {why}");
    }
    let t = cfg.transformer_spec();
    let get = |name: &str| -> Result<Tensor> {
        weights
            .get(name)
            .map(|w| w.detach().to_device(Device::Cpu).to_kind(Kind::Float))
            .with_context(|| format!("the checkpoint has no `{name}`"))
    };
    // A bias ablate was built without is a zero bias in the layouts that always have one.
    let bias_or_zero = |name: &str, width: i64| -> Result<Tensor> {
        match weights.get(name) {
            Some(_) => get(name),
            None => Ok(Tensor::zeros([width], (Kind::Float, Device::Cpu))),
        }
    };
    let a = &t.attention;
    let [wq, wk, wv] = a.projection_widths();
    let mut out: Vec<(String, Tensor)> = Vec::new();
    let mut put = |name: String, tensor: Tensor| out.push((name, tensor.contiguous()));
    let table = || -> Result<Tensor> {
        Ok(match t.position.encoding {
            PositionEncoding::Learned => get("position.table")?,
            PositionEncoding::Sinusoidal => {
                crate::transformer::positions::sinusoidal_table(t.block_size, t.d_model, Device::Cpu)
            }
            _ => Tensor::zeros([t.block_size, t.d_model], (Kind::Float, Device::Cpu)),
        })
    };
    for i in 0..t.layers {
        let l = |rest: &str| format!("layers.{i}.{rest}");
        let qkv = get(&l("attn.qkv.weight"))?;
        let qkv_bias = bias_or_zero(&l("attn.qkv.bias"), wq + wk + wv)?;
        let (out_w, out_b) = (get(&l("attn.out.weight"))?, bias_or_zero(&l("attn.out.bias"), t.d_model)?);
        let split = |w: &Tensor| w.split_with_sizes([wq, wk, wv], 0);
        match layout {
            Layout::Gpt2 => {
                let h = |rest: &str| format!("transformer.h.{i}.{rest}");
                put(h("ln_1.weight"), get(&l("norm_attn.weight"))?);
                put(h("ln_1.bias"), get(&l("norm_attn.bias"))?);
                // Conv1D: (in, out), the transpose of a linear layer's (out, in).
                put(h("attn.c_attn.weight"), qkv.tr());
                put(h("attn.c_attn.bias"), qkv_bias);
                put(h("attn.c_proj.weight"), out_w.tr());
                put(h("attn.c_proj.bias"), out_b);
                put(h("ln_2.weight"), get(&l("norm_ffn.weight"))?);
                put(h("ln_2.bias"), get(&l("norm_ffn.bias"))?);
                put(h("mlp.c_fc.weight"), get(&l("ffn.up.weight"))?.tr());
                put(h("mlp.c_fc.bias"), get(&l("ffn.up.bias"))?);
                put(h("mlp.c_proj.weight"), get(&l("ffn.down.weight"))?.tr());
                put(h("mlp.c_proj.bias"), get(&l("ffn.down.bias"))?);
            }
            Layout::Opt => {
                let h = |rest: &str| format!("model.decoder.layers.{i}.{rest}");
                let (w, b) = (split(&qkv), split(&qkv_bias));
                for (j, role) in ["q_proj", "k_proj", "v_proj"].iter().enumerate() {
                    put(h(&format!("self_attn.{role}.weight")), w[j].shallow_clone());
                    put(h(&format!("self_attn.{role}.bias")), b[j].shallow_clone());
                }
                put(h("self_attn.out_proj.weight"), out_w);
                put(h("self_attn.out_proj.bias"), out_b);
                put(h("self_attn_layer_norm.weight"), get(&l("norm_attn.weight"))?);
                put(h("self_attn_layer_norm.bias"), get(&l("norm_attn.bias"))?);
                put(h("fc1.weight"), get(&l("ffn.up.weight"))?);
                put(h("fc1.bias"), get(&l("ffn.up.bias"))?);
                put(h("fc2.weight"), get(&l("ffn.down.weight"))?);
                put(h("fc2.bias"), get(&l("ffn.down.bias"))?);
                put(h("final_layer_norm.weight"), get(&l("norm_ffn.weight"))?);
                put(h("final_layer_norm.bias"), get(&l("norm_ffn.bias"))?);
            }
            Layout::Llama => {
                let h = |rest: &str| format!("model.layers.{i}.{rest}");
                let w = split(&qkv);
                for (j, role) in ["q_proj", "k_proj", "v_proj"].iter().enumerate() {
                    put(h(&format!("self_attn.{role}.weight")), w[j].shallow_clone());
                }
                if a.bias {
                    let b = split(&qkv_bias);
                    for (j, role) in ["q_proj", "k_proj", "v_proj"].iter().enumerate() {
                        put(h(&format!("self_attn.{role}.bias")), b[j].shallow_clone());
                    }
                    put(h("self_attn.o_proj.bias"), out_b);
                }
                put(h("self_attn.o_proj.weight"), out_w);
                // ablate's gated FFN is down(act(up x) ⊙ gate x); Llama's down(act(gate_proj x) ⊙ up_proj x).
                put(h("mlp.gate_proj.weight"), get(&l("ffn.up.weight"))?);
                put(h("mlp.gate_proj.bias"), get(&l("ffn.up.bias"))?);
                put(h("mlp.up_proj.weight"), get(&l("ffn.gate.weight"))?);
                put(h("mlp.up_proj.bias"), get(&l("ffn.gate.bias"))?);
                put(h("mlp.down_proj.weight"), get(&l("ffn.down.weight"))?);
                put(h("mlp.down_proj.bias"), get(&l("ffn.down.bias"))?);
                put(h("input_layernorm.weight"), get(&l("norm_attn.weight"))?);
                put(h("post_attention_layernorm.weight"), get(&l("norm_ffn.weight"))?);
            }
        }
    }
    let embedding = get("token_embedding.weight")?;
    let final_norm = |suffix: &str| get(&format!("final_norm.{suffix}"));
    let head_name = match layout {
        Layout::Gpt2 => {
            put("transformer.wte.weight".into(), embedding);
            put("transformer.wpe.weight".into(), table()?);
            put("transformer.ln_f.weight".into(), final_norm("weight")?);
            put("transformer.ln_f.bias".into(), final_norm("bias")?);
            "lm_head.weight"
        }
        Layout::Opt => {
            put("model.decoder.embed_tokens.weight".into(), embedding);
            // OPT's learned positions are looked up two rows on (its `OPTLearnedPositionalEmbedding`).
            let padded = Tensor::cat(&[Tensor::zeros([2, t.d_model], (Kind::Float, Device::Cpu)), table()?], 0);
            put("model.decoder.embed_positions.weight".into(), padded);
            if t.final_norm {
                put("model.decoder.final_layer_norm.weight".into(), final_norm("weight")?);
                put("model.decoder.final_layer_norm.bias".into(), final_norm("bias")?);
            }
            "lm_head.weight"
        }
        Layout::Llama => {
            put("model.embed_tokens.weight".into(), embedding);
            put("model.norm.weight".into(), final_norm("weight")?);
            "lm_head.weight"
        }
    };
    if !t.tie_embeddings {
        put(head_name.into(), get("lm_head.weight")?);
    }
    Ok(Exported { layout, config: hf_config(layout, &t, vocab), tensors: out })
}

/// `config.json` of `layout` for the decoder `t` over `vocab` tokens.
fn hf_config(layout: Layout, t: &TransformerSpec, vocab: i64) -> serde_json::Value {
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
        Layout::Llama => json!({
            "model_type": "llama",
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
            "mlp_bias": true,
            "attention_dropout": a.dropout,
        }),
    };
    let mut config = common;
    let (Some(c), Some(s)) = (config.as_object_mut(), specific.as_object()) else { unreachable!("JSON objects") };
    c.extend(s.clone());
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
    let mut card = format!(
        "---\nlibrary_name: transformers\ntags: [ablate]\n---\n# {run_id}\n\nTrained by ablate ({source}); exported by \
         `ablate export` in Hugging Face's {} layout (`{}`).\n\n",
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
    card.push_str(
        "```python\nfrom transformers import AutoModelForCausalLM, PreTrainedTokenizerFast\nmodel = \
         AutoModelForCausalLM.from_pretrained(\"DIR\")\ntokenizer = PreTrainedTokenizerFast(tokenizer_file=\"DIR/tokenizer.json\")\n```\n",
    );
    crate::files::write_atomically(&dir.join("README.md"), card.as_bytes())
}
