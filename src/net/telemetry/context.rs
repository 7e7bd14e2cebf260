//! W3C Trace Context (`traceparent`, <https://www.w3.org/TR/trace-context/>): parsing what a
//! client or the router sent, and formatting what goes on. Pure: no clock, no I/O; the only
//! randomness is the new ids, from the thread's own generator (`fastrand`, no lock).
//!
//! An invalid header is never an error for the request: [`TraceContext::parse`] answers `None`
//! and the caller starts a new trace, as the specification asks of a receiver ("If the vendor
//! failed to parse traceparent, it MUST NOT attempt to parse tracestate"; a new trace begins).

/// Bytes of a version-00 `traceparent`: `00-<32 hex>-<16 hex>-<2 hex>`.
pub const TRACEPARENT_LEN: usize = 55;

/// The `sampled` bit of the trace flags.
const FLAG_SAMPLED: u8 = 0x01;

/// One position in a trace: the trace, the span at this hop, and the trace flags.
///
/// Invariant: neither id is all zeros (the specification's invalid value).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TraceContext {
    pub trace_id: [u8; 16],
    pub span_id: [u8; 8],
    pub flags: u8,
}

impl TraceContext {
    /// A `traceparent` value, or `None` when it is not one this router can continue: wrong
    /// length, version `ff` or a non-hex version, upper-case or non-hex digits, missing dashes,
    /// an all-zero trace or span id. Version `00` must be exactly 55 bytes; a later version may
    /// append `-`-separated fields, which are ignored (the specification's forward
    /// compatibility rule).
    pub fn parse(header: &[u8]) -> Option<TraceContext> {
        if header.len() < TRACEPARENT_LEN {
            return None;
        }
        let version = hex_byte(&header[0..2])?;
        if version == 0xff {
            return None;
        }
        if version == 0 && header.len() != TRACEPARENT_LEN {
            return None;
        }
        if header.len() > TRACEPARENT_LEN && header[TRACEPARENT_LEN] != b'-' {
            return None;
        }
        if header[2] != b'-' || header[35] != b'-' || header[52] != b'-' {
            return None;
        }
        let mut trace_id = [0u8; 16];
        for (index, byte) in trace_id.iter_mut().enumerate() {
            *byte = hex_byte(&header[3 + 2 * index..5 + 2 * index])?;
        }
        let mut span_id = [0u8; 8];
        for (index, byte) in span_id.iter_mut().enumerate() {
            *byte = hex_byte(&header[36 + 2 * index..38 + 2 * index])?;
        }
        let flags = hex_byte(&header[53..55])?;
        if trace_id == [0; 16] || span_id == [0; 8] {
            return None;
        }
        Some(TraceContext {
            trace_id,
            span_id,
            flags,
        })
    }

    /// The start of a new trace: fresh trace and span ids, sampled.
    pub fn new_root() -> TraceContext {
        TraceContext {
            trace_id: nonzero_id(),
            span_id: nonzero_id(),
            flags: FLAG_SAMPLED,
        }
    }

    /// A span under this one: the same trace and flags, a fresh span id.
    pub fn child(&self) -> TraceContext {
        TraceContext {
            trace_id: self.trace_id,
            span_id: nonzero_id(),
            flags: self.flags,
        }
    }

    /// Sets or clears the `sampled` flag (the sampler's decision for this span).
    pub fn set_sampled(&mut self, sampled: bool) {
        if sampled {
            self.flags |= FLAG_SAMPLED;
        } else {
            self.flags &= !FLAG_SAMPLED;
        }
    }

    /// Whether the trace's spans are recorded (the `sampled` flag: the caller upstream decided).
    pub fn is_sampled(&self) -> bool {
        self.flags & FLAG_SAMPLED != 0
    }

    /// The version-00 `traceparent` for this context, always 55 lower-case ASCII bytes.
    pub fn traceparent(&self) -> [u8; TRACEPARENT_LEN] {
        let mut out = [b'-'; TRACEPARENT_LEN];
        out[0..2].copy_from_slice(b"00");
        put_hex(&mut out[3..35], &self.trace_id);
        put_hex(&mut out[36..52], &self.span_id);
        put_hex(&mut out[53..55], &[self.flags & FLAG_SAMPLED]);
        out
    }

