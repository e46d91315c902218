//! `google.protobuf.Duration` and `google.protobuf.Timestamp` as cel-go's standard library has
//! them: Go's `time.ParseDuration` and RFC 3339 `time.Parse`, the range checks of
//! `common/types` (years 0001..9999), its overflow-checked arithmetic and its accessors.
//!
//! Time zones come from chrono-tz's copy of the tz database; Go reads the host's zoneinfo
//! files (Debian's tzdata in Kubernetes' images). They agree for canonical zones (checked
//! against the oracle from year 1 to 9999) but not for the history of names that upstream has
//! since turned into links and Debian still builds from their old definitions: before 1970
//! for zones such as `Europe/Amsterdam`, and in the 1970s too for `WET`, `CET`, `MET`, `EET`
//! and the `EST5EDT`-style names.
use std::fmt::Write as _;

use chrono::{DateTime, Datelike, NaiveDateTime, Offset, TimeZone, Timelike};

use super::semver::go_quote;

const NANOS_PER_SECOND: i64 = 1_000_000_000;
/// cel-go's `minUnixTime` and `maxUnixTime`: 0001-01-01T00:00:00Z and 9999-12-31T23:59:59Z.
const MIN_UNIX_SECONDS: i64 = -62_135_596_800;
const MAX_UNIX_SECONDS: i64 = 253_402_300_799;

pub const INTEGER_OVERFLOW: &str = "integer overflow";
pub const TIMESTAMP_OVERFLOW: &str = "timestamp overflow";

/// A timestamp: an instant (seconds and nanoseconds since the Unix epoch) and the UTC offset it
/// was written with. Go keeps a time's location; `string()` shows it, and map keys compare it.
#[derive(Debug, Clone, Copy)]
pub struct Timestamp {
    pub seconds: i64,
    /// Always in `0..1_000_000_000`.
    pub nanos: u32,
    /// Seconds east of UTC.
    pub offset: i32,
    pub location: Location,
}

/// The identity of a Go `time.Time`'s location, which Go map keys (CEL map keys) compare.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Location {
    /// UTC (`Z`, `timestamp(int)`).
    Utc,
    /// `time.Local` (UTC in Kubernetes' images): what Go's parser picks for a `+00:00` offset.
    Local,
    /// A fixed offset of whole hours from -12 to +14, which Go shares between parses.
    SharedFixed,
    /// Any other fixed offset: a new location for every parse.
    Fixed(u64),
}

impl Location {
    /// The location Go's RFC 3339 parser gives a time written with `offset`.
    fn parsed(offset: i64, zulu: bool) -> Location {
        static NEXT_FIXED: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        if zulu {
            Location::Utc
        } else if offset == 0 {
            Location::Local
        } else if offset % 3600 == 0 && (-12 * 3600..=14 * 3600).contains(&offset) {
            Location::SharedFixed
        } else {
            Location::Fixed(NEXT_FIXED.fetch_add(1, std::sync::atomic::Ordering::Relaxed))
        }
    }
}

impl Timestamp {
    fn instant(&self) -> (i64, u32) {
        (self.seconds, self.nanos)
    }

    pub fn same_instant(&self, other: &Timestamp) -> bool {
        self.instant() == other.instant()
    }

    pub fn cmp_instant(&self, other: &Timestamp) -> std::cmp::Ordering {
        self.instant().cmp(&other.instant())
    }

    /// Whether Go map keys holding these times are the same key (the instant and the location).
    pub fn same_key(&self, other: &Timestamp) -> bool {
        self.same_instant(other) && self.offset == other.offset && self.location == other.location
    }

    /// Go's `Time.IsZero`: January 1, year 1, 00:00:00 UTC.
    pub fn is_zero(&self) -> bool {
        self.seconds == MIN_UNIX_SECONDS && self.nanos == 0
    }

