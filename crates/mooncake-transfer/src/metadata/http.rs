//! Client for an HTTP metadata server (`http://host:port/metadata`), using
//! the reference protocol: `GET|PUT|DELETE <url>?key=KEY`, and 404 with body
//! `metadata not found` for a missing key.
//!
//! A small HTTP/1.1 client of its own on blocking std sockets: no runtime,
//! so it is safe on any thread (async context included), and it keeps idle
//! connections for reuse. A call on a warm connection is one write and one
//! or two reads, about the loopback round trip; general-purpose clients
//! spent 5-30x that here. Responses are parsed strictly but completely
//! (content-length, chunked, or until close), so any HTTP/1.1 server works.

use std::io::{self, BufRead, BufReader, Read, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::time::{Duration, Instant};

use mooncake_common::auth::ClusterToken;
use mooncake_common::{Error, ErrorCode, Result};
use parking_lot::Mutex;

use super::{MetadataStore, CONNECT_TIMEOUT, MAX_VALUE_LEN, REQUEST_TIMEOUT};

/// The body the reference server sends with a 404 for a missing key.
pub(super) const NOT_FOUND_BODY: &str = "metadata not found";

/// Key read (never written) by [`HttpStore::connect`] to check, within
/// [`CONNECT_TIMEOUT`], that the URL really is a metadata server.
const PROBE_KEY: &str = "mooncake/probe";

/// Idle connections kept per store.
const MAX_IDLE: usize = 16;

/// Bound on a response's status line plus headers.
const MAX_HEAD_LEN: usize = 64 << 10;

/// Bodies up to this size go out in the same write as the request head.
const COALESCE_LEN: usize = 64 << 10;

/// Most memory reserved for a reply body before its bytes arrive.
const BODY_RESERVE: usize = 64 << 10;

pub(super) struct HttpStore {
    url: String,
    target: Target,
    /// `Bearer <cluster token>`, sent with every request when set.
    authorization: Option<String>,
    idle: Mutex<Vec<Conn>>,
}

/// Where requests go, from the URL.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Target {
    /// `host:port` to dial (port 80 when the URL has none).
    dial: String,
    /// The `Host` header: the URL's authority as written.
    host: String,
    /// Request path, e.g. `/metadata`.
    path: String,
}

impl Target {
    fn parse(url: &str) -> Option<Target> {
        let rest = url.strip_prefix("http://")?;
        let (authority, path) = match rest.find('/') {
            Some(i) => rest.split_at(i),
            None => (rest, "/"),
        };
        if authority.is_empty()
            || authority.contains(['@', '?', '#', ' '])
            || path.contains(['?', '#', ' '])
        {
            return None;
        }
        let has_port = match authority.rfind(':') {
            // `[::1]` alone: the colons are inside the brackets.
            Some(i) => !authority[i..].contains(']'),
            None => false,
        };
        let dial = if has_port {
            let port = &authority[authority.rfind(':')? + 1..];
            port.parse::<u16>().ok()?;
            authority.to_string()
        } else {
            format!("{authority}:80")
        };
        Some(Target {
            dial,
            host: authority.to_string(),
            path: path.to_string(),
        })
    }
}

#[derive(Clone, Copy, Debug)]
enum Verb {
    Get,
    Put,
    Delete,
}

impl Verb {
    fn as_str(self) -> &'static str {
        match self {
            Verb::Get => "GET",
            Verb::Put => "PUT",
            Verb::Delete => "DELETE",
        }
    }
}

/// A parsed response.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Reply {
    pub(crate) status: u16,
    pub(crate) body: Vec<u8>,
    /// Whether the connection may carry another request.
    pub(crate) keep_alive: bool,
}

impl Reply {
    /// A 404 means "missing key" only with the protocol's body; any other 404
    /// (say, a URL without `/metadata`) means this is not a metadata endpoint.
    fn is_missing_key(&self) -> bool {
        self.status == 404 && self.body.trim_ascii() == NOT_FOUND_BODY.as_bytes()
    }
}

struct Conn {
    stream: BufReader<TcpStream>,
}

