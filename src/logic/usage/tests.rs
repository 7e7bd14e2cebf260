//! Tests of `usage`: whole bodies, the splitter at every split point, the stream scanners and
//! their fast paths against the full parse.

mod bodies_and_streams {
    //! Proves usage is read exactly from realistic bodies and streams, whatever the chunking.
    use super::super::*;
    use bytes::Bytes;

    #[test]
    fn whole_body_openai_chat() {
        let body = br#"{"id":"c1","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"usage"}}],
            "usage":{"prompt_tokens":12,"completion_tokens":34,"total_tokens":46}}"#;
        assert_eq!(
            from_openai_chat(body),
            Some(Usage {
                input_tokens: 12,
                output_tokens: 34
            })
        );
        assert_eq!(from_openai_chat(br#"{"choices":[]}"#), None);
        assert_eq!(from_openai_chat(br#"{"usage":null}"#), None);
        assert_eq!(from_openai_chat(b"not json"), None);
        assert_eq!(
            from_openai_chat(br#"{"usage":{"prompt_tokens":3}}"#),
            Some(Usage {
                input_tokens: 3,
                output_tokens: 0
            })
        );
    }

    #[test]
    fn whole_body_embeddings_and_rerank() {
        let embeddings = br#"{"object":"list","data":[{"embedding":[0.1,-0.2]}],"usage":{"prompt_tokens":8,"total_tokens":8}}"#;
        assert_eq!(
            from_openai_embeddings(embeddings),
            Some(Usage {
                input_tokens: 8,
                output_tokens: 0
            })
        );
        let rerank =
            br#"{"results":[{"index":0,"relevance_score":0.9}],"usage":{"total_tokens":21}}"#;
        assert_eq!(
            from_openai_embeddings(rerank),
            Some(Usage {
                input_tokens: 21,
                output_tokens: 0
            })
        );
        assert_eq!(from_openai_embeddings(br#"{"usage":{}}"#), None);
    }

    #[test]
    fn whole_body_anthropic_counts_cache_as_input() {
        let body = br#"{"id":"msg_1","type":"message","content":[{"type":"text","text":"hi"}],
            "usage":{"input_tokens":10,"cache_creation_input_tokens":100,"cache_read_input_tokens":1000,"output_tokens":7}}"#;
        assert_eq!(
            from_anthropic_message(body),
            Some(Usage {
                input_tokens: 1110,
                output_tokens: 7
            })
        );
        assert_eq!(
            from_anthropic_message(
                br#"{"usage":{"input_tokens":5,"output_tokens":2,"cache_read_input_tokens":null}}"#
            ),
            Some(Usage {
                input_tokens: 5,
                output_tokens: 2
            })
        );
    }

    fn openai_stream(crlf: bool) -> Vec<u8> {
        let newline = if crlf { "\r\n" } else { "\n" };
        let mut events = vec![
            r#"data: {"id":"c1","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"role":"assistant","content":""}}],"usage":null}"#.to_owned(),
            ": keep-alive".to_owned(),
        ];
        for word in ["Hello", " wor", "ld", "\\n\\n", "\\\"usage\\\""] {
            events.push(format!(
                r#"data: {{"id":"c1","object":"chat.completion.chunk","choices":[{{"index":0,"delta":{{"content":"{word}"}}}}]}}"#
            ));
        }
        events.push(
            r#"data: {"id":"c1","choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}"#
                .to_owned(),
        );
        events.push(r#"data: {"id":"c1","choices":[],"usage":{"prompt_tokens":17,"completion_tokens":6,"total_tokens":23}}"#.to_owned());
        events.push("data: [DONE]".to_owned());
        let mut stream = Vec::new();
        for event in events {
            stream.extend_from_slice(event.as_bytes());
            stream.extend_from_slice(newline.as_bytes());
            stream.extend_from_slice(newline.as_bytes());
        }
        stream
    }

    /// Split `stream` at `cuts`, returning events and the final tail.
    fn split_at(stream: &[u8], cuts: &[usize]) -> (Vec<SseEvent>, Bytes) {
        let mut splitter = SseSplitter::new(1 << 20);
        let mut events = Vec::new();
        let mut previous = 0;
        for &cut in cuts.iter().chain(std::iter::once(&stream.len())) {
            let cut = cut.clamp(previous, stream.len());
            splitter.push(Bytes::copy_from_slice(&stream[previous..cut]));
            previous = cut;
            while let Some(event) = splitter.next_event().unwrap() {
                events.push(event);
            }
        }
        (events, splitter.take_tail())
    }

    /// Classifies with what the splitter found and, alongside, from the bytes alone: both must
    /// agree on every event.
    fn classify(events: &[SseEvent]) -> (Vec<OpenAiEvent>, Option<Usage>) {
        let mut scan = OpenAiStreamScan::new();
        let mut from_bytes = OpenAiStreamScan::new();
        let kinds = events
            .iter()
            .map(|event| {
                let kind = scan.scan_event(event);
                assert_eq!(from_bytes.scan(event), kind, "{event:?}");
                kind
            })
            .collect();
        assert_eq!(from_bytes.usage(), scan.usage());
        (kinds, scan.usage())
    }

    #[test]
    fn openai_stream_at_every_split_point() {
        for crlf in [false, true] {
            let stream = openai_stream(crlf);
            let (whole, tail) = split_at(&stream, &[]);
            assert!(tail.is_empty());
            assert_eq!(whole.len(), 10);
            let (kinds, usage) = classify(&whole);
            let usage_expected = Usage {
                input_tokens: 17,
                output_tokens: 6,
            };
            assert_eq!(kinds[0], OpenAiEvent::Data(None));
            assert_eq!(kinds[1], OpenAiEvent::Other);
            assert_eq!(
                kinds[6],
                OpenAiEvent::Data(None),
                "escaped \"usage\" in content"
            );
            assert_eq!(kinds[8], OpenAiEvent::UsageOnly(usage_expected));
            assert_eq!(kinds[9], OpenAiEvent::Done);
            assert_eq!(usage, Some(usage_expected));
            // One cut anywhere, and two cuts close together around CR/LF seams.
            for cut in 0..=stream.len() {
                for gap in [0, 1, 2, 3] {
                    let (events, tail) = split_at(&stream, &[cut, cut + gap]);
                    assert_eq!(events, whole, "cut {cut} gap {gap} crlf {crlf}");
                    assert!(tail.is_empty());
                }
            }
            // Byte at a time.
            let cuts: Vec<usize> = (0..stream.len()).collect();
            assert_eq!(split_at(&stream, &cuts).0, whole);
        }
    }

    #[test]
    fn events_inside_a_chunk_are_not_copied() {
        let chunk = Bytes::from_static(b"data: a\n\ndata: b\n\ndata: c");
        let mut splitter = SseSplitter::new(1024);
        splitter.push(chunk.clone());
        let first = splitter.next_event().unwrap().unwrap();
        let second = splitter.next_event().unwrap().unwrap();
        assert_eq!(first.as_ptr(), chunk.as_ptr());
        assert_eq!(&second[..], b"data: b\n\n");
        assert_eq!(second.as_ptr(), chunk[9..].as_ptr());
        assert_eq!(splitter.next_event().unwrap(), None);
        splitter.push(Bytes::from_static(b"\n\ndata: d\n\n"));
        assert_eq!(&splitter.next_event().unwrap().unwrap()[..], b"data: c\n\n");
        assert_eq!(&splitter.next_event().unwrap().unwrap()[..], b"data: d\n\n");
        assert_eq!(splitter.next_event().unwrap(), None);
    }

    /// The splitter says an event is one line only when it is, in every mode (fresh chunk,
    /// merged tail, straddling), and then the data read from the hint is the data read from the
    /// bytes.
    #[test]
    fn one_line_hint_is_only_given_to_one_line_events() {
        let stream: &[u8] =
            b"data: a\n\nevent: e\ndata: b\n\ndata: c\r\n\r\n: note\n\ndata: d\ndata: e\n\r\n";
        for cut in 0..=stream.len() {
            let (events, tail) = split_at(stream, &[cut]);
            assert!(tail.is_empty());
            assert_eq!(events.len(), 5);
            for event in &events {
                let lines = memchr::memchr_iter(b'\n', event).count();
                assert!(!event.one_line || lines == 2, "cut {cut}: {event:?}");
                let (mut hinted, mut plain) = (Vec::new(), Vec::new());
                assert_eq!(
                    event.data(&mut hinted),
                    event_data(event, &mut plain),
                    "cut {cut}: {event:?}"
                );
            }
            let (first, third) = (&events[0], &events[2]);
            if cut == 0 || cut >= 9 {
                assert!(first.one_line, "cut {cut}");
            }
            if cut <= 27 || cut >= 38 {
                assert!(third.one_line, "cut {cut}");
            }
        }
        // Two chunks pushed before draining: the merged tail gives the hint too.
        let mut splitter = SseSplitter::new(1024);
        splitter.push(Bytes::from_static(b"data: a\n\ndata:"));
        splitter.push(Bytes::from_static(b" b\n\n"));
        let merged = splitter.next_event().unwrap().unwrap();
        assert!(merged.one_line);
        assert_eq!(merged.data(&mut Vec::new()), Some(&b"a"[..]));
    }

    #[test]
    fn push_without_draining_keeps_order() {
        let mut splitter = SseSplitter::new(1024);
        splitter.push(Bytes::from_static(b"data: a\n\ndata: b"));
        splitter.push(Bytes::from_static(b"\n\ndata: c\n\n"));
        let mut events = Vec::new();
        while let Some(event) = splitter.next_event().unwrap() {
            events.push(event.into_bytes());
        }
        assert_eq!(events, ["data: a\n\n", "data: b\n\n", "data: c\n\n"]);
    }

    #[test]
    fn oversized_events_are_refused() {
        let mut splitter = SseSplitter::new(16);
        splitter.push(Bytes::from_static(b"data: 0123456789"));
        assert_eq!(splitter.next_event(), Ok(None));
        splitter.push(Bytes::from_static(b"abcdef"));
        assert_eq!(splitter.next_event(), Err(SseError::EventTooLarge));
    }

    #[test]
    fn event_data_reads_every_line_form() {
        let mut scratch = Vec::new();
        let cases: [(&[u8], Option<&[u8]>); 7] = [
            (b"data: {\"a\":1}\n\n", Some(b"{\"a\":1}")),
            (b"data:x", Some(b"x")),
            (
                b"event: e\r\ndata: one\r\ndata: two\r\n\r\n",
                Some(b"one\ntwo"),
            ),
            (b"id: 1\ndata: [DONE]\n", Some(b"[DONE]")),
            (b": comment\n\n", None),
            (b"", None),
            (b"data:\n\n", Some(b"")),
        ];
        for (event, data) in cases {
            assert_eq!(
                event_data(event, &mut scratch),
                data,
                "{:?}",
                String::from_utf8_lossy(event)
            );
        }
    }

    #[test]
    fn usage_on_content_chunks_and_multi_line_data() {
        let mut scan = OpenAiStreamScan::new();
        let event = br#"data: {"choices":[{"index":0,"delta":{"content":"x"}}],"usage":{"prompt_tokens":1,"completion_tokens":1}}

"#;
        assert_eq!(
            scan.scan(event),
            OpenAiEvent::Data(Some(Usage {
                input_tokens: 1,
                output_tokens: 1
            }))
        );
        let split_data = b"event: chunk\ndata: {\"choices\":[],\ndata: \"usage\":{\"prompt_tokens\":4,\"completion_tokens\":2}}\n\n";
        assert_eq!(
            scan.scan(split_data),
            OpenAiEvent::UsageOnly(Usage {
                input_tokens: 4,
                output_tokens: 2
            })
        );
        assert_eq!(
            scan.usage(),
            Some(Usage {
                input_tokens: 4,
                output_tokens: 2
            })
        );
        assert_eq!(
            scan.scan(b"data: {\"usage\": broken\n\n"),
            OpenAiEvent::Other
        );
        assert_eq!(scan.scan(b"event: ping\n\n"), OpenAiEvent::Other);
        assert_eq!(scan.scan(b"data:[DONE]\r\n\r\n"), OpenAiEvent::Done);
    }

    const ANTHROPIC_STREAM: &str = concat!(
        "event: message_start\n",
        r#"data: {"type":"message_start","message":{"id":"msg_1","type":"message","role":"assistant","content":[],"model":"claude","stop_reason":null,"usage":{"input_tokens":25,"cache_creation_input_tokens":3,"cache_read_input_tokens":100,"output_tokens":1}}}"#,
        "\n\n",
        "event: content_block_start\n",
        r#"data: {"type":"content_block_start","index":0,"content_block":{"type":"text","text":""}}"#,
        "\n\n",
        "event: ping\n",
        r#"data: {"type": "ping"}"#,
        "\n\n",
        "event: content_block_delta\n",
        r#"data: {"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"the \"usage\" is"}}"#,
        "\n\n",
        "event: content_block_stop\n",
        r#"data: {"type":"content_block_stop","index":0}"#,
        "\n\n",
        "event: message_delta\n",
        r#"data: {"type":"message_delta","delta":{"stop_reason":"end_turn","stop_sequence":null},"usage":{"output_tokens":9}}"#,
        "\n\n",
        "event: message_delta\n",
        r#"data: {"type":"message_delta","delta":{},"usage":{"output_tokens":15}}"#,
        "\n\n",
        "event: message_stop\n",
        r#"data: {"type":"message_stop"}"#,
        "\n\n",
    );

    #[test]
    fn anthropic_stream_at_every_split_point() {
        let stream = ANTHROPIC_STREAM.as_bytes();
        let expected = Usage {
            input_tokens: 128,
            output_tokens: 15,
        };
        for cut in 0..=stream.len() {
            let (events, tail) = split_at(stream, &[cut, cut + 1]);
            assert_eq!(events.len(), 8, "cut {cut}");
            assert!(tail.is_empty());
            let mut scan = AnthropicStreamScan::new();
            for event in &events {
                scan.scan(event);
            }
            assert_eq!(scan.usage(), Some(expected), "cut {cut}");
        }
    }

    #[test]
    fn anthropic_delta_with_input_replaces_input() {
        let mut scan = AnthropicStreamScan::new();
        assert_eq!(scan.usage(), None);
        scan.scan(br#"data: {"type":"message_start","message":{"usage":{"input_tokens":5,"output_tokens":1}}}"#);
        scan.scan(br#"data: {"type":"message_delta","usage":{"input_tokens":6,"cache_read_input_tokens":4,"output_tokens":3}}"#);
        assert_eq!(
            scan.usage(),
            Some(Usage {
                input_tokens: 10,
                output_tokens: 3
            })
        );
    }

    #[test]
    fn unterminated_tail_is_returned() {
        let (events, tail) = split_at(b"data: a\n\ndata: partial", &[3]);
        assert_eq!(events.len(), 1);
        assert_eq!(&events[0][..], b"data: a\n\n");
        assert_eq!(&tail[..], b"data: partial");
    }
}

mod null_usage_tests {
    use super::super::*;

    #[test]
    fn null_usage_members_are_not_parsed_as_usage() {
        let mut scan = OpenAiStreamScan::new();
        let chunk = b"data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"a\"}}],\"usage\" : null}\n\n";
        assert_eq!(scan.scan(chunk), OpenAiEvent::Data(None));
        let last = b"data: {\"choices\":[],\"usage\":{\"prompt_tokens\":3,\"completion_tokens\":4,\"total_tokens\":7}}\n\n";
        assert!(matches!(scan.scan(last), OpenAiEvent::UsageOnly(_)));
        assert_eq!(scan.usage().unwrap().output_tokens, 4);
        assert!(is_null_member(b":null}"));
        assert!(!is_null_member(b":{\"prompt_tokens\":1}"));
        assert!(!is_null_member(b"}"));
    }

    #[test]
    fn a_trailing_null_usage_member_is_read_from_the_end() {
        for data in [
            &br#"{"id":"c","choices":[{"index":0,"delta":{"content":"x"}}],"usage":null}"#[..],
            br#"{"choices": [], "usage" : null }"#,
            br#"{"usage":null}"#,
        ] {
            assert!(
                ends_with_null_usage(data),
                "{}",
                String::from_utf8_lossy(data)
            );
            assert_eq!(classified_by_parse(data), OpenAiEvent::Data(None));
        }
        for data in [
            // Nested, not the top-level member.
            &br#"{"choices":[],"x":{"usage":null}}"#[..],
            // A key that ends in an escaped quote and `usage`: not `usage`.
            br#"{"usage":{"prompt_tokens":1},"k"usage":null}"#,
            br#"{"choices":[],"usage":{"prompt_tokens":1}}"#,
            br#"{"choices":[],"usage":null"#,
            br#"usage":null}"#,
        ] {
            assert!(
                !ends_with_null_usage(data),
                "{}",
                String::from_utf8_lossy(data)
            );
        }
        // Usage named twice at the top level: the full parse refuses the chunk (no usage either
        // way), and the trailing null settles it as an ordinary chunk; both are forwarded.
        let twice = br#"{"usage":{"prompt_tokens":5},"choices":[],"usage":null}"#;
        assert_eq!(classified_by_parse(twice), OpenAiEvent::Other);
        let mut scan = OpenAiStreamScan::new();
        let event = [&b"data: "[..], twice, b"\n\n"].concat();
        assert_eq!(scan.scan(&event), OpenAiEvent::Data(None));
        assert_eq!(scan.usage(), None);
    }

    /// What the full parse makes of one chunk's data: the reference the fast path must match.
    fn classified_by_parse(data: &[u8]) -> OpenAiEvent {
        let Ok(chunk) = serde_json::from_slice::<OpenAiChunk>(data) else {
            return OpenAiEvent::Other;
        };
        match chunk.usage.as_ref().map(OpenAiUsage::chat) {
            None => OpenAiEvent::Data(None),
            Some(usage) if chunk.choices.is_none_or(|choices| choices.is_empty()) => {
                OpenAiEvent::UsageOnly(usage)
            }
            Some(usage) => OpenAiEvent::Data(Some(usage)),
        }
    }

    #[test]
    fn usage_chunks_read_without_a_full_parse_match_the_full_parse() {
        const USAGE: &str = r#"{"prompt_tokens":5,"completion_tokens":18,"total_tokens":23}"#;
        // (data, whether the fast path must take it)
        let cases = [
            (
                format!(r#"{{"id":"c","choices":[],"usage":{USAGE}}}"#),
                true,
            ),
            (
                format!(
                    r#"{{"choices":[{{"index":0,"delta":{{"content":"x"}}}}],"usage":{USAGE}}}"#
                ),
                true,
            ),
            (format!(r#"{{"id":"c","usage":{USAGE}}}"#), true),
            (format!(r#"{{"choices":null,"usage":{USAGE}}}"#), true),
            (format!(r#"{{"choices" : [ ] , "usage" : {USAGE} }}"#), true),
            (
                format!(r#"{{"choices":[ {{"index":0}} ],"usage":{USAGE}}}"#),
                true,
            ),
            // Not plainly shaped: the full parse decides.
            (format!(r#"{{"usage":{USAGE},"choices":[]}}"#), false),
            (
                format!(r#"{{"choices":[{{"delta":{{"content":"choices"}}}}],"usage":{USAGE}}}"#),
                false,
            ),
            (
                format!(r#"{{"choices":[{{"delta":{{"usage":{USAGE}}}}}],"usage":null}}"#),
                false,
            ),
            (
                format!(r#"{{"choices":[{{"delta":{{"usage":{USAGE}}}}}]}}"#),
                false,
            ),
            (format!(r#"{{"choices":"none","usage":{USAGE}}}"#), false),
            (
                r#"{"choices":[],"usage":{"prompt_tokens":"five"}}"#.to_owned(),
                false,
            ),
            (r#"{"choices":[],"usage":[1]}"#.to_owned(), false),
            // Escaped keys inside a string are not keys.
            (
                format!(
                    r#"{{"choices":[{{"delta":{{"content":"\"choices\":[]"}}}}],"usage":{USAGE}}}"#
                ),
                true,
            ),
        ];
        for (data, fast) in &cases {
            let data = data.as_bytes();
            let taken = first_usage_object(data).and_then(|at| usage_chunk_fast(data, at));
            assert_eq!(taken.is_some(), *fast, "{}", String::from_utf8_lossy(data));
            let event = format!("data: {}\n\n", String::from_utf8_lossy(data));
            assert_eq!(
                OpenAiStreamScan::new().scan(event.as_bytes()),
                classified_by_parse(data),
                "{}",
                String::from_utf8_lossy(data)
            );
        }
    }

    /// Every line form `event_data` reads, against a plain reference of WHATWG's rule: the fast
    /// path for one-line events must not change what any event's data is.
    #[test]
    fn event_data_matches_the_line_by_line_rule() {
        fn reference(event: &[u8]) -> Option<Vec<u8>> {
            let mut lines = Vec::new();
            for line in event.split(|&byte| byte == b'\n') {
                let line = line.strip_suffix(b"\r").unwrap_or(line);
                if let Some(value) = line.strip_prefix(b"data:") {
                    lines.push(value.strip_prefix(b" ").unwrap_or(value).to_vec());
                }
            }
            (!lines.is_empty()).then(|| lines.join(&b'\n'))
        }
        let events: [&[u8]; 14] = [
            b"data: x\n\n",
            b"data:x\n\n",
            b"data:  x\n\n",
            b"data: x\r\n\r\n",
            b"data: x\n\r\n",
            b"data: x\r\n",
            b"data: x\n",
            b"data: x",
            b"data:\n\n",
            b"data: a\ndata: b\n\n",
            b"data: a\n: comment\n\n",
            b"event: e\ndata: a\n\n",
            b": only a comment\n\n",
            b"data: a\r\ndata: b\r\n\r\n",
        ];
        for event in events {
            let mut scratch = Vec::new();
            assert_eq!(
                event_data(event, &mut scratch).map(<[u8]>::to_vec),
                reference(event),
                "{}",
                String::from_utf8_lossy(event)
            );
        }
    }
}

mod usage_object_tests {
    use super::super::*;

    /// serde_json's reading of a usage object and the bytes it took: the reference.
    fn by_serde<U: UsageCounts>(object: &[u8]) -> Option<(U, usize)> {
        let mut values = serde_json::Deserializer::from_slice(object).into_iter::<U>();
        let usage = values.next()?.ok()?;
        Some((usage, values.byte_offset()))
    }

    #[test]
    fn usage_objects_read_in_one_pass_are_read_as_serde_reads_them() {
        // (object, whether the one-pass read must take it rather than leave it to serde)
        let cases: [(&[u8], bool); 16] = [
            (br#"{"prompt_tokens":5,"completion_tokens":16,"total_tokens":21}"#, true),
            (br#"{ "prompt_tokens" : 5 , "total_tokens" : 21 }"#, true),
            (br#"{"prompt_tokens":5,"completion_tokens":null}"#, true),
            (br#"{}"#, true),
            (br#"{"prompt_tokens":5,"prompt_tokens_details":{"cached_tokens":0},"completion_tokens":2}"#, true),
            (br#"{"input_tokens":3,"service_tier":"standard","output_tokens":4}"#, true),
            (br#"{"prompt_tokens":5}}"#, true),
            // Left to serde, which accepts or refuses each as it always did.
            (br#"{"prompt_tokens":5,"prompt_tokens":6}"#, false),
            (br#"{"prompt_tokens":5.0}"#, false),
            (br#"{"prompt_tokens":-1}"#, false),
            (br#"{"prompt_tokens":"5"}"#, false),
            (br#"{"prompt_tokens":99999999999999999999}"#, false),
            (br#"{"prompt_tokens":5,"extra":[1,2]}"#, false),
            (br#"{"prompt_tokens":5,"extra":true}"#, false),
            (br#"{"prompt\u005ftokens":5}"#, false),
            (br#"{"prompt_tokens":5"#, false),
        ];
        for (object, plain) in cases {
            let text = String::from_utf8_lossy(object);
            let flat = read_usage_flat::<OpenAiUsage>(object).is_some();
            assert_eq!(flat, plain, "{text}");
            assert_eq!(
                read_usage::<OpenAiUsage>(object),
                by_serde::<OpenAiUsage>(object),
                "{text}"
            );
            assert_eq!(
                read_usage::<AnthropicUsage>(object),
                by_serde::<AnthropicUsage>(object),
                "{text}"
            );
        }
    }

    #[test]
    fn fast_path_ignores_usage_inside_strings_and_falls_back() {
        let body = br#"{"choices":[{"message":{"content":"say \"usage\": {\"prompt_tokens\":99}"}}],"usage":{"prompt_tokens":3,"completion_tokens":4}}"#;
        let usage = from_openai_chat(body).unwrap();
        assert_eq!((usage.input_tokens, usage.output_tokens), (3, 4));
        // Usage not last, and a trailing member after it.
        let body = br#"{"usage":{"prompt_tokens":5,"completion_tokens":6},"id":"x"}"#;
        let usage = from_openai_chat(body).unwrap();
        assert_eq!((usage.input_tokens, usage.output_tokens), (5, 6));
        // The last "usage" is a string value: the full parse still finds the object.
        let body = br#"{"usage":{"prompt_tokens":1,"completion_tokens":2},"note":"usage"}"#;
        assert_eq!(from_openai_chat(body).unwrap().output_tokens, 2);
        assert_eq!(from_openai_chat(br#"{"usage":null}"#), None);
        assert_eq!(from_openai_chat(b"not json"), None);
    }
}
