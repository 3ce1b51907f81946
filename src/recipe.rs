//! Recipes: a base config plus a `sweep` block of dotted keys, expanded into concrete runs before anything
//! trains. Every problem is reported as one line `file:line: key: what is wrong`, with the allowed values.
use serde::Deserialize;
use serde_yaml::{Mapping, Value};
use sha2::{Digest, Sha256};
use std::collections::HashMap;
use std::path::{Path, PathBuf};

use crate::config::{Config, DataConfig, ModelConfig, TrainConfig};

/// A recipe error pointing at a place in the YAML file (`line` 0: the file as a whole).
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{}", self.located())]
pub struct RecipeError {
    pub file: String,
    pub line: usize,
    pub message: String,
}

impl RecipeError {
    fn located(&self) -> String {
        // Messages quote the offending text; control characters in it (a key with a line break inside) are
        // escaped so that the error stays one line.
        let message: String = self
            .message
            .chars()
            .map(|c| if c.is_control() { c.escape_default().to_string() } else { c.to_string() })
            .collect();
        match self.line {
            0 => format!("{}: {message}", self.file),
            line => format!("{}:{line}: {message}", self.file),
        }
    }
}

/// The file as written. The base config sections are the config structs themselves.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RecipeFile {
    name: Option<String>,
    description: Option<String>,
    #[serde(default)]
    model: ModelConfig,
    #[serde(default)]
    data: DataConfig,
    #[serde(default)]
    train: TrainConfig,
    /// An image classifier instead of a language model.
    vision: Option<crate::vision::VisionConfig>,
    /// A BERT encoder run (masked-LM pre-training, fine-tuning).
    bert: Option<crate::config::BertRunConfig>,
    /// An encoder-decoder translation run.
    translate: Option<crate::config::TranslateConfig>,
    /// Dotted config key -> list of values; several keys form a grid.
    #[serde(default)]
    sweep: Mapping,
    /// Every sweep point is repeated once per seed.
    seeds: Option<Vec<u64>>,
    /// Extra dotted-key overrides applied by `--smoke` on top of the generic shrink.
    #[serde(default)]
    smoke: Mapping,
}

/// One concrete run of a sweep.
#[derive(Debug, Clone)]
pub struct RunSpec {
    /// Unique within the recipe: the swept values and the seed, e.g. `model.heads=4 seed=1`.
    pub id: String,
    /// The variant without the seed, for plot legends: e.g. `heads=4`.
    pub label: String,
    /// (dotted key, value as text) for every swept key.
    pub swept: Vec<(String, String)>,
    pub seed: u64,
    pub config: Config,
    /// Short hash of the resolved config: a finished run is skipped on re-run only if this still matches.
    pub config_hash: String,
}

#[derive(Debug, Clone)]
pub struct Recipe {
    pub file: String,
    pub name: String,
    pub description: Option<String>,
    pub base: Config,
    pub sweep_keys: Vec<String>,
    pub seeds: Vec<u64>,
    pub runs: Vec<RunSpec>,
    pub smoke: bool,
}

/// Finds `name` as given, or under `recipes_dir` (so `ablate heads.yaml` finds `recipes/heads.yaml`).
pub fn resolve_path(name: &Path, recipes_dir: Option<&Path>) -> Option<PathBuf> {
    if name.is_file() {
        return Some(name.to_path_buf());
    }
    let dirs = recipes_dir.into_iter().map(Path::to_path_buf).chain(std::iter::once(PathBuf::from("recipes")));
    for dir in dirs {
        for candidate in [dir.join(name), dir.join(name).with_extension("yaml")] {
            if candidate.is_file() {
                return Some(candidate);
            }
        }
    }
    None
}

pub fn load(path: &Path, smoke: bool) -> Result<Recipe, RecipeError> {
    let file = path.display().to_string();
    let text = std::fs::read_to_string(path).map_err(|e| RecipeError {
        file: file.clone(),
        line: 0,
        message: format!("cannot read recipe: {e}"),
    })?;
    parse(&text, &file, path.file_stem().and_then(|s| s.to_str()).unwrap_or("recipe"), smoke)
}

