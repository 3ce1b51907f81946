//! Named metrics. Each is declared once (by the kind of run that measures it, or here when every kind
//! does): its `runs.csv` column and/or `curves.csv` key, a human label, its unit and whether higher is
//! better. CSV columns, console lines, summary tables and plot titles and axes all read these declarations.
use std::borrow::Cow;

#[derive(Debug, Clone, PartialEq)]
pub struct Metric {
    /// Column of the final value in `runs.csv` (`None`: a curve only).
    pub column: Option<Cow<'static, str>>,
    /// `split/metric` key of its learning curve in `curves.csv` (`None`: a final value only).
    pub curve: Option<&'static str>,
    /// What it is, for legends, axes and tables: "test loss", "test accuracy".
    pub label: &'static str,
    /// "nats/token", "images/s", "" for a plain number or a fraction.
    pub unit: &'static str,
    pub higher_is_better: bool,
    /// Decimal places in tables and console lines.
    pub digits: usize,
    /// Decimal places in `runs.csv`.
    pub csv_digits: usize,
    /// Shown in the console line after a run and in `ablate summary`.
    pub headline: bool,
    /// Its curve gets a chart against the step.
    pub chart: bool,
    /// Its final value gets a chart against the first swept key.
    pub final_chart: bool,
    /// A diagnostic (a property of the data or of the model's internals, not its quality): judged and
    /// shown, never a verdict of model quality or a primary metric.
    pub diagnostic: bool,
}

impl Metric {
    /// A final value that is also a learning curve.
    pub const fn both(
        column: &'static str,
        curve: &'static str,
        label: &'static str,
        unit: &'static str,
        higher_is_better: bool,
    ) -> Self {
        Self {
            column: Some(Cow::Borrowed(column)),
            curve: Some(curve),
            label,
            unit,
            higher_is_better,
            digits: 4,
            csv_digits: 6,
            headline: true,
            chart: true,
            final_chart: true,
            diagnostic: false,
        }
    }

    /// A learning curve without a final column.
    pub const fn curve(curve: &'static str, label: &'static str, unit: &'static str, higher_is_better: bool) -> Self {
        Self {
            column: None,
            curve: Some(curve),
            label,
            unit,
            higher_is_better,
            digits: 4,
            csv_digits: 6,
            headline: false,
            chart: true,
            final_chart: false,
            diagnostic: false,
        }
    }

    /// A final value without a curve.
    pub const fn column(column: &'static str, label: &'static str, unit: &'static str, higher_is_better: bool) -> Self {
        Self {
            column: Some(Cow::Borrowed(column)),
            curve: None,
            label,
            unit,
            higher_is_better,
            digits: 4,
            csv_digits: 6,
            headline: true,
            chart: true,
            final_chart: true,
            diagnostic: false,
        }
    }

    pub const fn digits(mut self, digits: usize) -> Self {
        self.digits = digits;
        self
    }

    pub const fn csv(mut self, digits: usize) -> Self {
        self.csv_digits = digits;
        self
    }

    /// Left out of console lines and summaries (still in the CSV and plots).
    pub const fn detail(mut self) -> Self {
        self.headline = false;
        self
    }

    /// No charts of their own (an x axis for other charts, a value other charts show).
    pub const fn no_charts(mut self) -> Self {
        self.chart = false;
        self.final_chart = false;
        self
    }

    /// A diagnostic, not a measure of quality ([`Metric::diagnostic`]).
    pub const fn diagnostic(mut self) -> Self {
        self.diagnostic = true;
        self
    }

    /// A curve chart, but no chart of the final value.
    pub const fn no_final_chart(mut self) -> Self {
        self.final_chart = false;
        self
    }

    /// The label of its learning curve: a `val/…` curve is measured on the validation split, so a label
    /// that names the test split (the final column's) names the validation split instead.
    pub fn curve_label(&self) -> Cow<'static, str> {
        match (self.curve.is_some_and(|c| c.starts_with("val/")), self.label.strip_prefix("test ")) {
            (true, Some(rest)) => Cow::Owned(format!("validation {rest}")),
            _ => Cow::Borrowed(self.label),
        }
    }

    /// [`Metric::axis`] of its learning curve ([`Metric::curve_label`]).
    pub fn curve_axis(&self) -> String {
        let label = self.curve_label();
        if self.unit.is_empty() {
            label.into_owned()
        } else {
            format!("{label} ({})", self.unit)
        }
    }

    /// The label with its unit, for an axis: "test loss (nats/token)".
    pub fn axis(&self) -> String {
        if self.unit.is_empty() {
            self.label.to_string()
        } else {
            format!("{} ({})", self.label, self.unit)
        }
    }

    /// `value` with this metric's digits (empty when it is not finite: a diverged run has no score).
    pub fn format(&self, value: f64) -> String {
        if value.is_finite() {
            format!("{value:.*}", self.digits)
        } else {
            String::new()
        }
    }

    /// `value` as `runs.csv` records it (empty when it is not finite).
    pub fn csv_value(&self, value: f64) -> String {
        if value.is_finite() {
            format!("{value:.*}", self.csv_digits)
        } else {
            String::new()
        }
    }

    pub fn column_name(&self) -> Option<&str> {
        self.column.as_deref()
    }
}

