//! Named models: the paper sizes (224×224 RGB, 1000 classes; their parameter counts equal timm's, tested)
//! and small ones for 28×28 grey images with 10 classes. `ablate describe` lists them, and the vision
//! complexity benchmark measures them.
use super::schema::{BlockKind, Config, Kind, Pool, VisionConfig};

pub const PRESETS: &[&str] = &[
    "vit_tiny_patch16_224",
    "vit_small_patch16_224",
    "vit_base_patch16_224",
    "swin_tiny_patch4_window7_224",
    "davit_tiny",
    "vit_fmnist",
    "swin_fmnist",
    "davit_fmnist",
    "image_gpt_fmnist",
];

/// The preset `name`, resolved (every default filled), or `None`.
pub fn preset(name: &str) -> Option<Config> {
    // (kind, patch, width, depth or depths per stage, heads of the first stage)
    let (kind, patch, d_model, depths, heads): (Kind, i64, i64, &[i64], i64) = match name {
        "vit_tiny_patch16_224" => (Kind::Vit, 16, 192, &[12], 3),
        "vit_small_patch16_224" => (Kind::Vit, 16, 384, &[12], 6),
        "vit_base_patch16_224" => (Kind::Vit, 16, 768, &[12], 12),
        "swin_tiny_patch4_window7_224" => (Kind::Swin, 4, 96, &[2, 2, 6, 2], 3),
        "davit_tiny" => (Kind::Davit, 4, 96, &[2, 2, 6, 2], 3),
        // 28×28 → 7×7 patches of 4×4: 49 tokens.
        "vit_fmnist" => (Kind::Vit, 4, 64, &[4], 4),
        // 28×28 → 14×14 tokens of 2×2, windows of 7, merged once to 7×7.
        "swin_fmnist" => (Kind::Swin, 2, 32, &[2, 2], 2),
        "davit_fmnist" => (Kind::Davit, 2, 32, &[2, 2], 2),
        // 28×28 averaged over 2×2 blocks → 14×14 pixels: 196 tokens of a 16-colour palette.
        "image_gpt_fmnist" => (Kind::ImageGpt, 2, 64, &[4], 4),
        _ => return None,
    };
    let mut cfg = Config::defaults(kind);
    let paper = name.ends_with("224") || name == "davit_tiny";
    cfg.transformer.d_model = d_model;
    cfg.transformer.heads = heads;
    // The position encoding is the kind's default (Config::defaults): learned, Swin's 2-D bias, DaViT's conv.
    if !kind.is_hierarchical() {
        cfg.transformer.layers = depths[0];
    }
    cfg.vision = Some(VisionConfig {
        image_size: if paper { 224 } else { 28 },
        channels: if paper { 3 } else { 1 },
        classes: if paper { 1000 } else { 10 },
        patch_size: patch,
        pool: Pool::Cls,
        depths: if kind.is_hierarchical() { depths.to_vec() } else { VisionConfig::default().depths },
        window: 7,
        shift: true,
        attention_types: vec![BlockKind::Spatial, BlockKind::Channel],
        ..VisionConfig::default()
    });
    cfg.resolve();
    Some(cfg)
}
