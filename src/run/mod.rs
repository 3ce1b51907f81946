//! Running recipes: the sweep, its result files, plots and summaries, the comparison with the committed
//! reference, scaling out over processes and
//! Slurm, and the benchmarks (sequence-length complexity, training-step throughput).
pub mod bench;
pub mod complexity;
pub mod heads;
pub mod interaction;
pub mod launch;
pub mod plot;
pub mod report;
pub mod reproduce;
pub mod results;
pub mod scale;
pub mod summary;
pub mod sweep;
pub mod tensorboard;
