//! The claim a heartbeat makes of its router's totals, and the routers a reader has read whole.

use super::*;

const NOW: u64 = 1_780_000_000_000;

fn heartbeat(whole_in: Option<&str>) -> Heartbeat {
    Heartbeat {
        run: 1,
        at_unix_ms: NOW,
        interval_ms: 1000,
        peer_id: "peer".into(),
        grpc_addr: None,
        agents: Vec::new(),
        agents_version: None,
        agents_unknown: false,
        left: false,
        whole_in: whole_in.map(str::to_owned),
    }
}

fn record(id: &str, whole_in: Option<&str>, age_ms: u64) -> Record {
    Record {
        id: id.into(),
        heartbeat: heartbeat(whole_in),
        age_ms,
    }
}

fn text(whole_in: Option<&str>) -> String {
    serde_json::to_string(&heartbeat(whole_in)).expect("a heartbeat serializes")
}

#[test]
fn a_claim_waits_for_a_round_that_gathered_every_shard_after_the_epoch_was_learned() {
    let mut claim = Claim::default();
    claim.gathered(true);
    assert_eq!(claim.of_round(), None, "nothing learned yet");
    // The first round learns the epoch: its totals were gathered before.
    claim.learned("e1");
    assert_eq!(claim.of_round(), None);
    // A round whose usage misses a shard's report cannot claim.
    claim.gathered(false);
    assert_eq!(claim.of_round(), None);
    // One that gathered them all writes them whole and claims, whether it goes through or not.
    claim.gathered(true);
    assert_eq!(claim.of_round().as_deref(), Some("e1"));
    claim.went_through(Some("e1".into()));
    claim.learned("e1");
    assert_eq!(claim.of_round().as_deref(), Some("e1"));
    // The store lost its data: the old claim stands (it names the old epoch, which no reader
    // takes for the new one) until a round writes every total again.
    claim.learned("e2");
    assert_eq!(claim.of_round().as_deref(), Some("e1"));
    claim.gathered(true);
    assert_eq!(claim.of_round().as_deref(), Some("e2"));
    // Its reply was lost: the next round claims it again.
    claim.gathered(true);
    assert_eq!(claim.of_round().as_deref(), Some("e2"));
    claim.went_through(Some("e2".into()));
    claim.learned("e2");
    assert_eq!(claim.of_round().as_deref(), Some("e2"));
}

#[test]
fn a_router_is_read_whole_from_a_read_that_saw_its_claim_of_that_epoch() {
    let mut reads = Reads::default();
    reads.in_epoch("e1");
    let records = [
        record("router-0", None, 0),
        record("router-1", Some("e1"), 0),
        record("router-2", None, 0),
    ];
    // Nothing read yet: both others are unread, and router-1 is ready to be read.
    assert_eq!(
        reads.unread("router-0", &records),
        Unread {
            routers: 2,
            claimed: true
        }
    );
    let one = text(Some("e1"));
    let two = text(None);
    reads.read(
        Some("e1"),
        [("router-1", one.as_str()), ("router-2", two.as_str())],
    );
    assert_eq!(
        reads.unread("router-0", &records),
        Unread {
            routers: 1,
            claimed: false
        }
    );
    // A claim of another epoch is no claim of this one.
    let old = text(Some("e0"));
    reads.read(Some("e1"), [("router-2", old.as_str())]);
    assert_eq!(reads.unread("router-0", &records).routers, 1);
    // A silent router is no unread one: the daily budgets keep its part as a silent router's.
    let silent = [record("router-2", None, 10_000)];
    assert_eq!(reads.unread("router-0", &silent), Unread::default());
    // The store lost its data: nobody is read whole any more.
    reads.in_epoch("e2");
    assert_eq!(reads.unread("router-0", &records).routers, 2);
}

#[test]
fn a_record_of_a_router_before_the_claim_counts_whole_in_every_epoch() {
    let older = r#"{"run":1,"at_unix_ms":1,"interval_ms":1000,"peer_id":"p"}"#;
    let beat: Heartbeat = serde_json::from_str(older).expect("an older record parses");
    assert_eq!(beat.whole_in.as_deref(), Some(WHOLE_IN_EVERY_EPOCH));
    // Written by this version without a claim: null, not absent.
    let none: Heartbeat = serde_json::from_str(&text(None)).expect("parses");
    assert_eq!(none.whole_in, None);
    let mut reads = Reads::default();
    reads.read(Some("e7"), [("router-1", older)]);
    assert_eq!(
        reads.unread("router-0", &[record("router-1", None, 0)]),
        Unread::default()
    );
    // No epoch in the store yet: nothing can be claimed of it.
    let mut empty = Reads::default();
    empty.read(None, [("router-1", older)]);
    assert_eq!(
        empty
            .unread("router-0", &[record("router-1", None, 0)])
            .routers,
        1
    );
}
