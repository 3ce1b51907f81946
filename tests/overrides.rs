//! Command-line overrides (`key=value`, `--sweep`, `--seeds`): they act on every run, change the config
//! hash, and a bad one is refused in one line naming the argument.
use ablate::recipe::{parse, parse_with, Overrides};

const RECIPE: &str = "kind: lm
transformer:
  d_model: 64
train:
  steps: 100
sweep:
  transformer.heads: [1, 2, 4]
seeds: [0, 1]
";

fn with(set: &[&str], sweep: &[&str], seeds: Option<&str>) -> Result<ablate::recipe::Recipe, String> {
    let strings = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
    let overrides = Overrides::parse(&strings(set), &strings(sweep), seeds).map_err(|e| e.to_string())?;
    parse_with(RECIPE, "r.yaml", "r", false, &overrides).map_err(|e| e.to_string())
}

#[test]
fn overrides_act_on_every_run_and_change_its_hash() {
    let base = parse(RECIPE, "r.yaml", "r", false).unwrap();
    let r = with(&["train.steps=300", "transformer.pe=rope"], &[], None).unwrap();
    assert_eq!(r.runs.len(), 6);
    for (run, before) in r.runs.iter().zip(&base.runs) {
        assert_eq!(run.id, before.id, "overrides of unswept keys keep the run ids");
        assert_eq!(run.config.train.steps, 300);
        assert_eq!(run.config.transformer.pe, ablate::transformer::spec::PositionEncoding::Rope);
        assert_ne!(run.config_hash, before.config_hash, "a changed config is a different run to resume");
    }
    assert_eq!(r.overrides.describe(), ["train.steps=300", "transformer.pe=rope"]);
    // Writing the value the file already has changes nothing.
    let same = with(&["train.steps=100"], &[], None).unwrap();
    assert_eq!(same.runs[0].config_hash, base.runs[0].config_hash);
}

#[test]
fn sweeps_and_seeds_from_the_command_line() {
    // Replacing an axis keeps its place; a new axis goes after the recipe's.
    let r = with(&[], &["transformer.heads=1,16", "train.lr=0.001,0.0003"], Some("5")).unwrap();
    assert_eq!(r.sweep_keys, ["transformer.heads", "train.lr"]);
    let ids: Vec<&str> = r.runs.iter().map(|r| r.id.as_str()).collect();
    assert_eq!(
        ids,
        [
            "transformer.heads=1 train.lr=0.001 seed=5",
            "transformer.heads=1 train.lr=0.0003 seed=5",
            "transformer.heads=16 train.lr=0.001 seed=5",
            "transformer.heads=16 train.lr=0.0003 seed=5",
        ]
    );
    assert_eq!(r.runs[3].config.train.lr, 0.0003);
    assert_eq!(r.runs[3].config.train.seed, 5);
    // Setting a swept key fixes it: its axis goes.
    let fixed = with(&["transformer.heads=8"], &[], None).unwrap();
    assert!(fixed.sweep_keys.is_empty());
    assert_eq!(fixed.runs.len(), 2);
    assert!(fixed.runs.iter().all(|r| r.config.transformer.heads == 8));
}

#[test]
fn overrides_beat_smoke_shrinking() {
    let strings = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
    let overrides = Overrides::parse(&strings(&["train.steps=9"]), &[], None).unwrap();
    let r = parse_with(RECIPE, "r.yaml", "r", true, &overrides).unwrap();
    assert_eq!(r.runs[0].config.train.steps, 9);
}

