//! The lean tunnel's multiplexer, without I/O: streams, their flow control and the connection's
//! frames in and out, as a state machine the two ends' drivers feed (`tunnel::link`). Frames come
//! in through [`Mux::receive`]; what the peer must be told goes to the
//! output buffer ([`Mux::take_output`]); what the local side must learn comes out as [`Event`]s.
//!
//! Roles: the router is the [`Role::Client`] (it opens odd-numbered streams with REQUEST
//! frames); the agent is the [`Role::Server`] (it answers each with RESPONSE, DATA, or RESET).
//!
//! Flow control, in both directions and at two levels like HTTP/2's: a sender may have at most
//! [`STREAM_WINDOW`] bytes of DATA unacknowledged on a stream and [`CONNECTION_WINDOW`] on the
//! connection. The receiver grants credit back (CREDIT frames) as its local side reports bytes
//! consumed ([`Mux::consumed`]), once half a window has built up, so a steady stream costs one
//! CREDIT frame per half window, not one per DATA frame. Data arriving beyond the window is a
//! protocol error.
//!
//! Invariants (the tests check them on random interleavings of two muxes back to back):
//! - every byte a side sends arrives once, in order, on its stream; an END arrives after the
//!   last byte;
//! - a sender never has more than a window's worth unacknowledged, at either level;
//! - a stream's state is dropped once both directions ended or either side reset it, so a
//!   long-lived tunnel holds state only for streams in flight (at most [`STREAMS_MAX`] on the
//!   server; a REQUEST beyond that is refused with a reset);
//! - bytes that arrive for a stream already gone still count against, and are credited back to,
//!   the connection's window, so a reset never leaks connection credit.

use std::collections::VecDeque;

use bytes::{Bytes, BytesMut};
use http::header::HeaderMap;
use http::uri::PathAndQuery;
use http::{Method, StatusCode};
use std::collections::HashMap;
use thiserror::Error;

use super::wire::{self, Frame, PAYLOAD_BYTES_MAX, StreamId, WireError};

/// What each side may receive unacknowledged on one stream.
pub const STREAM_WINDOW: u32 = 4 << 20;
/// What each side may receive unacknowledged on the whole connection.
pub const CONNECTION_WINDOW: u32 = 16 << 20;
/// Streams the server keeps open at once; a REQUEST beyond them is reset with `REFUSED_STREAM`.
pub const STREAMS_MAX: usize = 1024;

/// HTTP/2's reset codes, which the tunnel keeps (`crate::net::tunnel::BACKEND_FAILED` among them).
pub const REFUSED_STREAM: u32 = 0x7;
pub const CANCEL: u32 = 0x8;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    Client,
    Server,
}

/// What the local side learns from the peer.
#[derive(Debug, Clone, PartialEq)]
pub enum Event {
    /// Server: a new stream's request head.
    Request {
        stream: StreamId,
        method: Method,
        target: PathAndQuery,
        fields: HeaderMap,
        end: bool,
    },
    /// Client: the response head of a stream it opened.
    Response {
        stream: StreamId,
        status: StatusCode,
        fields: HeaderMap,
        end: bool,
    },
    /// Body bytes; the local side reports them [`Mux::consumed`] once it has used them.
    Data {
        stream: StreamId,
        data: Bytes,
        end: bool,
    },
    /// The peer reset the stream; its state is gone.
    Reset {
        stream: StreamId,
        reason: u32,
    },
    /// Credit arrived: the stream may send again ([`Mux::send_data`]).
    Writable {
        stream: StreamId,
    },
    Pong {
        opaque: u64,
    },
    /// The peer will open or accept no stream after `last_stream`.
    GoAway {
        last_stream: StreamId,
        reason: u32,
    },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Error)]
