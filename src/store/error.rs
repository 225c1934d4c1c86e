//! What a store's methods fail with: [`StoreError`], and whether a failure means the
//! database could not be reached ([`is_unreachable`]).

use std::sync::Arc;

/// The database could not be reached, or a statement failed. Cheap to clone, so one
/// failed batch can be reported to every event in it.
#[derive(Clone, Debug, thiserror::Error)]
#[error(transparent)]
pub struct StoreError(Arc<sqlx::Error>);

impl From<sqlx::Error> for StoreError {
    fn from(e: sqlx::Error) -> Self {
        Self(Arc::new(e))
    }
}

impl StoreError {
    /// The statement ran but a row it returned could not be decoded (text that is not
    /// UTF-8 in a SQLite file written before the write refused it): the database is up,
    /// and the same rows will fail the same way until an operator fixes them.
    pub fn is_undecodable_row(&self) -> bool {
        matches!(
            *self.0,
            sqlx::Error::ColumnDecode { .. } | sqlx::Error::Decode(_)
        )
    }
}

/// Whether `error` means the database could not be reached, or a SQLite file stayed
/// locked (worth waiting for), as opposed to a statement that failed.
pub fn is_unreachable(error: &sqlx::Error) -> bool {
    match error {
        // A connection dropped during the handshake reads as a protocol error.
        sqlx::Error::Io(_) | sqlx::Error::PoolTimedOut | sqlx::Error::Protocol(_) => true,
        // SQLite: the file stayed locked (SQLITE_BUSY, SQLITE_LOCKED and their extended
        // codes) past the busy timeout.
        sqlx::Error::Database(e) if e.try_downcast_ref::<sqlx::sqlite::SqliteError>().is_some() => {
            e.code()
                .and_then(|code| code.parse::<i32>().ok())
                .is_some_and(|code| matches!(code & 0xff, 5 | 6))
        }
        // cannot_connect_now (starting up or shutting down), and connection exceptions.
        sqlx::Error::Database(e) => e
            .code()
            .is_some_and(|code| code == "57P03" || code.starts_with("08")),
        _ => false,
    }
}
