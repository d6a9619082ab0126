//! HTTP(S) for downloads: the URL check every hop passes, GET with redirects followed one by
//! one (each checked), request errors described for the caller, and small documents fetched
//! into memory.

use std::io::Read;
use std::time::Duration;

use super::error::DownloadError;

/// Checks the URL's scheme before any connection is made.
pub fn check_url(url: &str) -> Result<(), DownloadError> {
    let lower = url.to_ascii_lowercase();
    if !(lower.starts_with("http://") || lower.starts_with("https://")) {
        let scheme = url.split_once(':').map(|(s, _)| s).unwrap_or(url);
        return Err(DownloadError::Scheme(scheme.to_string()));
    }
    if url.len() <= lower.find("//").map(|i| i + 2).unwrap_or(0) {
        return Err(DownloadError::NoHost);
    }
    Ok(())
}

/// The error of a failed request: an HTTP status as itself (a caller may try another URL
/// for a 404), anything else described.
pub(super) fn request_error(url: &str, e: ureq::Error) -> DownloadError {
    match e {
        ureq::Error::StatusCode(code) => DownloadError::Status {
            code,
            url: url.to_string(),
        },
        e => DownloadError::Request(describe(url, e)),
    }
}

/// Says why a request for `url` failed, and what the likely cause is.
fn describe(url: &str, e: ureq::Error) -> String {
    let msg = e.to_string();
    let lower = msg.to_ascii_lowercase();
    match e {
        ureq::Error::StatusCode(code) => {
            format!("the server answered HTTP {code} for {url}; check the URL")
        }
        ureq::Error::HostNotFound => format!(
            "cannot resolve the host of {url} (DNS): {msg}; check the host name and the network"
        ),
        ureq::Error::Tls(_) | ureq::Error::Rustls(_) => format!(
            "TLS failed for {url}: {msg}; the server's certificate is not trusted or the \
             handshake failed"
        ),
        ureq::Error::ConnectionFailed => {
            format!("cannot connect to {url}: {msg}; is the server up and reachable?")
        }
        ureq::Error::Timeout(t) => {
            format!("{url} did not answer in time ({t}); is the server up and reachable?")
        }
        ureq::Error::TooManyRedirects => format!("too many redirects from {url}"),
        ureq::Error::BadUri(_) => format!("{url} is not a valid URL: {msg}"),
        _ if lower.contains("tls") || lower.contains("certificate") => {
            format!("TLS failed for {url}: {msg}")
        }
        _ => format!("download of {url} failed: {msg}"),
    }
}

/// A response header as text, when present and readable.
pub(super) fn header(resp: &ureq::http::Response<ureq::Body>, name: &str) -> Option<String> {
    resp.headers()
        .get(name)
        .and_then(|v| v.to_str().ok())
        .map(str::to_string)
}

/// Most redirects followed for one download.
const MAX_REDIRECTS: usize = 8;

/// Resolves a redirect's Location against the URL that answered with it (RFC 3986 reference
/// forms: absolute, `//host/...`, `/path`, `?query`, relative path). Dot segments are left for
/// the URL parser to normalize.
fn join_location(base: &str, location: &str) -> String {
    let loc = location.trim();
    let has_scheme = loc.split_once(':').is_some_and(|(scheme, _)| {
        scheme.starts_with(|c: char| c.is_ascii_alphabetic())
            && scheme
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '+' | '-' | '.'))
    });
    if has_scheme {
        return loc.to_string();
    }
    let (scheme, rest) = base.split_once("://").unwrap_or(("http", base));
    if let Some(r) = loc.strip_prefix("//") {
        return format!("{scheme}://{r}");
    }
    let authority_end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    let origin = format!("{scheme}://{}", &rest[..authority_end]);
    let tail = &rest[authority_end..];
    let path = &tail[..tail.find(['?', '#']).unwrap_or(tail.len())];
    if loc.starts_with('/') {
        return format!("{origin}{loc}");
    }
    if loc.starts_with('?') || loc.is_empty() {
        let path = if path.is_empty() { "/" } else { path };
        return format!("{origin}{path}{loc}");
    }
    let dir = &path[..path.rfind('/').map(|i| i + 1).unwrap_or(0)];
    let dir = if dir.is_empty() { "/" } else { dir };
    format!("{origin}{dir}{loc}")
}

