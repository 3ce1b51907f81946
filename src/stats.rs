//! The statistics a results table reports: the sample mean and standard deviation of a variant's seeds, a
//! Student-t confidence interval for its mean, a paired comparison with a baseline variant over shared
//! seeds, and the test that decides whether a rerun reproduces a reference. Torch-free.
use statrs::distribution::{ContinuousCDF, StudentsT};

/// The confidence level of every interval ablate reports.
pub const CONFIDENCE: f64 = 0.95;

/// Mean and sample standard deviation (n − 1 in the denominator; 0 for a single value).
pub fn mean_std(values: &[f64]) -> (f64, f64) {
    let n = values.len() as f64;
    let mean = values.iter().sum::<f64>() / n;
    if values.len() < 2 {
        return (mean, 0.0);
    }
    let var = values.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / (n - 1.0);
    (mean, var.sqrt())
}

/// The two-sided `CONFIDENCE` quantile of Student's t with `df` degrees of freedom (12.706 for df = 1,
/// 4.303 for df = 2).
pub fn t_critical(df: f64) -> f64 {
    let t = StudentsT::new(0.0, 1.0, df).expect("df > 0");
    t.inverse_cdf(0.5 + CONFIDENCE / 2.0)
}

/// Two-sided p-value of a t statistic with `df` degrees of freedom.
fn two_sided_p(t: f64, df: f64) -> f64 {
    if t.is_nan() {
        return f64::NAN;
    }
    if t.is_infinite() {
        return 0.0;
    }
    let dist = StudentsT::new(0.0, 1.0, df).expect("df > 0");
    (2.0 * dist.cdf(-t.abs())).min(1.0)
}

/// A sample described for a table: n, mean, sample std and the half-width of the confidence interval of
/// the mean (`None` below two values, where no interval exists).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Estimate {
    pub n: usize,
    pub mean: f64,
    pub std: f64,
    pub half_width: Option<f64>,
}

impl Estimate {
    pub fn of(values: &[f64]) -> Estimate {
        let (mean, std) = mean_std(values);
        let n = values.len();
        let half_width = (n >= 2).then(|| t_critical(n as f64 - 1.0) * std / (n as f64).sqrt());
        Estimate { n, mean, std, half_width }
    }
}

/// A variant against a baseline over the seeds both ran: per-seed differences (variant − baseline), their
/// mean with its confidence interval, and the paired t-test's two-sided p-value.
#[derive(Debug, Clone, PartialEq)]
pub struct Paired {
    pub seeds: Vec<u64>,
    pub differences: Vec<f64>,
    pub difference: Estimate,
    pub t: f64,
    pub p: f64,
}

/// Pairs `variant` with `baseline` by seed. `None` below two shared seeds (no spread to test against).
pub fn paired(baseline: &[(u64, f64)], variant: &[(u64, f64)]) -> Option<Paired> {
    let mut seeds = Vec::new();
    let mut differences = Vec::new();
    for &(seed, v) in variant {
        if let Some(&(_, b)) = baseline.iter().find(|(s, _)| *s == seed) {
            seeds.push(seed);
            differences.push(v - b);
        }
    }
    if differences.len() < 2 {
        return None;
    }
    let difference = Estimate::of(&differences);
    let se = difference.std / (difference.n as f64).sqrt();
    let t = if se > 0.0 {
        difference.mean / se
    } else if difference.mean == 0.0 {
        // Identical on every seed: no evidence of a difference.
        0.0
    } else {
        f64::INFINITY.copysign(difference.mean)
    };
    let p = two_sided_p(t, difference.n as f64 - 1.0);
    Some(Paired { seeds, differences, difference, t, p })
}

/// Welch's unequal-variance t-test of two independent samples (each of at least two values): the two-sided
/// p-value of "same mean".
pub fn welch_p(a: &[f64], b: &[f64]) -> f64 {
    let (ea, eb) = (Estimate::of(a), Estimate::of(b));
    let (va, vb) = (ea.std.powi(2) / ea.n as f64, eb.std.powi(2) / eb.n as f64);
    let se2 = va + vb;
    if se2 == 0.0 {
        return if ea.mean == eb.mean { 1.0 } else { 0.0 };
    }
    let t = (ea.mean - eb.mean) / se2.sqrt();
    let df = se2.powi(2) / (va.powi(2) / (ea.n as f64 - 1.0) + vb.powi(2) / (eb.n as f64 - 1.0));
    two_sided_p(t, df)
}

/// Whether a rerun's values of a metric agree with a reference's, and the rule that decided.
#[derive(Debug, Clone, PartialEq)]
pub struct Agreement {
    pub reproduces: bool,
    pub rule: String,
}

/// Relative tolerance for comparing single runs, where no spread is known: what bit-level differences
/// between CPUs and libtorch builds move a final metric by, with room to spare.
pub const SINGLE_RUN_TOLERANCE: f64 = 0.01;