/// How an exchange failed: on a pooled connection, a failure before any
/// byte of the reply is what a connection the server closed meanwhile looks
/// like, and is worth one retry on a fresh connection.
struct Failure {
    error: io::Error,
    before_reply: bool,
}

impl HttpStore {
    /// Checks the URL and that a metadata server answers there; a dead
    /// address or something that is not a metadata server is `ERR_METADATA`.
    pub(super) fn connect(url: &str, token: Option<&ClusterToken>) -> Result<HttpStore> {
        let mut store = HttpStore::new(url)?;
        store.authorization = token.map(ClusterToken::bearer);
        let reply = store.call(Verb::Get, PROBE_KEY, &[], CONNECT_TIMEOUT)?;
        if reply.status == 200 || reply.is_missing_key() {
            Ok(store)
        } else {
            Err(store.status_error(Verb::Get, PROBE_KEY, &reply))
        }
    }

    /// Builds the client without contacting the server.
    pub(super) fn new(url: &str) -> Result<HttpStore> {
        let url = url.trim();
        if url.starts_with("https://") {
            return Err(Error::new(
                ErrorCode::ERR_METADATA,
                format!("{url}: https is not supported"),
            ));
        }
        let target = Target::parse(url).ok_or_else(|| {
            Error::new(
                ErrorCode::ERR_METADATA,
                format!("invalid metadata URL {url:?}"),
            )
        })?;
        Ok(HttpStore {
            url: url.to_string(),
            target,
            authorization: None,
            idle: Mutex::new(Vec::new()),
        })
    }

    #[cfg(test)]
    fn url(&self) -> &str {
        &self.url
    }

    /// One request, on an idle connection if there is one. A pooled
    /// connection that fails before any reply byte is retried once on a
    /// fresh one (all three verbs are idempotent).
    fn call(&self, verb: Verb, key: &str, body: &[u8], limit: Duration) -> Result<Reply> {
        let deadline = Instant::now() + limit;
        let auth = self.authorization.as_deref();
        let head = encode_request(verb, &self.target, key, body.len(), auth);
        let pooled = self.idle.lock().pop();
        if let Some(mut conn) = pooled {
            match exchange(&mut conn, &head, body, deadline) {
                Ok(reply) => return Ok(self.recycle(conn, reply)),
                Err(f) if f.before_reply => {}
                Err(f) => return Err(self.io_error(f.error)),
            }
        }
        let mut conn = self.dial(deadline)?;
        match exchange(&mut conn, &head, body, deadline) {
            Ok(reply) => Ok(self.recycle(conn, reply)),
            Err(f) => Err(self.io_error(f.error)),
        }
    }

    fn recycle(&self, conn: Conn, reply: Reply) -> Reply {
        if reply.keep_alive {
            let mut idle = self.idle.lock();
            if idle.len() < MAX_IDLE {
                idle.push(conn);
            }
        }
        reply
    }

    fn dial(&self, deadline: Instant) -> Result<Conn> {
        let addrs = self.target.dial.to_socket_addrs().map_err(|e| {
            Error::new(
                ErrorCode::ERR_METADATA,
                format!("metadata server {}: {e}", self.url),
            )
        })?;
        let mut last = io::Error::new(io::ErrorKind::NotFound, "host has no address");
        for addr in addrs {
            let left = deadline
                .saturating_duration_since(Instant::now())
                .min(CONNECT_TIMEOUT);
            if left.is_zero() {
                last = io::Error::new(io::ErrorKind::TimedOut, "connect timed out");
                break;
            }
            match TcpStream::connect_timeout(&addr, left) {
                Ok(stream) => {
                    // Requests are small and answered at once: no Nagle delay.
                    stream.set_nodelay(true).map_err(|e| self.io_error(e))?;
                    return Ok(Conn {
                        stream: BufReader::with_capacity(16 << 10, stream),
                    });
                }
                Err(e) => last = e,
            }
        }
        Err(self.io_error(last))
    }

    fn io_error(&self, e: io::Error) -> Error {
        Error::new(
            ErrorCode::ERR_METADATA,
            format!("metadata server {}: {e}", self.url),
        )
    }

