//! TensorBoard event files beside the CSV, so the viewers researchers already use (TensorBoard; W&B and Aim
//! import its files) open ablate's results. Under `<out>/tensorboard/`: one run directory per run with
//! every curve of `curves.csv` as scalars (tag `split/metric`: `val/loss`, `train/lr`, `train/grad_norm`)
//! and its final `runs.csv` metrics as `final/<column>` (throughput among them); and at the top, the
//! HParams plugin's experiment, so the HParams tab is the ablation table: the swept keys as
//! hyper-parameters, the final metrics as metrics, the seeds of a variant in one session group.
//!
//! The CSV files stay the source of truth: event files are derived from them after every finished run,
//! each written whole through a temporary file and a rename, so a kill leaves none half-written.
//!
//! Format: a file of records (little-endian u64 length, its masked CRC-32C, the bytes, their masked
//! CRC-32C), each an `Event` protobuf message (tensorboard/compat/proto/event.proto, summary.proto;
//! tensorboard/plugins/hparams/{api,plugin_data}.proto). The messages are declared here with prost's derive,
//! only the fields ablate writes, with the protos' field numbers.
use anyhow::Result;
use prost::Message;
use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};

use super::reading::Results;
use super::summary::{judgements, JudgedRow};
use super::verdicts;
use crate::files::write_atomically;
use crate::recipe::Recipe;
use crate::tasks::checkpoint::file_stem;

#[derive(Clone, PartialEq, Message)]
struct Event {
    #[prost(double, tag = "1")]
    wall_time: f64,
    #[prost(int64, tag = "2")]
    step: i64,
    #[prost(oneof = "What", tags = "3, 5")]
    what: Option<What>,
}

#[derive(Clone, PartialEq, prost::Oneof)]
enum What {
    #[prost(string, tag = "3")]
    FileVersion(String),
    #[prost(message, tag = "5")]
    Summary(Summary),
}

#[derive(Clone, PartialEq, Message)]
struct Summary {
    #[prost(message, repeated, tag = "1")]
    value: Vec<SummaryValue>,
}

#[derive(Clone, PartialEq, Message)]
struct SummaryValue {
    #[prost(string, tag = "1")]
    tag: String,
    /// A member of the proto's `value` oneof; absent for the hparams plugin's summaries, which carry
    /// everything in their metadata.
    #[prost(float, optional, tag = "2")]
    simple_value: Option<f32>,
    #[prost(message, optional, tag = "9")]
    metadata: Option<SummaryMetadata>,
    /// The `value` oneof's tensor member: the text plugin's string.
    #[prost(message, optional, tag = "8")]
    tensor: Option<TensorProto>,
}

/// `tensorflow.TensorProto`, only a scalar string (tensorflow/core/framework/tensor.proto).
#[derive(Clone, PartialEq, Message)]
struct TensorProto {
    #[prost(int32, tag = "1")]
    dtype: i32,
    #[prost(message, optional, tag = "2")]
    tensor_shape: Option<TensorShape>,
    #[prost(bytes = "vec", repeated, tag = "8")]
    string_val: Vec<Vec<u8>>,
}

/// `tensorflow.TensorShapeProto` with no dimensions: a scalar.
#[derive(Clone, PartialEq, Message)]
struct TensorShape {}

/// `tensorflow.DataType`'s DT_STRING.
const DT_STRING: i32 = 7;

#[derive(Clone, PartialEq, Message)]
struct SummaryMetadata {
    #[prost(message, optional, tag = "1")]
    plugin_data: Option<PluginData>,
}

#[derive(Clone, PartialEq, Message)]
struct PluginData {
    #[prost(string, tag = "1")]
    plugin_name: String,
    #[prost(bytes = "vec", tag = "2")]
    content: Vec<u8>,
}

#[derive(Clone, PartialEq, Message)]
struct HParamsPluginData {
    #[prost(int32, tag = "1")]
    version: i32,
    #[prost(oneof = "HParamsData", tags = "2, 3, 4")]
    data: Option<HParamsData>,
}

