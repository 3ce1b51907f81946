//! Pathfinder (Linsley et al. 2018, LRA's 32×32 task): are two dots joined by one dashed curve? Each image
//! holds a few dashed contours; two dots mark either the two ends of one contour (positive) or one end each of
//! two different contours (negative). The contour length (in steps) sets the difficulty. Labels are balanced
//! by construction: the label is drawn first, with probability ½.
//!
//! A contour is a walk of unit steps whose heading turns by at most `max_turn` radians per step (at random,
//! or towards the centre within 6 pixels of the border, so that long contours fit), drawn dashed: `dash`
//! steps on, `gap` steps off. How this differs from the original: pixels are binary (0 or 255)
//! on the N×N grid instead of anti-aliased paddles rendered large and resized; dots are 3×3 squares; and
//! contours keep at least `separation` pixels from one another (the original lets distractors pass close),
//! so that whether two dots are joined is decided by the image alone (a test checks it by bridging gaps).
//!
//! Shortcuts controlled (each tested in `tests/lra.rs`, no threshold on the number beating about 60%): the
//! amount of ink (both classes draw `distractors + 2` contours); the distance between the dots and where
//! they lie (both classes start from the two ends of one contour, and an image is kept only if it can be
//! completed either way, so which dots survive does not depend on the label); the ink near each dot; and
//! any side or direction of the image (each image is shown under one of the square's eight symmetries).
use rand::Rng;
use rand_pcg::Pcg64;

use super::Example;

#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Spec {
    /// Side of the image in pixels (LRA: 32; Path-X: 128).
    pub size: usize,
    /// Steps of each contour (longer: harder).
    pub contour_length: usize,
    /// Contours per image besides two (a positive's marked one and one unmarked, or a negative's two marked
    /// ones), so that both classes hold as many (1: in a 32×32 image three contours of up to 24 steps fit at
    /// a separation of 4; longer ones need a larger image).
    pub distractors: usize,
    pub dash: usize,
    pub gap: usize,
    /// The largest change of heading per step, in radians.
    pub max_turn: f64,
    /// The smallest distance (Chebyshev, in pixels) between two contours.
    pub separation: usize,
}

impl Spec {
    /// LRA's 32×32 images with contours of `contour_length` steps.
    pub fn sized(size: usize, contour_length: usize) -> Self {
        Self { size, contour_length, distractors: 1, dash: 3, gap: 1, max_turn: 0.35, separation: 4 }
    }
}

/// An image being drawn: pixels, and which contour owns each (for the separation rule).
struct Canvas {
    size: usize,
    pixels: Vec<u8>,
    owner: Vec<Option<usize>>,
}

impl Canvas {
    fn new(size: usize) -> Self {
        Self { size, pixels: vec![0; size * size], owner: vec![None; size * size] }
    }

    /// Whether every point is inside the image and at least `sep` pixels from the pixels of every contour
    /// but `id`.
    fn clear_for(&self, points: &[(usize, usize)], sep: usize, id: usize) -> bool {
        let n = self.size as i64;
        points.iter().all(|&(r, c)| {
            let (r, c, s) = (r as i64, c as i64, sep as i64);
            (r - s..=r + s).all(|rr| {
                (c - s..=c + s).all(|cc| {
                    !(0..n).contains(&rr)
                        || !(0..n).contains(&cc)
                        || self.owner[(rr * n + cc) as usize].is_none_or(|o| o == id)
                })
            })
        })
    }

    fn draw(&mut self, points: &[(usize, usize)], id: usize) {
        for &(r, c) in points {
            self.pixels[r * self.size + c] = 255;
            self.owner[r * self.size + c] = Some(id);
        }
    }
}

/// A contour: the pixels of its dashes, in order, and its two ends.
struct Contour {
    pixels: Vec<(usize, usize)>,
    ends: [(usize, usize); 2],
}

/// How near the border (in pixels) a walk starts turning back.
const STEER_WITHIN: f64 = 6.0;

/// A dashed contour of `spec.contour_length` steps from a random start, or `None` if it leaves the image
/// (its dots need a pixel of margin) or curls back until its ends are less than 5 pixels apart.
fn contour(rng: &mut Pcg64, spec: &Spec) -> Option<Contour> {
    let n = spec.size as f64;
    let start = (rng.random_range(2.0..n - 2.0), rng.random_range(2.0..n - 2.0));
    contour_from(rng, spec, start)
}

/// [`contour`] from a given start `(row, column)`: its first end.
fn contour_from(rng: &mut Pcg64, spec: &Spec, (mut y, mut x): (f64, f64)) -> Option<Contour> {
    let n = spec.size as f64;
    let mut heading = rng.random_range(0.0..std::f64::consts::TAU);
    let mut pixels = Vec::new();
    let mut ends = [(0, 0); 2];
    let period = spec.dash + spec.gap;
    // The last step must be on a dash: round the length to end a dash.
    let steps = (spec.contour_length / period) * period + spec.dash;
    for step in 0..steps {
        let (r, c) = (y.round(), x.round());
        if r < 1.0 || c < 1.0 || r > n - 2.0 || c > n - 2.0 {
            return None;
        }
        let p = (r as usize, c as usize);
        if step == 0 {
            ends[0] = p;
        }
        ends[1] = p;
        if step % period < spec.dash && pixels.last() != Some(&p) {
            pixels.push(p);
        }
        // Near the border the walk turns towards the centre as sharply as it may (curvature stays bounded);
        // elsewhere it turns at random.
        let border = y.min(x).min(n - 1.0 - y).min(n - 1.0 - x);
        let turn = if border < STEER_WITHIN {
            let towards = (n / 2.0 - y).atan2(n / 2.0 - x);
            let off =
                (towards - heading + std::f64::consts::PI).rem_euclid(std::f64::consts::TAU) - std::f64::consts::PI;
            off.clamp(-spec.max_turn, spec.max_turn)
        } else {
            rng.random_range(-spec.max_turn..=spec.max_turn)
        };
        heading += turn;
        y += heading.sin();
        x += heading.cos();
    }
    // Two dots on ends that nearly meet would read as one: such a contour is drawn again.
    let apart = ends[0].0.abs_diff(ends[1].0).max(ends[0].1.abs_diff(ends[1].1));
    (apart >= 5).then_some(Contour { pixels, ends })
}

