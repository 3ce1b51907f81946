//! What a mechanism is worth in compute: the compute-equivalent gain (CEG) of an arm over a baseline, each
//! trained at every rung of a compute ladder with the same seeds. Torch-free.
//!
//! Each arm's frontier is L(C) = E + A·C^(−α). E, the loss no compute removes, is shared by the two arms and
//! fitted per seed: the E that lets a power law per arm fit that seed's two ladders best in squared loss
//! (searched in [0, the lowest loss of the seed's runs)); with it pinned, each ladder is fitted by least
//! squares of log(L − E) on log C (A and α per seed and arm). The compute an arm needs for a target
//! loss L* is C(L*) = (A / (L* − E))^(1/α), and the gain at L* is CEG = C_baseline(L*) / C_arm(L*): how many
//! times the baseline's compute the arm's result is worth. Over the seeds both arms ran, the estimate is the
//! geometric mean of the per-seed gains, with a Student-t interval on their logarithms (n − 1 degrees of
//! freedom): seeds are the independent units, and each seed's fit (its floor included) is its own, so the
//! spread over seeds carries the floor's uncertainty too; `tests/ceg.rs` simulates
//! the interval's coverage on synthetic frontiers with a known gain, with E fitted as here, and fails when
//! it leaves 93–97%.
//!
//! Whether the advantage changes with scale is the paired difference of the per-seed exponents,
//! α_arm − α_baseline, judged like every comparison (`crate::design`, at ±δ on α): *grows* (the arm's loss
//! falls faster with compute), *shrinks*, *no difference* beyond ±δ, or *inconclusive*. The exponent trades
//! against the floor: a short ladder far above E barely pins it, and a floor the arms do not share is read
//! as an exponent difference. So the difference is judged twice, under the shared floor and under each arm's
//! own floor ([`FloorFit::Free`]), and a verdict is stated only when both fits give it ([`ScaleVerdict`]);
//! `tests/ceg.rs` simulates arms with equal exponents and different floors, where the shared fit alone
//! claims a change far above its level.
use crate::design::{judge_family, Evidence, Stages};
use crate::stats::{mean_std, t_critical, Verdict};

/// One arm's ladder: the rungs' compute (increasing) and, per seed, its loss at every rung.
#[derive(Debug, Clone, PartialEq)]
pub struct Ladder {
    pub compute: Vec<f64>,
    /// (seed, its loss at each rung, in the order of `compute`).
    pub seeds: Vec<(u64, Vec<f64>)>,
}

impl Ladder {
    /// The mean loss over seeds at each rung (NaN where no seed has a finite value).
    pub fn means(&self) -> Vec<f64> {
        (0..self.compute.len())
            .map(|i| {
                let values: Vec<f64> = self.seeds.iter().map(|(_, l)| l[i]).filter(|v: &f64| v.is_finite()).collect();
                if values.is_empty() {
                    f64::NAN
                } else {
                    mean_std(&values).0
                }
            })
            .collect()
    }

    /// The lowest and highest rung means: the measured range a target must lie in.
    pub fn range(&self) -> (f64, f64) {
        self.means().iter().fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), &m| (lo.min(m), hi.max(m)))
    }
}

/// A frontier L = E + A·C^(−α) with E pinned.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Frontier {
    pub floor: f64,
    pub coefficient: f64,
    pub exponent: f64,
}

impl Frontier {
    /// Least squares of log(L − E) on log C over the points; `None` with fewer than two points above E, or
    /// a frontier that does not fall (α ≤ 0).
    pub fn fit(compute: &[f64], loss: &[f64], floor: f64) -> Option<Frontier> {
        let points: Vec<(f64, f64)> = compute
            .iter()
            .zip(loss)
            .filter(|(c, l)| **c > 0.0 && l.is_finite() && **l > floor)
            .map(|(c, l)| (c.ln(), (l - floor).ln()))
            .collect();
        if points.len() < 2 {
            return None;
        }
        let n = points.len() as f64;
        let (mx, my) = (points.iter().map(|p| p.0).sum::<f64>() / n, points.iter().map(|p| p.1).sum::<f64>() / n);
        let sxx: f64 = points.iter().map(|p| (p.0 - mx).powi(2)).sum();
        if sxx == 0.0 {
            return None;
        }
        let slope = points.iter().map(|p| (p.0 - mx) * (p.1 - my)).sum::<f64>() / sxx;
        let exponent = -slope;
        (exponent > 0.0).then(|| Frontier { floor, coefficient: (my - slope * mx).exp(), exponent })
    }

