//! TLS inside a VM's tunnels to its secrets' hosts. The proxy is a certificate authority made
//! for this VM when it starts: its key lives in the proxy's memory only (the guest gets its
//! certificate, to trust), and it signs a certificate for each host the guest tunnels to that
//! a secret goes to. The proxy ends the guest's TLS with that certificate, reads the request's
//! head, adds the secret ([`super::rewrite`]), and sends the request over its own TLS to the
//! host, verified against the web's roots (and the operator's extra CA, for a test
//! upstream). Tunnels to other hosts are never opened: they stay plain tunnels.

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::sync::{Arc, Mutex};

use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DnType, IsCa, KeyPair, KeyUsagePurpose,
};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer, ServerName};

use super::request::read_head;
use super::rewrite::rewrite;
use super::secrets::ProxySecret;
use crate::kind::Failed;

/// Most bytes of one intercepted exchange, each way.
const MAX_BYTES: u64 = 8 << 30;
/// Longest chunk-size line of a chunked request body.
const MAX_LINE: u64 = 4096;

/// This VM's certificate authority and the TLS settings made from it.
pub struct Authority {
    issuer: CertifiedIssuer<'static, KeyPair>,
    /// One key for every host's certificate (made once: a key pair is the slow part).
    leaf_key: KeyPair,
    leaves: Mutex<HashMap<String, Arc<rustls::ServerConfig>>>,
    upstream: Arc<rustls::ClientConfig>,
}

/// Where an intercepted tunnel goes, and how long it may sit idle once its head is read.
pub struct Tunnel<'a> {
    /// The host as the guest named it.
    pub host: &'a str,
    /// Its port.
    pub port: u16,
    /// The read timeout on the guest's side after the head (the head keeps the socket's own).
    pub idle: std::time::Duration,
}

/// What one intercepted request did.
#[derive(Debug, Default)]
pub struct Exchanged {
    /// Bytes carried, both ways.
    pub bytes: u64,
    /// Secrets added to it.
    pub added: Vec<String>,
    /// Secrets whose placeholder it carried to a host not theirs.
    pub stray: Vec<String>,
}

fn tls_err(what: &str) -> impl Fn(rustls::Error) -> Failed + '_ {
    move |e| Failed::host(format!("{what}: {e}"))
}

impl Authority {
    /// A new authority for VM `vm`; upstream hosts are verified against the web's roots and
    /// the certificates in the PEM file `extra_roots`.
    pub fn new(vm: &str, extra_roots: Option<&Path>) -> Result<Authority, Failed> {
        let gen = |e: rcgen::Error| Failed::host(format!("cannot make the VM's CA: {e}"));
        let mut params = CertificateParams::default();
        params
            .distinguished_name
            .push(DnType::CommonName, format!("mcqemu egress CA for VM {vm}"));
        params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
        params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
        let issuer =
            CertifiedIssuer::self_signed(params, KeyPair::generate().map_err(gen)?).map_err(gen)?;
        let mut roots = rustls::RootCertStore::empty();
        roots.extend(webpki_roots::TLS_SERVER_ROOTS.iter().cloned());
        if let Some(path) = extra_roots {
            let certs = CertificateDer::pem_file_iter(path)
                .map_err(|e| Failed::host(format!("cannot read {}: {e}", path.display())))?;
            for c in certs {
                let c = c.map_err(|e| Failed::host(format!("{}: {e}", path.display())))?;
                roots
                    .add(c)
                    .map_err(tls_err("an extra upstream CA is not a CA certificate"))?;
            }
        }
        let upstream = rustls::ClientConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .map_err(tls_err("TLS settings"))?
            .with_root_certificates(roots)
            .with_no_client_auth();
        Ok(Authority {
            issuer,
            leaf_key: KeyPair::generate().map_err(gen)?,
            leaves: Mutex::new(HashMap::new()),
            upstream: Arc::new(upstream),
        })
    }

    /// The authority's certificate, for the guest to trust (PEM).
    pub fn ca_pem(&self) -> String {
        pem("CERTIFICATE", self.issuer.der())
    }

