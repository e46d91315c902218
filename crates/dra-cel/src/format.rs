//! Kubernetes' `format` CEL library: named formats and their `validate()` messages, following
//! k8s.io/apimachinery validation and kube-openapi strfmt.

/// The named formats (`format.<name>()`), in a fixed order so a `u8` can name one.
pub const NAMES: &[&str] = &[
    "dns1123Label",
    "dns1123Subdomain",
    "dns1035Label",
    "qualifiedName",
    "dns1123LabelPrefix",
    "dns1123SubdomainPrefix",
    "dns1035LabelPrefix",
    "labelValue",
    "uri",
    "uuid",
    "byte",
    "date",
    "datetime",
];

/// The same names as CEL functions (`format.dns1123Label`), for the declarations.
pub const QUALIFIED: &[&str] = &[
    "format.dns1123Label",
    "format.dns1123Subdomain",
    "format.dns1035Label",
    "format.qualifiedName",
    "format.dns1123LabelPrefix",
    "format.dns1123SubdomainPrefix",
    "format.dns1035LabelPrefix",
    "format.labelValue",
    "format.uri",
    "format.uuid",
    "format.byte",
    "format.date",
    "format.datetime",
];

/// `MaxRegexSize` of each format, which prices `validate()`.
pub fn max_regex_size(format: u8) -> u64 {
    // len(strfmt.UUIDPattern) and len(strfmt.DateTimePattern).
    const UUID: u64 = 70;
    const DATETIME: u64 = 71;
    [
        30, 60, 30, 60, 30, 60, 30, 40, 1103, UUID, 84, DATETIME, DATETIME,
    ]
    .get(format as usize)
    .copied()
    .unwrap_or(1)
}

pub fn index_of(name: &str) -> Option<u8> {
    NAMES.iter().position(|n| *n == name).map(|i| i as u8)
}

const DNS1123_LABEL_FMT: &str = "[a-z0-9]([-a-z0-9]*[a-z0-9])?";
const DNS1123_LABEL_MSG: &str = "a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', and must start and end with an alphanumeric character";
const DNS1123_SUBDOMAIN_MSG: &str = "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character";
const DNS1035_LABEL_FMT: &str = "[a-z]([-a-z0-9]*[a-z0-9])?";
const DNS1035_LABEL_MSG: &str = "a DNS-1035 label must consist of lower case alphanumeric characters or '-', start with an alphabetic character, and end with an alphanumeric character";
const LABEL_KEY_FMT: &str = "([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]";
const LABEL_KEY_MSG: &str = "must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character";
const LABEL_VALUE_MSG: &str = "a valid label must be an empty string or consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character";

fn regex_error(msg: &str, fmt: &str, examples: &[&str]) -> String {
    let shown: Vec<String> = examples.iter().map(|e| format!("'{e}', ")).collect();
    format!(
        "{msg} (e.g. {}regex used for validation is '{fmt}')",
        shown.join("or ")
    )
}

fn subdomain_fmt() -> String {
    format!("{DNS1123_LABEL_FMT}(\\.{DNS1123_LABEL_FMT})*")
}

/// `[a-z0-9]([-a-z0-9]*[a-z0-9])?`, optionally with a different first-character class.
fn is_label(s: &str, first_alpha: bool) -> bool {
    let b = s.as_bytes();
    let Some((&first, _)) = b.split_first() else {
        return false;
    };
    let alnum = |c: u8| c.is_ascii_lowercase() || c.is_ascii_digit();
    let first_ok = if first_alpha {
        first.is_ascii_lowercase()
    } else {
        alnum(first)
    };
    first_ok && alnum(b[b.len() - 1]) && b.iter().all(|&c| alnum(c) || c == b'-')
}

fn is_subdomain(s: &str) -> bool {
    s.split('.').all(|l| is_label(l, false))
}

fn is_label_key_name(s: &str) -> bool {
    let b = s.as_bytes();
    let Some((&first, _)) = b.split_first() else {
        return false;
    };
    let ext = |c: u8| c.is_ascii_alphanumeric() || matches!(c, b'-' | b'_' | b'.');
    first.is_ascii_alphanumeric()
        && b[b.len() - 1].is_ascii_alphanumeric()
        && b.iter().all(|&c| ext(c))
}

