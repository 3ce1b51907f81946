//! ListOps (Nangia & Bowman 2018, as the Long Range Arena uses it): nested prefix expressions over the digits
//! 0–9 with four operators — MAX, MIN, MED (median) and SM (sum modulo 10) — written as LRA's tokens
//! `[MAX 2 9 [MIN 4 7 ] 0 ]`; the label is the expression's value (10 classes). LRA's defaults: at most 10
//! levels of nesting and 10 arguments per operator; the length (in tokens) is drawn within a range the recipe
//! sets (LRA: 500–2,000).
//!
//! MED of an even count is the mean of the two middle values rounded down, as LRA's generator computes it
//! (`int(np.median(values))` on non-negative digits).
//!
//! Generation grows a tree to a drawn length: it starts from one operator over 2–10 digits and replaces a
//! random digit (above the depth limit) by a new operator over 2–10 digits until the target length is
//! reached, never past the range's end.
use rand_pcg::Pcg64;

use super::{between, Example};

/// The four operators.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    Max,
    Min,
    Med,
    Sm,
}

impl Op {
    const ALL: [Op; 4] = [Op::Max, Op::Min, Op::Med, Op::Sm];

    fn name(self) -> &'static str {
        match self {
            Op::Max => "[MAX",
            Op::Min => "[MIN",
            Op::Med => "[MED",
            Op::Sm => "[SM",
        }
    }

    /// The operator's value on its arguments' values.
    pub fn apply(self, values: &[u32]) -> u32 {
        match self {
            Op::Max => *values.iter().max().expect("an operator has arguments"),
            Op::Min => *values.iter().min().expect("an operator has arguments"),
            Op::Sm => values.iter().sum::<u32>() % 10,
            Op::Med => {
                let mut v = values.to_vec();
                v.sort_unstable();
                let n = v.len();
                if n % 2 == 1 {
                    v[n / 2]
                } else {
                    (v[n / 2 - 1] + v[n / 2]) / 2
                }
            }
        }
    }
}

/// Token ids: 0–9 the digits, 10–13 the operators' opening tokens, 14 the closing `]`.
pub const VOCAB: u32 = 15;
const CLOSE: u32 = 14;

fn op_token(op: Op) -> u32 {
    10 + Op::ALL.iter().position(|&o| o == op).expect("one of the four") as u32
}

/// A token id as LRA writes it.
pub fn token_name(t: u32) -> String {
    match t {
        0..=9 => t.to_string(),
        10..=13 => Op::ALL[(t - 10) as usize].name().to_string(),
        CLOSE => "]".to_string(),
        _ => format!("<{t}>"),
    }
}

/// The generator's settings.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Spec {
    pub min_length: usize,
    pub max_length: usize,
    pub max_depth: usize,
    pub max_args: usize,
}

impl Spec {
    /// LRA's depth and arity limits with lengths in `min..=max`.
    pub fn lengths(min_length: usize, max_length: usize) -> Self {
        Self { min_length, max_length, max_depth: 10, max_args: 10 }
    }

    /// The length range made workable: at least 4 tokens (one operator over two digits), the end at least
    /// 2 past the start.
    fn bounds(&self) -> (usize, usize) {
        let lo = self.min_length.max(4);
        (lo, self.max_length.max(lo + 2))
    }
}

enum Node {
    Digit(u32),
    Apply(Op, Vec<usize>),
}

/// One expression of a length drawn in the spec's range, and its value.
pub fn generate(rng: &mut Pcg64, spec: &Spec) -> Example {
    // Growth stops within 2 tokens of the target (an operator adds at least 3), so the target is drawn at
    // least 2 above the range's start.
    let (lo, hi) = spec.bounds();
    let target = between(rng, lo + 2, hi);
    let mut nodes: Vec<Node> = Vec::new();
    let digit = |rng: &mut Pcg64| between(rng, 0, 9) as u32;
    let op = |rng: &mut Pcg64| Op::ALL[between(rng, 0, 3)];
    // The root: an operator over k digits is k + 2 tokens.
    let k = between(rng, 2, spec.max_args.min(target - 2).max(2));
    let children: Vec<usize> = (0..k).map(|i| i + 1).collect();
    nodes.push(Node::Apply(op(rng), children));
    let mut leaves: Vec<(usize, usize)> = Vec::new(); // (node, depth)
    for i in 0..k {
        nodes.push(Node::Digit(digit(rng)));
        leaves.push((i + 1, 1));
    }
    let mut length = k + 2;
    loop {
        // A digit at depth d becomes an operator over j digits: j + 1 more tokens.
        let room = target.saturating_sub(length);
        if room < 3 {
            break;
        }
        let expandable: Vec<usize> = (0..leaves.len()).filter(|&i| leaves[i].1 < spec.max_depth).collect();
        if expandable.is_empty() {
            break;
        }
        let pick = expandable[between(rng, 0, expandable.len() - 1)];
        let (node, depth) = leaves.swap_remove(pick);
        let j = between(rng, 2, spec.max_args.min(room - 1));
        let first = nodes.len();
        for i in 0..j {
            nodes.push(Node::Digit(digit(rng)));
            leaves.push((first + i, depth + 1));
        }
        nodes[node] = Node::Apply(op(rng), (first..first + j).collect());
        length += j + 1;
    }
    let mut tokens = Vec::with_capacity(length);
    let label = write(&nodes, 0, &mut tokens);
    Example { tokens, label }
}

/// Appends node `i`'s tokens and returns its value.
fn write(nodes: &[Node], i: usize, tokens: &mut Vec<u32>) -> u32 {
    match &nodes[i] {
        Node::Digit(d) => {
            tokens.push(*d);
            *d
        }
        Node::Apply(op, children) => {
            tokens.push(op_token(*op));
            let values: Vec<u32> = children.iter().map(|&c| write(nodes, c, tokens)).collect();
            tokens.push(CLOSE);
            op.apply(&values)
        }
    }
}