pub enum MuxError {
    #[error(transparent)]
    Wire(#[from] WireError),
    #[error("tunnel protocol error: {0}")]
    Protocol(&'static str),
}

/// A stream's send call on a stream that is gone (reset, or ended).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Error)]
#[error("the tunnel stream is closed")]
pub struct StreamClosed;

#[derive(Debug, Default)]
struct Stream {
    /// The local side ended or reset its direction.
    send_done: bool,
    /// The peer ended its direction.
    recv_done: bool,
    /// What this side may still send before more credit.
    send_window: u32,
    /// What the peer may still send before this side grants more.
    recv_window: u32,
    /// Consumed and not yet credited back.
    recv_unacked: u32,
    /// Waiting for credit (an [`Event::Writable`] is due when some comes).
    blocked: bool,
}

/// The receive windows both ends use: protocol constants in production ([`Windows::TUNNEL`]);
/// small ones in tests, to reach flow control with small bodies.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Windows {
    pub stream: u32,
    pub connection: u32,
}

impl Windows {
    pub const TUNNEL: Windows = Windows {
        stream: STREAM_WINDOW,
        connection: CONNECTION_WINDOW,
    };
}

#[derive(Debug)]
pub struct Mux {
    role: Role,
    windows: Windows,
    streams: HashMap<StreamId, Stream, foldhash::fast::RandomState>,
    /// Client: the next stream to open (odd; after `u32::MAX` it wraps to 1, skipping streams
    /// still open, so a tunnel never runs out of them). Unused on a server.
    next_stream: StreamId,
    send_window: u32,
    recv_window: u32,
    recv_unacked: u32,
    /// Some stream waits for connection credit.
    blocked: bool,
    /// A GOAWAY came: no new stream.
    gone_away: bool,
    out: BytesMut,
    events: VecDeque<Event>,
}

impl Mux {
    pub fn new(role: Role) -> Mux {
        Mux::with_windows(role, Windows::TUNNEL)
    }

    pub fn with_windows(role: Role, windows: Windows) -> Mux {
        Mux {
            role,
            windows,
            streams: HashMap::default(),
            next_stream: 1,
            send_window: windows.connection,
            recv_window: windows.connection,
            recv_unacked: 0,
            blocked: false,
            gone_away: false,
            out: BytesMut::new(),
            events: VecDeque::new(),
        }
    }

    pub fn role(&self) -> Role {
        self.role
    }

    /// Streams whose state is held.
    pub fn open_streams(&self) -> usize {
        self.streams.len()
    }

    /// The frames to write to the peer, in order.
    pub fn take_output(&mut self) -> BytesMut {
        self.out.split()
    }

    /// Moves the frames to write to the peer onto the end of `to`. When `to` is empty the two
    /// buffers trade places, so a connection that writes everything it is given keeps reusing
    /// the same two allocations rather than growing a new one for every batch of frames.
    pub fn move_output(&mut self, to: &mut BytesMut) {
        if to.is_empty() {
            std::mem::swap(&mut self.out, to);
        } else {
            to.extend_from_slice(&self.out);
            self.out.clear();
        }
    }

    pub fn has_output(&self) -> bool {
        !self.out.is_empty()
    }

    pub fn poll_event(&mut self) -> Option<Event> {
        self.events.pop_front()
    }

    /// Client: opens a stream with its request head; `None` after the peer's GOAWAY.
    pub fn open(
        &mut self,
        method: Method,
        target: PathAndQuery,
        fields: HeaderMap,
        end: bool,
    ) -> Option<StreamId> {
        assert_eq!(self.role, Role::Client, "only the client opens streams");
        if self.gone_away {
            return None;
        }
        // 2^31 odd numbers: a stream still open after the ids went round once is skipped. The
        // peer cannot mistake a reused id for the old stream: both ends dropped it long before,
        // and frames arrive in order.
        let mut stream = self.next_stream;
        while self.streams.contains_key(&stream) {
            stream = stream.wrapping_add(2);
        }
        self.next_stream = stream.wrapping_add(2);
        wire::encode(
            &Frame::Request {
                stream,
                method,
                target,
                fields,
                end,
            },
            &mut self.out,
        );
        self.streams
            .insert(stream, Stream::new(end, self.windows.stream));
        Some(stream)
    }

