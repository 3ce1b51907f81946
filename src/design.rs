//! The sequential design of `--until-settled`: a pilot (the recipe's own seeds), then seeds added on the
//! pilot's spread, judged by a **two-stage inverse-normal combination test** (Bauer & Köhne 1994; Lehmacher
//! & Wassmer 1999; Jennison & Turnbull 2000, ch. 18). Torch-free.
//!
//! Why this design. Testing the pooled seeds with the plain paired t-test after choosing how many to add
//! from the pilot is not a fixed design: choosing *whether* to add from the pilot's verdict (the rule ablate
//! had until December 2026) is optional stopping, and choosing *how many* from the pilot's spread alone (an
//! internal pilot) still correlates the final variance with the sample size. Simulated with three or four
//! pilot seeds, the first puts the false-positive rate at 0.08–0.10 at a stated 0.05 where δ/sd ≤ 1, the
//! second at up to 0.086 (docs/results.md).
//! The combination test keeps each stage's evidence apart: stage 1 is the paired t-test over the pilot seeds,
//! stage 2 the paired t-test over the added seeds only, each turned into a one-sided p-value and combined as
//! Z = w₁·Φ⁻¹(1 − p₁) + w₂·Φ⁻¹(1 − p₂) with weights fixed before the data (w₁ = w₂ = 1/√2). Under the null
//! the two p-values are independent and uniform whatever rule chose the second stage's size, so Z is exactly
//! standard normal and every test built on it keeps its stated level. The price is power: each stage
//! estimates its own spread (docs/results.md has the simulated table).
//!
//! Every hypothesis is a one-sided test of the mean paired difference μ against a shift μ₀, and the rest is
//! built from it: the difference test (two-sided, μ₀ = 0), TOST's two one-sided tests (μ₀ = ∓δ), and the
//! margin tests (μ₀ = ±δ, at α/2 one-sided so that a margin verdict agrees with the 95% interval). With one
//! stage the same functions give the paired t-test, TOST and the one-sample t-test against δ exactly.
use statrs::distribution::{ContinuousCDF, Normal, StudentsT};

use crate::stats::{holm, settles, Adjusted, Estimate, Verdict, ALPHA, MOST_SEEDS};

/// The weight of each stage's z in the combination, fixed before any data: equal weights, so that neither
/// the cap nor the number of seeds added can be tuned to the pilot's result.
pub const STAGE_WEIGHT: f64 = std::f64::consts::FRAC_1_SQRT_2;

/// The fewest added seeds a second stage can be tested on (a paired t-test needs two pairs).
pub const SECOND_STAGE_MIN: usize = 2;

/// A comparison's paired differences (variant − reference), split by stage: `pilot` over the recipe's own
/// seeds, `added` over the seeds added to settle it; `planned` when the recipe's plan has a second stage
/// (then a comparison with fewer than [`SECOND_STAGE_MIN`] added seeds is unfinished, never judged on its
/// pilot alone: stopping where the pilot looked decided is the optional stopping this design replaces).
#[derive(Debug, Clone, PartialEq)]
pub struct Stages {
    pub pilot: Vec<f64>,
    pub added: Vec<f64>,
    pub planned: bool,
}

/// How a comparison was tested.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Analysis {
    /// One stage: the plain paired tests over every shared seed.
    Fixed,
    /// Two stages combined by the inverse-normal method.
    TwoStage,
    /// Seeds were added but fewer than [`SECOND_STAGE_MIN`] on this comparison: the design's second stage is
    /// incomplete and nothing is decided.
    Incomplete,
}

impl Stages {
    /// How these stages are tested: two stages once the second has [`SECOND_STAGE_MIN`] pairs, one when
    /// nothing was added or planned, else unfinished.
    pub fn analysis(&self) -> Analysis {
        match self.added.len() {
            n if n >= SECOND_STAGE_MIN => Analysis::TwoStage,
            0 if !self.planned => Analysis::Fixed,
            _ => Analysis::Incomplete,
        }
    }