    pub fn loss_at(&self, compute: f64) -> f64 {
        self.floor + self.coefficient * compute.powf(-self.exponent)
    }

    /// The compute at which the frontier reaches `target` (infinite at or below the floor).
    pub fn compute_at(&self, target: f64) -> f64 {
        if target <= self.floor {
            return f64::INFINITY;
        }
        (self.coefficient / (target - self.floor)).powf(1.0 / self.exponent)
    }
}

/// The shared floor E: the E whose pinned power laws, one per curve of `curves` (compute, rung means), have
/// the least squared error in loss together, searched on [0, `ceiling`) by a grid of 400 and a golden-section
/// refinement of its best cell. `ceiling` keeps every run above E (the lowest loss any run reached).
pub fn fit_floor(curves: &[(&[f64], &[f64])], ceiling: f64) -> f64 {
    let lowest_mean = curves.iter().flat_map(|(_, m)| m.iter().copied()).fold(f64::INFINITY, f64::min);
    let top = ceiling.min(lowest_mean);
    if !(top > 0.0 && top.is_finite()) {
        return 0.0;
    }
    let top = top * (1.0 - 1e-6);
    let sse = |e: f64| -> f64 {
        curves
            .iter()
            .map(|(compute, means)| match Frontier::fit(compute, means, e) {
                Some(f) => compute.iter().zip(means.iter()).map(|(c, l)| (l - f.loss_at(*c)).powi(2)).sum(),
                None => f64::INFINITY,
            })
            .sum()
    };
    let cells = 400;
    let at = |i: usize| top * i as f64 / cells as f64;
    let best = (0..cells).min_by(|&a, &b| sse(at(a)).total_cmp(&sse(at(b)))).unwrap_or(0);
    let (mut lo, mut hi) = (at(best.saturating_sub(1)), at((best + 1).min(cells - 1)));
    let phi = (5f64.sqrt() - 1.0) / 2.0;
    for _ in 0..60 {
        let (a, b) = (hi - phi * (hi - lo), lo + phi * (hi - lo));
        if sse(a) <= sse(b) {
            hi = b;
        } else {
            lo = a;
        }
    }
    let e = (lo + hi) / 2.0;
    if sse(e) <= sse(at(best)) {
        e
    } else {
        at(best)
    }
}

/// How a seed's floor E is fitted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FloorFit {
    /// One E for the seed's two ladders (the gains and the fit check use this).
    Shared,
    /// Each ladder its own E: an arm that lowers the floor is then not read as a steeper frontier.
    Free,
}

/// One seed's pair of frontiers (baseline, arm), with the floor they share fitted to that seed's two
/// ladders ([`fit_floor`]): every per-seed quantity then carries the floor's own uncertainty, so the spread
/// over seeds includes it.
pub fn seed_pairs(baseline: &Ladder, arm: &Ladder) -> Vec<(u64, Frontier, Frontier)> {
    seed_pairs_with(baseline, arm, FloorFit::Shared)
}

