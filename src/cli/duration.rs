//! Durations as Kubernetes components take them: Go's `time.ParseDuration` syntax (`90s`,
//! `1m30s`, `1.5h`, `250ms`), plus a bare number of seconds so the older `--*-seconds` flags keep
//! working.

use std::time::Duration;

/// Parses `300ms`, `1m30s`, `2h`, `1.5s` or a bare `60` (seconds).
pub fn parse(text: &str) -> Result<Duration, String> {
    let text = text.trim();
    if text.is_empty() {
        return Err("empty duration".into());
    }
    if let Ok(seconds) = text.parse::<u64>() {
        return Ok(Duration::from_secs(seconds));
    }
    if text == "0" {
        return Ok(Duration::ZERO);
    }
    if text.starts_with('-') {
        return Err(format!("{text:?}: a duration cannot be negative"));
    }
    let mut rest = text.strip_prefix('+').unwrap_or(text);
    let mut total = 0f64;
    while !rest.is_empty() {
        let number_len = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .ok_or_else(|| format!("{text:?}: missing unit (ns, us, ms, s, m, h)"))?;
        let (number, tail) = rest.split_at(number_len);
        let value: f64 = number
            .parse()
            .map_err(|_| format!("{text:?}: {number:?} is not a number"))?;
        let unit_len = tail
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(tail.len());
        let (unit, tail) = tail.split_at(unit_len);
        let seconds_per_unit = match unit {
            "ns" => 1e-9,
            "us" | "µs" | "μs" => 1e-6,
            "ms" => 1e-3,
            "s" => 1.0,
            "m" => 60.0,
            "h" => 3600.0,
            _ => {
                return Err(format!(
                    "{text:?}: unknown unit {unit:?} (ns, us, ms, s, m, h)"
                ));
            }
        };
        total += value * seconds_per_unit;
        rest = tail;
    }
    Duration::try_from_secs_f64(total).map_err(|e| format!("{text:?}: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn go_durations_and_bare_seconds() {
        for (text, millis) in [
            ("60", 60_000),
            ("0", 0),
            ("90s", 90_000),
            ("1m30s", 90_000),
            ("1.5h", 5_400_000),
            ("250ms", 250),
            ("2h45m", 9_900_000),
            ("1500us", 1),
        ] {
            assert_eq!(parse(text).map(|d| d.as_millis()), Ok(millis), "{text}");
        }
        for bad in ["", "-5s", "5x", "s", "1m30", "abc"] {
            assert!(parse(bad).is_err(), "{bad:?} should be refused");
        }
    }
}
