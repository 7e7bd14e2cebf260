//! Proves the router-side request deadline: a non-streamed answer that is not complete within
//! `--request-timeout` gets 504 request_timeout and is cancelled at the backend, while a stream
//! whose head arrived in time runs to its end past the deadline.

mod common;

use common::{Options, Site, chat};

#[test]
fn slow_non_streamed_answer_is_504_and_cancelled_but_streams_run_on() {
    let site = Site::start(
        "request_timeout",
        Options::new()
            .sim(&[
                "--models",
                "sim-model",
                "--ttft",
                "3s",
                "--output-tokens",
                "3",
            ])
            .router_args(&["--request-timeout", "1s"])
            .agent(0, &["--capacity", "1"]),
    );
    let (status, _, body) = site.post_json("/v1/chat/completions", &chat("sim-model", false));
    assert_eq!(status, 504, "{body}");
    let value: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(value["error"]["code"], "request_timeout", "{body}");
    site.wait_sim_metric(0, "sim_cancelled_total", |v| v == 1.0);
    site.wait_metric("hivenet_shard_in_flight", |v| v == 0.0);

    // Capacity 1: this stream gets the slot only because the timed-out request released it.
    let (status, _, body) = site.post_json("/v1/chat/completions", &chat("sim-model", true));
    assert_eq!(status, 200, "{body}\n{}", site.logs());
    assert!(
        body.ends_with("data: [DONE]\n\n"),
        "stream cut short: {body}"
    );
    assert_eq!(body.matches("\"content\":\"tok").count(), 3, "{body}");
}