/// [`seed_pairs`] with the floor fitted as `floors` says.
pub fn seed_pairs_with(baseline: &Ladder, arm: &Ladder, floors: FloorFit) -> Vec<(u64, Frontier, Frontier)> {
    let lowest = |losses: &[&[f64]]| losses.iter().flat_map(|l| l.iter()).copied().fold(f64::INFINITY, f64::min);
    arm.seeds
        .iter()
        .filter_map(|(s, mine)| {
            let (_, theirs) = baseline.seeds.iter().find(|(t, _)| t == s)?;
            let (floor_b, floor_a) = match floors {
                FloorFit::Shared => {
                    let e = fit_floor(&[(&baseline.compute, theirs), (&arm.compute, mine)], lowest(&[theirs, mine]));
                    (e, e)
                }
                FloorFit::Free => (
                    fit_floor(&[(&baseline.compute, theirs)], lowest(&[theirs])),
                    fit_floor(&[(&arm.compute, mine)], lowest(&[mine])),
                ),
            };
            let b = Frontier::fit(&baseline.compute, theirs, floor_b)?;
            let a = Frontier::fit(&arm.compute, mine, floor_a)?;
            Some((*s, b, a))
        })
        .collect()
}

/// The compute-equivalent gain at one target loss.
#[derive(Debug, Clone, PartialEq)]
pub struct Gain {
    pub target: f64,
    /// The geometric mean over seeds of C_baseline(L*) / C_arm(L*).
    pub ratio: f64,
    /// Its 95% interval (t on the per-seed log ratios); `None` below two seeds.
    pub interval: Option<(f64, f64)>,
    /// (seed, log of that seed's ratio).
    pub log_ratios: Vec<(u64, f64)>,
    /// Whether L* lies inside both arms' measured ranges (rung means): outside, the gain is a forecast.
    pub inside: bool,
}

/// The gain of `arm` over `baseline` at `target`, over the seeds both ran ([`seed_pairs`]).
pub fn gain(baseline: &Ladder, arm: &Ladder, target: f64) -> Option<Gain> {
    let log_ratios: Vec<(u64, f64)> = seed_pairs(baseline, arm)
        .iter()
        .filter_map(|(s, b, a)| {
            let r = (b.compute_at(target) / a.compute_at(target)).ln();
            r.is_finite().then_some((*s, r))
        })
        .collect();
    if log_ratios.is_empty() {
        return None;
    }
    let values: Vec<f64> = log_ratios.iter().map(|(_, r)| *r).collect();
    let (mean, sd) = mean_std(&values);
    let n = values.len();
    let interval = (n >= 2).then(|| {
        let h = t_critical(n as f64 - 1.0) * sd / (n as f64).sqrt();
        ((mean - h).exp(), (mean + h).exp())
    });
    let within = |l: &Ladder| {
        let (lo, hi) = l.range();
        lo <= target && target <= hi
    };
    Some(Gain { target, ratio: mean.exp(), interval, log_ratios, inside: within(baseline) && within(arm) })
}

/// How well the law describes a pair of ladders: the residual standard deviation of every seed's fit (its
/// losses minus its fitted frontier's, both arms, every rung), on the residuals' degrees of freedom (the
/// points less the [`PARAMETERS_PER_SEED`] each seed's fit spends), against the seeds' own spread (the root
/// mean of the variance over seeds at each rung of each arm). A law that misses the rungs by much more than
/// the seeds differ ([`FitCheck::fits`]) describes no frontier, and a gain read off it is no estimate.
/// Without the correction, 8 points fitted with 5 parameters would show a residual √(3/8) ≈ 0.61 of its
/// size, and the rule would pass laws that miss.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct FitCheck {
    pub residual: f64,
    pub seed_spread: f64,
}

/// The parameters a seed's fit of two ladders spends: the shared floor E, and A and α per arm.
pub const PARAMETERS_PER_SEED: usize = 5;

impl FitCheck {
    /// The residuals within twice the seeds' spread.
    pub fn fits(&self) -> bool {
        self.residual <= 2.0 * self.seed_spread
    }
}

