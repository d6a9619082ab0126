//! A tiny HTTP/1.1 server on 127.0.0.1 with fixed routes, for the download tests. Routes can be
//! replaced while it runs ([`HttpServer::set_route`]), and every request's head is kept
//! ([`HttpServer::requests`]).

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// How a path is served.
#[derive(Clone)]
pub enum Route {
    /// 200 with this body, written `chunk` bytes at a time with `delay` between chunks.
    Body {
        /// The body.
        data: Arc<Vec<u8>>,
        /// Bytes per write.
        chunk: usize,
        /// Pause after each write.
        delay: Duration,
    },
    /// A bodyless reply with this status.
    Status(u16),
    /// 200 announcing `claimed` bytes in Content-Length, sending only `data`, then closing.
    Truncated {
        /// Announced length.
        claimed: usize,
        /// What is really sent.
        data: Arc<Vec<u8>>,
    },
    /// 200 with `Transfer-Encoding: chunked`, sending `data` in chunks; with `complete` false
    /// the connection closes without the final zero-length chunk.
    Chunked {
        /// The body.
        data: Arc<Vec<u8>>,
        /// Whether to send the terminating chunk.
        complete: bool,
    },
    /// A redirect with this status to this location.
    Redirect(u16, String),
    /// 200 announcing `claimed` bytes, sending `data`, then going silent (connection open) for
    /// `hold` or until the server is dropped.
    Stall {
        /// Announced length.
        claimed: usize,
        /// What is sent before the silence.
        data: Arc<Vec<u8>>,
        /// How long to stay silent.
        hold: Duration,
    },
    /// A file served with `Accept-Ranges: bytes` and its validators: `Range: bytes=N-` gets
    /// 206 from byte N (416 when N is past the end), unless an `If-Range` differs from the
    /// validator (the ETag, else Last-Modified), which gets the whole file with 200.
    Ranged {
        /// The whole file.
        data: Arc<Vec<u8>>,
        /// `ETag`, when sent.
        etag: Option<String>,
        /// `Last-Modified`, when sent.
        last_modified: Option<String>,
        /// Close the connection after this many body bytes (the Content-Length still announces
        /// them all): an interrupted transfer.
        cut_after: Option<usize>,
        /// Bytes per write.
        chunk: usize,
        /// Pause after each write.
        delay: Duration,
    },
}

impl Route {
    /// The whole body at once.
    pub fn body(data: Vec<u8>) -> Route {
        Route::Body {
            data: Arc::new(data),
            chunk: 64 * 1024,
            delay: Duration::ZERO,
        }
    }

    /// The body in `chunk`-byte pieces with `delay` after each.
    pub fn trickle(data: Vec<u8>, chunk: usize, delay: Duration) -> Route {
        Route::Body {
            data: Arc::new(data),
            chunk,
            delay,
        }
    }

    /// `data` with Range support and this ETag, sent whole at once.
    pub fn ranged(data: Arc<Vec<u8>>, etag: &str) -> Route {
        Route::Ranged {
            data,
            etag: Some(etag.to_string()),
            last_modified: None,
            cut_after: None,
            chunk: 64 * 1024,
            delay: Duration::ZERO,
        }
    }
}

/// One request the server received.
#[derive(Clone, Debug)]
pub struct Hit {
    /// The request target (`/path`).
    pub path: String,
    /// The header fields, names lower-cased, in order.
    pub headers: Vec<(String, String)>,
}

impl Hit {
    /// The first value of header `name` (any case).
    pub fn header(&self, name: &str) -> Option<&str> {
        let name = name.to_ascii_lowercase();
        self.headers
            .iter()
            .find(|(n, _)| *n == name)
            .map(|(_, v)| v.as_str())
    }
}

type Routes = Arc<Mutex<Vec<(String, Route)>>>;

/// An HTTP server on an ephemeral loopback port serving fixed routes; unknown paths get 404.
/// Stops accepting on drop; connection threads end when their body is sent, the peer goes
/// away, or the server is dropped.
pub struct HttpServer {
    addr: SocketAddr,
    stop: Arc<AtomicBool>,
    hits: Arc<Mutex<Vec<Hit>>>,
    routes: Routes,
    acceptor: Option<JoinHandle<()>>,
}

