//! The key reference, generated from the schema itself: every dotted key of a run's config with its type
//! or allowed values, its default for each kind, the kinds that read it, and its doc comment. `ablate keys`
//! prints [`markdown`]; `docs/keys.md` is that output, and a test fails when the two differ, so the
//! reference cannot drift from the code.
//!
//! The structs derive a JSON Schema (schemars, honouring their serde attributes); defaults come from
//! [`Config::defaults`] and "read by" from [`super::reads::unread`], the same functions loading uses.
use serde_json::Value;

use super::reads::unread;
use super::schema::{Config, Kind};

/// One dotted key of the reference.
#[derive(Debug, Clone, PartialEq)]
pub struct KeyDoc {
    /// `transformer.attention.heads`; list items are `key[].field`.
    pub key: String,
    /// `integer`, `number or null`, `` `dot` | `additive` ``, `list of integer`, …
    pub kind_of_value: String,
    /// The doc comment (of the field, else of its type), with any documented values appended.
    pub doc: String,
    /// Default per kind that reads the key, or per kind that has it where none reads it at its defaults
    /// (JSON text; `null`: derived from other keys, see the doc).
    pub defaults: Vec<(Kind, String)>,
    /// Kinds whose default config reads the key.
    pub read_by: Vec<Kind>,
    /// Why no kind reads it at its defaults (a key that only acts with another setting), if none does: the
    /// reason given to the first kind whose config has the key.
    pub condition: Option<String>,
}

/// The config schema with every sub-schema inlined, as JSON.
fn config_schema() -> Value {
    let settings = schemars::generate::SchemaSettings::draft2020_12().with(|s| s.inline_subschemas = true);
    settings.into_generator().into_root_schema_for::<Config>().to_value()
}

/// Every key of the schema, sections and keys in alphabetical order.
pub fn reference() -> Vec<KeyDoc> {
    let schema = config_schema();
    let mut leaves = Vec::new();
    collect("", &schema, &mut leaves);
    let defaults: Vec<(Kind, Config, Value)> = Kind::ALL
        .iter()
        .map(|&k| {
            let cfg = Config::defaults(k);
            let value = serde_json::to_value(&cfg).expect("a config serialises");
            (k, cfg, value)
        })
        .collect();
    leaves
        .into_iter()
        .map(|(key, kind_of_value, doc)| {
            let mut read_by = Vec::new();
            let mut reasons = Vec::new();
            let mut values = Vec::new();
            let mut unread_values = Vec::new();
            let lookup = key.split("[]").next().unwrap_or(&key);
            for (kind, cfg, value) in &defaults {
                match unread(cfg, lookup) {
                    None => {
                        read_by.push(*kind);
                        if !key.contains("[]") {
                            values.push((*kind, default_text(value, &key)));
                        }
                    }
                    // The reason of a kind whose config has the key at all (its section exists).
                    Some(reason) if default_text(value, lookup) != "missing" => {
                        reasons.push(reason);
                        unread_values.push((*kind, default_text(value, &key)));
                    }
                    Some(_) => {}
                }
            }
            let condition = read_by.is_empty().then(|| reasons.first().cloned()).flatten();
            if read_by.is_empty() && !key.contains("[]") {
                // A key that acts only once another is set still has a default: that of the kinds with it.
                values = unread_values;
            }
            KeyDoc { key, kind_of_value, doc, defaults: values, read_by, condition }
        })
        .collect()
}

/// One refusal of the reference: a key (or one value of it) that some kinds read and others refuse.
#[derive(Debug, Clone, PartialEq)]
pub struct Refusal {
    /// `transformer.pe`; with `value`, only that value is refused (`bias_2d`).
    pub key: String,
    pub value: Option<String>,
    /// The kinds that refuse it, in `Kind::ALL`'s order.
    pub kinds: Vec<Kind>,
    /// The first of those kinds' one-line reason, as the recipe's refusal gives it.
    pub why: String,
}

