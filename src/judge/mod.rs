//! Judging results: the one reading of a results directory ([`reading::Results`]), and what is made from
//! it — the summary tables and verdicts, the verdict block of a results README, the sensitivity and compute
//! (what each arm is worth) sections,
//! reproduction against a committed reference, TensorBoard event files, the HTML report and the plots.
//! Nothing here trains; `run` (the sweep, scale-out, the settling loop) sits above and calls in.
pub mod compute;
pub mod plot;
pub mod reading;
pub mod report;
pub mod reproduce;
pub mod sensitivity;
pub mod summary;
pub mod tensorboard;
pub mod verdicts;

use anyhow::Result;

/// What every finished results directory gets from its CSVs, in this order: the plots, the TensorBoard
/// event files of any run that has none yet (runs finished by an earlier, interrupted sweep or merged from
/// shards), and the HTML report that embeds the plots. A sweep, a merge and `ablate plot` all end here.
pub fn finish(results: &reading::Results) -> Result<()> {
    plot::plot_results(results)?;
    tensorboard::export(results)?;
    report::write_report(results)
}