/// [`FitCheck`] of `arm` and `baseline` fitted as [`seed_pairs`] fits them; `None` without two seeds.
pub fn fit_check(baseline: &Ladder, arm: &Ladder) -> Option<FitCheck> {
    let pairs = seed_pairs(baseline, arm);
    let mut squares = Vec::new();
    for (s, b, a) in &pairs {
        for (ladder, f) in [(baseline, b), (arm, a)] {
            let (_, losses) = ladder.seeds.iter().find(|(t, _)| t == s)?;
            squares.extend(ladder.compute.iter().zip(losses).map(|(c, l)| (l - f.loss_at(*c)).powi(2)));
        }
    }
    let dof = squares.len().checked_sub(PARAMETERS_PER_SEED * pairs.len()).filter(|&d| d > 0)?;
    let mut variances = Vec::new();
    for ladder in [baseline, arm] {
        for i in 0..ladder.compute.len() {
            let values: Vec<f64> = ladder.seeds.iter().map(|(_, l)| l[i]).filter(|v| v.is_finite()).collect();
            if values.len() >= 2 {
                variances.push(mean_std(&values).1.powi(2));
            }
        }
    }
    if squares.is_empty() || variances.is_empty() {
        return None;
    }
    let mean = |v: &[f64]| v.iter().sum::<f64>() / v.len() as f64;
    let residual = (squares.iter().sum::<f64>() / dof as f64).sqrt();
    Some(FitCheck { residual, seed_spread: mean(&variances).sqrt() })
}

/// Per seed both arms fitted: α_arm − α_baseline.
pub fn exponent_differences(baseline: &Ladder, arm: &Ladder) -> Vec<(u64, f64)> {
    exponent_differences_with(baseline, arm, FloorFit::Shared)
}

/// [`exponent_differences`] with the floor fitted as `floors` says.
pub fn exponent_differences_with(baseline: &Ladder, arm: &Ladder, floors: FloorFit) -> Vec<(u64, f64)> {
    seed_pairs_with(baseline, arm, floors).iter().map(|(s, b, a)| (*s, a.exponent - b.exponent)).collect()
}

/// How an arm's advantage changes with compute, judged under both floor fits: the per-seed exponent
/// differences and their verdict (Holm over the family) under the shared floor and under free floors.
#[derive(Debug, Clone, PartialEq)]
pub struct ScaleVerdict {
    pub shared: (Vec<f64>, Verdict),
    pub free: (Vec<f64>, Verdict),
}

/// The change a verdict on α_arm − α_baseline states (`None`: it states none).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ScaleClass {
    Grows,
    Shrinks,
    NoChange,
}

impl ScaleVerdict {
    fn class(verdict: &Verdict) -> Option<ScaleClass> {
        match verdict {
            Verdict::Better { negligible: true, .. }
            | Verdict::Worse { negligible: true, .. }
            | Verdict::Equivalent => Some(ScaleClass::NoChange),
            Verdict::Better { .. } => Some(ScaleClass::Grows),
            Verdict::Worse { .. } => Some(ScaleClass::Shrinks),
            _ => None,
        }
    }

    /// What is stated: the class both fits give; `None` where either states none or they differ.
    pub fn stated(&self) -> Option<ScaleClass> {
        let shared = self.shared_class()?;
        (Self::class(&self.free.1) == Some(shared)).then_some(shared)
    }

    /// The class the shared-floor fit alone gives (what was stated before both fits were asked).
    pub fn shared_class(&self) -> Option<ScaleClass> {
        Self::class(&self.shared.1)
    }

    /// The verdict in words: the shared fit's where both fits agree, else *inconclusive: depends on the
    /// floor* naming each fit's; inconclusive under both, the shared fit's words (the seeds it would take).
    pub fn words(&self) -> String {
        let (shared, free) = (Self::class(&self.shared.1), Self::class(&self.free.1));
        if shared == free {
            return scale_word(&self.shared.1);
        }
        format!(
            "inconclusive: depends on the floor (shared E: {}; free E: {})",
            scale_word(&self.shared.1),
            scale_word(&self.free.1)
        )
    }
}

