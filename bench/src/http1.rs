//! A lean HTTP/1.1 client for the load loops: one keep-alive connection per request in flight,
//! each request written with one `write` and its answer read with as few `read`s as it takes,
//! parsed for the status, `Content-Length` or chunked framing, and the body.
//!
//! The load shares the machine's two cores with the servers it measures, so what the client
//! spends is taken from them. hyper's pooled client (`hyper_util::client::legacy`) spent about
//! 18 µs of CPU per request in the one-message-per-request phase (0.45 cores at 25k requests a
//! second), the NATS client about 9 µs per message; this one does what the exchange needs and
//! nothing else, so that both peers are measured with a client of about the same weight.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Mutex;

use bytes::Bytes;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// The largest answer head read (status line and headers).
const MAX_HEAD: usize = 64 << 10;
/// The largest answer body read.
const MAX_BODY: usize = 256 << 20;

/// Idle keep-alive connections by server address.
#[derive(Default)]
pub struct Client {
    idle: Mutex<HashMap<SocketAddr, Vec<TcpStream>>>,
}

/// One request.
pub struct Request<'a> {
    pub method: &'a str,
    pub path: &'a str,
    pub headers: &'a [(&'a str, &'a str)],
    pub body: &'a [u8],
}

impl Client {
    pub fn new() -> Self {
        Self::default()
    }

    fn take(&self, addr: SocketAddr) -> Option<TcpStream> {
        self.idle
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .get_mut(&addr)
            .and_then(Vec::pop)
    }

    fn give_back(&self, addr: SocketAddr, conn: TcpStream) {
        self.idle
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .entry(addr)
            .or_default()
            .push(conn);
    }

    /// Send `req` to `addr` and read the answer: its status and body. A reused connection that
    /// the server closed in the meantime is replaced once by a new one.
    pub async fn request(
        &self,
        addr: SocketAddr,
        req: &Request<'_>,
    ) -> Result<(u16, Bytes), String> {
        let mut head = String::with_capacity(160);
        head.push_str(req.method);
        head.push(' ');
        head.push_str(req.path);
        head.push_str(" HTTP/1.1\r\nhost: ");
        head.push_str(&addr.to_string());
        for (k, v) in req.headers {
            head.push_str("\r\n");
            head.push_str(k);
            head.push_str(": ");
            head.push_str(v);
        }
        head.push_str("\r\ncontent-length: ");
        head.push_str(&req.body.len().to_string());
        head.push_str("\r\n\r\n");
        let mut wire = Vec::with_capacity(head.len() + req.body.len());
        wire.extend_from_slice(head.as_bytes());
        wire.extend_from_slice(req.body);

        if let Some(conn) = self.take(addr) {
            match exchange(conn, &wire).await {
                Ok((status, body, conn)) => {
                    if let Some(c) = conn {
                        self.give_back(addr, c);
                    }
                    return Ok((status, body));
                }
                // Nothing came back on a reused connection: it was closed while idle.
                Err(Failure::Stale) => {}
                Err(Failure::Other(e)) => return Err(e),
            }
        }
        let conn = TcpStream::connect(addr)
            .await
            .map_err(|e| format!("connect {addr}: {e}"))?;
        conn.set_nodelay(true).map_err(|e| e.to_string())?;
        match exchange(conn, &wire).await {
            Ok((status, body, conn)) => {
                if let Some(c) = conn {
                    self.give_back(addr, c);
                }
                Ok((status, body))
            }
            Err(Failure::Stale) => Err(format!("{addr} closed the connection without an answer")),
            Err(Failure::Other(e)) => Err(e),
        }
    }
}

enum Failure {
    /// The connection ended before any byte of an answer.
    Stale,
    Other(String),
}

