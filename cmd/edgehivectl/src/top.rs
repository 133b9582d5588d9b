//! `edgehivectl top`: quantities read as kubectl reads them, and the table.

use serde_json::Value;

/// A CPU quantity (`250000000n`, `15u`, `15m`, `2`) in millicores.
pub(crate) fn millicores(quantity: &str) -> Option<f64> {
    let (number, per_milli) = [("n", 1e6), ("u", 1e3), ("m", 1.0)]
        .iter()
        .find_map(|(suffix, scale)| Some((quantity.strip_suffix(suffix)?, *scale)))
        .unwrap_or((quantity, 1e-3));
    number.parse::<f64>().ok().map(|n| n / per_milli)
}

/// A memory quantity (`2048Ki`, `5Mi`, `1234`) in bytes.
pub(crate) fn bytes(quantity: &str) -> Option<u64> {
    let units = [
        ("Ki", 1u64 << 10),
        ("Mi", 1 << 20),
        ("Gi", 1 << 30),
        ("Ti", 1 << 40),
    ];
    let (number, unit) = units
        .iter()
        .find_map(|(suffix, unit)| Some((quantity.strip_suffix(suffix)?, *unit)))
        .unwrap_or((quantity, 1));
    number.parse::<u64>().ok()?.checked_mul(unit)
}

/// `kubectl top`'s table: the usage of each row, CPU in millicores and
/// memory in MiB.
pub(crate) fn top_table(header: &[&str], rows: Vec<(Vec<String>, &Value)>) -> String {
    let mut lines = vec![
        header
            .iter()
            .map(|h| (*h).to_owned())
            .chain(["CPU(cores)".to_owned(), "MEMORY(bytes)".to_owned()])
            .collect::<Vec<_>>(),
    ];
    for (names, usage) in rows {
        // As kubectl shows them: millicores rounded up, whole MiB.
        let cpu = usage["cpu"]
            .as_str()
            .and_then(millicores)
            .unwrap_or(0.0)
            .ceil();
        let memory = usage["memory"].as_str().and_then(bytes).unwrap_or(0) >> 20;
        lines.push(
            names
                .into_iter()
                .chain([format!("{cpu}m"), format!("{memory}Mi")])
                .collect(),
        );
    }
    let widths: Vec<usize> = (0..lines[0].len())
        .map(|i| lines.iter().map(|l| l[i].len()).max().unwrap_or(0))
        .collect();
    lines
        .iter()
        .map(|line| {
            let cells: Vec<String> = line
                .iter()
                .zip(&widths)
                .map(|(cell, width)| format!("{cell:<width$}"))
                .collect();
            cells.join("   ").trim_end().to_owned() + "\n"
        })
        .collect()
}