    /// Server: the response head of `stream`.
    pub fn respond(
        &mut self,
        stream: StreamId,
        status: StatusCode,
        fields: HeaderMap,
        end: bool,
    ) -> Result<(), StreamClosed> {
        assert_eq!(self.role, Role::Server, "only the server responds");
        let state = self.streams.get_mut(&stream).ok_or(StreamClosed)?;
        if state.send_done {
            return Err(StreamClosed);
        }
        state.send_done = end;
        wire::encode(
            &Frame::Response {
                stream,
                status,
                fields,
                end,
            },
            &mut self.out,
        );
        self.forget_if_done(stream);
        Ok(())
    }

    /// Sends as much of `data` as the windows allow, taking it off the front; `end` goes with
    /// its last byte. What is left waits for an [`Event::Writable`] on this stream. An empty
    /// `data` with `end` sends just the end.
    pub fn send_data(
        &mut self,
        stream: StreamId,
        data: &mut Bytes,
        end: bool,
    ) -> Result<(), StreamClosed> {
        let state = self.streams.get_mut(&stream).ok_or(StreamClosed)?;
        if state.send_done {
            return Err(StreamClosed);
        }
        loop {
            let allowed = (state.send_window.min(self.send_window) as usize)
                .min(PAYLOAD_BYTES_MAX)
                .min(data.len());
            if allowed == 0 && !data.is_empty() {
                state.blocked = true;
                if self.send_window == 0 {
                    self.blocked = true;
                }
                return Ok(());
            }
            let piece = data.split_to(allowed);
            state.send_window -= allowed as u32;
            self.send_window -= allowed as u32;
            let last = end && data.is_empty();
            wire::encode(
                &Frame::Data {
                    stream,
                    data: piece,
                    end: last,
                },
                &mut self.out,
            );
            if data.is_empty() {
                state.send_done = last;
                break;
            }
        }
        self.forget_if_done(stream);
        Ok(())
    }

    /// The local side used `bytes` of `stream`'s received data: credit goes back once half a
    /// window has built up (for the stream while it still receives, always for the connection).
    pub fn consumed(&mut self, stream: StreamId, bytes: u32) {
        self.recv_unacked += bytes;
        if self.recv_unacked >= self.windows.connection / 2 {
            let credit = std::mem::take(&mut self.recv_unacked);
            self.recv_window += credit;
            wire::encode(
                &Frame::Credit {
                    stream: 0,
                    bytes: credit,
                },
                &mut self.out,
            );
        }
        let Some(state) = self.streams.get_mut(&stream) else {
            return;
        };
        state.recv_unacked += bytes;
        if !state.recv_done && state.recv_unacked >= self.windows.stream / 2 {
            let credit = std::mem::take(&mut state.recv_unacked);
            state.recv_window += credit;
            wire::encode(
                &Frame::Credit {
                    stream,
                    bytes: credit,
                },
                &mut self.out,
            );
        }
    }

    /// Resets `stream` (the local side gave up on it); its state goes at once.
    pub fn reset(&mut self, stream: StreamId, reason: u32) {
        if self.streams.remove(&stream).is_some() {
            wire::encode(&Frame::Reset { stream, reason }, &mut self.out);
        }
    }

    pub fn ping(&mut self, opaque: u64) {
        wire::encode(&Frame::Ping { opaque, ack: false }, &mut self.out);
    }

    /// Takes in every whole frame in `buf`; frames cut short stay for the next read.
    pub fn receive(&mut self, buf: &mut BytesMut) -> Result<(), MuxError> {
        while let Some(frame) = wire::decode(buf)? {
            self.receive_frame(frame)?;
        }
        Ok(())
    }

