//! The two-stage design's error rates, simulated with the production rule (`ablate::design`): the plan
//! (`Planner`), the combination tests (`Evidence`) and the family's Holm step (`judge_family`). One
//! comparison, and a family of four variants against one shared baseline; pilots of 3 and 4 seeds, caps of
//! 5–10, δ/sd of 0.5, 1 and 2. The family-wise rate of a false *better*/*worse* when every true difference is
//! 0, and of a false *equivalent* when every true difference is ±δ, must each stay within 0.05 + 3 standard
//! errors (6,000 replicates: SE ≤ 0.0029), and of a false *beyond δ* there (one side's claim) within its
//! nominal 0.025 + 3 standard errors. The same harness shows the rule
//! ablate used before December 2026 (stop where the pilot is decided, else add seeds and test the pooled
//! seeds) and an internal pilot (add seeds on the spread alone, test the pooled seeds) breaking that bound,
//! so the test can fail. `cargo test --release --test sequential -- --ignored --nocapture` prints the table
//! of docs/results.md.
use ablate::design::{family_level, judge_family, Evidence, Planner, Stages};
use ablate::stats::{mean_std, splitmix64, Verdict, ALPHA};

const REPLICATES: usize = 6000;

/// A standard normal draw (Box–Muller over splitmix64), the same on every machine.
fn normal(state: &mut u64) -> f64 {
    let u = |s: &mut u64| ((splitmix64(s) >> 11) as f64 + 0.5) / (1u64 << 53) as f64;
    let (a, b) = (u(state), u(state));
    (-2.0 * a.ln()).sqrt() * (2.0 * std::f64::consts::PI * b).cos()
}

#[derive(Clone, Copy, PartialEq)]
enum Rule {
    /// The design: every comparison gets its second stage, judged by the combination test.
    TwoStage,
    /// Before December 2026: decided at the pilot stops; the rest extended and the pooled seeds tested.
    Gated,
    /// Extended on the spread alone (no gate), the pooled seeds tested.
    InternalPilot,
    /// Every arm at the cap, one test.
    FixedAtCap,
}

struct Cell {
    pilot: usize,
    cap: usize,
    ratio: f64,
    variants: usize,
    noise: Noise,
}

/// How the seeds' paired differences scatter around the truth. Every test here assumes normal differences;
/// the other two show what that assumption is worth (docs/results.md, "When the differences are not normal").
#[derive(Clone, Copy, PartialEq)]
enum Noise {
    /// Arms with normal noise (the paired differences normal, sd 1; a family's share its baseline's).
    Normal,
    /// Each paired difference the truth plus a centred exponential (sd 1, skewness 2): a variant that now and
    /// then does much worse than its baseline. One comparison.
    Skewed,
    /// Each paired difference the truth plus Student's t with 3 degrees of freedom scaled to sd 1
    /// (symmetric, heavy-tailed: rare seeds far off). One comparison.
    HeavyTailed,
}

impl Noise {
    /// One draw (mean 0, sd 1).
    fn draw(self, state: &mut u64) -> f64 {
        match self {
            Noise::Normal => normal(state),
            Noise::Skewed => {
                let u = ((splitmix64(state) >> 11) as f64 + 0.5) / (1u64 << 53) as f64;
                -u.ln() - 1.0
            }
            Noise::HeavyTailed => {
                let chi2: f64 = (0..3).map(|_| normal(state).powi(2)).sum();
                normal(state) / (chi2 / 3.0).sqrt() / 3f64.sqrt()
            }
        }
    }
}

/// What one replicate's family claimed, and the seeds its arms used.
struct Claims {
    any_difference: bool,
    any_equivalent: bool,
    any_beyond: bool,
    /// The first comparison called better (for power).
    first_better: bool,
    seeds: usize,
}

fn stages(d: &[f64], pilot: usize, n: usize, planned: bool) -> Stages {
    Stages { pilot: d[..pilot].to_vec(), added: d[pilot..n].to_vec(), planned }
}

fn pooled(d: &[f64], n: usize) -> Stages {
    Stages { pilot: d[..n].to_vec(), added: vec![], planned: false }
}

fn sd(x: &[f64]) -> f64 {
    mean_std(x).1
}

