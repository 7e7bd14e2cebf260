//! The audit log (observability reference, "Audit logging"): one JSON object per request, one
//! line each, appended to `HIVENET_ROUTER_AUDIT_LOG_PATH` (default
//! `/var/log/hivenet-router/audit.jsonl`; standard output when the file cannot be opened, with a
//! line on standard error saying so).
//!
//! Architecture: each shard formats its records into its own single-producer byte ring
//! ([`AuditSender`]); one writer thread drains every ring into the file every few milliseconds
//! and flushes. The request path formats one line into a reused buffer and copies it into the
//! ring: no lock, no system call, no wait. A ring that is full (the disk cannot keep up) drops the
//! record and counts it rather than stall the shard; the writer logs a warning with the count
//! whenever it grew.
//!
//! Invariants: a record is committed to its ring whole, so the writer never writes half a line;
//! [`AuditLog::shutdown`] drains every ring before it returns, so a graceful stop loses nothing
//! already recorded.
//!
//! What a record holds is metadata only (no prompt, no response, no headers, no key): see
//! [`AuditRecord`]. Differences from the reference: `ts` is UTC (`Z`) rather than Europe/Rome
//! local time, and a static key's `key_id` is its own stable id (`static:<id>`), which the older
//! implementation did not have.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, SystemTime};

use serde::Serialize;

/// The reference's default path.
pub const DEFAULT_PATH: &str = "/var/log/hivenet-router/audit.jsonl";

/// Bytes of records one shard may have waiting for the writer.
const RING_BYTES: usize = 1 << 20;

/// How often the writer drains the rings when they were empty last time.
const DRAIN_INTERVAL: Duration = Duration::from_millis(10);

/// One request, as the audit log records it (field order and names as the reference shows).
#[derive(Debug, Serialize)]
pub struct AuditRecord<'a> {
    pub log_type: &'static str,
    pub level: &'static str,
    /// The request's trace id, 32 hex digits, when tracing is on; empty otherwise
    /// (observability reference, "Trace IDs").
    pub trace_id: &'a str,
    pub request_id: &'a str,
    pub tenant_id: &'a str,
    pub key_id: Shown<AuditKey<'a>>,
    pub model: &'a str,
    pub status_code: u16,
    pub latency_ms: u64,
    pub input_tokens: u64,
    pub output_tokens: u64,
    pub agent_id: &'a str,
    pub error_code: &'a str,
    pub source_ip: SourceIp,
    pub ts: Timestamp,
}

/// Serializes a `Display` value as a JSON string, formatted straight into the output (no
/// intermediate `String` on the request path).
#[derive(Debug)]
pub struct Shown<T>(pub T);

impl<T: std::fmt::Display> Serialize for Shown<T> {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(&self.0)
    }
}

/// `key_id`: the dynamic entry's id, `static:<id>` for a static key (its own stable id), empty
/// without a key.
#[derive(Debug, Clone, Copy)]
pub enum AuditKey<'a> {
    None,
    Dynamic(&'a str),
    Static(crate::logic::auth::keys::KeyId),
}

impl<'a> AuditKey<'a> {
    pub fn of(key: Option<&'a crate::logic::auth::keys::KeyRecord>) -> AuditKey<'a> {
        use crate::logic::auth::keys::KeySource;
        match key.map(|key| (&key.source, key.key_id)) {
            Some((KeySource::Dynamic { id }, _)) => AuditKey::Dynamic(id),
            Some((KeySource::Static { .. }, key_id)) => AuditKey::Static(key_id),
            Some((KeySource::Anonymous, _)) | None => AuditKey::None,
        }
    }
}

impl std::fmt::Display for AuditKey<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            AuditKey::None => Ok(()),
            AuditKey::Dynamic(id) => f.write_str(id),
            AuditKey::Static(key_id) => write!(f, "static:{key_id}"),
        }
    }
}

/// The client's address, or nothing (`""`) when unknown.
#[derive(Debug, Clone, Copy)]
pub struct SourceIp(pub Option<std::net::IpAddr>);

impl std::fmt::Display for SourceIp {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.0 {
            Some(ip) => ip.fmt(f),
            None => Ok(()),
        }
    }
}

