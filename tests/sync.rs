//! What a training step asks of the host: on a GPU every read of a value to the host
//! (`aten::_local_scalar_dense`, behind `item()` / `double_value`) makes the host wait for the device and
//! stops it queueing the next step, and every operator is at least one kernel launch. Both are counted on
//! the CPU under libtorch's profiler, per step in steady state (the difference between a run of 2n and
//! one of n steps, divided by n: evaluation, set-up and the end cancel), and held to a budget. Batches are
//! drawn on the CPU by design (the same stream on every device), so only reads made by the training
//! step's own code count.
mod common;

/// (host reads, operators) per training step of a decoder shaped by `model` (transformer keys), clipped,
/// logging every `log` steps.
fn per_step(model: &str, log: i64, extra: &str) -> (f64, f64) {
    let corpus = common::corpus_file("sync", &"the quick brown fox jumps over the lazy dog. ".repeat(80));
    let counts = |steps: i64| {
        let cfg = common::config(&format!(
            "kind: lm\ntransformer:\n{model}data:\n  path: {}\n\
             train:\n  steps: {steps}\n  batch_size: 4\n  eval_interval: 1000\n  eval_batches: 1\n  log_interval: {log}\n  \
             grad_clip: 1.0\n{extra}",
            corpus.display()
        ));
        let ((), ops) = ablate::train::native::profile(false, || {
            common::train(&cfg);
        })
        .unwrap();
        let reads = ablate::run::bench::host_reads(&ops);
        (reads as f64, ops.len() as f64)
    };
    let n = 2 * log;
    let (short, long) = (counts(n), counts(2 * n));
    ((long.0 - short.0) / n as f64, (long.1 - short.1) / n as f64)
}

const SMALL: &str = "  d_model: 16\n  layers: 2\n  heads: 2\n  block_size: 16\n";
/// recipes/heads.yaml's model at 4 heads (its batch is 12; 4 here keeps the test short: the counts do not
/// depend on the batch).
const HEADS: &str =
    "  d_model: 128\n  layers: 4\n  heads: 4\n  block_size: 64\n  pe: learned\n  pre_ln: false\n  dropout: 0.0\n";

#[test]
fn a_training_step_reads_nothing_back_to_the_host_between_log_steps() {
    // Measured (this test's numbers, torch 2.11.0 on the CPU): before, 2.00 host reads and 1232 operators
    // per step (small), 2.00 and 2467 (heads); after, 0.10 and 1166 (small), 0.10 and 2129 (heads):
    // results/bench/host_sync.md.
    for (name, model, budget) in [("small", SMALL, 1200.0), ("heads", HEADS, 2200.0)] {
        let (reads, ops) = per_step(model, 10, "");
        eprintln!("{name}: per step {reads:.2} host reads, {ops:.0} operators");
        // One read of the gradient norm per log step (the losses come back in one copy, not a scalar
        // read): 0.1 per step at a log interval of 10. Before: 2 per step (the loss and the norm).
        assert!(reads <= 0.2, "{name}: {reads} host reads per step");
        // Forward, backward and the fused update; the clipping is two foreach calls, not a norm and a
        // multiply per parameter tensor.
        assert!(ops <= budget, "{name}: {ops} operators per step");
    }
}

/// The source of every `fn NAME` in `file` (its signature and body, braces matched).
fn functions(file: &str, name: &str) -> Vec<String> {
    let text = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/src/").to_string() + file).unwrap();
    let mut out = Vec::new();
    let mut rest = text.as_str();
    while let Some(at) = rest.find(&format!("fn {name}(")) {
        let body = &rest[at..];
        let open = body.find('{').unwrap();
        let mut depth = 0;
        let mut end = open;
        for (i, c) in body[open..].char_indices() {
            match c {
                '{' => depth += 1,
                '}' => depth -= 1,
                _ => {}
            }
            if depth == 0 {
                end = open + i;
                break;
            }
        }
        out.push(body[..=end].to_string());
        rest = &body[end..];
    }
    assert!(!out.is_empty(), "no fn {name} in src/{file}");
    out
}

/// The `.to(…)` / `.to_device(…)` calls in `code` that copy to a variable device (not back to the CPU).
fn plain_device_copies(code: &str) -> Vec<String> {
    let mut out = Vec::new();
    for call in [".to(", ".to_device("] {
        let mut rest = code;
        while let Some(at) = rest.find(call) {
            let args = &rest[at + call.len()..];
            let argument: String = args.chars().take_while(|&c| c != ')').collect();
            if argument.contains("device") && !argument.contains("Device::Cpu") {
                out.push(format!("{call}{argument})"));
            }
            rest = args;
        }
    }
    out
}

#[test]
fn every_training_batch_reaches_the_device_through_pinned_memory() {
    // A copy from pageable host memory waits for the GPU's queue to drain (CUDA's rule), so each one in a
    // training step is a hidden sync the CPU's read count above cannot see: every batch goes through
    // data::to_device_async. The step of every kind, and the batch builders it calls.
    let steps = [
        ("tasks/lm.rs", "training_loss"),
        ("tasks/imagegpt.rs", "training_loss"),
        ("tasks/seq_classify.rs", "training_loss"),
        ("tasks/translate.rs", "training_loss"),
        ("tasks/translate.rs", "batch"),
        ("tasks/bert.rs", "training_loss"),
        ("tasks/bert.rs", "batch"),
        ("tasks/classify.rs", "training_loss"),
        ("data/text.rs", "train_batch"),
        ("data/text.rs", "batch"),
        ("data/images.rs", "train_batch"),
        ("data/corpus_tasks.rs", "rows"),
        ("transformer/attention/pattern.rs", "allowed"),
        ("transformer/attention/pattern.rs", "windowed"),
    ];
    let mut found = Vec::new();
    for (file, name) in steps {
        for code in functions(file, name) {
            found.extend(plain_device_copies(&code).into_iter().map(|c| format!("src/{file} fn {name}: {c}")));
        }
    }
    assert!(found.is_empty(), "plain (pageable) device copies in a training step: {found:#?}");
    // The test can see one: the evaluation batches of seq_classify are copied once, before training.
    assert!(!plain_device_copies(&functions("tasks/seq_classify.rs", "batches")[0]).is_empty());
}

#[test]
fn nothing_pins_memory_through_the_deprecated_overload() {
    // tch's `pin_memory(device)` / `f_pin_memory(device)` call libtorch's `pin_memory(Device)`, which prints
    // a deprecation warning on every call (two lines per batch tensor per step on a GPU); data::pin_memory
    // calls `Tensor::pin_memory()` with no device through csrc/fused.cpp.
    let files = common::rust_files(std::path::Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/src")));
    let offenders: Vec<String> = files
        .iter()
        .filter(|f| {
            let text = std::fs::read_to_string(f).unwrap();
            text.contains(".pin_memory(") || text.contains("f_pin_memory(")
        })
        .map(|f| f.display().to_string())
        .collect();
    assert!(offenders.is_empty(), "tch's pin_memory(device) is called in {offenders:?}");
    let shim = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/csrc/fused.cpp")).unwrap();
    assert!(shim.contains("t->pin_memory()"), "csrc/fused.cpp pins without a device");
    // Where nothing can pin (no accelerator, as on this CPU machine) the shim says so and the batch is
    // copied plainly; where something can, the pinned copy holds the same values.
    let t = tch::Tensor::arange(6, (tch::Kind::Int64, tch::Device::Cpu));
    if let Some(pinned) = ablate::data::pin_memory(&t) {
        assert_eq!(Vec::<i64>::try_from(&pinned).unwrap(), [0, 1, 2, 3, 4, 5]);
    }
}