    /// The trace id as 32 lower-case hex digits (the audit record's `trace_id`).
    pub fn trace_id_hex(&self) -> [u8; 32] {
        let mut out = [0u8; 32];
        put_hex(&mut out, &self.trace_id);
        out
    }
}

/// Random bytes, never all zeros (the invalid id): a zero draw (2^-64 at worst) becomes 1.
fn nonzero_id<const N: usize>() -> [u8; N] {
    let mut id = [0u8; N];
    fastrand::fill(&mut id);
    if id == [0u8; N] {
        id[N - 1] = 1;
    }
    id
}

/// Two lower-case hex digits to a byte; upper case is invalid in `traceparent`.
fn hex_byte(digits: &[u8]) -> Option<u8> {
    let digit = |byte: u8| match byte {
        b'0'..=b'9' => Some(byte - b'0'),
        b'a'..=b'f' => Some(byte - b'a' + 10),
        _ => None,
    };
    Some(digit(digits[0])? << 4 | digit(digits[1])?)
}

fn put_hex(out: &mut [u8], bytes: &[u8]) {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    for (pair, byte) in out.chunks_exact_mut(2).zip(bytes) {
        pair[0] = HEX[usize::from(byte >> 4)];
        pair[1] = HEX[usize::from(byte & 0x0f)];
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const VALID: &[u8] = b"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

    #[test]
    fn a_valid_header_round_trips() {
        let context = TraceContext::parse(VALID).unwrap();
        assert_eq!(context.trace_id[0], 0x4b);
        assert_eq!(context.span_id[7], 0xb7);
        assert!(context.is_sampled());
        assert_eq!(&context.traceparent()[..], VALID);
        assert_eq!(
            &context.trace_id_hex()[..],
            b"4bf92f3577b34da6a3ce929d0e0e4736"
        );
    }

    #[test]
    fn an_unsampled_parent_stays_unsampled() {
        let context =
            TraceContext::parse(b"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00")
                .unwrap();
        assert!(!context.is_sampled());
        assert!(!context.child().is_sampled());
    }

    #[test]
    fn invalid_headers_are_refused() {
        let invalid: &[&[u8]] = &[
            b"",
            b"00",
            // Version ff is forbidden; a non-hex version is not a version.
            b"ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            b"0x-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            // All-zero ids.
            b"00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            b"00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
            // Bad lengths: one digit short, one long, trailing bytes on version 00.
            b"00-4bf92f3577b34da6a3ce929d0e0e473-00f067aa0ba902b7-01",
            b"00-4bf92f3577b34da6a3ce929d0e0e47361-00f067aa0ba902b7-01",
            b"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-",
            // Upper case, non-hex, wrong separators.
            b"00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
            b"00-4bf92f3577b34da6a3ce929d0e0e473g-00f067aa0ba902b7-01",
            b"00_4bf92f3577b34da6a3ce929d0e0e4736_00f067aa0ba902b7_01",
        ];
        for header in invalid {
            assert_eq!(
                TraceContext::parse(header),
                None,
                "{}",
                String::from_utf8_lossy(header)
            );
        }
    }

    #[test]
    fn a_later_version_may_append_fields() {
        let header = b"01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-extra";
        let context = TraceContext::parse(header).unwrap();
        assert_eq!(&context.traceparent()[..], VALID, "sent on as version 00");
        assert_eq!(
            TraceContext::parse(b"01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01x"),
            None
        );
    }

    #[test]
    fn new_traces_and_children_have_fresh_valid_ids() {
        let root = TraceContext::new_root();
        assert!(root.is_sampled());
        let child = root.child();
        assert_eq!(child.trace_id, root.trace_id);
        assert_ne!(child.span_id, root.span_id);
        assert_eq!(TraceContext::parse(&child.traceparent()), Some(child));
        assert_ne!(TraceContext::new_root().trace_id, root.trace_id);
    }

    #[test]
    fn only_the_sampled_flag_is_sent_on() {
        let context =
            TraceContext::parse(b"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-ff")
                .unwrap();
        assert!(context.traceparent().ends_with(b"-01"));
    }
}
