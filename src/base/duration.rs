//! Go-style duration strings (`250ms`, `1h30m`, `60s`, `0`) as the reference documents them for
//! every duration flag and environment variable, so existing operator configs parse unchanged.

use std::time::Duration;

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum DurationError {
    #[error("duration is empty")]
    Empty,
    #[error("duration {0:?} has a number without a unit (use e.g. 500ms, 5s, 1m)")]
    MissingUnit(String),
    #[error("duration {0:?} has an unknown unit")]
    UnknownUnit(String),
    #[error("duration {0:?} is not a valid number")]
    BadNumber(String),
    #[error("duration {0:?} is negative")]
    Negative(String),
    #[error("duration {0:?} is too large")]
    Overflow(String),
}

/// Parses `[0-9.]+(ns|us|µs|ms|s|m|h)` repeated, or a bare `0`.
pub fn parse(text: &str) -> Result<Duration, DurationError> {
    let trimmed = text.trim();
    if trimmed.is_empty() {
        return Err(DurationError::Empty);
    }
    if trimmed.starts_with('-') {
        return Err(DurationError::Negative(text.to_owned()));
    }
    let body = trimmed.strip_prefix('+').unwrap_or(trimmed);
    if body == "0" {
        return Ok(Duration::ZERO);
    }
    let mut total_nanos: u128 = 0;
    let mut rest = body;
    while !rest.is_empty() {
        let number_len = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .ok_or_else(|| DurationError::MissingUnit(text.to_owned()))?;
        if number_len == 0 {
            return Err(DurationError::BadNumber(text.to_owned()));
        }
        let number: f64 = rest[..number_len]
            .parse()
            .map_err(|_| DurationError::BadNumber(text.to_owned()))?;
        rest = &rest[number_len..];
        let unit_len = rest
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(rest.len());
        let unit_nanos: f64 = match &rest[..unit_len] {
            "ns" => 1.0,
            "us" | "µs" | "μs" => 1e3,
            "ms" => 1e6,
            "s" => 1e9,
            "m" => 60e9,
            "h" => 3600e9,
            _ => return Err(DurationError::UnknownUnit(text.to_owned())),
        };
        rest = &rest[unit_len..];
        let nanos = number * unit_nanos;
        if !nanos.is_finite() || nanos > u64::MAX as f64 {
            return Err(DurationError::Overflow(text.to_owned()));
        }
        total_nanos += nanos as u128;
    }
    u64::try_from(total_nanos)
        .map(Duration::from_nanos)
        .map_err(|_| DurationError::Overflow(text.to_owned()))
}

/// Adapter for clap's `value_parser`.
pub fn parse_arg(text: &str) -> Result<Duration, String> {
    parse(text).map_err(|error| error.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_go_forms() {
        assert_eq!(parse("250ms"), Ok(Duration::from_millis(250)));
        assert_eq!(parse("60s"), Ok(Duration::from_secs(60)));
        assert_eq!(parse("1h30m"), Ok(Duration::from_secs(5400)));
        assert_eq!(parse("1.5s"), Ok(Duration::from_millis(1500)));
        assert_eq!(parse("0"), Ok(Duration::ZERO));
        assert_eq!(parse("10us"), Ok(Duration::from_micros(10)));
    }

    #[test]
    fn refuses_bad_forms() {
        assert_eq!(parse(""), Err(DurationError::Empty));
        assert!(matches!(parse("5"), Err(DurationError::MissingUnit(_))));
        assert!(matches!(parse("5d"), Err(DurationError::UnknownUnit(_))));
        assert!(matches!(parse("-5s"), Err(DurationError::Negative(_))));
        assert!(matches!(parse("s"), Err(DurationError::BadNumber(_))));
        assert!(matches!(parse("1..2s"), Err(DurationError::BadNumber(_))));
    }
}