#[test]
fn bad_overrides_name_their_argument_in_one_line() {
    type Case<'a> = (&'a [&'a str], &'a [&'a str], Option<&'a str>, &'a str);
    let cases: [Case; 9] = [
        (
            &["train.stepz=3"],
            &[],
            None,
            "argument `train.stepz=3`: train.stepz: unknown config key `train.stepz` (did you mean train.steps?)",
        ),
        (&["train.steps=many"], &[], None, "argument `train.steps=many`: train.steps"),
        (
            &["transformer.heads=3"],
            &[],
            None,
            "argument `transformer.heads=3`: transformer.heads: 3 heads do not divide d_model 64",
        ),
        (
            &["vision.patch_size=4"],
            &[],
            None,
            "argument `vision.patch_size=4`: vision.patch_size: the vision section is read by kind",
        ),
        (
            &[],
            &["transformer.heads=1,3"],
            None,
            "argument `--sweep transformer.heads=1,3`: transformer.heads: 3 heads do not divide",
        ),
        (
            &[],
            &["transformer.hedas=1,2"],
            None,
            "argument `--sweep transformer.hedas=1,2`: sweep.transformer.hedas: unknown config key",
        ),
        (&[], &["transformer.pe=rope,rotary"], None, "argument `--sweep transformer.pe=rope,rotary`"),
        (&["transformer=1"], &[], None, "argument `transformer=1`: sets all of `transformer`"),
        (
            &["transformer.heads=2"],
            &["transformer.heads=1,2"],
            None,
            "argument `--sweep transformer.heads=1,2`: `transformer.heads` is both set",
        ),
    ];
    for (set, sweep, seeds, expected) in cases {
        let e = with(set, sweep, seeds).unwrap_err();
        assert!(e.starts_with(expected) && !e.contains('\n'), "{set:?} {sweep:?}: {e}");
    }
    // A variant that sets the key would be changed behind its label.
    let recipe = "kind: lm\nvariants:\n  - label: wide\n    transformer.d_model: 128\n  - label: narrow\n    transformer.d_model: 32\n";
    let overrides = Overrides::parse(&["transformer.d_model=64".to_string()], &[], None).unwrap();
    let e = parse_with(recipe, "v.yaml", "v", false, &overrides).unwrap_err().to_string();
    assert!(e.starts_with("argument `transformer.d_model=64`: variants.0 sets `transformer.d_model`"), "{e}");
    // Setting a whole section whose key inside it is swept would silently undo the sweep.
    let recipe = "kind: vit\nsweep:\n  data.images.flip: [true, false]\n";
    let overrides = Overrides::parse(&["data.images={dataset: mnist}".to_string()], &[], None).unwrap();
    let e = parse_with(recipe, "i.yaml", "i", false, &overrides).unwrap_err().to_string();
    assert!(e.contains("override `data.images.flip` itself"), "{e}");
}

#[test]
fn an_override_that_pins_the_compared_key_runs_without_the_comparison() {
    // `bin/ablate heads.yaml transformer.heads=4` is a quick run of one arm: the recipe's `compare:`
    // (baseline heads=1, a prediction about heads=2) has nothing to pair then, which is not an error; the
    // same recipe as written still has its comparison checked.
    let text = "kind: lm\ntransformer: {d_model: 32, layers: 1, block_size: 16}\nsweep:\n  transformer.heads: [1, 2]\ncompare:\n  baseline: heads=1\n  predict:\n    - {comparison: heads=2, metric: test_loss, expect: better, source: a test, role: test}\n";
    let dir = std::env::temp_dir().join(format!("ablate-pin-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("pin.yaml");
    std::fs::write(&path, text).unwrap();
    let pinned = ablate::recipe::Overrides::parse(&["transformer.heads=4".to_string()], &[], None).unwrap();
    let recipe = ablate::recipe::load_with(&path, false, &pinned).unwrap();
    ablate::judge::summary::check_compare(&recipe).unwrap();
    // After a run of the pinned arm the summary (and the end of the sweep) make no comparison, no error.
    let rows = "run_id,label,seed,config_hash,status,transformer.heads,test_loss,test_accuracy\nseed=0,base,0,x,ok,4,2.0,0.5\n";
    std::fs::write(dir.join("runs.csv"), rows).unwrap();
    assert!(ablate::judge::summary::judgements(&ablate::judge::reading::Results::open(&dir, &recipe, None).unwrap())
        .unwrap()
        .is_none());
    ablate::judge::summary::summary_table(&ablate::judge::reading::Results::open(&dir, &recipe, None).unwrap())
        .unwrap();
    let written = ablate::recipe::load(&path, false).unwrap();
    ablate::judge::summary::check_compare(&written).unwrap();
    std::fs::write(&path, text.replace("baseline: heads=1", "baseline: heads=7")).unwrap();
    let bad = ablate::recipe::load(&path, false).unwrap();
    assert!(ablate::judge::summary::check_compare(&bad).unwrap_err().to_string().contains("compare.baseline"));
    let _ = std::fs::remove_dir_all(&dir);
}