/// Parses and expands a recipe given as text (`file` names it in errors, `stem` is the default name).
pub fn parse(text: &str, file: &str, stem: &str, smoke: bool) -> Result<Recipe, RecipeError> {
    // Lines as YAML counts them (a lone carriage return ends a line too). A construct left open is only
    // noticed past the end of the file; such errors point at its last line.
    let last_line = text.replace("\r\n", "\n").replace('\r', "\n").lines().count().max(1);
    let lines = LineMap::build(text).map_err(|(line, message)| RecipeError {
        file: file.into(),
        line: line.clamp(1, last_line),
        message: format!("YAML syntax error: {message}"),
    })?;
    let err = |line: usize, message: String| RecipeError { file: file.into(), line: line.clamp(1, last_line), message };
    let parsed: RecipeFile = serde_yaml::from_str(text).map_err(|e| {
        let line = e.location().map(|l| l.line()).unwrap_or(1);
        err(line, explain_serde_error(&e.to_string()))
    })?;
    let base = Config {
        model: parsed.model,
        data: parsed.data,
        train: parsed.train,
        vision: parsed.vision,
        bert: parsed.bert,
        translate: parsed.translate,
    };
    let seeds = match parsed.seeds {
        Some(s) if s.is_empty() => {
            return Err(err(lines.line("seeds"), "seeds: the list is empty; give at least one seed".into()))
        }
        Some(s) => s,
        None => vec![base.train.seed],
    };
    let base_value = serde_yaml::to_value(&base).expect("config serialises");

    // The sweep grid: keys in file order, each a non-empty list.
    let mut axes: Vec<(String, Vec<Value>)> = Vec::new();
    for (k, v) in &parsed.sweep {
        let Some(key) = k.as_str() else {
            return Err(err(lines.line("sweep"), "sweep: keys must be dotted config paths like model.heads".into()));
        };
        let line = lines.line(&format!("sweep.{key}"));
        check_path(&base_value, key).map_err(|m| err(line, format!("sweep.{key}: {m}")))?;
        let Value::Sequence(values) = v else {
            return Err(err(line, format!("sweep.{key}: expected a non-empty list of values, e.g. [1, 2, 4]")));
        };
        if values.is_empty() {
            return Err(err(line, format!("sweep.{key}: expected a non-empty list of values, e.g. [1, 2, 4]")));
        }
        // Each value on its own must be a valid setting of its key: a type error points at that value.
        for (i, candidate) in values.iter().enumerate() {
            let mut value = base_value.clone();
            set_path(&mut value, key, candidate.clone());
            if let Err(e) = serde_yaml::from_value::<Config>(value) {
                let msg = explain_serde_error(&e.to_string());
                let msg = if msg.starts_with(key) { msg } else { format!("{key}: {msg}") };
                return Err(err(lines.line(&format!("sweep.{key}.{i}")), msg));
            }
        }
        axes.push((key.to_string(), values.clone()));
    }
    let mut smoke_overrides: Vec<(String, Value)> = Vec::new();
    for (k, v) in &parsed.smoke {
        let key = k.as_str().unwrap_or_default().to_string();
        let line = lines.line(&format!("smoke.{key}"));
        check_path(&base_value, &key).map_err(|m| err(line, format!("smoke.{key}: {m}")))?;
        smoke_overrides.push((key, v.clone()));
    }

    // A typo such as a long list under several keys can multiply into more runs than any sweep means to
    // have (and than memory holds); refuse before expanding.
    let count = axes.iter().try_fold(seeds.len() as u128, |n, a| n.checked_mul(a.1.len() as u128)).unwrap_or(u128::MAX);
    if count > MAX_RUNS {
        return Err(err(
            lines.line("sweep"),
            format!(
                "sweep: the grid times the seeds is {count} runs; at most {MAX_RUNS} (split the recipe, or shard it)"
            ),
        ));
    }
    let mut runs = Vec::new();
    for point in grid(&axes) {
        for &seed in &seeds {
            let mut value = base_value.clone();
            let mut swept = Vec::new();
            for (axis, &i) in axes.iter().zip(&point) {
                set_path(&mut value, &axis.0, axis.1[i].clone());
                swept.push((axis.0.clone(), value_text(&axis.1[i])));
            }
            set_path(&mut value, "train.seed", Value::from(seed));
            if smoke {
                shrink_for_smoke(&mut value, &axes);
                for (k, v) in &smoke_overrides {
                    set_path(&mut value, k, v.clone());
                }
            }
            // The line to blame for a problem with this run: the swept value that caused it, else the key.
            let blame = |key: &str| -> usize {
                if let Some((ai, _)) = axes.iter().enumerate().find(|(_, a)| a.0 == key) {
                    return lines.line(&format!("sweep.{key}.{}", point[ai]));
                }
                if lines.has(key) {
                    return lines.line(key);
                }
                match axes.first() {
                    Some(a) => lines.line(&format!("sweep.{}.{}", a.0, point[0])),
                    None => lines.line(key),
                }
            };
            let config: Config = serde_yaml::from_value(value).map_err(|e| {
                let msg = explain_serde_error(&e.to_string());
                let key = msg.split(':').next().unwrap_or("").to_string();
                err(blame(&key), msg)
            })?;
            config.validate().map_err(|inv| err(blame(inv.key), format!("{}: {}", inv.key, inv.message)))?;
            let mut id_parts: Vec<String> = swept.iter().map(|(k, v)| format!("{k}={v}")).collect();
            let label = swept
                .iter()
                .map(|(k, v)| format!("{}={}", k.rsplit('.').next().unwrap_or(k), short_value(v)))
                .collect::<Vec<_>>()
                .join(" ");
            id_parts.push(format!("seed={seed}"));
            let yaml = serde_yaml::to_string(&config).expect("config serialises");
            let config_hash = Sha256::digest(yaml.as_bytes()).iter().take(6).map(|b| format!("{b:02x}")).collect();
            runs.push(RunSpec {
                id: id_parts.join(" "),
                label: if label.is_empty() { "base".into() } else { label },
                swept,
                seed,
                config,
                config_hash,
            });
        }
    }
    Ok(Recipe {
        file: file.into(),
        name: parsed.name.unwrap_or_else(|| stem.to_string()),
        description: parsed.description,
        base,
        sweep_keys: axes.iter().map(|a| a.0.clone()).collect(),
        seeds,
        runs,
        smoke,
    })
}

