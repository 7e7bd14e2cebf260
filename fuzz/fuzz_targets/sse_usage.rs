//! The usage readers of `usage`: the server-sent-event splitter, the OpenAI and Anthropic stream
//! scanners, and the whole-body usage parsers, over a backend's response.
//!
//! Asserts:
//! - nothing panics;
//! - the splitter loses and invents no byte: its events and tail concatenate to the input, and
//!   every event but the tail ends in a blank line;
//! - the same bytes pushed in pieces (drained after each push, or pushed twice before draining,
//!   as a reader that falls behind does) split into the same events and tail, so the usage
//!   read from a stream does not depend on how the network cut it;
//! - an event longer than the buffering limit is refused, never buffered past it;
//! - the scanners read an event the same from the splitter's hint (`scan_event`) as from its
//!   bytes alone (`scan`).
#![no_main]

use bytes::Bytes;
use fuzz_support::Cuts;
use hivenet_router::logic::usage::{
    self, AnthropicStreamScan, OpenAiEvent, OpenAiStreamScan, SseError, SseEvent, SseSplitter,
    Usage,
};
use libfuzzer_sys::fuzz_target;

/// The splitter's limit for the exactness checks: more than any input.
const EVENT_BYTES_UNBOUNDED: usize = 1 << 30;
/// A limit fuzzed inputs do reach.
const EVENT_BYTES_SMALL: usize = 200;

fuzz_target!(|data: &[u8]| {
    let _ = usage::from_openai_chat(data);
    let _ = usage::from_openai_embeddings(data);
    let _ = usage::from_anthropic_message(data);

    let whole = split(&[data], &[]);
    let mut rejoined: Vec<u8> = whole
        .events
        .iter()
        .flat_map(|event| event.iter())
        .copied()
        .collect();
    rejoined.extend_from_slice(&whole.tail);
    assert_eq!(rejoined, data, "the splitter lost or invented bytes");
    for event in &whole.events {
        assert!(
            event.ends_with(b"\n"),
            "an event does not end in a blank line"
        );
    }
    assert!(whole.error.is_none());

    let mut cuts = Cuts::new(data, 40);
    let pieces = cuts.split(data);
    // Which pushes are followed by a second push before draining.
    let doubled: Vec<bool> = pieces
        .iter()
        .map(|_| cuts.next_u64().is_multiple_of(4))
        .collect();
    let in_pieces = split(&pieces, &doubled);
    assert_eq!(in_pieces.events, whole.events, "events depend on the cuts");
    assert_eq!(in_pieces.tail, whole.tail);
    assert_eq!(in_pieces.openai, whole.openai);
    assert_eq!(in_pieces.anthropic, whole.anthropic);

    // Bounded: with a small limit, pieces end in an error or in events, never a huge buffer.
    let mut splitter = SseSplitter::new(EVENT_BYTES_SMALL);
    for piece in &pieces {
        splitter.push(Bytes::copy_from_slice(piece));
        loop {
            match splitter.next_event() {
                Ok(Some(_)) => {}
                Ok(None) => break,
                Err(SseError::EventTooLarge) => return,
            }
        }
    }
    assert!(splitter.take_tail().len() <= EVENT_BYTES_SMALL);
});

#[derive(Debug)]
struct Split {
    events: Vec<SseEvent>,
    tail: Bytes,
    error: Option<SseError>,
    openai: (Vec<OpenAiEvent>, Option<Usage>),
    anthropic: Option<Usage>,
}

fn split(pieces: &[&[u8]], doubled: &[bool]) -> Split {
    let mut splitter = SseSplitter::new(EVENT_BYTES_UNBOUNDED);
    let mut events = Vec::new();
    let mut error = None;
    let mut index = 0;
    while index < pieces.len() {
        splitter.push(Bytes::copy_from_slice(pieces[index]));
        if doubled.get(index) == Some(&true) && index + 1 < pieces.len() {
            index += 1;
            splitter.push(Bytes::copy_from_slice(pieces[index]));
        }
        index += 1;
        loop {
            match splitter.next_event() {
                Ok(Some(event)) => events.push(event),
                Ok(None) => break,
                Err(failure) => {
                    error = Some(failure);
                    break;
                }
            }
        }
    }
    let tail = splitter.take_tail();
    let mut openai = OpenAiStreamScan::new();
    let mut openai_bytes = OpenAiStreamScan::new();
    let mut anthropic = AnthropicStreamScan::new();
    let mut anthropic_bytes = AnthropicStreamScan::new();
    let mut kinds = Vec::new();
    for event in &events {
        let kind = openai.scan_event(event);
        assert_eq!(
            openai_bytes.scan(event),
            kind,
            "the splitter's hint changed a reading"
        );
        if kind == OpenAiEvent::Done {
            assert!(event.windows(6).any(|window| window == b"[DONE]"));
        }
        kinds.push(kind);
        anthropic.scan_event(event);
        anthropic_bytes.scan(event);
    }
    assert_eq!(openai_bytes.usage(), openai.usage());
    assert_eq!(anthropic_bytes.usage(), anthropic.usage());
    Split {
        events,
        tail,
        error,
        openai: (kinds, openai.usage()),
        anthropic: anthropic.usage(),
    }
}