    /// `timestamp(int)`: Unix seconds, in UTC.
    pub fn from_unix(seconds: i64) -> Result<Timestamp, &'static str> {
        if !(MIN_UNIX_SECONDS..=MAX_UNIX_SECONDS).contains(&seconds) {
            return Err(TIMESTAMP_OVERFLOW);
        }
        Ok(Timestamp {
            seconds,
            nanos: 0,
            offset: 0,
            location: Location::Utc,
        })
    }

    /// `timestamp(string)`: `Ok(None)` when the text is not RFC 3339 as Go parses it.
    pub fn parse(text: &str) -> Result<Option<Timestamp>, &'static str> {
        let Some(parsed) = parse_rfc3339(text.as_bytes()) else {
            return Ok(None);
        };
        if !(MIN_UNIX_SECONDS..=MAX_UNIX_SECONDS).contains(&parsed.seconds) {
            return Err(TIMESTAMP_OVERFLOW);
        }
        Ok(Some(parsed))
    }

    /// Go's `Format(time.RFC3339Nano)` in the timestamp's own offset.
    pub fn to_rfc3339(self) -> String {
        let local = civil(self.seconds + i64::from(self.offset), self.nanos);
        let mut out = String::with_capacity(32);
        let _ = write!(
            out,
            "{:04}-{:02}-{:02}T{:02}:{:02}:{:02}",
            local.year(),
            local.month(),
            local.day(),
            local.hour(),
            local.minute(),
            local.second()
        );
        if self.nanos != 0 {
            let digits = format!("{:09}", self.nanos);
            out.push('.');
            out.push_str(digits.trim_end_matches('0'));
        }
        if self.offset == 0 {
            out.push('Z');
        } else {
            let minutes = self.offset / 60;
            let sign = if minutes < 0 { '-' } else { '+' };
            let minutes = minutes.abs();
            let _ = write!(out, "{sign}{:02}:{:02}", minutes / 60, minutes % 60);
        }
        out
    }

    /// cel-go's `addTimeDurationChecked`: the result keeps this timestamp's offset.
    pub fn add_duration(&self, nanos: i64) -> Result<Timestamp, &'static str> {
        let seconds = self
            .seconds
            .checked_add(nanos / NANOS_PER_SECOND)
            .ok_or(INTEGER_OVERFLOW)?;
        let mut seconds = seconds;
        let mut sub = i64::from(self.nanos) + nanos % NANOS_PER_SECOND;
        if !(0..NANOS_PER_SECOND).contains(&sub) {
            seconds = seconds
                .checked_add(sub / NANOS_PER_SECOND)
                .ok_or(INTEGER_OVERFLOW)?;
            sub -= (sub / NANOS_PER_SECOND) * NANOS_PER_SECOND;
            if sub < 0 {
                seconds = seconds.checked_add(-1).ok_or(INTEGER_OVERFLOW)?;
                sub += NANOS_PER_SECOND;
            }
        }
        if !(MIN_UNIX_SECONDS..=MAX_UNIX_SECONDS).contains(&seconds) {
            return Err(TIMESTAMP_OVERFLOW);
        }
        Ok(Timestamp {
            seconds,
            nanos: sub as u32,
            offset: self.offset,
            location: self.location,
        })
    }

    /// cel-go's `subtractTimeDurationChecked` (negates, then adds).
    pub fn sub_duration(&self, nanos: i64) -> Result<Timestamp, &'static str> {
        self.add_duration(nanos.checked_neg().ok_or(INTEGER_OVERFLOW)?)
    }

    /// cel-go's `subtractTimeChecked`: the duration between two instants, in nanoseconds.
    pub fn since(&self, earlier: &Timestamp) -> Result<i64, &'static str> {
        let seconds = self
            .seconds
            .checked_sub(earlier.seconds)
            .ok_or(INTEGER_OVERFLOW)?;
        let nanos = i64::from(self.nanos) - i64::from(earlier.nanos);
        seconds
            .checked_mul(NANOS_PER_SECOND)
            .and_then(|s| s.checked_add(nanos))
            .ok_or(INTEGER_OVERFLOW)
    }

    /// The calendar fields of an accessor (`getHours()` ...), in UTC or in `zone` (an IANA
    /// name or a `[+-]HH:MM` offset, as cel-go's `inTimeZone` reads it).
    pub fn fields_in(&self, zone: Option<&str>) -> Result<NaiveDateTime, String> {
        let offset = match zone {
            None => 0,
            Some(zone) => zone_offset(zone, self.seconds)?,
        };
        Ok(civil(self.seconds.wrapping_add(offset), self.nanos))
    }
}

/// Which calendar field an accessor reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum TimeField {
    FullYear,
    Month,
    DayOfYear,
    DayOfMonth,
    Date,
    DayOfWeek,
    Hours,
    Minutes,
    Seconds,
    Milliseconds,
}