/// The smallest recipe of `kind` that loads (BERT and the encoder–decoder need a tokenizer with special
/// tokens and its size), setting the dotted `key` to `value` (YAML).
fn minimal_recipe(kind: Kind, key: &str, value: &str) -> String {
    use serde_yaml::{Mapping, Value as Yaml};
    let mut root = Mapping::new();
    root.insert("kind".into(), kind.name().into());
    if matches!(kind, Kind::Bert | Kind::Translate) {
        let tokenizer = if kind == Kind::Bert { "wordpiece" } else { "bpe" };
        let mut data = Mapping::new();
        data.insert("tokenizer".into(), tokenizer.into());
        data.insert("vocab_size".into(), 300.into());
        root.insert("data".into(), Yaml::Mapping(data));
    }
    let parts: Vec<&str> = key.split('.').collect();
    let mut target = &mut root;
    for part in &parts[..parts.len() - 1] {
        let entry = target.entry((*part).into()).or_insert_with(|| Yaml::Mapping(Mapping::new()));
        target = entry.as_mapping_mut().expect("a section");
    }
    let value: Yaml = serde_yaml::from_str(value).unwrap_or_else(|_| value.into());
    target.insert(parts[parts.len() - 1].into(), value);
    serde_yaml::to_string(&Yaml::Mapping(root)).expect("YAML serialises")
}

/// Every refusal of a kind. A key: [`unread`] (the function loading asks) refuses it at a kind's defaults
/// while another kind reads it there; a whole section when the kind refuses the section itself. A value of an
/// enum key: a recipe of the kind setting it is refused (by `unread` or by validation) while a recipe of
/// another kind setting it loads. Keys that no kind reads at its defaults act once another key is set: those
/// are conditions, documented in the key reference, not refusals. Rows with the same kinds and reason are one.
pub fn refusals() -> Vec<Refusal> {
    let schema = config_schema();
    let mut leaves = Vec::new();
    collect("", &schema, &mut leaves);
    let defaults: Vec<(Kind, Config, Value)> = Kind::ALL
        .iter()
        .map(|&k| {
            let cfg = Config::defaults(k);
            let json = serde_json::to_value(&cfg).expect("a config serialises");
            (k, cfg, json)
        })
        .collect();
    let mut rows: Vec<(String, Option<String>, Kind, String)> = Vec::new();
    let section_refused = |cfg: &Config, key: &str| unread(cfg, key.split('.').next().unwrap_or(key));
    let mut sections_done = Vec::new();
    for (key, kind_of_value, _) in leaves.iter().filter(|(k, _, _)| !k.contains("[]") && k != "kind") {
        // Every kind whose config has the key, with its defaults and why it does not read the key there.
        let at_defaults: Vec<(Kind, &Config, Option<String>)> = defaults
            .iter()
            .filter(|(_, _, json)| default_text(json, key) != "missing")
            .map(|(kind, cfg, _)| (*kind, cfg, unread(cfg, key)))
            .collect();
        if at_defaults.iter().all(|(_, _, why)| why.is_some()) {
            continue;
        }
        for (kind, cfg, why) in &at_defaults {
            let Some(why) = why else { continue };
            match section_refused(cfg, key) {
                Some(section_why) => {
                    let section = key.split('.').next().unwrap_or(key).to_string();
                    if !sections_done.contains(&(section.clone(), *kind)) {
                        sections_done.push((section.clone(), *kind));
                        rows.push((section, None, *kind, section_why));
                    }
                }
                None => rows.push((key.clone(), None, *kind, why.clone())),
            }
        }
        // An enum's values, each set by a recipe of every kind that reads the key at its defaults.
        let values: Vec<&str> = kind_of_value.split(" | ").map(|v| v.trim_matches('`')).collect();
        if !kind_of_value.starts_with('`') || values.iter().any(|v| v.contains(' ')) {
            continue;
        }
        for value in values {
            let outcomes: Vec<(Kind, Option<String>)> = at_defaults
                .iter()
                .filter(|(_, _, why)| why.is_none())
                .map(|(kind, _, _)| {
                    let text = minimal_recipe(*kind, key, value);
                    // The reason after the location and the key (`r.yaml:3: transformer.pe: …`); an error
                    // about another key (a tokenizer's size) is no refusal of this value.
                    let refused = super::parse(&text, "r.yaml", "r", false).err().and_then(|e| {
                        let line = e.to_string();
                        let (_, after) = line.split_once(": ")?;
                        after.strip_prefix(&format!("{key}: ")).map(str::to_string)
                    });
                    (*kind, refused)
                })
                .collect();
            if outcomes.iter().all(|(_, why)| why.is_some()) {
                continue;
            }
            for (kind, why) in outcomes {
                if let Some(why) = why {
                    rows.push((key.clone(), Some(value.to_string()), kind, why));
                }
            }
        }
    }
    let mut out: Vec<Refusal> = Vec::new();
    for (key, value, kind, why) in rows {
        match out.iter_mut().find(|r| r.key == key && r.value == value) {
            Some(r) => r.kinds.push(kind),
            None => out.push(Refusal { key, value, kinds: vec![kind], why }),
        }
    }
    out
}

