//! Recipes: what a run trains (`kind`), a base config, a `sweep` block of dotted keys and a list of
//! `variants`, expanded into concrete runs before anything trains. Every problem is reported as one line
//! `file:line: key: what is wrong`, with the allowed values.
//!
//! This layer needs no libtorch (`cargo build --no-default-features` builds it, and the fuzz target uses
//! it so): it is the schema, its validation, which keys each kind reads, and the expansion.
use serde::Deserialize;
use serde_yaml::{Mapping, Value};
use sha2::{Digest, Sha256};
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

pub mod compare;
pub mod convert;
pub mod keys;
pub mod lines;
pub mod overrides;
pub mod presets;
pub mod reads;
pub mod schema;
pub mod tune;
pub mod validate;

pub use overrides::Overrides;
pub use schema::*;
pub use tune::{TuneRole, Tuning};
pub use validate::{divisors, Invalid, MAX_D_MODEL};

use lines::LineMap;

/// A recipe error pointing at a place in the YAML file (`line` 0: the file as a whole).
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{}", self.located())]
pub struct RecipeError {
    pub file: String,
    pub line: usize,
    pub message: String,
    /// The command-line argument to blame instead of a place in the file (an override).
    pub argument: Option<String>,
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
        match (&self.argument, self.line) {
            (Some(argument), _) => format!("argument `{argument}`: {message}"),
            (None, 0) => format!("{}: {message}", self.file),
            (None, line) => format!("{}:{line}: {message}", self.file),
        }
    }
}

/// The file as written. The config sections are kept as YAML here: each run's are laid over the defaults
/// of its kind and then read into the config structs, whose errors name the key.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RecipeFile {
    name: Option<String>,
    description: Option<String>,
    /// What the runs train: lm, bert, translate, vit, swin, davit, image_gpt, cnn or seq_classify.
    kind: Option<Kind>,
    transformer: Option<Value>,
    data: Option<Value>,
    train: Option<Value>,
    bert: Option<Value>,
    translate: Option<Value>,
    vision: Option<Value>,
    image_gpt: Option<Value>,
    cnn: Option<Value>,
    seq_classify: Option<Value>,
    /// Dotted config key -> list of values; several keys form a grid.
    #[serde(default)]
    sweep: Mapping,
    /// A list of named settings (each a mapping of dotted keys, and an optional `label`), crossed with the
    /// sweep: for comparisons that are not a grid, such as different kinds of model.
    #[serde(default)]
    variants: Vec<Mapping>,
    /// Every sweep point is repeated once per seed.
    seeds: Option<Vec<u64>>,
    /// Extra dotted-key overrides applied by `--smoke` on top of the generic shrink.
    #[serde(default)]
    smoke: Mapping,
    /// Per-arm tuning of some keys by successive halving on the validation split.
    tune: Option<tune::TuneFile>,
    /// Dotted config key -> value: the second scale (a width, a depth) the whole comparison is re-run at,
    /// into `<out>/scale_check/`.
    #[serde(default)]
    scale_check: Mapping,
    /// The comparisons the results answer and the smallest effect that matters per metric.
    compare: Option<compare::CompareFile>,
    /// A recipe kept as an example whose committed reference was withdrawn: why, and where its question is
    /// answered now.
    retired: Option<Retired>,
}

/// The sections as their structs, read straight from the text only to report a mistake in them at its
/// line (serde_yaml knows positions when it reads text, not when it reads a merged value).
#[derive(Deserialize)]
#[allow(dead_code)]
struct TypedSections {
    name: Option<String>,
    description: Option<String>,
    kind: Option<Kind>,
    transformer: Option<TransformerConfig>,
    data: Option<DataConfig>,
    train: Option<TrainConfig>,
    bert: Option<BertConfig>,
    translate: Option<TranslateConfig>,
    vision: Option<VisionConfig>,
    image_gpt: Option<ImageGptConfig>,
    cnn: Option<CnnConfig>,
    seq_classify: Option<SeqClassifyConfig>,
    sweep: Option<Value>,
    variants: Option<Value>,
    seeds: Option<Value>,
    smoke: Option<Value>,
    tune: Option<Value>,
    scale_check: Option<Value>,
    compare: Option<Value>,
    retired: Option<Value>,
}

/// The config sections of a recipe file, in schema order.
const SECTIONS: [&str; 9] =
    ["transformer", "data", "train", "bert", "translate", "vision", "image_gpt", "cnn", "seq_classify"];

/// One concrete run of a sweep.
#[derive(Debug, Clone)]
pub struct RunSpec {
    /// Unique within the recipe: the swept values and the seed, e.g. `transformer.heads=4 seed=1`.
    pub id: String,
    /// The variant without the seed, for plot legends: e.g. `heads=4`.
    pub label: String,
    /// (dotted key, value as text) for every swept key (`variant` for a `variants` entry).
    pub swept: Vec<(String, String)>,
    pub seed: u64,
    pub config: Config,
    /// Short hash of the columns the run reads: a finished run is skipped on re-run only if this still
    /// matches.
    pub config_hash: String,
    /// In a recipe with `tune:`, what the run is for (a rung of an arm's tuning, or a final run).
    pub tune: Option<TuneRole>,
}

#[derive(Debug, Clone)]
pub struct Recipe {
    pub file: String,
    pub name: String,
    pub description: Option<String>,
    /// The swept keys in grid order; `variant` stands for the `variants` list.
    pub sweep_keys: Vec<String>,
    pub seeds: Vec<u64>,
    /// Every run the recipe can train. With `tune:`, every arm's tuning runs and its final runs for every
    /// candidate: which of them train is decided as the sweep goes.
    pub runs: Vec<RunSpec>,
    pub smoke: bool,
    /// The command line's changes to the file.
    pub overrides: Overrides,
    pub tuning: Option<Tuning>,
    /// With `scale_check:`, the same recipe at the second scale (its settings applied to every run as
    /// overrides are), and those settings as `key=value` text.
    pub scale_check: Option<(Box<Recipe>, Vec<String>)>,
    /// With `compare:`, the comparisons its results answer and their margins.
    pub compare: Option<compare::Compare>,
    /// With `retired:`, the recipe has no committed reference (results/<name> is gone), and says why.
    pub retired: Option<Retired>,
}

