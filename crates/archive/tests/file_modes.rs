//! The SQLite archive holds every run's text: its file and the `-wal`/`-shm` files SQLite
//! creates next to it are readable by their owner only, and an existing database with a
//! wider mode is narrowed when it is opened.
#![cfg(unix)]

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use streamgate_archive::open_store;

fn mode(p: &Path) -> u32 {
    std::fs::metadata(p).expect("stat").permissions().mode() & 0o777
}

fn side(db: &Path, suffix: &str) -> std::path::PathBuf {
    let mut s = db.as_os_str().to_owned();
    s.push(suffix);
    s.into()
}

#[tokio::test]
async fn new_database_and_its_wal_and_shm_are_owner_only() {
    let dir = tempfile::tempdir().expect("tempdir");
    let db = dir.path().join("archive.db");
    let store = open_store(&format!("sqlite://{}", db.display()))
        .await
        .expect("open");
    // Reading through the store opens the WAL and SHM files.
    let _ = store.get_run("default", "nope").await.expect("read");
    assert_eq!(mode(&db), 0o600, "archive.db");
    for suffix in ["-wal", "-shm"] {
        let p = side(&db, suffix);
        assert!(p.exists(), "{} exists in WAL mode", p.display());
        assert_eq!(mode(&p), 0o600, "{}", p.display());
    }
}

#[tokio::test]
async fn existing_database_is_narrowed_to_owner_only() {
    let dir = tempfile::tempdir().expect("tempdir");
    let db = dir.path().join("archive.db");
    let url = format!("sqlite://{}", db.display());
    drop(open_store(&url).await.expect("first open"));
    // Give the store's threads a moment to close their connections.
    tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    std::fs::set_permissions(&db, std::fs::Permissions::from_mode(0o644)).expect("chmod");
    for suffix in ["-wal", "-shm"] {
        let p = side(&db, suffix);
        if p.exists() {
            std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o644)).expect("chmod");
        }
    }
    let store = open_store(&url).await.expect("reopen");
    let _ = store.get_run("default", "nope").await.expect("read");
    assert_eq!(mode(&db), 0o600, "archive.db");
    for suffix in ["-wal", "-shm"] {
        let p = side(&db, suffix);
        if p.exists() {
            assert_eq!(mode(&p), 0o600, "{}", p.display());
        }
    }
}