/// The mechanisms researchers ablate after UDL's chapter, in order: the schema's fields marked
/// `#[schemars(extend("x-after-udl" = N))]` (N their place), so a new one is marked where it is declared.
/// docs/knobs.md's mechanism table lists these keys with their values and the first sentence of their doc
/// ([`mechanisms_markdown`]).
pub fn mechanisms_after_udl() -> Vec<String> {
    fn walk(prefix: &str, schema: &Value, out: &mut Vec<(i64, String)>) {
        let Some(properties) = schema.get("properties").and_then(Value::as_object) else { return };
        for (name, property) in properties {
            let key = if prefix.is_empty() { name.clone() } else { format!("{prefix}.{name}") };
            if let Some(place) = property.get("x-after-udl").and_then(Value::as_i64) {
                out.push((place, key.clone()));
            }
            walk(&key, without_null(property).0, out);
        }
    }
    let mut marked = Vec::new();
    walk("", &config_schema(), &mut marked);
    marked.sort();
    marked.into_iter().map(|(_, key)| key).collect()
}

/// docs/knobs.md's mechanism table: each key of [`mechanisms_after_udl`], its values and the first sentence
/// of its doc comment (the key reference's text, so the two cannot differ).
pub fn mechanisms_markdown() -> String {
    let all = reference();
    let mut out = String::from("| key | values | what it does |\n|---|---|---|\n");
    for key in mechanisms_after_udl() {
        let doc = all.iter().find(|d| d.key == key).unwrap_or_else(|| panic!("{key} is a key of the schema"));
        out.push_str(&format!("| `{key}` | {} | {} |\n", cell(&doc.kind_of_value), cell(first_sentence(&doc.doc))));
    }
    out
}

/// Text up to the first full stop that ends a sentence (not "et al." or "e.g.").
fn first_sentence(text: &str) -> &str {
    let mut from = 0;
    while let Some(at) = text[from..].find(". ") {
        let end = from + at;
        let word = text[..end].rsplit([' ', '(']).next().unwrap_or("");
        if !matches!(word, "al" | "e.g" | "i.e" | "cf" | "vs") {
            return &text[..=end];
        }
        from = end + 2;
    }
    text
}