    /// The guest side's TLS settings for `host`: a certificate for it, signed now or before.
    fn server_config(&self, host: &str) -> Result<Arc<rustls::ServerConfig>, Failed> {
        let mut leaves = self
            .leaves
            .lock()
            .map_err(|_| Failed::host("the certificate cache is poisoned"))?;
        if let Some(c) = leaves.get(host) {
            return Ok(c.clone());
        }
        let gen = |e: rcgen::Error| Failed::host(format!("cannot sign a certificate: {e}"));
        let mut params = CertificateParams::new(vec![host.to_string()]).map_err(gen)?;
        params.distinguished_name.push(DnType::CommonName, host);
        let leaf = params
            .signed_by(&self.leaf_key, &self.issuer)
            .map_err(gen)?;
        let chain = vec![leaf.der().clone(), self.issuer.der().clone()];
        let key = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(self.leaf_key.serialize_der()));
        let config = rustls::ServerConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .map_err(tls_err("TLS settings"))?
            .with_no_client_auth()
            .with_single_cert(chain, key)
            .map_err(tls_err("the host's certificate"))?;
        let config = Arc::new(config);
        leaves.insert(host.to_string(), config.clone());
        Ok(config)
    }

    /// Serves one tunnel the guest opened `to` a host (its CONNECT answered; `early`
    /// holds any bytes it sent past the CONNECT): one request, its secrets added, sent to the
    /// host over verified TLS on `upstream`, and the answer carried back.
    pub fn intercept(
        &self,
        guest: TcpStream,
        early: &[u8],
        upstream: TcpStream,
        to: &Tunnel,
        secrets: &[ProxySecret],
    ) -> Result<Exchanged, Failed> {
        let (host, port) = (to.host, to.port);
        let mut conn = rustls::ServerConnection::new(self.server_config(host)?)
            .map_err(tls_err("the guest's TLS"))?;
        if !early.is_empty() {
            conn.read_tls(&mut &early[..])
                .map_err(|e| Failed::host(format!("the guest's TLS: {e}")))?;
        }
        let mut g = rustls::StreamOwned::new(conn, guest);
        let (head, rest) = read_head(&mut g)?;
        let _ = g.sock.set_read_timeout(Some(to.idle));
        let out = rewrite(&head, host, port, secrets, true)?;
        let name = ServerName::try_from(host.to_string())
            .map_err(|e| Failed::invalid(format!("{host} is not a TLS server name: {e}")))?;
        let client = rustls::ClientConnection::new(self.upstream.clone(), name)
            .map_err(tls_err("the host's TLS"))?;
        let mut u = rustls::StreamOwned::new(client, upstream);
        let up = |e: std::io::Error| Failed::host(format!("{host}:{port}: {e}"));
        u.write_all(&out.head).map_err(up)?;
        let sent = body(&head, &rest, &mut g, &mut u).map_err(up)?;
        u.flush().map_err(up)?;
        let back = copy_until_end(&mut u, &mut g).map_err(up)?;
        g.conn.send_close_notify();
        let _ = g.flush();
        Ok(Exchanged {
            bytes: out.head.len() as u64 + sent + back,
            added: out.added,
            stray: out.stray,
        })
    }
}

/// The crypto every TLS setting here uses (ring, as the rest of the binary).
fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// PEM text of a DER document.
fn pem(label: &str, der: &[u8]) -> String {
    let b64 = crate::b64::encode(der);
    let mut out = format!("-----BEGIN {label}-----\n");
    for line in b64.as_bytes().chunks(64) {
        out.push_str(&String::from_utf8_lossy(line));
        out.push('\n');
    }
    out.push_str(&format!("-----END {label}-----\n"));
    out
}

/// How a request's body is framed, from its head.
#[derive(Debug, PartialEq, Eq)]
enum Framing {
    None,
    Length(u64),
    Chunked,
}

fn framing(head: &[u8]) -> Result<Framing, std::io::Error> {
    let bad = |why: &str| std::io::Error::new(std::io::ErrorKind::InvalidData, why.to_string());
    let text = String::from_utf8_lossy(head);
    let mut f = Framing::None;
    for line in text.split("\r\n").skip(1) {
        let Some((n, v)) = line.split_once(':') else {
            continue;
        };
        let (n, v) = (n.trim().to_ascii_lowercase(), v.trim());
        if n == "transfer-encoding" {
            if !v.eq_ignore_ascii_case("chunked") {
                return Err(bad("only chunked transfer-encoding is carried"));
            }
            f = Framing::Chunked;
        } else if n == "content-length" && f == Framing::None {
            f = Framing::Length(v.parse().map_err(|_| bad("a bad Content-Length"))?);
        }
    }
    Ok(f)
}