impl Serialize for SourceIp {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

/// An IPv4 address as text, digit by digit, and its length.
fn ipv4_text(ip: std::net::Ipv4Addr) -> ([u8; 15], usize) {
    let mut text = [0u8; 15];
    let mut len = 0;
    for (index, octet) in ip.octets().into_iter().enumerate() {
        if index > 0 {
            text[len] = b'.';
            len += 1;
        }
        let digits = match octet {
            0..=9 => 1,
            10..=99 => 2,
            _ => 3,
        };
        put_digits(&mut text[len..len + digits], u64::from(octet));
        len += digits;
    }
    (text, len)
}

/// RFC 3339 UTC with milliseconds, e.g. `2026-07-27T14:20:10.123Z`.
#[derive(Debug, Clone, Copy)]
pub struct Timestamp(pub SystemTime);

impl Timestamp {
    /// `YYYY-MM-DDTHH:MM:SS.mmmZ` in UTC, written digit by digit: one string for the serializer
    /// instead of seven padded integers through `fmt` (each its own escaped write). Times before
    /// 1970 show as 1970; years past 9999 as 9999.
    fn render(&self) -> [u8; 24] {
        let since_epoch = self
            .0
            .duration_since(SystemTime::UNIX_EPOCH)
            .unwrap_or_default();
        let seconds = since_epoch.as_secs();
        let (days, of_day) = (seconds / 86_400, seconds % 86_400);
        let (year, month, day) = civil_from_days(days as i64);
        let mut out = *b"0000-00-00T00:00:00.000Z";
        put_digits(&mut out[0..4], year.clamp(0, 9999) as u64);
        put_digits(&mut out[5..7], u64::from(month));
        put_digits(&mut out[8..10], u64::from(day));
        put_digits(&mut out[11..13], of_day / 3600);
        put_digits(&mut out[14..16], of_day / 60 % 60);
        put_digits(&mut out[17..19], of_day % 60);
        put_digits(&mut out[20..23], u64::from(since_epoch.subsec_millis()));
        out
    }
}

/// `value`'s last `out.len()` decimal digits, zero-padded.
fn put_digits(out: &mut [u8], mut value: u64) {
    for slot in out.iter_mut().rev() {
        *slot = b'0' + (value % 10) as u8;
        value /= 10;
    }
}

impl std::fmt::Display for Timestamp {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let rendered = self.render();
        f.write_str(std::str::from_utf8(&rendered).expect("digits and ASCII punctuation"))
    }
}

impl Serialize for Timestamp {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let rendered = self.render();
        serializer
            .serialize_str(std::str::from_utf8(&rendered).expect("digits and ASCII punctuation"))
    }
}

impl AuditRecord<'_> {
    /// `info` below 400, `error` from 400 (reference, "Audit fields").
    pub fn level_of(status: u16) -> &'static str {
        if status >= 400 { "error" } else { "info" }
    }

    /// Appends the record as one JSON object: the bytes serde_json gives its derived `Serialize`
    /// (a unit test holds them equal), written field by field. serde_json escapes every key and
    /// value byte by byte; here the keys are constants and a value that needs no escaping (all
    /// but odd model names) is copied whole. Through serde_json a record costs 6,100
    /// instructions, 7-9 % of the router's per request
    /// (`perf/notes/2026-12-01-where-requests-wait-and-the-stream-cork.md`).
    pub fn write_json(&self, out: &mut Vec<u8>) {
        out.push(b'{');
        let leading = [
            ("log_type", self.log_type),
            ("level", self.level),
            ("trace_id", self.trace_id),
            ("request_id", self.request_id),
            ("tenant_id", self.tenant_id),
        ];
        for (index, (name, value)) in leading.into_iter().enumerate() {
            json_key(out, name, index > 0);
            json_str(out, value);
        }
        json_key(out, "key_id", true);
        match self.key_id.0 {
            AuditKey::None => out.extend_from_slice(b"\"\""),
            AuditKey::Dynamic(id) => json_str(out, id),
            AuditKey::Static(key_id) => {
                out.extend_from_slice(b"\"static:");
                out.extend_from_slice(&key_id.hex());
                out.push(b'"');
            }
        }
        json_key(out, "model", true);
        json_str(out, self.model);
        let mut digits = itoa::Buffer::new();
        let counts = [
            ("status_code", u64::from(self.status_code)),
            ("latency_ms", self.latency_ms),
            ("input_tokens", self.input_tokens),
            ("output_tokens", self.output_tokens),
        ];
        for (name, value) in counts {
            json_key(out, name, true);
            out.extend_from_slice(digits.format(value).as_bytes());
        }
        for (name, value) in [("agent_id", self.agent_id), ("error_code", self.error_code)] {
            json_key(out, name, true);
            json_str(out, value);
        }
        json_key(out, "source_ip", true);
        out.push(b'"');
        match self.source_ip.0 {
            Some(std::net::IpAddr::V4(ip)) => {
                let (text, len) = ipv4_text(ip);
                out.extend_from_slice(&text[..len]);
            }
            // IPv6 text is hex digits and colons: nothing to escape.
            Some(ip @ std::net::IpAddr::V6(_)) => {
                use std::io::Write as _;
                let _ = write!(out, "{ip}");
            }
            None => {}
        }
        out.extend_from_slice(b"\",\"ts\":\"");
        out.extend_from_slice(&self.ts.render());
        out.extend_from_slice(b"\"}");
    }
}