    /// P(a value as high as the observed one | μ = `shift`): the one-sided p-value of H₀: μ ≤ shift against
    /// μ > shift. NaN when a stage has fewer than two pairs.
    pub fn upper_p(&self, shift: f64) -> f64 {
        match self.analysis() {
            Analysis::Fixed => upper_t_p(&self.pilot, shift),
            Analysis::TwoStage => {
                let z = STAGE_WEIGHT * stage_z(&self.pilot, shift) + STAGE_WEIGHT * stage_z(&self.added, shift);
                standard_normal().sf(z)
            }
            Analysis::Incomplete => f64::NAN,
        }
    }

    /// The one-sided p-value of H₀: μ ≥ shift against μ < shift.
    pub fn lower_p(&self, shift: f64) -> f64 {
        match self.analysis() {
            Analysis::Fixed => upper_t_p(&negated(&self.pilot), -shift),
            _ => 1.0 - self.upper_p(shift),
        }
    }

    /// The two-sided p-value of "no difference" (the paired t-test's with one stage).
    pub fn difference_p(&self) -> f64 {
        let (upper, lower) = (self.upper_p(0.0), self.lower_p(0.0));
        if upper.is_nan() || lower.is_nan() {
            return f64::NAN;
        }
        (2.0 * upper.min(lower)).min(1.0)
    }

    /// TOST's p-value of "the difference lies within ±δ": the larger of the two one-sided p-values
    /// (statsmodels' `ttost_paired` with one stage).
    pub fn equivalence_p(&self, delta: f64) -> f64 {
        let (above_lower_margin, below_upper_margin) = (self.upper_p(-delta), self.lower_p(delta));
        if above_lower_margin.is_nan() || below_upper_margin.is_nan() {
            return f64::NAN;
        }
        above_lower_margin.max(below_upper_margin)
    }

    /// The p-value of "the difference exceeds +δ" (`above`) or falls below −δ: twice the one-sided p-value
    /// against the margin, so that it is below α exactly when the 95% interval lies beyond the margin.
    pub fn beyond_margin_p(&self, delta: f64, above: bool) -> f64 {
        let one_sided = if above { self.upper_p(delta) } else { self.lower_p(-delta) };
        if one_sided.is_nan() {
            return f64::NAN;
        }
        (2.0 * one_sided).min(1.0)
    }

    /// The 95% interval of μ that the design's tests give: with one stage the paired t interval; with two,
    /// the shifts the two-sided combination test does not reject (found by bisection; the test's p moves
    /// monotonically with the shift). `None` when untestable.
    pub fn interval(&self) -> Option<(f64, f64)> {
        match self.analysis() {
            Analysis::Incomplete => None,
            Analysis::Fixed if no_spread(&self.pilot) => None,
            Analysis::Fixed => {
                let e = Estimate::of(&self.pilot);
                e.half_width.map(|h| (e.mean - h, e.mean + h))
            }
            Analysis::TwoStage => {
                let e = Estimate::of(&self.all());
                let level = (1.0 - crate::stats::CONFIDENCE) / 2.0;
                // upper_p rises with the shift: the lower end is where it crosses level, the upper end where
                // lower_p (falling with the shift) does.
                let lo = solve_increasing(|s| self.upper_p(s) - level, e.mean, e.std.max(e.mean.abs()).max(1e-12))?;
                let hi = solve_increasing(|s| level - self.lower_p(s), e.mean, e.std.max(e.mean.abs()).max(1e-12))?;
                Some((lo, hi))
            }
        }
    }

    /// Every difference, pilot first.
    pub fn all(&self) -> Vec<f64> {
        self.pilot.iter().chain(&self.added).copied().collect()
    }
}

fn negated(x: &[f64]) -> Vec<f64> {
    x.iter().map(|v| -v).collect()
}

