//! The convolutional baseline (kind cnn): its size and cost in closed form, the locality that is its
//! prior (against a ViT, whose every output reads the whole image), its knobs, and a run that learns.
use ablate::models::cnn::Cnn;
use ablate::models::spec::{CnnSpec, Image};
use ablate::models::vit::Vit;
use tch::{nn, Device, Kind, Tensor};

mod common;

fn spec(channels: &[i64], kernel: i64) -> CnnSpec {
    CnnSpec { image: Image { size: 28, channels: 1, classes: 10, patch: 1 }, channels: channels.to_vec(), kernel }
}

#[test]
fn parameters_and_multiply_accumulates_match_their_closed_forms() {
    let _serial = common::serial();
    let vs = nn::VarStore::new(Device::Cpu);
    let s = spec(&[8, 16], 3);
    let _model = Cnn::new(&vs.root(), &s);
    let trainable: i64 = vs.trainable_variables().iter().map(|t| t.numel() as i64).sum();
    // Convolutions without bias (BatchNorm's shift replaces it), BatchNorm's gain and shift, the classifier.
    let expected = (9 * 8) + 2 * 8 + (8 * 16 * 9) + 2 * 16 + (16 * 10 + 10);
    assert_eq!(trainable, expected);
    // Stage 0 at 28×28, stage 1 after one pooling at 14×14, then the classifier.
    let macs = (28 * 28 * 9 * 8 + 14 * 14 * 8 * 16 * 9 + 16 * 10) as f64;
    assert_eq!(s.forward_macs(), macs);
    // Odd sides floor: 28 → 14 → 7 → 3.
    assert_eq!((s.side(2), spec(&[1, 1, 1, 1], 3).side(3)), (7, 3));
}

/// The pixels (rows, columns) whose change moves `output` at all: where its gradient is not zero.
fn reach(output: &Tensor, images: &Tensor) -> (Vec<i64>, Vec<i64>) {
    let grad = Tensor::run_backward(&[output], &[images], false, false).pop().unwrap();
    let touched = grad.abs().sum_dim_intlist([0i64, 1].as_slice(), false, Kind::Float).gt(0.0);
    let rows = Vec::<bool>::try_from(touched.any_dim(1, false)).unwrap();
    let cols = Vec::<bool>::try_from(touched.any_dim(0, false)).unwrap();
    let at = |v: Vec<bool>| v.iter().enumerate().filter(|(_, &b)| b).map(|(i, _)| i as i64).collect();
    (at(rows), at(cols))
}

#[test]
fn a_convolutional_feature_sees_only_its_receptive_field_while_a_vit_token_sees_the_whole_image() {
    let _serial = common::serial();
    tch::manual_seed(0);
    let vs = nn::VarStore::new(Device::Cpu);
    let model = Cnn::new(&vs.root(), &spec(&[4, 4], 3));
    let images = Tensor::randn([1, 1, 28, 28], (Kind::Float, Device::Cpu)).set_requires_grad(true);
    // Evaluation mode: BatchNorm's running statistics, so images of a batch do not mix.
    let map = model.feature_map(&images, false);
    assert_eq!(map.size(), [1, 4, 14, 14]);
    // Output (5, 9) of the second stage: a 3×3 convolution over the pooled map, whose rows 4..=6 pool input
    // rows 8..=13, each read by the first 3×3 convolution from one row further out: rows 7..=14.
    let (rows, cols) = reach(&map.get(0).get(0).get(5).get(9), &images);
    assert_eq!(rows, (7..=14).collect::<Vec<_>>());
    assert_eq!(cols, (15..=22).collect::<Vec<_>>());

    let cfg = common::config("kind: vit\ntransformer: {d_model: 16, layers: 1, heads: 2}\nvision: {patch_size: 7}\n");
    let vit = Vit::new(&(vs.root() / "vit"), &cfg.vit_spec());
    let images = Tensor::randn([1, 1, 28, 28], (Kind::Float, Device::Cpu)).set_requires_grad(true);
    let (tokens, _) = vit.features(&images, false, false);
    // One layer of global attention: the first patch's state already depends on every pixel. (Weighted:
    // the features of a LayerNorm's output with unit gain and zero shift sum to zero whatever the input.)
    let weights = Tensor::randn([16], (Kind::Float, Device::Cpu));
    let (rows, cols) = reach(&(tokens.get(0).get(1) * weights).sum(Kind::Float), &images);
    assert_eq!((rows.len(), cols.len()), (28, 28));
}

#[test]
fn the_cnn_section_shapes_the_model_and_the_transformer_section_is_refused() {
    let _serial = common::serial();
    let params = |text: &str| {
        let cfg = common::config(text);
        let vs = nn::VarStore::new(Device::Cpu);
        let model = ablate::tasks::classify::classifier(&cfg, &vs.root());
        let out =
            tch::no_grad(|| model.classify(&Tensor::zeros([2, 1, 28, 28], (Kind::Float, Device::Cpu)), false, false).0);
        assert_eq!(out.size(), [2, 10]);
        vs.trainable_variables().iter().map(|t| t.numel()).sum::<usize>()
    };
    let base = params("kind: cnn\ncnn: {channels: [4, 8]}\n");
    assert_eq!(base, 9 * 4 + 8 + 4 * 8 * 9 + 16 + 8 * 10 + 10);
    assert_eq!(params("kind: cnn\ncnn: {channels: [4, 8], kernel: 5}\n"), 25 * 4 + 8 + 4 * 8 * 25 + 16 + 90);
    assert_eq!(params("kind: cnn\ncnn: {channels: [4, 8, 8]}\n"), base + 8 * 8 * 9 + 16);
    for (text, line, message) in [
        ("kind: cnn\ntransformer:\n  heads: 2\n", 3, "transformer.heads: the transformer section; kind cnn"),
        (
            "kind: cnn\nvision:\n  patch_size: 4\n",
            3,
            "vision.patch_size is read by kind vit, swin, davit, image_gpt only",
        ),
        ("kind: cnn\ncnn:\n  kernel: 4\n", 3, "cnn.kernel: must be odd"),
        ("kind: cnn\ncnn:\n  channels: []\n", 3, "cnn.channels: 1 or more stages"),
        ("kind: vit\ncnn:\n  kernel: 5\n", 3, "the cnn section is read by kind cnn only"),
    ] {
        let e = ablate::recipe::parse(text, "c.yaml", "c", false).unwrap_err();
        assert_eq!(e.line, line, "{e}");
        assert!(e.to_string().contains(message), "{e}");
        assert_eq!(e.to_string().lines().count(), 1, "{e}");
    }
}

#[test]
fn a_small_cnn_learns_fashion_mnist_through_the_classification_loop() {
    let _serial = common::serial();
    let cfg = common::config(
        "kind: cnn\ncnn: {channels: [16, 32, 64]}\ndata:\n  images:\n    dataset: fashion_mnist\n    train_fraction: 0.1\n\
         train:\n  steps: 150\n  batch_size: 64\n  lr: 3.0e-3\n  warmup_steps: 10\n  eval_interval: 150\n  eval_batches: 2\n",
    );
    let (run, _) = common::train(&cfg);
    // Ten balanced classes: chance is 0.1. Measured 0.72.
    let accuracy = run.outcome.get("test_accuracy");
    assert!(accuracy > 0.55, "test accuracy {accuracy}");
    assert!(run.outcome.get("tokens_per_s") > 0.0);
}