impl TimeField {
    pub fn name(self) -> &'static str {
        match self {
            TimeField::FullYear => "getFullYear",
            TimeField::Month => "getMonth",
            TimeField::DayOfYear => "getDayOfYear",
            TimeField::DayOfMonth => "getDayOfMonth",
            TimeField::Date => "getDate",
            TimeField::DayOfWeek => "getDayOfWeek",
            TimeField::Hours => "getHours",
            TimeField::Minutes => "getMinutes",
            TimeField::Seconds => "getSeconds",
            TimeField::Milliseconds => "getMilliseconds",
        }
    }

    /// Whether durations have this accessor too.
    pub fn on_durations(self) -> bool {
        matches!(
            self,
            TimeField::Hours | TimeField::Minutes | TimeField::Seconds | TimeField::Milliseconds
        )
    }

    /// The field of a timestamp's calendar view (months, days of year and month 0-based, as CEL
    /// defines them; `getDate` 1-based).
    pub fn of_timestamp(self, t: &NaiveDateTime) -> i64 {
        let v = match self {
            TimeField::FullYear => t.year(),
            TimeField::Month => t.month0() as i32,
            TimeField::DayOfYear => t.ordinal0() as i32,
            TimeField::DayOfMonth => t.day0() as i32,
            TimeField::Date => t.day() as i32,
            TimeField::DayOfWeek => t.weekday().num_days_from_sunday() as i32,
            TimeField::Hours => t.hour() as i32,
            TimeField::Minutes => t.minute() as i32,
            TimeField::Seconds => t.second() as i32,
            TimeField::Milliseconds => (t.nanosecond() / 1_000_000) as i32,
        };
        i64::from(v)
    }

    /// Go's `Duration.Hours()` etc. truncated to int (through float64, as cel-go does).
    pub fn of_duration(self, nanos: i64) -> i64 {
        let whole_and_fraction =
            |unit: i64| (nanos / unit) as f64 + (nanos % unit) as f64 / unit as f64;
        match self {
            TimeField::Hours => whole_and_fraction(3_600 * NANOS_PER_SECOND) as i64,
            TimeField::Minutes => whole_and_fraction(60 * NANOS_PER_SECOND) as i64,
            TimeField::Seconds => whole_and_fraction(NANOS_PER_SECOND) as i64,
            _ => nanos / 1_000_000,
        }
    }
}

/// The civil date and time of Unix seconds (chrono covers far more than any reachable value;
/// the epoch stands in for the impossible rest).
fn civil(seconds: i64, nanos: u32) -> NaiveDateTime {
    DateTime::from_timestamp(seconds, nanos)
        .unwrap_or_default()
        .naive_utc()
}

/// cel-go's `inTimeZone`: seconds east of UTC at the instant `at`.
fn zone_offset(zone: &str, at: i64) -> Result<i64, String> {
    let Some(colon) = zone.find(':') else {
        return iana_offset(zone, at);
    };
    let hours = go_atoi(&zone[..colon])?;
    let minutes = go_atoi(&zone[colon + 1..])?;
    // As Go: the sign of the text, not of the parsed hours, decides how minutes apply, and
    // int arithmetic wraps.
    let offset_minutes = if zone.starts_with('-') {
        hours.wrapping_mul(60).wrapping_sub(minutes)
    } else {
        hours.wrapping_mul(60).wrapping_add(minutes)
    };
    // `int((time.Duration(offset) * time.Minute).Seconds())`.
    let nanos = offset_minutes.wrapping_mul(60 * NANOS_PER_SECOND);
    Ok(TimeField::Seconds.of_duration(nanos))
}

/// Go's `time.LoadLocation` (with the tz database of chrono-tz) and the offset at `at`.
fn iana_offset(name: &str, at: i64) -> Result<i64, String> {
    // "Local" is the scheduler's own zone, UTC in Kubernetes' images.
    if name.is_empty() || name == "UTC" || name == "Local" {
        return Ok(0);
    }
    if name.contains("..") || name.starts_with('/') || name.starts_with('\\') {
        return Err("time: invalid location name".into());
    }
    // Zones whose files Debian's tzdata (the scheduler image's, and Go's source) still ships
    // with their own definitions, where chrono-tz follows upstream's links or has no entry.
    let name = match name {
        "EST" => return Ok(-5 * 3600),
        "MST" => return Ok(-7 * 3600),
        "HST" => return Ok(-10 * 3600),
        "Factory" | "localtime" => return Ok(0),
        "posixrules" => "America/New_York",
        other => other,
    };
    let zone: chrono_tz::Tz = name.parse().map_err(|_| missing_zone_error(name))?;
    let utc = DateTime::from_timestamp(at, 0)
        .unwrap_or_default()
        .naive_utc();
    Ok(i64::from(
        zone.offset_from_utc_datetime(&utc).fix().local_minus_utc(),
    ))
}