    fn status_error(&self, verb: Verb, key: &str, reply: &Reply) -> Error {
        let body = String::from_utf8_lossy(&reply.body[..reply.body.len().min(200)]).into_owned();
        Error::new(
            ErrorCode::ERR_METADATA,
            format!(
                "{} {}?key={key}: HTTP {}: {}",
                verb.as_str(),
                self.url,
                reply.status,
                body.trim()
            ),
        )
    }
}

impl MetadataStore for HttpStore {
    fn get(&self, key: &str) -> Result<Option<Vec<u8>>> {
        let reply = self.call(Verb::Get, key, &[], REQUEST_TIMEOUT)?;
        match reply.status {
            200 => Ok(Some(reply.body)),
            _ if reply.is_missing_key() => Ok(None),
            _ => Err(self.status_error(Verb::Get, key, &reply)),
        }
    }

    fn put(&self, key: &str, value: &[u8]) -> Result<()> {
        let reply = self.call(Verb::Put, key, value, REQUEST_TIMEOUT)?;
        match reply.status {
            200 | 201 | 204 => Ok(()),
            _ => Err(self.status_error(Verb::Put, key, &reply)),
        }
    }

    fn delete(&self, key: &str) -> Result<()> {
        let reply = self.call(Verb::Delete, key, &[], REQUEST_TIMEOUT)?;
        match reply.status {
            200 | 204 => Ok(()),
            // Deleting a missing key leaves the store as asked.
            _ if reply.is_missing_key() => Ok(()),
            _ => Err(self.status_error(Verb::Delete, key, &reply)),
        }
    }
}

/// Sends the request and reads the reply, all before `deadline`.
fn exchange(
    conn: &mut Conn,
    head: &[u8],
    body: &[u8],
    deadline: Instant,
) -> std::result::Result<Reply, Failure> {
    let before = |error| Failure {
        error,
        before_reply: true,
    };
    let left = deadline.saturating_duration_since(Instant::now());
    if left.is_zero() {
        return Err(before(io::Error::new(
            io::ErrorKind::TimedOut,
            "request timed out",
        )));
    }
    let sock = conn.stream.get_mut();
    sock.set_write_timeout(Some(left)).map_err(before)?;
    sock.set_read_timeout(Some(left)).map_err(before)?;
    if body.len() <= COALESCE_LEN {
        let mut msg = Vec::with_capacity(head.len() + body.len());
        msg.extend_from_slice(head);
        msg.extend_from_slice(body);
        sock.write_all(&msg).map_err(before)?;
    } else {
        sock.write_all(head).map_err(before)?;
        sock.write_all(body).map_err(before)?;
    }
    // Nothing read yet: EOF or reset here means the server had closed it.
    conn.stream.fill_buf().map_err(before)?;
    if conn.stream.buffer().is_empty() {
        return Err(before(io::Error::new(
            io::ErrorKind::UnexpectedEof,
            "connection closed",
        )));
    }
    read_reply(&mut conn.stream, deadline).map_err(|error| Failure {
        error,
        before_reply: false,
    })
}

/// `VERB /path?key=KEY HTTP/1.1` plus headers; the key is percent-encoded.
fn encode_request(
    verb: Verb,
    target: &Target,
    key: &str,
    body_len: usize,
    authorization: Option<&str>,
) -> Vec<u8> {
    let mut head = Vec::with_capacity(128 + key.len() * 3);
    head.extend_from_slice(verb.as_str().as_bytes());
    head.push(b' ');
    head.extend_from_slice(target.path.as_bytes());
    head.extend_from_slice(b"?key=");
    percent_encode(key, &mut head);
    head.extend_from_slice(b" HTTP/1.1\r\nHost: ");
    head.extend_from_slice(target.host.as_bytes());
    head.extend_from_slice(b"\r\n");
    if let Some(a) = authorization {
        head.extend_from_slice(b"Authorization: ");
        head.extend_from_slice(a.as_bytes());
        head.extend_from_slice(b"\r\n");
    }
    if let Verb::Put = verb {
        head.extend_from_slice(
            format!("Content-Type: application/json\r\nContent-Length: {body_len}\r\n").as_bytes(),
        );
    }
    head.extend_from_slice(b"\r\n");
    head
}