/// One replicate: arms with standard deviation 1/√2 (so each paired difference has sd 1), the variants'
/// true difference `truth` each; δ = the cell's ratio.
fn replicate(cell: &Cell, planner: &Planner, rule: Rule, truth: &dyn Fn(usize) -> f64, state: &mut u64) -> Claims {
    let arm_sd = std::f64::consts::FRAC_1_SQRT_2;
    let base: Vec<f64> = (0..cell.cap).map(|_| arm_sd * normal(state)).collect();
    let diffs: Vec<Vec<f64>> = (0..cell.variants)
        .map(|v| {
            (0..cell.cap)
                .map(|s| match cell.noise {
                    Noise::Normal => truth(v) + arm_sd * Noise::Normal.draw(state) - base[s],
                    other => truth(v) + other.draw(state),
                })
                .collect()
        })
        .collect();
    let delta = cell.ratio;
    let judge = |family: Vec<Stages>| {
        let evidence: Vec<Evidence> = family.iter().map(|s| Evidence::of(s, delta)).collect();
        judge_family(&evidence, true, &vec![None; evidence.len()]).1
    };
    let (verdicts, targets): (Vec<Verdict>, Vec<usize>) = match rule {
        Rule::FixedAtCap => (judge(diffs.iter().map(|d| pooled(d, cell.cap)).collect()), vec![cell.cap; cell.variants]),
        Rule::TwoStage => {
            let targets: Vec<usize> = diffs.iter().map(|d| planner.target(sd(&d[..cell.pilot]), delta)).collect();
            (judge(diffs.iter().zip(&targets).map(|(d, &n)| stages(d, cell.pilot, n, true)).collect()), targets)
        }
        Rule::InternalPilot | Rule::Gated => {
            let pilot = judge(diffs.iter().map(|d| pooled(d, cell.pilot)).collect());
            let targets: Vec<usize> = diffs
                .iter()
                .zip(&pilot)
                .map(|(d, v)| match (rule, v.is_decided()) {
                    (Rule::Gated, true) => cell.pilot,
                    _ => planner.needed(sd(&d[..cell.pilot]), delta).max(cell.pilot),
                })
                .collect();
            (judge(diffs.iter().zip(&targets).map(|(d, &n)| pooled(d, n)).collect()), targets)
        }
    };
    let baseline = targets.iter().copied().max().unwrap_or(cell.pilot);
    Claims {
        any_difference: verdicts.iter().any(|v| matches!(v, Verdict::Better { .. } | Verdict::Worse { .. })),
        any_equivalent: verdicts.contains(&Verdict::Equivalent),
        any_beyond: verdicts
            .iter()
            .any(|v| matches!(v, Verdict::Better { beyond: true, .. } | Verdict::Worse { beyond: true, .. })),
        first_better: matches!(verdicts[0], Verdict::Better { .. }),
        seeds: baseline + targets.iter().sum::<usize>(),
    }
}

/// Rates over `REPLICATES`: (false difference at 0, false equivalence at ±δ, false beyond-δ at ±δ, power to
/// call the first variant better at +δ, mean seeds over all arms at 0).
fn rates(cell: &Cell, rule: Rule, seed: u64) -> [f64; 5] {
    let planner = Planner::new(cell.pilot, cell.cap, family_level(cell.variants));
    let mut state = seed;
    let (mut fp, mut fe, mut fb, mut power, mut seeds) = (0, 0, 0, 0, 0);
    for r in 0..REPLICATES {
        let null = replicate(cell, &planner, rule, &|_| 0.0, &mut state);
        fp += usize::from(null.any_difference);
        seeds += null.seeds;
        let sign = if r % 2 == 0 { 1.0 } else { -1.0 };
        let margin = replicate(cell, &planner, rule, &|_| sign * cell.ratio, &mut state);
        fe += usize::from(margin.any_equivalent);
        fb += usize::from(margin.any_beyond);
        let effect = replicate(cell, &planner, rule, &|_| cell.ratio, &mut state);
        power += usize::from(effect.first_better);
    }
    let n = REPLICATES as f64;
    [fp as f64 / n, fe as f64 / n, fb as f64 / n, power as f64 / n, seeds as f64 / n]
}

fn cells() -> Vec<Cell> {
    let mut out = Vec::new();
    for variants in [1, 4] {
        for (pilot, cap) in [(3, 5), (3, 6), (3, 10), (4, 6), (4, 8), (4, 10)] {
            for ratio in [0.5, 1.0, 2.0] {
                out.push(Cell { pilot, cap, ratio, variants, noise: Noise::Normal });
            }
        }
    }
    out
}