/// Go's error for a zone name that is no file of the zone database: reading a region's
/// directory (`America`), a file as a directory (`UTC/`), or nothing there.
fn missing_zone_error(name: &str) -> String {
    let exists = |zone: &str| chrono_tz::TZ_VARIANTS.iter().any(|z| z.name() == zone);
    let directory = if name.ends_with('/') {
        name.to_string()
    } else {
        format!("{name}/")
    };
    if chrono_tz::TZ_VARIANTS
        .iter()
        .any(|z| z.name().starts_with(&directory))
    {
        return "is a directory".into();
    }
    if name.strip_suffix('/').is_some_and(exists) {
        return "not a directory".into();
    }
    format!("unknown time zone {name}")
}

/// Go's `strconv.Atoi`, with its error texts.
fn go_atoi(text: &str) -> Result<i64, String> {
    // Rust accepts a leading '+' as Go does; both reject anything but ASCII digits after it.
    text.parse::<i64>().map_err(|e| {
        let reason = match e.kind() {
            std::num::IntErrorKind::PosOverflow | std::num::IntErrorKind::NegOverflow => {
                "value out of range"
            }
            _ => "invalid syntax",
        };
        format!("strconv.Atoi: parsing {}: {reason}", go_quote(text))
    })
}

/// Go's `time.ParseDuration`: nanoseconds, or `None` when Go rejects the text.
pub fn parse_duration(text: &str) -> Option<i64> {
    const LIMIT: u64 = 1 << 63;
    let mut s = text.as_bytes();
    let mut negative = false;
    if let Some((&sign @ (b'-' | b'+'), rest)) = s.split_first() {
        negative = sign == b'-';
        s = rest;
    }
    if s == b"0" {
        return Some(0);
    }
    if s.is_empty() {
        return None;
    }
    let mut total: u64 = 0;
    while !s.is_empty() {
        if !(s[0] == b'.' || s[0].is_ascii_digit()) {
            return None;
        }
        // Integer part; overflow is an error.
        let mut whole: u64 = 0;
        let mut i = 0;
        while i < s.len() && s[i].is_ascii_digit() {
            if whole > LIMIT / 10 {
                return None;
            }
            whole = whole * 10 + u64::from(s[i] - b'0');
            if whole > LIMIT {
                return None;
            }
            i += 1;
        }
        let had_whole = i > 0;
        s = &s[i..];
        // Fraction; digits past u64 precision are ignored.
        let (mut fraction, mut scale, mut had_fraction) = (0u64, 1f64, false);
        if s.first() == Some(&b'.') {
            s = &s[1..];
            let mut overflow = false;
            let mut j = 0;
            while j < s.len() && s[j].is_ascii_digit() {
                if !overflow {
                    if fraction > (LIMIT - 1) / 10 {
                        overflow = true;
                    } else {
                        let next = fraction * 10 + u64::from(s[j] - b'0');
                        if next > LIMIT {
                            overflow = true;
                        } else {
                            fraction = next;
                            scale *= 10.0;
                        }
                    }
                }
                j += 1;
            }
            had_fraction = j > 0;
            s = &s[j..];
        }
        if !had_whole && !had_fraction {
            return None;
        }
        // The unit runs to the next digit or period.
        let unit_len = s
            .iter()
            .position(|&c| c == b'.' || c.is_ascii_digit())
            .unwrap_or(s.len());
        if unit_len == 0 {
            return None;
        }
        let unit: u64 = match &s[..unit_len] {
            b"ns" => 1,
            // "µs" (micro sign) and "μs" (Greek mu), in UTF-8.
            b"us" | [0xC2, 0xB5, b's'] | [0xCE, 0xBC, b's'] => 1_000,
            b"ms" => 1_000_000,
            b"s" => 1_000_000_000,
            b"m" => 60_000_000_000,
            b"h" => 3_600_000_000_000,
            _ => return None,
        };
        s = &s[unit_len..];
        if whole > LIMIT / unit {
            return None;
        }
        let mut value = whole * unit;
        if fraction > 0 {
            // Go computes the fraction in float64 (nanosecond-exact up to hours).
            value += (fraction as f64 * (unit as f64 / scale)) as u64;
            if value > LIMIT {
                return None;
            }
        }
        total += value;
        if total > LIMIT {
            return None;
        }
    }
    if negative {
        return Some((total as i64).wrapping_neg());
    }
    if total > LIMIT - 1 {
        return None;
    }
    Some(total as i64)
}

