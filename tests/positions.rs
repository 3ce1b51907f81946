//! Position encodings (UDL §12.3.1; Shaw, T5, ALiBi, RoPE): relative schemes see offsets only, and
//! every encoding makes the model order-sensitive where no encoding cannot be.
mod common;
use ablate::transformer::attention::relative::{alibi_slopes, t5_bucket, Relative};
use ablate::transformer::attention::{Mask, MultiHeadAttention};
use ablate::transformer::layers::{LayerInit, Pass, Placement, TransformerLayer};
use ablate::transformer::positions::AbsolutePositions;
use ablate::transformer::spec::{
    AbsoluteAt, AttentionSpec, Implementation, PositionEncoding, PositionSpec, TransformerSpec,
};
use tch::nn::Module;
use tch::{nn, Device, Kind, Tensor};

const RELATIVE: [PositionEncoding; 4] =
    [PositionEncoding::Shaw, PositionEncoding::T5, PositionEncoding::Alibi, PositionEncoding::Rope];

fn randomise(vs: &nn::VarStore, std: f64) {
    tch::no_grad(|| {
        for mut p in vs.trainable_variables() {
            p.copy_(&(Tensor::randn(p.size(), (Kind::Float, Device::Cpu)) * std));
        }
    });
}

fn attention_with(pe: PositionEncoding) -> (nn::VarStore, MultiHeadAttention) {
    let vs = nn::VarStore::new(Device::Cpu);
    let spec = AttentionSpec { implementation: Implementation::Explicit, ..AttentionSpec::standard(16, 4) };
    let position = PositionSpec { shaw_max_distance: 4, t5_buckets: 8, t5_max_distance: 20, ..PositionSpec::of(pe) };
    let m = MultiHeadAttention::new(vs.root(), 16, &spec, &position, None, 0.02);
    randomise(&vs, 0.4);
    (vs, m)
}

#[test]
fn relative_schemes_give_the_same_scores_when_every_position_shifts() {
    let _serial = common::serial();
    for pe in RELATIVE {
        for causal in [false, true] {
            tch::manual_seed(10);
            let (vs, m) = attention_with(pe);
            let x = Tensor::randn([2, 12, 16], (Kind::Float, Device::Cpu));
            let at = |offset: i64| {
                let mask = Mask { causal, key_padding: None, offset, bias: None };
                m.self_attend(&x, &mask, None, false, true).weights.unwrap()
            };
            let base = at(0);
            for offset in [1, 37, 1000] {
                let diff = (&base - at(offset)).abs().max().double_value(&[]);
                assert!(diff < 1e-5, "{pe:?} causal={causal}: shifting by {offset} changed weights by {diff}");
            }
            // And the scheme does act: the weights differ from attention without positions.
            let (mut vs_plain, plain) = attention_with(PositionEncoding::None);
            vs_plain.copy(&vs).unwrap(); // the projections; the scheme's own parameters have no counterpart
            let w_plain = plain
                .self_attend(&x, &Mask { causal, key_padding: None, offset: 0, bias: None }, None, false, true)
                .weights
                .unwrap();
            assert!((&base - w_plain).abs().max().double_value(&[]) > 1e-3, "{pe:?} had no effect");
        }
    }
}

#[test]
fn alibi_slopes_are_the_papers_geometric_sequence() {
    let _serial = common::serial();
    let eight = alibi_slopes(8);
    let expected: Vec<f64> = (1..=8).map(|i| 0.5f64.powi(i)).collect();
    assert_eq!(eight, expected);
    // Not a power of two: the 4-head slopes, then every other slope of the 8-head sequence.
    assert_eq!(alibi_slopes(6), vec![0.25, 0.0625, 0.015625, 0.00390625, 0.5, 0.125]);
    assert_eq!(alibi_slopes(1), vec![2f64.powi(-8)]);
}

#[test]
fn alibi_bias_is_minus_slope_times_distance() {
    let _serial = common::serial();
    let vs = nn::VarStore::new(Device::Cpu);
    let r = Relative::new(&vs.root(), &PositionSpec::of(PositionEncoding::Alibi), 8, 4, None);
    let q = Tensor::zeros([1, 8, 5, 4], (Kind::Float, Device::Cpu));
    let i = Tensor::arange(5, (Kind::Int64, Device::Cpu)).view([5, 1]);
    let j = Tensor::arange(5, (Kind::Int64, Device::Cpu)).view([1, 5]);
    let bias = r.score_bias(&q, &(i - j), true, 1.0).unwrap();
    assert_eq!(bias.size(), vec![1, 8, 5, 5]);
    assert!((bias.double_value(&[0, 0, 4, 1]) - (-0.5 * 3.0)).abs() < 1e-6);
    assert!((bias.double_value(&[0, 2, 1, 3]) - (-0.125 * 2.0)).abs() < 1e-6);
}

