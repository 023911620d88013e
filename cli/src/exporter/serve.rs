//! The exporter's HTTP server: `GET` (and `HEAD`) of `/metrics`, each answered with a scrape of
//! [`super::metrics`].
//!
//! The server is `std::net` plus `httparse` (the request parser hyper uses, no dependencies), not
//! `tiny_http` and not an async stack. `tiny_http` 0.12 sets no timeout on the connections it
//! accepts and gives no way to set one, and it starts a thread per waiting connection without
//! bound: a client that connects and sends nothing holds a thread for as long as it likes, and
//! enough of them hold the process's threads and descriptors. Here every connection gets its own
//! thread (so a slow client never delays another scrape), at most [`MAX_CONNECTIONS`] at once (the
//! rest are answered 503 at once), a deadline of [`HEAD_DEADLINE`] for its whole request head, and
//! a write timeout. An async stack would bring tokio and hyper (minutes of compiling on a small
//! machine) to serve one scrape every few seconds.
//!
//! Only `GET` (and `HEAD`) of `/metrics` is served; other paths get 404, other methods 405, a
//! request that is not HTTP/1.x 400, one too long 431, one too slow 408. Nothing a request says
//! can change anything: the exporter only reads segments.

use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::metrics::{prometheus_text, scrape_and_keep, Mapped};

/// Connections served at once; more are answered 503 without reading them.
pub const MAX_CONNECTIONS: usize = 32;
/// The time a client has to send its whole request head.
pub const HEAD_DEADLINE: Duration = Duration::from_secs(5);
/// The longest one write of the response may block on a client that does not read.
const WRITE_TIMEOUT: Duration = Duration::from_secs(10);
/// The largest request head accepted.
const MAX_HEAD_BYTES: usize = 8 * 1024;
/// Longest `command` label, in characters.
/// The scrape's body for clients that accept OpenMetrics.
const OPENMETRICS: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";
/// The scrape's body for the others.
const PROMETHEUS_TEXT: &str = "text/plain; version=0.0.4; charset=utf-8";

/// Accepts connections for ever, each on a thread of its own (at most [`MAX_CONNECTIONS`]).
pub(super) fn serve(listener: TcpListener, all_users: bool) {
    let open = Arc::new(AtomicUsize::new(0));
    for connection in listener.incoming() {
        let stream = match connection {
            Ok(s) => s,
            Err(e) => {
                // Out of descriptors, or the client gave up before we accepted: try again shortly.
                sayln!("gpumemhook exporter: accept: {e}");
                std::thread::sleep(Duration::from_millis(50));
                continue;
            }
        };
        if open.fetch_add(1, Ordering::SeqCst) >= MAX_CONNECTIONS {
            open.fetch_sub(1, Ordering::SeqCst);
            refuse_busy(stream);
            continue;
        }
        let slot = ConnectionSlot(Arc::clone(&open));
        let spawned = std::thread::Builder::new()
            .name("scrape".into())
            .spawn(move || {
                let _slot = slot;
                handle(stream, all_users);
            });
        if let Err(e) = spawned {
            sayln!("gpumemhook exporter: cannot start a thread for a connection: {e}");
        }
    }
}

/// Counts a connection being served; gives its place back when dropped.
struct ConnectionSlot(Arc<AtomicUsize>);

impl Drop for ConnectionSlot {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

/// Answers 503 without waiting on the client: what it already sent is read (closing a socket with
/// unread bytes resets the connection, and the answer with it), nothing more.
fn refuse_busy(mut stream: TcpStream) {
    let _ = stream.set_nonblocking(true);
    let response = Response::text(503, "too many connections at once; try again\n");
    let _ = stream.write_all(&response.to_bytes(false));
    let _ = stream.shutdown(Shutdown::Write);
    let mut sink = [0u8; 4096];
    for _ in 0..16 {
        if !matches!(stream.read(&mut sink), Ok(n) if n > 0) {
            break;
        }
    }
}

/// A request head's parts that the exporter looks at.
#[derive(Debug)]
struct Head {
    method: String,
    path: String,
    /// The client accepts OpenMetrics (its `Accept` names it).
    openmetrics: bool,
}

/// Why no request head was read.
#[derive(Debug, PartialEq, Eq)]
enum HeadError {
    /// The client closed the connection before sending anything.
    Closed,
    /// Not all of the head came within [`HEAD_DEADLINE`].
    TimedOut,
    /// Longer than [`MAX_HEAD_BYTES`], or too many header fields.
    TooLarge,
    /// Not an HTTP/1.x request head.
    Malformed,
}

/// Reads one request head within [`HEAD_DEADLINE`] (in all, however the bytes trickle in).
fn read_head(stream: &mut TcpStream) -> Result<Head, HeadError> {
    let deadline = Instant::now() + HEAD_DEADLINE;
    let mut buffer = Vec::with_capacity(1024);
    let mut chunk = [0u8; 1024];
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(HeadError::TimedOut);
        }
        stream
            .set_read_timeout(Some(left))
            .map_err(|_| HeadError::Malformed)?;
        let n = match stream.read(&mut chunk) {
            Ok(0) if buffer.is_empty() => return Err(HeadError::Closed),
            // Half a request, then the end: it will never be whole.
            Ok(0) => return Err(HeadError::Malformed),
            Ok(n) => n,
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) =>
            {
                return Err(HeadError::TimedOut)
            }
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(_) => return Err(HeadError::Closed),
        };
        buffer.extend_from_slice(&chunk[..n]);
        let mut fields = [httparse::EMPTY_HEADER; 64];
        let mut request = httparse::Request::new(&mut fields);
        match request.parse(&buffer) {
            Ok(httparse::Status::Complete(_)) => {
                let openmetrics = request.headers.iter().any(|h| {
                    h.name.eq_ignore_ascii_case("accept")
                        && String::from_utf8_lossy(h.value)
                            .to_ascii_lowercase()
                            .contains("application/openmetrics-text")
                });
                return Ok(Head {
                    method: request.method.unwrap_or_default().to_string(),
                    path: request.path.unwrap_or_default().to_string(),
                    openmetrics,
                });
            }
            Ok(httparse::Status::Partial) if buffer.len() < MAX_HEAD_BYTES => {}
            Ok(httparse::Status::Partial) | Err(httparse::Error::TooManyHeaders) => {
                return Err(HeadError::TooLarge)
            }
            Err(_) => return Err(HeadError::Malformed),
        }
    }
}

