//! The other direction of [`super::export`]: a Hugging Face decoder directory (`config.json`,
//! `model.safetensors`, optionally `tokenizer.json`) in the GPT-2, OPT, Llama, Mistral or Qwen3 layout — as `ablate export`
//! or `transformers`' `save_pretrained` writes it — read as an ablate decoder. `ablate import` writes the
//! recipe whose transformer section is the checkpoint's model; `train.init_from` starts a run from its
//! weights. Both directions walk the same correspondences (`export::links`), so load → export gives back
//! every tensor bit for bit (`tests/interop.rs`).
//!
//! Llama's `mlp_bias` is `transformer.ffn_bias`; Mistral and Qwen3 have none. Mistral's `sliding_window` and
//! Qwen3's per-layer `layer_types` are ablate's causal windows (`pattern.window`, `layer_patterns`), one
//! narrower: `transformers` counts the query itself. Qwen3's per-head `q_norm`/`k_norm` are ablate's QK-norm.
//! OPT's position table keeps two rows before position 0 that only padded positions read; ablate has none,
//! so they are not kept (exported as zeros).
//!
//! A checkpoint whose config sets something ablate's decoder does not compute (GPT-2's tanh-approximated
//! GELU, a layer-dependent score scale, RoPE scaling, another norm ε) is refused in one line naming the key.
use anyhow::{bail, Context, Result};
use serde_json::{json, Value};
use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use tch::{nn, Device, Kind, Tensor};

use super::export::{hf_config, links, Layout, Op};
use crate::recipe::Config;

/// A Hugging Face decoder directory: its layout and its `config.json` with the layout's defaults filled in
/// for the keys it leaves out.
pub struct HfCheckpoint {
    pub dir: PathBuf,
    pub layout: Layout,
    pub config: serde_json::Map<String, Value>,
}

/// `transformers`' defaults (its config classes', 5.25.0) for the keys a saved config may leave out.
fn class_defaults(layout: Layout) -> Value {
    match layout {
        Layout::Gpt2 => json!({
            "n_inner": null, "activation_function": "gelu_new", "layer_norm_epsilon": 1e-5,
            "scale_attn_weights": true, "scale_attn_by_inverse_layer_idx": false, "tie_word_embeddings": true,
            "add_cross_attention": false,
        }),
        Layout::Opt => json!({
            "do_layer_norm_before": true, "_remove_final_layer_norm": false, "word_embed_proj_dim": null,
            "activation_function": "relu", "enable_bias": true, "layer_norm_elementwise_affine": true,
            "tie_word_embeddings": true,
        }),
        Layout::Llama => json!({
            "num_key_value_heads": null, "head_dim": null, "hidden_act": "silu", "rms_norm_eps": 1e-6,
            "tie_word_embeddings": false, "attention_bias": false, "mlp_bias": false, "rope_scaling": null,
        }),
        // Mistral's and Qwen3's configs have no mlp_bias (nor Mistral an attention_bias): they have no biases.
        Layout::Mistral => json!({
            "num_key_value_heads": 8, "head_dim": null, "hidden_act": "silu", "rms_norm_eps": 1e-6,
            "tie_word_embeddings": false, "attention_bias": false, "mlp_bias": false, "rope_scaling": null,
            "sliding_window": 4096,
        }),
        Layout::Qwen3 => json!({
            "num_key_value_heads": 32, "head_dim": 128, "hidden_act": "silu", "rms_norm_eps": 1e-6,
            "tie_word_embeddings": false, "attention_bias": false, "mlp_bias": false, "rope_scaling": null,
            "use_sliding_window": false, "sliding_window": 4096, "max_window_layers": 28, "layer_types": null,
        }),
        Layout::Bert | Layout::Vit | Layout::Swin | Layout::Davit | Layout::ImageGpt => json!({}),
    }
}