/// The API server's checks of object names, label keys and label values (util/validation's
/// `IsDNS1123Label`, `IsDNS1123Subdomain`, `IsQualifiedName`, `IsValidLabelValue`): each returns
/// its error messages, none for a good value.
pub mod names {
    pub fn dns1123_label(s: &str) -> Vec<String> {
        super::dns1123_label(s)
    }
    pub fn dns1123_subdomain(s: &str) -> Vec<String> {
        super::dns1123_subdomain(s, false)
    }
    pub fn qualified_name(s: &str) -> Vec<String> {
        super::qualified_name(s)
    }
    pub fn label_value(s: &str) -> Vec<String> {
        super::label_value(s)
    }
}

/// util/validation `IsDNS1123Label` (its length message says "characters").
fn dns1123_label(s: &str) -> Vec<String> {
    let mut errs = Vec::new();
    if s.len() > 63 {
        errs.push("must be no more than 63 characters".to_string());
    }
    if !is_label(s, false) {
        if is_subdomain(s) {
            errs.push("must not contain dots".to_string());
        } else {
            errs.push(regex_error(
                DNS1123_LABEL_MSG,
                DNS1123_LABEL_FMT,
                &["my-name", "123-abc"],
            ));
        }
    }
    errs
}

/// Subdomain check; `bytes` selects api/validate/content's wording of the length error.
fn dns1123_subdomain(s: &str, bytes: bool) -> Vec<String> {
    let mut errs = Vec::new();
    if s.len() > 253 {
        let unit = if bytes { "bytes" } else { "characters" };
        errs.push(format!("must be no more than 253 {unit}"));
    }
    if !is_subdomain(s) {
        errs.push(regex_error(
            DNS1123_SUBDOMAIN_MSG,
            &subdomain_fmt(),
            &["example.com"],
        ));
    }
    errs
}

fn dns1035_label(s: &str) -> Vec<String> {
    let mut errs = Vec::new();
    if s.len() > 63 {
        errs.push("must be no more than 63 characters".to_string());
    }
    if !is_label(s, true) {
        errs.push(regex_error(
            DNS1035_LABEL_MSG,
            DNS1035_LABEL_FMT,
            &["my-name", "abc-123"],
        ));
    }
    errs
}

/// content `IsLabelKey` (= qualified name).
fn qualified_name(s: &str) -> Vec<String> {
    let mut errs = Vec::new();
    let parts: Vec<&str> = s.split('/').collect();
    let name = match parts.as_slice() {
        [name] => *name,
        [prefix, name] => {
            if prefix.is_empty() {
                errs.push("prefix part must be non-empty".to_string());
            } else {
                errs.extend(
                    dns1123_subdomain(prefix, true)
                        .into_iter()
                        .map(|m| format!("prefix part {m}")),
                );
            }
            *name
        }
        _ => {
            errs.push(format!(
                "a valid label key {} with an optional DNS subdomain prefix and '/' (e.g. 'example.com/MyName')",
                regex_error(LABEL_KEY_MSG, LABEL_KEY_FMT, &["MyName", "my.name", "123-abc"])
            ));
            return errs;
        }
    };
    if name.is_empty() {
        errs.push("name part must be non-empty".to_string());
    } else if name.len() > 63 {
        errs.push("name part must be no more than 63 bytes".to_string());
    }
    if !is_label_key_name(name) {
        errs.push(format!(
            "name part {}",
            regex_error(
                LABEL_KEY_MSG,
                LABEL_KEY_FMT,
                &["MyName", "my.name", "123-abc"]
            )
        ));
    }
    errs
}

fn label_value(s: &str) -> Vec<String> {
    let mut errs = Vec::new();
    if s.len() > 63 {
        errs.push("must be no more than 63 bytes".to_string());
    }
    if !s.is_empty() && !is_label_key_name(s) {
        errs.push(regex_error(
            LABEL_VALUE_MSG,
            &format!("({LABEL_KEY_FMT})?"),
            &["MyValue", "my_value", "12345"],
        ));
    }
    errs
}

/// api/validation `maskTrailingDash`: a generated-name prefix may end in '-'.
fn mask_trailing_dash(s: &str) -> String {
    if s.len() > 1 && s.ends_with('-') {
        // Go slices bytes; a multi-byte character before the dash cannot pass anyway.
        let cut = s.len() - 2;
        let head = s.get(..cut).unwrap_or("\u{fffd}");
        format!("{head}a")
    } else {
        s.to_string()
    }
}