/// The refusals as a Markdown table (the README's, between its `refusals` markers): one row per reason and
/// set of kinds, naming every key (or value) it refuses.
pub fn refusals_markdown() -> String {
    let mut rows: Vec<(Vec<String>, Vec<Kind>, String)> = Vec::new();
    for r in refusals() {
        let what = match &r.value {
            Some(v) => format!("`{}: {v}`", r.key),
            None if !r.key.contains('.') => format!("the whole `{}` section", r.key),
            None => format!("`{}`", r.key),
        };
        match rows.iter_mut().find(|(_, kinds, why)| *kinds == r.kinds && *why == r.why) {
            Some(row) => row.0.push(what),
            None => rows.push((vec![what], r.kinds, r.why)),
        }
    }
    let mut out = String::from("| refused | kinds | why (the refusal's line, for the first kind) |\n|---|---|---|\n");
    for (what, kinds, why) in rows {
        let kinds: Vec<&str> = kinds.iter().map(|k| k.name()).collect();
        out.push_str(&format!("| {} | {} | {} |\n", what.join(", "), kinds.join(", "), cell(&why)));
    }
    out
}

/// The value at a dotted key of a serialised config, as JSON text (`missing` where the kind's config has
/// no such section; `null` inside an optional setting that is unset, such as `train.budget`).
fn default_text(config: &Value, key: &str) -> String {
    let mut value = config;
    for part in key.split('.') {
        if value.is_null() {
            return "null".into();
        }
        match value.get(part) {
            Some(inner) => value = inner,
            None => return "missing".into(),
        }
    }
    value.to_string()
}

/// Walks an object schema: a leaf per scalar, enum or list key; nested objects (sections, optional
/// sections such as `data.images`) are walked into, and so are the items of a list of objects.
fn collect(prefix: &str, schema: &Value, out: &mut Vec<(String, String, String)>) {
    let Some(properties) = schema.get("properties").and_then(Value::as_object) else {
        return;
    };
    for (name, property) in properties {
        let key = if prefix.is_empty() { name.clone() } else { format!("{prefix}.{name}") };
        let (inner, nullable) = without_null(property);
        let doc = description(property).or_else(|| description(inner)).unwrap_or_default();
        if inner.get("properties").is_some() {
            collect(&key, inner, out);
            continue;
        }
        let items = inner.get("items");
        let mut what = match items {
            Some(items) if items.get("properties").is_some() => "list of mappings".to_string(),
            Some(items) => format!("list of {}", value_kind(without_null(items).0)),
            None => value_kind(inner),
        };
        if nullable {
            what.push_str(" or null");
        }
        let doc = with_values(&doc, inner);
        out.push((key.clone(), what, doc));
        if let Some(items) = items.filter(|i| i.get("properties").is_some()) {
            collect(&format!("{key}[]"), items, out);
        }
    }
}

/// An `Option`'s schema without its `null`: the inner schema, and whether null is allowed.
fn without_null(schema: &Value) -> (&Value, bool) {
    if let Some(any) = schema.get("anyOf").and_then(Value::as_array) {
        let others: Vec<&Value> = any.iter().filter(|s| s.get("type") != Some(&Value::from("null"))).collect();
        if others.len() == 1 && any.len() == 2 {
            return (others[0], true);
        }
    }
    let nullable =
        schema.get("type").and_then(Value::as_array).is_some_and(|types| types.contains(&Value::from("null")));
    (schema, nullable)
}

fn description(schema: &Value) -> Option<String> {
    schema.get("description").and_then(Value::as_str).map(|d| d.split_whitespace().collect::<Vec<_>>().join(" "))
}

/// The names of an enum's values (`enum`, or `oneOf`/`anyOf` of `const`s and `enum`s), if it is one.
fn enum_values(schema: &Value) -> Option<Vec<(String, Option<String>)>> {
    if let Some(values) = schema.get("enum").and_then(Value::as_array) {
        return Some(values.iter().filter_map(|v| v.as_str().map(|s| (s.to_string(), None))).collect());
    }
    if let Some(c) = schema.get("const").and_then(Value::as_str) {
        return Some(vec![(c.to_string(), description(schema))]);
    }
    let alternatives = schema.get("oneOf").or_else(|| schema.get("anyOf"))?.as_array()?;
    let mut out = Vec::new();
    for alternative in alternatives {
        match enum_values(alternative) {
            Some(values) => out.extend(values),
            None => out.push((format!("a {}", value_kind(alternative)), description(alternative))),
        }
    }
    Some(out)
}

