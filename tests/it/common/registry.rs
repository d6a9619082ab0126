//! Debian's docker-registry on a free loopback port, for the container-image tests and bench.

use std::path::Path;
use std::time::Duration;

/// Debian's docker-registry on a free loopback port, its storage in `dir`; killed on drop.
pub struct Registry {
    child: std::process::Child,
    pub addr: String,
}

impl Registry {
    pub fn start(dir: &Path) -> Registry {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let addr = format!("127.0.0.1:{port}");
        std::fs::create_dir_all(dir).unwrap();
        let cfg = dir.join("registry.yml");
        std::fs::write(
            &cfg,
            format!(
                "version: 0.1\nlog:\n  level: error\nstorage:\n  filesystem:\n    rootdirectory: {}\nhttp:\n  addr: {addr}\n",
                dir.join("storage").display()
            ),
        )
        .unwrap();
        let child = std::process::Command::new("docker-registry")
            .arg("serve")
            .arg(&cfg)
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap_or_else(|e| {
                panic!("docker-registry (apt install docker-registry; .ci/setup-host does): {e}")
            });
        let deadline = std::time::Instant::now() + Duration::from_secs(20);
        while std::net::TcpStream::connect(&addr).is_err() {
            assert!(
                std::time::Instant::now() < deadline,
                "docker-registry did not listen on {addr}"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        Registry { child, addr }
    }
}

impl Drop for Registry {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