/// Decides whether `new` reproduces `reference` (both the values of one metric over seeds):
/// - both with ≥ 2 values: Welch's t-test, reproduces unless p < 1 − `CONFIDENCE`;
/// - one side a single value, the other ≥ 2: the single value must lie in the other side's
///   `CONFIDENCE` prediction interval for one new observation, mean ± t·s·√(1 + 1/n);
/// - single values on both sides: within `SINGLE_RUN_TOLERANCE` relative (absolute below 1e-9).
pub fn agreement(reference: &[f64], new: &[f64]) -> Agreement {
    let alpha = 1.0 - CONFIDENCE;
    match (reference.len(), new.len()) {
        (0, _) | (_, 0) => Agreement { reproduces: false, rule: "no values to compare".into() },
        (1, 1) => {
            let (r, v) = (reference[0], new[0]);
            let rel = (v - r).abs() / r.abs().max(1e-9);
            Agreement {
                reproduces: rel <= SINGLE_RUN_TOLERANCE,
                rule: format!("single runs, {:.2}% apart (tolerance {}%)", 100.0 * rel, 100.0 * SINGLE_RUN_TOLERANCE),
            }
        }
        (1, _) | (_, 1) => {
            let (single, sample, which) =
                if new.len() == 1 { (new[0], reference, "reference") } else { (reference[0], new, "rerun") };
            let e = Estimate::of(sample);
            let half = t_critical(e.n as f64 - 1.0) * e.std * (1.0 + 1.0 / e.n as f64).sqrt();
            Agreement {
                reproduces: (single - e.mean).abs() <= half,
                rule: format!(
                    "{}% prediction interval of the {which}'s {} seeds: [{:.4}, {:.4}]",
                    100.0 * CONFIDENCE,
                    e.n,
                    e.mean - half,
                    e.mean + half
                ),
            }
        }
        _ => {
            let p = welch_p(reference, new);
            Agreement { reproduces: p >= alpha, rule: format!("Welch t-test p = {}", format_p(p)) }
        }
    }
}

/// A p-value as papers print it: three significant digits, `< 0.001` below that.
pub fn format_p(p: f64) -> String {
    if p.is_nan() {
        "–".into()
    } else if p < 0.001 {
        "< 0.001".into()
    } else {
        format!("{p:.3}")
    }
}

/// Holm–Bonferroni adjusted p-values of a family of tests, in the order given: the k-th smallest of the m
/// p-values times (m − k + 1), made non-decreasing in that order and capped at 1, which controls the
/// family-wise error rate at the level it is compared with (statsmodels' `multipletests(method="holm")`).
/// NaN p-values (comparisons that could not be tested) are left out of the family and stay NaN.
pub fn holm(p: &[f64]) -> Vec<f64> {
    let mut order: Vec<usize> = (0..p.len()).filter(|&i| !p[i].is_nan()).collect();
    order.sort_by(|&a, &b| p[a].total_cmp(&p[b]));
    let m = order.len();
    let mut adjusted = vec![f64::NAN; p.len()];
    let mut running = 0.0f64;
    for (k, &i) in order.iter().enumerate() {
        running = running.max(((m - k) as f64 * p[i]).min(1.0));
        adjusted[i] = running;
    }
    adjusted
}

/// The significance level of every test ablate reports, and the power its sample-size planning aims for.
pub const ALPHA: f64 = 0.05;
pub const POWER: f64 = 0.8;

/// The CDF at `x` of Student's t with `df` degrees of freedom and noncentrality `ncp`:
/// P(T ≤ x) = E[Φ(x·S/√df − ncp)] over S = √V, V ~ χ²(df), integrated numerically (Simpson's rule over S,
/// whose density stays finite at 0 for every df; 4,000 intervals reach 1e-9 of statsmodels' values).
fn noncentral_t_cdf(x: f64, df: f64, ncp: f64) -> f64 {
    use statrs::distribution::Normal;
    use statrs::function::gamma::ln_gamma;
    let normal = Normal::new(0.0, 1.0).expect("a standard normal");
    // Density of S = √V: 2 s^(df−1) e^(−s²/2) / (2^(df/2) Γ(df/2)).
    let ln_norm = (df / 2.0) * std::f64::consts::LN_2 + ln_gamma(df / 2.0) - std::f64::consts::LN_2;
    let density = |s: f64| {
        if s == 0.0 {
            return if df == 1.0 { (-ln_norm).exp() } else { 0.0 };
        }
        ((df - 1.0) * s.ln() - s * s / 2.0 - ln_norm).exp()
    };
    let f = |s: f64| normal.cdf(x * s / df.sqrt() - ncp) * density(s);
    let upper = (df + 40.0 * (2.0 * df).sqrt() + 100.0).sqrt();
    let intervals = 4000;
    let h = upper / intervals as f64;
    let inner: f64 = (1..intervals).map(|i| f(i as f64 * h) * if i % 2 == 1 { 4.0 } else { 2.0 }).sum();
    ((f(0.0) + inner + f(upper)) * h / 3.0).clamp(0.0, 1.0)
}

/// The power of a two-sided paired t-test at level `ALPHA` with `n` pairs to detect a mean difference of
/// `effect` standard deviations of the differences (Cohen's d of the differences); statsmodels'
/// `TTestPower().power`.
pub fn paired_t_power(effect: f64, n: usize) -> f64 {
    paired_t_power_at(effect, n, ALPHA)
}

