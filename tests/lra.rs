//! The Long Range Arena generators (`data::lra`): ListOps labels against an independent evaluation of the
//! printed expression, Pathfinder labels against the image's own connectivity, lengths, balance, disjoint
//! splits and determinism, and `ablate data`'s JSON lines for every task.
mod common;
use ablate::data::lra::{self, listops, pathfinder, Example, Split};
use ablate::models::seq_classifier::SeqClassifier;
use std::collections::HashSet;

/// Evaluates LRA's printed tokens with a stack, apart from the generator's tree: the value, the deepest
/// nesting and the most arguments of an operator.
fn evaluate(text: &str) -> (u32, usize, usize) {
    let mut stack: Vec<(String, Vec<u32>)> = Vec::new();
    let (mut deepest, mut widest) = (0, 0);
    let mut result = None;
    for token in text.split(' ') {
        match token {
            "]" => {
                let (op, args) = stack.pop().expect("balanced");
                widest = widest.max(args.len());
                let mut sorted = args.clone();
                sorted.sort();
                let value = match op.as_str() {
                    "[MAX" => *sorted.last().unwrap(),
                    "[MIN" => sorted[0],
                    "[SM" => args.iter().sum::<u32>() % 10,
                    // numpy's median of non-negative digits, truncated as int() does.
                    "[MED" => {
                        let n = sorted.len();
                        let median = if n % 2 == 1 {
                            sorted[n / 2] as f64
                        } else {
                            (sorted[n / 2 - 1] + sorted[n / 2]) as f64 / 2.0
                        };
                        median as u32
                    }
                    other => panic!("unknown operator {other}"),
                };
                match stack.last_mut() {
                    Some((_, parent)) => parent.push(value),
                    None => result = Some(value),
                }
            }
            op if op.starts_with('[') => {
                stack.push((op.to_string(), Vec::new()));
                deepest = deepest.max(stack.len());
            }
            digit => stack.last_mut().expect("a digit inside an operator").1.push(digit.parse().unwrap()),
        }
    }
    (result.expect("one whole expression"), deepest, widest)
}

fn text(e: &Example) -> String {
    e.tokens.iter().map(|&t| listops::token_name(t)).collect::<Vec<_>>().join(" ")
}

#[test]
fn listops_labels_equal_an_independent_evaluation_within_lras_limits_and_lengths() {
    let _serial = common::serial();
    for (lo, hi) in [(10, 40), (500, 2000)] {
        let spec = listops::Spec::lengths(lo, hi);
        let examples =
            lra::examples_of(3, Split::Train, if hi > 100 { 60 } else { 500 }, |r| listops::generate(r, &spec));
        for e in &examples {
            let (value, depth, args) = evaluate(&text(e));
            assert_eq!(value, e.label, "{}", text(e));
            assert!((lo..=hi).contains(&e.tokens.len()), "length {} outside {lo}–{hi}", e.tokens.len());
            assert!(depth <= 10 && args <= 10, "depth {depth}, arguments {args}");
        }
    }
}

#[test]
fn med_of_an_even_count_is_the_truncated_mean_of_the_middle_two() {
    let _serial = common::serial();
    assert_eq!(listops::Op::Med.apply(&[1, 2]), 1);
    assert_eq!(listops::Op::Med.apply(&[9, 2, 4, 3]), 3);
    assert_eq!(listops::Op::Med.apply(&[7, 7, 1]), 7);
    assert_eq!(listops::Op::Sm.apply(&[9, 8, 7]), 4);
}

#[test]
fn listops_labels_cover_every_class_within_stated_bounds() {
    let _serial = common::serial();
    // ListOps is not balanced (nor is LRA's): MIN and MAX pull towards 0 and 9. Measured over 2,000
    // expressions of 100–300 tokens: every class between 2% and 40%.
    let spec = listops::Spec::lengths(100, 300);
    let examples = lra::examples_of(1, Split::Train, 2000, |r| listops::generate(r, &spec));
    let mut counts = [0usize; 10];
    for e in &examples {
        counts[e.label as usize] += 1;
    }
    for (class, &c) in counts.iter().enumerate() {
        let share = c as f64 / 2000.0;
        assert!((0.02..0.40).contains(&share), "class {class}: {share} ({counts:?})");
    }
}