#[test]
fn t5_buckets_are_exact_near_and_logarithmic_far() {
    let _serial = common::serial();
    let dist = Tensor::from_slice(&[0i64, 1, 3, 4, 7, 8, 15, 16, 100, 1000, -1, -5]);
    let causal = Vec::<i64>::try_from(t5_bucket(&dist, false, 16, 64)).unwrap();
    // 8 exact buckets (0..7), then log-spaced up to the last bucket at max_distance 64; keys after the query
    // (negative offsets) fall into bucket 0 in a causal model.
    assert_eq!(&causal[..5], &[0, 1, 3, 4, 7]);
    assert!(causal[5] >= 8 && causal[6] >= causal[5] && causal[7] >= causal[6]);
    assert_eq!(causal[8], 15);
    assert_eq!(causal[9], 15);
    assert_eq!(&causal[10..], &[0, 0]);
    let bidirectional = Vec::<i64>::try_from(t5_bucket(&dist, true, 16, 64)).unwrap();
    // Half the buckets per direction: keys after the query use buckets 8..15.
    assert_eq!(bidirectional[1], 1);
    assert_eq!(bidirectional[10], 9);
    assert!(bidirectional[11] > 8);
}

#[test]
fn rope_scores_depend_only_on_the_offset() {
    let _serial = common::serial();
    let vs = nn::VarStore::new(Device::Cpu);
    for fraction in [1.0, 0.5] {
        let cfg = PositionSpec { rope_fraction: fraction, ..PositionSpec::of(PositionEncoding::Rope) };
        let r = Relative::new(&vs.root(), &cfg, 1, 8, None);
        tch::manual_seed(11);
        let q = Tensor::randn([1, 1, 1, 8], (Kind::Float, Device::Cpu));
        let k = Tensor::randn([1, 1, 1, 8], (Kind::Float, Device::Cpu));
        let score = |i: i64, j: i64| (r.rotate(&q, i) * r.rotate(&k, j)).sum(Kind::Float).double_value(&[]);
        let s = score(3, 1);
        assert!((s - score(10, 8)).abs() < 1e-4, "{fraction}");
        assert!((s - score(500, 498)).abs() < 1e-3, "{fraction}");
        assert!((s - score(3, 2)).abs() > 1e-3, "{fraction}: a different offset must change the score");
        // Rotation keeps norms.
        let n0 = q.norm().double_value(&[]);
        assert!((r.rotate(&q, 77).norm().double_value(&[]) - n0).abs() < 1e-5);
    }
}

/// A one-layer bidirectional encoder with the given position encoding, mean-pooled.
struct Encoder {
    _vs: nn::VarStore,
    embedding: nn::Embedding,
    positions: AbsolutePositions,
    at: AbsoluteAt,
    layer: TransformerLayer,
}

impl Encoder {
    fn new(pe: PositionEncoding, at: AbsoluteAt) -> Self {
        tch::manual_seed(12);
        let vs = nn::VarStore::new(Device::Cpu);
        let mut spec = TransformerSpec::small(16, 1, 4, 8);
        spec.ffn_hidden = 32;
        spec.position = PositionSpec { at, ..PositionSpec::of(pe) };
        let embedding = nn::embedding(vs.root() / "emb", 10, 16, Default::default());
        let positions = AbsolutePositions::new(vs.root() / "pos", pe, 8, 16);
        let layer = TransformerLayer::new(
            vs.root() / "layer",
            &spec,
            false,
            LayerInit::default(),
            None,
            Placement { index: 0, count: 1 },
        );
        randomise(&vs, 0.5);
        Self { _vs: vs, embedding, positions, at, layer }
    }

    fn pooled(&self, ids: &[i64]) -> Tensor {
        let idx = Tensor::from_slice(ids).unsqueeze(0);
        let mut x = self.embedding.forward(&idx);
        let table = self.positions.table(ids.len() as i64);
        let mut qk = None;
        match (self.at, &table) {
            (AbsoluteAt::Qk, Some(t)) => qk = Some(t),
            (_, Some(t)) => x = &x + t,
            _ => {}
        }
        self.layer.forward(&x, &Mask::default(), qk, None, Default::default(), false, false).output.mean_dim(
            1,
            false,
            Kind::Float,
        )
    }
}

#[test]
fn position_encodings_tell_who_ate_whom_and_no_encoding_cannot() {
    let _serial = common::serial();
    // "the woman ate the raccoon" vs "the raccoon ate the woman": the same bag of words.
    let (the, woman, ate, raccoon) = (1, 2, 3, 4);
    let a = [the, woman, ate, the, raccoon];
    let b = [the, raccoon, ate, the, woman];
    let none = Encoder::new(PositionEncoding::None, AbsoluteAt::Input);
    let diff = (none.pooled(&a) - none.pooled(&b)).abs().max().double_value(&[]);
    assert!(diff < 1e-5, "without positions the two sentences must look the same, differed by {diff}");
    let mut cases: Vec<(PositionEncoding, AbsoluteAt)> = RELATIVE.iter().map(|&p| (p, AbsoluteAt::Input)).collect();
    for at in [AbsoluteAt::Input, AbsoluteAt::Qk] {
        cases.push((PositionEncoding::Sinusoidal, at));
        cases.push((PositionEncoding::Learned, at));
    }
    for (pe, at) in cases {
        let enc = Encoder::new(pe, at);
        let diff = (enc.pooled(&a) - enc.pooled(&b)).abs().max().double_value(&[]);
        assert!(diff > 1e-4, "{pe:?} at {at:?} cannot tell the sentences apart (difference {diff})");
    }
}