/// The smallest effect (in standard deviations of the paired differences) that `n` pairs detect with
/// power `POWER`; statsmodels' `TTestPower().solve_power(nobs=n, power=0.8)`.
pub fn minimum_detectable_effect(n: usize) -> f64 {
    let (mut lo, mut hi) = (0.0f64, 1.0f64);
    while paired_t_power(hi, n) < POWER {
        hi *= 2.0;
    }
    for _ in 0..60 {
        let mid = (lo + hi) / 2.0;
        if paired_t_power(mid, n) < POWER {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    (lo + hi) / 2.0
}

/// The fewest pairs (seeds) that detect `effect` standard deviations of the differences with power
/// `POWER`: statsmodels' `solve_power(effect_size=effect, power=0.8)` rounded up. `None` for no effect, or
/// above 10,000 seeds.
pub fn seeds_needed(effect: f64) -> Option<usize> {
    let effect = effect.abs();
    if effect.is_nan() || effect == 0.0 || effect.is_infinite() {
        return None;
    }
    fewest_pairs(|n| paired_t_power(effect, n) >= POWER)
}

/// The fewest pairs (from 2) for which `enough` holds, `enough` growing with the pairs; `None` above
/// `MOST_SEEDS`. Power grows with the pairs: double until it is reached, then halve the gap.
fn fewest_pairs(enough: impl Fn(usize) -> bool) -> Option<usize> {
    let (mut lo, mut hi) = (1, 2);
    while !enough(hi) {
        if hi >= MOST_SEEDS {
            return None;
        }
        (lo, hi) = (hi, (hi * 2).min(MOST_SEEDS));
    }
    // Reached at `hi` and not at `lo` (or `lo` is below a test's two pairs).
    while hi - lo > 1 {
        let mid = (lo + hi) / 2;
        if enough(mid) {
            hi = mid;
        } else {
            lo = mid;
        }
    }
    Some(hi)
}

/// The power of a two-sided paired t-test at level `alpha` with `n` pairs to detect a mean difference of
/// `effect` standard deviations of the differences.
pub fn paired_t_power_at(effect: f64, n: usize, alpha: f64) -> f64 {
    assert!(n >= 2, "a paired t-test needs two pairs");
    let df = n as f64 - 1.0;
    let ncp = effect * (n as f64).sqrt();
    let critical = StudentsT::new(0.0, 1.0, df).expect("df > 0").inverse_cdf(1.0 - alpha / 2.0);
    1.0 - noncentral_t_cdf(critical, df, ncp) + noncentral_t_cdf(-critical, df, ncp)
}

/// A lower bound on the power of TOST at level `alpha` with `n` pairs, margin ±`margin` and a true mean
/// difference of 0 (both in standard deviations of the differences): each one-sided test's power from the
/// noncentral t, joined by P(A ∩ B) ≥ P(A) + P(B) − 1. The bound is tight where the power is high, which
/// is where seeds are planned (0.8), and errs towards more seeds.
pub fn tost_power_lower_bound(margin: f64, n: usize, alpha: f64) -> f64 {
    assert!(n >= 2, "a paired test needs two pairs");
    let df = n as f64 - 1.0;
    let ncp = margin * (n as f64).sqrt();
    let critical = StudentsT::new(0.0, 1.0, df).expect("df > 0").inverse_cdf(1.0 - alpha);
    // P(T_lower > t_c) with T_lower ~ t(df, +ncp); by symmetry P(T_upper < −t_c) is the same.
    let one_sided = 1.0 - noncentral_t_cdf(critical, df, ncp);
    (2.0 * one_sided - 1.0).max(0.0)
}

/// The most seeds a plan or a verdict names; beyond it a comparison is called unsettleable here.
pub const MOST_SEEDS: usize = 10_000;

/// The pairs (seeds) that settle a comparison whose paired differences have standard deviation `sd`, at
/// the smallest effect that matters `delta`, tested at level `alpha` (a family's Bonferroni level, the first
/// step of Holm): enough that the paired t-test detects a difference of δ with power `POWER`, and that TOST
/// declares equivalence within ±δ with power `POWER` when there is no difference. Whichever way the truth
/// lies, a verdict is then likely. It is a planning rule for a fixed design: testing the pooled seeds with
/// the plain tests after choosing their number from a pilot does not keep the tests' error rates (see
/// `design`, which does). `None` above `MOST_SEEDS` (or with no spread to plan from).
pub fn seeds_to_settle(sd: f64, delta: f64, alpha: f64) -> Option<usize> {
    if !(sd.is_finite() && sd > 0.0 && delta.is_finite() && delta > 0.0) {
        return None;
    }
    fewest_pairs(|n| settles(delta / sd, n, alpha))
}

/// Whether `n` pairs settle a comparison whose margin is `effect` standard deviations of the differences,
/// at level `alpha`: power `POWER` for both the paired t-test at the margin and TOST at no difference (the
/// rule of [`seeds_to_settle`]).
pub fn settles(effect: f64, n: usize, alpha: f64) -> bool {
    paired_t_power_at(effect, n, alpha) >= POWER && tost_power_lower_bound(effect, n, alpha) >= POWER
}

/// What a comparison settles to, by fixed rules over one family of comparisons (Holm-adjusted):
/// better or worse when the difference test's adjusted p is below `ALPHA` (*beyond δ* when the margin test's
/// is too: the 95% interval lies past the margin); equivalent within ±δ when TOST's adjusted p is; otherwise
/// inconclusive, with the seeds that would settle it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Verdict {
    /// Significantly better; `negligible` when the whole difference also lies within ±δ (TOST rejects
    /// too): real, but smaller than what matters; `beyond` when it is shown to be larger than δ.
    Better {
        negligible: bool,
        beyond: bool,
    },
    Worse {
        negligible: bool,
        beyond: bool,
    },
    /// No difference larger than δ either way.
    Equivalent,
    /// Neither: `seeds` (in total, per arm) would settle it in a fixed design, `None` above `MOST_SEEDS`.
    Inconclusive {
        seeds: Option<usize>,
    },
    /// Seeds were added to settle it, but its second stage has fewer than the two it is tested on: the
    /// design is unfinished and nothing is decided (`added`: the seeds it has beyond the pilot).
    Incomplete {
        added: usize,
    },
    /// Fewer than two shared seeds: no test.
    Untested,
}

/// The Holm-adjusted p-values a verdict reads: the difference (two-sided), TOST's equivalence within ±δ,
/// and the margin tests "above +δ" and "below −δ".
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Adjusted {
    pub difference: f64,
    pub equivalence: f64,
    pub above_margin: f64,
    pub below_margin: f64,
}

impl Verdict {
    /// Decides from the mean difference (variant − reference), whether higher is better, the Holm-adjusted
    /// p-values and the seeds-to-settle rule's answer.
    pub fn decide(mean: f64, higher_is_better: bool, p: Adjusted, seeds: Option<usize>) -> Verdict {
        if p.difference.is_nan() || p.equivalence.is_nan() {
            return Verdict::Untested;
        }
        let negligible = p.equivalence < ALPHA;
        if p.difference < ALPHA {
            let up = mean > 0.0;
            let beyond = if up { p.above_margin < ALPHA } else { p.below_margin < ALPHA };
            if up == higher_is_better {
                Verdict::Better { negligible, beyond }
            } else {
                Verdict::Worse { negligible, beyond }
            }
        } else if negligible {
            Verdict::Equivalent
        } else {
            Verdict::Inconclusive { seeds }
        }
    }

    /// The word a table prints, with δ: `better`, `worse`, `equivalent (±0.01)`, `inconclusive (≈ 11 seeds)`.
    pub fn describe(&self, delta: &str) -> String {
        match self {
            Verdict::Better { beyond: true, .. } => format!("better, by more than {delta}"),
            Verdict::Worse { beyond: true, .. } => format!("worse, by more than {delta}"),
            Verdict::Better { negligible: false, .. } => "better".into(),
            Verdict::Worse { negligible: false, .. } => "worse".into(),
            Verdict::Better { negligible: true, .. } => format!("better, by less than ±{delta}"),
            Verdict::Worse { negligible: true, .. } => format!("worse, by less than ±{delta}"),
            Verdict::Equivalent => format!("equivalent (±{delta})"),
            Verdict::Inconclusive { seeds: Some(n) } => {
                format!("inconclusive (a fixed design of about {n} seeds would settle it)")
            }
            Verdict::Inconclusive { seeds: None } => {
                format!("inconclusive (more than {MOST_SEEDS} seeds would be needed)")
            }
            Verdict::Incomplete { added } => {
                format!("incomplete (its second stage has {added} added seed(s); it is tested on two or more)")
            }
            Verdict::Untested => {
                "untested (fewer than two shared seeds, or a stage whose differences are all equal)".into()
            }
        }
    }

    /// The verdict's class in one word (for counting and for `verdicts.csv`).
    pub fn word(&self) -> &'static str {
        match self {
            Verdict::Better { .. } => "better",
            Verdict::Worse { .. } => "worse",
            Verdict::Equivalent => "equivalent",
            Verdict::Inconclusive { .. } => "inconclusive",
            Verdict::Incomplete { .. } => "incomplete",
            Verdict::Untested => "untested",
        }
    }

    pub fn is_decided(&self) -> bool {
        matches!(self, Verdict::Better { .. } | Verdict::Worse { .. } | Verdict::Equivalent)
    }
}