fn is_uuid(s: &str) -> bool {
    let hex: String = s.chars().filter(|c| *c != '-').collect();
    // Dashes are optional but only at the four group boundaries.
    let groups = [8usize, 4, 4, 4, 12];
    let b = s.as_bytes();
    let mut i = 0;
    for (n, g) in groups.iter().enumerate() {
        for _ in 0..*g {
            if i >= b.len() || !b[i].is_ascii_hexdigit() {
                return false;
            }
            i += 1;
        }
        if n < 4 && i < b.len() && b[i] == b'-' {
            i += 1;
        }
    }
    i == b.len() && hex.len() == 32
}

fn is_base64(s: &str) -> bool {
    let b = s.as_bytes();
    if b.is_empty() || !b.len().is_multiple_of(4) {
        return false;
    }
    let ok = |c: u8| c.is_ascii_alphanumeric() || c == b'+' || c == b'/';
    let body = &b[..b.len() - 4];
    let last = &b[b.len() - 4..];
    body.iter().all(|&c| ok(c))
        && match last {
            [a, b2, b'=', b'='] => ok(*a) && ok(*b2),
            [a, b2, c, b'='] => ok(*a) && ok(*b2) && ok(*c),
            [a, b2, c, d] => ok(*a) && ok(*b2) && ok(*c) && ok(*d),
            _ => false,
        }
}

/// Go `time.Parse("2006-01-02", s)` succeeds.
fn is_date(s: &str) -> bool {
    let b = s.as_bytes();
    if b.len() != 10 || b[4] != b'-' || b[7] != b'-' {
        return false;
    }
    let num = |r: std::ops::Range<usize>| -> Option<u32> {
        let part = s.get(r)?;
        part.bytes()
            .all(|c| c.is_ascii_digit())
            .then(|| part.parse().ok())
            .flatten()
    };
    let (Some(y), Some(m), Some(d)) = (num(0..4), num(5..7), num(8..10)) else {
        return false;
    };
    let leap = (y % 4 == 0 && y % 100 != 0) || y % 400 == 0;
    let days = match m {
        1 | 3 | 5 | 7 | 8 | 10 | 12 => 31,
        4 | 6 | 9 | 11 => 30,
        2 if leap => 29,
        2 => 28,
        _ => return false,
    };
    (1..=days).contains(&d)
}

/// strfmt `IsDateTime`.
fn is_datetime(s: &str) -> bool {
    if s.len() < 4 {
        return false;
    }
    let lower = s.to_lowercase();
    let parts: Vec<&str> = lower.split('t').collect();
    if parts.len() < 2 || !is_date(parts[0]) {
        return false;
    }
    // `^([0-9]{2}):([0-9]{2}):([0-9]{2})(.[0-9]+)?(z|([+-][0-9]{2}:[0-9]{2}))$`
    let t = parts[1];
    let b = t.as_bytes();
    let two = |i: usize| b.len() >= i + 2 && b[i].is_ascii_digit() && b[i + 1].is_ascii_digit();
    if !(two(0) && b.get(2) == Some(&b':') && two(3) && b.get(5) == Some(&b':') && two(6)) {
        return false;
    }
    let mut i = 8;
    // `.` in the pattern is any character, then one or more digits.
    if i < b.len() && b[i] != b'z' && b[i] != b'+' && b[i] != b'-' {
        let start = i + 1;
        let mut j = start;
        while j < b.len() && b[j].is_ascii_digit() {
            j += 1;
        }
        if j == start {
            return false;
        }
        i = j;
    }
    let zone = &t[i.min(t.len())..];
    let zone_ok = zone == "z"
        || (zone.len() == 6
            && matches!(zone.as_bytes()[0], b'+' | b'-')
            && zone.as_bytes()[1..3].iter().all(u8::is_ascii_digit)
            && zone.as_bytes()[3] == b':'
            && zone.as_bytes()[4..6].iter().all(u8::is_ascii_digit));
    zone_ok && &t[0..2] <= "23" && &t[3..5] <= "59" && &t[6..8] <= "59"
}

