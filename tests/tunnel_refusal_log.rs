//! Proves through the real router that refused tunnel connections cannot flood its log: a burst of
//! connections with a bad session token writes one WARN line, and the next refusal after the
//! 10-second interval writes one more that counts the refusals left out in between.

mod common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use common::{Options, Site};
use hivenet_router::net::tunnel::preamble::{self, Status};

const BURST: usize = 40;

/// Opens a tunnel connection with a bad token; returns once the router has answered.
fn refused_tunnel(site: &Site) {
    let mut socket = TcpStream::connect(("127.0.0.1", site.p2p)).expect("connect to --p2p-port");
    socket
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    socket
        .write_all(&preamble::encode(
            preamble::Codec::Lean,
            0,
            "not-a-session-token",
        ))
        .unwrap();
    let mut status = [0u8; 1];
    socket.read_exact(&mut status).expect("a status byte");
    assert_eq!(Status::from_byte(status[0]), Some(Status::BadToken));
}

fn refusal_lines(site: &Site) -> Vec<String> {
    site.router
        .log_text()
        .lines()
        .filter(|line| line.contains("tunnel refused"))
        .map(str::to_owned)
        .collect()
}

#[test]
fn a_burst_of_refused_tunnels_logs_one_line_per_interval_with_a_count() {
    let site = Site::start("tunnel-refusal-log", Options::new());
    let started = Instant::now();
    for _ in 0..BURST {
        refused_tunnel(&site);
    }
    let first = site.wait_for("the first refusal line", || {
        let lines = refusal_lines(&site);
        (!lines.is_empty()).then_some(lines)
    });
    // Give the last refusals of the burst time to reach the log, had they been logged.
    std::thread::sleep(Duration::from_millis(500));
    let lines = refusal_lines(&site);
    assert_eq!(lines.len(), 1, "{lines:#?}");
    assert!(first[0].contains("WARN"), "{}", first[0]);
    assert!(first[0].contains("session token refused"), "{}", first[0]);
    assert!(first[0].contains("suppressed=0"), "{}", first[0]);

    // After the interval, the next refusal is logged with the count of those left out.
    let interval = hivenet_router::router::shard::tunnels::REFUSAL_LOG_INTERVAL;
    std::thread::sleep((interval + Duration::from_millis(200)).saturating_sub(started.elapsed()));
    refused_tunnel(&site);
    let lines = site.wait_for("the second refusal line", || {
        let lines = refusal_lines(&site);
        (lines.len() == 2).then_some(lines)
    });
    assert!(
        lines[1].contains(&format!("suppressed={}", BURST - 1)),
        "{lines:#?}"
    );
}