#[derive(Clone, PartialEq, prost::Oneof)]
enum HParamsData {
    #[prost(message, tag = "2")]
    Experiment(Experiment),
    #[prost(message, tag = "3")]
    SessionStartInfo(SessionStartInfo),
    #[prost(message, tag = "4")]
    SessionEndInfo(SessionEndInfo),
}

#[derive(Clone, PartialEq, Message)]
struct Experiment {
    #[prost(string, tag = "1")]
    description: String,
    #[prost(double, tag = "3")]
    time_created_secs: f64,
    #[prost(message, repeated, tag = "4")]
    hparam_infos: Vec<HParamInfo>,
    #[prost(message, repeated, tag = "5")]
    metric_infos: Vec<MetricInfo>,
}

/// `tensorboard.hparams.DataType`.
const DATA_TYPE_STRING: i32 = 1;
const DATA_TYPE_BOOL: i32 = 2;
const DATA_TYPE_FLOAT64: i32 = 3;
/// `tensorboard.hparams.Status`.
const STATUS_SUCCESS: i32 = 1;
const STATUS_FAILURE: i32 = 2;
/// `tensorboard.hparams.DatasetType`.
const DATASET_TRAINING: i32 = 1;
const DATASET_VALIDATION: i32 = 2;

#[derive(Clone, PartialEq, Message)]
struct HParamInfo {
    #[prost(string, tag = "1")]
    name: String,
    #[prost(string, tag = "3")]
    description: String,
    #[prost(int32, tag = "4")]
    r#type: i32,
    #[prost(message, optional, tag = "5")]
    domain_discrete: Option<ListValue>,
}

#[derive(Clone, PartialEq, Message)]
struct MetricInfo {
    #[prost(message, optional, tag = "1")]
    name: Option<MetricName>,
    #[prost(string, tag = "3")]
    display_name: String,
    #[prost(string, tag = "4")]
    description: String,
    #[prost(int32, tag = "5")]
    dataset_type: i32,
}

#[derive(Clone, PartialEq, Message)]
struct MetricName {
    #[prost(string, tag = "1")]
    group: String,
    #[prost(string, tag = "2")]
    tag: String,
}

#[derive(Clone, PartialEq, Message)]
struct SessionStartInfo {
    #[prost(map = "string, message", tag = "1")]
    hparams: HashMap<String, ProtoValue>,
    #[prost(string, tag = "4")]
    group_name: String,
    #[prost(double, tag = "5")]
    start_time_secs: f64,
}

#[derive(Clone, PartialEq, Message)]
struct SessionEndInfo {
    #[prost(int32, tag = "1")]
    status: i32,
    #[prost(double, tag = "2")]
    end_time_secs: f64,
}

/// `google.protobuf.Value`, the kinds a hyper-parameter takes.
#[derive(Clone, PartialEq, Message)]
struct ProtoValue {
    #[prost(oneof = "Kind", tags = "2, 3, 4")]
    kind: Option<Kind>,
}

#[derive(Clone, PartialEq, prost::Oneof)]
enum Kind {
    #[prost(double, tag = "2")]
    Number(f64),
    #[prost(string, tag = "3")]
    Text(String),
    #[prost(bool, tag = "4")]
    Bool(bool),
}

/// `google.protobuf.ListValue`.
#[derive(Clone, PartialEq, Message)]
struct ListValue {
    #[prost(message, repeated, tag = "1")]
    values: Vec<ProtoValue>,
}

/// The hparams plugin's summary tags and data version.
const EXPERIMENT_TAG: &str = "_hparams_/experiment";
const SESSION_START_TAG: &str = "_hparams_/session_start_info";
const SESSION_END_TAG: &str = "_hparams_/session_end_info";

/// The CRC-32C of `data`, masked as TFRecord stores it (a CRC of data that holds CRCs is weak otherwise).
fn masked_crc(data: &[u8]) -> u32 {
    let crc = crc32c::crc32c(data);
    (crc.rotate_right(15)).wrapping_add(0xa282_ead8)
}