#[test]
fn splits_are_disjoint_and_a_seed_gives_the_same_examples() {
    let _serial = common::serial();
    let spec = listops::Spec::lengths(6, 12);
    let draw = |seed, split| lra::examples_of(seed, split, 200, |r| listops::generate(r, &spec));
    let [train, validation, test] = [Split::Train, Split::Validation, Split::Test].map(|s| draw(7, s));
    let seen: HashSet<&Vec<u32>> = train.iter().map(|e| &e.tokens).collect();
    assert!(
        validation.iter().chain(&test).all(|e| !seen.contains(&e.tokens)),
        "short expressions repeat, yet never across splits"
    );
    let val: HashSet<&Vec<u32>> = validation.iter().map(|e| &e.tokens).collect();
    assert!(test.iter().all(|e| !val.contains(&e.tokens)));
    assert_eq!(draw(7, Split::Test), test);
    assert_ne!(draw(8, Split::Test), test);
    let pf = pathfinder::Spec::sized(32, 14);
    let images = |seed| lra::try_examples_of(seed, Split::Validation, 20, |r| pathfinder::generate(r, &pf)).unwrap();
    assert_eq!(images(2), images(2));
}

/// The dots of a Pathfinder image: centres of 3×3 squares of lit pixels (overlapping squares count once).
fn dots(px: &[u32], n: usize) -> Vec<(usize, usize)> {
    let lit = |r: usize, c: usize| px[r * n + c] > 0;
    let mut out: Vec<(usize, usize)> = Vec::new();
    for r in 1..n - 1 {
        for c in 1..n - 1 {
            let full = (r - 1..=r + 1).all(|rr| (c - 1..=c + 1).all(|cc| lit(rr, cc)));
            if full && !out.iter().any(|&(a, b)| a.abs_diff(r) <= 2 && b.abs_diff(c) <= 2) {
                out.push((r, c));
            }
        }
    }
    out
}

/// Whether `a` and `b` are joined by lit pixels, gaps of up to `bridge` pixels (Chebyshev) crossed: the
/// dashes of one contour are that close, different contours never are.
fn joined(px: &[u32], n: usize, a: (usize, usize), b: (usize, usize), bridge: usize) -> bool {
    let mut seen = vec![false; n * n];
    let mut todo = vec![a];
    seen[a.0 * n + a.1] = true;
    while let Some((r, c)) = todo.pop() {
        if (r, c) == b {
            return true;
        }
        for rr in r.saturating_sub(bridge)..=(r + bridge).min(n - 1) {
            for cc in c.saturating_sub(bridge)..=(c + bridge).min(n - 1) {
                if px[rr * n + cc] > 0 && !seen[rr * n + cc] {
                    seen[rr * n + cc] = true;
                    todo.push((rr, cc));
                }
            }
        }
    }
    false
}

#[test]
fn every_pathfinder_positive_joins_its_dots_and_no_negative_does_and_labels_are_balanced() {
    let _serial = common::serial();
    for (size, length) in [(32, 14), (32, 20)] {
        let spec = pathfinder::Spec::sized(size, length);
        let examples = lra::try_examples_of(5, Split::Train, 300, |r| pathfinder::generate(r, &spec)).unwrap();
        let mut positives = 0;
        for e in &examples {
            assert_eq!(e.tokens.len(), size * size);
            assert!(e.tokens.iter().all(|&p| p == 0 || p == 255));
            let d = dots(&e.tokens, size);
            assert_eq!(d.len(), 2, "two dots");
            // Across a gap of `gap` steps two lit pixels are at most gap + 2 apart once rounded (Chebyshev);
            // different contours are more than `separation` apart.
            let bridge = spec.gap + 2;
            assert!(spec.separation > bridge);
            assert_eq!(joined(&e.tokens, size, d[0], d[1], bridge), e.label == 1, "label {}", e.label);
            positives += e.label as usize;
        }
        // The label is drawn with probability ½: 300 draws land within ±0.1 of half (a 3.5σ bound).
        let share = positives as f64 / 300.0;
        assert!((share - 0.5).abs() < 0.1, "{share}");
    }
}

