//! The occupancy-credit grant script (`sync::pool_store`) in a real Valkey: grants from many
//! routers at once never take the pool past its budget; a router that has not seen the store's
//! epoch is refused; a newer run of a router replaces the older run's holding; `WAIT` tells a grant
//! a replica acknowledged from one none did; a failover before the acknowledgement loses the grant,
//! and the store notices the promoted primary by its replication ID.

mod common;

use common::runtime;

use common::valkey::{Sentinels, Valkey, store_settings};
use hivenet_router::router::sync::pool_store::Grant;
use hivenet_router::router::sync::store::Store;

const SITE: &str = "credits";
const EPOCH: &str = "epoch-1";

fn store(valkey: &Valkey, router: &str) -> Store {
    store_at(&[valkey.addr()], None, router)
}

/// A store for `router` at `addrs`: the primary, or the Sentinels of `sentinel_master`.
fn store_at(addrs: &[String], sentinel_master: Option<&str>, router: &str) -> Store {
    Store::new(
        store_settings(addrs, sentinel_master, None),
        SITE,
        router,
        std::time::Duration::from_secs(2),
    )
}

fn pool_total(valkey: &Valkey) -> u64 {
    let reply = valkey
        .reply(&["HVALS", "hivenet:{credits}:pool:chat"])
        .unwrap();
    reply
        .items()
        .iter()
        .map(|value| {
            let text = value.text();
            text.split(':').nth(1).unwrap().parse::<u64>().unwrap()
        })
        .sum()
}

#[test]
fn grants_from_many_routers_at_once_never_pass_the_budget() {
    const BUDGET: u64 = 100;
    let valkey = Valkey::primary();
    valkey.command(&["SET", "hivenet:{credits}:epoch", EPOCH]);
    let granted: u64 = std::thread::scope(|scope| {
        let routers: Vec<_> = (0..6)
            .map(|router| {
                let valkey = &valkey;
                scope.spawn(move || {
                    let name = format!("router-{router}");
                    let mut store = store(valkey, &name);
                    runtime().block_on(async move {
                        let mut total = 0;
                        for want in [7u64, 13, 29, 3, 41, 17, 11, 5] {
                            match store
                                .grant("chat", &name, 1, EPOCH, want, BUDGET)
                                .await
                                .unwrap()
                            {
                                Grant::Granted { granted, .. } => total += granted,
                                other => panic!("{other:?}"),
                            }
                        }
                        total
                    })
                })
            })
            .collect();
        routers
            .into_iter()
            .map(|router| router.join().unwrap())
            .sum()
    });
    assert_eq!(
        granted, BUDGET,
        "six routers asked for far more than the budget"
    );
    assert_eq!(pool_total(&valkey), BUDGET);
}

#[test]
fn a_stale_epoch_is_refused_and_a_newer_run_replaces_the_older() {
    let valkey = Valkey::primary();
    valkey.command(&["SET", "hivenet:{credits}:epoch", EPOCH]);
    let mut store = store(&valkey, "router-0");
    runtime().block_on(async {
        assert_eq!(
            store
                .grant("chat", "router-0", 1, "an-older-epoch", 10, 100)
                .await
                .unwrap(),
            Grant::StaleEpoch
        );
        assert_eq!(
            store
                .grant("chat", "router-0", 1, EPOCH, 80, 100)
                .await
                .unwrap(),
            Grant::Granted {
                granted: 80,
                held: 80
            }
        );
        // The restarted router's first grant: the old run's 80 are free again.
        assert_eq!(
            store
                .grant("chat", "router-0", 2, EPOCH, 100, 100)
                .await
                .unwrap(),
            Grant::Granted {
                granted: 100,
                held: 100
            }
        );
        assert_eq!(
            store
                .grant("chat", "router-0", 1, EPOCH, 1, 100)
                .await
                .unwrap(),
            Grant::Replaced
        );
    });
    assert_eq!(pool_total(&valkey), 100);
}

#[test]
fn wait_tells_a_grant_a_replica_acknowledged() {
    let primary = Valkey::primary();
    primary.command(&["SET", "hivenet:{credits}:epoch", EPOCH]);
    let mut alone = store(&primary, "router-0");
    runtime().block_on(async {
        alone
            .grant("chat", "router-0", 1, EPOCH, 10, 100)
            .await
            .unwrap();
        assert_eq!(alone.wait_replicas(100).await.unwrap(), 0, "no replica yet");
    });
    let replica = Valkey::replica_of(&primary);
    replica.wait_replica_synced();
    let mut store = store(&primary, "router-1");
    runtime().block_on(async {
        store
            .grant("chat", "router-1", 1, EPOCH, 10, 100)
            .await
            .unwrap();
        assert_eq!(store.wait_replicas(1_000).await.unwrap(), 1);
    });
    assert_eq!(
        replica.command(&["HGET", "hivenet:{credits}:pool:chat", "router-1"]),
        "1:10:1"
    );
}

#[test]
fn a_failover_before_the_acknowledgement_loses_the_grant_and_is_noticed() {
    let mut primary = Valkey::primary();
    let replica = Valkey::replica_of(&primary);
    replica.wait_replica_synced();
    let mut sentinels = Sentinels::start(3, &primary, "hivenet");
    primary.command(&["SET", "hivenet:{credits}:epoch", EPOCH]);
    let mut store = store_at(&sentinels.addrs(), Some("hivenet"), "router-0");
    let rt = runtime();
    rt.block_on(async {
        store.ensure_connected().await.unwrap();
        store
            .grant("chat", "router-0", 1, EPOCH, 10, 100)
            .await
            .unwrap();
        assert_eq!(store.wait_replicas(1_000).await.unwrap(), 1, "acknowledged");
    });
    // The replica stops answering and its link is cut: the next grant is used unacknowledged,
    // then the primary dies before the replica ever had it.
    replica.freeze();
    primary.command(&["CLIENT", "KILL", "TYPE", "replica"]);
    rt.block_on(async {
        assert_eq!(
            store
                .grant("chat", "router-0", 1, EPOCH, 20, 100)
                .await
                .unwrap(),
            Grant::Granted {
                granted: 20,
                held: 30
            }
        );
        assert_eq!(
            store.wait_replicas(100).await.unwrap(),
            0,
            "not acknowledged"
        );
    });
    let old = primary.addr();
    primary.kill();
    replica.thaw();
    let promoted = sentinels.wait_failover_from(&old);
    assert_eq!(promoted, replica.addr());
    assert_eq!(
        replica.command(&["HGET", "hivenet:{credits}:pool:chat", "router-0"]),
        "1:10:1",
        "the promoted replica never had the unacknowledged grant"
    );
    // The store follows the Sentinels to the promoted replica and notices the new replication
    // ID: the router guards what may have been lost (`credits::view::PoolView::failed_over`).
    let failovers = common::poll(std::time::Duration::from_secs(20), || {
        rt.block_on(async {
            let _ = store.ensure_connected().await;
            let _ = store.grant("chat", "router-0", 1, EPOCH, 0, 100).await;
        });
        (store.failovers() == 1).then_some(())
    });
    assert!(failovers.is_some(), "the failover went unnoticed");
}