/// One TFRecord: length, its masked CRC, the bytes, their masked CRC.
fn record(data: &[u8], out: &mut Vec<u8>) {
    let length = (data.len() as u64).to_le_bytes();
    out.extend_from_slice(&length);
    out.extend_from_slice(&masked_crc(&length).to_le_bytes());
    out.extend_from_slice(data);
    out.extend_from_slice(&masked_crc(data).to_le_bytes());
}

/// An event file's bytes: the version event, then `events`.
fn event_file(events: &[Event], wall_time: f64) -> Vec<u8> {
    let mut out = Vec::new();
    let version = Event { wall_time, step: 0, what: Some(What::FileVersion("brain.Event:2".into())) };
    record(&version.encode_to_vec(), &mut out);
    for e in events {
        record(&e.encode_to_vec(), &mut out);
    }
    out
}

fn scalar(tag: &str, step: i64, value: f64, wall_time: f64) -> Event {
    let value = SummaryValue { tag: tag.into(), simple_value: Some(value as f32), metadata: None, tensor: None };
    Event { wall_time, step, what: Some(What::Summary(Summary { value: vec![value] })) }
}

fn hparams_event(tag: &str, data: HParamsData, wall_time: f64) -> Event {
    let content = HParamsPluginData { version: 0, data: Some(data) }.encode_to_vec();
    let metadata = SummaryMetadata { plugin_data: Some(PluginData { plugin_name: "hparams".into(), content }) };
    let value = SummaryValue { tag: tag.into(), simple_value: None, metadata: Some(metadata), tensor: None };
    Event { wall_time, step: 0, what: Some(What::Summary(Summary { value: vec![value] })) }
}

/// A markdown text under `tag`, as the text plugin's summaries hold it (the TEXT tab renders it).
fn text_event(tag: &str, markdown: &str, wall_time: f64) -> Event {
    let metadata =
        SummaryMetadata { plugin_data: Some(PluginData { plugin_name: "text".into(), content: Vec::new() }) };
    let tensor = TensorProto {
        dtype: DT_STRING,
        tensor_shape: Some(TensorShape {}),
        string_val: vec![markdown.as_bytes().to_vec()],
    };
    let value = SummaryValue { tag: tag.into(), simple_value: None, metadata: Some(metadata), tensor: Some(tensor) };
    Event { wall_time, step: 0, what: Some(What::Summary(Summary { value: vec![value] })) }
}

/// A hyper-parameter's value as TensorBoard types it: numbers as numbers, true/false as booleans.
fn typed(text: &str) -> ProtoValue {
    let kind = match text {
        "true" => Kind::Bool(true),
        "false" => Kind::Bool(false),
        _ => match text.parse::<f64>() {
            Ok(x) if x.is_finite() => Kind::Number(x),
            _ => Kind::Text(text.to_string()),
        },
    };
    ProtoValue { kind: Some(kind) }
}

fn data_type(values: &[ProtoValue]) -> i32 {
    let all = |f: fn(&Kind) -> bool| values.iter().all(|v| v.kind.as_ref().is_some_and(f));
    if all(|k| matches!(k, Kind::Number(_))) {
        DATA_TYPE_FLOAT64
    } else if all(|k| matches!(k, Kind::Bool(_))) {
        DATA_TYPE_BOOL
    } else {
        DATA_TYPE_STRING
    }
}

/// The events file of a directory: one fixed name, rewritten whole.
fn events_path(dir: &Path) -> PathBuf {
    dir.join("events.out.tfevents.0.ablate")
}

/// The hyper-parameters of a run: its swept keys (a key with no column of its own, such as `variant` or a
/// swept section, by the run's swept value or its label). The seed is not one: the seeds of a variant are
/// the sessions of one group, which the HParams tab aggregates into one row.
fn hparams_of(recipe: &Recipe, row: &BTreeMap<String, String>) -> Vec<(String, String)> {
    recipe
        .sweep_keys
        .iter()
        .map(|k| {
            let value = row.get(k).cloned().or_else(|| {
                let spec = recipe.runs.iter().find(|r| r.id == row["run_id"])?;
                spec.swept.iter().find(|(key, _)| key == k).map(|(_, v)| v.clone())
            });
            (k.clone(), value.unwrap_or_else(|| row["label"].clone()))
        })
        .collect()
}