/// Whether `m` measures the machine or the launch (throughput, time, memory, utilisation, communication):
/// one of [`cost`]'s columns (a world of 2 lists the data-parallel ones too), never a verdict of quality.
pub fn is_cost(m: &Metric) -> bool {
    cost("", 2).iter().any(|c| c.column_name().is_some() && c.column_name() == m.column_name())
}

/// Cost metrics every run records, after its kind's own.
/// A run on `world_size` data-parallel processes also records its global batch and the share of training
/// time spent in collectives; throughput and FLOP/s are the whole group's, MFU per process.
pub fn cost(throughput_unit: &'static str, world_size: i64) -> Vec<Metric> {
    let mut m = vec![
        Metric::column("params", "trainable parameters", "", false).digits(0).csv(0).detail().no_charts(),
        Metric::column("wall_s", "wall time", "s", false).digits(1).csv(3).detail().no_charts(),
        Metric::column("tokens_per_s", "training throughput", throughput_unit, true).digits(0).csv(1).no_charts(),
        Metric::column("model_tflops", "achieved model FLOP/s", "TFLOP/s", true).csv(4).detail().no_charts(),
        Metric::column("mfu", "model FLOPs utilisation of the matmul peak", "", true).digits(3).csv(4).no_charts(),
        Metric::column("steps", "optimisation steps", "", true).digits(0).csv(0).detail().no_charts(),
        // A run's bits depend on it: libtorch's CPU kernels split reductions by thread.
        Metric::column("threads", "intra-op CPU threads the run trained on", "", false)
            .digits(0)
            .csv(0)
            .detail()
            .no_charts(),
        Metric::column(
            "peak_memory_mb",
            "peak memory while training (host RSS on the CPU, CUDA allocator on a GPU)",
            "MB",
            false,
        )
        .digits(0)
        .csv(1)
        .detail()
        .no_charts(),
    ];
    if world_size > 1 {
        m.push(
            Metric::column("global_batch", "examples per step over all processes", "", false)
                .digits(0)
                .csv(0)
                .detail()
                .no_charts(),
        );
        m.push(
            Metric::column("comm_share", "share of training time in gradient all-reduce", "", false)
                .digits(3)
                .csv(4)
                .detail()
                .no_charts(),
        );
    }
    m
}

/// Curves of the optimisation loop, the same for every kind.
pub fn optimisation(loss_unit: &'static str) -> Vec<Metric> {
    vec![
        Metric::both("train_loss", "train/loss", "training loss", loss_unit, false).detail().no_final_chart(),
        Metric::curve("train/grad_norm", "gradient norm before clipping", "", false),
        Metric::curve("train/lr", "learning rate", "", false).no_charts(),
        Metric::curve("train/loss_scale", "fp16 loss scale", "", true).no_charts(),
    ]
}

/// The outlier probe (`train.probe_outliers`): diagnostics of the model's internals, lower is fewer outliers.
pub fn outlier_probes() -> Vec<Metric> {
    vec![
        Metric::column("attn_out_peak_ratio", "largest activation of an attention output over its RMS", "", false)
            .diagnostic()
            .digits(3),
        Metric::column("attn_out_kurtosis", "kurtosis of the attention outputs", "", false).diagnostic().digits(3),
        Metric::column("attn_logit_max", "largest attention logit", "", false).diagnostic().digits(2),
    ]
}

/// The residual-stream probe (`train.probe_residual`): outliers where Bondarenko et al. measure them, and
/// where attention parks.
pub fn residual_probes() -> Vec<Metric> {
    vec![
        Metric::column("resid_peak_ratio", "largest residual-stream activation over its RMS", "", false)
            .diagnostic()
            .digits(3),
        Metric::column("resid_kurtosis", "kurtosis of the residual stream", "", false).diagnostic().digits(3),
        Metric::column("attn_first_token_mass", "attention weight on the first token", "", false)
            .diagnostic()
            .digits(4),
        Metric::column("attn_delimiter_mass", "attention weight on spaces and newlines", "", false)
            .diagnostic()
            .digits(4),
    ]
}

/// The attention probes (`train.probe_attention`).
pub fn attention_probes() -> Vec<Metric> {
    vec![
        Metric::curve("val/attn_entropy", "mean attention entropy", "nats", false),
        Metric::curve("val/attn_max_weight", "mean of each row's largest attention weight", "", false),
    ]
}