/// A stack of no layers: what it returns is its input after the positions joined it.
fn joined_input(encoding: PositionEncoding, concat: bool, x: &Tensor, table_width: i64) -> (Tensor, Tensor) {
    use ablate::transformer::layers::{GlobalTokens, Stack};
    let vs = nn::VarStore::new(Device::Cpu);
    let positions = AbsolutePositions::new(vs.root() / "position", encoding, 10, table_width);
    let table = positions.table(x.size()[1]).unwrap();
    let stack = Stack {
        positions,
        at: AbsoluteAt::Input,
        embedding_norm: None,
        global_tokens: GlobalTokens::new(&vs.root(), 0, 32),
        layers: Vec::new(),
        conv_positions: None,
        final_norm: None,
        dropout: 0.0,
        embedding_scale: 1.0,
        concat_positions: concat,
        value_embeddings: None,
    };
    (stack.forward(x, &Mask::default(), None, Pass::eval()).0, table)
}

#[test]
fn concatenated_positions_take_their_own_dimensions_and_added_ones_share_all() {
    let _serial = common::serial();
    tch::manual_seed(0);
    for encoding in [PositionEncoding::Sinusoidal, PositionEncoding::Learned] {
        // Concatenated: 24 token features, then the 8 of the position table, untouched by each other.
        let tokens = Tensor::randn([2, 6, 24], (Kind::Float, Device::Cpu));
        let (out, table) = joined_input(encoding, true, &tokens, 8);
        assert_eq!(out.size(), [2, 6, 32]);
        assert!(out.narrow(2, 0, 24).equal(&tokens), "{encoding:?}: the token part changed");
        for b in 0..2 {
            assert!(out.get(b).narrow(1, 24, 8).equal(&table), "{encoding:?}: the position part is not Π");
        }
        // Added: every dimension carries both.
        let tokens = Tensor::randn([2, 6, 32], (Kind::Float, Device::Cpu));
        let (out, table) = joined_input(encoding, false, &tokens, 32);
        assert!(out.allclose(&(&tokens + &table), 0.0, 0.0, false));
    }
    // The sinusoid table of width P is Vaswani's formula at P (not the first P columns of the D-wide one).
    let narrow = ablate::transformer::positions::sinusoidal_table(10, 8, Device::Cpu);
    let expected = (3.0f64 / 10000f64.powf(2.0 / 8.0)).sin();
    assert!((narrow.double_value(&[3, 2]) - expected).abs() < 1e-6);
}

#[test]
fn concatenated_positions_shrink_the_token_embedding_and_the_table() {
    let _serial = common::serial();
    let count = |extra: &str| {
        let text = format!(
            "kind: lm\ntransformer: {{d_model: 32, layers: 1, heads: 4, block_size: 16, pe: learned{extra}}}\n"
        );
        let cfg = ablate::recipe::parse(&text, "p.yaml", "p", false).unwrap().runs[0].config.clone();
        let vs = nn::VarStore::new(Device::Cpu);
        let _model = ablate::tasks::task(cfg.kind).build(&cfg, &vs.root(), 50);
        vs.trainable_variables().iter().map(|t| t.numel() as i64).sum::<i64>()
    };
    let added = count("");
    let concatenated = count(", position: {combine: concat, concat_dim: 8}");
    // Tokens: 50 × 32 → 50 × 24; positions: 16 × 32 → 16 × 8.
    assert_eq!(added - concatenated, 50 * 8 + 16 * 24);
    // Without a width, a quarter of d_model.
    assert_eq!(count(", position: {combine: concat}"), concatenated);
    for (text, message) in [
        ("transformer: {pe: learned, position: {combine: concat, at: qk}}", "once, at the input"),
        ("transformer: {pe: rope, position: {combine: concat}}", "transformer.pe is rope"),
        ("transformer: {pe: learned, tie_embeddings: true, position: {combine: concat}}", "tie_embeddings: false"),
        ("transformer: {pe: learned, position: {combine: concat, concat_dim: 128}}", "1 to 127, got 128"),
        ("transformer: {pe: learned, position: {concat_dim: 8}}", "transformer.position.concat_dim: is the width"),
    ] {
        let e = ablate::recipe::parse(&format!("kind: lm\n{text}\n"), "p.yaml", "p", false).unwrap_err();
        assert!(e.to_string().contains(message), "{text}: {e}");
        assert_eq!(e.to_string().lines().count(), 1);
    }
}