/// Go's `Duration.Seconds()` printed with `strconv.FormatFloat(_, 'f', -1, 64)` and an `s`,
/// as cel-go's `string(duration)`.
pub fn format_duration(nanos: i64) -> String {
    let seconds = (nanos / NANOS_PER_SECOND) as f64 + (nanos % NANOS_PER_SECOND) as f64 / 1e9;
    // Rust's shortest round-trip Display never uses an exponent, like Go's 'f' with -1.
    format!("{seconds}s")
}

/// Go's `time.Parse(time.RFC3339, text)` (its general parser, which accepts everything its
/// RFC 3339 fast path does and a little more: one-digit hours, `,` before fractions, zone
/// offsets up to 24:60).
fn parse_rfc3339(s: &[u8]) -> Option<Timestamp> {
    let digit = |s: &[u8], i: usize| s.get(i).is_some_and(u8::is_ascii_digit);
    // getnum: one or two digits (two when `fixed`).
    let getnum = |s: &[u8], fixed: bool| -> Option<(i64, usize)> {
        if !digit(s, 0) {
            return None;
        }
        if !digit(s, 1) {
            if fixed {
                return None;
            }
            return Some((i64::from(s[0] - b'0'), 1));
        }
        Some((i64::from(s[0] - b'0') * 10 + i64::from(s[1] - b'0'), 2))
    };
    let literal = |s: &[u8], c: u8| -> Option<usize> { (s.first() == Some(&c)).then_some(1) };

    let mut rest = s;
    if rest.len() < 4 || !rest[..4].iter().all(u8::is_ascii_digit) {
        return None;
    }
    let year: i64 = rest[..4]
        .iter()
        .fold(0, |acc, d| acc * 10 + i64::from(d - b'0'));
    rest = &rest[4..];
    rest = &rest[literal(rest, b'-')?..];
    let (month, n) = getnum(rest, true)?;
    rest = &rest[n..];
    if !(1..=12).contains(&month) {
        return None;
    }
    rest = &rest[literal(rest, b'-')?..];
    let (day, n) = getnum(rest, true)?;
    rest = &rest[n..];
    rest = &rest[literal(rest, b'T')?..];
    let (hour, n) = getnum(rest, false)?;
    rest = &rest[n..];
    if !(0..24).contains(&hour) {
        return None;
    }
    rest = &rest[literal(rest, b':')?..];
    let (minute, n) = getnum(rest, true)?;
    rest = &rest[n..];
    if !(0..60).contains(&minute) {
        return None;
    }
    rest = &rest[literal(rest, b':')?..];
    let (second, n) = getnum(rest, true)?;
    rest = &rest[n..];
    if !(0..60).contains(&second) {
        return None;
    }
    let mut nanos: i64 = 0;
    if rest.len() >= 2 && matches!(rest[0], b'.' | b',') && digit(rest, 1) {
        let mut end = 2;
        while digit(rest, end) {
            end += 1;
        }
        // Digits past the ninth are ignored.
        let used = &rest[1..end.min(10)];
        nanos = used.iter().fold(0, |acc, d| acc * 10 + i64::from(d - b'0'));
        for _ in used.len()..9 {
            nanos *= 10;
        }
        rest = &rest[end..];
    }
    let zulu = rest.first() == Some(&b'Z');
    let offset: i64 = if zulu {
        rest = &rest[1..];
        0
    } else {
        if rest.len() < 6 || rest[3] != b':' {
            return None;
        }
        let (hours, _) = getnum(&rest[1..3], true)?;
        let (minutes, _) = getnum(&rest[4..6], true)?;
        if hours > 24 || minutes > 60 {
            return None;
        }
        let magnitude = (hours * 60 + minutes) * 60;
        let offset = match rest[0] {
            b'+' => magnitude,
            b'-' => -magnitude,
            _ => return None,
        };
        rest = &rest[6..];
        offset
    };
    if !rest.is_empty() {
        return None;
    }
    let date = chrono::NaiveDate::from_ymd_opt(year as i32, month as u32, 1)?;
    if day < 1 || day > days_in_month(date) {
        return None;
    }
    let date = chrono::NaiveDate::from_ymd_opt(year as i32, month as u32, day as u32)?;
    let local_seconds = date
        .and_hms_opt(hour as u32, minute as u32, second as u32)?
        .and_utc()
        .timestamp();
    Some(Timestamp {
        seconds: local_seconds - offset,
        nanos: nanos as u32,
        offset: offset as i32,
        location: Location::parsed(offset, zulu),
    })
}