/// Escapes all but RFC 3986 unreserved characters and `/` (which keys are
/// full of, and which query strings may hold as is).
fn percent_encode(s: &str, out: &mut Vec<u8>) {
    const HEX: &[u8; 16] = b"0123456789ABCDEF";
    for &b in s.as_bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~' | b'/') {
            out.push(b);
        } else {
            out.extend_from_slice(&[b'%', HEX[(b >> 4) as usize], HEX[(b & 15) as usize]]);
        }
    }
}

fn bad(msg: impl Into<String>) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, msg.into())
}

/// Parses one response: status line, headers, then the body by
/// content-length, chunks, or up to EOF. Interim 1xx responses are skipped.
pub(crate) fn read_reply<R: BufRead>(r: &mut R, deadline: Instant) -> io::Result<Reply> {
    loop {
        let mut head_left = MAX_HEAD_LEN;
        let status_line = read_line(r, &mut head_left)?;
        let status_line =
            std::str::from_utf8(&status_line).map_err(|_| bad("status line is not text"))?;
        let mut parts = status_line.splitn(3, ' ');
        let version = parts.next().unwrap_or("");
        let status: u16 = match (version, parts.next().map(str::parse)) {
            ("HTTP/1.1" | "HTTP/1.0", Some(Ok(s))) if (100..600).contains(&s) => s,
            _ => return Err(bad(format!("not an HTTP/1.x status line: {status_line:?}"))),
        };
        let mut keep_alive = version == "HTTP/1.1";
        let mut length: Option<usize> = None;
        let mut chunked = false;
        loop {
            let line = read_line(r, &mut head_left)?;
            if line.is_empty() {
                break;
            }
            let line = std::str::from_utf8(&line).map_err(|_| bad("header is not text"))?;
            let (name, value) = line
                .split_once(':')
                .ok_or_else(|| bad(format!("malformed header {line:?}")))?;
            let value = value.trim();
            if name.eq_ignore_ascii_case("content-length") {
                let n = value
                    .parse::<usize>()
                    .map_err(|_| bad(format!("bad content-length {value:?}")))?;
                if length.is_some_and(|l| l != n) {
                    return Err(bad("conflicting content-length headers"));
                }
                length = Some(n);
            } else if name.eq_ignore_ascii_case("transfer-encoding") {
                chunked = value
                    .to_ascii_lowercase()
                    .split(',')
                    .any(|t| t.trim() == "chunked");
            } else if name.eq_ignore_ascii_case("connection") {
                let v = value.to_ascii_lowercase();
                if v.split(',').any(|t| t.trim() == "close") {
                    keep_alive = false;
                } else if v.split(',').any(|t| t.trim() == "keep-alive") {
                    keep_alive = true;
                }
            }
        }
        if (100..200).contains(&status) {
            continue;
        }
        let body = if status == 204 || status == 304 {
            Vec::new()
        } else if chunked {
            read_chunked(r, deadline)?
        } else if let Some(n) = length {
            if n > MAX_VALUE_LEN {
                return Err(bad(format!("reply of {n} bytes exceeds {MAX_VALUE_LEN}")));
            }
            let mut body = Vec::with_capacity(n.min(BODY_RESERVE));
            append_exact(r, n, &mut body)?;
            body
        } else {
            // Delimited by the server closing the connection.
            keep_alive = false;
            let mut body = Vec::new();
            r.take(MAX_VALUE_LEN as u64 + 1).read_to_end(&mut body)?;
            if body.len() > MAX_VALUE_LEN {
                return Err(bad(format!("reply exceeds {MAX_VALUE_LEN} bytes")));
            }
            body
        };
        return Ok(Reply {
            status,
            body,
            keep_alive,
        });
    }
}

