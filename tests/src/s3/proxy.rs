//! A TCP proxy in front of the S3 server that injects faults on command: refuse, answer 503, stall
//! or relay, so the sink's behaviour against a failing bucket can be tested.

#[allow(clippy::wildcard_imports)]
use super::*;

/// What a [`FaultProxy`] does with connections.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// Relay bytes both ways to the upstream server.
    Pass,
    /// Answer every request `503 Service Unavailable` (S3 `SlowDown` XML body) and close.
    Http503,
    /// Close the listening socket: connecting fails with "connection refused".
    Refuse,
    /// Accept connections and never answer (until the mode changes or the proxy is dropped).
    Stall,
}

impl Mode {
    fn code(self) -> u8 {
        match self {
            Mode::Pass => 0,
            Mode::Http503 => 1,
            Mode::Refuse => 2,
            Mode::Stall => 3,
        }
    }

    fn from_code(c: u8) -> Mode {
        match c {
            1 => Mode::Http503,
            2 => Mode::Refuse,
            3 => Mode::Stall,
            _ => Mode::Pass,
        }
    }
}

struct Shared {
    mode: AtomicU8,
    /// The mode the accept loop has put in place (set_mode waits for it).
    applied: AtomicU8,
    stop: AtomicBool,
    connections: AtomicU64,
    /// Client sides of live connections, shut down on a mode change and on drop so that pooled
    /// keep-alive connections cannot bypass the new mode.
    live: Mutex<Vec<(u64, TcpStream)>>,
}

impl Shared {
    fn mode(&self) -> Mode {
        Mode::from_code(self.mode.load(Ordering::SeqCst))
    }

    fn cut_all(&self) {
        let mut live = self
            .live
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        for (_, s) in live.drain(..) {
            let _ = s.shutdown(Shutdown::Both);
        }
    }

    fn forget(&self, id: u64) {
        let mut live = self
            .live
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        live.retain(|(i, _)| *i != id);
    }
}

/// A TCP proxy on its own loopback port in front of an S3 server, switchable between passing
/// traffic, answering 503, refusing connections and stalling. Point the code under test at
/// [`FaultProxy::endpoint`]. Changing the mode cuts every open connection, so a client's
/// connection pool sees the new mode on its next request. Threads end when the proxy is dropped.
pub struct FaultProxy {
    /// `http://127.0.0.1:<port>`.
    pub endpoint: String,
    /// The proxy's port.
    pub port: u16,
    shared: Arc<Shared>,
    acceptor: Option<JoinHandle<()>>,
}

impl FaultProxy {
    /// A proxy in [`Mode::Pass`] to `127.0.0.1:<upstream_port>`.
    ///
    /// # Panics
    /// When no loopback port can be bound.
    #[must_use]
    pub fn start(upstream_port: u16) -> FaultProxy {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind the fault proxy");
        let port = listener.local_addr().expect("proxy address").port();
        listener
            .set_nonblocking(true)
            .expect("nonblocking listener");
        let shared = Arc::new(Shared {
            mode: AtomicU8::new(Mode::Pass.code()),
            applied: AtomicU8::new(Mode::Pass.code()),
            stop: AtomicBool::new(false),
            connections: AtomicU64::new(0),
            live: Mutex::new(Vec::new()),
        });
        let upstream = SocketAddr::from(([127, 0, 0, 1], upstream_port));
        let sh = Arc::clone(&shared);
        let acceptor = std::thread::Builder::new()
            .name("fault-proxy".into())
            .spawn(move || accept_loop(Some(listener), port, upstream, &sh))
            .expect("spawn the fault proxy");
        FaultProxy {
            endpoint: format!("http://127.0.0.1:{port}"),
            port,
            shared,
            acceptor: Some(acceptor),
        }
    }

    /// Switch mode; returns once the new mode is in force for new connections (open ones are cut).
    ///
    /// # Panics
    /// When the proxy does not apply it within 5 s (e.g. its port was taken while refusing).
    pub fn set_mode(&self, mode: Mode) {
        self.shared.mode.store(mode.code(), Ordering::SeqCst);
        self.shared.cut_all();
        let until = Instant::now() + Duration::from_secs(5);
        while self.shared.applied.load(Ordering::SeqCst) != mode.code() {
            assert!(
                Instant::now() < until,
                "the fault proxy did not switch to {mode:?} within 5 s"
            );
            std::thread::sleep(Duration::from_millis(5));
        }
        // Connections accepted just before the switch.
        self.shared.cut_all();
    }

    /// The current mode.
    #[must_use]
    pub fn mode(&self) -> Mode {
        self.shared.mode()
    }

    /// Connections accepted so far (all modes but Refuse).
    #[must_use]
    pub fn connections(&self) -> u64 {
        self.shared.connections.load(Ordering::SeqCst)
    }
}

impl Drop for FaultProxy {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::SeqCst);
        self.shared.cut_all();
        if let Some(h) = self.acceptor.take() {
            let _ = h.join();
        }
        self.shared.cut_all();
    }
}