/// What a key holds: a JSON type, or the enum's values.
fn value_kind(schema: &Value) -> String {
    if let Some(values) = enum_values(schema) {
        let names: Vec<String> =
            values.iter().map(|(v, _)| if v.starts_with("a ") { v.clone() } else { format!("`{v}`") }).collect();
        return names.join(" | ");
    }
    match schema.get("type") {
        Some(Value::String(t)) => t.clone(),
        Some(Value::Array(types)) => {
            let names: Vec<&str> = types.iter().filter_map(Value::as_str).filter(|t| *t != "null").collect();
            names.join(" or ")
        }
        _ => "any".into(),
    }
}

/// The doc with the documented values of an enum appended (`` `masked`: … ``).
fn with_values(doc: &str, schema: &Value) -> String {
    let documented: Vec<String> = enum_values(schema)
        .unwrap_or_default()
        .into_iter()
        .filter_map(|(v, d)| d.map(|d| format!("`{v}`: {d}")))
        .collect();
    match (doc.is_empty(), documented.is_empty()) {
        (_, true) => doc.to_string(),
        (true, false) => documented.join("; "),
        (false, false) => format!("{doc} Values — {}", documented.join("; ")),
    }
}

/// A table cell: one line, with the table's separator escaped.
fn cell(text: &str) -> String {
    text.replace('\n', " ").replace('|', "\\|")
}

/// The defaults as one cell: the value most kinds share, then the kinds that differ from it.
fn defaults_cell(defaults: &[(Kind, String)]) -> String {
    let Some(common) = defaults
        .iter()
        .map(|(_, v)| v)
        .max_by_key(|v| (defaults.iter().filter(|(_, w)| w == *v).count(), std::cmp::Reverse(v.len())))
    else {
        return String::new();
    };
    let others: Vec<String> =
        defaults.iter().filter(|(_, v)| v != common).map(|(k, v)| format!("{k}: `{v}`")).collect();
    if others.is_empty() {
        format!("`{common}`")
    } else {
        format!("`{common}` ({})", others.join(", "))
    }
}