    fn receive_frame(&mut self, frame: Frame) -> Result<(), MuxError> {
        match frame {
            Frame::Request {
                stream,
                method,
                target,
                fields,
                end,
            } => {
                if self.role != Role::Server {
                    return Err(MuxError::Protocol("a request sent to the router"));
                }
                if stream % 2 == 0 || self.streams.contains_key(&stream) {
                    return Err(MuxError::Protocol("a request on an open or even stream"));
                }
                if self.streams.len() >= STREAMS_MAX {
                    wire::encode(
                        &Frame::Reset {
                            stream,
                            reason: REFUSED_STREAM,
                        },
                        &mut self.out,
                    );
                    return Ok(());
                }
                let mut state = Stream::new(false, self.windows.stream);
                state.recv_done = end;
                self.streams.insert(stream, state);
                self.events.push_back(Event::Request {
                    stream,
                    method,
                    target,
                    fields,
                    end,
                });
            }
            Frame::Response {
                stream,
                status,
                fields,
                end,
            } => {
                if self.role != Role::Client {
                    return Err(MuxError::Protocol("a response sent to the agent"));
                }
                // A stream this side reset meanwhile: its answer is dropped.
                let Some(state) = self.streams.get_mut(&stream) else {
                    return Ok(());
                };
                if state.recv_done {
                    return Err(MuxError::Protocol("a response after the stream's end"));
                }
                state.recv_done = end;
                self.events.push_back(Event::Response {
                    stream,
                    status,
                    fields,
                    end,
                });
                self.forget_if_done(stream);
            }
            Frame::Data { stream, data, end } => {
                let length = data.len() as u32;
                if length > self.recv_window {
                    return Err(MuxError::Protocol("data beyond the connection's window"));
                }
                self.recv_window -= length;
                let Some(state) = self.streams.get_mut(&stream) else {
                    // Reset meanwhile: the bytes still count on the connection; credit them.
                    self.consumed(stream, length);
                    return Ok(());
                };
                if state.recv_done {
                    return Err(MuxError::Protocol("data after the stream's end"));
                }
                if length > state.recv_window {
                    return Err(MuxError::Protocol("data beyond the stream's window"));
                }
                state.recv_window -= length;
                state.recv_done = end;
                self.events.push_back(Event::Data { stream, data, end });
                self.forget_if_done(stream);
            }
            Frame::Reset { stream, reason } => {
                if self.streams.remove(&stream).is_some() {
                    self.events.push_back(Event::Reset { stream, reason });
                }
            }
            Frame::Credit { stream: 0, bytes } => {
                self.send_window = self
                    .send_window
                    .checked_add(bytes)
                    .filter(|window| *window <= self.windows.connection)
                    .ok_or(MuxError::Protocol("connection credit beyond its window"))?;
                if std::mem::take(&mut self.blocked) {
                    for (stream, state) in &mut self.streams {
                        if std::mem::take(&mut state.blocked) {
                            self.events.push_back(Event::Writable { stream: *stream });
                        }
                    }
                }
            }
            Frame::Credit { stream, bytes } => {
                let Some(state) = self.streams.get_mut(&stream) else {
                    return Ok(());
                };
                state.send_window = state
                    .send_window
                    .checked_add(bytes)
                    .filter(|window| *window <= self.windows.stream)
                    .ok_or(MuxError::Protocol("stream credit beyond its window"))?;
                if std::mem::take(&mut state.blocked) {
                    self.events.push_back(Event::Writable { stream });
                }
            }
            Frame::Ping { opaque, ack: false } => {
                wire::encode(&Frame::Ping { opaque, ack: true }, &mut self.out);
            }
            Frame::Ping { opaque, ack: true } => self.events.push_back(Event::Pong { opaque }),
            Frame::GoAway {
                last_stream,
                reason,
            } => {
                self.gone_away = true;
                self.events.push_back(Event::GoAway {
                    last_stream,
                    reason,
                });
            }
        }
        Ok(())
    }