/// [`ScaleVerdict`] of each of `arms` against `baseline` at ±`delta` (each fit's family Holm-adjusted).
pub fn scale_verdicts(baseline: &Ladder, arms: &[&Ladder], delta: f64) -> Vec<ScaleVerdict> {
    let differences = |floors: FloorFit| -> Vec<Vec<f64>> {
        arms.iter()
            .map(|arm| exponent_differences_with(baseline, arm, floors).into_iter().map(|d| d.1).collect())
            .collect()
    };
    let (shared, free) = (differences(FloorFit::Shared), differences(FloorFit::Free));
    let (shared_verdicts, free_verdicts) = (exponent_verdicts(&shared, delta), exponent_verdicts(&free, delta));
    shared
        .into_iter()
        .zip(shared_verdicts)
        .zip(free.into_iter().zip(free_verdicts))
        .map(|(shared, free)| ScaleVerdict { shared, free })
        .collect()
}

/// The verdicts on α_arm − α_baseline for a family of arms (each arm's per-seed differences), at ±`delta`,
/// Holm-adjusted over the family: `Better` means the arm's exponent is larger (its advantage grows with
/// compute). A fixed design: every seed the arms share.
pub fn exponent_verdicts(differences: &[Vec<f64>], delta: f64) -> Vec<Verdict> {
    let evidence: Vec<Evidence> = differences
        .iter()
        .map(|d| Evidence::of(&Stages { pilot: d.clone(), added: Vec::new(), planned: false }, delta))
        .collect();
    let seeds: Vec<Option<usize>> = vec![None; differences.len()];
    judge_family(&evidence, true, &seeds).1
}

/// A verdict on the exponent difference in words: how the advantage changes with compute.
pub fn scale_word(verdict: &Verdict) -> String {
    match verdict {
        // A difference shown but within ±δ is no change that matters.
        Verdict::Better { negligible: true, .. } | Verdict::Worse { negligible: true, .. } | Verdict::Equivalent => {
            "no change with compute beyond ±δ".into()
        }
        Verdict::Better { .. } => "grows with compute".into(),
        Verdict::Worse { .. } => "shrinks with compute".into(),
        Verdict::Inconclusive { seeds: Some(n) } => format!("inconclusive (about {n} seeds would settle it)"),
        other => other.word().to_string(),
    }
}

/// The gain in wall-clock time: the compute-equivalent gain times how much faster the arm turns compute into
/// loss, C_b(L*)/R_b ÷ C_a(L*)/R_a = CEG · R_a/R_b, R being each arm's model FLOP/s. `speed_logs` are the
/// log ratios ln(R_a/R_b) of paired timing repeats (each repeat times both arms back to back, on the same
/// cores). The estimate is exp(mean log CEG + mean log speed ratio); its 95% interval is Welch's: the two
/// means are independent (seeds and repeats), their standard errors add in quadrature, and the degrees of
/// freedom are Welch–Satterthwaite's. `tests/ceg.rs` simulates its coverage. `None` without a speed ratio.
pub fn wall_gain(gain: &Gain, speed_logs: &[f64]) -> Option<(f64, Option<(f64, f64)>)> {
    if speed_logs.is_empty() {
        return None;
    }
    let seeds: Vec<f64> = gain.log_ratios.iter().map(|r| r.1).collect();
    let (g, sd_g) = mean_std(&seeds);
    let (r, sd_r) = mean_std(speed_logs);
    let centre = g + r;
    let (n, m) = (seeds.len() as f64, speed_logs.len() as f64);
    if n < 2.0 || m < 2.0 {
        return Some((centre.exp(), None));
    }
    let (vg, vr) = (sd_g * sd_g / n, sd_r * sd_r / m);
    let se = (vg + vr).sqrt();
    if se == 0.0 {
        return Some((centre.exp(), Some((centre.exp(), centre.exp()))));
    }
    let df = (vg + vr).powi(2) / (vg * vg / (n - 1.0) + vr * vr / (m - 1.0));
    let h = t_critical(df) * se;
    Some((centre.exp(), Some(((centre - h).exp(), (centre + h).exp()))))
}