/// `retired:` — a shipped recipe whose committed reference was withdrawn (out of date and not worth its
/// refresh, or answered better by another recipe's results). The recipe still runs, as an example;
/// `ablate stale` lists it with its successors and checks that they hold current references.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Retired {
    /// Why the reference was withdrawn, in a sentence.
    pub reason: String,
    /// The recipes (by name) whose results answer its question now; empty when none does.
    #[serde(default)]
    pub successors: Vec<String>,
}

impl Recipe {
    /// How many runs the recipe trains when it is done: every run, or with `tune:` each arm's tuning runs
    /// that successive halving keeps and its final runs of one candidate.
    pub fn planned_runs(&self) -> usize {
        let Some(t) = &self.tuning else { return self.runs.len() };
        let per_arm_tuning: usize = (0..t.rungs).map(|r| t.survivors_at(r) * t.seeds.len()).sum();
        let finals = self.runs.iter().filter(|r| r.tune.is_some_and(|role| role.rung.is_none())).count();
        t.arms.len() * per_arm_tuning + finals / t.candidates.len().max(1)
    }

    /// The kinds of run in the recipe, in first-seen order.
    pub fn kinds(&self) -> Vec<Kind> {
        let mut out = Vec::new();
        for r in &self.runs {
            if !out.contains(&r.config.kind) {
                out.push(r.config.kind);
            }
        }
        out
    }
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
    load_with(path, smoke, &Overrides::default())
}

/// Loads a recipe with command-line overrides laid over it.
pub fn load_with(path: &Path, smoke: bool, overrides: &Overrides) -> Result<Recipe, RecipeError> {
    let file = path.display().to_string();
    if path.is_dir() {
        return Err(RecipeError { file, line: 0, message: "is a directory, not a recipe file".into(), argument: None });
    }
    let text = std::fs::read_to_string(path).map_err(|e| RecipeError {
        file: file.clone(),
        line: 0,
        message: format!("cannot read recipe: {e}"),
        argument: None,
    })?;
    parse_with(&text, &file, path.file_stem().and_then(|s| s.to_str()).unwrap_or("recipe"), smoke, overrides)
}

/// Every config key of every kind, with defaults: what a dotted key in `sweep`, `variants` or `smoke` is
/// checked against.
fn schema_template() -> Value {
    let mut template = Value::Mapping(Mapping::new());
    for kind in Kind::ALL {
        merge(&mut template, to_value(&Config::defaults(kind)));
    }
    template
}

fn to_value(config: &Config) -> Value {
    serde_yaml::to_value(config).expect("a config serialises")
}

/// `over` laid onto `base`: mappings merge key by key, anything else replaces.
fn merge(base: &mut Value, over: Value) {
    match (base, over) {
        (Value::Mapping(b), Value::Mapping(o)) => {
            for (k, v) in o {
                match b.get_mut(&k) {
                    Some(slot) => merge(slot, v),
                    None => {
                        b.insert(k, v);
                    }
                }
            }
        }
        (slot, v) => *slot = v,
    }
}

/// One dotted-key setting of a run, and where it was written.
struct Setting {
    key: String,
    value: Value,
    /// The recipe path of its line (`sweep.transformer.heads.2`, `variants.1.kind`, …).
    source: String,
}

/// Parses and expands a recipe given as text (`file` names it in errors, `stem` is the default name).
pub fn parse(text: &str, file: &str, stem: &str, smoke: bool) -> Result<Recipe, RecipeError> {
    parse_with(text, file, stem, smoke, &Overrides::default())
}

/// [`parse`] with command-line overrides: `key=value` settings applied to every run after everything
/// else, `--sweep` axes and `--seeds`. A problem they cause names the argument.
///
/// A pipeline of named steps: read the file, lay the overrides over it, then the seeds, the written
/// sections, the sweep axes, the variants, the smoke and override settings, the grid's size, the expansion
/// into runs, the refusal of keys no run reads, and each run's validation.
pub fn parse_with(
    text: &str,
    file: &str,
    stem: &str,
    smoke: bool,
    overrides: &Overrides,
) -> Result<Recipe, RecipeError> {
    let (mut recipe, second) = parse_one_scale(text, file, stem, smoke, overrides)?;
    let Some(SecondScale { settings, line }) = second else { return Ok(recipe) };
    // The second scale is the recipe with its settings laid over every run, after the command line's.
    let mut scaled = overrides.clone();
    for (key, value) in &settings {
        scaled.set.push((key.clone(), value.clone(), format!("{key}={}", value_text(value))));
    }
    let (check, _) = parse_one_scale(text, file, stem, smoke, &scaled).map_err(|e| RecipeError {
        message: format!("scale_check: {}", e.message),
        line,
        argument: None,
        ..e
    })?;
    let named = scaled.set[overrides.set.len()..].iter().map(|(_, _, text)| text.clone()).collect();
    recipe.scale_check = Some((Box::new(check), named));
    Ok(recipe)
}

/// A recipe's `scale_check:` settings, each checked, and the line of the section.
struct SecondScale {
    settings: Vec<(String, Value)>,
    line: usize,
}

