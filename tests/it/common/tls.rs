//! An HTTPS server on 127.0.0.1 with a CA of its own, standing in for a host an egress proxy
//! speaks TLS to (the secrets test, the egress bench): it records each request's head and
//! answers `ok`, closing the connection.

use std::io::{Read, Write};
use std::net::TcpListener;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// Request heads a server received.
pub type Heads = Arc<Mutex<Vec<String>>>;

/// A running upstream.
pub struct TlsUpstream {
    /// Its port on 127.0.0.1 (its certificate names localhost and 127.0.0.1).
    pub port: u16,
    /// What it received.
    pub heads: Heads,
    /// Its CA's certificate (PEM), for whoever is to trust it.
    pub ca_pem: String,
}

/// PEM text of a DER certificate.
pub fn pem(der: &[u8]) -> String {
    let b64 = mcqemu::b64::encode(der);
    let mut out = String::from("-----BEGIN CERTIFICATE-----\n");
    for line in b64.as_bytes().chunks(64) {
        out.push_str(std::str::from_utf8(line).unwrap_or_default());
        out.push('\n');
    }
    out.push_str("-----END CERTIFICATE-----\n");
    out
}

/// Reads one request head from `c`, records it in `heads`, and answers `ok`.
pub fn answer(mut c: impl Read + Write, heads: &Heads) {
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") && head.len() < 65536 {
        match c.read(&mut byte) {
            Ok(1) => head.push(byte[0]),
            _ => return,
        }
    }
    if let Ok(mut h) = heads.lock() {
        h.push(String::from_utf8_lossy(&head).into_owned());
    }
    let _ = c.write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok");
    let _ = c.flush();
}

/// Starts an upstream; each connection is served on a thread of its own.
pub fn start() -> TlsUpstream {
    let mut ca = rcgen::CertificateParams::default();
    ca.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    ca.distinguished_name
        .push(rcgen::DnType::CommonName, "mcqemu test upstream CA");
    let issuer =
        rcgen::CertifiedIssuer::self_signed(ca, rcgen::KeyPair::generate().expect("a key"))
            .expect("a CA");
    let key = rcgen::KeyPair::generate().expect("a key");
    let leaf = rcgen::CertificateParams::new(vec!["localhost".into(), "127.0.0.1".into()])
        .expect("names")
        .signed_by(&key, &issuer)
        .expect("a certificate");
    let chain = vec![leaf.der().clone(), issuer.der().clone()];
    let key = rustls::pki_types::PrivateKeyDer::Pkcs8(key.serialize_der().into());
    let config = Arc::new(
        rustls::ServerConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .expect("TLS versions")
        .with_no_client_auth()
        .with_single_cert(chain, key)
        .expect("TLS settings"),
    );
    let l = TcpListener::bind("127.0.0.1:0").expect("a port");
    let port = l.local_addr().expect("its address").port();
    let heads: Heads = Arc::default();
    let h = heads.clone();
    std::thread::spawn(move || {
        for c in l.incoming().flatten() {
            let (config, h) = (config.clone(), h.clone());
            std::thread::spawn(move || {
                let _ = c.set_read_timeout(Some(Duration::from_secs(10)));
                let Ok(conn) = rustls::ServerConnection::new(config) else {
                    return;
                };
                let mut s = rustls::StreamOwned::new(conn, c);
                answer(&mut s, &h);
                s.conn.send_close_notify();
                let _ = s.flush();
            });
        }
    });
    TlsUpstream {
        port,
        heads,
        ca_pem: pem(issuer.der()),
    }
}