/// A 3×3 dot centred on `p`.
fn dot(p: (usize, usize)) -> Vec<(usize, usize)> {
    let mut out = Vec::new();
    for r in p.0 - 1..=p.0 + 1 {
        for c in p.1 - 1..=p.1 + 1 {
            out.push((r, c));
        }
    }
    out
}

/// Images tried before giving up: the contours do not fit (too long, too many, too far apart).
const TRIES: usize = 2_000;

/// One image (row-major grey levels, 0 or 255) and its label (1: the dots are joined); an error when
/// `TRIES` images in a row could not place every contour.
pub fn generate(rng: &mut Pcg64, spec: &Spec) -> anyhow::Result<Example> {
    let joined = rng.random_bool(0.5);
    (0..TRIES).find_map(|_| try_generate(rng, spec, joined)).ok_or_else(|| {
        anyhow::anyhow!(
            "pathfinder: {} contours of {} steps, {} pixels apart, do not fit a {}×{} image: use shorter contours, fewer distractors or a larger image",
            spec.distractors + 2,
            spec.contour_length,
            spec.separation,
            spec.size,
            spec.size
        )
    })
}

/// One image of the class `joined`, or `None` when its contours did not fit.
///
/// A positive's dots are the two ends of one contour, so they lie as close together (and as far from the
/// border) as a contour's ends do; had a negative's two contours been drawn anywhere, the distance between
/// its dots alone would tell the classes apart (74.5% of images by one threshold, in a first version). So
/// both classes start from the same two dots, the ends of a contour `marked`, and the image is kept only
/// if it can be completed both ways: as a positive (`marked` drawn, with further contours around it) and as
/// a negative (`marked` left out, a different contour setting out from each dot). Which dots survive that
/// test then does not depend on the label, and the label picks which completion is shown.
fn try_generate(rng: &mut Pcg64, spec: &Spec, joined: bool) -> Option<Example> {
    let marked = contour(rng, spec)?;
    let positive = complete(rng, spec, &marked, true)?;
    let negative = complete(rng, spec, &marked, false)?;
    let pixels = random_symmetry(rng, if joined { &positive } else { &negative }, spec.size);
    Some(Example { tokens: pixels.iter().map(|&p| u32::from(p)).collect(), label: u32::from(joined) })
}

/// The image whose dots are `marked`'s ends: `marked` itself and `1 + distractors` contours more
/// (`joined`), or two contours setting out from its ends and `distractors` more. Both draw as many contours
/// (the positive's first unmarked one stands in for the negative's second marked one), so that the count of
/// lit pixels does not give the label away.
fn complete(rng: &mut Pcg64, spec: &Spec, marked: &Contour, joined: bool) -> Option<Vec<u8>> {
    let mut canvas = Canvas::new(spec.size);
    let ends = marked.ends;
    // The dots first, each owned by the contour it marks, so that every other contour keeps clear of both
    // (a negative's first contour must leave room for the second to set out from the other dot).
    for (k, e) in ends.iter().enumerate() {
        canvas.draw(&dot(*e), if joined { 0 } else { k });
    }
    for id in 0..2 + spec.distractors {
        // A few tries per contour before the image starts over (more for one that must set out from a
        // given dot: only its heading and turns are free).
        let tries = if !joined && id < 2 { 400 } else { 200 };
        let c = (0..tries).find_map(|_| {
            let c = match (joined, id) {
                (true, 0) => Contour { pixels: marked.pixels.clone(), ends },
                (false, 0 | 1) => contour_from(rng, spec, (ends[id].0 as f64, ends[id].1 as f64))?,
                _ => contour(rng, spec)?,
            };
            canvas.clear_for(&c.pixels, spec.separation, id).then_some(c)
        })?;
        canvas.draw(&c.pixels, id);
    }
    Some(canvas.pixels)
}

/// The image under one of the square's eight symmetries, drawn uniformly (flips of rows, of columns, and a
/// transpose), so that no direction or side of the image is favoured by either class: how the contours are
/// placed (the first on an empty image, the others around it, walks steered off the border) could
/// otherwise leave the dots' mean row or column a little more spread in one class than in the other.
fn random_symmetry(rng: &mut Pcg64, pixels: &[u8], n: usize) -> Vec<u8> {
    let (flip_rows, flip_columns, transpose) = (rng.random_bool(0.5), rng.random_bool(0.5), rng.random_bool(0.5));
    let mut out = vec![0; n * n];
    for r in 0..n {
        for c in 0..n {
            let (r2, c2) = (if flip_rows { n - 1 - r } else { r }, if flip_columns { n - 1 - c } else { c });
            let (r2, c2) = if transpose { (c2, r2) } else { (r2, c2) };
            out[r2 * n + c2] = pixels[r * n + c];
        }
    }
    out
}