#[test]
fn the_amount_of_ink_does_not_give_a_pathfinder_label_away() {
    let _serial = common::serial();
    // Both classes draw as many contours: no threshold on the count of lit pixels beats chance by much (an
    // image with one contour fewer per positive, as a first version drew them, is told apart every time).
    let spec = pathfinder::Spec::sized(32, 14);
    let examples = lra::try_examples_of(6, Split::Train, 400, |r| pathfinder::generate(r, &spec)).unwrap();
    let ink: Vec<(usize, u32)> =
        examples.iter().map(|e| (e.tokens.iter().filter(|&&p| p > 0).count(), e.label)).collect();
    let best = (0..=1024)
        .map(|t| {
            let right = ink.iter().filter(|&&(n, label)| (n > t) == (label == 1)).count();
            right.max(ink.len() - right) as f64 / ink.len() as f64
        })
        .fold(0.0, f64::max);
    assert!(best < 0.62, "a threshold on the lit pixels classifies {best:.3} of the images");
}

#[test]
fn byte_and_pixel_sequences_have_their_lengths_values_and_disjoint_splits() {
    let _serial = common::serial();
    let emails = ablate::data::spam::spam_assassin().unwrap();
    let bytes = |split, n| lra::byte_examples(&emails, split, n, 1024);
    let train = bytes(Split::Train, 10_000);
    let (validation, test) = (bytes(Split::Validation, 10_000), bytes(Split::Test, 10_000));
    assert_eq!(train.len() + validation.len() + test.len(), emails.len());
    assert!(train
        .iter()
        .chain(&validation)
        .chain(&test)
        .all(|e| e.tokens.len() == 1024 && e.tokens.iter().all(|&b| b < 256)));
    assert!(train.iter().any(|e| e.tokens.last() == Some(&lra::BYTE_PAD)), "short emails are padded");
    // A few examples of a split keep its mix of classes (the corpus is ordered ham, then spam).
    for split in [Split::Train, Split::Validation, Split::Test] {
        let few = bytes(split, 40);
        let spam = few.iter().filter(|e| e.label == 1).count();
        let all = bytes(split, 10_000);
        let share = all.iter().filter(|e| e.label == 1).count() as f64 / all.len() as f64;
        assert!((spam as f64 / 40.0 - share).abs() < 0.1, "{split:?}: {spam} of 40 spam, {share:.2} in the split");
    }
    let cfg = ablate::recipe::ImageDataConfig::default();
    let images = ablate::data::images::ImageTask::load(&cfg, 0.1).unwrap();
    let pixels = lra::pixel_examples(&images, Split::Test, 3).unwrap();
    assert!(pixels.iter().all(|e| e.tokens.len() == 784 && e.tokens.iter().all(|&p| p < 256) && e.label < 10));
    let first = images.test.images.get(0).reshape([-1]);
    assert_eq!(
        pixels[0].tokens,
        Vec::<i64>::try_from(first.to_kind(tch::Kind::Int64)).unwrap().iter().map(|&p| p as u32).collect::<Vec<_>>()
    );
}