/// `scale_check:`'s settings checked against the schema and the sweep (a swept key would change what every
/// arm shares); `None` when the recipe has none.
fn second_scale(src: &Source, parsed: &RecipeFile, sweep_keys: &[String]) -> Result<Option<SecondScale>, RecipeError> {
    if parsed.scale_check.is_empty() {
        return Ok(None);
    }
    let mut settings = Vec::new();
    for (k, v) in &parsed.scale_check {
        let key = k.as_str().unwrap_or_default().to_string();
        let at = format!("scale_check.{key}");
        src.setting(&key, v, &at)?;
        if sweep_keys.contains(&key) {
            return Err(src.at(&at, format!("{at}: {key} is swept; a second scale changes what every arm shares")));
        }
        settings.push((key, v.clone()));
    }
    Ok(Some(SecondScale { settings, line: src.lines.line("scale_check") }))
}

/// [`parse_with`] at one scale: the recipe as written (and overridden), without its second scale, and that
/// scale's settings.
fn parse_one_scale(
    text: &str,
    file: &str,
    stem: &str,
    smoke: bool,
    overrides: &Overrides,
) -> Result<(Recipe, Option<SecondScale>), RecipeError> {
    let (mut parsed, typed, mut lines, last_line) = read_recipe_file(text, file)?;
    apply_overrides(&mut parsed, &mut lines, overrides, file)?;
    let src = Source { file, last_line, lines, template: schema_template() };
    let mut seeds = seeds(&src, &parsed, &typed)?;
    // The plan (`compare.max_seeds`) is the recipe's, checked against its own seeds, not a smoke run's.
    let planned_seeds = seeds.len();
    if smoke && overrides.seeds.is_none() {
        // Two seeds keep every paired comparison and interval computing; a third adds only time.
        seeds.truncate(SMOKE_SEEDS);
    }
    let written = written_sections(&src, &parsed)?;
    let (mut axes, mut sweep_keys) = sweep_axes(&src, &parsed)?;
    let (variant_labels, variants) = variant_axis(&src, &parsed)?;
    if !variants.is_empty() {
        // The variants axis comes first; its points are looked up in `variants` per run.
        sweep_keys.insert(0, "variant".into());
        axes.insert(0, Vec::new());
    }
    let smoke_settings = parsed
        .smoke
        .iter()
        .map(|(k, v)| {
            let key = k.as_str().unwrap_or_default().to_string();
            src.setting(&key, v, &format!("smoke.{key}"))
        })
        .collect::<Result<Vec<_>, _>>()?;
    // `key=value` overrides act last, on every run, over sweep, variants and smoke alike.
    let override_settings =
        overrides.set.iter().map(|(key, value, _)| src.setting(key, value, key)).collect::<Result<Vec<_>, _>>()?;
    let sizes: Vec<usize> = axes
        .iter()
        .enumerate()
        .map(|(i, a)| if i == 0 && !variants.is_empty() { variants.len() } else { a.len() })
        .collect();
    check_grid_size(&src, &sizes, seeds.len())?;
    let grid = Grid {
        axes: &axes,
        variants: &variants,
        variant_labels: &variant_labels,
        sweep_keys: &sweep_keys,
        smoke: smoke.then_some(smoke_settings.as_slice()),
        overrides: &override_settings,
        written_keys: leaves(&Value::Mapping(written.clone())),
        written: &written,
        kind: parsed.kind,
    };
    refuse_replaced_sections(&src, &grid)?;
    let (mut runs, set_per_run) = expand(&src, &grid, &sizes, &seeds)?;
    refuse_unread_keys(&src, &runs, &set_per_run)?;
    validate_runs(&src, &mut runs, &set_per_run)?;
    let (tuning, runs) = match &parsed.tune {
        Some(file) => {
            let (tuning, runs) = tune::expand(&src, file, runs, &sweep_keys, &seeds)?;
            (Some(tuning), runs)
        }
        None => (None, runs),
    };
    let second = second_scale(&src, &parsed, &sweep_keys)?;
    let compare = parsed.compare.as_ref().map(|c| compare::expand(&src, c, planned_seeds)).transpose()?;
    let retired = parsed.retired.clone().map(|r| checked_retirement(&src, r)).transpose()?;
    let recipe = Recipe {
        file: file.into(),
        name: parsed.name.unwrap_or_else(|| stem.to_string()),
        description: parsed.description,
        sweep_keys,
        seeds,
        runs,
        smoke,
        overrides: overrides.clone(),
        tuning,
        scale_check: None,
        compare,
        retired,
    };
    Ok((recipe, second))
}

/// `retired:` with a reason to read and successors that are recipe names, not paths.
fn checked_retirement(src: &Source, retired: Retired) -> Result<Retired, RecipeError> {
    if retired.reason.trim().is_empty() {
        return Err(src.at("retired.reason", "retired.reason: say why the reference was withdrawn".into()));
    }
    if let Some(bad) = retired.successors.iter().find(|s| s.is_empty() || s.contains(['/', '.', ' '])) {
        return Err(src.at(
            "retired.successors",
            format!("retired.successors: `{bad}` is not a recipe name (write `heads`, not a path)"),
        ));
    }
    Ok(retired)
}

/// What every step after the overrides reads: the file's name, its line map (with the arguments that
/// overrides blame), and the schema template that keys and values are checked against.
struct Source<'a> {
    file: &'a str,
    last_line: usize,
    lines: LineMap,
    template: Value,
}

