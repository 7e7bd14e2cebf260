//! The response body type: a complete buffer, or a live generation streamed as server-sent events.
//!
//! A streamed answer is generated while hyper polls the body, one frame per delay: with zero
//! `--ttft`/`--itl` the whole stream is one frame, with delays one frame per token. Headers go out
//! at admission; the first body bytes (OpenAI's role chunk, Anthropic's `message_start`) come with
//! the first token, one time to first token later (`--ttft` plus the prefill of the prompt tokens
//! the prefix cache did not hold). The
//! [`Generation`] guard lives inside the body, so when the client disconnects hyper drops the body,
//! generation stops, the concurrency permit is released and the request counts as cancelled.

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll, ready};
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use hyper::body::{Body, Frame, SizeHint};
use tokio::time::{Instant, Sleep};

use crate::simulated_engine::engine::Generation;
use crate::simulated_engine::render::{Answer, StreamEvents};

/// Every response body the simulator sends.
#[derive(Debug)]
pub enum SimBody {
    /// A complete body; `None` once sent.
    Complete(Option<Bytes>),
    Stream(Box<GenerationStream>),
}

impl SimBody {
    pub fn complete(bytes: impl Into<Bytes>) -> SimBody {
        SimBody::Complete(Some(bytes.into()))
    }
}

impl Body for SimBody {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        self: Pin<&mut Self>,
        context: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        match self.get_mut() {
            SimBody::Complete(bytes) => {
                Poll::Ready(bytes.take().map(|bytes| Ok(Frame::data(bytes))))
            }
            SimBody::Stream(stream) => stream
                .poll_next(context)
                .map(|bytes| bytes.map(|bytes| Ok(Frame::data(bytes)))),
        }
    }

    fn is_end_stream(&self) -> bool {
        matches!(self, SimBody::Complete(None))
    }

    fn size_hint(&self) -> SizeHint {
        match self {
            SimBody::Complete(bytes) => {
                SizeHint::with_exact(bytes.as_ref().map_or(0, |bytes| bytes.len() as u64))
            }
            SimBody::Stream(_) => SizeHint::default(),
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    Preamble,
    Tokens,
    Done,
}

/// The delays of a simulated generation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Pacing {
    /// Before the first token, from admission: `--ttft`, plus the request's prefill once
    /// [`with_prefill`](Pacing::with_prefill) has added it.
    pub time_to_first_token: Duration,
    /// Between consecutive tokens (`--itl`).
    pub inter_token_latency: Duration,
}

impl Pacing {
    /// This pacing for a request with `uncached_prompt_tokens` prompt tokens to prefill: the first
    /// token comes `prefill_per_token` (`--prefill-per-token`) later for each of them. Saturates
    /// instead of overflowing.
    pub fn with_prefill(self, prefill_per_token: Duration, uncached_prompt_tokens: u64) -> Pacing {
        let tokens = u32::try_from(uncached_prompt_tokens).unwrap_or(u32::MAX);
        Pacing {
            time_to_first_token: self
                .time_to_first_token
                .saturating_add(prefill_per_token.saturating_mul(tokens)),
            ..self
        }
    }
}

/// A streamed answer being generated.
#[derive(Debug)]
pub struct GenerationStream {
    /// `None` once every token is generated: the permit and KV share are released at that point,
    /// as an engine frees a sequence when it finishes, not when the client reads the last byte.
    generation: Option<Generation<'static>>,
    answer: Answer<'static>,
    events: StreamEvents,
    pacing: Pacing,
    generated_tokens: u64,
    phase: Phase,
    /// The pending delay, if any; reused across tokens to avoid a timer allocation per token.
    delay: Option<Pin<Box<Sleep>>>,
    delay_armed: bool,
    buffer: BytesMut,
}

impl GenerationStream {
    /// Must be called inside the runtime: the time-to-first-token delay starts now, at admission.
    pub fn new(
        generation: Generation<'static>,
        answer: Answer<'static>,
        events: StreamEvents,
        pacing: Pacing,
    ) -> GenerationStream {
        let mut stream = GenerationStream {
            generation: Some(generation),
            answer,
            events,
            pacing,
            generated_tokens: 0,
            phase: Phase::Preamble,
            delay: None,
            delay_armed: false,
            buffer: BytesMut::new(),
        };
        // The preamble waits for the first token, as in vLLM, whose first chunk (the role delta)
        // is sent when prefill completes: a client's time to first byte is the time to first token.
        if !pacing.time_to_first_token.is_zero() && answer.plan.output_tokens > 0 {
            stream.arm_delay(pacing.time_to_first_token);
        }
        stream
    }

    fn arm_delay(&mut self, duration: Duration) {
        let deadline = Instant::now() + duration;
        match &mut self.delay {
            Some(delay) => delay.as_mut().reset(deadline),
            None => self.delay = Some(Box::pin(tokio::time::sleep_until(deadline))),
        }
        self.delay_armed = true;
    }

    fn take_buffer(&mut self) -> Option<Bytes> {
        (!self.buffer.is_empty()).then(|| self.buffer.split().freeze())
    }

    /// Generates until the next delay or the end, and returns what was produced as one frame.
    fn poll_next(&mut self, context: &mut Context<'_>) -> Poll<Option<Bytes>> {
        loop {
            if self.delay_armed {
                let delay = self.delay.as_mut().expect("an armed delay exists");
                ready!(delay.as_mut().poll(context));
                self.delay_armed = false;
            }
            match self.phase {
                Phase::Preamble => {
                    self.events.preamble(&mut self.buffer, &self.answer);
                    self.phase = Phase::Tokens;
                }
                Phase::Tokens if self.generated_tokens < self.answer.plan.output_tokens => {
                    self.events.token(&mut self.buffer);
                    self.generated_tokens += 1;
                    if let Some(generation) = &mut self.generation {
                        generation.advance(1);
                    }
                    let inter_token_latency = self.pacing.inter_token_latency;
                    if !inter_token_latency.is_zero()
                        && self.generated_tokens < self.answer.plan.output_tokens
                    {
                        self.arm_delay(inter_token_latency);
                        return Poll::Ready(self.take_buffer());
                    }
                }
                Phase::Tokens => {
                    self.events.ending(&mut self.buffer, &self.answer);
                    if let Some(generation) = self.generation.take() {
                        generation.finish();
                    }
                    self.phase = Phase::Done;
                    return Poll::Ready(self.take_buffer());
                }
                Phase::Done => return Poll::Ready(None),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefill_adds_to_the_time_to_first_token_only() {
        let base = Pacing {
            time_to_first_token: Duration::from_millis(5),
            inter_token_latency: Duration::from_millis(2),
        };
        let paced = base.with_prefill(Duration::from_millis(1), 30);
        assert_eq!(paced.time_to_first_token, Duration::from_millis(35));
        assert_eq!(paced.inter_token_latency, Duration::from_millis(2));
        assert_eq!(base.with_prefill(Duration::from_millis(1), 0), base);
        assert_eq!(base.with_prefill(Duration::ZERO, 1000), base);
        assert_eq!(
            base.with_prefill(Duration::MAX, u64::MAX)
                .time_to_first_token,
            Duration::MAX
        );
    }
}