/// Whether a comparison decided at two scales agrees: `holds at both` (the same decided direction, or
/// equivalent at both), `sign differs` (better at one, worse at the other), else `one scale only` (decided at
/// one, or decided differently short of a reversal), or `inconclusive at both`.
pub fn across_scales(here: Verdict, there: Verdict) -> &'static str {
    use Verdict::*;
    match (here, there) {
        (Better { .. }, Better { .. }) | (Worse { .. }, Worse { .. }) | (Equivalent, Equivalent) => "holds at both",
        (Better { .. }, Worse { .. }) | (Worse { .. }, Better { .. }) => "sign differs",
        (a, b) if !a.is_decided() && !b.is_decided() => "inconclusive at both",
        _ => "one scale only",
    }
}

/// A power law y = c · x^(−α) fitted to points (x, y), both positive: least squares on log y against log x
/// (Kaplan et al. 2020 fit L(N) = (N_c / N)^α_N this way), with a percentile bootstrap interval for α.
#[derive(Debug, Clone, PartialEq)]
pub struct PowerLaw {
    /// α: the exponent of the decay (positive when y falls as x grows).
    pub exponent: f64,
    /// c: y at x = 1.
    pub coefficient: f64,
    /// The 95% percentile bootstrap interval of α over resampled points; `None` with fewer than three
    /// distinct x values (a resample would often hold one).
    pub interval: Option<(f64, f64)>,
    /// R² of the fit on log axes.
    pub r_squared: f64,
    pub points: usize,
}

