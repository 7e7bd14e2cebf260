//! A TCP relay between the agents and the router's tunnel port, so a test can cut tunnels the
//! way a network would: the router announces the relay's address, the agents dial it, and
//! [`TunnelRelay::cut`] shuts both sides of established connections down.

use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::sync::atomic::{AtomicU16, Ordering};
use std::sync::{Arc, Mutex};

pub struct TunnelRelay {
    pub port: u16,
    target: Arc<AtomicU16>,
    /// Live connections, oldest first: (agent side, router side).
    live: Arc<Mutex<Vec<(TcpStream, TcpStream)>>>,
}

impl TunnelRelay {
    /// Listens on a free loopback port; connections are refused until [`TunnelRelay::forward_to`].
    pub fn start() -> TunnelRelay {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind the relay");
        let port = listener.local_addr().expect("relay address").port();
        let target = Arc::new(AtomicU16::new(0));
        let live: Arc<Mutex<Vec<(TcpStream, TcpStream)>>> = Arc::default();
        let (accept_target, accept_live) = (target.clone(), live.clone());
        std::thread::spawn(move || {
            for agent in listener.incoming() {
                let Ok(agent) = agent else { continue };
                let port = accept_target.load(Ordering::Acquire);
                let Ok(router) = TcpStream::connect(("127.0.0.1", port)) else {
                    continue;
                };
                let _ = agent.set_nodelay(true);
                let _ = router.set_nodelay(true);
                let pair = (
                    agent.try_clone().expect("clone"),
                    router.try_clone().expect("clone"),
                );
                accept_live.lock().unwrap().push(pair);
                pipe(
                    agent.try_clone().expect("clone"),
                    router.try_clone().expect("clone"),
                );
                pipe(router, agent);
            }
        });
        TunnelRelay { port, target, live }
    }

    pub fn forward_to(&self, port: u16) {
        self.target.store(port, Ordering::Release);
    }

    /// Shuts down the `count` oldest live connections; returns how many it cut.
    pub fn cut(&self, count: usize) -> usize {
        let mut live = self.live.lock().unwrap();
        let count = count.min(live.len());
        for (agent, router) in live.drain(..count) {
            let _ = agent.shutdown(Shutdown::Both);
            let _ = router.shutdown(Shutdown::Both);
        }
        count
    }
}

fn pipe(mut from: TcpStream, mut to: TcpStream) {
    std::thread::spawn(move || {
        let mut buffer = [0u8; 16 * 1024];
        loop {
            match from.read(&mut buffer) {
                Ok(0) | Err(_) => break,
                Ok(read) => {
                    if to.write_all(&buffer[..read]).is_err() {
                        break;
                    }
                }
            }
        }
        let _ = to.shutdown(Shutdown::Both);
        let _ = from.shutdown(Shutdown::Both);
    });
}