/// Write `wire` and read one answer; the connection back when it can be used again.
async fn exchange(
    mut conn: TcpStream,
    wire: &[u8],
) -> Result<(u16, Bytes, Option<TcpStream>), Failure> {
    if conn.write_all(wire).await.is_err() {
        return Err(Failure::Stale);
    }
    let mut buf: Vec<u8> = Vec::with_capacity(4096);
    // The head.
    let end = loop {
        if let Some(at) = find(&buf, b"\r\n\r\n") {
            break at + 4;
        }
        if buf.len() > MAX_HEAD {
            return Err(Failure::Other("answer head too long".into()));
        }
        let n = read_more(&mut conn, &mut buf).await?;
        if n == 0 {
            return Err(if buf.is_empty() {
                Failure::Stale
            } else {
                Failure::Other("connection closed inside an answer head".into())
            });
        }
    };
    let head = std::str::from_utf8(&buf[..end])
        .map_err(|_| Failure::Other("answer head is not UTF-8".into()))?;
    let mut lines = head.split("\r\n");
    let status = lines
        .next()
        .and_then(|l| l.split(' ').nth(1))
        .and_then(|s| s.parse::<u16>().ok())
        .ok_or_else(|| Failure::Other(format!("bad status line in {head:?}")))?;
    let (mut length, mut chunked, mut close) = (None, false, false);
    for line in lines {
        let Some((k, v)) = line.split_once(':') else {
            continue;
        };
        let (k, v) = (k.trim(), v.trim());
        if k.eq_ignore_ascii_case("content-length") {
            length = v.parse::<usize>().ok();
        } else if k.eq_ignore_ascii_case("transfer-encoding") {
            chunked = v.eq_ignore_ascii_case("chunked");
        } else if k.eq_ignore_ascii_case("connection") {
            close = v.eq_ignore_ascii_case("close");
        }
    }
    let body = if chunked {
        read_chunked(&mut conn, buf, end).await?
    } else if let Some(len) = length {
        if len > MAX_BODY {
            return Err(Failure::Other(format!("answer body of {len} bytes")));
        }
        while buf.len() < end + len {
            if read_more(&mut conn, &mut buf).await? == 0 {
                return Err(Failure::Other(
                    "connection closed inside an answer body".into(),
                ));
            }
        }
        Bytes::copy_from_slice(&buf[end..end + len])
    } else {
        // Delimited by the end of the connection.
        close = true;
        while read_more(&mut conn, &mut buf).await? > 0 {
            if buf.len() > end + MAX_BODY {
                return Err(Failure::Other("answer body too long".into()));
            }
        }
        Bytes::copy_from_slice(&buf[end..])
    };
    Ok((status, body, (!close).then_some(conn)))
}

async fn read_more(conn: &mut TcpStream, buf: &mut Vec<u8>) -> Result<usize, Failure> {
    if buf.capacity() - buf.len() < 4096 {
        buf.reserve(buf.capacity().max(4096));
    }
    conn.read_buf(buf)
        .await
        .map_err(|e| Failure::Other(format!("read: {e}")))
}