impl Source<'_> {
    /// An error at a line of the file.
    fn err(&self, line: usize, message: String) -> RecipeError {
        located_error(self.file, self.last_line, line, message)
    }

    /// A problem at a recipe path: on the command line if an override set it, else at its line.
    fn at(&self, source: &str, message: String) -> RecipeError {
        match self.lines.argument(source) {
            Some(argument) => {
                RecipeError { file: self.file.into(), line: 0, message, argument: Some(argument.to_string()) }
            }
            None => self.err(self.lines.line(source), message),
        }
    }

    /// `key` (set at `source`) is a key of the schema; `train.seed` is set through `seeds:`.
    fn check(&self, key: &str, source: &str) -> Result<(), RecipeError> {
        if key == "kind" {
            return Ok(());
        }
        if key == "train.seed" && !source.starts_with("smoke.") {
            return Err(
                self.at(source, format!("{source}: list the seeds in `seeds:` (every run is repeated once per seed)"))
            );
        }
        check_path(&self.template, key).map_err(|m| self.at(source, format!("{source}: {m}")))
    }

    /// A setting's value on its own must be a valid value of its key: a type error points at it.
    fn type_check(&self, setting: &Setting) -> Result<(), RecipeError> {
        let mut value = self.template.clone();
        set_path(&mut value, &setting.key, setting.value.clone());
        serde_yaml::from_value::<Config>(value).map(|_| ()).map_err(|e| {
            let msg = explain_serde_error(&e.to_string());
            let msg = if msg.starts_with(&setting.key) { msg } else { format!("{}: {msg}", setting.key) };
            self.at(&setting.source, msg)
        })
    }

    /// A checked setting of `key` to `value`, written at `source`.
    fn setting(&self, key: &str, value: &Value, source: &str) -> Result<Setting, RecipeError> {
        self.check(key, source)?;
        let setting = Setting { key: key.into(), value: value.clone(), source: source.into() };
        self.type_check(&setting)?;
        Ok(setting)
    }
}

/// An error at `line` of `file`, clamped into the file (a construct left open is only noticed past its end).
fn located_error(file: &str, last_line: usize, line: usize, message: String) -> RecipeError {
    RecipeError { file: file.into(), line: line.clamp(1, last_line), message, argument: None }
}

/// The file read three ways: its line map, its top level with the sections as YAML, and the sections as
/// their structs (only to report a mistake inside one at its line). Also its last line.
fn read_recipe_file(text: &str, file: &str) -> Result<(RecipeFile, TypedSections, LineMap, usize), RecipeError> {
    // Lines as YAML counts them (a lone carriage return ends a line too).
    let last_line = text.replace("\r\n", "\n").replace('\r', "\n").lines().count().max(1);
    let lines = LineMap::build(text)
        .map_err(|(line, message)| located_error(file, last_line, line, format!("YAML syntax error: {message}")))?;
    let serde_error = |e: serde_yaml::Error| {
        let line = e.location().map(|l| l.line()).unwrap_or(1);
        located_error(file, last_line, line, explain_serde_error(&e.to_string()))
    };
    let parsed: RecipeFile = serde_yaml::from_str(text).map_err(serde_error)?;
    let typed = serde_yaml::from_str::<TypedSections>(text).map_err(serde_error)?;
    Ok((parsed, typed, lines, last_line))
}

/// Lays the command line's overrides over the file: `--sweep` axes replace or add axes, `key=value` fixes a
/// key (and ends its axis), `--seeds` replaces the seeds. Each path they touch is blamed on its argument.
/// Refused: a key both set and swept on the command line, a section set whole inside which the recipe
/// sweeps, and a key a variant sets.
fn apply_overrides(
    parsed: &mut RecipeFile,
    lines: &mut LineMap,
    overrides: &Overrides,
    file: &str,
) -> Result<(), RecipeError> {
    let refuse = |argument: &str, message: String| RecipeError {
        file: file.into(),
        line: 0,
        message,
        argument: Some(argument.to_string()),
    };
    for (key, values, argument) in &overrides.sweep {
        parsed.sweep.insert(Value::from(key.as_str()), Value::Sequence(values.clone()));
        lines.blame_argument(&format!("sweep.{key}"), argument);
    }
    for (key, _, argument) in &overrides.set {
        let fixed = |k: &str| k == key || k.starts_with(&format!("{key}."));
        let inside = |k: &str| key.starts_with(&format!("{k}."));
        let swept: Vec<String> = parsed.sweep.keys().filter_map(|k| k.as_str().map(String::from)).collect();
        for k in swept.into_iter().filter(|k| fixed(k)) {
            if overrides.sweep.iter().any(|(s, _, _)| *s == k) {
                return Err(refuse(argument, format!("`{k}` is also swept by --sweep; give one")));
            }
            if k != *key {
                return Err(refuse(
                    argument,
                    format!("sets all of `{key}`, which the recipe sweeps `{k}` inside; override `{k}` itself"),
                ));
            }
            // The key is fixed: its axis goes.
            parsed.sweep.remove(k.as_str());
        }
        for (i, variant) in parsed.variants.iter().enumerate() {
            if let Some(k) =
                variant.keys().filter_map(|k| k.as_str()).find(|k| *k != "label" && (fixed(k) || inside(k)))
            {
                return Err(refuse(
                    argument,
                    format!(
                        "variants.{i} sets `{k}`; overriding it would change that variant behind its label (edit the recipe instead)"
                    ),
                ));
            }
        }
        lines.blame_argument(key, argument);
    }
    if let Some((list, argument)) = &overrides.seeds {
        parsed.seeds = Some(list.clone());
        lines.blame_argument("seeds", argument);
    }
    Ok(())
}

/// The runs' seeds: the `seeds:` list (non-empty, each once), else `train.seed` as written.
fn seeds(src: &Source, parsed: &RecipeFile, typed: &TypedSections) -> Result<Vec<u64>, RecipeError> {
    match &parsed.seeds {
        Some(s) if s.is_empty() => Err(src.at("seeds", "seeds: the list is empty; give at least one seed".into())),
        Some(s) => {
            // Two runs with one seed would be one run twice, under one id in every result file.
            if let Some((i, seed)) = s.iter().enumerate().find(|(i, seed)| s[..*i].contains(seed)) {
                return Err(src.at(&format!("seeds.{i}"), format!("seeds: {seed} is listed twice")));
            }
            Ok(s.clone())
        }
        None => Ok(vec![typed.train.as_ref().map_or(0, |t| t.seed)]),
    }
}