/// Writes `<dir>/tensorboard/` from `runs.csv` and `curves.csv`: the event file of every finished run that
/// has none yet (times spread over its recorded wall time, ending now), and the experiment, rewritten.
pub fn export(results: &Results) -> Result<()> {
    let (dir, recipe, rows) = (&results.dir, results.recipe, &results.runs);
    let curves = results.curves()?;
    let root = dir.join("tensorboard");
    std::fs::create_dir_all(&root)?;
    let now =
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs_f64()).unwrap_or(0.0);
    let final_metrics: Vec<_> = results.metrics.iter().filter(|m| m.headline && m.column_name().is_some()).collect();
    for row in rows {
        let run_dir = root.join(file_stem(&row["run_id"]));
        let path = events_path(&run_dir);
        if path.exists() {
            continue;
        }
        std::fs::create_dir_all(&run_dir)?;
        let wall: f64 = row.get("wall_s").and_then(|v| v.parse().ok()).unwrap_or(0.0);
        let steps: i64 = row.get("steps").and_then(|v| v.parse().ok()).unwrap_or(0).max(1);
        let start = now - wall;
        let at = |step: i64| start + wall * (step.clamp(0, steps) as f64 / steps as f64);
        let mut events = Vec::new();
        let group = row["label"].clone();
        let hparams: HashMap<String, ProtoValue> =
            hparams_of(recipe, row).into_iter().map(|(k, v)| (k, typed(&v))).collect();
        let start_info = SessionStartInfo { hparams, group_name: group, start_time_secs: start };
        events.push(hparams_event(SESSION_START_TAG, HParamsData::SessionStartInfo(start_info), start));
        let mut points: Vec<(i64, &str, f64)> = Vec::new();
        for (key, series) in curves.get(&row["run_id"]).into_iter().flatten() {
            points.extend(series.iter().map(|&(step, value)| (step, key.as_str(), value)));
        }
        // In step order, as a training loop would have written them.
        points.sort_by_key(|p| p.0);
        for (step, tag, value) in points {
            events.push(scalar(tag, step, value, at(step)));
        }
        let last = row.get("steps").and_then(|v| v.parse().ok()).unwrap_or(steps);
        for m in &final_metrics {
            let column = m.column_name().expect("filtered to columns");
            if let Some(v) = row.get(column).and_then(|v| v.parse::<f64>().ok()) {
                events.push(scalar(&format!("final/{column}"), last, v, now));
            }
        }
        let status = if row["status"] == "ok" { STATUS_SUCCESS } else { STATUS_FAILURE };
        let end = SessionEndInfo { status, end_time_secs: now };
        events.push(hparams_event(SESSION_END_TAG, HParamsData::SessionEndInfo(end), now));
        write_atomically(&path, &event_file(&events, start))?;
    }
    // The experiment: every hyper-parameter with the values the runs took, every final metric.
    let mut names: Vec<String> = Vec::new();
    let mut domains: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for row in rows {
        for (k, v) in hparams_of(recipe, row) {
            if !names.contains(&k) {
                names.push(k.clone());
            }
            let seen = domains.entry(k).or_default();
            if !seen.contains(&v) {
                seen.push(v);
            }
        }
    }
    let hparam_infos = names
        .iter()
        .map(|name| {
            let values: Vec<ProtoValue> = domains[name].iter().map(|v| typed(v)).collect();
            HParamInfo {
                name: name.clone(),
                description: format!("swept key {name}"),
                r#type: data_type(&values),
                domain_discrete: Some(ListValue { values }),
            }
        })
        .collect();
    // The verdicts, where the recipe compares: each metric's in its HParams description, the whole block in
    // the TEXT tab.
    let (verdict_text, judged) = verdicts_of(results);
    let metric_infos = final_metrics
        .iter()
        .filter(|m| rows.iter().any(|r| r.get(m.column_name().unwrap_or_default()).is_some_and(|v| !v.is_empty())))
        .map(|m| {
            let column = m.column_name().expect("filtered to columns");
            MetricInfo {
                name: Some(MetricName { group: String::new(), tag: format!("final/{column}") }),
                display_name: results.declarations.heading(m),
                description: metric_description(column, &judged),
                dataset_type: if column.starts_with("train") { DATASET_TRAINING } else { DATASET_VALIDATION },
            }
        })
        .collect();
    let experiment = Experiment {
        description: recipe.description.clone().unwrap_or_else(|| recipe.name.clone()),
        time_created_secs: now,
        hparam_infos,
        metric_infos,
    };
    let mut events = vec![hparams_event(EXPERIMENT_TAG, HParamsData::Experiment(experiment), now)];
    if let Some(text) = verdict_text {
        events.push(text_event(VERDICTS_TAG, &text, now));
    }
    write_atomically(&events_path(&root), &event_file(&events, now))
}