/// Carries the request's body (`rest` is its start, read with the head) from the guest to the
/// host, as its head frames it; the bytes carried.
fn body(head: &[u8], rest: &[u8], g: &mut impl Read, u: &mut impl Write) -> std::io::Result<u64> {
    let mut from = BufReader::new(rest.chain(g));
    match framing(head)? {
        Framing::None => Ok(0),
        Framing::Length(n) => {
            let got = std::io::copy(&mut (&mut from).take(n.min(MAX_BYTES)), u)?;
            if got < n {
                return Err(std::io::ErrorKind::UnexpectedEof.into());
            }
            Ok(got)
        }
        Framing::Chunked => {
            let mut total = 0;
            loop {
                let mut line = String::new();
                (&mut from).take(MAX_LINE).read_line(&mut line)?;
                if !line.ends_with('\n') {
                    return Err(std::io::ErrorKind::InvalidData.into());
                }
                u.write_all(line.as_bytes())?;
                total += line.len() as u64;
                let size = line.trim().split(';').next().unwrap_or("");
                let size = u64::from_str_radix(size, 16)
                    .map_err(|_| std::io::Error::from(std::io::ErrorKind::InvalidData))?;
                if size == 0 {
                    // Trailers, then the blank line.
                    loop {
                        let mut t = String::new();
                        (&mut from).take(MAX_LINE).read_line(&mut t)?;
                        u.write_all(t.as_bytes())?;
                        total += t.len() as u64;
                        if t == "\r\n" || t.is_empty() {
                            return Ok(total);
                        }
                    }
                }
                let got = std::io::copy(&mut (&mut from).take(size + 2), u)?;
                total += got;
                if got < size + 2 || total > MAX_BYTES {
                    return Err(std::io::ErrorKind::UnexpectedEof.into());
                }
            }
        }
    }
}

/// Copies the host's answer to the guest until the host closes (the request said
/// `Connection: close`); a TLS stream cut without its close_notify ends it too.
fn copy_until_end(u: &mut impl Read, g: &mut impl Write) -> std::io::Result<u64> {
    let mut buf = vec![0u8; 16 << 10];
    let mut total = 0u64;
    loop {
        let n = match u.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => break,
            Err(e) => return Err(e),
        };
        g.write_all(&buf[..n])?;
        total += n as u64;
        if total > MAX_BYTES {
            break;
        }
    }
    g.flush()?;
    Ok(total)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bodies_are_carried_as_their_heads_frame_them() {
        let head = b"POST / HTTP/1.1\r\nContent-Length: 5\r\n\r\n";
        let mut out = Vec::new();
        let n = body(head, b"he", &mut &b"llo+extra"[..], &mut out).unwrap();
        assert_eq!((n, out.as_slice()), (5, &b"hello"[..]));

        let head = b"POST / HTTP/1.1\r\ntransfer-encoding: chunked\r\n\r\n";
        let wire = b"3\r\nabc\r\n0\r\n\r\nnext";
        let mut out = Vec::new();
        body(head, &wire[..4], &mut &wire[4..], &mut out).unwrap();
        assert_eq!(out, b"3\r\nabc\r\n0\r\n\r\n");

        let mut out = Vec::new();
        assert!(body(head, b"zz\r\n", &mut &b""[..], &mut out).is_err());
        let head = b"POST / HTTP/1.1\r\nTransfer-Encoding: gzip\r\n\r\n";
        assert!(body(head, b"", &mut &b""[..], &mut out).is_err());
        let head = b"GET / HTTP/1.1\r\nHost: a\r\n\r\n";
        assert_eq!(body(head, b"", &mut &b"x"[..], &mut out).unwrap(), 0);
    }

    #[test]
    fn the_authority_signs_certificates_rustls_accepts() {
        let a = Authority::new("t", None).unwrap();
        assert!(a.ca_pem().starts_with("-----BEGIN CERTIFICATE-----\n"));
        let one = a.server_config("api.example.com").unwrap();
        let again = a.server_config("api.example.com").unwrap();
        assert!(
            Arc::ptr_eq(&one, &again),
            "a host's certificate is made once"
        );
        a.server_config("127.0.0.1").unwrap();
    }
}
