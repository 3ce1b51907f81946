//! The knob matrix's rows: every knob of the Transformer section, each set away from its default. The knob
//! test (`tests/knobs.rs`) holds every kind to them; the interop test (`tests/interop.rs`) exports every row
//! a Hugging Face layout accepts, so a new knob enters both by its row here.
/// (key, value, settings both models share): every knob of the Transformer section, each set away from its
/// default. `None` for the value means "the kind's default, flipped" (a boolean).
pub const KNOBS: &[(&str, Option<&str>, &str)] = &[
    ("transformer.d_model", Some("48"), ""),
    ("transformer.layers", Some("3"), ""),
    ("transformer.heads", Some("8"), ""),
    ("transformer.head_dim", Some("12"), ""),
    ("transformer.ffn_hidden", Some("40"), ""),
    ("transformer.activation", None, ""),
    ("transformer.pre_ln", None, ""),
    ("transformer.final_norm", None, ""),
    ("transformer.norm", Some("rms_norm"), ""),
    ("transformer.norm", Some("batch_norm"), ""),
    ("transformer.norm", Some("none"), ""),
    ("transformer.residual", Some("false"), ""),
    ("transformer.dropout", Some("0.3"), ""),
    ("transformer.pe", Some("none"), ""),
    ("transformer.pe", Some("sinusoidal"), ""),
    ("transformer.pe", Some("learned"), ""),
    ("transformer.pe", Some("shaw"), ""),
    ("transformer.pe", Some("t5"), ""),
    ("transformer.pe", Some("alibi"), ""),
    ("transformer.pe", Some("rope"), ""),
    ("transformer.pe", Some("bias_2d"), ""),
    ("transformer.pe", Some("conv"), ""),
    ("transformer.position.at", Some("every_layer"), "transformer.pe: learned"),
    ("transformer.position.at", Some("qk"), "transformer.pe: learned"),
    ("transformer.position.combine", Some("concat"), "transformer.pe: learned"),
    ("transformer.position.concat_dim", Some("4"), "transformer.pe: learned, transformer.position.combine: concat"),
    ("transformer.position.rope_theta", Some("100.0"), "transformer.pe: rope"),
    ("transformer.position.rope_fraction", Some("0.5"), "transformer.pe: rope"),
    ("transformer.position.shaw_max_distance", Some("2"), "transformer.pe: shaw"),
    ("transformer.position.t5_buckets", Some("8"), "transformer.pe: t5"),
    // With 8 buckets the offsets of a 16-token block reach the log-spaced buckets that max_distance shapes.
    ("transformer.position.t5_max_distance", Some("8"), "transformer.pe: t5, transformer.position.t5_buckets: 8"),
    ("transformer.attention.kv_heads", Some("1"), ""),
    ("transformer.attention.qk_dim", Some("4"), ""),
    ("transformer.attention.scoring", Some("additive"), ""),
    ("transformer.attention.scale", Some("none"), ""),
    ("transformer.attention.scale", Some("0.05"), ""),
    ("transformer.attention.implementation", Some("explicit"), ""),
    ("transformer.attention.implementation", Some("sparse"), "transformer.attention.pattern.window: 2"),
    ("transformer.attention.dropout", Some("0.3"), ""),
    ("transformer.attention.bias", Some("false"), ""),
    ("transformer.attention.pattern.window", Some("2"), ""),
    ("transformer.attention.pattern.dilation", Some("2"), "transformer.attention.pattern.window: 2"),
    ("transformer.attention.pattern.global_every", Some("3"), ""),
    ("transformer.attention.pattern.global_tokens", Some("2"), ""),
    ("transformer.attention.layer_patterns", Some("[{window: 2}, {}]"), ""),
    ("transformer.block_size", Some("24"), ""),
    ("transformer.tie_embeddings", None, ""),
    ("transformer.scale_embeddings", Some("true"), ""),
    ("transformer.activation", Some("relu2"), ""),
    ("transformer.activation", Some("swiglu"), ""),
    ("transformer.activation", Some("geglu"), ""),
    ("transformer.attention.qk_norm", Some("rms_norm"), ""),
    ("transformer.attention.qk_norm", Some("layer_norm"), ""),
    // A small cap, so that the test's random weights reach it.
    ("transformer.attention.softcap", Some("0.5"), ""),
    ("transformer.logit_softcap", Some("0.5"), ""),
    ("transformer.output_init", Some("zero"), ""),
    ("transformer.parallel", Some("true"), "transformer.pre_ln: true"),
    ("transformer.value_residual", Some("true"), ""),
    ("transformer.value_embeddings", Some("1"), ""),
    ("transformer.unet_skips", Some("true"), ""),
    ("transformer.attention.pattern.window_schedule", Some("[[4, 1]]"), "transformer.attention.pattern.window: 2"),
    ("transformer.attention.output_gate", Some("headwise"), ""),
    ("transformer.attention.output_gate", Some("elementwise"), ""),
    ("transformer.attention.differential", Some("true"), ""),
    ("transformer.attention.sink", Some("learned"), ""),
    ("transformer.ffn_bias", None, ""),
    // muP: with the same weights, the readout multiplier (base/width) and 1/d_head attention scores act.
    ("transformer.parametrisation", Some("mup"), ""),
    ("transformer.mup_base_width", Some("16"), "transformer.parametrisation: mup"),
];

/// The recipe `base` with one variant that sets `settings` (dotted key, YAML value); `base` itself without.
pub fn with_variant(base: &str, settings: &[(String, String)]) -> String {
    let mut text = base.to_string();
    if !settings.is_empty() {
        let body: Vec<String> = settings.iter().map(|(k, v)| format!("{k}: {v}")).collect();
        text.push_str(&format!("variants:\n  - {{{}}}\n", body.join(", ")));
    }
    text
}

/// A row's value: as written, or the kind's default flipped.
pub fn knob_value(key: &str, value: Option<&str>, defaults: &ablate::recipe::Config) -> String {
    if let Some(v) = value {
        return v.to_string();
    }
    let t = &defaults.transformer;
    match key {
        "transformer.activation" => {
            if t.activation == ablate::recipe::Activation::Relu { "gelu" } else { "relu" }.to_string()
        }
        "transformer.pre_ln" => (!t.pre_ln).to_string(),
        "transformer.final_norm" => (!defaults.final_norm()).to_string(),
        "transformer.tie_embeddings" => (!t.tie_embeddings).to_string(),
        "transformer.ffn_bias" => (!t.ffn_bias).to_string(),
        other => panic!("no flip for {other}"),
    }
}

/// The (shared) context settings as (key, value) pairs.
pub fn context(extra: &str) -> Vec<(String, String)> {
    extra
        .split_terminator(", ")
        .filter(|s| !s.is_empty())
        .map(|s| {
            let (k, v) = s.split_once(": ").unwrap();
            (k.to_string(), v.to_string())
        })
        .collect()
}