/// The user's sections, as one tree laid over each run's kind defaults.
fn written_sections(src: &Source, parsed: &RecipeFile) -> Result<Mapping, RecipeError> {
    let mut written = Mapping::new();
    for (name, section) in SECTIONS.iter().zip([
        &parsed.transformer,
        &parsed.data,
        &parsed.train,
        &parsed.bert,
        &parsed.translate,
        &parsed.vision,
        &parsed.image_gpt,
        &parsed.cnn,
        &parsed.seq_classify,
    ]) {
        match section {
            Some(v @ Value::Mapping(_)) => {
                written.insert(Value::from(*name), v.clone());
            }
            Some(Value::Null) | None => {}
            Some(_) => return Err(src.at(name, format!("{name}: expected a section of keys"))),
        }
    }
    Ok(written)
}

/// The sweep grid: keys in file order, each a non-empty list of distinct, valid values. Returns the axes
/// and their keys.
fn sweep_axes(src: &Source, parsed: &RecipeFile) -> Result<(Vec<Vec<Setting>>, Vec<String>), RecipeError> {
    let mut axes: Vec<Vec<Setting>> = Vec::new();
    let mut sweep_keys = Vec::new();
    for (k, v) in &parsed.sweep {
        let Some(key) = k.as_str() else {
            return Err(src.at("sweep", "sweep: keys must be dotted config paths like transformer.heads".into()));
        };
        let source = format!("sweep.{key}");
        src.check(key, &source)?;
        let values = match v {
            Value::Sequence(values) if !values.is_empty() => values,
            _ => return Err(src.at(&source, format!("{source}: expected a non-empty list of values, e.g. [1, 2, 4]"))),
        };
        sweep_keys.push(key.to_string());
        let settings: Vec<Setting> = values
            .iter()
            .enumerate()
            .map(|(i, value)| Setting { key: key.into(), value: value.clone(), source: format!("{source}.{i}") })
            .collect();
        for (i, setting) in settings.iter().enumerate() {
            src.type_check(setting)?;
            if values[..i].contains(&setting.value) {
                let text = value_text(&setting.value);
                return Err(src.at(&setting.source, format!("{source}: {text} is listed twice")));
            }
        }
        axes.push(settings);
    }
    Ok((axes, sweep_keys))
}

/// `variants`: one axis whose points set several keys at once, each with a label (given, or made from its
/// settings) that no other variant has. Returns the labels and each variant's settings.
fn variant_axis(src: &Source, parsed: &RecipeFile) -> Result<(Vec<String>, Vec<Vec<Setting>>), RecipeError> {
    let mut labels: Vec<String> = Vec::new();
    let mut variants = Vec::new();
    for (i, variant) in parsed.variants.iter().enumerate() {
        let mut label = None;
        let mut settings = Vec::new();
        for (k, v) in variant {
            let source = format!("variants.{i}.{}", k.as_str().unwrap_or_default());
            let Some(key) = k.as_str() else {
                return Err(src.at(&source, "variants: keys must be dotted config paths".into()));
            };
            if key == "label" {
                label = Some(value_text(v));
                continue;
            }
            settings.push(src.setting(key, v, &source)?);
        }
        let label = label.unwrap_or_else(|| {
            settings
                .iter()
                .map(|s| format!("{}={}", short_key(&s.key), short_value(&value_text(&s.value))))
                .collect::<Vec<_>>()
                .join(" ")
        });
        if labels.contains(&label) {
            return Err(src.at(&format!("variants.{i}"), format!("variants: two variants are labelled `{label}`")));
        }
        labels.push(label);
        variants.push(settings);
    }
    Ok((labels, variants))
}

/// A sweep value or a variant that sets a whole section (`transformer: {attention: {softcap: 0.5}}`) replaces
/// it, so the keys the recipe writes inside that section would silently go back to their defaults (a base
/// `d_model: 32` becoming 128): refused in one line that shows the dotted form. A recipe that means to
/// replace the section repeats in it the keys it keeps (`window: null` for a dense pattern).
fn refuse_replaced_sections(src: &Source, grid: &Grid) -> Result<(), RecipeError> {
    for setting in grid.axes.iter().flatten().chain(grid.variants.iter().flatten()) {
        if !matches!(setting.value, Value::Mapping(_)) {
            continue;
        }
        let given: Vec<String> = leaves(&setting.value).iter().map(|l| format!("{}.{l}", setting.key)).collect();
        let inside = format!("{}.", setting.key);
        let lost: Vec<&String> =
            grid.written_keys.iter().filter(|w| w.starts_with(&inside) && !given.contains(w)).collect();
        let Some(first) = lost.first() else { continue };
        let dotted = match (given.first(), leaf_at(&setting.value, given.first().map(|g| &g[inside.len()..]))) {
            (Some(key), Some(value)) => format!("`{key}: {}`", value_text(&value)),
            _ => format!("`{}.<key>: <value>`", setting.key),
        };
        return Err(src.at(
            &setting.source,
            format!(
                "{}: replaces the whole section, so what the recipe writes in it ({first}{}) would go back to the defaults; set only what changes, dotted ({dotted}), or repeat in it the keys to keep",
                setting.key,
                if lost.len() > 1 { format!(" and {} more", lost.len() - 1) } else { String::new() }
            ),
        ));
    }
    Ok(())
}