/// The cartesian product of the axes' value indices, first axis slowest.
/// The most runs one recipe may expand to.
const MAX_RUNS: u128 = 100_000;

fn grid(axes: &[(String, Vec<Value>)]) -> Vec<Vec<usize>> {
    let mut points = vec![Vec::new()];
    for (_, values) in axes {
        points =
            points.into_iter().flat_map(|p| (0..values.len()).map(move |i| [p.clone(), vec![i]].concat())).collect();
    }
    points
}

/// Shrinks a run to seconds without changing the recipe's shape: every swept key keeps its values.
fn shrink_for_smoke(value: &mut Value, axes: &[(String, Vec<Value>)]) {
    let swept = |k: &str| axes.iter().any(|a| a.0 == k);
    let mut cap = |key: &str, max: i64| {
        if swept(key) {
            return;
        }
        let current = get_path(value, key).and_then(Value::as_i64);
        if current.is_none_or(|c| c > max) {
            set_path(value, key, Value::from(max));
        }
    };
    cap("train.steps", 6);
    cap("train.eval_interval", 3);
    cap("train.eval_batches", 2);
    cap("train.log_interval", 2);
    cap("train.batch_size", 4);
    cap("train.warmup_steps", 2);
    cap("model.layers", 2);
    cap("model.block_size", 32);
    cap("data.max_chars", 50_000);
    // Pre-training length is capped even when swept: the smoke run keeps "none" (0) apart from "some".
    if let Some(steps) = get_path(value, "bert.pretrain_steps").and_then(Value::as_i64) {
        if steps > 4 {
            set_path(value, "bert.pretrain_steps", Value::from(4));
        }
    }
}

/// A swept value as legends show it: without quotes, and a path (a checkpoint) by its file name only.
fn short_value(v: &str) -> String {
    let v = v.replace('"', "");
    match v.rsplit_once('/') {
        Some((_, name)) if !v.starts_with('{') && !v.starts_with('[') => {
            name.strip_suffix(".safetensors").unwrap_or(name).to_string()
        }
        _ => v,
    }
}

/// A swept value as it appears in run ids, labels and CSV cells: scalars as written, sections and lists as
/// one-line JSON.
fn value_text(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        Value::Null => "null".into(),
        Value::Mapping(_) | Value::Sequence(_) => serde_json::to_string(v).unwrap_or_default(),
        other => serde_yaml::to_string(other).unwrap_or_default().trim().to_string(),
    }
}

fn get_path<'a>(value: &'a Value, dotted: &str) -> Option<&'a Value> {
    dotted.split('.').try_fold(value, |v, part| v.as_mapping()?.get(part))
}

fn set_path(value: &mut Value, dotted: &str, new: Value) {
    let mut v = value;
    for part in dotted.split('.') {
        v = v.as_mapping_mut().expect("path checked").entry(Value::from(part)).or_insert(Value::Null);
    }
    *v = new;
}

/// Checks that `dotted` names a config value, with a did-you-mean and the allowed keys if not.
fn check_path(base: &Value, dotted: &str) -> Result<(), String> {
    let mut v = base;
    let mut walked = Vec::new();
    for part in dotted.split('.') {
        let Some(map) = v.as_mapping() else {
            return Err(format!("`{}` is a value, not a section: nothing below it can be set", walked.join(".")));
        };
        let keys: Vec<String> = map.keys().filter_map(|k| k.as_str().map(String::from)).collect();
        match map.get(part) {
            Some(next) => v = next,
            None => {
                let prefix = if walked.is_empty() { String::new() } else { format!("{}.", walked.join(".")) };
                let hint = closest(part, &keys).map(|c| format!(" (did you mean {prefix}{c}?)")).unwrap_or_default();
                return Err(format!(
                    "unknown config key `{dotted}`{hint}; allowed under {}: {}",
                    if walked.is_empty() { "the top level".to_string() } else { walked.join(".") },
                    keys.join(", ")
                ));
            }
        }
        walked.push(part);
    }
    Ok(())
}

