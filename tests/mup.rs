//! muP (`transformer.parametrisation: mup`): the coordinate check as a test (coordinates flat across widths
//! under muP, growing under the standard parametrisation), the base-width identity, and the rules it sets.
use ablate::recipe::{parse, Parametrisation};
use ablate::run::coord::{coord_check, spread};

/// A small pre-LN decoder (muP's base width is the default 64) at lr 1e-3, `extra` keys added to its transformer
/// section.
fn config(extra: &str) -> ablate::recipe::Config {
    let text = format!(
        "kind: lm\ntransformer: {{layers: 2, heads: 4, block_size: 64, pre_ln: true{extra}}}\ndata: {{max_chars: 300000}}\ntrain: {{batch_size: 12, lr: 1.0e-3}}\n"
    );
    parse(&text, "m.yaml", "m", false).unwrap().runs[0].config.clone()
}

#[test]
fn under_mup_the_coordinates_stay_flat_across_widths_and_under_standard_they_grow() {
    let coords = coord_check(&config(", d_model: 64"), &[64, 128, 256, 512], 5).unwrap();
    for site in ["layer 0", "layer 1", "logits"] {
        let (standard, mup) =
            (spread(&coords, Parametrisation::Standard, site), spread(&coords, Parametrisation::Mup, site));
        // The band: within 30% across an 8-fold range of widths under muP at lr 1e-3; the standard
        // parametrisation's logits and layer outputs grow at least 3-fold over it. (At lr 3e-3 the narrowest
        // model, d=64, moves further than the rest in five steps: muP's spread there is 1.1–1.9, still far
        // below the standard's 3.8–38×. The limit muP describes is the wide one.)
        assert!(mup < 1.3, "{site}: muP spread {mup}");
        assert!(standard > 3.0, "{site}: standard spread {standard}");
    }
    // The embedding is an input layer: the same init and rate in both, flat in both.
    assert!(spread(&coords, Parametrisation::Standard, "embedding") < 1.1);
    // At the base width the muP model is the standard one, step for step.
    let at_base = |p: Parametrisation| -> Vec<(i64, String, f64)> {
        coords
            .iter()
            .filter(|c| c.width == 64 && c.parametrisation == p)
            .map(|c| (c.step, c.site.clone(), c.mean_abs))
            .collect()
    };
    assert_eq!(at_base(Parametrisation::Standard), at_base(Parametrisation::Mup));
}

#[test]
fn mup_sets_the_scores_init_readout_and_learning_rates_from_the_width_multiplier() {
    let cfg = config(", d_model: 256, parametrisation: mup");
    let spec = cfg.transformer_spec();
    assert_eq!(spec.mup_width_mult, Some(4.0));
    // 1/d_head scaling: √(64/4)/64 with heads of 64, which is 1/√16 at the base width's heads of 16.
    assert_eq!(spec.attention.scale.factor(64), (16f64).sqrt() / 64.0);
    assert!((spec.attention.init_std - 0.01).abs() < 1e-12, "0.02/√4");
    assert_eq!(spec.readout_factor(), 0.25);
    assert_eq!(cfg.train.hidden_lr_scale, 0.25);
    let standard = config(", d_model: 256");
    assert_eq!(
        config(", d_model: 256, parametrisation: mup, mup_base_width: 128").transformer_spec().mup_width_mult,
        Some(2.0)
    );
    assert_eq!((standard.train.hidden_lr_scale, standard.transformer_spec().readout_factor()), (1.0, 1.0));
    // Refused in one line: another kind, a scale of one's own, tied embeddings.
    for (text, says) in [
        ("kind: vit\ntransformer: {parametrisation: mup}\n", "kind lm"),
        ("kind: lm\ntransformer: {parametrisation: mup, attention: {scale: none}}\n", "leave it at sqrt_dk"),
        ("kind: lm\ntransformer: {parametrisation: mup, tie_embeddings: true}\n", "tie_embeddings: false"),
    ] {
        let e = parse(text, "b.yaml", "b", false).err().unwrap().to_string();
        assert!(e.contains(says) && e.lines().count() == 1, "{e}");
    }
}
