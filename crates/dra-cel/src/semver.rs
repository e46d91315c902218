//! Semantic versions as Kubernetes' CEL semver library parses them (blang/semver v4 `Parse`,
//! plus the library's `normalize` mode). Equality and ordering ignore build metadata.
use std::cmp::Ordering;
use std::fmt;
use std::fmt::Write as _;

#[derive(Debug, Clone, PartialEq, Eq)]
enum PreRelease {
    Numeric(u64),
    Alpha(String),
}

#[derive(Debug, Clone)]
pub struct Semver {
    pub major: u64,
    pub minor: u64,
    pub patch: u64,
    pre: Vec<PreRelease>,
    build: Vec<String>,
}

/// Error texts are blang/semver's and Go strconv's, verbatim.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct SemverError(pub String);

fn contains_only(s: &str, allowed: impl Fn(u8) -> bool) -> bool {
    s.bytes().all(allowed)
}

fn is_alphanum(c: u8) -> bool {
    c.is_ascii_alphanumeric() || c == b'-'
}

fn has_leading_zeroes(s: &str) -> bool {
    s.len() > 1 && s.as_bytes()[0] == b'0'
}

/// `strconv.ParseUint(s, 10, 64)` with Go's error text.
fn parse_uint(s: &str) -> Result<u64, SemverError> {
    if s.is_empty() || !contains_only(s, |c| c.is_ascii_digit()) {
        return Err(SemverError(format!(
            "strconv.ParseUint: parsing {}: invalid syntax",
            go_quote(s)
        )));
    }
    s.parse::<u64>().map_err(|_| {
        SemverError(format!(
            "strconv.ParseUint: parsing {}: value out of range",
            go_quote(s)
        ))
    })
}

/// Go's `unicode.IsPrint`, approximated: controls, separators other than the ASCII space,
/// format characters, private use and noncharacters are not printable (unassigned code points
/// are treated as printable).
fn go_printable(c: char) -> bool {
    let u = c as u32;
    !(c.is_control()
        || matches!(
            u,
            0xA0 | 0xAD
                | 0x600..=0x605
                | 0x61C
                | 0x6DD
                | 0x70F
                | 0x1680
                | 0x180E
                | 0x2000..=0x200F
                | 0x2028..=0x202F
                | 0x205F..=0x2064
                | 0x2066..=0x206F
                | 0x3000
                | 0xD800..=0xF8FF
                | 0xFEFF
                | 0xFFF9..=0xFFFB
                | 0xFFFE..=0xFFFF
                | 0x110BD
                | 0x1D173..=0x1D17A
                | 0xE0001..=0xE007F
                | 0xF0000..
        ))
}

/// Go's `strconv.Quote` (`%q`).
pub(crate) fn go_quote(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\x07' => out.push_str("\\a"),
            '\x08' => out.push_str("\\b"),
            '\x0c' => out.push_str("\\f"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\x0b' => out.push_str("\\v"),
            c if go_printable(c) => out.push(c),
            c if (c as u32) < 0x80 => {
                let _ = write!(out, "\\x{:02x}", c as u32);
            }
            c if (c as u32) < 0x10000 => {
                let _ = write!(out, "\\u{:04x}", c as u32);
            }
            c => {
                let _ = write!(out, "\\U{:08x}", c as u32);
            }
        }
    }
    out.push('"');
    out
}

impl Semver {
    /// blang/semver v4 `Parse` (strict).
    pub fn parse(s: &str) -> Result<Semver, SemverError> {
        let err = |m: String| Err(SemverError(m));
        if s.is_empty() {
            return err("Version string empty".into());
        }
        let parts: Vec<&str> = s.splitn(3, '.').collect();
        if parts.len() != 3 {
            return err("No Major.Minor.Patch elements found".into());
        }
        let digits = |c: u8| c.is_ascii_digit();
        if !contains_only(parts[0], digits) {
            return err(format!(
                "Invalid character(s) found in major number {}",
                go_quote(parts[0])
            ));
        }
        if has_leading_zeroes(parts[0]) {
            return err(format!(
                "Major number must not contain leading zeroes {}",
                go_quote(parts[0])
            ));
        }
        let major = parse_uint(parts[0])?;
        if !contains_only(parts[1], digits) {
            return err(format!(
                "Invalid character(s) found in minor number {}",
                go_quote(parts[1])
            ));
        }
        if has_leading_zeroes(parts[1]) {
            return err(format!(
                "Minor number must not contain leading zeroes {}",
                go_quote(parts[1])
            ));
        }
        let minor = parse_uint(parts[1])?;

        let mut patch_str = parts[2];
        let mut build: Vec<&str> = Vec::new();
        let mut prerelease: Vec<&str> = Vec::new();
        if let Some(i) = patch_str.find('+') {
            build = patch_str[i + 1..].split('.').collect();
            patch_str = &patch_str[..i];
        }
        if let Some(i) = patch_str.find('-') {
            prerelease = patch_str[i + 1..].split('.').collect();
            patch_str = &patch_str[..i];
        }
        if !contains_only(patch_str, digits) {
            return err(format!(
                "Invalid character(s) found in patch number {}",
                go_quote(patch_str)
            ));
        }
        if has_leading_zeroes(patch_str) {
            return err(format!(
                "Patch number must not contain leading zeroes {}",
                go_quote(patch_str)
            ));
        }
        let patch = parse_uint(patch_str)?;

        let mut pre = Vec::with_capacity(prerelease.len());
        for p in prerelease {
            if p.is_empty() {
                return err("Prerelease is empty".into());
            }
            if contains_only(p, digits) {
                if has_leading_zeroes(p) {
                    return err(format!(
                        "Numeric PreRelease version must not contain leading zeroes {}",
                        go_quote(p)
                    ));
                }
                pre.push(PreRelease::Numeric(parse_uint(p)?));
            } else if contains_only(p, is_alphanum) {
                pre.push(PreRelease::Alpha(p.to_string()));
            } else {
                return err(format!(
                    "Invalid character(s) found in prerelease {}",
                    go_quote(p)
                ));
            }
        }
        let mut build_out = Vec::with_capacity(build.len());
        for b in build {
            if b.is_empty() {
                return err("Build meta data is empty".into());
            }
            if !contains_only(b, is_alphanum) {
                return err(format!(
                    "Invalid character(s) found in build meta data {}",
                    go_quote(b)
                ));
            }
            build_out.push(b.to_string());
        }
        Ok(Semver {
            major,
            minor,
            patch,
            pre,
            build: build_out,
        })
    }

