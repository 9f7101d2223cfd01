//! The machine description and the result table.

use std::time::{SystemTime, UNIX_EPOCH};

/// Core count, CPU model and the date of the run.
#[derive(Debug, Clone)]
pub(crate) struct Machine {
    pub(crate) cores: usize,
    pub(crate) cpu: String,
    pub(crate) date: String,
}

impl Machine {
    pub(crate) fn detect() -> Self {
        let cores = std::thread::available_parallelism().map_or(1, usize::from);
        let cpu = std::fs::read_to_string("/proc/cpuinfo")
            .ok()
            .and_then(|info| {
                info.lines()
                    .find(|line| line.starts_with("model name"))
                    .and_then(|line| line.split_once(':'))
                    .map(|(_, model)| model.trim().to_string())
            })
            .unwrap_or_else(|| "unknown".to_string());
        Self { cores, cpu, date: utc_now() }
    }
}

/// The current UTC date and time as `YYYY-MM-DD HH:MM UTC`.
fn utc_now() -> String {
    let secs = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs());
    let days = (secs / 86_400) as i64;
    let (hh, mm) = ((secs % 86_400) / 3600, (secs % 3600) / 60);
    // Civil date from days since 1970-01-01 (Howard Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!("{year:04}-{month:02}-{day:02} {hh:02}:{mm:02} UTC")
}

/// A markdown table, printed with aligned columns so that it reads well in a terminal too.
#[derive(Debug, Default)]
pub(crate) struct Table {
    rows: Vec<[String; 4]>,
}

impl Table {
    pub(crate) fn row(
        &mut self,
        what: impl Into<String>,
        value: String,
        unit: &str,
        notes: impl Into<String>,
    ) {
        self.rows.push([what.into(), value, unit.to_string(), notes.into()]);
    }

    pub(crate) fn render(&self) -> String {
        let header = ["Measurement", "Value", "Unit", "Notes"].map(String::from);
        let mut widths = [0usize; 4];
        for row in std::iter::once(&header).chain(&self.rows) {
            for (width, cell) in widths.iter_mut().zip(row) {
                *width = (*width).max(cell.chars().count());
            }
        }
        let line = |row: &[String; 4]| {
            let cells: Vec<String> = row
                .iter()
                .zip(widths)
                .enumerate()
                .map(
                    |(i, (cell, width))| {
                        if i == 1 { format!("{cell:>width$}") } else { format!("{cell:<width$}") }
                    },
                )
                .collect();
            format!("| {} |\n", cells.join(" | "))
        };
        let mut out = line(&header);
        let rule: Vec<String> = widths
            .iter()
            .enumerate()
            .map(|(i, w)| if i == 1 { format!("{}:", "-".repeat(w + 1)) } else { "-".repeat(w + 2) })
            .collect();
        out.push_str(&format!("|{}|\n", rule.join("|")));
        for row in &self.rows {
            out.push_str(&line(row));
        }
        out
    }
}

/// `1234567.8` → `1 234 568`: thousands separated for readability.
pub(crate) fn grouped(value: f64) -> String {
    let digits = format!("{:.0}", value.max(0.0));
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i) % 3 == 0 {
            out.push(' ');
        }
        out.push(c);
    }
    out
}
