//! Response bytes for both wire dialects: OpenAI chat completions and Anthropic messages, whole or
//! as server-sent events. Pure: writes into a caller-owned buffer, takes ids and times as inputs.
//!
//! Everything is written by hand rather than through `serde_json` because every value is either a
//! number, a fixed literal, the generated text (only `tok ` words, nothing to escape) or the model
//! name, which is JSON-escaped once at start-up. The shapes follow the public API references
//! field for field, including OpenAI's `"choices":[]` usage chunk and Anthropic's event order.

use std::fmt::Write;

use bytes::BytesMut;

use crate::simulated_engine::request::{OutputPlan, StopReason};

/// The text of one simulated token. One short word, so an answer's length in bytes is
/// `TOKEN_TEXT.len() * tokens` and never needs JSON escaping.
pub const TOKEN_TEXT: &str = "tok ";

/// What every response carries about the request it answers.
#[derive(Debug, Clone, Copy)]
pub struct Answer<'a> {
    /// Process-unique serial, rendered as `chatcmpl-sim-N` or `msg_sim_N`.
    pub response_id: u64,
    pub created_unix_seconds: u64,
    /// The model name as a JSON string literal, quotes included.
    pub model_json: &'a str,
    pub prompt_tokens: u64,
    pub plan: OutputPlan,
}

fn openai_finish_reason(reason: StopReason) -> &'static str {
    match reason {
        StopReason::Natural => "stop",
        StopReason::TokenLimit => "length",
    }
}

fn anthropic_stop_reason(reason: StopReason) -> &'static str {
    match reason {
        StopReason::Natural => "end_turn",
        StopReason::TokenLimit => "max_tokens",
    }
}

fn push_text(out: &mut BytesMut, tokens: u64) {
    for _ in 0..tokens {
        out.extend_from_slice(TOKEN_TEXT.as_bytes());
    }
}

/// Writes formatted text; `BytesMut` grows as needed, so formatting cannot fail.
fn push_fmt(out: &mut BytesMut, arguments: std::fmt::Arguments<'_>) {
    out.write_fmt(arguments)
        .expect("writing into BytesMut cannot fail");
}

/// Non-stream OpenAI `chat.completion`.
pub fn openai_completion(out: &mut BytesMut, answer: &Answer<'_>) {
    let completion_tokens = answer.plan.output_tokens;
    push_fmt(
        out,
        format_args!(
            r#"{{"id":"chatcmpl-sim-{}","object":"chat.completion","created":{},"model":{},"choices":[{{"index":0,"message":{{"role":"assistant","content":""#,
            answer.response_id, answer.created_unix_seconds, answer.model_json
        ),
    );
    push_text(out, completion_tokens);
    push_fmt(
        out,
        format_args!(
            r#""}},"finish_reason":"{}"}}],"usage":{{"prompt_tokens":{},"completion_tokens":{},"total_tokens":{}}}}}"#,
            openai_finish_reason(answer.plan.stop_reason),
            answer.prompt_tokens,
            completion_tokens,
            answer.prompt_tokens + completion_tokens
        ),
    );
}

/// Non-stream Anthropic `message`.
pub fn anthropic_message(out: &mut BytesMut, answer: &Answer<'_>) {
    push_fmt(
        out,
        format_args!(
            r#"{{"id":"msg_sim_{}","type":"message","role":"assistant","model":{},"content":[{{"type":"text","text":""#,
            answer.response_id, answer.model_json
        ),
    );
    push_text(out, answer.plan.output_tokens);
    push_fmt(
        out,
        format_args!(
            r#""}}],"stop_reason":"{}","stop_sequence":null,"usage":{{"input_tokens":{},"output_tokens":{}}}}}"#,
            anthropic_stop_reason(answer.plan.stop_reason),
            answer.prompt_tokens,
            answer.plan.output_tokens
        ),
    );
}

/// The streaming events of one answer, in either dialect. A stream is: [`preamble`], one
/// [`token`] per generated token, then [`ending`].
///
/// [`preamble`]: StreamEvents::preamble
/// [`token`]: StreamEvents::token
/// [`ending`]: StreamEvents::ending
#[derive(Debug)]
pub enum StreamEvents {
    OpenAi {
        /// `data: {"id":..,"object":"chat.completion.chunk",..,"choices":[{"index":0,"delta":`,
        /// shared by every chunk of the stream and rendered once.
        chunk_prefix: BytesMut,
        include_usage: bool,
    },
    Anthropic,
}