/// The HTTP client mcqemu's downloads and the registry client use: bounded connect, response
/// and per-read waits; redirects and error statuses left to the caller.
pub fn agent() -> ureq::Agent {
    // Redirects are followed here, not by ureq: ureq panics on a Location without a host
    // (e.g. file:///etc/passwd), and every hop must pass the same http(s) check as the URL.
    ureq::Agent::config_builder()
        .timeout_connect(Some(Duration::from_secs(20)))
        .timeout_recv_response(Some(Duration::from_secs(60)))
        .timeout_per_read(Some(Duration::from_secs(60)))
        .max_redirects(0)
        .http_status_as_error(false)
        .user_agent(concat!("mcqemu/", env!("CARGO_PKG_VERSION")))
        .build()
        .into()
}

/// GETs `url` (with `range` as `Range`/`If-Range` when continuing), following redirects with
/// each hop checked. Returns the response and the final URL.
pub(super) fn get(
    url: &str,
    range: Option<(u64, Option<&str>)>,
) -> Result<(ureq::http::Response<ureq::Body>, String), DownloadError> {
    let agent = agent();
    let mut url = url.to_string();
    let mut hops = 0;
    loop {
        let mut rb = agent.get(&url);
        if let Some((from, validator)) = range {
            rb = rb.header("Range", &format!("bytes={from}-"));
            if let Some(v) = validator {
                rb = rb.header("If-Range", v);
            }
        }
        let resp = rb.call().map_err(|e| request_error(&url, e))?;
        let status = resp.status().as_u16();
        if status == 416 {
            return Ok((resp, url));
        }
        if (400..600).contains(&status) {
            let e = ureq::Error::StatusCode(status);
            return Err(request_error(&url, e));
        }
        if !(300..400).contains(&status) {
            return Ok((resp, url));
        }
        let location = header(&resp, "Location").ok_or_else(|| DownloadError::NoLocation {
            status,
            url: url.clone(),
        })?;
        if hops >= MAX_REDIRECTS {
            return Err(DownloadError::TooManyRedirects(url));
        }
        let next = join_location(&url, &location);
        if let Err(why) = check_url(&next) {
            return Err(DownloadError::RedirectRefused {
                from: url,
                to: next,
                why: Box::new(why),
            });
        }
        url = next;
        hops += 1;
    }
}

/// Fetches a small document (a checksum file) into memory, at most `max` bytes.
pub fn fetch_small(url: &str, max: usize) -> Result<Vec<u8>, DownloadError> {
    check_url(url)?;
    let (resp, _) = get(url, None)?;
    let status = resp.status().as_u16();
    if status != 200 {
        let e = ureq::Error::StatusCode(status);
        return Err(request_error(url, e));
    }
    let mut body = Vec::new();
    resp.into_body()
        .into_reader()
        .take(max as u64 + 1)
        .read_to_end(&mut body)
        .map_err(|error| DownloadError::Connection { done: 0, error })?;
    if body.len() > max {
        return Err(DownloadError::PassedMax(max as u64));
    }
    Ok(body)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refuses_other_schemes() {
        assert!(check_url("file:///etc/passwd")
            .unwrap_err()
            .to_string()
            .contains("\"file\""));
        assert!(check_url("ftp://x/y").is_err());
        assert!(check_url("https://").is_err());
        assert!(check_url("HTTPS://example.org/a.img").is_ok());
    }

    #[test]
    fn joins_redirect_locations() {
        let base = "http://h:8080/a/b/img.qcow2?x=1";
        assert_eq!(join_location(base, "https://o/x"), "https://o/x");
        assert_eq!(
            join_location(base, "file:///etc/passwd"),
            "file:///etc/passwd"
        );
        assert_eq!(join_location(base, "//cdn/y"), "http://cdn/y");
        assert_eq!(join_location(base, "/z"), "http://h:8080/z");
        assert_eq!(join_location(base, "c.img"), "http://h:8080/a/b/c.img");
        assert_eq!(
            join_location(base, "../c.img"),
            "http://h:8080/a/b/../c.img"
        );
        assert_eq!(
            join_location(base, "?y=2"),
            "http://h:8080/a/b/img.qcow2?y=2"
        );
        assert_eq!(join_location("http://h", "c.img"), "http://h/c.img");
        assert_eq!(join_location("http://h?q", "c.img"), "http://h/c.img");
    }
}