/// A whole response, sent at once; every connection closes after one.
struct Response {
    status: u16,
    content_type: &'static str,
    extra_header: Option<&'static str>,
    body: String,
}

impl Response {
    fn text(status: u16, body: &str) -> Response {
        Response {
            status,
            content_type: "text/plain; charset=utf-8",
            extra_header: None,
            body: body.to_string(),
        }
    }

    fn to_bytes(&self, head_only: bool) -> Vec<u8> {
        let reason = match self.status {
            200 => "OK",
            400 => "Bad Request",
            404 => "Not Found",
            405 => "Method Not Allowed",
            408 => "Request Timeout",
            431 => "Request Header Fields Too Large",
            503 => "Service Unavailable",
            _ => "Internal Server Error",
        };
        let mut out = format!(
            "HTTP/1.1 {} {reason}\r\nContent-Type: {}\r\nContent-Length: {}\r\nCache-Control: \
             no-store\r\nConnection: close\r\n",
            self.status,
            self.content_type,
            self.body.len()
        );
        if let Some(h) = self.extra_header {
            out.push_str(h);
            out.push_str("\r\n");
        }
        out.push_str("\r\n");
        let mut bytes = out.into_bytes();
        if !head_only {
            bytes.extend_from_slice(self.body.as_bytes());
        }
        bytes
    }
}

/// What to answer to a request head, and the segments read for it (to unmap after sending it).
fn respond(head: &Head, all_users: bool) -> (Response, Mapped) {
    let path = head.path.split('?').next().unwrap_or_default();
    if path != "/metrics" {
        let body = "not found: this exporter serves /metrics only\n";
        return (Response::text(404, body), Vec::new());
    }
    if head.method != "GET" && head.method != "HEAD" {
        let response = Response {
            extra_header: Some("Allow: GET, HEAD"),
            ..Response::text(405, "/metrics is read with GET (or HEAD)\n")
        };
        return (response, Vec::new());
    }
    match scrape_and_keep(all_users) {
        Ok((body, mapped)) if head.openmetrics => {
            let response = Response {
                status: 200,
                content_type: OPENMETRICS,
                extra_header: None,
                body,
            };
            (response, mapped)
        }
        Ok((body, mapped)) => {
            let response = Response {
                status: 200,
                content_type: PROMETHEUS_TEXT,
                extra_header: None,
                body: prometheus_text(&body),
            };
            (response, mapped)
        }
        Err(e) => {
            let body = format!("cannot read the hooked processes: {e:#}\n");
            (Response::text(500, &body), Vec::new())
        }
    }
}

/// Serves one connection: one request, one response, then close.
fn handle(mut stream: TcpStream, all_users: bool) {
    let _ = stream.set_write_timeout(Some(WRITE_TIMEOUT));
    let _ = stream.set_nodelay(true);
    let mut mapped = Vec::new();
    let (response, head_only) = match read_head(&mut stream) {
        Ok(head) => {
            let (response, segments) = respond(&head, all_users);
            mapped = segments;
            (response, head.method == "HEAD")
        }
        Err(HeadError::Closed) => return,
        Err(HeadError::TimedOut) => (
            Response::text(408, "the request head did not arrive in time\n"),
            false,
        ),
        Err(HeadError::TooLarge) => (
            Response::text(431, "the request head is too large\n"),
            false,
        ),
        Err(HeadError::Malformed) => (
            Response::text(400, "not an HTTP/1.x request (GET /metrics)\n"),
            false,
        ),
    };
    let sent = stream.write_all(&response.to_bytes(head_only));
    drop(mapped);
    if sent.is_err() {
        return;
    }
    // Close our side, then read what the client still sends for a moment: closing a socket with
    // unread bytes resets the connection, which could destroy the response before it is read.
    let _ = stream.shutdown(Shutdown::Write);
    let _ = stream.set_read_timeout(Some(Duration::from_millis(200)));
    let mut sink = [0u8; 4096];
    let mut drained = 0;
    while drained < 64 * 1024 {
        match stream.read(&mut sink) {
            Ok(0) | Err(_) => break,
            Ok(n) => drained += n,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_get_or_head_of_metrics_is_served() {
        let head = |method: &str, path: &str| Head {
            method: method.into(),
            path: path.into(),
            openmetrics: false,
        };
        assert_eq!(respond(&head("GET", "/"), false).0.status, 404);
        assert_eq!(respond(&head("GET", "/metrics/x"), false).0.status, 404);
        let (post, _) = respond(&head("POST", "/metrics"), false);
        assert_eq!(post.status, 405);
        assert!(String::from_utf8_lossy(&post.to_bytes(true)).contains("Allow: GET, HEAD\r\n"));
    }
}
