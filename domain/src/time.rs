//! Broker time: stamps in microseconds since the Unix epoch (UTC), and their text forms.

use serde::{Deserialize, Serialize};
use time::OffsetDateTime;
use time::format_description::well_known::Rfc3339;

/// A broker stamp: microseconds since the Unix epoch, UTC. Assigned by the state machine as
/// `max(previous + 1, proposed)`, so stamps of applied entries strictly rise.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default, Serialize, Deserialize,
)]
pub struct Stamp(pub u64);

impl Stamp {
    /// The stamp `seconds` later, saturating.
    #[must_use]
    pub fn plus_seconds(self, seconds: u64) -> Stamp {
        Stamp(self.0.saturating_add(seconds.saturating_mul(1_000_000)))
    }

    /// The stamp `seconds` earlier, saturating at zero.
    #[must_use]
    pub fn minus_seconds(self, seconds: u64) -> Stamp {
        Stamp(self.0.saturating_sub(seconds.saturating_mul(1_000_000)))
    }

    fn datetime(self) -> OffsetDateTime {
        let nanos = i128::from(self.0) * 1000;
        OffsetDateTime::from_unix_timestamp_nanos(nanos).unwrap_or(OffsetDateTime::UNIX_EPOCH)
    }

    /// `YYYY-MM-DDTHH:MM:SS.mmmZ`, the form messages and leases are shown in.
    #[must_use]
    pub fn iso_millis(self) -> String {
        let d = self.datetime();
        Self::iso(d, d.millisecond().into(), 3)
    }

    /// `YYYY-MM-DDTHH:MM:SS.ffffffZ`: fixed width, so clients may compare it as a string.
    #[must_use]
    pub fn iso_micros(self) -> String {
        let d = self.datetime();
        Self::iso(d, d.microsecond(), 6)
    }

    /// The ISO form with `digits` digits of `fraction`, written digit by digit (every pop
    /// answer has one per message; `format!` was a visible part of a pop's cost).
    fn iso(d: OffsetDateTime, fraction: u32, digits: u32) -> String {
        fn put(out: &mut String, v: u32, width: u32) {
            for i in (0..width).rev() {
                let digit = (v / 10u32.pow(i)) % 10;
                out.push(char::from(b'0' + digit as u8));
            }
        }
        let mut out = String::with_capacity(28);
        let year = d.year();
        if (0..=9999).contains(&year) {
            put(&mut out, year.unsigned_abs(), 4);
        } else {
            out.push_str(&format!("{year:04}"));
        }
        out.push('-');
        put(&mut out, u8::from(d.month()).into(), 2);
        out.push('-');
        put(&mut out, d.day().into(), 2);
        out.push('T');
        put(&mut out, d.hour().into(), 2);
        out.push(':');
        put(&mut out, d.minute().into(), 2);
        out.push(':');
        put(&mut out, d.second().into(), 2);
        out.push('.');
        put(&mut out, fraction, digits);
        out.push('Z');
        out
    }

    /// Parse an ISO-8601 time with `Z` or an offset; a time without offset is read as UTC.
    ///
    /// # Errors
    /// When the text is not such a time, or lies before the epoch.
    pub fn parse_iso(text: &str) -> Result<Stamp, TimeParseError> {
        let t = text.trim();
        let parsed = OffsetDateTime::parse(t, &Rfc3339)
            .or_else(|_| OffsetDateTime::parse(&format!("{t}Z"), &Rfc3339))
            .map_err(|_| TimeParseError::NotIso(t.to_owned()))?;
        let micros = parsed.unix_timestamp_nanos() / 1000;
        u64::try_from(micros)
            .map(Stamp)
            .map_err(|_| TimeParseError::BeforeEpoch(t.to_owned()))
    }
}

/// A time a client wrote that is not one the broker reads.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TimeParseError {
    /// Not ISO 8601 (RFC 3339, with or without an offset).
    #[error("'{0}' is not an ISO-8601 time")]
    NotIso(String),
    /// Before the epoch, which no stamp is.
    #[error("'{0}' lies before 1970")]
    BeforeEpoch(String),
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats_are_fixed_width_and_round_trip() {
        let s = Stamp(1_785_000_000_123_456);
        assert_eq!(s.iso_micros().len(), 27);
        assert_eq!(Stamp::parse_iso(&s.iso_micros()), Ok(s));
        assert!(s.iso_millis().ends_with(".123Z"));
        assert_eq!(Stamp(0).iso_micros(), "1970-01-01T00:00:00.000000Z");
    }

    /// The digit-by-digit forms are what `format!` wrote, over stamps from the epoch to past
    /// the year 9999.
    #[test]
    fn formats_match_the_formatted_forms() {
        let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
        for i in 0..20_000u64 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let s = Stamp(if i < 4 {
                [0, 1, 999_999, 253_402_300_799_999_999][i as usize]
            } else {
                x % 300_000_000_000_000_000
            });
            let d = s.datetime();
            let base = format!(
                "{:04}-{:02}-{:02}T{:02}:{:02}:{:02}",
                d.year(),
                u8::from(d.month()),
                d.day(),
                d.hour(),
                d.minute(),
                d.second()
            );
            assert_eq!(
                s.iso_millis(),
                format!("{base}.{:03}Z", d.millisecond()),
                "{s:?}"
            );
            assert_eq!(
                s.iso_micros(),
                format!("{base}.{:06}Z", d.microsecond()),
                "{s:?}"
            );
        }
    }

    #[test]
    fn parses_offsets_and_bare_times() {
        let a = Stamp::parse_iso("2026-01-01T01:00:00+01:00").unwrap();
        let b = Stamp::parse_iso("2026-01-01T00:00:00").unwrap();
        assert_eq!(a, b);
        assert!(Stamp::parse_iso("yesterday").is_err());
    }
}