    /// The library's `normalizeAndParse`: optional `v`, leading zeros, short forms.
    pub fn parse_normalized(s: &str) -> Result<Semver, SemverError> {
        let s = s.strip_prefix('v').unwrap_or(s);
        let mut parts: Vec<String> = s
            .splitn(3, '.')
            .map(|p| {
                if p.len() > 1 {
                    let trimmed = p.trim_start_matches('0');
                    if trimmed.is_empty() || !trimmed.as_bytes()[0].is_ascii_digit() {
                        format!("0{trimmed}")
                    } else {
                        trimmed.to_string()
                    }
                } else {
                    p.to_string()
                }
            })
            .collect();
        if parts.len() < 3 {
            if parts.last().is_some_and(|p| p.contains(['+', '-'])) {
                return Err(SemverError(
                    "short version cannot contain PreRelease/Build meta data".into(),
                ));
            }
            while parts.len() < 3 {
                parts.push("0".into());
            }
        }
        Self::parse(&parts.join("."))
    }

    /// Semver 2.0 precedence (blang `Compare`); build metadata is ignored.
    pub fn compare(&self, other: &Semver) -> Ordering {
        (self.major, self.minor, self.patch)
            .cmp(&(other.major, other.minor, other.patch))
            .then_with(|| match (self.pre.is_empty(), other.pre.is_empty()) {
                (true, true) => Ordering::Equal,
                (true, false) => Ordering::Greater,
                (false, true) => Ordering::Less,
                (false, false) => {
                    for (a, b) in self.pre.iter().zip(&other.pre) {
                        let c = match (a, b) {
                            (PreRelease::Numeric(x), PreRelease::Numeric(y)) => x.cmp(y),
                            (PreRelease::Numeric(_), PreRelease::Alpha(_)) => Ordering::Less,
                            (PreRelease::Alpha(_), PreRelease::Numeric(_)) => Ordering::Greater,
                            (PreRelease::Alpha(x), PreRelease::Alpha(y)) => x.cmp(y),
                        };
                        if c != Ordering::Equal {
                            return c;
                        }
                    }
                    self.pre.len().cmp(&other.pre.len())
                }
            })
    }
}

impl fmt::Display for Semver {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}.{}", self.major, self.minor, self.patch)?;
        for (i, p) in self.pre.iter().enumerate() {
            f.write_str(if i == 0 { "-" } else { "." })?;
            match p {
                PreRelease::Numeric(n) => write!(f, "{n}")?,
                PreRelease::Alpha(s) => f.write_str(s)?,
            }
        }
        for (i, b) in self.build.iter().enumerate() {
            f.write_str(if i == 0 { "+" } else { "." })?;
            f.write_str(b)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v(s: &str) -> Semver {
        Semver::parse(s).unwrap_or_else(|e| panic!("{s}: {e}"))
    }

    #[test]
    fn strict_parse_matches_blang() {
        assert_eq!(
            v("1.2.3-alpha.1+build.5").to_string(),
            "1.2.3-alpha.1+build.5"
        );
        assert_eq!(Semver::parse("").unwrap_err().0, "Version string empty");
        assert_eq!(
            Semver::parse("1.2").unwrap_err().0,
            "No Major.Minor.Patch elements found"
        );
        assert_eq!(
            Semver::parse("01.2.3").unwrap_err().0,
            "Major number must not contain leading zeroes \"01\""
        );
        assert_eq!(
            Semver::parse("v1.2.3").unwrap_err().0,
            "Invalid character(s) found in major number \"v1\""
        );
        assert_eq!(
            Semver::parse("1..3").unwrap_err().0,
            "strconv.ParseUint: parsing \"\": invalid syntax"
        );
        assert_eq!(
            Semver::parse("1.2.3-").unwrap_err().0,
            "Prerelease is empty"
        );
    }

    #[test]
    fn normalize_pads_and_strips() {
        assert_eq!(
            Semver::parse_normalized("v1.2").map(|s| s.to_string()),
            Ok("1.2.0".into())
        );
        assert_eq!(
            Semver::parse_normalized("01.002.0003").map(|s| s.to_string()),
            Ok("1.2.3".into())
        );
        assert_eq!(
            Semver::parse_normalized("1.2-rc").unwrap_err().0,
            "short version cannot contain PreRelease/Build meta data"
        );
    }

    #[test]
    fn precedence_ignores_build_metadata() {
        assert_eq!(v("1.0.0+a").compare(&v("1.0.0+b")), Ordering::Equal);
        assert_eq!(v("1.0.0-alpha").compare(&v("1.0.0")), Ordering::Less);
        assert_eq!(
            v("1.0.0-alpha.1").compare(&v("1.0.0-alpha.beta")),
            Ordering::Less
        );
        assert_eq!(v("1.0.0-2").compare(&v("1.0.0-10")), Ordering::Less);
        assert_eq!(
            v("1.0.0-alpha").compare(&v("1.0.0-alpha.1")),
            Ordering::Less
        );
    }
}