/// The most similar candidate, if it is close enough to be a typo.
pub fn closest<'a>(word: &str, candidates: &'a [String]) -> Option<&'a str> {
    candidates
        .iter()
        .map(|c| (edit_distance(word, c), c))
        .filter(|(d, c)| *d <= 2.max(c.len() / 3))
        .min_by_key(|(d, _)| *d)
        .map(|(_, c)| c.as_str())
}

fn edit_distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut row: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut prev = row[0];
        row[0] = i + 1;
        for (j, cb) in b.iter().enumerate() {
            let cur = row[j + 1];
            row[j + 1] = (prev + usize::from(ca != *cb)).min(row[j] + 1).min(cur + 1);
            prev = cur;
        }
    }
    row[b.len()]
}

/// serde_yaml's message without its position suffix, with a did-you-mean for unknown fields.
fn explain_serde_error(message: &str) -> String {
    let message = match message.rfind(" at line ") {
        Some(i) => &message[..i],
        None => message,
    };
    // "path: unknown field `hedas`, expected one of `a`, `b`" (or "expected `a` or `b`")
    if let Some(start) = message.find("unknown field `") {
        let rest = &message[start + "unknown field `".len()..];
        if let Some(end) = rest.find('`') {
            let field = &rest[..end];
            let allowed: Vec<String> = rest[end..].split('`').skip(2).step_by(2).map(String::from).collect();
            if let Some(c) = closest(field, &allowed) {
                return format!("{message} (did you mean `{c}`?)");
            }
        }
    }
    message.to_string()
}

/// Line numbers (1-based) of every key and sequence item in a YAML document, by dotted path.
struct LineMap(HashMap<String, usize>);

impl LineMap {
    fn build(text: &str) -> Result<Self, (usize, String)> {
        use yaml_rust2::parser::{Event, MarkedEventReceiver, Parser};
        use yaml_rust2::scanner::Marker;
        enum Frame {
            Map { prefix: String, key: Option<String> },
            Seq { prefix: String, index: usize },
        }
        struct Recv {
            stack: Vec<Frame>,
            lines: HashMap<String, usize>,
        }
        fn join(prefix: &str, part: &str) -> String {
            if prefix.is_empty() {
                part.to_string()
            } else {
                format!("{prefix}.{part}")
            }
        }
        impl Recv {
            /// The path of the node that starts now, and advance the parent's state past it.
            fn node_path(&mut self, line: usize, is_scalar_key_candidate: Option<&str>) -> Option<String> {
                match self.stack.last_mut() {
                    None => Some(String::new()),
                    Some(Frame::Map { prefix, key }) => match key.take() {
                        None => {
                            if let Some(k) = is_scalar_key_candidate {
                                let path = join(prefix, k);
                                self.lines.entry(path).or_insert(line);
                                *key = Some(k.to_string());
                            }
                            None
                        }
                        Some(k) => Some(join(prefix, &k)),
                    },
                    Some(Frame::Seq { prefix, index }) => {
                        let path = join(prefix, &index.to_string());
                        *index += 1;
                        self.lines.entry(path.clone()).or_insert(line);
                        Some(path)
                    }
                }
            }
        }
        impl MarkedEventReceiver for Recv {
            fn on_event(&mut self, ev: Event, mark: Marker) {
                let line = mark.line();
                match ev {
                    Event::Scalar(s, ..) => {
                        let _ = self.node_path(line, Some(&s));
                    }
                    Event::Alias(_) => {
                        let _ = self.node_path(line, Some(""));
                    }
                    Event::MappingStart(..) => {
                        let prefix = self.node_path(line, None).unwrap_or_default();
                        self.stack.push(Frame::Map { prefix, key: None });
                    }
                    Event::SequenceStart(..) => {
                        let prefix = self.node_path(line, None).unwrap_or_default();
                        self.stack.push(Frame::Seq { prefix, index: 0 });
                    }
                    Event::MappingEnd | Event::SequenceEnd => {
                        self.stack.pop();
                    }
                    _ => {}
                }
            }
        }
        let mut recv = Recv { stack: Vec::new(), lines: HashMap::new() };
        Parser::new_from_str(text).load(&mut recv, false).map_err(|e| (e.marker().line(), e.info().to_string()))?;
        Ok(LineMap(recv.lines))
    }

    fn has(&self, path: &str) -> bool {
        self.0.contains_key(path)
    }

    /// The line of `path`, else of its nearest enclosing key that is in the file, else 1.
    fn line(&self, path: &str) -> usize {
        let mut p = path;
        loop {
            if let Some(&l) = self.0.get(p) {
                return l;
            }
            match p.rfind('.') {
                Some(i) => p = &p[..i],
                None => return 1,
            }
        }
    }
}
