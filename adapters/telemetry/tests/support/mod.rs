//! A stand-in OTLP collector on loopback: plain HTTP/1.1, records what arrives.
#![allow(dead_code, reason = "each test binary uses a part of this module")]

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::{Mutex, mpsc};
use std::time::{Duration, Instant};

/// One request as the collector saw it.
#[derive(Debug, Clone)]
pub struct Received {
    pub method: String,
    pub path: String,
    pub content_type: String,
    pub body_len: usize,
}

/// How the stand-in behaves.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Behaviour {
    /// Answers every request with 200 and an empty body.
    Answer,
    /// Accepts connections, reads, never answers.
    Hang,
}

pub struct Collector {
    pub addr: SocketAddr,
    received: mpsc::Receiver<Received>,
    seen: Mutex<Vec<Received>>,
    connections: mpsc::Receiver<()>,
}

impl Collector {
    pub fn start(behaviour: Behaviour) -> Collector {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind loopback");
        let addr = listener.local_addr().expect("local addr");
        let (sent, received) = mpsc::channel();
        let (connected, connections) = mpsc::channel();
        std::thread::spawn(move || {
            for stream in listener.incoming() {
                let Ok(stream) = stream else { return };
                let _ = connected.send(());
                let sent = sent.clone();
                std::thread::spawn(move || serve(stream, behaviour, &sent));
            }
        });
        Collector {
            addr,
            received,
            seen: Mutex::new(Vec::new()),
            connections,
        }
    }

    pub fn endpoint(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Waits until a request for `path` has arrived (now or earlier), or `within` passes.
    pub fn wait_for(&self, path: &str, within: Duration) -> Option<Received> {
        let deadline = Instant::now() + within;
        let mut seen = self.seen.lock().unwrap_or_else(|e| e.into_inner());
        loop {
            if let Some(r) = seen.iter().find(|r| r.path == path) {
                return Some(r.clone());
            }
            let left = deadline.checked_duration_since(Instant::now())?;
            seen.push(self.received.recv_timeout(left).ok()?);
        }
    }

    /// Waits until a connection is accepted, or `within` passes.
    pub fn wait_for_connection(&self, within: Duration) -> bool {
        self.connections.recv_timeout(within).is_ok()
    }
}

fn serve(stream: TcpStream, behaviour: Behaviour, sent: &mpsc::Sender<Received>) {
    let Ok(mut writer) = stream.try_clone() else {
        return;
    };
    let mut reader = BufReader::new(stream);
    loop {
        let mut request_line = String::new();
        if reader.read_line(&mut request_line).unwrap_or(0) == 0 {
            return;
        }
        let mut parts = request_line.split_whitespace();
        let method = parts.next().unwrap_or_default().to_owned();
        let path = parts.next().unwrap_or_default().to_owned();
        let mut content_type = String::new();
        let mut content_length = 0usize;
        loop {
            let mut header = String::new();
            if reader.read_line(&mut header).unwrap_or(0) == 0 {
                return;
            }
            let header = header.trim_end();
            if header.is_empty() {
                break;
            }
            if let Some((name, value)) = header.split_once(':') {
                match name.trim().to_ascii_lowercase().as_str() {
                    "content-type" => content_type = value.trim().to_owned(),
                    "content-length" => content_length = value.trim().parse().unwrap_or(0),
                    _ => {}
                }
            }
        }
        let mut body = vec![0u8; content_length];
        if reader.read_exact(&mut body).is_err() {
            return;
        }
        if behaviour == Behaviour::Hang {
            // Keep the connection open and silent until the client gives up.
            let _ = reader.read_to_end(&mut Vec::new());
            return;
        }
        let _ = sent.send(Received {
            method,
            path,
            content_type,
            body_len: body.len(),
        });
        let answer =
            "HTTP/1.1 200 OK\r\ncontent-type: application/x-protobuf\r\ncontent-length: 0\r\n\r\n";
        if writer.write_all(answer.as_bytes()).is_err() {
            return;
        }
    }
}
