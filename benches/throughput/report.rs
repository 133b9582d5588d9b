//! Results of a benchmark run: a table for people, JSON lines for machines.

use std::io::Write;

/// One measured figure, with its same-run baseline where it has one.
#[derive(Debug, Clone)]
pub struct Row {
    /// Scenario name, `group/scenario`.
    pub scenario: String,
    /// What was measured.
    pub metric: String,
    /// The value.
    pub value: f64,
    /// Its unit.
    pub unit: &'static str,
    /// The same figure for the baseline, measured in the same run.
    pub baseline: Option<f64>,
    /// What the baseline is.
    pub baseline_name: &'static str,
}

/// All rows of one run.
#[derive(Debug, Default)]
pub struct Report {
    rows: Vec<Row>,
}

impl Report {
    /// Adds a figure with its baseline.
    pub fn with_baseline(
        &mut self,
        scenario: &str,
        metric: &str,
        value: f64,
        unit: &'static str,
        baseline: f64,
        baseline_name: &'static str,
    ) {
        self.rows.push(Row {
            scenario: scenario.to_owned(),
            metric: metric.to_owned(),
            value,
            unit,
            baseline: Some(baseline),
            baseline_name,
        });
    }

    /// Adds a figure that has no baseline of its own (a time, a size).
    pub fn plain(&mut self, scenario: &str, metric: &str, value: f64, unit: &'static str) {
        self.rows.push(Row {
            scenario: scenario.to_owned(),
            metric: metric.to_owned(),
            value,
            unit,
            baseline: None,
            baseline_name: "",
        });
    }

    /// Prints each row as one JSON object, baseline inline (for a parent
    /// process to read back with [`Report::add_json`]).
    pub fn print_json_rows(&self) -> anyhow::Result<()> {
        let mut out = std::io::stdout().lock();
        for row in &self.rows {
            let line = serde_json::json!({
                "scenario": row.scenario, "metric": row.metric, "value": row.value,
                "unit": row.unit, "baseline": row.baseline, "baseline_name": row.baseline_name,
            });
            writeln!(out, "{line}")?;
        }
        Ok(())
    }

    /// Adds a row printed by [`Report::print_json_rows`].
    pub fn add_json(&mut self, row: &serde_json::Value) -> anyhow::Result<()> {
        let text = |key: &str| row[key].as_str().map(str::to_owned);
        let unit: &'static str = match row["unit"].as_str() {
            Some("s") => "s",
            Some("ms") => "ms",
            Some("KiB") => "KiB",
            Some("objects/s") => "objects/s",
            Some("msgs/s") => "msgs/s",
            other => anyhow::bail!("unknown unit {other:?}"),
        };
        let baseline_name: &'static str = match row["baseline_name"].as_str() {
            Some("raw unix socket") => "raw unix socket",
            Some("raw tcp socket") => "raw tcp socket",
            _ => "",
        };
        self.rows.push(Row {
            scenario: text("scenario").unwrap_or_default(),
            metric: text("metric").unwrap_or_default(),
            value: row["value"].as_f64().unwrap_or_default(),
            unit,
            baseline: row["baseline"].as_f64(),
            baseline_name,
        });
        Ok(())
    }

    /// Prints the table.
    pub fn print_table(&self) {
        println!(
            "{:<28} {:<16} {:>14} {:<8} {:>14} {:>7}  baseline is",
            "scenario", "metric", "value", "unit", "baseline", "ratio"
        );
        for row in &self.rows {
            let (baseline, ratio) = match row.baseline {
                Some(b) if b != 0.0 => (format_value(b), format!("{:.2}", row.value / b)),
                Some(b) => (format_value(b), "-".to_owned()),
                None => ("-".to_owned(), "-".to_owned()),
            };
            println!(
                "{:<28} {:<16} {:>14} {:<8} {:>14} {:>7}  {}",
                row.scenario,
                row.metric,
                format_value(row.value),
                row.unit,
                baseline,
                ratio,
                row.baseline_name
            );
        }
    }

    /// Prints one JSON object per figure and per baseline.
    pub fn print_json_lines(&self) -> std::io::Result<()> {
        let mut out = std::io::stdout().lock();
        for row in &self.rows {
            let line = serde_json::json!({
                "scenario": row.scenario, "metric": row.metric,
                "value": row.value, "unit": row.unit,
            });
            writeln!(out, "{line}")?;
            if let Some(baseline) = row.baseline {
                let line = serde_json::json!({
                    "scenario": row.scenario, "metric": format!("{}_baseline", row.metric),
                    "value": baseline, "unit": row.unit, "baseline": row.baseline_name,
                });
                writeln!(out, "{line}")?;
            }
        }
        Ok(())
    }
}

fn format_value(v: f64) -> String {
    if v.abs() >= 100.0 {
        format!("{v:.0}")
    } else {
        format!("{v:.2}")
    }
}

/// The median of some measurements.
pub fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    values.get(values.len() / 2).copied().unwrap_or(0.0)
}

/// The `q`-quantile (0..=1) of sorted durations in microseconds.
pub fn quantile_us(sorted_ns: &[u64], q: f64) -> f64 {
    if sorted_ns.is_empty() {
        return 0.0;
    }
    let index = ((sorted_ns.len() - 1) as f64 * q).round() as usize;
    sorted_ns[index.min(sorted_ns.len() - 1)] as f64 / 1_000.0
}
