//! `session_settings`: a session's own enabled flag, limits and model. The worker reads
//! them with the counters (see `counters_columns_sql`); this module writes them for
//! `summarizer session <id> --set`.

use sqlx::Row;
use sqlx::postgres::PgRow;

use super::{PgStore, StoreError};
use crate::config::Limits;
use crate::overrides::{Change, InvalidSetting, SessionSettings};

/// Why an edit of a session's settings wrote nothing.
#[derive(Debug, thiserror::Error)]
pub enum SettingsError {
    /// The edit is wrong (an unknown key, a bad value, keep not below the threshold).
    #[error("{0}")]
    Invalid(#[from] InvalidSetting),
    #[error(transparent)]
    Store(#[from] StoreError),
}

impl From<sqlx::Error> for SettingsError {
    fn from(e: sqlx::Error) -> Self {
        Self::Store(e.into())
    }
}

/// The `settings_*` columns a counters query selects (NULLs without a row).
pub(super) fn settings_from(row: &PgRow) -> Result<SessionSettings, sqlx::Error> {
    Ok(SessionSettings {
        enabled: row.try_get("settings_enabled")?,
        threshold_chars: row.try_get("settings_threshold_chars")?,
        keep_chars: row.try_get("settings_keep_chars")?,
        model: row.try_get("settings_model")?,
    })
}

/// One session's row, under the column names [`settings_from`] reads.
macro_rules! select_settings_sql {
    () => {
        "SELECT enabled AS settings_enabled,
                threshold_chars AS settings_threshold_chars, keep_chars AS settings_keep_chars,
                model AS settings_model
         FROM session_settings WHERE session_id = $1"
    };
}

impl PgStore {
    /// The session's settings; all `None` when it has no row.
    ///
    /// # Errors
    /// When the database is unreachable.
    pub async fn session_settings(&self, session_id: &str) -> Result<SessionSettings, StoreError> {
        let row = sqlx::query(select_settings_sql!())
            .bind(session_id)
            .fetch_optional(self.pool())
            .await?;
        Ok(row
            .as_ref()
            .map(settings_from)
            .transpose()?
            .unwrap_or_default())
    }

    /// Applies `changes` to the session's settings, checked as a whole against the
    /// result (`configured` stands in for an inherited threshold), in one transaction
    /// that locks the row meanwhile. Returns the settings written. The session need not
    /// have a message yet.
    ///
    /// # Errors
    /// [`SettingsError::Invalid`] when the edit is wrong, [`SettingsError::Store`] when
    /// the database fails; nothing is written in either case.
    pub async fn change_session_settings(
        &self,
        session_id: &str,
        changes: &[Change],
        configured: Limits,
    ) -> Result<SessionSettings, SettingsError> {
        let mut tx = self.pool().begin().await?;
        let current = sqlx::query(concat!(select_settings_sql!(), " FOR UPDATE"))
            .bind(session_id)
            .fetch_optional(&mut *tx)
            .await?
            .as_ref()
            .map(settings_from)
            .transpose()?
            .unwrap_or_default();
        let next = current.changed(changes, configured)?;
        sqlx::query(
            "INSERT INTO session_settings (session_id, enabled, threshold_chars, keep_chars, model)
             VALUES ($1, $2, $3, $4, $5)
             ON CONFLICT (session_id) DO UPDATE SET
                 enabled = excluded.enabled, threshold_chars = excluded.threshold_chars,
                 keep_chars = excluded.keep_chars, model = excluded.model",
        )
        .bind(session_id)
        .bind(next.enabled)
        .bind(next.threshold_chars)
        .bind(next.keep_chars)
        .bind(&next.model)
        .execute(&mut *tx)
        .await?;
        tx.commit().await?;
        Ok(next)
    }
}