fn read_chunked<R: BufRead>(r: &mut R, deadline: Instant) -> io::Result<Vec<u8>> {
    let mut body = Vec::new();
    loop {
        if Instant::now() > deadline {
            return Err(io::Error::new(io::ErrorKind::TimedOut, "reply timed out"));
        }
        let mut line_left = 1024;
        let line = read_line(r, &mut line_left)?;
        let line = std::str::from_utf8(&line).map_err(|_| bad("chunk size is not text"))?;
        let size_hex = line.split(';').next().unwrap_or("").trim();
        let size = usize::from_str_radix(size_hex, 16)
            .map_err(|_| bad(format!("bad chunk size {line:?}")))?;
        if size == 0 {
            // Trailers, up to the empty line.
            let mut trailers_left = MAX_HEAD_LEN;
            while !read_line(r, &mut trailers_left)?.is_empty() {}
            return Ok(body);
        }
        if size > MAX_VALUE_LEN - body.len() {
            return Err(bad(format!("reply exceeds {MAX_VALUE_LEN} bytes")));
        }
        append_exact(r, size, &mut body)?;
        let mut crlf = [0u8; 2];
        r.read_exact(&mut crlf)?;
        if &crlf != b"\r\n" {
            return Err(bad("chunk not followed by CRLF"));
        }
    }
}

/// Appends the next `n` bytes of `r` to `body`. The buffer grows as the
/// bytes arrive, so a length that lies costs no memory.
fn append_exact(r: &mut impl Read, n: usize, body: &mut Vec<u8>) -> io::Result<()> {
    let start = body.len();
    r.take(n as u64).read_to_end(body)?;
    if body.len() - start < n {
        return Err(io::Error::new(
            io::ErrorKind::UnexpectedEof,
            "connection closed mid-body",
        ));
    }
    Ok(())
}