/// Reads `dir/config.json`: a decoder in one of the layouts, or one line saying why not.
pub fn read(dir: &Path) -> Result<HfCheckpoint> {
    let path = dir.join("config.json");
    let text = std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
    let value: Value = serde_json::from_str(&text).with_context(|| format!("{} is not JSON", path.display()))?;
    let Value::Object(mut config) = value else { bail!("{} is not a JSON object", path.display()) };
    let model_type = config.get("model_type").and_then(Value::as_str).unwrap_or("(none)").to_string();
    let layout = Layout::parse(&model_type).map_err(|_| {
        anyhow::anyhow!(
            "{}: model_type `{model_type}` has no ablate reading: expected one of {}",
            path.display(),
            Layout::DECODERS.map(Layout::name).join(", ")
        )
    })?;
    if layout.kind() != crate::recipe::Kind::Lm {
        bail!(
            "{}: model_type `{model_type}`: ablate imports decoders ({})",
            path.display(),
            Layout::DECODERS.map(Layout::name).join(", ")
        );
    }
    if let Value::Object(defaults) = class_defaults(layout) {
        for (k, v) in defaults {
            config.entry(k).or_insert(v);
        }
    }
    // The keys whose `null` means another key's value.
    let get = |c: &serde_json::Map<String, Value>, k: &str| c.get(k).cloned().unwrap_or(Value::Null);
    let fill = |c: &mut serde_json::Map<String, Value>, k: &str, v: Value| {
        if c.get(k).is_none_or(Value::is_null) {
            c.insert(k.into(), v);
        }
    };
    match layout {
        Layout::Gpt2 => {
            let inner = json!(4 * get(&config, "n_embd").as_i64().unwrap_or(0));
            fill(&mut config, "n_inner", inner);
        }
        Layout::Opt => {
            let d = get(&config, "hidden_size");
            fill(&mut config, "word_embed_proj_dim", d);
        }
        Layout::Llama | Layout::Mistral | Layout::Qwen3 => {
            let heads = get(&config, "num_attention_heads");
            fill(&mut config, "num_key_value_heads", heads);
            let (d, h) = (get(&config, "hidden_size").as_i64(), get(&config, "num_attention_heads").as_i64());
            fill(&mut config, "head_dim", json!(d.zip(h).map(|(d, h)| d / h.max(1))));
            // Older configs give RoPE's θ and scaling at the top level.
            if config.get("rope_parameters").is_none_or(Value::is_null) {
                let theta = config.get("rope_theta").cloned().unwrap_or(json!(10000.0));
                let kind = match get(&config, "rope_scaling") {
                    Value::Null => json!("default"),
                    scaling => scaling.get("rope_type").or_else(|| scaling.get("type")).cloned().unwrap_or(json!("?")),
                };
                config.insert("rope_parameters".into(), json!({"rope_type": kind, "rope_theta": theta}));
            }
            // Qwen3Config's own rule: no window unless use_sliding_window, and layers from max_window_layers on
            // slide when the layer types are not given.
            if layout == Layout::Qwen3 {
                if get(&config, "use_sliding_window") != json!(true) {
                    config.insert("sliding_window".into(), Value::Null);
                }
                let (sliding, from) = (!get(&config, "sliding_window").is_null(), get(&config, "max_window_layers"));
                let layers = get(&config, "num_hidden_layers").as_i64().unwrap_or(0);
                let types: Vec<&str> = (0..layers)
                    .map(|i| match sliding && from.as_i64().is_some_and(|m| i >= m) {
                        true => "sliding_attention",
                        false => "full_attention",
                    })
                    .collect();
                fill(&mut config, "layer_types", json!(types));
            }
        }
        Layout::Bert | Layout::Vit | Layout::Swin | Layout::Davit | Layout::ImageGpt => {}
    }
    Ok(HfCheckpoint { dir: dir.to_path_buf(), layout, config })
}

impl HfCheckpoint {
    fn key(&self, k: &str) -> Value {
        self.config.get(k).cloned().unwrap_or(Value::Null)
    }

