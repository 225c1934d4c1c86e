//! `session_settings` on SQLite: read with the counters (through [`settings_from`]) and
//! written for `summarizer session <id> --set`, as `store::settings` does on Postgres.

use sqlx::Row;
use sqlx::sqlite::SqliteRow;

use super::SqliteStore;
use crate::config::Limits;
use crate::overrides::{Change, SessionSettings};
use crate::store::{SettingsError, StoreError};

/// The `settings_*` columns a counters query selects (NULLs without a row). `enabled` is
/// an INTEGER 0/1, which decodes as a bool.
pub(super) fn settings_from(row: &SqliteRow) -> Result<SessionSettings, sqlx::Error> {
    Ok(SessionSettings {
        enabled: row.try_get("settings_enabled")?,
        threshold_chars: row.try_get("settings_threshold_chars")?,
        keep_chars: row.try_get("settings_keep_chars")?,
        model: row.try_get("settings_model")?,
    })
}

/// One session's row, under the column names [`settings_from`] reads.
const SELECT_SETTINGS: &str = "
    SELECT enabled AS settings_enabled,
           threshold_chars AS settings_threshold_chars, keep_chars AS settings_keep_chars,
           model AS settings_model
    FROM session_settings WHERE session_id = ?1";

impl SqliteStore {
    /// The session's settings; all `None` when it has no row.
    ///
    /// # Errors
    /// When the file cannot be read.
    pub async fn session_settings(&self, session_id: &str) -> Result<SessionSettings, StoreError> {
        let row = sqlx::query(SELECT_SETTINGS)
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
    /// result (`configured` stands in for an inherited threshold). Returns the settings
    /// written. The read and the write are one transaction holding the file's write
    /// lock, where Postgres locks the row.
    ///
    /// # Errors
    /// [`SettingsError::Invalid`] when the edit is wrong, [`SettingsError::Store`] when
    /// the file cannot be written; nothing is written in either case.
    pub async fn change_session_settings(
        &self,
        session_id: &str,
        changes: &[Change],
        configured: Limits,
    ) -> Result<SessionSettings, SettingsError> {
        let mut tx = self.begin_write().await?;
        let current = sqlx::query(SELECT_SETTINGS)
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
             VALUES (?1, ?2, ?3, ?4, ?5)
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