/// `"name":`, after a comma unless it is the object's first member.
fn json_key(out: &mut Vec<u8>, name: &str, after_another: bool) {
    if after_another {
        out.push(b',');
    }
    out.push(b'"');
    out.extend_from_slice(name.as_bytes());
    out.extend_from_slice(b"\":");
}

/// `value` as a JSON string: copied whole when nothing in it needs escaping, else through
/// serde_json's escaping (which escapes exactly `"`, `\\` and bytes below 0x20).
fn json_str(out: &mut Vec<u8>, value: &str) {
    // Every byte is looked at, with no early exit, so that the compiler checks many at a time:
    // the values are short and almost never need escaping.
    let escapes = value.bytes().fold(0u8, |escapes, byte| {
        escapes | u8::from(byte < 0x20 || byte == b'"' || byte == b'\\')
    });
    if escapes == 0 {
        out.push(b'"');
        out.extend_from_slice(value.as_bytes());
        out.push(b'"');
    } else {
        serde_json::to_writer(&mut *out, value).expect("a Vec takes any write");
    }
}

/// The error code a record carries when the handler attached none: derived from the status
/// (reference, "Error codes").
pub fn error_code_for_status(status: u16) -> &'static str {
    match status {
        0..=399 => "",
        400 => "request_invalid",
        401 => "unauthorized",
        403 => "model_forbidden",
        404 => "model_not_found",
        429 => "rate_limit_exceeded",
        503 => "no_agents_available",
        504 => "request_timeout",
        _ => "backend_error",
    }
}

/// `X-Request-ID` when it is a UUID (8-4-4-4-12 hex digits), else a new random UUID v4: no
/// arbitrary text reaches the log.
pub fn request_id(presented: Option<&[u8]>, out: &mut [u8; 36]) {
    if let Some(presented) = presented
        && is_uuid(presented)
    {
        out.copy_from_slice(presented);
        out.make_ascii_lowercase();
        return;
    }
    let mut bytes = fastrand::u128(..).to_be_bytes();
    bytes[6] = (bytes[6] & 0x0f) | 0x40;
    bytes[8] = (bytes[8] & 0x3f) | 0x80;
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let mut at = 0;
    for (index, byte) in bytes.iter().enumerate() {
        if matches!(index, 4 | 6 | 8 | 10) {
            out[at] = b'-';
            at += 1;
        }
        out[at] = HEX[usize::from(byte >> 4)];
        out[at + 1] = HEX[usize::from(byte & 0x0f)];
        at += 2;
    }
}

fn is_uuid(text: &[u8]) -> bool {
    text.len() == 36
        && text.iter().enumerate().all(|(index, byte)| match index {
            8 | 13 | 18 | 23 => *byte == b'-',
            _ => byte.is_ascii_hexdigit(),
        })
}