/// The value at dotted path `path` inside `value`.
fn leaf_at(value: &Value, path: Option<&str>) -> Option<Value> {
    let mut at = value;
    for part in path?.split('.') {
        at = at.as_mapping()?.get(Value::String(part.to_string()))?;
    }
    Some(at.clone())
}

/// A typo such as a long list under several keys can multiply into more runs than any sweep means to have
/// (and than memory holds): refused before expanding.
fn check_grid_size(src: &Source, sizes: &[usize], seeds: usize) -> Result<(), RecipeError> {
    let count = sizes.iter().try_fold(seeds as u128, |n, &a| n.checked_mul(a as u128)).unwrap_or(u128::MAX);
    if count > MAX_RUNS {
        return Err(src.at(
            "sweep",
            format!(
                "sweep: the grid times the seeds is {count} runs; at most {MAX_RUNS} (split the recipe, or shard it)"
            ),
        ));
    }
    Ok(())
}

/// What the expansion crosses: the axes (the variants axis first, when there is one), the settings every
/// run takes after them, and the written sections they are laid over.
struct Grid<'a> {
    axes: &'a [Vec<Setting>],
    variants: &'a [Vec<Setting>],
    variant_labels: &'a [String],
    sweep_keys: &'a [String],
    /// With --smoke: the recipe's `smoke:` settings.
    smoke: Option<&'a [Setting]>,
    overrides: &'a [Setting],
    /// The dotted keys of the written sections, each blamed on its own line.
    written_keys: Vec<String>,
    written: &'a Mapping,
    /// The file's `kind:`.
    kind: Option<Kind>,
}

/// The keys the recipe set for one run, each with the recipe path (or argument) to blame.
type SetKeys = Vec<(String, String)>;

/// Every point of the grid times every seed, as a run; with, per run, the keys the recipe set for it.
fn expand(
    src: &Source,
    grid: &Grid,
    sizes: &[usize],
    seeds: &[u64],
) -> Result<(Vec<RunSpec>, Vec<SetKeys>), RecipeError> {
    let mut runs = Vec::new();
    let mut set_per_run = Vec::new();
    for point in sizes.iter().map(|&n| 0..n).multi_cartesian_product_or_unit() {
        for &seed in seeds {
            let (run, set) = build_run(src, grid, &point, seed)?;
            runs.push(run);
            set_per_run.push(set);
        }
    }
    Ok((runs, set_per_run))
}

/// The run at one point of the grid with one seed: its settings laid over its kind's defaults and the
/// written sections, shrunk with --smoke, read into a config; its id and label from the swept values.
fn build_run(src: &Source, grid: &Grid, point: &[usize], seed: u64) -> Result<(RunSpec, SetKeys), RecipeError> {
    let mut settings: Vec<&Setting> = Vec::new();
    let mut swept = Vec::new();
    for (axis, &i) in point.iter().enumerate() {
        if axis == 0 && !grid.variants.is_empty() {
            settings.extend(grid.variants[i].iter());
            swept.push(("variant".to_string(), grid.variant_labels[i].clone()));
        } else {
            let s = &grid.axes[axis][i];
            settings.push(s);
            swept.push((s.key.clone(), value_text(&s.value)));
        }
    }
    settings.extend(grid.smoke.unwrap_or_default().iter());
    settings.extend(grid.overrides.iter());
    let kind = match settings.iter().rev().find(|s| s.key == "kind") {
        Some(s) => serde_yaml::from_value::<Kind>(s.value.clone())
            .map_err(|e| src.at(&s.source, format!("kind: {}", explain_serde_error(&e.to_string()))))?,
        None => grid.kind.ok_or_else(|| {
            let names: Vec<&str> = Kind::ALL.iter().map(|k| k.name()).collect();
            let (last, rest) = names.split_last().expect("there are kinds");
            src.err(1, format!("kind: missing: say what the recipe trains (kind: {} or {last})", rest.join(", ")))
        })?,
    };
    let defaults = to_value(&Config::defaults(kind));
    let mut value = defaults.clone();
    merge(&mut value, Value::Mapping(grid.written.clone()));
    let mut set: SetKeys = grid.written_keys.iter().map(|k| (k.clone(), k.clone())).collect();
    for s in settings.iter().filter(|s| s.key != "kind") {
        // A section's unset keys take the kind's defaults, not the base recipe's.
        let mut new = get_path(&defaults, &s.key).cloned().unwrap_or(Value::Null);
        if matches!((&new, &s.value), (Value::Mapping(_), Value::Mapping(_))) {
            merge(&mut new, s.value.clone());
        } else {
            new = s.value.clone();
        }
        set_path(&mut value, &s.key, new);
        for leaf in leaves(&s.value) {
            let key = if leaf.is_empty() { s.key.clone() } else { format!("{}.{leaf}", s.key) };
            set.push((key, s.source.clone()));
        }
    }
    set_path(&mut value, "kind", serde_yaml::to_value(kind).expect("a kind serialises"));
    set_path(&mut value, "train.seed", Value::from(seed));
    if grid.smoke.is_some() {
        shrink_for_smoke(&mut value, kind, grid.sweep_keys, &settings);
    }
    let config: Config = serde_yaml::from_value(value).map_err(|e| {
        let msg = explain_serde_error(&e.to_string());
        let key = msg.split(':').next().unwrap_or("").to_string();
        let source =
            set.iter().rev().find(|(k, _)| *k == key || k.starts_with(&format!("{key}."))).map(|(_, s)| s.clone());
        src.at(source.as_deref().unwrap_or(&key), msg)
    })?;
    let mut id_parts: Vec<String> = swept.iter().map(|(k, v)| format!("{k}={v}")).collect();
    let label = swept
        .iter()
        .map(|(k, v)| if k == "variant" { v.clone() } else { format!("{}={}", short_key(k), short_value(v)) })
        .collect::<Vec<_>>()
        .join(" ");
    id_parts.push(format!("seed={seed}"));
    let run = RunSpec {
        id: id_parts.join(" "),
        label: if label.is_empty() { "base".into() } else { label },
        swept,
        seed,
        config,
        config_hash: String::new(),
        tune: None,
    };
    Ok((run, set))
}