fn standard_normal() -> Normal {
    Normal::new(0.0, 1.0).expect("a standard normal")
}

/// Whether the differences `d` are all equal (to far below the 6 decimals runs.csv records): a sample with
/// no estimate of its noise. Its t is infinite at every shift but one (or, with the rounding of the recorded
/// values, astronomically large), so a test on it would decide alone and shrink the interval to a point
/// (two seeds that happen to differ by the same number of correctly predicted test tokens). It carries no
/// test, in a fixed design as in either stage of two: the comparison is *untested*.
fn no_spread(d: &[f64]) -> bool {
    d.len() >= 2 && d.iter().all(|&x| (x - d[0]).abs() <= 1e-9 * (1.0 + d[0].abs()))
}

/// The one-sided p-value of H₀: μ ≤ shift from a paired t-test over `d`: NaN below two values or with no
/// spread ([`no_spread`]).
fn upper_t_p(d: &[f64], shift: f64) -> f64 {
    if d.len() < 2 || no_spread(d) {
        return f64::NAN;
    }
    let e = Estimate::of(d);
    let se = e.std / (e.n as f64).sqrt();
    let t = StudentsT::new(0.0, 1.0, e.n as f64 - 1.0).expect("df > 0");
    t.sf((e.mean - shift) / se)
}

/// One stage's evidence against H₀: μ ≤ shift as a standard normal deviate, Φ⁻¹(1 − p), computed from the
/// smaller tail so that it stays exact far out (p is floored at 1e-300); NaN for a stage with no spread.
fn stage_z(d: &[f64], shift: f64) -> f64 {
    // A stage with no spread carries no test (`no_spread`): upper_t_p says NaN, and the comparison stays open.
    let upper = upper_t_p(d, shift);
    if upper.is_nan() {
        return f64::NAN;
    }
    let normal = standard_normal();
    if upper <= 0.5 {
        -normal.inverse_cdf(upper.max(1e-300))
    } else {
        normal.inverse_cdf((1.0 - upper).max(1e-300))
    }
}