fn days_in_month(first: chrono::NaiveDate) -> i64 {
    let next = if first.month() == 12 {
        chrono::NaiveDate::from_ymd_opt(first.year() + 1, 1, 1)
    } else {
        chrono::NaiveDate::from_ymd_opt(first.year(), first.month() + 1, 1)
    };
    next.map(|n| (n - first).num_days()).unwrap_or(31)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_parse_as_go() {
        assert_eq!(parse_duration("1h2m3.5s"), Some(3_723_500_000_000));
        assert_eq!(parse_duration("-1.5h"), Some(-5_400_000_000_000));
        assert_eq!(parse_duration("2us"), Some(2_000));
        assert_eq!(parse_duration("2µs"), Some(2_000));
        assert_eq!(parse_duration("+0"), Some(0));
        assert_eq!(parse_duration(".5s"), Some(500_000_000));
        assert_eq!(parse_duration("1.s"), Some(1_000_000_000));
        assert_eq!(parse_duration("-9223372036854775808ns"), Some(i64::MIN));
        assert_eq!(parse_duration("9223372036854775808ns"), None);
        assert_eq!(parse_duration("9223372036854775807ns"), Some(i64::MAX));
        for bad in ["", "1", "s", ".s", "1d", "1 s", "-", "1h-1m", "1S"] {
            assert_eq!(parse_duration(bad), None, "{bad}");
        }
    }

    #[test]
    fn durations_print_as_go() {
        assert_eq!(format_duration(5_400_000_000_000), "5400s");
        assert_eq!(format_duration(1), "0.000000001s");
        assert_eq!(format_duration(-1_500_000_000), "-1.5s");
        assert_eq!(format_duration(0), "0s");
    }

    #[test]
    fn timestamps_parse_and_print_as_go() {
        let t = |s: &str| Timestamp::parse(s).map(|t| t.map(|t| t.to_rfc3339()));
        assert_eq!(
            t("2021-01-01T10:20:30Z"),
            Ok(Some("2021-01-01T10:20:30Z".into()))
        );
        assert_eq!(
            t("2021-01-01T10:20:30.120+01:00"),
            Ok(Some("2021-01-01T10:20:30.12+01:00".into()))
        );
        assert_eq!(
            t("2021-01-01T1:20:30,5Z"),
            Ok(Some("2021-01-01T01:20:30.5Z".into()))
        );
        assert_eq!(
            t("2021-01-01T10:20:30+24:60"),
            Ok(Some("2021-01-01T10:20:30+25:00".into()))
        );
        assert_eq!(t("2020-02-29T00:00:00Z").map(|x| x.is_some()), Ok(true));
        for bad in [
            "2021-02-29T00:00:00Z",
            "2021-01-01 10:20:30Z",
            "2021-01-01T10:20:30",
            "2021-01-01T10:20:30z",
            "2021-1-01T10:20:30Z",
            "2021-01-01T10:20:60Z",
            "2021-01-01T10:20:30+1:00",
        ] {
            assert_eq!(t(bad), Ok(None), "{bad}");
        }
        assert_eq!(t("0000-12-31T23:59:59Z"), Err(TIMESTAMP_OVERFLOW));
        assert_eq!(t("0001-01-01T00:00:00+00:01"), Err(TIMESTAMP_OVERFLOW));
        assert_eq!(
            t("0001-01-01T00:00:00-05:00"),
            Ok(Some("0001-01-01T00:00:00-05:00".into()))
        );
    }

    #[test]
    fn zones_as_go() {
        let ts = Timestamp::parse("2023-07-01T05:00:00Z").ok().flatten();
        let ts = ts.expect("valid");
        let hours = |z: &str| {
            ts.fields_in(Some(z))
                .map(|t| TimeField::Hours.of_timestamp(&t))
        };
        assert_eq!(hours("America/Los_Angeles"), Ok(22));
        assert_eq!(hours("+05:30"), Ok(10));
        assert_eq!(hours("-00:30"), Ok(4));
        assert_eq!(hours("-08:30"), Ok(20));
        assert_eq!(
            hours("Mars/Base"),
            Err("unknown time zone Mars/Base".into())
        );
        assert_eq!(
            hours("+x:00"),
            Err("strconv.Atoi: parsing \"+x\": invalid syntax".into())
        );
    }
}