    fn int(&self, k: &str) -> Result<i64> {
        self.key(k).as_i64().with_context(|| format!("{}: config.json's {k} is not an integer", self.dir.display()))
    }

    fn number(&self, k: &str) -> f64 {
        self.key(k).as_f64().unwrap_or(0.0)
    }

    pub fn vocab(&self) -> Result<i64> {
        self.int("vocab_size")
    }

    /// One line refusing `key`'s value: what ablate computes instead.
    fn refuse(&self, key: &str, why: &str) -> anyhow::Error {
        anyhow::anyhow!(
            "{}: config.json's {key}={}: {why}, so ablate cannot read this {} checkpoint exactly",
            self.dir.display(),
            self.key(key),
            self.layout.name()
        )
    }

    /// ablate's name for the FFN nonlinearity `config.json` gives under `key` (a gated FFN's for `gated`),
    /// or the one line refusing it.
    fn activation(&self, key: &str, gated: bool) -> Result<&'static str> {
        Ok(match (self.key(key).as_str().unwrap_or(""), gated) {
            ("gelu", false) => "gelu",
            ("relu", false) => "relu",
            ("relu2", false) => "relu2",
            ("silu" | "swish", true) => "swiglu",
            ("gelu", true) => "geglu",
            (_, false) => {
                return Err(self.refuse(key, "ablate's FFN nonlinearities are exact GELU, ReLU and squared ReLU"))
            }
            (_, true) => return Err(self.refuse(key, "ablate's gated FFNs are SwiGLU (silu) and GeGLU (gelu)")),
        })
    }

    /// The recipe's transformer section that builds this checkpoint's model (checked by [`check_matches`]:
    /// the section's own config must be the checkpoint's).
    pub fn transformer_section(&self) -> Result<Value> {
        Ok(match self.layout {
            Layout::Gpt2 => {
                let act = self.activation("activation_function", false)?;
                json!({
                    "d_model": self.int("n_embd")?, "layers": self.int("n_layer")?, "heads": self.int("n_head")?,
                    "ffn_hidden": self.int("n_inner")?, "block_size": self.int("n_positions")?,
                    "activation": act, "pre_ln": true, "final_norm": true, "norm": "layer_norm", "pe": "learned",
                    "tie_embeddings": self.key("tie_word_embeddings"),
                    "dropout": self.number("resid_pdrop"),
                    "attention": {
                        "bias": true, "dropout": self.number("attn_pdrop"),
                        "scale": if self.key("scale_attn_weights") == json!(false) { json!("none") } else { json!("sqrt_dk") },
                    },
                })
            }
            Layout::Opt => {
                let act = self.activation("activation_function", false)?;
                let pre_ln = self.key("do_layer_norm_before") != json!(false);
                let final_norm = pre_ln && self.key("_remove_final_layer_norm") != json!(true);
                json!({
                    "d_model": self.int("hidden_size")?, "layers": self.int("num_hidden_layers")?,
                    "heads": self.int("num_attention_heads")?, "ffn_hidden": self.int("ffn_dim")?,
                    "block_size": self.int("max_position_embeddings")?, "activation": act, "pre_ln": pre_ln,
                    "final_norm": final_norm, "norm": "layer_norm", "pe": "learned",
                    "tie_embeddings": self.key("tie_word_embeddings"), "dropout": self.number("dropout"),
                    "attention": {"bias": true, "dropout": self.number("attention_dropout")},
                })
            }
            Layout::Bert | Layout::Vit | Layout::Swin | Layout::Davit | Layout::ImageGpt => {
                bail!("{}: ablate imports decoders", self.dir.display())
            }
            Layout::Llama | Layout::Mistral | Layout::Qwen3 => {
                let act = self.activation("hidden_act", true)?;
                let rope = self.key("rope_parameters");
                let mut section = json!({
                    "d_model": self.int("hidden_size")?, "layers": self.int("num_hidden_layers")?,
                    "heads": self.int("num_attention_heads")?, "ffn_hidden": self.int("intermediate_size")?,
                    "block_size": self.int("max_position_embeddings")?, "activation": act, "pre_ln": true,
                    "final_norm": true, "norm": "rms_norm", "pe": "rope", "head_dim": self.int("head_dim")?,
                    "position": {"rope_theta": rope.get("rope_theta").and_then(Value::as_f64).unwrap_or(10000.0)},
                    "tie_embeddings": self.key("tie_word_embeddings"), "dropout": 0.0,
                    "ffn_bias": self.key("mlp_bias"),
                    "attention": {
                        "bias": self.key("attention_bias"), "dropout": self.number("attention_dropout"),
                        "kv_heads": self.int("num_key_value_heads")?,
                    },
                });
                let attention = &mut section["attention"];
                if self.layout == Layout::Qwen3 {
                    attention["qk_norm"] = json!("rms_norm");
                }
                self.windows_into(attention)?;
                section
            }
        })
    }

    /// Mistral's one sliding window, or Qwen3's per layer, as ablate's causal windows in `attention`
    /// (`transformers`' width counts the query, ablate's only its neighbours).
    fn windows_into(&self, attention: &mut Value) -> Result<()> {
        let width = match self.key("sliding_window") {
            Value::Null => return Ok(()),
            w => w
                .as_i64()
                .filter(|w| *w >= 1)
                .ok_or_else(|| self.refuse("sliding_window", "a window is a positive width"))?,
        };
        let window = json!({"window": width - 1});
        match self.layout {
            Layout::Qwen3 => {
                let types = self.key("layer_types");
                let types: Vec<&str> = types.as_array().into_iter().flatten().filter_map(Value::as_str).collect();
                if types.iter().any(|t| !matches!(*t, "sliding_attention" | "full_attention")) {
                    return Err(self.refuse("layer_types", "ablate's layers attend fully or in a sliding window"));
                }
                if types.iter().all(|t| *t == "sliding_attention") {
                    attention["pattern"] = window;
                } else if types.contains(&"sliding_attention") {
                    let per_layer: Vec<Value> = types
                        .iter()
                        .map(|t| if *t == "sliding_attention" { window.clone() } else { json!({}) })
                        .collect();
                    attention["layer_patterns"] = json!(per_layer);
                }
            }
            _ => attention["pattern"] = window,
        }
        Ok(())
    }

    /// Whether `cfg`'s decoder over `vocab` tokens is this checkpoint's model: its layout expresses it, and
    /// the config ablate would write for it agrees with `config.json` on every key that shapes the function.
    pub fn check_matches(&self, cfg: &Config, vocab: i64) -> Result<()> {
        let dir = self.dir.display();
        if let Some(why) = super::export::refusal(self.layout, cfg) {
            bail!("{dir} is a {} checkpoint, and this run's {why}", self.layout.name());
        }
        // What ablate's decoder never computes, whatever the recipe says.
        let neutral: &[(&str, Value, &str)] = match self.layout {
            Layout::Gpt2 => &[
                ("scale_attn_by_inverse_layer_idx", json!(false), "ablate does not scale scores by the layer index"),
                ("add_cross_attention", json!(false), "ablate's decoder has no cross-attention"),
                ("layer_norm_epsilon", json!(1e-5), "ablate's LayerNorm ε is 1e-5"),
            ],
            Layout::Opt => &[
                ("enable_bias", json!(true), "ablate's OPT layout has biases"),
                ("layer_norm_elementwise_affine", json!(true), "ablate's LayerNorm has a gain and a bias"),
            ],
            Layout::Llama | Layout::Mistral | Layout::Qwen3 => {
                &[("rms_norm_eps", json!(1e-5), "ablate's RMSNorm ε is 1e-5")]
            }
            Layout::Bert | Layout::Vit | Layout::Swin | Layout::Davit | Layout::ImageGpt => &[],
        };
        for (key, value, why) in neutral {
            if !same(&self.key(key), value) {
                return Err(self.refuse(key, why));
            }
        }
        let t = cfg.transformer_spec();
        let ours = hf_config(self.layout, &t, vocab);
        // Dropout shapes training, not the function; the rest is bookkeeping.
        let unshaping = [
            "architectures",
            "torch_dtype",
            "bos_token_id",
            "eos_token_id",
            "pad_token_id",
            "n_ctx",
            "resid_pdrop",
            "embd_pdrop",
            "attn_pdrop",
            "dropout",
            "attention_dropout",
        ];
        let ours = ours.as_object().expect("a JSON object");
        for (key, value) in ours.iter().filter(|(k, _)| !unshaping.contains(&k.as_str())) {
            let theirs = self.key(key);
            let (theirs, value) = match key.as_str() {
                "rope_parameters" => (
                    json!([theirs["rope_type"], theirs["rope_theta"]]),
                    json!([value["rope_type"], value["rope_theta"]]),
                ),
                _ => (theirs, value.clone()),
            };
            if !same(&theirs, &value) {
                bail!("{dir}: config.json's {key} is {theirs}, this run's model has {value}");
            }
        }
        Ok(())
    }

    /// Copies the checkpoint's weights into `vs`, which holds `cfg`'s decoder (checked first with
    /// [`HfCheckpoint::check_matches`]). Every variable must be found with its shape, and every tensor of the
    /// checkpoint placed (but the causal-mask and rotary buffers old checkpoints store).
    pub fn load_into(&self, vs: &nn::VarStore, cfg: &Config) -> Result<()> {
        let path = self.dir.join("model.safetensors");
        let mut stored: HashMap<String, Tensor> = Tensor::read_safetensors(&path)
            .with_context(|| format!("reading {}", path.display()))?
            .into_iter()
            .filter(|(name, _)| !is_buffer(name))
            .collect();
        let t = cfg.transformer_spec();
        let mut variables: BTreeMap<String, Tensor> = vs.variables().into_iter().collect();
        tch::no_grad(|| -> Result<()> {
            for link in links(self.layout, &t) {
                let parts: Vec<Option<Tensor>> = link.theirs.iter().map(|n| stored.remove(n)).collect();
                let value = match (parts.iter().all(Option::is_some), &link.zero_if_absent) {
                    (true, _) => {
                        let parts: Vec<Tensor> = parts
                            .into_iter()
                            .flatten()
                            .map(|p| p.to_device(Device::Cpu).to_kind(Kind::Float))
                            .collect();
                        match link.op {
                            Op::Same => parts[0].shallow_clone(),
                            Op::Transpose => parts[0].tr().contiguous(),
                            Op::Stack => Tensor::cat(&parts, 0),
                            Op::Offset(rows) => parts[0].narrow(0, rows, parts[0].size()[0] - rows),
                            Op::Batch => parts[0].squeeze_dim(0),
                            Op::Copies => parts[0].shallow_clone(),
                            // Only ImageGPT's head, whose layout is never read (`read` takes decoders).
                            Op::DropLastRow => bail!("{}: a head without its last row is not read", path.display()),
                        }
                    }
                    (false, Some(shape)) if parts.iter().all(Option::is_none) => {
                        Tensor::zeros(shape.as_slice(), (Kind::Float, Device::Cpu))
                    }
                    _ => bail!("{} has no `{}`", path.display(), link.theirs.join("`, `")),
                };
                let Some(mut var) = variables.remove(&link.ours) else {
                    // ablate was built without this bias; the checkpoint's must then be zeros.
                    if link.zero_if_absent.is_some() && value.abs().max().double_value(&[]) == 0.0 {
                        continue;
                    }
                    bail!("{}: `{}` has no place in this run's model", path.display(), link.theirs.join("`, `"));
                };
                if value.size() != var.size() {
                    bail!(
                        "{}: `{}` is {:?}, this run's {} needs {:?}",
                        path.display(),
                        link.theirs[0],
                        value.size(),
                        link.ours,
                        var.size()
                    );
                }
                var.copy_(&value);
            }
            Ok(())
        })?;
        if let Some(name) = variables.keys().next() {
            bail!("{}: nothing in it sets this run's `{name}`", path.display());
        }
        let mut left: Vec<&String> = stored.keys().collect();
        left.sort();
        if let Some(name) = left.first() {
            bail!("{}: `{name}` has no place in this run's model", path.display());
        }
        Ok(())
    }

    /// Whether the checkpoint's `tokenizer.json` (when it has one) gives every token the id `tokenizer`
    /// gives it: the embedding rows belong to the checkpoint's ids.
    pub fn check_vocabulary(&self, tokenizer: &crate::data::tokenize::TextTokenizer) -> Result<()> {
        let path = self.dir.join("tokenizer.json");
        if !path.exists() {
            return Ok(());
        }
        let theirs = tokenizers::Tokenizer::from_file(&path)
            .map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?
            .get_vocab(true);
        let ours: HashMap<String, u32> = match tokenizer.to_saved()? {
            ("char", characters) => characters.chars().enumerate().map(|(i, c)| (c.to_string(), i as u32)).collect(),
            (_, json) => tokenizers::Tokenizer::from_bytes(json.as_bytes())
                .map_err(|e| anyhow::anyhow!("the run's tokenizer: {e}"))?
                .get_vocab(true),
        };
        let mut tokens: Vec<(&String, &u32)> = theirs.iter().collect();
        tokens.sort_by_key(|(_, id)| **id);
        for (token, id) in tokens {
            if ours.get(token) != Some(id) {
                let given = ours.get(token).map_or("none".to_string(), |i| i.to_string());
                bail!(
                    "{}: the checkpoint's token {token:?} is id {id}, this run's data gives it {given}: train on the vocabulary the checkpoint was trained with",
                    path.display()
                );
            }
        }
        if ours.len() != theirs.len() {
            bail!("{}: {} tokens, this run's data has {}", path.display(), theirs.len(), ours.len());
        }
        Ok(())
    }
}

