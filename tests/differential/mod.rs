//! What the comparisons with other people's code share: a table of explained differences that
//! must each still match one (so it stays true), and the count line of the run.

#[path = "../common/docs.rs"]
mod docs;

/// Differences found, each either matching a row of an explanation table or kept as unexplained.
/// A row is `(key glob, entry glob, why)`; `*` in a glob stands for any text.
pub struct Explanations<'a> {
    table: &'a [(&'a str, &'a str, &'a str)],
    used: Vec<bool>,
    unexplained: Vec<String>,
    pub differences: usize,
}

impl<'a> Explanations<'a> {
    pub fn new(table: &'a [(&'a str, &'a str, &'a str)]) -> Self {
        Self {
            table,
            used: vec![false; table.len()],
            unexplained: vec![],
            differences: 0,
        }
    }

    /// One difference: `key` and `entry` as the table's globs see them, `what` as a person reads it.
    pub fn difference(&mut self, key: &str, entry: &str, what: String) {
        self.differences += 1;
        match self
            .table
            .iter()
            .position(|(k, e, _)| glob(k, key) && glob(e, entry))
        {
            Some(i) => self.used[i] = true,
            None => self.unexplained.push(what),
        }
    }

    /// Fails on any unexplained difference and any row no difference matched.
    pub fn assert_all_explained(&self) {
        let stale: Vec<String> = self
            .table
            .iter()
            .zip(&self.used)
            .filter(|(_, used)| !**used)
            .map(|((k, e, _), _)| format!("{k}: {e}"))
            .collect();
        assert!(
            self.unexplained.is_empty() && stale.is_empty(),
            "unexplained differences:\n  {}\nexplanations matching nothing:\n  {}",
            self.unexplained.join("\n  "),
            stale.join("\n  ")
        );
    }
}

/// Whether `text` matches `pattern`, where `*` stands for any text.
pub fn glob(pattern: &str, text: &str) -> bool {
    docs::wildcard_matches(pattern, "*", text)
}

/// Prints the count line and appends it to `$GPU_DRA_TEST_REPORT` when set (e2e/run-tests ends
/// with those lines).
pub fn report(line: &str) {
    use std::io::Write as _;
    eprintln!("{line}");
    if let Some(path) = std::env::var_os("GPU_DRA_TEST_REPORT") {
        let mut file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&path)
            .unwrap_or_else(|e| panic!("GPU_DRA_TEST_REPORT {path:?}: {e}"));
        writeln!(file, "{line}").unwrap_or_else(|e| panic!("GPU_DRA_TEST_REPORT {path:?}: {e}"));
    }
}
