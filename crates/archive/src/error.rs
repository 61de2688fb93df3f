//! Errors of the archive.

/// Everything that can go wrong talking to a store.
#[derive(Debug, thiserror::Error)]
pub enum ArchiveError {
    /// The store URL or path is unusable.
    #[error("archive configuration: {0}")]
    Config(String),
    /// SQLite reported an error.
    #[error("sqlite: {0}")]
    Sqlite(#[from] rusqlite::Error),
    /// PostgreSQL reported an error.
    #[error("postgres: {0}")]
    Postgres(#[from] tokio_postgres::Error),
    /// No PostgreSQL connection could be taken from the pool.
    #[error("postgres pool: {0}")]
    Pool(#[from] deadpool_postgres::PoolError),
    /// The database holds a schema newer than this build knows.
    #[error("database schema version {found} is newer than this build's {known}")]
    SchemaTooNew {
        /// Highest version recorded in `schema_migrations`.
        found: i64,
        /// Highest version this build can apply.
        known: i64,
    },
    /// A stored row cannot be turned back into an event or record.
    #[error("corrupt archive row {what}: {detail}")]
    Corrupt {
        /// Which row (`run/seq`, `run`, …).
        what: String,
        /// What is wrong with it.
        detail: String,
    },
    /// A value does not fit the database's signed 64-bit integers.
    #[error("{what} {value} is out of range (max {max})", max = i64::MAX)]
    OutOfRange {
        /// Which field.
        what: &'static str,
        /// The offending value.
        value: u64,
    },
    /// A list cursor was not produced by this store.
    #[error("invalid list cursor {0:?}")]
    BadCursor(String),
    /// The database file could not be created or made private to its owner.
    #[error("cannot make {path} private (mode 0600): {source}")]
    Private {
        /// The file.
        path: String,
        /// Why.
        source: std::io::Error,
    },
    /// The SQLite archive's WAL file could not be synced to disk: what was written since
    /// is not known to be durable, so it is never acknowledged; a restart recovers.
    #[error("the archive's WAL could not be synced to disk ({0}); restart to recover")]
    WalSync(String),
    /// A blocking reader task, or the SQLite writer thread while opening, stopped
    /// unexpectedly.
    #[error("sqlite worker stopped: {0}")]
    WorkerGone(String),
    /// The SQLite writer thread (or its WAL syncer) has stopped: after a failed WAL sync,
    /// or a panic. No write on this store can succeed again.
    #[error("the sqlite archive's writer stopped ({0}); restart to recover")]
    WriterStopped(String),
}

impl ArchiveError {
    /// Whether no retry of a write on this store can succeed: its SQLite writer is gone
    /// (it stops after a failed WAL sync), so only a new process can go on. A consumer
    /// that retries on any other error should exit on this one, and leave what it holds
    /// unacknowledged for the next one.
    pub fn is_permanent(&self) -> bool {
        matches!(
            self,
            ArchiveError::WalSync(_) | ArchiveError::WriterStopped(_)
        )
    }
}

#[cfg(test)]
mod tests {
    use super::ArchiveError;

    #[test]
    fn only_a_gone_writer_is_permanent() {
        assert!(ArchiveError::WalSync("EIO".into()).is_permanent());
        assert!(ArchiveError::WriterStopped("writer thread stopped".into()).is_permanent());
        // A reader's task that stopped says nothing of the writer.
        assert!(!ArchiveError::WorkerGone("reader panicked".into()).is_permanent());
        assert!(!ArchiveError::Config("x".into()).is_permanent());
        assert!(!ArchiveError::BadCursor("x".into()).is_permanent());
    }
}