impl StreamEvents {
    pub fn openai(answer: &Answer<'_>, include_usage: bool) -> StreamEvents {
        let mut chunk_prefix = BytesMut::with_capacity(160);
        push_fmt(
            &mut chunk_prefix,
            format_args!(
                r#"data: {{"id":"chatcmpl-sim-{}","object":"chat.completion.chunk","created":{},"model":{},"#,
                answer.response_id, answer.created_unix_seconds, answer.model_json
            ),
        );
        StreamEvents::OpenAi {
            chunk_prefix,
            include_usage,
        }
    }

    /// Events sent before the first token: OpenAI's role chunk; Anthropic's `message_start`,
    /// `content_block_start` and `ping`.
    pub fn preamble(&self, out: &mut BytesMut, answer: &Answer<'_>) {
        match self {
            StreamEvents::OpenAi {
                chunk_prefix,
                include_usage,
            } => {
                out.extend_from_slice(chunk_prefix);
                out.extend_from_slice(
                    br#""choices":[{"index":0,"delta":{"role":"assistant","content":""},"finish_reason":null}]"#,
                );
                close_openai_chunk(out, *include_usage);
            }
            StreamEvents::Anthropic => {
                push_fmt(
                    out,
                    format_args!(
                        "event: message_start\ndata: {{\"type\":\"message_start\",\"message\":{{\"id\":\"msg_sim_{}\",\"type\":\"message\",\"role\":\"assistant\",\"model\":{},\"content\":[],\"stop_reason\":null,\"stop_sequence\":null,\"usage\":{{\"input_tokens\":{},\"output_tokens\":1}}}}}}\n\n",
                        answer.response_id, answer.model_json, answer.prompt_tokens
                    ),
                );
                out.extend_from_slice(
                    b"event: content_block_start\ndata: {\"type\":\"content_block_start\",\"index\":0,\"content_block\":{\"type\":\"text\",\"text\":\"\"}}\n\n\
                      event: ping\ndata: {\"type\":\"ping\"}\n\n",
                );
            }
        }
    }

    /// One generated token.
    pub fn token(&self, out: &mut BytesMut) {
        match self {
            StreamEvents::OpenAi {
                chunk_prefix,
                include_usage,
            } => {
                out.extend_from_slice(chunk_prefix);
                push_fmt(
                    out,
                    format_args!(
                        r#""choices":[{{"index":0,"delta":{{"content":"{TOKEN_TEXT}"}},"finish_reason":null}}]"#
                    ),
                );
                close_openai_chunk(out, *include_usage);
            }
            StreamEvents::Anthropic => push_fmt(
                out,
                format_args!(
                    "event: content_block_delta\ndata: {{\"type\":\"content_block_delta\",\"index\":0,\"delta\":{{\"type\":\"text_delta\",\"text\":\"{TOKEN_TEXT}\"}}}}\n\n"
                ),
            ),
        }
    }

    /// Events after the last token: OpenAI's finish chunk, optional usage chunk and `[DONE]`;
    /// Anthropic's `content_block_stop`, `message_delta` and `message_stop`.
    pub fn ending(&self, out: &mut BytesMut, answer: &Answer<'_>) {
        let completion_tokens = answer.plan.output_tokens;
        match self {
            StreamEvents::OpenAi {
                chunk_prefix,
                include_usage,
            } => {
                out.extend_from_slice(chunk_prefix);
                push_fmt(
                    out,
                    format_args!(
                        r#""choices":[{{"index":0,"delta":{{}},"finish_reason":"{}"}}]"#,
                        openai_finish_reason(answer.plan.stop_reason)
                    ),
                );
                close_openai_chunk(out, *include_usage);
                if *include_usage {
                    out.extend_from_slice(chunk_prefix);
                    push_fmt(
                        out,
                        format_args!(
                            r#""choices":[],"usage":{{"prompt_tokens":{},"completion_tokens":{},"total_tokens":{}}}}}"#,
                            answer.prompt_tokens,
                            completion_tokens,
                            answer.prompt_tokens + completion_tokens
                        ),
                    );
                    out.extend_from_slice(b"\n\n");
                }
                out.extend_from_slice(b"data: [DONE]\n\n");
            }
            StreamEvents::Anthropic => {
                out.extend_from_slice(
                    b"event: content_block_stop\ndata: {\"type\":\"content_block_stop\",\"index\":0}\n\n",
                );
                push_fmt(
                    out,
                    format_args!(
                        "event: message_delta\ndata: {{\"type\":\"message_delta\",\"delta\":{{\"stop_reason\":\"{}\",\"stop_sequence\":null}},\"usage\":{{\"output_tokens\":{}}}}}\n\n",
                        anthropic_stop_reason(answer.plan.stop_reason),
                        completion_tokens
                    ),
                );
                out.extend_from_slice(
                    b"event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n",
                );
            }
        }
    }
}