/// The reference as Markdown: a table per section of the config.
pub fn markdown() -> String {
    let mut out = String::from(
        "# Recipe keys\n\n\
         Generated by `ablate keys` from the config structs (`src/recipe/schema.rs` and the `spec` modules): \
         do not edit by hand; a test fails when this file and the command's output differ. Regenerate with \
         `target/release/ablate keys > docs/keys.md`.\n\n\
         Every key is a dotted path, as in a recipe's sections, a `sweep:` axis, a variant, a `KEY=VALUE` \
         override and a `runs.csv` column. *Default* is each kind's default (`null`: derived from other keys, \
         as the description says); *read by* lists the kinds whose default config reads the key (or, where none \
         does, why not: such a key acts once another key is set). A recipe that sets a key its kind (or its \
         other settings) cannot honour is refused with one line saying why. Sections and keys are in \
         alphabetical order. \
         Keys of a list of mappings are written `key[].field`.\n",
    );
    let all = reference();
    let mut section = "";
    for doc in &all {
        let top = doc.key.split('.').next().unwrap_or("");
        if top != section {
            section = top;
            out.push_str(&format!(
                "\n## `{section}`\n\n| key | value | default | read by | what it does |\n|---|---|---|---|---|\n"
            ));
        }
        let read_by = if doc.read_by.len() == Kind::ALL.len() {
            "every kind".to_string()
        } else if doc.read_by.is_empty() {
            format!("none at their defaults: {}", doc.condition.as_deref().unwrap_or(""))
        } else {
            doc.read_by.iter().map(|k| k.name()).collect::<Vec<_>>().join(", ")
        };
        out.push_str(&format!(
            "| `{}` | {} | {} | {} | {} |\n",
            doc.key,
            cell(&doc.kind_of_value),
            cell(&defaults_cell(&doc.defaults)),
            cell(&read_by),
            cell(&doc.doc)
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_key_of_every_default_config_is_in_the_reference_and_nothing_else() {
        fn leaves(prefix: &str, v: &Value, out: &mut std::collections::BTreeSet<String>) {
            match v {
                Value::Object(map) if !map.is_empty() => {
                    for (k, v) in map {
                        let key = if prefix.is_empty() { k.clone() } else { format!("{prefix}.{k}") };
                        leaves(&key, v, out);
                    }
                }
                _ => {
                    out.insert(prefix.to_string());
                }
            }
        }
        let documented: std::collections::BTreeSet<String> =
            reference().into_iter().map(|d| d.key).filter(|k| !k.contains("[]")).collect();
        let mut serialised = std::collections::BTreeSet::new();
        for kind in Kind::ALL {
            let mut cfg = Config::defaults(kind);
            cfg.data.images.get_or_insert_with(Default::default);
            // Every quantity of a budget, so that each is a leaf (a run sets one).
            cfg.train.budget = Some(crate::recipe::Budget { tokens: Some(1.0), flops: Some(1.0), seconds: Some(1.0) });
            leaves("", &serde_json::to_value(&cfg).unwrap(), &mut serialised);
        }
        let missing: Vec<_> = serialised.difference(&documented).collect();
        assert!(missing.is_empty(), "keys a config has that the reference lacks: {missing:?}");
        let extra: Vec<_> = documented.difference(&serialised).collect();
        assert!(extra.is_empty(), "keys the reference lists that no config has: {extra:?}");
    }

    #[test]
    fn a_key_shows_its_values_its_default_per_kind_and_who_reads_it() {
        let all = reference();
        let find = |k: &str| all.iter().find(|d| d.key == k).unwrap_or_else(|| panic!("{k} missing")).clone();
        let pe = find("transformer.pe");
        assert!(pe.kind_of_value.contains("`rope`") && pe.kind_of_value.contains("`alibi`"), "{pe:?}");
        assert!(pe.doc.starts_with("Position encoding"), "{pe:?}");
        assert!(pe.defaults.contains(&(Kind::Lm, "\"learned\"".into())), "{pe:?}");
        assert!(pe.defaults.contains(&(Kind::Swin, "\"bias_2d\"".into())), "{pe:?}");
        assert!(!pe.read_by.contains(&Kind::Cnn), "{pe:?}");
        let mask = find("bert.mask_fraction");
        assert_eq!(mask.read_by, vec![Kind::Bert]);
        assert_eq!(mask.defaults, vec![(Kind::Bert, "0.15".into())]);
        let head_dim = find("transformer.head_dim");
        assert_eq!(head_dim.kind_of_value, "integer or null");
        let scale = find("transformer.attention.scale");
        assert!(scale.kind_of_value.contains("`sqrt_dk`") && scale.kind_of_value.contains("a number"), "{scale:?}");
        assert!(all.iter().any(|d| d.key == "transformer.attention.layer_patterns[].window"));
    }

    /// `docs/keys.md` is `ablate keys`' output: regenerate it when the schema changes (or run this test with
    /// `ABLATE_BLESS=1`).
    #[test]
    fn docs_keys_md_is_the_generated_reference() {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/keys.md");
        if std::env::var_os("ABLATE_BLESS").is_some() {
            std::fs::write(&path, markdown()).unwrap();
        }
        let committed = std::fs::read_to_string(&path).unwrap_or_default();
        assert!(
            committed == markdown(),
            "docs/keys.md differs from `ablate keys`: regenerate it with `target/release/ablate keys > docs/keys.md`"
        );
    }
}