/// A chunked body that starts at `buf[at..]`.
async fn read_chunked(
    conn: &mut TcpStream,
    mut buf: Vec<u8>,
    mut at: usize,
) -> Result<Bytes, Failure> {
    let mut body = Vec::new();
    loop {
        let line_end = loop {
            if let Some(i) = find(&buf[at..], b"\r\n") {
                break at + i;
            }
            if read_more(conn, &mut buf).await? == 0 {
                return Err(Failure::Other(
                    "connection closed inside a chunk size".into(),
                ));
            }
        };
        let size_text = std::str::from_utf8(&buf[at..line_end])
            .map_err(|_| Failure::Other("bad chunk size".into()))?;
        let size = usize::from_str_radix(size_text.split(';').next().unwrap_or("").trim(), 16)
            .map_err(|_| Failure::Other(format!("bad chunk size {size_text:?}")))?;
        at = line_end + 2;
        if body.len() + size > MAX_BODY {
            return Err(Failure::Other("answer body too long".into()));
        }
        // The chunk and its CRLF (after the last chunk: the empty trailer's CRLF).
        while buf.len() < at + size + 2 {
            if read_more(conn, &mut buf).await? == 0 {
                return Err(Failure::Other("connection closed inside a chunk".into()));
            }
        }
        if size == 0 {
            return Ok(Bytes::from(body));
        }
        body.extend_from_slice(&buf[at..at + size]);
        at += size + 2;
    }
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::net::TcpListener;

    /// A server that answers each request on a connection with the next of `answers`, then
    /// closes it; every request it read is sent back through the channel.
    async fn serve(
        answers: Vec<&'static str>,
    ) -> (SocketAddr, tokio::sync::mpsc::UnboundedReceiver<Vec<u8>>) {
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap();
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        tokio::spawn(async move {
            let (mut s, _) = l.accept().await.unwrap();
            for a in answers {
                let mut got = Vec::new();
                let mut b = [0u8; 4096];
                while find(&got, b"\r\n\r\n").is_none() {
                    let n = s.read(&mut b).await.unwrap();
                    got.extend_from_slice(&b[..n]);
                }
                let head_end = find(&got, b"\r\n\r\n").unwrap() + 4;
                let head = String::from_utf8_lossy(&got[..head_end]).to_lowercase();
                let len: usize = head
                    .split("content-length: ")
                    .nth(1)
                    .and_then(|r| r.split("\r\n").next())
                    .and_then(|n| n.parse().ok())
                    .unwrap();
                while got.len() < head_end + len {
                    let n = s.read(&mut b).await.unwrap();
                    got.extend_from_slice(&b[..n]);
                }
                tx.send(got).unwrap();
                s.write_all(a.as_bytes()).await.unwrap();
            }
        });
        (addr, rx)
    }

    /// `f`, which must end within ten seconds.
    async fn within<T>(f: impl Future<Output = T>) -> T {
        tokio::time::timeout(std::time::Duration::from_secs(10), f)
            .await
            .expect("answered in time")
    }

    #[tokio::test]
    async fn answers_are_read_whole_and_the_connection_kept() {
        let (addr, mut seen) = serve(vec![
            "HTTP/1.1 200 OK\r\ncontent-length: 5\r\ncontent-type: x\r\n\r\nhello",
            "HTTP/1.1 400 Bad Request\r\ntransfer-encoding: chunked\r\n\r\n3\r\nabc\r\n2;x=1\r\nde\r\n0\r\n\r\n",
            "HTTP/1.1 201 Created\r\nContent-Length: 0\r\n\r\n",
        ])
        .await;
        let c = Client::new();
        let req = |body: &'static [u8]| Request {
            method: "POST",
            path: "/api/v1/push",
            headers: &[("content-type", "application/json")],
            body,
        };
        // A second connection would never be answered: the server accepts one.
        assert_eq!(
            within(c.request(addr, &req(b"{\"a\":1}"))).await.unwrap(),
            (200, Bytes::from_static(b"hello"))
        );
        let sent = String::from_utf8(seen.recv().await.unwrap()).unwrap();
        assert!(sent.starts_with("POST /api/v1/push HTTP/1.1\r\n"), "{sent}");
        assert!(
            sent.contains("content-type: application/json\r\n"),
            "{sent}"
        );
        assert!(
            sent.ends_with("content-length: 7\r\n\r\n{\"a\":1}"),
            "{sent}"
        );
        assert_eq!(
            within(c.request(addr, &req(b""))).await.unwrap(),
            (400, Bytes::from_static(b"abcde"))
        );
        assert_eq!(
            within(c.request(addr, &req(b"x"))).await.unwrap(),
            (201, Bytes::new())
        );
        assert!(seen.recv().await.unwrap().ends_with(b"\r\n\r\n"));
        assert!(seen.recv().await.unwrap().ends_with(b"\r\n\r\nx"));
    }

    #[tokio::test]
    async fn a_closed_idle_connection_is_replaced_once() {
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap();
        tokio::spawn(async move {
            // The first connection answers once and closes; the second answers once.
            for body in ["one", "two"] {
                let (mut s, _) = l.accept().await.unwrap();
                let mut b = [0u8; 4096];
                let mut got = Vec::new();
                while find(&got, b"\r\n\r\n").is_none() {
                    let n = s.read(&mut b).await.unwrap();
                    got.extend_from_slice(&b[..n]);
                }
                let a = format!(
                    "HTTP/1.1 200 OK\r\ncontent-length: {}\r\n\r\n{body}",
                    body.len()
                );
                s.write_all(a.as_bytes()).await.unwrap();
                drop(s);
            }
        });
        let c = Client::new();
        let req = Request {
            method: "GET",
            path: "/health",
            headers: &[],
            body: b"",
        };
        assert_eq!(
            c.request(addr, &req).await.unwrap().1,
            Bytes::from_static(b"one")
        );
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        assert_eq!(
            c.request(addr, &req).await.unwrap().1,
            Bytes::from_static(b"two")
        );
    }
}