/// Days since 1970-01-01 to a proleptic Gregorian date (Howard Hinnant's algorithm).
fn civil_from_days(days: i64) -> (i64, u32, u32) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let day_of_era = z.rem_euclid(146_097);
    let year_of_era =
        (day_of_era - day_of_era / 1460 + day_of_era / 36_524 - day_of_era / 146_096) / 365;
    let day_of_year = day_of_era - (365 * year_of_era + year_of_era / 4 - year_of_era / 100);
    let month_index = (5 * day_of_year + 2) / 153;
    let day = (day_of_year - (153 * month_index + 2) / 5 + 1) as u32;
    let month = if month_index < 10 {
        month_index + 3
    } else {
        month_index - 9
    } as u32;
    let year = year_of_era + era * 400 + i64::from(month <= 2);
    (year, month, day)
}

/// A shard's end of the audit log.
pub struct AuditSender {
    ring: rtrb::Producer<u8>,
    line: Vec<u8>,
    dropped: Arc<AtomicU64>,
}

impl AuditSender {
    /// Formats `record` as one line and hands it to the writer; never blocks.
    pub fn record(&mut self, record: &AuditRecord<'_>) {
        self.line.clear();
        record.write_json(&mut self.line);
        self.line.push(b'\n');
        match self.ring.write_chunk_uninit(self.line.len()) {
            Ok(chunk) => {
                let written = chunk.fill_from_iter(self.line.iter().copied());
                debug_assert_eq!(written, self.line.len());
            }
            Err(_) => {
                self.dropped.fetch_add(1, Ordering::Relaxed);
            }
        }
    }
}

/// The writer thread and what the router needs to stop it.
pub struct AuditLog {
    stop: Arc<AtomicBool>,
    writer: Option<std::thread::JoinHandle<()>>,
    /// Records dropped because a shard's ring was full.
    pub dropped: Arc<AtomicU64>,
    pub destination: String,
}

impl AuditLog {
    /// Opens the log (creating the parent directory when possible; standard output otherwise)
    /// and starts the writer; returns it and one sender per shard.
    pub fn start(path: &Path, shards: usize) -> std::io::Result<(AuditLog, Vec<AuditSender>)> {
        let (output, destination): (Box<dyn Write + Send>, String) = match open(path) {
            Ok(file) => (Box::new(file), path.display().to_string()),
            Err(error) => {
                eprintln!(
                    "audit: cannot open {}: {error} — falling back to stdout",
                    path.display()
                );
                (Box::new(std::io::stdout()), "stdout".to_owned())
            }
        };
        let dropped = Arc::new(AtomicU64::new(0));
        let mut senders = Vec::with_capacity(shards);
        let mut rings = Vec::with_capacity(shards);
        for _ in 0..shards {
            let (producer, consumer) = rtrb::RingBuffer::new(RING_BYTES);
            senders.push(AuditSender {
                ring: producer,
                line: Vec::with_capacity(512),
                dropped: dropped.clone(),
            });
            rings.push(consumer);
        }
        let stop = Arc::new(AtomicBool::new(false));
        let stopping = stop.clone();
        let dropped_seen = dropped.clone();
        let writer = std::thread::Builder::new()
            .name("audit".into())
            .spawn(move || write_loop(output, rings, &stopping, &dropped_seen))?;
        Ok((
            AuditLog {
                stop,
                writer: Some(writer),
                dropped,
                destination,
            },
            senders,
        ))
    }

    /// Drains every ring into the log and stops the writer.
    pub fn shutdown(&mut self) {
        self.stop.store(true, Ordering::Release);
        if let Some(writer) = self.writer.take() {
            let _ = writer.join();
        }
    }
}

/// `HIVENET_ROUTER_AUDIT_LOG_PATH`, or the reference's default.
pub fn path_from_env() -> PathBuf {
    std::env::var_os("HIVENET_ROUTER_AUDIT_LOG_PATH")
        .filter(|path| !path.is_empty())
        .map_or_else(|| PathBuf::from(DEFAULT_PATH), PathBuf::from)
}

fn open(path: &Path) -> std::io::Result<std::io::BufWriter<std::fs::File>> {
    if let Some(parent) = path
        .parent()
        .filter(|parent| !parent.as_os_str().is_empty())
    {
        std::fs::create_dir_all(parent)?;
    }
    let file = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)?;
    Ok(std::io::BufWriter::with_capacity(1 << 16, file))
}