/// The text tag of the verdicts, in the top-level run (`.`).
pub const VERDICTS_TAG: &str = "verdicts";

/// The verdict block of `dir` as `ablate summary --readme` writes it (without its HTML markers, which the
/// TEXT tab would print), and its judged rows, where the recipe compares. A sweep whose baseline has not
/// finished yet has none, and the text says why instead.
fn verdicts_of(results: &Results) -> (Option<String>, Vec<JudgedRow>) {
    let (dir, recipe) = (&results.dir, results.recipe);
    let not_yet = |e: anyhow::Error| Some(format!("No verdicts yet: {e:#}"));
    let rows = match judgements(results) {
        Ok(None) => return (None, Vec::new()),
        Ok(Some(j)) => j.rows,
        Err(e) => return (not_yet(e), Vec::new()),
    };
    let command = format!("ablate summary {} --out {}", recipe.file, dir.display());
    let text = match verdicts::block(results, &command) {
        Ok(block) => Some(block.lines().filter(|l| !l.starts_with("<!--")).collect::<Vec<_>>().join("\n")),
        Err(e) => not_yet(e),
    };
    (text, rows)
}

/// A final metric's description in the HParams tab: its `runs.csv` column, then each comparison's verdict.
fn metric_description(column: &str, judged: &[JudgedRow]) -> String {
    let verdicts: Vec<String> = judged
        .iter()
        .filter(|r| r.metric.column_name() == Some(column))
        .map(|r| format!("{}: {}", r.comparison, r.judged.verdict.describe(&r.judged.delta_text)))
        .collect();
    if verdicts.is_empty() {
        format!("runs.csv column {column}")
    } else {
        format!("runs.csv column {column}; verdicts: {}", verdicts.join("; "))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn masked_crc_matches_tfrecord() {
        // CRC-32C check value of "123456789" is 0xE3069283 (RFC 3720 appendix B.4).
        assert_eq!(crc32c::crc32c(b"123456789"), 0xE306_9283);
        // tensorboard.compat.tensorflow_stub.pywrap_tensorflow.masked_crc32c of the same bytes, and of the
        // length field of a 3-byte record.
        assert_eq!(masked_crc(b"123456789"), 0xc78a_b0e5);
        assert_eq!(masked_crc(&3u64.to_le_bytes()), 0x0e49_99b0);
    }

    #[test]
    fn records_frame_their_bytes() {
        let mut out = Vec::new();
        record(b"abc", &mut out);
        assert_eq!(out.len(), 8 + 4 + 3 + 4);
        assert_eq!(u64::from_le_bytes(out[..8].try_into().unwrap()), 3);
        assert_eq!(&out[12..15], b"abc");
        let event = scalar("val/loss", 7, 2.5, 1.0);
        let decoded = Event::decode(event.encode_to_vec().as_slice()).unwrap();
        assert_eq!(decoded, event);
    }

    #[test]
    fn hyper_parameters_are_typed() {
        assert_eq!(typed("4").kind, Some(Kind::Number(4.0)));
        assert_eq!(typed("true").kind, Some(Kind::Bool(true)));
        assert_eq!(typed("rope").kind, Some(Kind::Text("rope".into())));
        assert_eq!(data_type(&[typed("1"), typed("2")]), DATA_TYPE_FLOAT64);
        assert_eq!(data_type(&[typed("1"), typed("x")]), DATA_TYPE_STRING);
    }
}