/// One line without its `\r\n` (or bare `\n`), charged against `left`.
fn read_line<R: BufRead>(r: &mut R, left: &mut usize) -> io::Result<Vec<u8>> {
    let mut line = Vec::new();
    let n = r.take(*left as u64).read_until(b'\n', &mut line)?;
    if n == 0 {
        return Err(io::Error::new(
            io::ErrorKind::UnexpectedEof,
            "connection closed mid-reply",
        ));
    }
    if line.last() != Some(&b'\n') {
        return Err(if n >= *left {
            bad("reply head too long")
        } else {
            io::ErrorKind::UnexpectedEof.into()
        });
    }
    *left -= n;
    line.pop();
    if line.last() == Some(&b'\r') {
        line.pop();
    }
    Ok(line)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(raw: &[u8]) -> io::Result<Reply> {
        read_reply(
            &mut io::Cursor::new(raw),
            Instant::now() + Duration::from_secs(5),
        )
    }

    #[test]
    fn rejects_urls_it_cannot_use() {
        for bad in [
            "https://h:1/metadata",
            "http://",
            "http:///metadata",
            "ftp://h:1",
            "http://h:1/m?key=x",
            "http://h:x/m",
        ] {
            let e = HttpStore::new(bad)
                .err()
                .unwrap_or_else(|| panic!("{bad:?} accepted"));
            assert_eq!(e.code, ErrorCode::ERR_METADATA, "{bad:?}");
        }
        assert_eq!(
            HttpStore::new(" http://h:1/metadata ").unwrap().url(),
            "http://h:1/metadata"
        );
    }

    #[test]
    fn targets_from_urls() {
        let t = Target::parse("http://10.0.0.1:8080/metadata").unwrap();
        assert_eq!(
            t,
            Target {
                dial: "10.0.0.1:8080".into(),
                host: "10.0.0.1:8080".into(),
                path: "/metadata".into()
            }
        );
        let t = Target::parse("http://meta.local").unwrap();
        assert_eq!((t.dial.as_str(), t.path.as_str()), ("meta.local:80", "/"));
        assert_eq!(Target::parse("http://[::1]:9/m").unwrap().dial, "[::1]:9");
        assert_eq!(Target::parse("http://[::1]/m").unwrap().dial, "[::1]:80");
    }

    #[test]
    fn requests_are_encoded() {
        let t = Target::parse("http://h:1/metadata").unwrap();
        let get = encode_request(Verb::Get, &t, "mooncake/ram/n0", 0, None);
        assert_eq!(
            get,
            b"GET /metadata?key=mooncake/ram/n0 HTTP/1.1\r\nHost: h:1\r\n\r\n"
        );
        let put = String::from_utf8(encode_request(Verb::Put, &t, "a b&c=d+%ü", 5, None)).unwrap();
        assert!(
            put.starts_with("PUT /metadata?key=a%20b%26c%3Dd%2B%25%C3%BC HTTP/1.1\r\n"),
            "{put}"
        );
        assert!(put.ends_with("Content-Length: 5\r\n\r\n"), "{put}");
    }

    #[test]
    fn replies_by_length_chunks_and_close() {
        let r = parse(
            b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}",
        )
        .unwrap();
        assert_eq!(
            r,
            Reply {
                status: 200,
                body: b"{}".to_vec(),
                keep_alive: true
            }
        );

        let r = parse(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3;x=y\r\nabc\r\nA\r\n0123456789\r\n0\r\nT: v\r\n\r\n")
            .unwrap();
        assert_eq!(r.body, b"abc0123456789");

        let r = parse(b"HTTP/1.0 404 Not Found\r\n\r\nmetadata not found").unwrap();
        assert!(r.is_missing_key() && !r.keep_alive);

        let r =
            parse(b"HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 0\r\n\r\n").unwrap();
        assert!(!r.keep_alive);

        let r = parse(b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 204 No Content\r\n\r\n").unwrap();
        assert_eq!((r.status, r.body.len()), (204, 0));

        let r = parse(b"HTTP/1.1 404 Not Found\nContent-Length: 9\n\nNot Found").unwrap();
        assert!(!r.is_missing_key());
    }

    #[test]
    fn malformed_replies_are_errors() {
        let long_header = format!("HTTP/1.1 200 OK\r\nX: {}\r\n\r\n", "a".repeat(MAX_HEAD_LEN));
        let huge = format!(
            "HTTP/1.1 200 OK\r\nContent-Length: {}\r\n\r\n",
            MAX_VALUE_LEN + 1
        );
        for raw in [
            &b""[..],
            b"SSH-2.0-OpenSSH\r\n",
            b"HTTP/1.1 abc OK\r\n\r\n",
            b"HTTP/2 200\r\n\r\n",
            b"HTTP/1.1 200 OK\r\nno colon\r\n\r\n",
            b"HTTP/1.1 200 OK\r\nContent-Length: -1\r\n\r\n",
            b"HTTP/1.1 200 OK\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\nab",
            b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nshort",
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabcXX0\r\n\r\n",
            b"HTTP/1.1 200 OK\r\nContent-Le",
            long_header.as_bytes(),
            huge.as_bytes(),
        ] {
            assert!(
                parse(raw).is_err(),
                "{:?}",
                String::from_utf8_lossy(&raw[..raw.len().min(80)])
            );
        }
    }

    /// Records the largest buffer a read was asked to fill.
    struct Recorder<'a> {
        data: &'a [u8],
        largest: &'a std::cell::Cell<usize>,
    }

    impl Read for Recorder<'_> {
        fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
            self.largest.set(self.largest.get().max(buf.len()));
            self.data.read(buf)
        }
    }

    #[test]
    fn a_length_that_lies_costs_no_memory() {
        let claims = 60_000_000;
        for raw in [
            format!("HTTP/1.1 200 OK\r\nContent-Length: {claims}\r\n\r\nabc"),
            format!("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n{claims:x}\r\nabc"),
        ] {
            let largest = std::cell::Cell::new(0);
            let mut r = io::BufReader::with_capacity(
                64,
                Recorder {
                    data: raw.as_bytes(),
                    largest: &largest,
                },
            );
            let e = read_reply(&mut r, Instant::now() + Duration::from_secs(5)).unwrap_err();
            assert_eq!(e.kind(), io::ErrorKind::UnexpectedEof);
            assert!(
                largest.get() <= BODY_RESERVE,
                "read into {} bytes",
                largest.get()
            );
        }
    }

    #[test]
    fn chunk_sizes_past_the_limit_are_refused_without_overflow() {
        let raw = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n1\r\na\r\nffffffffffffffff\r\nb\r\n0\r\n\r\n";
        let e = parse(raw).unwrap_err();
        assert!(e.to_string().contains("exceeds"), "{e}");
    }

    #[test]
    fn unreachable_server_is_err_metadata() {
        // Bind then drop: nothing listens on that port any more.
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let e = HttpStore::connect(&format!("http://127.0.0.1:{port}/metadata"), None)
            .err()
            .unwrap();
        assert_eq!(e.code, ErrorCode::ERR_METADATA);
    }
}
