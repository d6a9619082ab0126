//! A seed for a VM whose network is its egress proxy: the guest learns the proxy at first
//! boot (apt's proxy through cloud-init's own `apt` module, `http_proxy`/`https_proxy` for
//! every login and for programs that read /etc/environment). The caller's own `apt` settings
//! win; verbatim user_data is left as written.

use serde_json::{json, Value};

use super::{CloudInit, UserData};

impl CloudInit {
    /// The same seed, teaching the guest the proxy at `url`.
    pub fn with_proxy(mut self, url: &str) -> CloudInit {
        let UserData::Config(cfg) = &mut self.user_data else {
            return self;
        };
        cfg.entry("apt")
            .or_insert_with(|| json!({"proxy": url, "http_proxy": url, "https_proxy": url}));
        let env = format!(
            "http_proxy={url}\nhttps_proxy={url}\nHTTP_PROXY={url}\nHTTPS_PROXY={url}\n\
             no_proxy=localhost,127.0.0.1,::1\n"
        );
        let profile: String = env.lines().map(|l| format!("export {l}\n")).collect();
        let files = [
            json!({"path": "/etc/environment", "content": env, "append": true}),
            json!({"path": "/etc/profile.d/mcqemu-egress-proxy.sh", "content": profile,
                   "permissions": "0644"}),
        ];
        match cfg.get_mut("write_files") {
            Some(Value::Array(list)) => list.extend(files),
            _ => {
                cfg.insert("write_files".into(), Value::Array(files.to_vec()));
            }
        }
        self
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_seed_learns_the_proxy_and_keeps_the_callers_files_and_apt() {
        let ci = CloudInit::parse(&json!({"write_files": [{"path": "/a", "content": "x"}]}))
            .unwrap()
            .with_proxy("http://10.0.2.2:3128");
        let ud = ci.user_data();
        assert!(ud.contains("/a") && ud.contains("/etc/profile.d/mcqemu-egress-proxy.sh"));
        assert!(ud.contains("https_proxy=http://10.0.2.2:3128"));
        assert!(ud.contains("\"proxy\": \"http://10.0.2.2:3128\""), "{ud}");
        let raw = CloudInit::parse(&json!({"user_data": "#!/bin/sh\ntrue\n"})).unwrap();
        assert_eq!(
            raw.clone().with_proxy("http://p").user_data(),
            raw.user_data()
        );
    }
}