/// OpenAI puts `"usage":null` on every chunk but the last when the client asked for usage.
fn close_openai_chunk(out: &mut BytesMut, include_usage: bool) {
    if include_usage {
        out.extend_from_slice(br#","usage":null}"#);
    } else {
        out.extend_from_slice(b"}");
    }
    out.extend_from_slice(b"\n\n");
}

#[cfg(test)]
mod tests {
    use super::*;

    fn answer(plan: OutputPlan) -> Answer<'static> {
        Answer {
            response_id: 7,
            created_unix_seconds: 1000,
            model_json: "\"m\"",
            prompt_tokens: 5,
            plan,
        }
    }

    fn json(out: &BytesMut) -> serde_json::Value {
        serde_json::from_slice(out).expect("rendered json must parse")
    }

    #[test]
    fn openai_completion_is_valid_json_with_usage() {
        let mut out = BytesMut::new();
        openai_completion(
            &mut out,
            &answer(OutputPlan {
                output_tokens: 2,
                stop_reason: StopReason::TokenLimit,
            }),
        );
        let value = json(&out);
        assert_eq!(value["id"], "chatcmpl-sim-7");
        assert_eq!(value["choices"][0]["message"]["content"], "tok tok ");
        assert_eq!(value["choices"][0]["finish_reason"], "length");
        assert_eq!(value["usage"]["total_tokens"], 7);
    }

    #[test]
    fn anthropic_message_is_valid_json_with_usage() {
        let mut out = BytesMut::new();
        anthropic_message(
            &mut out,
            &answer(OutputPlan {
                output_tokens: 1,
                stop_reason: StopReason::Natural,
            }),
        );
        let value = json(&out);
        assert_eq!(value["id"], "msg_sim_7");
        assert_eq!(value["content"][0]["text"], "tok ");
        assert_eq!(value["stop_reason"], "end_turn");
        assert_eq!(value["usage"]["input_tokens"], 5);
        assert_eq!(value["usage"]["output_tokens"], 1);
    }

    #[test]
    fn every_openai_stream_chunk_parses() {
        let answer = answer(OutputPlan {
            output_tokens: 2,
            stop_reason: StopReason::Natural,
        });
        let events = StreamEvents::openai(&answer, true);
        let mut out = BytesMut::new();
        events.preamble(&mut out, &answer);
        events.token(&mut out);
        events.token(&mut out);
        events.ending(&mut out, &answer);
        let text = std::str::from_utf8(&out).unwrap();
        let chunks: Vec<&str> = text.split_terminator("\n\n").collect();
        assert_eq!(chunks.len(), 6);
        assert_eq!(chunks[5], "data: [DONE]");
        for chunk in &chunks[..5] {
            let value: serde_json::Value =
                serde_json::from_str(chunk.strip_prefix("data: ").unwrap()).unwrap();
            assert_eq!(value["object"], "chat.completion.chunk");
        }
        let usage: serde_json::Value =
            serde_json::from_str(chunks[4].strip_prefix("data: ").unwrap()).unwrap();
        assert_eq!(usage["choices"], serde_json::json!([]));
        assert_eq!(usage["usage"]["completion_tokens"], 2);
    }

    #[test]
    fn every_anthropic_event_parses_and_names_its_type() {
        let answer = answer(OutputPlan {
            output_tokens: 1,
            stop_reason: StopReason::TokenLimit,
        });
        let events = StreamEvents::Anthropic;
        let mut out = BytesMut::new();
        events.preamble(&mut out, &answer);
        events.token(&mut out);
        events.ending(&mut out, &answer);
        let text = std::str::from_utf8(&out).unwrap();
        let mut names = Vec::new();
        for event in text.split_terminator("\n\n") {
            let (name_line, data_line) = event.split_once('\n').unwrap();
            let name = name_line.strip_prefix("event: ").unwrap();
            let value: serde_json::Value =
                serde_json::from_str(data_line.strip_prefix("data: ").unwrap()).unwrap();
            assert_eq!(value["type"], name);
            names.push(name.to_owned());
        }
        assert_eq!(
            names,
            [
                "message_start",
                "content_block_start",
                "ping",
                "content_block_delta",
                "content_block_stop",
                "message_delta",
                "message_stop"
            ]
        );
    }
}