/// The buffers some checkpoints store beside their parameters: GPT-2's causal masks, Llama's rotary
/// frequencies. Recomputed by every implementation, they are not weights.
fn is_buffer(name: &str) -> bool {
    name.ends_with(".attn.bias") && name.starts_with("transformer.h.")
        || name.ends_with(".attn.masked_bias")
        || name.ends_with("rotary_emb.inv_freq")
}

/// JSON values equal, numbers by value (`1e-05` and `1e-5`, `10000` and `10000.0`).
fn same(a: &Value, b: &Value) -> bool {
    match (a.as_f64(), b.as_f64()) {
        (Some(x), Some(y)) => x == y || (x - y).abs() <= 1e-12 * x.abs().max(y.abs()),
        _ => a == b,
    }
}

/// A recipe (YAML) that builds the checkpoint's model and starts from its weights: `ablate import`'s output.
pub fn recipe(checkpoint: &HfCheckpoint, dir_as_written: &str) -> Result<String> {
    let section = checkpoint.transformer_section()?;
    let recipe = json!({"kind": "lm", "transformer": section, "train": {"init_from": dir_as_written}});
    Ok(format!(
        "# Written by `ablate import {dir_as_written}`: the transformer section is the {} checkpoint's model, and\n\
         # train.init_from starts every run from its weights. The data must give the checkpoint's token ids\n\
         # ({} tokens{}): set the data section to the corpus and tokenizer it was trained with.\n{}",
        checkpoint.layout.name(),
        checkpoint.vocab()?,
        if checkpoint.dir.join("tokenizer.json").exists() { ", checked against its tokenizer.json" } else { "" },
        serde_yaml::to_string(&recipe)?
    ))
}
