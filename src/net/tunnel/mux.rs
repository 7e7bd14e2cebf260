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
///
/// Sized for an LLM site: one tunnel connection carries the streams of one router shard to one
/// agent, and a shard holds 10,000 streams open at once, each seconds to minutes long. The
/// router never opens more than the agent's `--capacity` per model (`routing::AgentLoad`), so
/// this only bounds a faulty router: each open stream costs the mux a 20-byte map entry and the
/// agent a request task (`docs/request-path.md`, "What an open stream holds"). At 1,024, a shard
/// in front of an agent of `--capacity 20000` had every stream past the 1,024th refused
/// (`perf/llm-load.sh`).
pub const STREAMS_MAX: usize = 16 * 1024;

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
mod tests;