/// A key the recipe sets must act in at least one of the runs it is set for; the first (by line) that
/// acts in none is refused with the reason. A run that does not read a key leaves it out of its columns.
fn refuse_unread_keys(src: &Source, runs: &[RunSpec], set_per_run: &[SetKeys]) -> Result<(), RecipeError> {
    let mut refused: Vec<(String, String)> = Vec::new();
    let all_set: BTreeSet<(String, String)> = set_per_run.iter().flatten().cloned().collect();
    for (key, source) in &all_set {
        let setting_runs: Vec<&RunSpec> = runs
            .iter()
            .zip(set_per_run)
            .filter(|(_, set)| set.iter().any(|(k, s)| k == key && s == source))
            .map(|(r, _)| r)
            .collect();
        let reasons: Vec<String> = setting_runs.iter().filter_map(|r| reads::unread(&r.config, key)).collect();
        if !setting_runs.is_empty() && reasons.len() == setting_runs.len() {
            refused.push((source.clone(), format!("{key}: {}", reasons[0])));
        }
    }
    match refused.into_iter().min_by_key(|(s, _)| src.lines.line(s)) {
        Some((source, message)) => Err(src.at(&source, message)),
        None => Ok(()),
    }
}

/// Validates every run, blaming a problem on where the key was set for that run, else the swept value that
/// made the run, else the key's own line; then fills derived keys and the config hash.
fn validate_runs(src: &Source, runs: &mut [RunSpec], set_per_run: &[SetKeys]) -> Result<(), RecipeError> {
    for (run, set) in runs.iter_mut().zip(set_per_run) {
        let blame = |key: &str| -> String {
            if let Some((_, source)) = set.iter().rev().find(|(k, _)| k == key) {
                return source.clone();
            }
            if src.lines.has(key) || src.lines.argument(key).is_some() {
                return key.to_string();
            }
            match set.iter().rev().find(|(_, s)| s.starts_with("sweep.") || s.starts_with("variants.")) {
                Some((_, source)) => source.clone(),
                None => key.to_string(),
            }
        };
        run.config.validate().map_err(|inv| src.at(&blame(&inv.key), format!("{}: {}", inv.key, inv.message)))?;
        run.config.resolve();
        run.config_hash = config_hash(&run.config);
    }
    Ok(())
}

/// The most runs one recipe may expand to.
/// The most runs a recipe may expand to (with `--until-settled`, counting every seed an arm may end with).
pub const MAX_RUNS: u128 = 100_000;

/// The cartesian product of index ranges, first range slowest; one empty point when there are none.
trait Product {
    fn multi_cartesian_product_or_unit(self) -> Vec<Vec<usize>>;
}

impl<I: Iterator<Item = std::ops::Range<usize>>> Product for I {
    fn multi_cartesian_product_or_unit(self) -> Vec<Vec<usize>> {
        use itertools::Itertools;
        let ranges: Vec<_> = self.collect();
        if ranges.is_empty() {
            return vec![Vec::new()];
        }
        ranges.into_iter().multi_cartesian_product().collect()
    }
}

/// The dotted paths of every leaf below `value` (sequences and scalars are leaves); `""` for a leaf itself.
fn leaves(value: &Value) -> Vec<String> {
    match value {
        Value::Mapping(m) if !m.is_empty() => m
            .iter()
            .flat_map(|(k, v)| {
                let k = k.as_str().unwrap_or_default().to_string();
                leaves(v).into_iter().map(move |l| if l.is_empty() { k.clone() } else { format!("{k}.{l}") })
            })
            .collect(),
        Value::Mapping(_) => Vec::new(),
        _ => vec![String::new()],
    }
}

/// Every leaf of the config the run reads, as (dotted key, text value), in declaration order: the run's
/// columns in `runs.csv`, and what its hash covers.
pub fn columns(config: &Config) -> Vec<(String, String)> {
    fn walk(prefix: &str, v: &Value, out: &mut Vec<(String, String)>) {
        match v {
            Value::Mapping(m) => {
                for (k, v) in m {
                    let k = k.as_str().unwrap_or_default();
                    let key = if prefix.is_empty() { k.to_string() } else { format!("{prefix}.{k}") };
                    walk(&key, v, out);
                }
            }
            Value::Null => out.push((prefix.to_string(), String::new())),
            Value::Sequence(items) => out.push((prefix.to_string(), serde_json::to_string(items).unwrap_or_default())),
            Value::String(s) => out.push((prefix.to_string(), s.clone())),
            other => {
                out.push((prefix.to_string(), serde_yaml::to_string(other).unwrap_or_default().trim().to_string()))
            }
        }
    }
    let mut out = Vec::new();
    walk("", &to_value(config), &mut out);
    out.retain(|(k, _)| reads::unread(config, k).is_none() && !reads::silent_default(config, k));
    out
}

/// The config as YAML with only the keys the run reads (what `recipe.resolved.yaml` records).
pub fn read_value(config: &Config) -> Value {
    fn prune(prefix: &str, v: &mut Value, config: &Config) -> bool {
        match v {
            Value::Mapping(m) => {
                let keys: Vec<Value> = m.keys().cloned().collect();
                for k in keys {
                    let name = k.as_str().unwrap_or_default();
                    let key = if prefix.is_empty() { name.to_string() } else { format!("{prefix}.{name}") };
                    let keep = prune(&key, m.get_mut(&k).expect("listed"), config);
                    if !keep {
                        m.remove(&k);
                    }
                }
                !m.is_empty()
            }
            _ => reads::unread(config, prefix).is_none() && !reads::silent_default(config, prefix),
        }
    }
    let mut value = to_value(config);
    prune("", &mut value, config);
    value
}

