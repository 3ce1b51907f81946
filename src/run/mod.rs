//! Running recipes: the sweep, its result files, plots and summaries, scaling out over processes and
//! Slurm, and the benchmarks (sequence-length complexity, training-step throughput).
pub mod bench;
pub mod complexity;
pub mod plot;
pub mod results;
pub mod scale;
pub mod summary;
pub mod sweep;
