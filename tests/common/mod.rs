//! Test harness for the integration tests: starts real `hivenet-sim`, `hivenet-router` and
//! `hivenet-agent` processes on free loopback ports, waits for them with deadlines, and talks to
//! the router with a tiny byte-exact HTTP/1.1 client.
//!
//! Invariants: every child is SIGKILLed and reaped when its guard drops (also when a test panics);
//! every wait has a deadline and panics with the tail of the relevant logs; a port handed out by
//! [`free_port`] is never handed out again within this test binary.

#![allow(dead_code)]

pub mod agent_auth;
pub mod otlp;
pub mod relay;
pub mod valkey;

use std::collections::HashSet;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Mutex;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use serde_json::Value;

/// Agent secret shared by the router and agents of every site.
pub const SECRET: &str = "integration-test-secret";
/// Longest any wait helper polls before panicking. Generous: the suite runs on a loaded 2-core box.
pub const WAIT: Duration = Duration::from_secs(30);
/// Read timeout of the test HTTP client: a response that stalls this long fails the test instead
/// of hanging it.
pub const READ_TIMEOUT: Duration = Duration::from_secs(30);
const POLL_INTERVAL: Duration = Duration::from_millis(50);
/// Attempts at starting a router whose pre-picked port was taken by someone else meanwhile.
const ROUTER_START_ATTEMPTS: u32 = 5;
const LOG_TAIL_BYTES: usize = 4000;

// ---------------------------------------------------------------------------------------------
// Ports

static PORTS_HANDED_OUT: Mutex<Option<HashSet<u16>>> = Mutex::new(None);

