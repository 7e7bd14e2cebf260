//! Body-field and prompt extraction (`http::fields`, `http::prompt`): the one serde pass over a
//! client's JSON body, and the `include_usage` rewrite of a streaming body.
//!
//! Asserts:
//! - `extract_fields` never panics; an accepted body has a non-empty model of at most
//!   `MODEL_CHARS_MAX` characters;
//! - the prompt's counted bytes (unescaped text plus raw tool JSON) never exceed the body: no
//!   byte of the body is counted twice;
//! - a rewritten body (`request_with_include_usage`) is accepted again, asks for usage, names the
//!   same model, still streams, and has the same messages and images; a rewritten body needs no
//!   second rewrite.
#![no_main]

use hivenet_router::wire::http::fields::{self, MODEL_CHARS_MAX};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|body: &[u8]| {
    let Ok(found) = fields::extract_fields(body) else {
        return;
    };
    assert!(!found.model.is_empty());
    assert!(found.model.chars().count() <= MODEL_CHARS_MAX);
    let prompt = found.prompt;
    assert!(
        prompt.text_bytes.saturating_add(prompt.tools_bytes) <= body.len() as u64,
        "prompt counts {} text and {} tool bytes of a {}-byte body",
        prompt.text_bytes,
        prompt.tools_bytes,
        body.len()
    );
    assert!(prompt.estimable_bytes() >= prompt.text_bytes.max(prompt.tools_bytes));

    let Some(rewritten) = fields::request_with_include_usage(body, &found) else {
        assert!(!found.stream || found.include_usage == Some(true));
        return;
    };
    let again = fields::extract_fields(&rewritten).expect("a rewritten body is accepted");
    assert_eq!(again.model, found.model);
    assert!(again.stream);
    assert_eq!(again.include_usage, Some(true));
    assert_eq!(again.max_tokens, found.max_tokens);
    assert_eq!(again.max_completion_tokens, found.max_completion_tokens);
    assert_eq!(again.prompt.messages, prompt.messages);
    assert_eq!(again.prompt.images, prompt.images);
    assert!(fields::request_with_include_usage(&rewritten, &again).is_none());
});
