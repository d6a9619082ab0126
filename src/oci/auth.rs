//! Who mcqemu is to a registry, and what a registry says when it refuses: basic credentials
//! from the user's Docker config (`auths`, with the file and key they came from, so a refusal
//! can name them; a credential helper is named, not run), and the registry's own words from an
//! error answer, capped.

use std::path::{Path, PathBuf};

use super::error::OciError;

/// What the Docker config says of a host's credentials.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Creds {
    /// None: pull anonymously.
    None,
    /// The `auths` entry's base64 `user:password`.
    Basic(Basic),
    /// Kept by a credential helper, which mcqemu does not run: said when the registry refuses
    /// an anonymous pull.
    Helper(String),
}

/// Basic credentials, with where they came from: a refusal names them (never the password).
#[derive(Debug, PartialEq, Eq, Clone)]
pub(super) struct Basic {
    /// Base64 of `user:password`.
    pub(super) auth: String,
    /// The config file and its `auths` key, in words.
    pub(super) from: String,
}

impl Basic {
    /// The user name the credentials carry, when they decode.
    fn user(&self) -> Option<String> {
        let plain = crate::b64::decode(&self.auth).ok()?;
        let plain = String::from_utf8_lossy(&plain);
        Some(plain.split_once(':')?.0.to_string())
    }

    /// Who was tried, from where: `user "u" from FILE (auths key "K")`.
    pub(super) fn said(&self) -> String {
        match self.user() {
            Some(u) => format!("user {u:?} from {}", self.from),
            None => format!("the credentials from {}", self.from),
        }
    }
}

/// Credentials for `host` from the Docker config (`$DOCKER_CONFIG/config.json`, else
/// `~/.docker/config.json`).
pub(super) fn credentials(host: &str) -> Result<Creds, OciError> {
    let file = match std::env::var_os("DOCKER_CONFIG") {
        Some(d) => PathBuf::from(d).join("config.json"),
        None => match std::env::var_os("HOME") {
            Some(h) => PathBuf::from(h).join(".docker/config.json"),
            None => return Ok(Creds::None),
        },
    };
    creds_in(&file, host)
}

/// [`credentials`] from the config file `file`.
fn creds_in(file: &Path, host: &str) -> Result<Creds, OciError> {
    let Ok(bytes) = std::fs::read(file) else {
        return Ok(Creds::None);
    };
    let v: serde_json::Value = serde_json::from_slice(&bytes)
        .map_err(|e| OciError::Invalid(format!("{} is not JSON: {e}", file.display())))?;
    let keys = [
        host.to_string(),
        format!("https://{host}"),
        format!("http://{host}"),
    ];
    let hub = host == "registry-1.docker.io";
    for (key, a) in v["auths"].as_object().into_iter().flatten() {
        let k = key.trim_end_matches('/');
        let ok = keys.iter().any(|x| x == k)
            || (hub && (k.contains("index.docker.io") || k == "docker.io"));
        if let (true, Some(auth)) = (ok, a["auth"].as_str()) {
            return Ok(Creds::Basic(Basic {
                auth: auth.to_string(),
                from: format!("{} (auths key {key:?})", file.display()),
            }));
        }
    }
    let helper = v["credHelpers"][host].as_str().or(v["credsStore"].as_str());
    Ok(match helper {
        Some(h) => Creds::Helper(format!(
            "{} keeps the credentials for {host} in the helper docker-credential-{h}, which \
             mcqemu does not run; add an auths entry for {host} (base64 of user:password)",
            file.display()
        )),
        None => Creds::None,
    })
}

/// The registry's own words in an error answer: Docker Hub's token service's `details`, the
/// distribution spec's `errors[].message`, an OAuth `error_description`, or a short plain text.
pub(super) fn registry_words(mut resp: ureq::http::Response<ureq::Body>) -> Option<String> {
    let body = resp
        .body_mut()
        .with_config()
        .limit(64 * 1024)
        .read_to_vec()
        .ok()?;
    words_in(&body)
}

/// [`registry_words`] of a body already read.
fn words_in(body: &[u8]) -> Option<String> {
    let text = match serde_json::from_slice::<serde_json::Value>(body) {
        Ok(v) => {
            let errors: Vec<&str> = v["errors"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|e| e["message"].as_str())
                .collect();
            if let Some(d) = v["details"].as_str() {
                d.to_string()
            } else if !errors.is_empty() {
                errors.join("; ")
            } else if let Some(d) = v["error_description"].as_str().or(v["error"].as_str()) {
                d.to_string()
            } else {
                return None;
            }
        }
        Err(_) => String::from_utf8_lossy(body).trim().to_string(),
    };
    let text: String = text.chars().filter(|c| !c.is_control()).take(300).collect();
    (!text.is_empty()).then_some(text)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn credentials_come_from_auths_and_a_helper_is_named() {
        let f = std::env::temp_dir().join(format!("mcq-docker-config-{}.json", std::process::id()));
        std::fs::write(
            &f,
            r#"{"auths": {"https://ghcr.io": {"auth": "dTpw"}, "https://index.docker.io/v1/": {"auth": "aHViOnB3"}},
                "credHelpers": {"quay.io": "secretservice"}}"#,
        )
        .unwrap();
        let basic = |c: Creds| match c {
            Creds::Basic(b) => b,
            other => panic!("{other:?}"),
        };
        let ghcr = basic(creds_in(&f, "ghcr.io").unwrap());
        assert_eq!(ghcr.auth, "dTpw");
        assert_eq!(
            ghcr.said(),
            format!(
                "user \"u\" from {} (auths key \"https://ghcr.io\")",
                f.display()
            )
        );
        let hub = basic(creds_in(&f, "registry-1.docker.io").unwrap());
        assert_eq!(hub.auth, "aHViOnB3");
        assert!(
            hub.from.contains("\"https://index.docker.io/v1/\""),
            "{hub:?}"
        );
        match creds_in(&f, "quay.io").unwrap() {
            Creds::Helper(why) => assert!(why.contains("docker-credential-secretservice"), "{why}"),
            other => panic!("{other:?}"),
        }
        assert_eq!(creds_in(&f, "127.0.0.1:5000").unwrap(), Creds::None);
        let _ = std::fs::remove_file(&f);
        assert_eq!(
            creds_in(&f, "ghcr.io").unwrap(),
            Creds::None,
            "no config: anonymous"
        );
    }

    #[test]
    fn the_registrys_own_words_are_kept() {
        let w = |b: &str| words_in(b.as_bytes());
        assert_eq!(
            w(r#"{"details":"incorrect username or password"}"#).as_deref(),
            Some("incorrect username or password")
        );
        assert_eq!(
            w(r#"{"errors":[{"code":"UNAUTHORIZED","message":"authentication required"}]}"#)
                .as_deref(),
            Some("authentication required")
        );
        assert_eq!(w("").as_deref(), None);
        assert_eq!(w("{}").as_deref(), None);
        assert_eq!(w("denied\n").as_deref(), Some("denied"));
        assert_eq!(w(&"x".repeat(1000)).map(|t| t.len()), Some(300));
    }
}
