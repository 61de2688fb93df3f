//! The TLS and ingest-token flags end to end, through the binaries: `streamgate
//! normalizer` with `--tls-cert/--tls-key/--tls-client-ca` and `--ingest-tokens`, and
//! `streamgate ingest` with `--ca`, `--client-cert/--client-key` and `--token`.

use crate::common;

use common::*;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};
use streamgate_testkit::pki::TestPki;
use streamgate_testkit::NatsServer;

const ACME: &str = "acme-cli-token-0123456789";

fn token_file(dir: &std::path::Path, mode: u32) -> std::path::PathBuf {
    let p = dir.join("ingest-tokens");
    std::fs::write(&p, format!("# test\n{ACME} acme\n")).unwrap();
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(mode)).unwrap();
    }
    #[cfg(not(unix))]
    let _ = mode;
    p
}

fn normalizer(nats: &NatsServer, pki: &TestPki, tokens: &std::path::Path, grpc: u16) -> Command {
    let mut c = Command::new(bin());
    c.args(["normalizer", "--nats", &nats.url()])
        .args([
            "--grpc",
            &format!("127.0.0.1:{grpc}"),
            "--http",
            "127.0.0.1:0",
        ])
        .arg("--tls-cert")
        .arg(&pki.server.cert)
        .arg("--tls-key")
        .arg(&pki.server.key)
        .arg("--tls-client-ca")
        .arg(&pki.ca)
        .arg("--ingest-tokens")
        .arg(tokens)
        .env_remove("STREAMGATE_INGEST_TOKEN")
        .stdout(Stdio::null());
    c
}

#[test]
fn ingest_over_mtls_with_a_tenant_token() {
    let nats = NatsServer::start();
    let pki = TestPki::new();
    let dir = tempfile::tempdir().unwrap();

    // A token file others may read: refused at start, naming the fix.
    let loose = token_file(dir.path(), 0o644);
    let port = streamgate_bus::local::free_port().unwrap();
    let out = normalizer(&nats, &pki, &loose, port)
        .stderr(Stdio::piped())
        .output()
        .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("chmod 600"), "{stderr}");

    let tokens = token_file(dir.path(), 0o600);
    let port = streamgate_bus::local::free_port().unwrap();
    let _svc = Graceful(
        normalizer(&nats, &pki, &tokens, port)
            .stderr(std::fs::File::create(dir.path().join("normalizer.log")).unwrap())
            .spawn()
            .unwrap(),
    );
    let deadline = Instant::now() + PATIENCE;
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(Instant::now() < deadline, "normalizer did not listen");
        std::thread::sleep(Duration::from_millis(50));
    }
    let capture = dir.path().join("capture.sse");
    std::fs::write(&capture, fixture("f1/end-turn.sse")).unwrap();
    let ingest = |run: &str, tenant: &str, client_cert: bool| {
        let mut c = Command::new(bin());
        c.args(["ingest", "--family", "f1", "--run", run, "--tenant", tenant])
            .args(["--addr", &format!("127.0.0.1:{port}"), "--token", ACME])
            .arg("--ca")
            .arg(&pki.ca)
            .arg(&capture)
            .current_dir(dir.path());
        if client_cert {
            c.arg("--client-cert")
                .arg(&pki.client.cert)
                .arg("--client-key")
                .arg(&pki.client.key);
        }
        c.output().unwrap()
    };
    let ok = ingest("cli-1", "acme", true);
    assert!(
        ok.status.success(),
        "{}",
        String::from_utf8_lossy(&ok.stderr)
    );
    let denied = ingest("cli-2", "globex", true);
    assert!(!denied.status.success());
    let stderr = String::from_utf8_lossy(&denied.stderr);
    assert!(stderr.contains("may not write tenant"), "{stderr}");
    let no_cert = ingest("cli-3", "acme", false);
    assert!(!no_cert.status.success());
}