fn accept_loop(
    mut listener: Option<TcpListener>,
    port: u16,
    upstream: SocketAddr,
    sh: &Arc<Shared>,
) {
    let mut next_id = 0u64;
    while !sh.stop.load(Ordering::SeqCst) {
        let mode = sh.mode();
        if mode == Mode::Refuse {
            listener = None;
            sh.applied.store(mode.code(), Ordering::SeqCst);
            std::thread::sleep(Duration::from_millis(5));
            continue;
        }
        if listener.is_none() {
            match TcpListener::bind(("127.0.0.1", port))
                .and_then(|l| l.set_nonblocking(true).map(|()| l))
            {
                Ok(l) => listener = Some(l),
                Err(_) => {
                    std::thread::sleep(Duration::from_millis(10));
                    continue;
                }
            }
        }
        sh.applied.store(mode.code(), Ordering::SeqCst);
        let Some(l) = listener.as_ref() else { continue };
        match l.accept() {
            Ok((client, _)) => {
                let _ = client.set_nonblocking(false);
                sh.connections.fetch_add(1, Ordering::SeqCst);
                next_id += 1;
                let id = next_id;
                let mode = sh.mode();
                if let Ok(c) = client.try_clone() {
                    sh.live
                        .lock()
                        .unwrap_or_else(std::sync::PoisonError::into_inner)
                        .push((id, c));
                }
                let sh2 = Arc::clone(sh);
                let _ = std::thread::Builder::new()
                    .name("fault-proxy-conn".into())
                    .spawn(move || {
                        match mode {
                            Mode::Pass => relay(client, upstream),
                            Mode::Http503 => answer_503(client),
                            Mode::Stall | Mode::Refuse => stall(&client, &sh2, mode),
                        }
                        sh2.forget(id);
                    });
            }
            Err(e) if e.kind() == ErrorKind::WouldBlock => {
                std::thread::sleep(Duration::from_millis(5))
            }
            Err(_) => std::thread::sleep(Duration::from_millis(5)),
        }
    }
}

/// Copy both ways until either side closes (or the proxy cuts the client side).
fn relay(client: TcpStream, upstream: SocketAddr) {
    let Ok(server) = TcpStream::connect_timeout(&upstream, Duration::from_secs(2)) else {
        let _ = client.shutdown(Shutdown::Both);
        return;
    };
    let (Ok(mut c_read), Ok(mut s_write), Ok(s_shut), Ok(c_shut)) = (
        client.try_clone(),
        server.try_clone(),
        server.try_clone(),
        client.try_clone(),
    ) else {
        return;
    };
    let up = std::thread::spawn(move || {
        let _ = std::io::copy(&mut c_read, &mut s_write);
        let _ = s_shut.shutdown(Shutdown::Both);
        let _ = c_shut.shutdown(Shutdown::Both);
    });
    let (mut s_read, mut c_write) = (server, client);
    let _ = std::io::copy(&mut s_read, &mut c_write);
    let _ = c_write.shutdown(Shutdown::Both);
    let _ = s_read.shutdown(Shutdown::Both);
    let _ = up.join();
}

/// Read the request head (and a Content-Length body, so the client sees the answer rather than
/// a reset), answer 503 with an S3 error body, close.
fn answer_503(mut client: TcpStream) {
    let _ = client.set_read_timeout(Some(Duration::from_secs(2)));
    let mut buf = Vec::new();
    let mut chunk = [0u8; 8192];
    let head_end = loop {
        if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break Some(i + 4);
        }
        if buf.len() > 1 << 20 {
            break None;
        }
        match client.read(&mut chunk) {
            Ok(0) | Err(_) => break None,
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
        }
    };
    if let Some(end) = head_end {
        let head = String::from_utf8_lossy(&buf[..end]).to_ascii_lowercase();
        let length = head
            .lines()
            .find_map(|l| l.strip_prefix("content-length:"))
            .and_then(|v| v.trim().parse::<usize>().ok())
            .unwrap_or(0);
        let mut left = length.saturating_sub(buf.len() - end);
        while left > 0 {
            match client.read(&mut chunk) {
                Ok(0) | Err(_) => break,
                Ok(n) => left = left.saturating_sub(n),
            }
        }
    }
    let body = "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<Error><Code>SlowDown</Code>\
                <Message>fault proxy: service unavailable</Message></Error>";
    let answer = format!(
        "HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/xml\r\ncontent-length: {}\r\n\
         connection: close\r\n\r\n{body}",
        body.len()
    );
    let _ = client.write_all(answer.as_bytes());
    let _ = client.flush();
    let _ = client.shutdown(Shutdown::Both);
}

/// Hold the connection without answering until the mode changes or the proxy stops.
fn stall(client: &TcpStream, sh: &Shared, mode: Mode) {
    while !sh.stop.load(Ordering::SeqCst) && sh.mode() == mode {
        std::thread::sleep(Duration::from_millis(10));
    }
    let _ = client.shutdown(Shutdown::Both);
}