/// The root of `f` (increasing), bracketed outwards from `start` in steps of `scale`; 200 halvings.
fn solve_increasing(f: impl Fn(f64) -> f64, start: f64, scale: f64) -> Option<f64> {
    let (mut lo, mut hi) = (start - scale, start + scale);
    let mut widen = scale;
    for _ in 0..200 {
        if f(lo) <= 0.0 {
            break;
        }
        widen *= 2.0;
        lo = start - widen;
    }
    widen = scale;
    for _ in 0..200 {
        if f(hi) >= 0.0 {
            break;
        }
        widen *= 2.0;
        hi = start + widen;
    }
    if !(f(lo) <= 0.0 && f(hi) >= 0.0) {
        return None;
    }
    for _ in 0..200 {
        let mid = 0.5 * (lo + hi);
        if mid <= lo || mid >= hi {
            break;
        }
        if f(mid) < 0.0 {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    Some(0.5 * (lo + hi))
}

/// The raw p-values of one comparison's hypotheses at margin δ (see the module's note).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Evidence {
    pub analysis: Analysis,
    /// Two-sided, "no difference".
    pub difference: f64,
    /// TOST, "within ±δ".
    pub equivalence: f64,
    /// "Above +δ" and "below −δ", each at α/2 one-sided.
    pub above_margin: f64,
    pub below_margin: f64,
    /// The mean of every difference (the direction of a significant difference).
    pub mean: f64,
    /// The seeds beyond the pilot.
    pub added: usize,
}

impl Evidence {
    /// No test (fewer than two shared seeds, or no margin).
    pub fn untestable() -> Evidence {
        Evidence {
            analysis: Analysis::Fixed,
            difference: f64::NAN,
            equivalence: f64::NAN,
            above_margin: f64::NAN,
            below_margin: f64::NAN,
            mean: f64::NAN,
            added: 0,
        }
    }

    /// The evidence of `stages` at margin `delta` (> 0).
    pub fn of(stages: &Stages, delta: f64) -> Evidence {
        let all = stages.all();
        let mean = if all.is_empty() { f64::NAN } else { all.iter().sum::<f64>() / all.len() as f64 };
        Evidence {
            analysis: stages.analysis(),
            difference: stages.difference_p(),
            equivalence: stages.equivalence_p(delta),
            above_margin: stages.beyond_margin_p(delta, true),
            below_margin: stages.beyond_margin_p(delta, false),
            mean,
            added: stages.added.len(),
        }
    }
}

/// A family's Holm-adjusted p-values of each hypothesis, in the order of the comparisons.
#[derive(Debug, Clone, PartialEq)]
pub struct FamilyTests {
    pub difference: Vec<f64>,
    pub equivalence: Vec<f64>,
    pub above_margin: Vec<f64>,
    pub below_margin: Vec<f64>,
}

/// Holm over the family, for each kind of hypothesis separately (untestable comparisons left out).
pub fn adjust(family: &[Evidence]) -> FamilyTests {
    let column = |f: fn(&Evidence) -> f64| holm(&family.iter().map(f).collect::<Vec<_>>());
    FamilyTests {
        difference: column(|e| e.difference),
        equivalence: column(|e| e.equivalence),
        above_margin: column(|e| e.above_margin),
        below_margin: column(|e| e.below_margin),
    }
}

/// The verdicts of one family (one metric at one scale): the evidence Holm-adjusted per hypothesis and
/// decided by [`Verdict::decide`]; `seeds` is what an inconclusive comparison is told would settle it. A
/// comparison whose second stage is incomplete is left out of the family and called so.
pub fn judge_family(
    evidence: &[Evidence],
    higher_is_better: bool,
    seeds: &[Option<usize>],
) -> (FamilyTests, Vec<Verdict>) {
    let tests = adjust(evidence);
    let verdicts = evidence
        .iter()
        .enumerate()
        .map(|(k, e)| match e.analysis {
            Analysis::Incomplete => Verdict::Incomplete { added: e.added },
            _ => Verdict::decide(
                e.mean,
                higher_is_better,
                Adjusted {
                    difference: tests.difference[k],
                    equivalence: tests.equivalence[k],
                    above_margin: tests.above_margin[k],
                    below_margin: tests.below_margin[k],
                },
                seeds.get(k).copied().flatten(),
            ),
        })
        .collect();
    (tests, verdicts)
}

/// The settling plan's arithmetic: how many seeds in all an arm should end with, from the pilot's paired
/// spread, the margin and the family's level, never from the observed difference. The count is the rule of
/// [`crate::stats::seeds_to_settle`] (power 0.8 at δ for both the difference test and TOST, at the
/// family's Bonferroni level), raised to the pilot plus [`SECOND_STAGE_MIN`] so that every comparison gets a
/// testable second stage, and capped. The rule's thresholds are computed once per level and cap.
#[derive(Debug, Clone)]
pub struct Planner {
    pilot: usize,
    cap: usize,
    alpha: f64,
    /// `thresholds[n]`: the smallest δ/sd at which n pairs suffice (NaN below two).
    thresholds: Vec<f64>,
}

impl Planner {
    /// The plan for a pilot of `pilot` seeds, a family tested at `alpha` (α/m), and at most `cap` seeds.
    /// The thresholds are tabled up to [`TABLED_SEEDS`] (what a simulation calls thousands of times); beyond,
    /// [`Planner::needed`] searches as `seeds_to_settle` does.
    pub fn new(pilot: usize, cap: usize, alpha: f64) -> Planner {
        let enough = |effect: f64, n: usize| settles(effect, n, alpha);
        let thresholds = (0..=cap.min(TABLED_SEEDS))
            .map(|n| {
                if n < 2 {
                    return f64::NAN;
                }
                let mut hi = 1.0;
                while !enough(hi, n) {
                    hi *= 2.0;
                    if hi > 1e6 {
                        return f64::INFINITY;
                    }
                }
                let mut lo = 0.0;
                for _ in 0..45 {
                    let mid = 0.5 * (lo + hi);
                    if enough(mid, n) {
                        hi = mid;
                    } else {
                        lo = mid;
                    }
                }
                hi
            })
            .collect();
        Planner { pilot, cap, alpha, thresholds }
    }

    /// The seeds the comparison should end with: at least pilot + [`SECOND_STAGE_MIN`], at most the cap.
    /// With no spread to plan from (every difference equal) the floor; with no estimate at all, the cap.
    pub fn target(&self, sd: f64, delta: f64) -> usize {
        let floor = (self.pilot + SECOND_STAGE_MIN).min(self.cap);
        self.needed(sd, delta).clamp(floor, self.cap)
    }

    /// What the power rule alone asks for (2 with no spread; the cap when it asks for more, or with no
    /// estimate): `seeds_to_settle`, capped.
    pub fn needed(&self, sd: f64, delta: f64) -> usize {
        if sd == 0.0 {
            return 2.min(self.cap);
        }
        if !(sd.is_finite() && delta.is_finite() && delta > 0.0) {
            return self.cap;
        }
        let effect = delta / sd;
        let tabled = self.thresholds.len() - 1;
        match (2..=tabled).find(|&n| effect >= self.thresholds[n]) {
            Some(n) => n,
            None if self.cap <= tabled => self.cap,
            None => crate::stats::seeds_to_settle(sd, delta, self.alpha).map_or(self.cap, |n| n.min(self.cap)),
        }
    }
}

/// The seeds up to which a [`Planner`] tables its thresholds.
pub const TABLED_SEEDS: usize = 40;

/// The most seeds a plan may name per arm: the verdicts' own limit.
pub const MOST_PLANNED_SEEDS: usize = MOST_SEEDS;

/// Whether a cap of `cap` seeds per arm gives a pilot of `seeds` a testable second stage within the
/// verdicts' limit: `seeds` + [`SECOND_STAGE_MIN`] to [`MOST_PLANNED_SEEDS`].
pub fn is_second_stage(seeds: usize, cap: usize) -> bool {
    (seeds + SECOND_STAGE_MIN..=MOST_PLANNED_SEEDS).contains(&cap)
}

/// The level each comparison of a family of `m` is planned at: Holm's first step, α/m.
pub fn family_level(m: usize) -> f64 {
    ALPHA / m.max(1) as f64
}

#[cfg(test)]
mod tests {
    use super::*;

    fn close(a: f64, b: f64, tol: f64) -> bool {
        (a - b).abs() <= tol * b.abs().max(1e-12)
    }

    // Reference values computed once with SciPy 1.17.1 and statsmodels 0.15.0:
    //   d = [-0.11, -0.06, -0.05, -0.09]
    //   scipy.stats.ttest_1samp(d, 0).pvalue = 0.011091567639778482
    //   statsmodels.stats.weightstats.DescrStatsW(d).ttest_mean(-0.02, alternative="smaller")[1]
    //     = 0.012503680175864715   (H₀: μ ≥ −0.02)
    //   DescrStatsW(d).ttest_mean(-0.02, alternative="larger")[1] = 0.9874963198241353
    //   ttost_paired(d, zeros(4), -0.05, 0.05)[0] = 0.9301511301831382
    #[test]
    fn one_stage_is_the_paired_t_test_tost_and_the_margin_t_test() {
        let s = Stages { pilot: vec![-0.11, -0.06, -0.05, -0.09], added: vec![], planned: false };
        assert_eq!(s.analysis(), Analysis::Fixed);
        assert!(close(s.difference_p(), 0.011091567639778482, 1e-6), "{}", s.difference_p());
        assert!(close(s.lower_p(-0.02), 0.012503680175864715, 1e-6));
        assert!(close(s.upper_p(-0.02), 0.9874963198241353, 1e-6));
        assert!(close(s.beyond_margin_p(0.02, false), 2.0 * 0.012503680175864715, 1e-6));
        assert!(close(s.equivalence_p(0.05), 0.9301511301831382, 1e-6));
        let (lo, hi) = s.interval().unwrap();
        let e = Estimate::of(&s.pilot);
        assert!(close(hi - lo, 2.0 * e.half_width.unwrap(), 1e-12));
    }

    // Schuirmann's TOST (1987) with one stage, against
    //   statsmodels.stats.weightstats.ttost_paired(variant, baseline, -delta, delta)[0] (statsmodels 0.15.0)
    #[test]
    fn one_stage_tost_matches_statsmodels_ttost_paired() {
        let one = |d: Vec<f64>| Stages { pilot: d, added: vec![], planned: false };
        let baseline = [2.41, 2.45, 2.38, 2.50];
        let variant = [2.30, 2.39, 2.33, 2.41];
        let d = one(variant.iter().zip(&baseline).map(|(v, b)| v - b).collect());
        for (delta, expected) in [(0.05, 0.9301511301831376), (0.1, 0.10037268807121019), (0.2, 0.0014973559084275865)]
        {
            assert!(close(d.equivalence_p(delta), expected, 1e-6), "δ {delta}: {}", d.equivalence_p(delta));
        }
        let d = one([1.002, 1.097, 0.953].iter().zip(&[1.00, 1.10, 0.95]).map(|(v, b)| v - b).collect());
        assert!(close(d.equivalence_p(0.01), 0.01867008507923033, 1e-6));
        assert!(close(d.equivalence_p(0.02), 0.004544882459784162, 1e-6));
        assert!(one(vec![0.1]).equivalence_p(0.5).is_nan());
        // No spread: no test (it used to decide, 0 inside the margin and 1 outside), as a stage of two.
        assert!(one(vec![0.1, 0.1]).equivalence_p(0.5).is_nan() && one(vec![0.6, 0.6]).equivalence_p(0.5).is_nan());
    }

    // The combination by hand: stage p-values from scipy.stats.t.sf, z = norm.isf(p),
    //   pilot [0.3, 0.5, 0.1] -> t.sf(mean/se, 2) = 0.06084496717316008
    //   added [0.2, 0.4, 0.0, 0.6] -> t.sf(mean/se, 3) = 0.05136403942919947
    //   Z = (norm.isf(p1) + norm.isf(p2)) / sqrt(2) = 2.248237883126775, norm.sf(Z) = 0.012280512621304283
    #[test]
    fn two_stages_combine_their_own_t_tests_by_the_inverse_normal_method() {
        let s = Stages { pilot: vec![0.3, 0.5, 0.1], added: vec![0.2, 0.4, 0.0, 0.6], planned: true };
        assert_eq!(s.analysis(), Analysis::TwoStage);
        assert!(close(s.upper_p(0.0), 0.012280512621304283, 1e-6), "{}", s.upper_p(0.0));
        assert!(close(s.difference_p(), 2.0 * 0.012280512621304283, 1e-6));
        assert!(close(s.lower_p(0.0) + s.upper_p(0.0), 1.0, 1e-12));
        // The interval is exactly the shifts the test keeps: at its ends the two-sided p is α.
        let (lo, hi) = s.interval().unwrap();
        assert!(lo > 0.0 && hi > lo, "{lo} {hi}");
        assert!(close(2.0 * s.upper_p(lo), 0.05, 1e-6) && close(2.0 * s.lower_p(hi), 0.05, 1e-6));
        // Margin and equivalence read the same shifts: beyond +δ exactly when the interval's lower end is.
        assert!(s.beyond_margin_p(lo * 0.99, true) < 0.05 && s.beyond_margin_p(lo * 1.01, true) > 0.05);
        assert!(s.equivalence_p(hi * 1.5) < 0.05 && s.equivalence_p(0.1) > 0.05);
        let one = Stages { pilot: vec![0.3, 0.5, 0.1], added: vec![0.2], planned: true };
        assert_eq!(one.analysis(), Analysis::Incomplete);
        assert!(one.difference_p().is_nan() && one.interval().is_none());
        // A second stage with no spread (found in results/pe_placement: two added seeds with the same
        // accuracy difference, −0.0051) decides nothing, where it used to decide the comparison alone.
        // The differences as the recorded accuracies give them (0.446745 − 0.451823, 0.448047 − 0.453125):
        // equal but for the last bits of the floating-point subtraction.
        let added = vec![0.446745 - 0.451823, 0.448047 - 0.453125];
        assert_ne!(added[0], added[1], "the case is the rounding noise, not exact equality");
        let flat = Stages { pilot: vec![0.0027, 0.0027, -0.0017], added, planned: true };
        assert_eq!(flat.analysis(), Analysis::TwoStage);
        assert!(flat.difference_p().is_nan() && flat.equivalence_p(0.005).is_nan(), "{}", flat.difference_p());
        assert!(flat.interval().is_none());
        let pilot_only = Stages { pilot: vec![0.3, 0.5, 0.1], added: vec![], planned: true };
        assert_eq!(pilot_only.analysis(), Analysis::Incomplete, "a planned second stage that did not run");
        // A fixed design with no spread is untested alike (results/lra: two seeds with the same accuracy
        // difference, 0, were called equivalent with the interval [0, 0]); at zero and away from it.
        for d in [0.0, 0.0042] {
            let fixed = Stages { pilot: vec![d, d], added: vec![], planned: false };
            assert_eq!(fixed.analysis(), Analysis::Fixed);
            assert!(fixed.difference_p().is_nan() && fixed.equivalence_p(0.005).is_nan(), "{d}");
            assert!(fixed.beyond_margin_p(0.001, true).is_nan() && fixed.interval().is_none(), "{d}");
            let e = Evidence::of(&fixed, 0.005);
            let (_, verdicts) = judge_family(&[e], true, &[None]);
            assert_eq!(verdicts[0], crate::stats::Verdict::Untested, "{d}");
        }
    }

    #[test]
    fn the_plan_reads_the_spread_and_margin_only_with_a_floor_and_a_cap() {
        let p = Planner::new(3, 10, ALPHA);
        // The same n as the rule's own search where it lies inside [5, 10].
        for sd in [0.006, 0.008, 0.01] {
            let rule = crate::stats::seeds_to_settle(sd, 0.01, ALPHA).unwrap();
            assert_eq!(p.target(sd, 0.01), rule.clamp(5, 10), "sd {sd}");
        }
        assert_eq!(p.target(0.001, 0.01), 5, "a tiny spread still gets a testable second stage");
        assert_eq!(p.target(0.0, 0.01), 5);
        assert_eq!(p.target(1.0, 0.01), 10, "capped");
        assert_eq!(p.target(f64::NAN, 0.01), 10);
        assert_eq!(p.target(0.02, 0.02), p.target(0.01, 0.01), "only the ratio matters");
        assert!(Planner::new(3, 30, ALPHA / 4.0).target(0.01, 0.01) > p.target(0.01, 0.01));
        // Beyond the table the rule's own search answers, and quickly: a cap of 10,000 costs no table.
        let wide = Planner::new(3, 10_000, ALPHA);
        for sd in [0.01, 0.05, 0.2] {
            let rule = crate::stats::seeds_to_settle(sd, 0.01, ALPHA).unwrap();
            assert_eq!(wide.target(sd, 0.01), rule.max(5), "sd {sd}");
        }
    }
}
