//! Proves that when two agents (each in front of its own sim) serve the same model, the router
//! spreads a burst of sequential and concurrent requests over both of them.

mod common;

use common::{Options, Site, chat};

#[test]
fn two_agents_for_one_model_both_get_a_share() {
    let site = Site::start(
        "load_sharing",
        Options::new()
            .sim(&["--models", "sim-model", "--output-tokens", "4"])
            .sim(&[
                "--models",
                "sim-model",
                "--output-tokens",
                "4",
                "--ttft",
                "20ms",
            ])
            .agent(0, &["--capacity", "4"])
            .agent(1, &["--capacity", "4"]),
    );
    site.wait_healthy_agents("sim-model", 2);

    for _ in 0..16 {
        site.assert_chat_ok("sim-model");
    }
    // Concurrent: 3 rounds of 8 at once, more than one agent's capacity.
    for _ in 0..3 {
        std::thread::scope(|scope| {
            let handles: Vec<_> = (0..8)
                .map(|_| {
                    scope.spawn(|| {
                        let (status, _, body) =
                            site.post_json("/v1/chat/completions", &chat("sim-model", true));
                        assert_eq!(status, 200, "{body}");
                        assert!(body.ends_with("data: [DONE]\n\n"), "{body}");
                    })
                })
                .collect();
            for handle in handles {
                handle.join().expect("request thread");
            }
        });
    }

    let served: Vec<f64> = (0..2)
        .map(|sim| site.sim_metric(sim, "sim_requests_total"))
        .collect();
    assert_eq!(served.iter().sum::<f64>(), 40.0, "{served:?}");
    assert!(
        served.iter().all(|&n| n > 0.0),
        "one sim got nothing: {served:?}\n{}",
        site.logs()
    );
    site.wait_metric("hivenet_shard_in_flight", |v| v == 0.0);
}
