//! Configuration precedence for every binary: flag > environment > config file.
//!
//! Flags are declared with clap's `env = "STREAMGATE_…"`, so a flag falls back to its
//! environment variable. A config file is a list of `STREAMGATE_…=value` lines (`#`
//! comments allowed); [`load_env_file`] exports each key that is not already set, before
//! the flags are parsed — so a file supplies defaults and the environment overrides it.

use std::path::Path;

/// A config file problem.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The file could not be read.
    #[error("cannot read config file {path}: {source}")]
    Read {
        /// The file.
        path: String,
        /// Why.
        source: std::io::Error,
    },
    /// A line is not `KEY=value`.
    #[error("{path}:{line}: expected KEY=value")]
    Syntax {
        /// The file.
        path: String,
        /// 1-based line number.
        line: usize,
    },
}

/// Parses `KEY=value` lines (blank lines and `#` comments ignored; values may be quoted).
pub fn parse_env_file(text: &str, path: &str) -> Result<Vec<(String, String)>, ConfigError> {
    let mut out = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let Some((k, v)) = line.split_once('=') else {
            return Err(ConfigError::Syntax {
                path: path.to_owned(),
                line: i + 1,
            });
        };
        let k = k.trim();
        if k.is_empty() || !k.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') {
            return Err(ConfigError::Syntax {
                path: path.to_owned(),
                line: i + 1,
            });
        }
        let v = v.trim();
        let v = v
            .strip_prefix('"')
            .and_then(|v| v.strip_suffix('"'))
            .unwrap_or(v);
        out.push((k.to_owned(), v.to_owned()));
    }
    Ok(out)
}

/// Finds `--config FILE` (or `STREAMGATE_CONFIG`) in the process arguments and exports
/// the file's keys that the environment does not already set. Call before clap parses.
pub fn load_env_file_from_args() -> Result<(), ConfigError> {
    let args: Vec<String> = std::env::args().collect();
    let from_args = args
        .iter()
        .position(|a| a == "--config")
        .and_then(|i| args.get(i + 1).cloned())
        .or_else(|| {
            args.iter()
                .find_map(|a| a.strip_prefix("--config=").map(str::to_owned))
        });
    match from_args.or_else(|| std::env::var("STREAMGATE_CONFIG").ok()) {
        Some(path) => load_env_file(Path::new(&path)),
        None => Ok(()),
    }
}

/// Exports the file's keys that the environment does not already set. Call it while the
/// process is single-threaded (before a tokio runtime starts): `set_var` races with any
/// thread reading the environment.
pub fn load_env_file(path: &Path) -> Result<(), ConfigError> {
    let shown = path.display().to_string();
    let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
        path: shown.clone(),
        source,
    })?;
    for (k, v) in parse_env_file(&text, &shown)? {
        if std::env::var_os(&k).is_none() {
            // Single-threaded at this point (before the runtime starts).
            std::env::set_var(k, v);
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_comments_quotes_and_rejects_garbage() {
        let kv = parse_env_file("# c\nSTREAMGATE_A=1\n\nSTREAMGATE_B = \"x y\"\n", "f").unwrap();
        assert_eq!(
            kv,
            vec![
                ("STREAMGATE_A".into(), "1".into()),
                ("STREAMGATE_B".into(), "x y".into())
            ]
        );
        assert!(parse_env_file("nonsense", "f").is_err());
        assert!(parse_env_file("BAD KEY=1", "f").is_err());
    }
}
