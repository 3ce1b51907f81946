//! Running recipes: the sweep, its result files, plots and summaries, the comparison with the committed
//! reference, scaling out over processes and Slurm, and the benchmarks (sequence-length complexity,
//! training-step throughput).
pub mod bench;
pub mod complexity;
pub mod coord;
pub mod heads;
pub mod launch;
pub mod plot;
pub mod report;
pub mod reproduce;
pub mod results;
pub mod scale;
pub mod sensitivity;
pub mod settle;
pub mod summary;
pub mod sweep;
pub mod tensorboard;
pub mod tune;
pub mod verdicts;

/// What every finished results directory gets from its CSVs, in this order: the plots, the TensorBoard
/// event files of any run that has none yet (runs finished by an earlier, interrupted sweep or merged from
/// shards), and the HTML report that embeds the plots. A sweep, a merge and `ablate plot` all end here.
pub fn finish(out: &std::path::Path, recipe: &crate::recipe::Recipe) -> anyhow::Result<()> {
    plot::plot_results(out, recipe)?;
    tensorboard::export(out, recipe)?;
    report::write_report(out, recipe)
}