#[test]
fn ablate_data_prints_the_documented_json_lines_for_every_task() {
    let _serial = common::serial();
    for args in [
        vec!["listops", "--n", "3", "--length", "20-60"],
        vec!["pathfinder", "--n", "2", "--split", "test"],
        vec!["pixels", "--n", "2", "--split", "validation"],
        vec!["bytes", "--n", "2", "--length", "256"],
    ] {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_ablate")).arg("data").args(&args).output().unwrap();
        assert!(out.status.success(), "{args:?}: {}", String::from_utf8_lossy(&out.stderr));
        let lines: Vec<serde_json::Value> =
            String::from_utf8(out.stdout).unwrap().lines().map(|l| serde_json::from_str(l).unwrap()).collect();
        assert_eq!(lines.len(), args[2].parse::<usize>().unwrap(), "{args:?}");
        for l in &lines {
            let (input, label) = (l["input"].as_str().unwrap(), l["label"].as_u64().unwrap());
            assert!(!input.is_empty() && label < 10, "{args:?}: {l}");
            assert_eq!(l.as_object().unwrap().len(), 2);
        }
    }
    let bad = std::process::Command::new(env!("CARGO_BIN_EXE_ablate"))
        .args(["data", "listops", "--split", "dev"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&bad.stderr);
    assert!(!bad.status.success() && err.lines().count() == 1 && err.contains("unknown split"), "{err}");
}

#[test]
fn contours_that_cannot_fit_are_refused_with_one_line() {
    let _serial = common::serial();
    let spec = pathfinder::Spec { distractors: 30, ..pathfinder::Spec::sized(16, 30) };
    let e = lra::try_examples_of(0, Split::Train, 1, |r| pathfinder::generate(r, &spec)).unwrap_err().to_string();
    assert!(e.contains("do not fit") && e.lines().count() == 1, "{e}");
}

/// The classifier of kind seq_classify over 15 tokens (ListOps') with `attention` as its attention section.
fn classifier(attention: &str, pe: &str, pool: &str) -> (tch::nn::VarStore, SeqClassifier) {
    let text = format!(
        "kind: seq_classify\ntransformer: {{d_model: 16, layers: 2, heads: 2, block_size: 20, pe: {pe}, attention: {attention}}}\nseq_classify: {{min_length: 4, max_length: 16, pool: {pool}}}\n"
    );
    let cfg = ablate::recipe::parse(&text, "t.yaml", "t", false).unwrap().runs[0].config.clone();
    tch::manual_seed(3);
    let vs = tch::nn::VarStore::new(tch::Device::Cpu);
    let model = SeqClassifier::new(&vs.root(), &cfg.transformer_spec(), 15, 10, cfg.seq_classify().pool);
    (vs, model)
}

#[test]
fn padding_changes_no_class_score_under_any_pattern_position_scheme_or_pooling() {
    let _serial = common::serial();
    use tch::{Device, Kind, Tensor};
    for attention in [
        "{}",
        "{implementation: sparse, pattern: {window: 2}}",
        "{pattern: {window: 2}}",
        "{implementation: sparse, pattern: {window: 2, global_tokens: 2}}",
        "{implementation: sparse, pattern: {window: 2, dilation: 2}}",
    ] {
        for (pe, pool) in [("learned", "mean"), ("learned", "cls"), ("rope", "mean"), ("alibi", "cls")] {
            let (_vs, model) = classifier(attention, pe, pool);
            let short = Tensor::randint(15, [1, 9], (Kind::Int64, Device::Cpu));
            let padded = Tensor::cat(&[&short, &Tensor::full([1, 7], model.pad_id(), (Kind::Int64, Device::Cpu))], 1);
            let full = Tensor::randint(15, [1, 16], (Kind::Int64, Device::Cpu));
            let batch = Tensor::cat(&[&padded, &full], 0);
            let alone = tch::no_grad(|| model.classify(&short, false, false).0);
            let in_batch = tch::no_grad(|| model.classify(&batch, false, false).0);
            let diff = (alone.get(0) - in_batch.get(0)).abs().max().double_value(&[]);
            assert!(diff < 1e-5, "{attention} {pe} {pool}: padding moved the class scores by {diff}");
            // The check can fail: the padding's tokens read as real ones change the scores (where the pooled
            // vector can reach them: a windowed <cls> token two layers deep sees 4 positions).
            if pool == "cls" && attention != "{}" {
                continue;
            }
            let unmasked = Tensor::cat(&[&short, &Tensor::zeros([1, 7], (Kind::Int64, Device::Cpu))], 1);
            let read = tch::no_grad(|| model.classify(&unmasked, false, false).0);
            assert!((read - &alone).abs().max().double_value(&[]) > 1e-4, "{attention} {pe} {pool}");
        }
    }
}

/// The best share of `examples` that one threshold on a one-number summary classifies correctly (either
/// side of the threshold may be the positive one).
fn best_threshold_accuracy(examples: &[(f64, u32)]) -> f64 {
    let mut sorted = examples.to_vec();
    sorted.sort_by(|a, b| a.0.total_cmp(&b.0));
    let positives = sorted.iter().filter(|e| e.1 == 1).count();
    let n = sorted.len();
    // Below the threshold every example is called negative, above it positive: sweep the threshold up
    // through the sorted values, moving one example at a time (ties moved together).
    let mut right = positives; // everything called positive
    let mut best = right.max(n - right);
    let mut i = 0;
    while i < n {
        let v = sorted[i].0;
        while i < n && sorted[i].0 == v {
            if sorted[i].1 == 1 {
                right -= 1
            } else {
                right += 1
            }
            i += 1;
        }
        best = best.max(right.max(n - right));
    }
    best as f64 / n as f64
}

#[test]
fn the_threshold_helper_finds_a_perfect_split_and_none_in_noise() {
    let _serial = common::serial();
    let split: Vec<(f64, u32)> = (0..100).map(|i| (i as f64, u32::from(i >= 40))).collect();
    assert_eq!(best_threshold_accuracy(&split), 1.0);
    let reversed: Vec<(f64, u32)> = (0..100).map(|i| (i as f64, u32::from(i < 40))).collect();
    assert_eq!(best_threshold_accuracy(&reversed), 1.0);
    let constant: Vec<(f64, u32)> = (0..100).map(|i| (1.0, (i % 2) as u32)).collect();
    assert_eq!(best_threshold_accuracy(&constant), 0.5);
}

#[test]
fn no_one_number_summary_of_the_dots_gives_a_pathfinder_label_away() {
    let _serial = common::serial();
    // Positives mark the two ends of one contour of bounded length, so their dots were close together and a
    // negative's (ends of two contours) anywhere: one threshold on the dots' distance classified 74.5% of
    // a first generator's images (and the dots' mean row 61.8%). Both classes now start from the ends of
    // one contour and keep an image only if it completes either way. 2,000 images: the best threshold on
    // a summary that carries nothing stays within about 3 points of half at this size.
    let n = 32;
    let spec = pathfinder::Spec::sized(n, 14);
    let examples = lra::try_examples_of(12, Split::Train, 2000, |r| pathfinder::generate(r, &spec)).unwrap();
    let centre = (n as f64 - 1.0) / 2.0;
    // Lit pixels within 3 pixels of a dot, the dot itself left out.
    let near = |px: &[u32], (r, c): (usize, usize)| {
        let rows = r.saturating_sub(3)..=(r + 3).min(n - 1);
        rows.flat_map(|rr| (c.saturating_sub(3)..=(c + 3).min(n - 1)).map(move |cc| (rr, cc)))
            .filter(|&(rr, cc)| (rr.abs_diff(r) > 1 || cc.abs_diff(c) > 1) && px[rr * n + cc] > 0)
            .count() as f64
    };
    type Summary =
        (&'static str, fn(&[u32], (usize, usize), (usize, usize), &dyn Fn(&[u32], (usize, usize)) -> f64, f64) -> f64);
    let summaries: [Summary; 10] = [
        ("Euclidean distance between the dots", |_, a, b, _, _| {
            ((a.0 as f64 - b.0 as f64).powi(2) + (a.1 as f64 - b.1 as f64).powi(2)).sqrt()
        }),
        ("Chebyshev distance between the dots", |_, a, b, _, _| a.0.abs_diff(b.0).max(a.1.abs_diff(b.1)) as f64),
        ("lit pixels", |px, _, _, _, _| px.iter().filter(|&&p| p > 0).count() as f64),
        ("mean row of the dots", |_, a, b, _, _| (a.0 + b.0) as f64 / 2.0),
        ("mean column of the dots", |_, a, b, _, _| (a.1 + b.1) as f64 / 2.0),
        ("distance of the dots' midpoint from the centre", |_, a, b, _, centre| {
            (((a.0 + b.0) as f64 / 2.0 - centre).powi(2) + ((a.1 + b.1) as f64 / 2.0 - centre).powi(2)).sqrt()
        }),
        ("nearer dot's distance from the centre", |_, a, b, _, centre| {
            let d = |p: (usize, usize)| ((p.0 as f64 - centre).powi(2) + (p.1 as f64 - centre).powi(2)).sqrt();
            d(a).min(d(b))
        }),
        ("lit pixels near both dots", |px, a, b, near, _| near(px, a) + near(px, b)),
        ("fewer lit pixels near one dot", |px, a, b, near, _| near(px, a).min(near(px, b))),
        ("more lit pixels near one dot", |px, a, b, near, _| near(px, a).max(near(px, b))),
    ];
    let mut failures = Vec::new();
    for (name, summary) in summaries {
        let values: Vec<(f64, u32)> = examples
            .iter()
            .map(|e| {
                let d = dots(&e.tokens, n);
                (summary(&e.tokens, d[0], d[1], &near, centre), e.label)
            })
            .collect();
        let best = best_threshold_accuracy(&values);
        eprintln!("{name}: {best:.3}");
        if best > 0.60 {
            failures.push(format!("{name}: {best:.3}"));
        }
    }
    assert!(failures.is_empty(), "one threshold classifies more than 60% of the images by {failures:?}");
}