impl HttpServer {
    /// Starts serving `routes` (path → route).
    pub fn start(routes: Vec<(&str, Route)>) -> HttpServer {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind 127.0.0.1");
        let addr = listener.local_addr().unwrap();
        let routes: Routes = Arc::new(Mutex::new(
            routes
                .into_iter()
                .map(|(p, r)| (p.to_string(), r))
                .collect(),
        ));
        let stop = Arc::new(AtomicBool::new(false));
        let hits = Arc::new(Mutex::new(Vec::new()));
        let (stop2, hits2) = (Arc::clone(&stop), Arc::clone(&hits));
        let routes2 = Arc::clone(&routes);
        let acceptor = std::thread::spawn(move || {
            let routes = routes2;
            for conn in listener.incoming() {
                if stop2.load(Ordering::SeqCst) {
                    return;
                }
                let Ok(conn) = conn else { continue };
                let (routes, stop, hits) =
                    (Arc::clone(&routes), Arc::clone(&stop2), Arc::clone(&hits2));
                std::thread::spawn(move || serve_conn(conn, &routes, &stop, &hits));
            }
        });
        HttpServer {
            addr,
            stop,
            hits,
            routes,
            acceptor: Some(acceptor),
        }
    }

    /// `http://127.0.0.1:PORT/PATH`.
    pub fn url(&self, path: &str) -> String {
        format!("http://{}/{}", self.addr, path.trim_start_matches('/'))
    }

    /// The request paths seen so far.
    pub fn hits(&self) -> Vec<String> {
        self.hits
            .lock()
            .unwrap()
            .iter()
            .map(|h| h.path.clone())
            .collect()
    }

    /// The requests seen so far, with their headers.
    pub fn requests(&self) -> Vec<Hit> {
        self.hits.lock().unwrap().clone()
    }

    /// Serves `path` with `route` from the next request on (replacing its route, if any).
    /// Connections already being served keep the route they started with.
    pub fn set_route(&self, path: &str, route: Route) {
        let mut routes = self.routes.lock().unwrap();
        routes.retain(|(p, _)| p != path);
        routes.push((path.to_string(), route));
    }
}

impl Drop for HttpServer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        let _ = TcpStream::connect_timeout(&self.addr, Duration::from_secs(1));
        if let Some(h) = self.acceptor.take() {
            let _ = h.join();
        }
    }
}