fn write_loop(
    mut output: Box<dyn Write + Send>,
    mut rings: Vec<rtrb::Consumer<u8>>,
    stop: &AtomicBool,
    dropped: &AtomicU64,
) {
    let mut dropped_reported = 0;
    loop {
        // Read the flag first: a drain that follows it sees everything committed before it.
        let stopping = stop.load(Ordering::Acquire);
        let mut drained = 0;
        for ring in &mut rings {
            let available = ring.slots();
            if available == 0 {
                continue;
            }
            if let Ok(chunk) = ring.read_chunk(available) {
                let (first, second) = chunk.as_slices();
                let _ = output.write_all(first);
                let _ = output.write_all(second);
                drained += available;
                chunk.commit_all();
            }
        }
        if drained > 0 {
            let _ = output.flush();
        }
        let dropped_now = dropped.load(Ordering::Relaxed);
        if dropped_now > dropped_reported {
            tracing::warn!(
                dropped = dropped_now,
                "audit records dropped: the audit log cannot keep up"
            );
            dropped_reported = dropped_now;
        }
        if stopping {
            let _ = output.flush();
            return;
        }
        if drained == 0 {
            std::thread::sleep(DRAIN_INTERVAL);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_ascii_character_alone_in_a_value_is_written_as_serde_json_writes_it() {
        for byte in 0u8..=0x7f {
            let value = format!("key-{}-1", char::from(byte));
            let mut written = Vec::new();
            json_str(&mut written, &value);
            assert_eq!(
                written,
                serde_json::to_vec(&value).unwrap(),
                "byte {byte:#x}"
            );
        }
    }

    proptest::proptest! {
        /// Mostly printable ASCII, with control characters, quotes, backslashes and any other
        /// character now and then.
        #[test]
        fn a_string_is_written_as_serde_json_writes_it(
            chars in proptest::collection::vec(
                proptest::prop_oneof![
                    12 => proptest::char::range(' ', '~'),
                    1 => proptest::char::range('\0', '\u{1f}'),
                    1 => proptest::char::any(),
                ],
                0..60,
            )
        ) {
            let value: String = chars.into_iter().collect();
            let mut written = Vec::new();
            json_str(&mut written, &value);
            proptest::prop_assert_eq!(written, serde_json::to_vec(&value).unwrap());
        }
    }

    fn record(request_id: &str, ts: SystemTime) -> AuditRecord<'_> {
        AuditRecord {
            log_type: "audit",
            level: AuditRecord::level_of(200),
            trace_id: "",
            request_id,
            tenant_id: "acme\"corp",
            key_id: Shown(AuditKey::None),
            model: "m",
            status_code: 200,
            latency_ms: 12,
            input_tokens: 3,
            output_tokens: 4,
            agent_id: "12D3KooW",
            error_code: "",
            source_ip: SourceIp(Some("10.0.0.5".parse().unwrap())),
            ts: Timestamp(ts),
        }
    }

    #[test]
    fn request_ids_are_uuids_whatever_the_client_sends() {
        let mut id = [0u8; 36];
        request_id(Some(b"8B9E4A6D-DFB4-4B95-BADA-319E7E5B878A"), &mut id);
        assert_eq!(&id, b"8b9e4a6d-dfb4-4b95-bada-319e7e5b878a");
        for bad in [
            &b"not-a-uuid"[..],
            b"",
            b"8b9e4a6d-dfb4-4b95-bada-319e7e5b878\"",
            b"\n",
        ] {
            request_id(Some(bad), &mut id);
            assert!(is_uuid(&id), "{}", String::from_utf8_lossy(&id));
            assert_eq!(id[14], b'4', "version 4");
        }
        request_id(None, &mut id);
        assert!(is_uuid(&id));
    }

    #[test]
    fn timestamps_are_rfc3339_utc() {
        let at = |since_epoch: Duration| Timestamp(SystemTime::UNIX_EPOCH + since_epoch);
        assert_eq!(
            at(Duration::from_millis(1_785_162_010_123)).to_string(),
            "2026-07-27T14:20:10.123Z"
        );
        assert_eq!(
            at(Duration::from_secs(951_782_400)).to_string(),
            "2000-02-29T00:00:00.000Z"
        );
        assert_eq!(
            Timestamp(SystemTime::UNIX_EPOCH - Duration::from_secs(1)).to_string(),
            "1970-01-01T00:00:00.000Z",
            "before the epoch shows as the epoch"
        );
        let serialized =
            serde_json::to_string(&at(Duration::from_millis(1_785_162_010_123))).unwrap();
        assert_eq!(serialized, r#""2026-07-27T14:20:10.123Z""#);
    }

    #[test]
    fn the_hand_written_line_is_what_serde_json_writes() {
        let at = Timestamp(SystemTime::UNIX_EPOCH + Duration::from_millis(1_785_162_010_123));
        let record = |model: &'static str, key_id, source_ip: Option<&str>| AuditRecord {
            log_type: "audit",
            level: "info",
            trace_id: "",
            request_id: "6f1c6f7e-5d1e-4c59-9d0b-2b8f0c7e1a11",
            tenant_id: "team-a",
            key_id: Shown(key_id),
            model,
            status_code: 200,
            latency_ms: 1234,
            input_tokens: 0,
            output_tokens: u64::MAX,
            agent_id: "12D3KooWagent",
            error_code: "",
            source_ip: SourceIp(source_ip.map(|ip| ip.parse().unwrap())),
            ts: at,
        };
        let records = [
            record("sim-model", AuditKey::None, Some("10.200.7.255")),
            record(
                "quote\" back\\ nl\n ctl\u{1} del\u{7f} é",
                AuditKey::Dynamic("k-1"),
                None,
            ),
            record(
                "m",
                AuditKey::Static(crate::logic::auth::keys::KeyId(0x0a1b_2c3d)),
                Some("::1"),
            ),
            record(
                "",
                AuditKey::Static(crate::logic::auth::keys::KeyId(u32::MAX)),
                Some("0.0.0.0"),
            ),
        ];
        for record in &records {
            let mut written = Vec::new();
            record.write_json(&mut written);
            let expected = serde_json::to_vec(record).unwrap();
            assert_eq!(
                String::from_utf8_lossy(&written),
                String::from_utf8_lossy(&expected)
            );
        }
    }

    #[test]
    fn source_addresses_serialize_as_text() {
        let shown = |ip: Option<&str>| {
            serde_json::to_string(&SourceIp(ip.map(|ip| ip.parse().unwrap()))).unwrap()
        };
        assert_eq!(shown(Some("0.0.0.0")), r#""0.0.0.0""#);
        assert_eq!(shown(Some("10.200.7.255")), r#""10.200.7.255""#);
        assert_eq!(shown(Some("255.255.255.255")), r#""255.255.255.255""#);
        assert_eq!(shown(Some("2001:db8::1")), r#""2001:db8::1""#);
        assert_eq!(shown(None), r#""""#);
    }

    #[test]
    fn status_codes_map_to_fallback_error_codes() {
        assert_eq!(error_code_for_status(200), "");
        assert_eq!(error_code_for_status(404), "model_not_found");
        assert_eq!(error_code_for_status(413), "backend_error");
        assert_eq!(AuditRecord::level_of(404), "error");
    }

    #[test]
    fn records_reach_the_file_whole_and_in_order_after_shutdown() {
        let dir = std::env::temp_dir().join(format!("hivenet-audit-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let path = dir.join("nested/audit.jsonl");
        let (mut log, mut senders) = AuditLog::start(&path, 2).unwrap();
        for index in 0..1000 {
            let id = format!("{index:036}");
            senders[index % 2].record(&record(&id, SystemTime::now()));
        }
        log.shutdown();
        let text = std::fs::read_to_string(&path).unwrap();
        let lines: Vec<serde_json::Value> = text
            .lines()
            .map(|line| serde_json::from_str(line).expect("whole JSON lines"))
            .collect();
        assert_eq!(lines.len(), 1000);
        assert_eq!(lines[0]["log_type"], "audit");
        assert_eq!(lines[0]["tenant_id"], "acme\"corp");
        assert_eq!(lines[0]["source_ip"], "10.0.0.5");
        assert!(lines[0]["ts"].as_str().unwrap().ends_with('Z'));
        assert_eq!(log.dropped.load(Ordering::Relaxed), 0);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