/// The next number of splitmix64 from `state` (advanced): a small generator of our own, the same on every
/// machine, for draws that must not touch libtorch's (bootstrap resamples, fixed held-out sets).
pub fn splitmix64(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// The learning-rate sensitivity of a loss over a grid of rates (Wortsman et al. 2023, "Small-scale proxies
/// for large-scale Transformer training instabilities", §3.2): the mean over the grid's cells of (the cell's
/// mean loss − the best cell's mean), each run's loss first capped at its loss at initialisation (a diverged
/// run counts as that loss). 0 for a flat curve; large when most rates are far from the best.
#[derive(Debug, Clone, PartialEq)]
pub struct Sensitivity {
    pub value: f64,
    /// Which cell is best (lowest mean).
    pub best: usize,
    /// Each cell's term of the variance, c²·s²/n (c = 1/k, minus 1 at the best cell), and its degrees of
    /// freedom n − 1: the interval's standard error and Welch–Satterthwaite degrees of freedom.
    parts: Vec<(f64, f64)>,
}

impl Sensitivity {
    /// From each cell's capped losses (one per seed); `None` for an empty grid or an empty cell.
    pub fn of(cells: &[Vec<f64>]) -> Option<Sensitivity> {
        if cells.is_empty() || cells.iter().any(|c| c.is_empty()) {
            return None;
        }
        let means: Vec<f64> = cells.iter().map(|c| mean_std(c).0).collect();
        let best = (0..means.len()).min_by(|&a, &b| means[a].total_cmp(&means[b]))?;
        let k = means.len() as f64;
        let value = means.iter().map(|m| m - means[best]).sum::<f64>() / k;
        let parts = cells
            .iter()
            .enumerate()
            .map(|(i, c)| {
                let coefficient = 1.0 / k - f64::from(u8::from(i == best));
                let n = c.len() as f64;
                (coefficient * coefficient * mean_std(c).1.powi(2) / n, n - 1.0)
            })
            .collect();
        Some(Sensitivity { value, best, parts })
    }

    /// The 95% interval: value ± t · SE, the best cell taken as known (the delta method), with
    /// Welch–Satterthwaite degrees of freedom; `None` where a cell has one run. Simulated coverage:
    /// `tests/sequential.rs` (and docs/results.md).
    pub fn interval(&self) -> Option<(f64, f64)> {
        let half = half_width(&self.parts)?;
        Some((self.value - half, self.value + half))
    }

    /// `self − other` (two arms' sensitivities, their runs independent) with its 95% interval.
    pub fn difference(&self, other: &Sensitivity) -> (f64, Option<(f64, f64)>) {
        let d = self.value - other.value;
        let parts: Vec<(f64, f64)> = self.parts.iter().chain(&other.parts).copied().collect();
        (d, half_width(&parts).map(|h| (d - h, d + h)))
    }
}

/// t · √(Σ v) with Welch–Satterthwaite degrees of freedom over `(v, df)` terms; `None` where a term has no
/// degrees of freedom.
fn half_width(parts: &[(f64, f64)]) -> Option<f64> {
    if parts.iter().any(|&(_, df)| df < 1.0) {
        return None;
    }
    let variance: f64 = parts.iter().map(|p| p.0).sum();
    if variance == 0.0 {
        return Some(0.0);
    }
    let df = variance.powi(2) / parts.iter().map(|&(v, df)| v * v / df).sum::<f64>();
    Some(t_critical(df) * variance.sqrt())
}

/// Least squares of log y on log x: (slope, intercept, R²); `None` unless two x values differ.
fn log_log_line(points: &[(f64, f64)]) -> Option<(f64, f64, f64)> {
    let n = points.len() as f64;
    let logs: Vec<(f64, f64)> = points.iter().map(|&(x, y)| (x.ln(), y.ln())).collect();
    let (mx, my) = (logs.iter().map(|p| p.0).sum::<f64>() / n, logs.iter().map(|p| p.1).sum::<f64>() / n);
    let sxx: f64 = logs.iter().map(|p| (p.0 - mx).powi(2)).sum();
    if sxx <= 1e-24 {
        return None;
    }
    let sxy: f64 = logs.iter().map(|p| (p.0 - mx) * (p.1 - my)).sum();
    let slope = sxy / sxx;
    let intercept = my - slope * mx;
    let syy: f64 = logs.iter().map(|p| (p.1 - my).powi(2)).sum();
    let residual: f64 = logs.iter().map(|p| (p.1 - intercept - slope * p.0).powi(2)).sum();
    let r_squared = if syy > 0.0 { 1.0 - residual / syy } else { 1.0 };
    Some((slope, intercept, r_squared))
}

/// Fits [`PowerLaw`] to `points` (pairs with a non-positive coordinate are refused), with `resamples`
/// bootstrap draws seeded by `seed` (splitmix64, so the interval is the same on every machine).
pub fn fit_power_law(points: &[(f64, f64)], resamples: usize, seed: u64) -> Result<PowerLaw, String> {
    if let Some(bad) = points.iter().find(|(x, y)| !(*x > 0.0 && *y > 0.0 && x.is_finite() && y.is_finite())) {
        return Err(format!("a power law needs positive values; got ({}, {})", bad.0, bad.1));
    }
    let (slope, intercept, r_squared) =
        log_log_line(points).ok_or_else(|| "a power law needs at least two different x values".to_string())?;
    let mut distinct: Vec<f64> = points.iter().map(|p| p.0).collect();
    distinct.sort_by(f64::total_cmp);
    distinct.dedup();
    let interval = (distinct.len() >= 3 && resamples > 0).then(|| {
        let mut state = seed;
        let mut next = || splitmix64(&mut state);
        let mut exponents: Vec<f64> = (0..resamples)
            .filter_map(|_| {
                let sample: Vec<(f64, f64)> =
                    (0..points.len()).map(|_| points[(next() % points.len() as u64) as usize]).collect();
                log_log_line(&sample).map(|(s, _, _)| -s)
            })
            .collect();
        exponents.sort_by(f64::total_cmp);
        let at = |q: f64| exponents[((q * (exponents.len() - 1) as f64).round() as usize).min(exponents.len() - 1)];
        (at(0.025), at(0.975))
    });
    Ok(PowerLaw { exponent: -slope, coefficient: intercept.exp(), interval, r_squared, points: points.len() })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Three rates of two seeds each, by hand: means 1.1, 0.6 and 2.2, so the best is the second and the
    /// sensitivity (0.5 + 0 + 1.6) / 3 = 0.7; variance terms (1/9, 4/9, 1/9) · s²/2 with s² = 0.02, 0.02,
    /// 0.08 sum to 0.01 on 2.4545 Welch–Satterthwaite degrees of freedom, so the half-width is
    /// t(0.975, 2.4545) · 0.1 = 0.362246 (SciPy's `stats.t.ppf`).
    #[test]
    fn the_sensitivity_and_its_interval_by_hand() {
        let cells = vec![vec![1.0, 1.2], vec![0.5, 0.7], vec![2.0, 2.4]];
        let s = Sensitivity::of(&cells).unwrap();
        assert_eq!(s.best, 1);
        assert!((s.value - 0.7).abs() < 1e-12);
        let (lo, hi) = s.interval().unwrap();
        assert!((lo - 0.3377535617562668).abs() < 1e-6 && (hi - 1.062246438243733).abs() < 1e-6, "{lo} {hi}");
        let flat = Sensitivity::of(&[vec![1.0, 1.0], vec![1.0, 1.0]]).unwrap();
        assert_eq!((flat.value, flat.interval()), (0.0, Some((0.0, 0.0))));
        assert_eq!(Sensitivity::of(&[vec![1.0], vec![2.0]]).unwrap().interval(), None, "one seed: no interval");
        let (d, interval) = s.difference(&flat);
        assert!((d - 0.7).abs() < 1e-12 && interval.is_some_and(|(lo, _)| (lo - 0.3377535617562668).abs() < 1e-6));
    }

    #[test]
    fn a_power_law_fit_recovers_a_known_exponent_inside_its_bootstrap_interval() {
        // y = 5 · x^−0.076 (Kaplan et al.'s α_N) at six sizes × three seeds, with multiplicative noise of
        // about 1% from a fixed sequence: α recovered within its interval, and the interval narrow.
        let noise = [
            0.011, -0.007, 0.003, -0.012, 0.008, -0.002, 0.006, -0.009, 0.001, 0.010, -0.004, -0.006, 0.007, -0.011,
            0.002, 0.009, -0.003, -0.005,
        ];
        let sizes = [1e4, 3e4, 1e5, 3e5, 1e6, 3e6];
        let points: Vec<(f64, f64)> = sizes
            .iter()
            .enumerate()
            .flat_map(|(i, &n)| (0..3).map(move |s| (i, s, n)))
            .map(|(i, s, n)| (n, 5.0 * f64::powf(n, -0.076) * (1.0 + noise[3 * i + s])))
            .collect();
        let fit = fit_power_law(&points, 2000, 7).unwrap();
        let (lo, hi) = fit.interval.unwrap();
        assert!(lo < 0.076 && 0.076 < hi, "{fit:?}");
        assert!((fit.exponent - 0.076).abs() < 0.005 && hi - lo < 0.02, "{fit:?}");
        assert!(fit.r_squared > 0.9, "{fit:?}");
        // Without noise the fit is exact; the same seed gives the same interval.
        let exact: Vec<(f64, f64)> = sizes.iter().map(|&n| (n, 2.0 * n.powf(-0.3))).collect();
        let e = fit_power_law(&exact, 500, 1).unwrap();
        assert!((e.exponent - 0.3).abs() < 1e-12 && (e.coefficient - 2.0).abs() < 1e-9, "{e:?}");
        assert_eq!(fit_power_law(&points, 2000, 7).unwrap().interval, fit.interval);
        assert!(fit_power_law(&[(1.0, 1.0), (1.0, 2.0)], 10, 1).is_err());
        assert!(fit_power_law(&[(1.0, 1.0), (0.0, 2.0)], 10, 1).unwrap_err().contains("positive"));
    }

    // Reference values computed once with SciPy 1.17.1 and NumPy:
    //   scipy.stats.t.ppf(0.975, df) for df 1, 2, 4
    //   numpy.std([2.41, 2.45, 2.38], ddof=1)
    //   scipy.stats.ttest_rel([2.30, 2.39, 2.33, 2.41], [2.41, 2.45, 2.38, 2.50])
    //   scipy.stats.ttest_ind([0.91, 0.93, 0.92], [0.88, 0.90, 0.86, 0.89], equal_var=False)
    const TTEST_REL_T: f64 = -5.628616053819832;
    const TTEST_REL_P: f64 = 0.01109156763977864;
    const WELCH_P: f64 = 0.015752005371269615;

    fn close(a: f64, b: f64, tol: f64) -> bool {
        (a - b).abs() <= tol * b.abs().max(1e-12)
    }

    // Reference values computed once with statsmodels 0.14 (`pip install statsmodels`):
    //   statsmodels.stats.multitest.multipletests(p, method="holm")[1]
    //   statsmodels.stats.power.TTestPower().power(effect_size=d, nobs=n, alpha=0.05, alternative="two-sided")
    //   TTestPower().solve_power(effect_size=None, nobs=n, alpha=0.05, power=0.8, alternative="two-sided")
    //   TTestPower().solve_power(effect_size=d, nobs=None, alpha=0.05, power=0.8, alternative="two-sided")
    #[test]
    fn holm_adjusts_like_statsmodels_multipletests() {
        let cases: [(&[f64], &[f64]); 3] = [
            (&[0.187, 0.009, 0.025, 0.056], &[0.187, 0.036, 0.075, 0.112]),
            (&[0.01, 0.04, 0.03, 0.005, 0.5], &[0.04, 0.09, 0.09, 0.025, 0.5]),
            (&[0.02, 0.02, 0.02], &[0.06, 0.06, 0.06]),
        ];
        for (p, expected) in cases {
            let adjusted = holm(p);
            for (a, e) in adjusted.iter().zip(expected) {
                assert!(close(*a, *e, 1e-12), "{p:?}: {adjusted:?}");
            }
        }
        let with_gap = holm(&[0.01, f64::NAN, 0.04]);
        assert!(with_gap[1].is_nan() && close(with_gap[0], 0.02, 1e-12) && close(with_gap[2], 0.04, 1e-12));
    }

    #[test]
    fn paired_t_power_matches_statsmodels() {
        let cases = [
            (1.0, 3, 0.1792553937765517),
            (1.0, 5, 0.4013899173717948),
            (0.5, 10, 0.2931756065140767),
            (2.0, 3, 0.4707494312784346),
            (0.8, 20, 0.9238987553885781),
        ];
        for (d, n, expected) in cases {
            let p = paired_t_power(d, n);
            assert!((p - expected).abs() < 1e-6, "d {d}, n {n}: {p} against {expected}");
        }
    }

    #[test]
    fn detectable_effects_and_seeds_needed_match_statsmodels() {
        for (n, expected) in
            [(2, 11.549889754978167), (3, 3.264043552819638), (5, 1.6819970833232674), (10, 0.9960019107624178)]
        {
            let d = minimum_detectable_effect(n);
            assert!(close(d, expected, 1e-5), "n {n}: {d} against {expected}");
        }
        // statsmodels' fractional solutions 33.37, 9.94, 4.22 pairs, rounded up to whole seeds.
        assert_eq!(seeds_needed(0.5), Some(34));
        assert_eq!(seeds_needed(1.0), Some(10));
        assert_eq!(seeds_needed(-2.0), Some(5));
        assert_eq!(seeds_needed(0.0), None);
    }

    #[test]
    fn t_quantiles_match_scipy() {
        for (df, expected) in [(1.0, 12.706204736174694), (2.0, 4.302652729749462), (4.0, 2.7764451051977934)] {
            assert!(close(t_critical(df), expected, 1e-9), "df {df}: {}", t_critical(df));
        }
    }

    #[test]
    fn sample_std_and_interval() {
        let e = Estimate::of(&[2.41, 2.45, 2.38]);
        assert!(close(e.mean, 2.4133333333333336, 1e-12));
        // numpy.std(x, ddof=1)
        assert!(close(e.std, 0.035118845842842, 1e-9));
        assert!(close(e.half_width.unwrap(), 4.302652729749464 * 0.035118845842842 / 3f64.sqrt(), 1e-9));
        assert_eq!(Estimate::of(&[1.0]).half_width, None);
    }

    #[test]
    fn paired_test_matches_scipy_ttest_rel() {
        let baseline = [(0, 2.41), (1, 2.45), (2, 2.38), (3, 2.50)];
        let variant = [(0, 2.30), (1, 2.39), (2, 2.33), (3, 2.41), (9, 1.0)];
        let p = paired(&baseline, &variant).unwrap();
        assert_eq!(p.seeds, [0, 1, 2, 3], "seed 9 has no baseline to pair with");
        assert!(close(p.t, TTEST_REL_T, 1e-9), "t {}", p.t);
        assert!(close(p.p, TTEST_REL_P, 1e-6), "p {}", p.p);
        assert!(paired(&baseline, &[(0, 1.0)]).is_none());
        let same = paired(&baseline, &baseline).unwrap();
        assert_eq!((same.t, same.p), (0.0, 1.0));
    }

    #[test]
    fn welch_matches_scipy() {
        let a = [0.91, 0.93, 0.92];
        let b = [0.88, 0.90, 0.86, 0.89];
        assert!(close(welch_p(&a, &b), WELCH_P, 1e-6), "p {}", welch_p(&a, &b));
    }

    #[test]
    fn agreement_rules() {
        assert!(agreement(&[0.9], &[0.905]).reproduces);
        assert!(!agreement(&[0.9], &[0.95]).reproduces);
        // 0.92 ± 4.303·0.01·√(4/3) = [0.870, 0.970]
        assert!(agreement(&[0.91, 0.92, 0.93], &[0.95]).reproduces);
        assert!(!agreement(&[0.91, 0.92, 0.93], &[0.99]).reproduces);
        assert!(agreement(&[0.91, 0.93, 0.92], &[0.92, 0.915, 0.925]).reproduces);
        assert!(!agreement(&[0.91, 0.93, 0.92], &[0.88, 0.90, 0.86, 0.89]).reproduces);
        assert!(!agreement(&[], &[1.0]).reproduces);
        assert_eq!(format_p(0.0004), "< 0.001");
        assert_eq!(format_p(0.04321), "0.043");
    }

    #[test]
    fn holm_of_mixed_p_values_matches_statsmodels() {
        let adjusted = holm(&[0.0123, 0.2, 0.0004, 0.049]);
        for (a, e) in adjusted.iter().zip([0.0369, 0.2, 0.0016, 0.098]) {
            assert!(close(*a, e, 1e-12), "{adjusted:?}");
        }
    }

    // Reference values computed once with statsmodels 0.15.0:
    //   TTestPower().power(effect_size=1.0, nobs=10, alpha=0.0125, alternative="two-sided")
    // and TOST's power by simulation (numpy, 400,000 draws of n standard normal differences, seed 0).
    #[test]
    fn power_at_a_family_level_and_tost_power_bound_against_references() {
        assert!((paired_t_power_at(1.0, 10, 0.0125) - 0.5473318804488909).abs() < 1e-6);
        // The bound never exceeds the simulated power and is within 0.03 of it where power is high.
        for (margin, n, alpha, simulated) in
            [(1.0, 10, 0.05, 0.7951), (1.5, 6, 0.05, 0.8628), (1.0, 14, 0.0125, 0.7412)]
        {
            let bound = tost_power_lower_bound(margin, n, alpha);
            assert!(
                bound <= simulated + 0.003 && bound >= simulated - 0.03,
                "{margin} {n} {alpha}: {bound} vs {simulated}"
            );
        }
    }

    #[test]
    fn seeds_to_settle_read_the_spread_and_delta_only() {
        // The rule has no argument for the observed difference; it scales with (sd/δ) and grows with the
        // family (a smaller level).
        let n = seeds_to_settle(0.01, 0.01, ALPHA).unwrap();
        assert_eq!(seeds_to_settle(0.02, 0.02, ALPHA), Some(n), "only the ratio matters");
        assert!(n >= seeds_needed(1.0).unwrap(), "at least what detection alone needs");
        assert!(paired_t_power(1.0, n) >= POWER && tost_power_lower_bound(1.0, n, ALPHA) >= POWER);
        assert!(tost_power_lower_bound(1.0, n - 1, ALPHA) < POWER || paired_t_power(1.0, n - 1) < POWER);
        assert!(seeds_to_settle(0.02, 0.01, ALPHA).unwrap() > n);
        assert!(seeds_to_settle(0.01, 0.01, ALPHA / 4.0).unwrap() > n);
        assert_eq!(seeds_to_settle(0.0, 0.01, ALPHA), None);
        assert_eq!(seeds_to_settle(1.0, 1e-4, ALPHA), None, "beyond the cap");
    }

    #[test]
    fn verdicts_follow_the_fixed_rules() {
        let p = |difference, equivalence, above_margin, below_margin| Adjusted {
            difference,
            equivalence,
            above_margin,
            below_margin,
        };
        let decide = Verdict::decide;
        let b = |negligible, beyond| Verdict::Better { negligible, beyond };
        let w = |negligible, beyond| Verdict::Worse { negligible, beyond };
        assert_eq!(decide(-0.05, false, p(0.01, 0.9, 1.0, 0.2), Some(9)), b(false, false));
        assert_eq!(decide(-0.05, false, p(0.01, 0.9, 1.0, 0.02), Some(9)), b(false, true));
        assert_eq!(decide(-0.05, true, p(0.01, 0.9, 1.0, 0.02), Some(9)), w(false, true));
        assert_eq!(decide(-0.05, true, p(0.01, 0.9, 0.01, 0.2), Some(9)), w(false, false), "the other margin");
        assert_eq!(decide(0.002, false, p(0.01, 0.01, 1.0, 1.0), None), w(true, false));
        assert_eq!(decide(0.002, false, p(0.3, 0.01, 1.0, 1.0), None), Verdict::Equivalent);
        assert_eq!(decide(0.002, false, p(0.3, 0.2, 1.0, 1.0), Some(12)), Verdict::Inconclusive { seeds: Some(12) });
        assert_eq!(decide(0.002, false, p(f64::NAN, f64::NAN, 1.0, 1.0), None), Verdict::Untested);
        assert_eq!(b(false, true).describe("0.01"), "better, by more than 0.01");
        assert!(Verdict::Incomplete { added: 1 }.describe("0.01").starts_with("incomplete"));
        assert_eq!(Verdict::Equivalent.describe("0.01"), "equivalent (±0.01)");
        assert!(!Verdict::Inconclusive { seeds: Some(5) }.describe("0.01").contains("distinguishable"));
        let (b, w, e, i) = (
            Verdict::Better { negligible: false, beyond: false },
            Verdict::Worse { negligible: true, beyond: false },
            Verdict::Equivalent,
            Verdict::Inconclusive { seeds: None },
        );
        assert_eq!(across_scales(b, b), "holds at both");
        assert_eq!(across_scales(e, e), "holds at both");
        assert_eq!(across_scales(b, w), "sign differs");
        assert_eq!(across_scales(b, i), "one scale only");
        assert_eq!(across_scales(b, e), "one scale only");
        assert_eq!(across_scales(i, Verdict::Untested), "inconclusive at both");
    }
}