/// 0.05 plus three standard errors of a rate near 0.05.
fn bound() -> f64 {
    bound_at(ALPHA)
}

/// `level` plus three standard errors of a rate near it, over `REPLICATES`.
fn bound_at(level: f64) -> f64 {
    level + 3.0 * (level * (1.0 - level) / REPLICATES as f64).sqrt()
}

/// Every cell's rates under `rule`, two cells at a time.
fn all_rates(rule: Rule, cells: &[Cell]) -> Vec<[f64; 5]> {
    let half = cells.len().div_ceil(2);
    std::thread::scope(|scope| {
        let parts: Vec<_> = cells
            .chunks(half)
            .enumerate()
            .map(|(c, chunk)| {
                scope.spawn(move || {
                    chunk
                        .iter()
                        .enumerate()
                        .map(|(i, cell)| rates(cell, rule, 1 + (c * half + i) as u64))
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        parts.into_iter().flat_map(|p| p.join().unwrap()).collect()
    })
}

#[test]
fn the_two_stage_design_keeps_its_stated_error_rates() {
    let cells = cells();
    let bound = bound();
    for (cell, r) in cells.iter().zip(all_rates(Rule::TwoStage, &cells)) {
        let what = format!("{} variant(s), pilot {}, cap {}, δ/sd {}", cell.variants, cell.pilot, cell.cap, cell.ratio);
        assert!(r[0] <= bound, "{what}: false better/worse {:.4} > {bound:.4}", r[0]);
        assert!(r[1] <= bound, "{what}: false equivalent {:.4} > {bound:.4}", r[1]);
        // "By more than δ" is one side's claim when the truth sits at that side's δ: its nominal rate is α/2
        // (issue 69: it was held to the two-sided 0.05).
        let one_sided = bound_at(ALPHA / 2.0);
        assert!(r[2] <= one_sided, "{what}: false beyond δ {:.4} > {one_sided:.4}", r[2]);
    }
}

#[test]
fn the_old_rule_and_an_internal_pilot_break_the_bound_the_design_keeps() {
    // One comparison, pilot 3, cap 10, δ/sd 1: where the audit found 0.093.
    let cell = [Cell { pilot: 3, cap: 10, ratio: 1.0, variants: 1, noise: Noise::Normal }];
    let bound = bound();
    for rule in [Rule::Gated, Rule::InternalPilot] {
        let r = all_rates(rule, &cell)[0];
        assert!(r[0] > bound, "the pooled test after a pilot should inflate: {:.4}", r[0]);
    }
    assert!(all_rates(Rule::TwoStage, &cell)[0][0] <= bound);
}

/// One comparison under non-normal differences, pilot 3 and 4, caps 5 and 10, δ/sd 0.5, 1 and 2.
fn non_normal_cells(noise: Noise) -> Vec<Cell> {
    let mut out = Vec::new();
    for (pilot, cap) in [(3, 5), (3, 10), (4, 10)] {
        for ratio in [0.5, 1.0, 2.0] {
            out.push(Cell { pilot, cap, ratio, variants: 1, noise });
        }
    }
    out
}

/// The tests assume normal differences, and docs/results.md says what that is worth: symmetric heavy tails
/// (t with 3 degrees of freedom) keep every rate within its bound (the t-test is conservative there), while
/// skewed differences (a centred exponential) break the false better/worse bound in both designs, where
/// the pilot is small and δ/sd ≤ 1. If either stopped holding, the docs would be wrong.
#[test]
fn the_rates_hold_under_symmetric_heavy_tails_and_not_under_skew() {
    let (bound, one_sided) = (bound(), bound_at(ALPHA / 2.0));
    let heavy = non_normal_cells(Noise::HeavyTailed);
    for (cell, r) in heavy.iter().zip(all_rates(Rule::TwoStage, &heavy)) {
        let what = format!("t(3): pilot {}, cap {}, δ/sd {}", cell.pilot, cell.cap, cell.ratio);
        assert!(r[0] <= bound && r[1] <= bound && r[2] <= one_sided, "{what}: {:.4} {:.4} {:.4}", r[0], r[1], r[2]);
    }
    let skewed = [Cell { pilot: 3, cap: 10, ratio: 1.0, variants: 1, noise: Noise::Skewed }];
    for rule in [Rule::TwoStage, Rule::FixedAtCap] {
        let r = all_rates(rule, &skewed)[0];
        assert!(r[0] > bound, "skewed differences should break the level: {:.4}", r[0]);
    }
}

#[test]
#[ignore = "prints docs/results.md's table under non-normal differences"]
fn print_the_non_normal_table() {
    println!("| differences | pilot | cap | δ/sd | design | false better/worse (0) | false equivalent (±δ) | false beyond δ (±δ) | power at δ |");
    println!("|---|---|---|---|---|---|---|---|---|");
    for (noise, name) in [(Noise::Skewed, "skewed (exponential)"), (Noise::HeavyTailed, "heavy-tailed (t, 3 df)")] {
        let cells = non_normal_cells(noise);
        let designs = [(Rule::TwoStage, "two-stage"), (Rule::FixedAtCap, "fixed at cap")];
        let all: Vec<Vec<[f64; 5]>> = designs.iter().map(|(rule, _)| all_rates(*rule, &cells)).collect();
        for (i, cell) in cells.iter().enumerate() {
            for (d, (_, design)) in designs.iter().enumerate() {
                let r = all[d][i];
                println!(
                    "| {name} | {} | {} | {} | {design} | {:.3} | {:.3} | {:.3} | {:.2} |",
                    cell.pilot, cell.cap, cell.ratio, r[0], r[1], r[2], r[3]
                );
            }
        }
    }
}

#[test]
#[ignore = "prints docs/results.md's table (about a minute)"]
fn print_the_design_table() {
    let cells = cells();
    let designs = [(Rule::TwoStage, "two-stage"), (Rule::FixedAtCap, "fixed at cap"), (Rule::Gated, "before Dec 2026")];
    let all: Vec<Vec<[f64; 5]>> = designs.iter().map(|(rule, _)| all_rates(*rule, &cells)).collect();
    println!("| variants | pilot | cap | δ/sd | design | false better/worse (0) | false equivalent (±δ) | false beyond δ (±δ) | power at δ | seeds per arm |");
    println!("|---|---|---|---|---|---|---|---|---|---|");
    for (i, cell) in cells.iter().enumerate() {
        for (d, (_, name)) in designs.iter().enumerate() {
            let r = all[d][i];
            println!(
                "| {} | {} | {} | {} | {name} | {:.3} | {:.3} | {:.3} | {:.2} | {:.1} |",
                cell.variants,
                cell.pilot,
                cell.cap,
                cell.ratio,
                r[0],
                r[1],
                r[2],
                r[3],
                r[4] / (cell.variants + 1) as f64
            );
        }
    }
}

/// The interaction test (a prediction's `versus:`): per seed, the contrast (A − A's reference) − (B − B's
/// reference) of four independently trained arms, tested as one fixed stage. Simulated with independent
/// unit-normal noise per run (so each contrast has variance 4): with no interaction the two-sided test
/// rejects at about α, and with an interaction of 1.5 the 95% interval covers it about 95% of the time, at
/// 3 and 5 seeds, within 3 standard errors (6,000 replicates). An interval that took the contrast's noise
/// for one run's (a known variance of 1 where it is 4: the normal interval 1.96/√n) fails the coverage
/// bound, so this can fail.
#[test]
fn the_interaction_test_holds_its_level_and_its_interval_covers() {
    for n in [3usize, 5] {
        let mut state = 0x5EED_0000 + n as u64;
        let (mut rejected, mut covered, mut covered_if_narrow) = (0usize, 0usize, 0usize);
        for _ in 0..REPLICATES {
            let contrasts = |state: &mut u64, interaction: f64| -> Vec<f64> {
                (0..n)
                    .map(|_| {
                        let cell = |s: &mut u64, mean: f64| mean + normal(s);
                        let (a, a_ref) = (cell(state, interaction), cell(state, 0.0));
                        let (b, b_ref) = (cell(state, 0.0), cell(state, 0.0));
                        (a - a_ref) - (b - b_ref)
                    })
                    .collect()
            };
            let null = Stages { pilot: contrasts(&mut state, 0.0), added: vec![], planned: false };
            rejected += usize::from(null.difference_p() < ALPHA);
            let truth = 1.5;
            let shifted = contrasts(&mut state, truth);
            let (lo, hi) = Stages { pilot: shifted.clone(), added: vec![], planned: false }.interval().unwrap();
            covered += usize::from(lo <= truth && truth <= hi);
            let (mean, _) = mean_std(&shifted);
            let narrow = 1.96 / (n as f64).sqrt();
            covered_if_narrow += usize::from((mean - truth).abs() <= narrow);
        }
        let rate = |k: usize| k as f64 / REPLICATES as f64;
        let se = (0.05f64 * 0.95 / REPLICATES as f64).sqrt();
        assert!((rate(rejected) - ALPHA).abs() < 3.0 * se, "n={n}: level {}", rate(rejected));
        assert!((rate(covered) - 0.95).abs() < 3.0 * se, "n={n}: coverage {}", rate(covered));
        assert!(rate(covered_if_narrow) < 0.95 - 3.0 * se, "n={n}: the narrow interval {}", rate(covered_if_narrow));
    }
}

/// The learning-rate sensitivity's interval (`ablate::stats::Sensitivity`, Wortsman et al. 2023), simulated
/// over seven rates with spreads growing with the rate (0.5σ to 2σ), 4,000 replicates per case: a curve
/// with a clear optimum (sensitivity 0.40 at σ = 0.02 and 0.1) and a nearly flat one (0.066, where the best
/// rate is a toss-up at σ = 0.1 and the minimum of noisy means biases the estimate). The delta-method
/// t interval covers at least 93% of the time with a clear optimum and at least 90% on the flat curve, at 3
/// and 5 seeds (docs/results.md gives the simulated rates); the percentile bootstrap over seeds, the obvious
/// alternative, covers 21–90% on the same draws (worst on the flat curve) and fails the same bounds at 3 seeds.
#[test]
fn the_sensitivity_interval_covers_what_it_states() {
    let clear = [3.0, 2.5, 2.2, 2.1, 2.12, 2.4, 3.2];
    let flat = [2.3, 2.2, 2.15, 2.14, 2.15, 2.2, 2.3];
    let truth = |mu: &[f64]| {
        let best = mu.iter().cloned().fold(f64::INFINITY, f64::min);
        mu.iter().map(|m| m - best).sum::<f64>() / mu.len() as f64
    };
    let replicates = 4000;
    for (curve, floor) in [(&clear, 0.93), (&flat, 0.90)] {
        for sigma in [0.02, 0.1] {
            for n in [3usize, 5] {
                let mut state = 0xC0FF_EE00 + n as u64 + (sigma * 1000.0) as u64;
                let (mut covered, mut bootstrap_covered) = (0usize, 0usize);
                let target = truth(curve);
                for _ in 0..replicates {
                    let cells: Vec<Vec<f64>> = curve
                        .iter()
                        .enumerate()
                        .map(|(i, mu)| {
                            let sd = sigma * (0.5 + 1.5 * i as f64 / 6.0);
                            (0..n).map(|_| mu + sd * normal(&mut state)).collect()
                        })
                        .collect();
                    let s = ablate::stats::Sensitivity::of(&cells).unwrap();
                    let (lo, hi) = s.interval().unwrap();
                    covered += usize::from(lo <= target && target <= hi);
                    // The percentile bootstrap: resample seeds within each rate, 200 draws.
                    let mut draws: Vec<f64> = (0..200)
                        .map(|_| {
                            let resampled: Vec<Vec<f64>> = cells
                                .iter()
                                .map(|c| (0..n).map(|_| c[(splitmix64(&mut state) % n as u64) as usize]).collect())
                                .collect();
                            ablate::stats::Sensitivity::of(&resampled).unwrap().value
                        })
                        .collect();
                    draws.sort_by(f64::total_cmp);
                    bootstrap_covered += usize::from(draws[5] <= target && target <= draws[194]);
                }
                let rate = covered as f64 / replicates as f64;
                let bootstrap = bootstrap_covered as f64 / replicates as f64;
                println!("sensitivity {target:.3} σ {sigma} n {n}: delta-method t {rate:.3}, bootstrap {bootstrap:.3}");
                assert!(rate >= floor, "{target:.3} σ {sigma} n {n}: coverage {rate}");
                if n == 3 {
                    assert!(bootstrap < floor, "the bootstrap would pass too ({bootstrap}): the bound cannot fail");
                }
            }
        }
    }
}