fn serve_conn(
    mut conn: TcpStream,
    routes: &Mutex<Vec<(String, Route)>>,
    stop: &AtomicBool,
    hits: &Mutex<Vec<Hit>>,
) {
    let _ = conn.set_read_timeout(Some(Duration::from_secs(5)));
    let _ = conn.set_write_timeout(Some(Duration::from_secs(5)));
    // Read the request head (we ignore any body: the client only sends GETs).
    let mut head = Vec::new();
    let mut buf = [0u8; 1024];
    while !head.windows(4).any(|w| w == b"\r\n\r\n") {
        match conn.read(&mut buf) {
            Ok(0) | Err(_) => return,
            Ok(n) => head.extend_from_slice(&buf[..n]),
        }
        if head.len() > 64 * 1024 {
            return;
        }
    }
    let head = String::from_utf8_lossy(&head).into_owned();
    let target = head
        .lines()
        .next()
        .and_then(|l| l.split_whitespace().nth(1))
        .unwrap_or("/")
        .to_string();
    let hit = Hit {
        path: target.clone(),
        headers: head
            .lines()
            .skip(1)
            .filter_map(|l| l.split_once(':'))
            .map(|(n, v)| (n.trim().to_ascii_lowercase(), v.trim().to_string()))
            .collect(),
    };
    hits.lock().unwrap().push(hit.clone());
    let route = routes
        .lock()
        .unwrap()
        .iter()
        .find(|(p, _)| *p == target || format!("/{}", p.trim_start_matches('/')) == target)
        .map(|(_, r)| r.clone())
        .unwrap_or(Route::Status(404));
    match route {
        Route::Status(code) => {
            let reason = match code {
                404 => "Not Found",
                500 => "Internal Server Error",
                403 => "Forbidden",
                _ => "Status",
            };
            let _ = write!(
                conn,
                "HTTP/1.1 {code} {reason}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
            );
        }
        Route::Truncated { claimed, data } => {
            let _ = write!(
                conn,
                "HTTP/1.1 200 OK\r\nContent-Type: application/octet-stream\r\nContent-Length: {claimed}\r\nConnection: close\r\n\r\n"
            );
            let _ = conn.write_all(&data);
            let _ = conn.flush();
            let _ = conn.shutdown(std::net::Shutdown::Both);
        }
        Route::Chunked { data, complete } => {
            let _ = write!(
                conn,
                "HTTP/1.1 200 OK\r\nContent-Type: application/octet-stream\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n"
            );
            for piece in data.chunks(16 * 1024) {
                let _ = write!(conn, "{:x}\r\n", piece.len());
                let _ = conn.write_all(piece);
                let _ = conn.write_all(b"\r\n");
            }
            if complete {
                let _ = conn.write_all(b"0\r\n\r\n");
            }
            let _ = conn.flush();
            let _ = conn.shutdown(std::net::Shutdown::Both);
        }
        Route::Stall {
            claimed,
            data,
            hold,
        } => {
            let _ = write!(
                conn,
                "HTTP/1.1 200 OK\r\nContent-Length: {claimed}\r\nConnection: close\r\n\r\n"
            );
            let _ = conn.write_all(&data);
            let _ = conn.flush();
            let until = Instant::now() + hold;
            while Instant::now() < until && !stop.load(Ordering::SeqCst) {
                std::thread::sleep(Duration::from_millis(20));
            }
        }
        Route::Redirect(code, location) => {
            let _ = write!(
                conn,
                "HTTP/1.1 {code} Moved\r\nLocation: {location}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
            );
        }
        Route::Body { data, chunk, delay } => {
            if write!(
                conn,
                "HTTP/1.1 200 OK\r\nContent-Type: application/octet-stream\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
                data.len()
            )
            .is_err()
            {
                return;
            }
            send_body(&mut conn, &data, chunk, delay, stop);
            let _ = conn.flush();
        }
        Route::Ranged {
            data,
            etag,
            last_modified,
            cut_after,
            chunk,
            delay,
        } => {
            let len = data.len();
            let validator = etag.as_deref().or(last_modified.as_deref());
            let fresh = hit.header("if-range").is_none_or(|v| Some(v) == validator);
            let start = hit
                .header("range")
                .and_then(|r| r.strip_prefix("bytes="))
                .and_then(|r| r.strip_suffix('-'))
                .and_then(|n| n.trim().parse::<usize>().ok())
                .filter(|_| fresh);
            let mut extra = String::from("Accept-Ranges: bytes\r\n");
            if let Some(e) = &etag {
                extra += &format!("ETag: {e}\r\n");
            }
            if let Some(m) = &last_modified {
                extra += &format!("Last-Modified: {m}\r\n");
            }
            let (status, body) = match start {
                Some(n) if n >= len => {
                    let _ = write!(
                        conn,
                        "HTTP/1.1 416 Range Not Satisfiable\r\n{extra}Content-Range: bytes */{len}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
                    );
                    return;
                }
                Some(n) => {
                    extra += &format!("Content-Range: bytes {n}-{}/{len}\r\n", len - 1);
                    ("206 Partial Content", &data[n..])
                }
                None => ("200 OK", &data[..]),
            };
            if write!(
                conn,
                "HTTP/1.1 {status}\r\nContent-Type: application/octet-stream\r\n{extra}Content-Length: {}\r\nConnection: close\r\n\r\n",
                body.len()
            )
            .is_err()
            {
                return;
            }
            let sent = cut_after.map_or(body.len(), |c| c.min(body.len()));
            send_body(&mut conn, &body[..sent], chunk, delay, stop);
            let _ = conn.flush();
            if cut_after.is_some() {
                let _ = conn.shutdown(std::net::Shutdown::Both);
            }
        }
    }
}

/// Writes `data` `chunk` bytes at a time with `delay` after each; stops early when the peer goes
/// away or the server is dropped.
fn send_body(conn: &mut TcpStream, data: &[u8], chunk: usize, delay: Duration, stop: &AtomicBool) {
    for piece in data.chunks(chunk.max(1)) {
        if stop.load(Ordering::SeqCst) || conn.write_all(piece).is_err() {
            return;
        }
        if !delay.is_zero() {
            std::thread::sleep(delay);
        }
    }
}

/// GET `path` from the guest's web server through a forward; the body (retried for a few
/// seconds while the answer is empty).
pub fn http_get(port: u64, path: &str) -> String {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let mut out = String::new();
        if let Ok(mut c) = TcpStream::connect(("127.0.0.1", port as u16)) {
            c.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
            let req = format!("GET {path} HTTP/1.0\r\nHost: x\r\n\r\n");
            if c.write_all(req.as_bytes()).is_ok() {
                let _ = c.read_to_string(&mut out);
            }
        }
        if let Some((_, body)) = out.split_once("\r\n\r\n") {
            return body.to_string();
        }
        if Instant::now() >= deadline {
            return format!("(no HTTP response: {out:?})");
        }
        std::thread::sleep(Duration::from_millis(300));
    }
}