/// A loopback port that was free a moment ago and that this test binary has never handed out.
/// Another process can still take it before the child binds it; [`Site::start`] retries then.
pub fn free_port() -> u16 {
    loop {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind an ephemeral port");
        let port = listener.local_addr().expect("local addr").port();
        drop(listener);
        let mut handed_out = PORTS_HANDED_OUT.lock().unwrap_or_else(|e| e.into_inner());
        if handed_out.get_or_insert_with(HashSet::new).insert(port) {
            return port;
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Child processes

/// A child process whose stdout and stderr go to `log`; SIGKILLed and reaped on drop.
pub struct Proc {
    pub name: String,
    pub log: PathBuf,
    child: Option<Child>,
}

impl Proc {
    fn spawn(
        name: &str,
        binary: &str,
        args: &[String],
        env: &[(String, String)],
        dir: &Path,
    ) -> Proc {
        let log = dir.join(format!("{name}.log"));
        let out = std::fs::File::create(&log).expect("create log file");
        let err = out.try_clone().expect("clone log file");
        let mut command = Command::new(binary);
        command
            .args(args)
            .current_dir(dir)
            .stdin(Stdio::null())
            .stdout(Stdio::from(out))
            .stderr(Stdio::from(err));
        // Settings leaking in from the developer's shell would change what the test exercises.
        for (key, _) in std::env::vars() {
            if key.starts_with("HIVENET_") || key == "RUST_LOG" {
                command.env_remove(key);
            }
        }
        // `TEST_CHILD_LOG=debug cargo test ...` turns up the children's logging for a failing test.
        let log_filter = std::env::var("TEST_CHILD_LOG").unwrap_or_else(|_| "info".to_string());
        command
            .env("HIVENET_ROUTER_JWT_SECRET", SECRET)
            .env("NO_COLOR", "1")
            .env("RUST_LOG", log_filter);
        for (key, value) in env {
            command.env(key, value);
        }
        let child = command
            .spawn()
            .unwrap_or_else(|e| panic!("spawn {binary}: {e}"));
        Proc {
            name: name.to_string(),
            log,
            child: Some(child),
        }
    }

    /// Whether the process has exited (reaping it if so).
    pub fn exited(&mut self) -> bool {
        match self.child.as_mut() {
            None => true,
            Some(child) => !matches!(child.try_wait(), Ok(None)),
        }
    }

    /// The OS process id while the child runs (for signals such as SIGHUP).
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// SIGTERMs the process and waits up to [`WAIT`] for it to exit; returns its exit status.
    /// Panics with the log tail if it does not exit.
    pub fn terminate(&mut self) -> std::process::ExitStatus {
        let child = self.child.as_mut().expect("process already reaped");
        let sent = Command::new("kill")
            .args(["-TERM", &child.id().to_string()])
            .status()
            .expect("run kill -TERM");
        assert!(sent.success(), "kill -TERM {} failed", self.name);
        let status = poll(WAIT, || child.try_wait().ok().flatten());
        match status {
            Some(status) => {
                self.child = None;
                status
            }
            None => panic!("{} ignored SIGTERM\n{}", self.name, self.log_tail()),
        }
    }

    /// Sends `signal` (`TERM`, `STOP`, `CONT`, ...) without waiting.
    pub fn signal(&self, signal: &str) {
        let pid = self.pid().expect("process already reaped");
        let sent = Command::new("kill")
            .args([&format!("-{signal}"), &pid.to_string()])
            .status()
            .expect("run kill");
        assert!(sent.success(), "kill -{signal} {} failed", self.name);
    }

    /// Waits up to `within` for the process to exit; its status, or `None` while it runs on.
    pub fn wait_exit(&mut self, within: Duration) -> Option<std::process::ExitStatus> {
        let child = self.child.as_mut()?;
        let status = poll(within, || child.try_wait().ok().flatten());
        if status.is_some() {
            self.child = None;
        }
        status
    }

    /// SIGKILLs the process and waits for it.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    pub fn log_text(&self) -> String {
        String::from_utf8_lossy(&std::fs::read(&self.log).unwrap_or_default()).into_owned()
    }

    pub fn log_tail(&self) -> String {
        let text = self.log_text();
        let mut start = text.len().saturating_sub(LOG_TAIL_BYTES);
        while !text.is_char_boundary(start) {
            start += 1;
        }
        format!(
            "----- {} ({}) -----\n{}",
            self.name,
            self.log.display(),
            &text[start..]
        )
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        self.kill();
    }
}

// ---------------------------------------------------------------------------------------------
// Site

/// What to start: sims, one router, agents.
#[derive(Clone, Default)]
pub struct Options {
    sims: Vec<Vec<String>>,
    router_args: Vec<String>,
    router_env: Vec<(String, String)>,
    agents: Vec<(usize, Vec<String>)>,
    models: Vec<String>,
    api_key: Option<String>,
    /// Start returns without waiting for `/v1/models` (routers whose keys are added later).
    skip_model_wait: bool,
    /// Agents reach the tunnel port through a [`relay::TunnelRelay`] the test can cut.
    relay_tunnels: bool,
    /// [`Options::reaper`]: the router logs its reaper passes.
    reaper_logged: bool,
}

fn strings(args: &[&str]) -> Vec<String> {
    args.iter().map(|s| s.to_string()).collect()
}

impl Options {
    pub fn new() -> Options {
        Options::default()
    }

    /// Adds a sim started with `args` (besides `--listen` and `--ready-file`).
    pub fn sim(mut self, args: &[&str]) -> Options {
        self.sims.push(strings(args));
        self
    }

    /// Extra router arguments (besides the four ports and the identity path). `--shards 2` is
    /// added unless given. `{grpc}` in an argument becomes the router's gRPC address
    /// (`127.0.0.1:<port>`, picked at start), e.g. `--advertise-grpc-addr {grpc}`.
    pub fn router_args(mut self, args: &[&str]) -> Options {
        self.router_args.extend(strings(args));
        self
    }

    /// A router environment variable; `{simN}` in the value becomes sim N's address.
    pub fn router_env(mut self, key: &str, value: &str) -> Options {
        self.router_env.push((key.to_string(), value.to_string()));
        self
    }

    /// Adds an agent in front of sim number `sim`, started with `args` (besides the backend URL,
    /// router address and identity path).
    pub fn agent(mut self, sim: usize, args: &[&str]) -> Options {
        self.agents.push((sim, strings(args)));
        self
    }

    /// The API key the harness's own probes (`/v1/models`, `get`, `post_json`) present, for
    /// routers started with API keys.
    pub fn api_key(mut self, key: &str) -> Options {
        self.api_key = Some(key.to_string());
        self
    }

    /// Makes the router site `id` of a sibling map (cross-site redirect on, siblings under
    /// 127.0.0.1), with [`REDIRECT_SECRET`] written to a file named after `name`.
    pub fn site(self, name: &str, id: &str) -> Options {
        let secrets = write_temp(&format!("redirect-{name}"), &format!("{REDIRECT_SECRET}\n"));
        self.router_args(&[
            "--site-id",
            id,
            "--redirect-secret-file",
            &secrets,
            "--redirect-allowed-domains",
            "127.0.0.1",
        ])
    }

    /// [`Site::start`] waits for health and tunnels only, not for `/v1/models` (for routers
    /// whose client keys do not exist yet).
    pub fn skip_model_wait(mut self) -> Options {
        self.skip_model_wait = true;
        self
    }

    /// Agents dial the router's tunnel port through a relay ([`Site::relay`]) that the test can
    /// cut, as a network fault would.
    pub fn relay_tunnels(mut self) -> Options {
        self.relay_tunnels = true;
        self
    }

    /// Runs the router's occupancy reaper every `interval`, releasing reservations untouched for
    /// `after` (`--admission-reap-interval`, `--admission-reap-after`), and turns on its debug
    /// line for each pass so [`Site::wait_reaper_pass`] sees it. For tests that assert
    /// `hivenet_admission_reaped_total` is 0: with the defaults (a pass every 5 minutes,
    /// reservations 30 minutes old) no pass happens while a test runs, and the assertion could
    /// not fail. `after` must be longer than any live reservation of the test goes untouched (a
    /// non-streamed request's whole life; a stream's gap between two refreshes, every 16 output
    /// events), or a live request is reaped.
    pub fn reaper(mut self, interval: &str, after: &str) -> Options {
        self.reaper_logged = true;
        self.router_args(&[
            "--admission-reap-interval",
            interval,
            "--admission-reap-after",
            after,
        ])
    }

    /// Models [`Site::start`] waits for in `/v1/models` (default: `sim-model` when there are
    /// agents).
    pub fn models(mut self, models: &[&str]) -> Options {
        self.models = strings(models);
        self
    }
}

/// How [`Site::restart_router`] stops the running router.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stop {
    /// SIGTERM, and the router must exit with status 0 (a graceful shutdown).
    Terminate,
    /// SIGKILL: a crash.
    Kill,
}

pub struct Site {
    /// Presented by the harness's own requests; see [`Options::api_key`].
    pub api_key: Option<String>,
    /// What the site was started with, for [`Site::restart_router`].
    options: Options,
    /// The router's tunnel port, reused by a restart.
    pub p2p: u16,
    /// Routers started so far (names the log of the next one).
    router_starts: u32,
    pub dir: PathBuf,
    pub sims: Vec<Proc>,
    pub sim_addrs: Vec<SocketAddr>,
    pub router: Proc,
    pub http: SocketAddr,
    pub grpc: SocketAddr,
    pub metrics: SocketAddr,
    pub agents: Vec<Proc>,
    pub shards: usize,
    /// With [`Options::relay_tunnels`]: what the agents dial instead of the tunnel port.
    pub relay: Option<relay::TunnelRelay>,
}

static SITE_SEQUENCE: AtomicU32 = AtomicU32::new(0);

impl Site {
    /// Starts everything in `options` and returns once the router answers `/health`, lists the
    /// expected models, and every agent has a tunnel open to every shard.
    pub fn start(name: &str, options: Options) -> Site {
        let sequence = SITE_SEQUENCE.fetch_add(1, Ordering::Relaxed);
        let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
            .join("hivenet-it")
            .join(format!("{name}-{}-{sequence}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("create test dir");

        let mut sims = Vec::new();
        let mut sim_addrs = Vec::new();
        for (index, sim_args) in options.sims.iter().enumerate() {
            let ready = dir.join(format!("sim{index}.addr"));
            let mut args = strings(&["--listen", "127.0.0.1:0", "--ready-file"]);
            args.push(ready.display().to_string());
            args.extend(sim_args.iter().cloned());
            let mut sim = Proc::spawn(
                &format!("sim{index}"),
                env!("CARGO_BIN_EXE_hivenet-sim"),
                &args,
                &[],
                &dir,
            );
            let addr = poll(WAIT, || {
                assert!(!sim.exited(), "sim{index} exited early\n{}", sim.log_tail());
                let text = std::fs::read_to_string(&ready).ok()?;
                text.trim().parse::<SocketAddr>().ok()
            })
            .unwrap_or_else(|| panic!("sim{index} never became ready\n{}", sim.log_tail()));
            sims.push(sim);
            sim_addrs.push(addr);
        }
        let mut options = options;
        for (_, value) in &mut options.router_env {
            for (index, addr) in sim_addrs.iter().enumerate() {
                *value = value.replace(&format!("{{sim{index}}}"), &addr.to_string());
            }
        }

        let shards = options
            .router_args
            .iter()
            .position(|a| a == "--shards")
            .and_then(|i| options.router_args.get(i + 1))
            .map(|s| s.parse().expect("--shards value"))
            .unwrap_or(2);
        let relay = options.relay_tunnels.then(relay::TunnelRelay::start);
        if let Some(relay) = &relay {
            let announce = format!("/ip4/127.0.0.1/tcp/{}", relay.port);
            options
                .router_args
                .extend(strings(&["--p2p-announce-addr", &announce]));
        }
        let (router, ports) = start_router(&dir, &options, shards);
        if let Some(relay) = &relay {
            relay.forward_to(ports.p2p);
        }
        let RouterPorts {
            http,
            grpc,
            metrics,
            p2p,
        } = ports;

        let mut site = Site {
            api_key: options.api_key.clone(),
            options: options.clone(),
            p2p,
            router_starts: 1,
            dir,
            sims,
            sim_addrs,
            router,
            http,
            grpc,
            metrics,
            agents: Vec::new(),
            shards,
            relay,
        };
        for (sim, agent_args) in &options.agents {
            let args: Vec<&str> = agent_args.iter().map(|s| s.as_str()).collect();
            site.spawn_agent(*sim, &args);
        }
        site.wait_ready();
        site
    }

    /// Waits for `/health`, the expected models (unless skipped) and every agent's tunnels.
    fn wait_ready(&self) {
        self.wait_health();
        let mut models = self.options.models.clone();
        if models.is_empty() && !self.agents.is_empty() {
            models.push("sim-model".to_string());
        }
        let wanted: Vec<&str> = models.iter().map(|s| s.as_str()).collect();
        if !self.options.skip_model_wait {
            self.wait_models(&wanted);
        }
        let tunnels = (self.agents.len() * self.shards) as f64;
        self.wait_metric("hivenet_shard_tunnels_open", |v| v >= tunnels);
    }

    /// Stops the router (`stop`) and starts a new one in the same directory on the same ports
    /// with the same arguments plus `extra_args`; returns once it is ready as in
    /// [`Site::start`] (the agents reconnect by themselves). Returns the old router's exit status
    /// for [`Stop::Terminate`].
    pub fn restart_router(
        &mut self,
        stop: Stop,
        extra_args: &[&str],
    ) -> Option<std::process::ExitStatus> {
        let status = match stop {
            Stop::Terminate => Some(self.router.terminate()),
            Stop::Kill => {
                self.router.kill();
                None
            }
        };
        let ports = RouterPorts {
            http: self.http,
            grpc: self.grpc,
            metrics: self.metrics,
            p2p: self.p2p,
        };
        let mut options = self.options.clone();
        options.router_args.extend(strings(extra_args));
        // The kernel may release a dead router's sockets a moment after the process is reaped
        // (io_uring tears its ring down asynchronously): retry while the port is still held.
        let started = Instant::now();
        let router = loop {
            let name = format!("router-restart{}", self.router_starts);
            self.router_starts += 1;
            let mut router = spawn_router(&self.dir, &name, &options, self.shards, &ports);
            match wait_router_started(&mut router) {
                Some(true) => break router,
                Some(false) if router.log_text().contains("in use") && started.elapsed() < WAIT => {
                    std::thread::sleep(POLL_INTERVAL);
                }
                _ => panic!("restarted router did not start\n{}", router.log_tail()),
            }
        };
        self.router = router;
        self.wait_ready();
        status
    }

    /// Starts one more agent in front of sim number `sim` (identity `agentN.key`, N its index in
    /// `agents`); does not wait for it.
    pub fn spawn_agent(&mut self, sim: usize, agent_args: &[&str]) -> usize {
        self.spawn_agent_with_env(sim, agent_args, &[])
    }

    /// [`Site::spawn_agent`] with environment variables for the agent.
    pub fn spawn_agent_with_env(
        &mut self,
        sim: usize,
        agent_args: &[&str],
        env: &[(&str, &str)],
    ) -> usize {
        let index = self.agents.len();
        let mut args = vec![
            "--backend-url".to_string(),
            format!("http://{}", self.sim_addrs[sim]),
            "--router-grpc".to_string(),
            self.grpc.to_string(),
            "--identity-path".to_string(),
            self.dir
                .join(format!("agent{index}.key"))
                .display()
                .to_string(),
        ];
        args.extend(strings(agent_args));
        let env: Vec<(String, String)> = env
            .iter()
            .map(|(key, value)| (key.to_string(), value.to_string()))
            .collect();
        self.agents.push(Proc::spawn(
            &format!("agent{index}"),
            env!("CARGO_BIN_EXE_hivenet-agent"),
            &args,
            &env,
            &self.dir,
        ));
        index
    }

    /// Reaper passes each shard has logged so far (index: shard). Needs [`Options::reaper`].
    pub fn reaper_passes(&self) -> Vec<usize> {
        assert!(
            self.options.reaper_logged,
            "start the site with Options::reaper to see reaper passes"
        );
        let mut passes = vec![0; self.shards];
        for line in self.router.log_text().lines() {
            if !line.contains("admission reaper pass") {
                continue;
            }
            let shard = line
                .split_once("shard=")
                .and_then(|(_, rest)| rest.split(|c: char| !c.is_ascii_digit()).next())
                .and_then(|digits| digits.parse::<usize>().ok())
                .unwrap_or_else(|| panic!("reaper pass line without a shard: {line}"));
            passes[shard] += 1;
        }
        passes
    }

    /// Waits until every shard has run its reaper once more after this call: whatever a
    /// reaper could release by now, it has.
    pub fn wait_reaper_pass(&self) {
        let before = self.reaper_passes();
        self.wait_for("a reaper pass on every shard", || {
            let now = self.reaper_passes();
            now.iter()
                .zip(&before)
                .all(|(now, before)| now > before)
                .then_some(())
        });
    }

    /// Tails of every log, for panic messages.
    pub fn logs(&self) -> String {
        let mut out = String::new();
        for proc in self
            .sims
            .iter()
            .chain([&self.router])
            .chain(self.agents.iter())
        {
            out.push_str(&proc.log_tail());
            out.push('\n');
        }
        out
    }

    /// Polls `probe` until it returns `Some` or [`WAIT`] passes; panics with the logs then.
    pub fn wait_for<T>(&self, what: &str, probe: impl FnMut() -> Option<T>) -> T {
        poll(WAIT, probe).unwrap_or_else(|| panic!("timed out waiting for {what}\n{}", self.logs()))
    }

    /// Waits until `/v1/models` lists `model` with `count` healthy agents.
    pub fn wait_healthy_agents(&self, model: &str, count: u64) {
        self.wait_for(&format!("{count} healthy agents for {model}"), || {
            let listing: Value = serde_json::from_str(&self.get("/v1/models").2).ok()?;
            let healthy = listing["data"]
                .as_array()?
                .iter()
                .find(|listed| listed["id"] == model)?["agents"]["healthy"]
                .as_u64()?;
            (healthy == count).then_some(())
        });
    }

    pub fn wait_health(&self) {
        self.wait_for("router /health", || {
            let response = try_request(self.http, &get_request("/health")).ok()?;
            (response.status == 200).then_some(())
        });
    }

    /// Ids listed by the router's `/v1/models`.
    pub fn model_ids(&self) -> Vec<String> {
        let (status, _, body) = self.get("/v1/models");
        assert_eq!(status, 200, "GET /v1/models: {body}");
        let value: Value = serde_json::from_str(&body).expect("models JSON");
        value["data"]
            .as_array()
            .expect("data array")
            .iter()
            .map(|m| m["id"].as_str().expect("model id").to_string())
            .collect()
    }

    pub fn wait_models(&self, models: &[&str]) {
        self.wait_for(&format!("/v1/models to list {models:?}"), || {
            let response =
                try_request(self.http, &self.with_key(get_request("/v1/models"))).ok()?;
            let value: Value = serde_json::from_slice(&response.body).ok()?;
            let ids: Vec<&str> = value["data"]
                .as_array()?
                .iter()
                .filter_map(|m| m["id"].as_str())
                .collect();
            models.iter().all(|m| ids.contains(m)).then_some(())
        });
    }

    pub fn wait_model_gone(&self, model: &str) {
        self.wait_for(&format!("/v1/models to drop {model}"), || {
            let response =
                try_request(self.http, &self.with_key(get_request("/v1/models"))).ok()?;
            let value: Value = serde_json::from_slice(&response.body).ok()?;
            let listed = value["data"]
                .as_array()?
                .iter()
                .any(|m| m["id"].as_str() == Some(model));
            (!listed).then_some(())
        });
    }

    /// The router's `/metrics` text.
    pub fn router_metrics(&self) -> String {
        let response = request(self.metrics, &get_request("/metrics"));
        assert_eq!(response.status, 200);
        String::from_utf8(response.body).expect("metrics utf-8")
    }

    /// `name` summed over every series (so over shards); panics when the router exposes no
    /// series of that name (see [`metric_sum`]).
    pub fn router_metric(&self, name: &str) -> f64 {
        metric_sum(&self.router_metrics(), name, &[])
    }

    /// Polls the router's `name` (summed over shards) until `predicate` holds; returns the value.
    /// A missing series does not satisfy the predicate (it may appear later, e.g. a per-model
    /// gauge after the model's first request); one still missing at the deadline panics saying so.
    pub fn wait_metric(&self, name: &str, predicate: impl Fn(f64) -> bool) -> f64 {
        self.wait_metric_at(
            self.metrics,
            &format!("router metric {name}"),
            name,
            predicate,
        )
    }

    fn wait_metric_at(
        &self,
        at: SocketAddr,
        what: &str,
        name: &str,
        predicate: impl Fn(f64) -> bool,
    ) -> f64 {
        let mut last = None;
        let found = poll(WAIT, || {
            let response = try_request(at, &get_request("/metrics")).ok()?;
            let text = String::from_utf8_lossy(&response.body);
            let value = metric_sum_present(&text, name, &[]);
            last = Some((value, text.into_owned()));
            let value = value?;
            predicate(value).then_some(value)
        });
        found.unwrap_or_else(|| match last {
            Some((None, text)) => panic!(
                "timed out waiting for {what}: no such series is exposed\n{}\n{}",
                metric_lines(&text, name),
                self.logs()
            ),
            Some((Some(value), _)) => panic!(
                "timed out waiting for {what}: last value {value}\n{}",
                self.logs()
            ),
            None => panic!(
                "timed out waiting for {what}: /metrics never answered\n{}",
                self.logs()
            ),
        })
    }

    pub fn sim_metrics(&self, sim: usize) -> String {
        let response = request(self.sim_addrs[sim], &get_request("/metrics"));
        assert_eq!(response.status, 200);
        String::from_utf8(response.body).expect("metrics utf-8")
    }

    /// `name` on sim number `sim`, summed over models.
    pub fn sim_metric(&self, sim: usize, name: &str) -> f64 {
        metric_sum(&self.sim_metrics(sim), name, &[])
    }

    pub fn wait_sim_metric(&self, sim: usize, name: &str, predicate: impl Fn(f64) -> bool) -> f64 {
        self.wait_metric_at(
            self.sim_addrs[sim],
            &format!("sim{sim} metric {name}"),
            name,
            predicate,
        )
    }

    /// Adds the harness's API key header to a raw request head, if the site has one.
    pub fn with_key(&self, raw: Vec<u8>) -> Vec<u8> {
        let Some(key) = &self.api_key else {
            return raw;
        };
        let text = String::from_utf8(raw).expect("utf-8 request");
        let (first_line, rest) = text.split_once("\r\n").expect("request line");
        format!("{first_line}\r\nauthorization: Bearer {key}\r\n{rest}").into_bytes()
    }

    /// `POST path` with a JSON body to the router on a fresh connection.
    pub fn post_json(&self, path: &str, body: &Value) -> (u16, Headers, String) {
        let response = request(
            self.http,
            &self.with_key(post_request(path, &body.to_string())),
        );
        let body = String::from_utf8(response.body).expect("utf-8 body");
        (response.status, response.headers, body)
    }

    /// `GET path` to the router on a fresh connection.
    pub fn get(&self, path: &str) -> (u16, Headers, String) {
        let response = request(self.http, &self.with_key(get_request(path)));
        let body = String::from_utf8(response.body).expect("utf-8 body");
        (response.status, response.headers, body)
    }

    /// Opens a connection and sends a streamed chat request for `model`; the caller reads the
    /// answer (and decides what to assert about it).
    pub fn send_chat_stream(&self, model: &str) -> Conn {
        let mut conn = Conn::connect(self.http);
        conn.send(&post_request(
            "/v1/chat/completions",
            &chat(model, true).to_string(),
        ))
        .unwrap();
        conn
    }

    /// A short non-streamed chat request that must succeed.
    pub fn assert_chat_ok(&self, model: &str) {
        let (status, _, body) = self.post_json("/v1/chat/completions", &chat(model, false));
        assert_eq!(status, 200, "chat to {model}: {body}\n{}", self.logs());
        let value: Value = serde_json::from_str(&body).expect("chat JSON");
        assert_eq!(value["object"], "chat.completion", "{body}");
    }
}

/// The four ports a router listens on.
struct RouterPorts {
    http: SocketAddr,
    grpc: SocketAddr,
    metrics: SocketAddr,
    p2p: u16,
}

fn spawn_router(
    dir: &Path,
    name: &str,
    options: &Options,
    shards: usize,
    ports: &RouterPorts,
) -> Proc {
    let mut args = vec![
        "--http-port".to_string(),
        ports.http.to_string(),
        "--grpc-port".to_string(),
        ports.grpc.to_string(),
        "--metrics-port".to_string(),
        ports.metrics.to_string(),
        "--p2p-port".to_string(),
        ports.p2p.to_string(),
        "--identity-path".to_string(),
        dir.join("router.key").display().to_string(),
    ];
    if !options.router_args.iter().any(|a| a == "--shards") {
        args.extend(strings(&["--shards", &shards.to_string()]));
    }
    let grpc = ports.grpc.to_string();
    args.extend(
        options
            .router_args
            .iter()
            .map(|arg| arg.replace("{grpc}", &grpc)),
    );
    // The audit log goes to the test's directory (its default is under /var/log); a test's
    // own value wins (set after).
    let mut router_env = vec![(
        "HIVENET_ROUTER_AUDIT_LOG_PATH".to_string(),
        dir.join("audit.jsonl").display().to_string(),
    )];
    if options.reaper_logged {
        let base = std::env::var("TEST_CHILD_LOG").unwrap_or_else(|_| "info".to_string());
        router_env.push((
            "RUST_LOG".to_string(),
            format!("{base},hivenet_router::router::front::runtime=debug"),
        ));
    }
    router_env.extend(options.router_env.iter().cloned());
    Proc::spawn(
        name,
        env!("CARGO_BIN_EXE_hivenet-router"),
        &args,
        &router_env,
        dir,
    )
}

/// `Some(true)` once the router logs that it listens, `Some(false)` if it exits first, `None`
/// when neither happens within [`WAIT`].
fn wait_router_started(router: &mut Proc) -> Option<bool> {
    poll(WAIT, || {
        if router.log_text().contains("hivenet-router listening") {
            return Some(true);
        }
        router.exited().then_some(false)
    })
}

fn start_router(dir: &Path, options: &Options, shards: usize) -> (Proc, RouterPorts) {
    let mut last_log = String::new();
    for attempt in 0..ROUTER_START_ATTEMPTS {
        let ports = RouterPorts {
            http: format!("127.0.0.1:{}", free_port()).parse().unwrap(),
            grpc: format!("127.0.0.1:{}", free_port()).parse().unwrap(),
            metrics: format!("127.0.0.1:{}", free_port()).parse().unwrap(),
            p2p: free_port(),
        };
        let mut router = spawn_router(
            dir,
            &format!("router-attempt{attempt}"),
            options,
            shards,
            &ports,
        );
        match wait_router_started(&mut router) {
            Some(true) => return (router, ports),
            Some(false) if router.log_text().contains("in use") => {
                last_log = router.log_tail();
                continue;
            }
            _ => panic!("router did not start\n{}", router.log_tail()),
        }
    }
    panic!("router could not find free ports\n{last_log}");
}

/// Returns once the rest of the UTC day is longer than `span`, waiting for the new day when it
/// is not: a test that counts a daily budget for `span` would see the budget start again at
/// midnight midway (a run across midnight counted two days' budgets against one).
pub fn clear_of_midnight(span: Duration) {
    loop {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .expect("the clock is after 1970");
        let left = Duration::from_secs(86_400 - now.as_secs() % 86_400);
        if left > span {
            return;
        }
        std::thread::sleep(left.min(Duration::from_millis(500)));
    }
}

/// Polls `probe` every [`POLL_INTERVAL`] until it returns `Some` or `deadline` passes.
pub fn poll<T>(deadline: Duration, mut probe: impl FnMut() -> Option<T>) -> Option<T> {
    let start = Instant::now();
    loop {
        if let Some(value) = probe() {
            return Some(value);
        }
        if start.elapsed() > deadline {
            return None;
        }
        std::thread::sleep(POLL_INTERVAL);
    }
}

// ---------------------------------------------------------------------------------------------
// Request bodies

/// A chat completion request for `model`.
/// The tenant id the router gives a key's `owner` (`logic::auth::keys`): the first non-zero
/// 32-bit big-endian window of SHA-256 of the domain and the name.
pub fn tenant_id(owner: &str) -> u32 {
    use sha2::{Digest, Sha256};
    let digest = Sha256::new()
        .chain_update(b"hivenet-router/tenant-id/v1\0")
        .chain_update(owner.as_bytes())
        .finalize();
    digest
        .chunks(4)
        .map(|window| u32::from_be_bytes(window.try_into().unwrap()))
        .find(|id| *id != 0)
        .unwrap()
}

/// An owner name whose tenant is owned by `shard` of `shards` (`tenant-0`, `tenant-1`, ...: the
/// first that fits).
pub fn owner_on(shard: usize, shards: usize) -> String {
    (0..)
        .map(|n| format!("tenant-{n}"))
        .find(|name| tenant_id(name) as usize % shards == shard)
        .unwrap()
}

pub fn chat(model: &str, stream: bool) -> Value {
    serde_json::json!({
        "model": model,
        "stream": stream,
        "messages": [{"role": "user", "content": "hello there"}],
    })
}

// ---------------------------------------------------------------------------------------------
// Metrics

/// Sums every sample of `name` whose labels include all of `labels`; `None` when no sample
/// matches (the series is missing, not zero).
pub fn metric_sum_present(text: &str, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
    let mut sum = None;
    for line in text.lines() {
        if line.starts_with('#') {
            continue;
        }
        let (series, value) = match line.rsplit_once(' ') {
            Some(split) => split,
            None => continue,
        };
        let (series_name, label_text) = match series.split_once('{') {
            Some((n, rest)) => (n, rest.trim_end_matches('}')),
            None => (series, ""),
        };
        if series_name != name {
            continue;
        }
        let matches = labels.iter().all(|(k, v)| {
            label_text
                .split(',')
                .any(|pair| pair == format!("{k}=\"{v}\""))
        });
        if matches {
            let value = value
                .parse::<f64>()
                .unwrap_or_else(|_| panic!("metric {name}: unparsable sample {line:?}"));
            *sum.get_or_insert(0.0) += value;
        }
    }
    sum
}

/// Sums every sample of `name` whose labels include all of `labels`. A missing series is an
/// error, not 0: an assertion that a counter is 0 must not pass because the counter was renamed
/// or dropped. For a series a test expects to be absent, use [`metric_absent`]; for one that may
/// legitimately not exist yet (a wait for its first count), [`metric_sum_present`], with a
/// comment saying why.
pub fn metric_sum(text: &str, name: &str, labels: &[(&str, &str)]) -> f64 {
    metric_sum_present(text, name, labels).unwrap_or_else(|| {
        panic!(
            "no series {name} with labels {labels:?} in /metrics (renamed, dropped, or not \
             exposed until first use? if its absence is expected here, use metric_absent or \
             metric_sum_present and say why)\n{}",
            metric_lines(text, name)
        )
    })
}

/// Whether no sample of `name` with `labels` is exposed (for tests that expect a series to be
/// absent, e.g. a per-model gauge of a model this router does not serve).
pub fn metric_absent(text: &str, name: &str, labels: &[(&str, &str)]) -> bool {
    metric_sum_present(text, name, labels).is_none()
}

/// The exposed samples whose name starts with `name`'s family prefix, for panic messages.
fn metric_lines(text: &str, name: &str) -> String {
    // `hivenet_admission_reaped_total` -> `hivenet_admission`: the neighbours a rename would
    // have left.
    let family = match name.match_indices('_').nth(1) {
        Some((end, _)) => &name[..end],
        None => name,
    };
    let lines: Vec<&str> = text
        .lines()
        .filter(|line| !line.starts_with('#') && line.starts_with(family))
        .collect();
    if lines.is_empty() {
        format!("(no samples starting with {family})")
    } else {
        format!("samples starting with {family}:\n{}", lines.join("\n"))
    }
}

// ---------------------------------------------------------------------------------------------
// HTTP/1.1 client

pub type Headers = Vec<(String, String)>;

/// One response as read off the wire.
#[derive(Debug, Default)]
pub struct Response {
    pub status: u16,
    /// Lower-cased names, values as sent.
    pub headers: Headers,
    /// The body with the framing removed.
    pub body: Vec<u8>,
    /// Payloads of each chunk when the body was chunked.
    pub chunks: Vec<Vec<u8>>,
    /// Every byte of this response, head included, as received.
    pub raw: Vec<u8>,
}

impl Response {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }

    pub fn json(&self) -> Value {
        serde_json::from_slice(&self.body)
            .unwrap_or_else(|e| panic!("response body is not JSON ({e}): {}", self.text()))
    }

    /// The `error.code` of an error envelope.
    pub fn error_code(&self) -> String {
        self.json()["error"]["code"]
            .as_str()
            .unwrap_or_else(|| panic!("no error.code in {}", self.text()))
            .to_string()
    }
}

/// Head of a response being read.
#[derive(Debug)]
pub struct Head {
    pub status: u16,
    pub headers: Headers,
    pub raw: Vec<u8>,
}

impl Head {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
}

/// A client connection that keeps bytes read past one response for the next (pipelining).
pub struct Conn {
    pub stream: TcpStream,
    buffer: Vec<u8>,
    /// Every byte received since the last response started.
    received: Vec<u8>,
}

impl Conn {
    pub fn open(addr: SocketAddr) -> std::io::Result<Conn> {
        let stream = TcpStream::connect_timeout(&addr, Duration::from_secs(10))?;
        stream.set_read_timeout(Some(READ_TIMEOUT))?;
        stream.set_nodelay(true)?;
        Ok(Conn {
            stream,
            buffer: Vec::new(),
            received: Vec::new(),
        })
    }

    pub fn connect(addr: SocketAddr) -> Conn {
        Conn::open(addr).unwrap_or_else(|e| panic!("connect {addr}: {e}"))
    }

    pub fn send(&mut self, bytes: &[u8]) -> std::io::Result<()> {
        self.stream.write_all(bytes)?;
        self.stream.flush()
    }

    /// Reads more bytes into the buffer; `Ok(0)` at end of stream.
    fn fill(&mut self) -> std::io::Result<usize> {
        let mut chunk = [0u8; 16 * 1024];
        let n = self.stream.read(&mut chunk)?;
        self.buffer.extend_from_slice(&chunk[..n]);
        Ok(n)
    }

    fn take(&mut self, n: usize) -> Vec<u8> {
        let bytes: Vec<u8> = self.buffer.drain(..n).collect();
        self.received.extend_from_slice(&bytes);
        bytes
    }

    fn read_line(&mut self) -> std::io::Result<Vec<u8>> {
        loop {
            if let Some(end) = self.buffer.windows(2).position(|w| w == b"\r\n") {
                let mut line = self.take(end + 2);
                line.truncate(end);
                return Ok(line);
            }
            if self.fill()? == 0 {
                return Err(eof("line"));
            }
        }
    }

    fn read_exact_buffered(&mut self, n: usize) -> std::io::Result<Vec<u8>> {
        while self.buffer.len() < n {
            if self.fill()? == 0 {
                return Err(eof("body"));
            }
        }
        Ok(self.take(n))
    }

    /// Reads a response head (status line and headers).
    pub fn read_head(&mut self) -> std::io::Result<Head> {
        self.received.clear();
        let end = loop {
            if let Some(end) = self.buffer.windows(4).position(|w| w == b"\r\n\r\n") {
                break end + 4;
            }
            if self.fill()? == 0 {
                return Err(eof("head"));
            }
        };
        let raw = self.take(end);
        let text = String::from_utf8_lossy(&raw).into_owned();
        let mut lines = text.split("\r\n");
        let status_line = lines.next().unwrap_or_default();
        let status = status_line
            .split(' ')
            .nth(1)
            .and_then(|s| s.parse().ok())
            .ok_or_else(|| std::io::Error::other(format!("bad status line {status_line:?}")))?;
        let headers = lines
            .filter(|l| !l.is_empty())
            .filter_map(|l| l.split_once(':'))
            .map(|(n, v)| (n.trim().to_ascii_lowercase(), v.trim().to_string()))
            .collect();
        Ok(Head {
            status,
            headers,
            raw,
        })
    }

    /// Reads one chunk of a chunked body; `None` for the last (zero-size) chunk, whose trailer
    /// section is consumed too.
    pub fn read_chunk(&mut self) -> std::io::Result<Option<Vec<u8>>> {
        let line = self.read_line()?;
        let size_text = String::from_utf8_lossy(&line);
        let size_text = size_text.split(';').next().unwrap_or_default().trim();
        let size = usize::from_str_radix(size_text, 16)
            .map_err(|_| std::io::Error::other(format!("bad chunk size line {size_text:?}")))?;
        if size == 0 {
            while !self.read_line()?.is_empty() {}
            return Ok(None);
        }
        let data = self.read_exact_buffered(size)?;
        let crlf = self.read_exact_buffered(2)?;
        if crlf != b"\r\n" {
            return Err(std::io::Error::other("chunk not followed by CRLF"));
        }
        Ok(Some(data))
    }

    /// Reads the rest of a chunked body, to its last chunk, as text.
    pub fn read_chunked_text(&mut self) -> std::io::Result<String> {
        let mut body = Vec::new();
        while let Some(chunk) = self.read_chunk()? {
            body.extend(chunk);
        }
        Ok(String::from_utf8_lossy(&body).into_owned())
    }

    /// Reads one whole response (for a request that was not `HEAD`).
    pub fn read_response(&mut self) -> std::io::Result<Response> {
        let head = self.read_head()?;
        let mut response = Response {
            status: head.status,
            headers: head.headers.clone(),
            ..Response::default()
        };
        let chunked = head
            .header("transfer-encoding")
            .is_some_and(|v| v.eq_ignore_ascii_case("chunked"));
        if head.status == 100 || head.status == 204 || head.status == 304 {
        } else if chunked {
            while let Some(chunk) = self.read_chunk()? {
                response.body.extend_from_slice(&chunk);
                response.chunks.push(chunk);
            }
        } else if let Some(length) = head.header("content-length") {
            let length: usize = length
                .parse()
                .map_err(|_| std::io::Error::other("bad content-length"))?;
            response.body = self.read_exact_buffered(length)?;
        } else {
            while self.fill()? > 0 {}
            let n = self.buffer.len();
            response.body = self.take(n);
        }
        response.raw = std::mem::take(&mut self.received);
        Ok(response)
    }

    /// Whether the peer closed the connection (reads end of stream within `READ_TIMEOUT`, or the
    /// connection was reset), with no further bytes.
    pub fn closed_by_peer(&mut self) -> bool {
        if !self.buffer.is_empty() {
            return false;
        }
        match self.fill() {
            Ok(0) => true,
            Ok(_) => false,
            Err(e) => matches!(
                e.kind(),
                std::io::ErrorKind::ConnectionReset | std::io::ErrorKind::ConnectionAborted
            ),
        }
    }
}

fn eof(what: &str) -> std::io::Error {
    std::io::Error::new(
        std::io::ErrorKind::UnexpectedEof,
        format!("connection closed while reading the {what}"),
    )
}

/// The redirect secret [`Options::site`] gives every site (32+ bytes, so sites verify each
/// other's tokens).
pub const REDIRECT_SECRET: &str = "shared-redirect-secret-0123456789abcdef";

/// Writes `contents` to a file named after `name` (and this process) under the tests' temp
/// directory; returns its path.
pub fn write_temp(name: &str, contents: &str) -> String {
    let path =
        PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("{name}-{}", std::process::id()));
    std::fs::write(&path, contents).expect("write a temp file");
    path.display().to_string()
}

/// The router binary with `args` for a start-up check: free loopback ports, an identity and working
/// directory under `dir`, none of the test environment's `HIVENET_*` variables but `env`.
fn start_up_command(dir: &Path, args: &[&str], env: &[(&str, &str)]) -> std::process::Command {
    let mut command = std::process::Command::new(env!("CARGO_BIN_EXE_hivenet-router"));
    for (key, _) in std::env::vars() {
        if key.starts_with("HIVENET_") {
            command.env_remove(key);
        }
    }
    command
        .args(args)
        .args([
            "--identity-path",
            &dir.join("router.key").display().to_string(),
        ])
        .args([
            "--http-port",
            &format!("127.0.0.1:{}", free_port()),
            "--grpc-port",
            &format!("127.0.0.1:{}", free_port()),
            "--metrics-port",
            &format!("127.0.0.1:{}", free_port()),
            "--p2p-port",
            &free_port().to_string(),
        ])
        .env("HIVENET_ROUTER_JWT_SECRET", "test-secret")
        .envs(env.iter().copied())
        .current_dir(dir);
    command
}

/// Runs the router binary with `args` until it exits, for start-up checks: free loopback ports,
/// an identity and working directory under `dir`, none of the test environment's `HIVENET_*`
/// variables but `env`. Returns whether it exited successfully, and its stderr.
pub fn run_router_to_exit(dir: &Path, args: &[&str], env: &[(&str, &str)]) -> (bool, String) {
    let output = start_up_command(dir, args, env)
        .output()
        .expect("run hivenet-router");
    (
        output.status.success(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

/// [`run_router_to_exit`] for a start-up check that may not end: the router runs with `args` for
/// at most `within`. Returns whether it exited successfully and its output (log lines and
/// stderr together), or `None` when it still ran at the deadline (it started; it is killed).
pub fn run_router_within(
    dir: &Path,
    args: &[&str],
    env: &[(&str, &str)],
    within: Duration,
) -> Option<(bool, String)> {
    let stderr_path = dir.join(format!("router-within-{}.stderr", free_port()));
    let stderr = std::fs::File::create(&stderr_path).expect("create the router's stderr file");
    let mut child = start_up_command(dir, args, env)
        .stdout(stderr.try_clone().expect("share the output file"))
        .stderr(stderr)
        .spawn()
        .expect("run hivenet-router");
    let status = poll(within, || child.try_wait().ok().flatten());
    if status.is_none() {
        let _ = child.kill();
        let _ = child.wait();
    }
    let text = std::fs::read_to_string(&stderr_path).unwrap_or_default();
    status.map(|status| (status.success(), text))
}

/// [`run_router_to_exit`] for a router that must refuse to start; returns its stderr.
pub fn refused_start(dir: &Path, args: &[&str], env: &[(&str, &str)]) -> String {
    let (started, stderr) = run_router_to_exit(dir, args, env);
    assert!(!started, "started with {args:?}");
    stderr
}

/// Sends `raw` on a fresh connection and reads one response.
pub fn try_request(addr: SocketAddr, raw: &[u8]) -> std::io::Result<Response> {
    let mut conn = Conn::open(addr)?;
    conn.send(raw)?;
    conn.read_response()
}

/// [`try_request`] that panics on I/O errors.
pub fn request(addr: SocketAddr, raw: &[u8]) -> Response {
    try_request(addr, raw).unwrap_or_else(|e| panic!("request to {addr}: {e}"))
}

pub fn get_request(path: &str) -> Vec<u8> {
    format!("GET {path} HTTP/1.1\r\nhost: test\r\nconnection: close\r\n\r\n").into_bytes()
}

pub fn post_request(path: &str, body: &str) -> Vec<u8> {
    format!(
        "POST {path} HTTP/1.1\r\nhost: test\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
        body.len()
    )
    .into_bytes()
}

/// Like [`post_request`] without `connection: close`, for keep-alive and pipelining.
pub fn post_request_keep_alive(path: &str, body: &str) -> Vec<u8> {
    format!(
        "POST {path} HTTP/1.1\r\nhost: test\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    )
    .into_bytes()
}

/// Splits an SSE body into events (the text between blank lines), checking each ends in `\n\n`.
pub fn sse_events(body: &[u8]) -> Vec<String> {
    let text = std::str::from_utf8(body).expect("SSE is utf-8");
    assert!(
        text.ends_with("\n\n"),
        "SSE body does not end with a blank line: {text:?}"
    );
    text[..text.len() - 2]
        .split("\n\n")
        .map(|e| e.to_string())
        .collect()
}

/// The engine's side of one HTTP/1.1 request, for test engines written by hand: the head
/// (lower-cased, request line first) and the body, chunked as the agent sends it or by
/// `content-length`. `None`: the connection ended first.
pub fn read_engine_request(reader: &mut impl std::io::BufRead) -> Option<(String, Vec<u8>)> {
    let mut head = String::new();
    loop {
        let mut line = String::new();
        if reader.read_line(&mut line).unwrap_or(0) == 0 {
            return None;
        }
        if line == "\r\n" {
            break;
        }
        head.push_str(&line.to_ascii_lowercase());
    }
    let mut body = Vec::new();
    if head.contains("transfer-encoding: chunked") {
        loop {
            let mut size = String::new();
            if reader.read_line(&mut size).unwrap_or(0) == 0 {
                return None;
            }
            let size = usize::from_str_radix(size.trim(), 16).unwrap_or(0);
            let mut chunk = vec![0u8; size + 2];
            reader.read_exact(&mut chunk).ok()?;
            if size == 0 {
                break;
            }
            body.extend_from_slice(&chunk[..size]);
        }
    } else if let Some(length) = head
        .lines()
        .find_map(|line| line.strip_prefix("content-length:"))
    {
        body = vec![0u8; length.trim().parse().unwrap_or(0)];
        reader.read_exact(&mut body).ok()?;
    }
    Some((head, body))
}

impl Site {
    /// Adds an agent in front of a hand-written test engine at `engine` serving `model`
    /// (`--engine custom`, capacity 4, plus `agent_args`), and waits until the model is listed
    /// and the agent has a tunnel to every shard.
    pub fn serve_custom_engine(&mut self, engine: SocketAddr, model: &str, agent_args: &[&str]) {
        self.sim_addrs.push(engine);
        let health = format!("http://{engine}/health");
        let mut args = vec![
            "--engine",
            "custom",
            "--health-url",
            &health,
            "--model",
            model,
            "--capacity",
            "4",
        ];
        args.extend_from_slice(agent_args);
        let sim = self.sim_addrs.len() - 1;
        self.spawn_agent(sim, &args);
        self.wait_models(&[model]);
        self.wait_metric("hivenet_shard_tunnels_open", |open| {
            open >= self.shards as f64
        });
    }
}

/// One POST over HTTP/2 with prior knowledge (h2c), read to the end: status, head and body.
pub fn h2c_post(addr: SocketAddr, path: &str, body: &str) -> (u16, http::HeaderMap, Vec<u8>) {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let socket = tokio::net::TcpStream::connect(addr).await.unwrap();
        let (send, connection) = h2::client::handshake(socket).await.unwrap();
        tokio::spawn(connection);
        let mut send = send.ready().await.unwrap();
        let request = http::Request::post(path)
            .header("content-type", "application/json")
            .body(())
            .unwrap();
        let (response, mut outbound) = send.send_request(request, false).unwrap();
        outbound
            .send_data(bytes::Bytes::from(body.to_owned()), true)
            .unwrap();
        let (head, mut inbound) = response.await.unwrap().into_parts();
        let mut data = Vec::new();
        while let Some(chunk) = inbound.data().await {
            let chunk = chunk.unwrap();
            let _ = inbound.flow_control().release_capacity(chunk.len());
            data.extend_from_slice(&chunk);
        }
        (head.status.as_u16(), head.headers, data)
    })
}

/// A single-threaded runtime for a test that drives async library code directly.
pub fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a tokio runtime")
}