    /// Drops a stream's state once both directions ended.
    fn forget_if_done(&mut self, stream: StreamId) {
        if self
            .streams
            .get(&stream)
            .is_some_and(|state| state.send_done && state.recv_done)
        {
            self.streams.remove(&stream);
        }
    }
}

impl Stream {
    fn new(send_done: bool, window: u32) -> Stream {
        Stream {
            send_done,
            recv_done: false,
            send_window: window,
            recv_window: window,
            recv_unacked: 0,
            blocked: false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn target() -> PathAndQuery {
        PathAndQuery::from_static("/v1/chat/completions")
    }

    /// Moves everything `from` wrote into `to`, and returns the events `to` raised.
    fn deliver(from: &mut Mux, to: &mut Mux) -> Vec<Event> {
        let mut bytes = from.take_output();
        to.receive(&mut bytes).unwrap();
        assert!(bytes.is_empty());
        std::iter::from_fn(|| to.poll_event()).collect()
    }

    #[test]
    fn a_request_and_its_answer_cross_and_leave_no_state() {
        let (mut router, mut agent) = (Mux::new(Role::Client), Mux::new(Role::Server));
        let stream = router
            .open(Method::POST, target(), HeaderMap::new(), false)
            .unwrap();
        router
            .send_data(stream, &mut Bytes::from_static(b"{}"), true)
            .unwrap();
        let events = deliver(&mut router, &mut agent);
        assert!(matches!(
            events[0],
            Event::Request {
                stream: 1,
                end: false,
                ..
            }
        ));
        assert_eq!(
            events[1],
            Event::Data {
                stream,
                data: Bytes::from_static(b"{}"),
                end: true
            }
        );
        agent.consumed(stream, 2);
        agent
            .respond(stream, StatusCode::OK, HeaderMap::new(), false)
            .unwrap();
        agent
            .send_data(stream, &mut Bytes::from_static(b"ok"), true)
            .unwrap();
        assert_eq!(agent.open_streams(), 0, "both directions ended");
        let events = deliver(&mut agent, &mut router);
        assert!(matches!(
            events[0],
            Event::Response {
                status: StatusCode::OK,
                end: false,
                ..
            }
        ));
        assert!(matches!(events[1], Event::Data { end: true, .. }));
        assert_eq!(router.open_streams(), 0);
    }

    #[test]
    fn a_reset_reaches_the_peer_and_late_data_is_credited_to_the_connection() {
        // A stream window of half the connection's: one stream's late bytes are enough for
        // the connection's credit to go back.
        let windows = Windows {
            stream: 128,
            connection: 256,
        };
        let (mut router, mut agent) = (
            Mux::with_windows(Role::Client, windows),
            Mux::with_windows(Role::Server, windows),
        );
        let stream = router
            .open(Method::POST, target(), HeaderMap::new(), true)
            .unwrap();
        deliver(&mut router, &mut agent);
        agent
            .respond(stream, StatusCode::OK, HeaderMap::new(), false)
            .unwrap();
        let mut big = Bytes::from(vec![7u8; 200]);
        agent.send_data(stream, &mut big, false).unwrap();
        // The router's client left before any of it arrived.
        router.reset(stream, CANCEL);
        assert_eq!(router.open_streams(), 0);
        assert!(
            deliver(&mut agent, &mut router)
                .iter()
                .all(|event| !matches!(event, Event::Data { .. }))
        );
        assert_eq!(
            deliver(&mut router, &mut agent),
            vec![Event::Reset {
                stream,
                reason: CANCEL
            }]
        );
        assert_eq!(agent.open_streams(), 0);
        assert_eq!(
            agent.send_window, 256,
            "the dropped bytes came back as credit"
        );
    }

    #[test]
    fn stream_ids_go_round_skipping_open_streams_and_a_duplicate_is_refused() {
        let (mut router, mut agent) = (Mux::new(Role::Client), Mux::new(Role::Server));
        let first = router
            .open(Method::POST, target(), HeaderMap::new(), true)
            .unwrap();
        deliver(&mut router, &mut agent);
        // Two billion streams later, the ids are about to go round; stream 1 is still open.
        router.next_stream = u32::MAX;
        let last = router
            .open(Method::POST, target(), HeaderMap::new(), true)
            .unwrap();
        let wrapped = router
            .open(Method::POST, target(), HeaderMap::new(), true)
            .unwrap();
        assert_eq!((first, last, wrapped), (1, u32::MAX, 3));
        assert_eq!(deliver(&mut router, &mut agent).len(), 2);
        // Stream 1 ends on both sides; its id is free again on the next round.
        agent
            .respond(first, StatusCode::OK, HeaderMap::new(), true)
            .unwrap();
        deliver(&mut agent, &mut router);
        router.next_stream = 1;
        assert_eq!(
            router.open(Method::POST, target(), HeaderMap::new(), true),
            Some(1)
        );
        assert_eq!(deliver(&mut router, &mut agent).len(), 1);
        // A request on a stream the agent still has open breaks the protocol.
        let mut duplicate = BytesMut::new();
        wire::encode(
            &Frame::Request {
                stream: 3,
                method: Method::POST,
                target: target(),
                fields: HeaderMap::new(),
                end: true,
            },
            &mut duplicate,
        );
        assert!(matches!(
            agent.receive(&mut duplicate),
            Err(MuxError::Protocol(_))
        ));
    }

    #[test]
    fn a_connection_writing_everything_reuses_two_buffers() {
        use bytes::Buf;
        let mut router = Mux::new(Role::Client);
        let mut write = BytesMut::new();
        let mut starts = Vec::new();
        for _ in 0..6 {
            router.open(Method::POST, target(), HeaderMap::new(), true);
            router.move_output(&mut write);
            starts.push(write.as_ptr());
            // The socket took all of it.
            write.advance(write.len());
        }
        // The first two rounds allocate a buffer each; from then on they take turns.
        assert_ne!(starts[0], starts[1]);
        assert_eq!(&starts[2..], &[starts[0], starts[1], starts[0], starts[1]]);
        // Output waiting behind unwritten bytes goes after them, in order.
        router.open(Method::POST, target(), HeaderMap::new(), true);
        router.move_output(&mut write);
        let unwritten = write.len();
        router.open(Method::POST, target(), HeaderMap::new(), true);
        router.move_output(&mut write);
        assert_eq!(write.len(), 2 * unwritten);
        assert!(!router.has_output());
    }

    #[test]
    fn a_full_server_refuses_a_stream_with_a_reset() {
        let (mut router, mut agent) = (Mux::new(Role::Client), Mux::new(Role::Server));
        for _ in 0..=STREAMS_MAX {
            router.open(Method::POST, target(), HeaderMap::new(), false);
        }
        let events = deliver(&mut router, &mut agent);
        assert_eq!(events.len(), STREAMS_MAX);
        let refused = deliver(&mut agent, &mut router);
        assert_eq!(
            refused,
            vec![Event::Reset {
                stream: 2 * STREAMS_MAX as u32 + 1,
                reason: REFUSED_STREAM
            }]
        );
    }

    #[test]
    fn pings_are_answered_and_a_goaway_stops_new_streams() {
        let (mut router, mut agent) = (Mux::new(Role::Client), Mux::new(Role::Server));
        router.ping(42);
        assert!(deliver(&mut router, &mut agent).is_empty());
        assert_eq!(
            deliver(&mut agent, &mut router),
            vec![Event::Pong { opaque: 42 }]
        );
        let mut bytes = BytesMut::new();
        wire::encode(
            &Frame::GoAway {
                last_stream: 0,
                reason: 0,
            },
            &mut bytes,
        );
        router.receive(&mut bytes).unwrap();
        assert!(
            router
                .open(Method::GET, target(), HeaderMap::new(), true)
                .is_none()
        );
    }

    #[test]
    fn data_beyond_a_window_is_a_protocol_error() {
        let mut agent = Mux::new(Role::Server);
        let mut bytes = BytesMut::new();
        wire::encode(
            &Frame::Request {
                stream: 1,
                method: Method::POST,
                target: target(),
                fields: HeaderMap::new(),
                end: false,
            },
            &mut bytes,
        );
        let piece = Bytes::from(vec![0u8; PAYLOAD_BYTES_MAX]);
        for _ in 0..=(STREAM_WINDOW as usize / PAYLOAD_BYTES_MAX) {
            wire::encode(
                &Frame::Data {
                    stream: 1,
                    data: piece.clone(),
                    end: false,
                },
                &mut bytes,
            );
        }
        assert_eq!(
            agent.receive(&mut bytes),
            Err(MuxError::Protocol("data beyond the stream's window"))
        );
    }

    /// One step of a random exchange between a router and an agent.
    #[derive(Debug, Clone)]
    enum Step {
        /// The router opens a stream with a body of this size.
        Open(usize),
        /// The agent answers its oldest unanswered stream with a body of this size.
        Answer(usize),
        /// A side consumes what it received on one of its streams (by index).
        ConsumeAtRouter(usize),
        ConsumeAtAgent(usize),
        /// The router resets one of its streams (by index).
        Reset(usize),
        /// Frames move: router to agent, or agent to router.
        ToAgent,
        ToRouter,
    }

    const SMALL: Windows = Windows {
        stream: 64,
        connection: 256,
    };

    fn step() -> impl Strategy<Value = Step> {
        prop_oneof![
            (0usize..300).prop_map(Step::Open),
            (0usize..300).prop_map(Step::Answer),
            any::<usize>().prop_map(Step::ConsumeAtRouter),
            any::<usize>().prop_map(Step::ConsumeAtAgent),
            any::<usize>().prop_map(Step::Reset),
            Just(Step::ToAgent),
            Just(Step::ToRouter),
        ]
    }

    /// One end of a random exchange: its mux, what it still has to send, what it received.
    struct End {
        mux: Mux,
        /// Bytes waiting for credit, and whether the end goes with them.
        sending: BTreeMap<StreamId, Bytes>,
        /// Per stream: bytes received, bytes consumed, ended.
        received: BTreeMap<StreamId, (usize, usize, bool)>,
        /// What this end sent on each stream.
        sent: BTreeMap<StreamId, usize>,
        reset: BTreeSet<StreamId>,
    }

    use std::collections::{BTreeMap, BTreeSet};

    impl End {
        fn new(role: Role) -> End {
            End {
                mux: Mux::with_windows(role, SMALL),
                sending: BTreeMap::new(),
                received: BTreeMap::new(),
                sent: BTreeMap::new(),
                reset: BTreeSet::new(),
            }
        }

        /// Takes in the peer's frames; returns the streams newly opened by the peer.
        fn absorb(&mut self, peer: &mut End) -> Vec<StreamId> {
            let mut opened = Vec::new();
            for event in deliver(&mut peer.mux, &mut self.mux) {
                match event {
                    Event::Request { stream, end, .. } => {
                        opened.push(stream);
                        self.received.insert(stream, (0, 0, end));
                    }
                    Event::Response { stream, end, .. } => {
                        self.received.entry(stream).or_default().2 = end;
                    }
                    Event::Data { stream, data, end } => {
                        let entry = self.received.entry(stream).or_default();
                        assert!(!entry.2, "data after the end");
                        entry.0 += data.len();
                        entry.2 = end;
                    }
                    Event::Reset { stream, .. } => {
                        self.reset.insert(stream);
                        self.sending.remove(&stream);
                    }
                    Event::Writable { stream } => {
                        if let Some(mut rest) = self.sending.remove(&stream)
                            && self.mux.send_data(stream, &mut rest, true).is_ok()
                            && !rest.is_empty()
                        {
                            self.sending.insert(stream, rest);
                        }
                    }
                    Event::Pong { .. } | Event::GoAway { .. } => {}
                }
            }
            opened
        }

        fn consume(&mut self, index: usize) {
            let streams: Vec<StreamId> = self.received.keys().copied().collect();
            if streams.is_empty() {
                return;
            }
            let stream = streams[index % streams.len()];
            let entry = self.received.get_mut(&stream).expect("listed");
            let fresh = entry.0 - entry.1;
            entry.1 = entry.0;
            self.mux.consumed(stream, fresh as u32);
        }

        fn send(&mut self, stream: StreamId, size: usize) {
            self.sent.insert(stream, size);
            let mut body = Bytes::from(vec![stream as u8; size]);
            if size > 0 {
                self.mux.send_data(stream, &mut body, true).unwrap();
            }
            if !body.is_empty() {
                self.sending.insert(stream, body);
            }
        }
    }

    struct Exchange {
        router: End,
        agent: End,
        unanswered: Vec<StreamId>,
    }

    impl Exchange {
        fn run(&mut self, step: Step) {
            match step {
                Step::Open(size) => {
                    let stream = self
                        .router
                        .mux
                        .open(Method::POST, target(), HeaderMap::new(), size == 0)
                        .unwrap();
                    self.router.send(stream, size);
                }
                Step::Answer(size) => {
                    if self.unanswered.is_empty() {
                        return;
                    }
                    let stream = self.unanswered.remove(0);
                    let answered =
                        self.agent
                            .mux
                            .respond(stream, StatusCode::OK, HeaderMap::new(), size == 0);
                    if answered.is_ok() {
                        self.agent.send(stream, size);
                    }
                }
                Step::ConsumeAtRouter(index) => self.router.consume(index),
                Step::ConsumeAtAgent(index) => self.agent.consume(index),
                Step::Reset(index) => {
                    let open: Vec<StreamId> = self
                        .router
                        .sent
                        .keys()
                        .copied()
                        .filter(|stream| !self.router.reset.contains(stream))
                        .collect();
                    if open.is_empty() {
                        return;
                    }
                    let stream = open[index % open.len()];
                    self.router.mux.reset(stream, CANCEL);
                    self.router.sending.remove(&stream);
                    self.router.reset.insert(stream);
                }
                Step::ToAgent => {
                    let opened = self.agent.absorb(&mut self.router);
                    self.unanswered.extend(opened);
                }
                Step::ToRouter => {
                    self.router.absorb(&mut self.agent);
                }
            }
        }

        /// Answers what is unanswered, then consumes and moves frames until nothing moves.
        fn settle(&mut self) {
            for _ in 0..10_000 {
                self.run(Step::ToAgent);
                if !self.unanswered.is_empty() {
                    self.run(Step::Answer(1));
                }
                self.run(Step::ToRouter);
                let streams = self.router.received.len().max(self.agent.received.len());
                for index in 0..streams {
                    self.router.consume(index);
                    self.agent.consume(index);
                }
                if !self.router.mux.has_output()
                    && !self.agent.mux.has_output()
                    && self.unanswered.is_empty()
                {
                    return;
                }
            }
            panic!("the exchange never settled");
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 256, .. ProptestConfig::default() })]

        /// Whatever the interleaving, each side receives exactly the bytes the other sent on
        /// the streams the router did not reset, with their ends, never beyond a window (a
        /// breach is a protocol error, which `deliver` unwraps); once all is delivered and
        /// consumed, no stream state is left on either side.
        #[test]
        fn random_exchanges_deliver_every_byte_within_the_windows(
            steps in prop::collection::vec(step(), 1..80),
        ) {
            let mut exchange = Exchange {
                router: End::new(Role::Client),
                agent: End::new(Role::Server),
                unanswered: Vec::new(),
            };
            for step in steps {
                exchange.run(step);
            }
            exchange.settle();
            let Exchange { router, agent, .. } = &exchange;
            for (stream, size) in &router.sent {
                if router.reset.contains(stream) {
                    continue;
                }
                let received = agent.received.get(stream).copied().unwrap_or_default();
                prop_assert_eq!(received.0, *size, "router -> agent, stream {}", stream);
                prop_assert!(received.2, "the end of stream {} reached the agent", stream);
            }
            for (stream, size) in &agent.sent {
                if router.reset.contains(stream) {
                    continue;
                }
                let received = router.received.get(stream).copied().unwrap_or_default();
                prop_assert_eq!(received.0, *size, "agent -> router, stream {}", stream);
                prop_assert!(received.2, "the end of stream {} reached the router", stream);
            }
            prop_assert_eq!(router.mux.open_streams(), 0);
            prop_assert_eq!(agent.mux.open_streams(), 0);
        }
    }
}
