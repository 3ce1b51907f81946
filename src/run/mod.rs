//! Running recipes: the sweep and its result files, the settling loop that adds seeds, tuning, scaling out
//! over processes and Slurm, and the benchmarks (sequence-length complexity, training-step throughput).
//! What is made of finished results (summaries, verdicts, plots, reports) is `judge`, below this.
pub mod bench;
pub mod complexity;
pub mod coord;
pub mod heads;
pub mod init_grads;
pub mod launch;
pub mod results;
pub mod scale;
pub mod settle;
pub mod sweep;
pub mod tune;
pub mod wall_clock;

/// Reads the finished results directory `out` once and draws, exports and reports it
/// ([`crate::judge::finish`]).
pub fn finish(out: &std::path::Path, recipe: &crate::recipe::Recipe) -> anyhow::Result<()> {
    let results = crate::judge::reading::Results::open(out, recipe, None)?;
    crate::judge::finish(&results)
}