/// Go `url.ParseRequestURI`, the checks that decide success plus their error texts.
fn parse_request_uri(s: &str) -> Result<(), String> {
    let wrap = |e: &str| format!("parse {}: {e}", super::net::go_quote(s));
    if s.bytes().any(|c| c < 0x20 || c == 0x7f) {
        return Err(wrap("net/url: invalid control character in URL"));
    }
    if s.is_empty() {
        return Err(wrap("empty url"));
    }
    if s == "*" {
        return Ok(());
    }
    let mut rest = s;
    let mut has_scheme = false;
    for (i, c) in s.bytes().enumerate() {
        if c.is_ascii_alphabetic() {
            continue;
        }
        if c.is_ascii_digit() || matches!(c, b'+' | b'-' | b'.') {
            if i == 0 {
                break;
            }
            continue;
        }
        if c == b':' {
            if i == 0 {
                return Err(wrap("missing protocol scheme"));
            }
            has_scheme = true;
            rest = &s[i + 1..];
        }
        break;
    }
    // The query is not validated by ParseRequestURI; only the part before `?` matters.
    let rest = rest.split_once('?').map(|(a, _)| a).unwrap_or(rest);
    if !rest.starts_with('/') {
        if has_scheme {
            return Ok(());
        }
        return Err(wrap("invalid URI for request"));
    }
    let path = if has_scheme && rest.starts_with("//") {
        let after = &rest[2..];
        let (authority, path) = match after.find('/') {
            Some(i) => (&after[..i], &after[i..]),
            None => (after, ""),
        };
        let host = authority
            .rsplit_once('@')
            .map(|(_, h)| h)
            .unwrap_or(authority);
        if let Some((_, port)) = host.rsplit_once(':')
            && !host.starts_with('[')
            && !port.bytes().all(|c| c.is_ascii_digit())
        {
            return Err(wrap(&format!(
                "invalid port {} after host",
                super::net::go_quote(&format!(":{port}"))
            )));
        }
        path
    } else {
        rest
    };
    let b = path.as_bytes();
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' {
            let ok =
                b.len() > i + 2 && b[i + 1].is_ascii_hexdigit() && b[i + 2].is_ascii_hexdigit();
            if !ok {
                let esc: String = path[i..].chars().take(3).collect();
                return Err(wrap(&format!(
                    "invalid URL escape {}",
                    super::net::go_quote(&esc)
                )));
            }
            i += 3;
        } else {
            i += 1;
        }
    }
    Ok(())
}

/// `<Format>.validate(s)`: the error list, empty when valid.
pub fn validate(format: u8, s: &str) -> Vec<String> {
    match NAMES.get(format as usize).copied().unwrap_or("") {
        "dns1123Label" => dns1123_label(s),
        "dns1123Subdomain" => dns1123_subdomain(s, false),
        "dns1035Label" => dns1035_label(s),
        "qualifiedName" => qualified_name(s),
        "dns1123LabelPrefix" => dns1123_label(&mask_trailing_dash(s)),
        "dns1123SubdomainPrefix" => dns1123_subdomain(&mask_trailing_dash(s), false),
        "dns1035LabelPrefix" => dns1035_label(&mask_trailing_dash(s)),
        "labelValue" => label_value(s),
        "uri" => parse_request_uri(s).err().into_iter().collect(),
        "uuid" if !is_uuid(s) => vec!["does not match the UUID format".into()],
        "byte" if !is_base64(s) => vec!["invalid base64".into()],
        "date" if !is_date(s) => vec!["invalid date".into()],
        "datetime" if !is_datetime(s) => vec!["invalid datetime".into()],
        _ => Vec::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn upstream_examples() {
        let f = |n: &str| index_of(n).unwrap();
        assert!(validate(f("dns1123Label"), "my-label-name").is_empty());
        assert_eq!(validate(f("dns1123Label"), "contains a space").len(), 1);
        assert!(validate(f("dns1123SubdomainPrefix"), "mysubdomain.prefix.-").is_empty());
        assert!(validate(f("qualifiedName"), "apiextensions.k8s.io/v1beta1").is_empty());
        assert!(validate(f("byte"), "aGVsbG8=").is_empty());
        assert!(!validate(f("byte"), "aGVsbG8").is_empty());
        assert!(validate(f("date"), "2020-01-01").is_empty());
        assert!(!validate(f("date"), "2020-01-32").is_empty());
        assert!(validate(f("datetime"), "2021-01-01T00:00:00Z").is_empty());
        assert!(validate(f("uuid"), "123e4567-e89b-12d3-a456-426614174000").is_empty());
        assert!(validate(f("uri"), "http://example.com").is_empty());
    }
}