/// Bumped whenever a default of the schema changes (`Config::defaults`, `Config::resolve`): runs that
/// relied on the old default then hash differently and train again.
const DEFAULTS_VERSION: &str = "defaults v1";

/// Short hash of what a run computes: the columns it reads whose values differ from its kind's defaults,
/// and the version of those defaults. A knob added later at a default that keeps the old behaviour leaves
/// every earlier run's hash (and so its place in `runs.csv`) as it was.
pub fn config_hash(config: &Config) -> String {
    let mut defaults = Config::defaults(config.kind);
    defaults.resolve();
    let default_columns: std::collections::HashMap<String, String> = columns(&defaults).into_iter().collect();
    let mut text = format!("{DEFAULTS_VERSION}\nkind={}\n", config.kind);
    for (k, v) in columns(config) {
        if default_columns.get(&k) != Some(&v) {
            text.push_str(&format!("{k}={v}\n"));
        }
    }
    Sha256::digest(text.as_bytes()).iter().take(6).map(|b| format!("{b:02x}")).collect()
}

/// The seeds a `--smoke` run keeps of the recipe's (its first ones), unless `--seeds` lists them.
const SMOKE_SEEDS: usize = 2;

/// Shrinks a run to seconds without changing the recipe's shape: every key the recipe sets for the run
/// (swept, or in a variant) keeps its value, and only keys the kind reads are touched.
fn shrink_for_smoke(value: &mut Value, kind: Kind, sweep_keys: &[String], settings: &[&Setting]) {
    let kept = |k: &str| sweep_keys.iter().any(|s| s == k) || settings.iter().any(|s| s.key == k);
    let value_embeddings = get_path(value, "transformer.value_embeddings").and_then(Value::as_i64).unwrap_or(0);
    // A budget in tokens or FLOPs can need many steps (more still on the smoke run's smaller model): a smoke
    // run ends after one second of training instead, even where the budget is swept (a compute ladder keeps
    // its rungs' labels, and its runs their ids, but not their compute).
    if get_path(value, "train.budget").is_some_and(|b| !b.is_null()) {
        let mut one_second = Mapping::new();
        one_second.insert(Value::from("seconds"), Value::from(1.0));
        set_path(value, "train.budget", Value::Mapping(one_second));
    }
    // A whole test split (`test_batches: all`, 10,000 images) read by every smoke run would take most of the
    // smoke's time: two batches show the path works.
    if !kept("train.test_batches") && get_path(value, "train.test_batches").is_some_and(|b| !b.is_null()) {
        set_path(value, "train.test_batches", Value::from(2));
    }
    let mut cap = |key: &str, max: i64| {
        if kept(key) {
            return;
        }
        let current = get_path(value, key).and_then(Value::as_i64);
        if current.is_none_or(|c| c > max) {
            set_path(value, key, Value::from(max));
        }
    };
    cap("train.steps", 6);
    cap("train.eval_interval", 3);
    cap("train.eval_batches", 1);
    cap("train.log_interval", 2);
    cap("train.batch_size", 4);
    cap("train.warmup_steps", 2);
    if matches!(kind, Kind::Lm | Kind::Bert | Kind::Vit | Kind::ImageGpt | Kind::SeqClassify) {
        // Value embeddings' tables feed the first and the last N layers, which must not overlap.
        cap("transformer.layers", 2.max(2 * value_embeddings));
    }
    if kind == Kind::SeqClassify {
        // The sequences keep their length (the recipe's point); the data shrinks to what six steps read.
        cap("seq_classify.train_examples", 64);
        cap("seq_classify.eval_examples", 32);
    }
    if kind.is_text() {
        cap("transformer.block_size", 32);
    }
    if matches!(kind, Kind::Lm | Kind::Bert) {
        cap("data.max_chars", 50_000);
    }
    // Pre-training length is capped even when swept: the smoke run keeps "none" (0) apart from "some".
    for key in ["bert.pretrain_steps", "vision.pretrain_steps"] {
        if let Some(steps) = get_path(value, key).and_then(Value::as_i64) {
            if steps > 4 {
                set_path(value, key, Value::from(4));
            }
        }
    }
}

/// The last part of a dotted key, for legends.
fn short_key(key: &str) -> &str {
    key.rsplit('.').next().unwrap_or(key)
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
        if !v.is_mapping() {
            *v = Value::Mapping(Mapping::new());
        }
        v = v.as_mapping_mut().expect("made a mapping above").entry(Value::from(part)).or_insert(Value::Null);
    }
    *v = new;
}

/// Checks that `dotted` names a config value, with a did-you-mean and the allowed keys if not.
fn check_path(template: &Value, dotted: &str) -> Result<(), String> {
    let mut v = template;
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
                let renamed =
                    if dotted.starts_with("model.") { " (the `model` section is now `transformer`)" } else { "" };
                return Err(format!(
                    "unknown config key `{dotted}`{hint}{renamed}; allowed under {}: {}",
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
        .map(|c| (strsim::levenshtein(word, c), c))
        .filter(|(d, c)| *d <= 2.max(c.len() / 3))
        .min_by_key(|(d, _)| *d)
        .map(|(_, c)| c.as_str())
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
            if field == "model" {
                return format!("{message} (the `model` section is now `transformer`)");
            }
            if let Some(c) = closest(field, &allowed) {
                return format!("{message} (did you mean `{c}`?)");
            }
        }
    }
    message.to_string()
}
