//! `session_settings`: a session's own enabled flag, limits and model. The worker reads
//! them with the counters (`counters.rs`); this file writes them for
//! `summarizer session <id> --set`.

use super::PgStore;
use crate::config::Limits;
use crate::overrides::{Change, SessionSettings};
use crate::store::SettingsTable;
use crate::store::settings::SettingsRow;
use crate::store::sql::UPSERT_SETTINGS;
use crate::store::{SettingsError, StoreError};
use async_trait::async_trait;

#[async_trait]
impl SettingsTable for PgStore {
    /// The session's settings; all `None` when it has no row.
    ///
    /// # Errors
    /// When the database is unreachable.
    async fn session_settings(&self, session_id: &str) -> Result<SessionSettings, StoreError> {
        let row: Option<SettingsRow> = sqlx::query_as(select_settings_sql!())
            .bind(session_id)
            .fetch_optional(&self.pool)
            .await?;
        Ok(row.map(Into::into).unwrap_or_default())
    }

    /// Applies `changes` to the session's settings, checked as a whole against the
    /// result (`configured` stands in for an inherited threshold), in one transaction
    /// that locks the row meanwhile. Returns the settings written. The session need not
    /// have a message yet.
    ///
    /// # Errors
    /// [`SettingsError::Invalid`] when the edit is wrong, [`SettingsError::Store`] when
    /// the database fails; nothing is written in either case.
    async fn change_session_settings(
        &self,
        session_id: &str,
        changes: &[Change],
        configured: Limits,
    ) -> Result<SessionSettings, SettingsError> {
        let mut tx = self.pool.begin().await?;
        let current: Option<SettingsRow> =
            sqlx::query_as(concat!(select_settings_sql!(), " FOR UPDATE"))
                .bind(session_id)
                .fetch_optional(&mut *tx)
                .await?;
        let current = current.map(SessionSettings::from).unwrap_or_default();
        let next = current.changed(changes, configured)?;
        sqlx::query(UPSERT_SETTINGS)
            .bind(session_id)
            .bind(next.enabled)
            .bind(next.threshold_chars)
            .bind(next.keep_chars)
            .bind(&next.model)
            .bind(next.tool_output_clearing)
            .bind(next.tool_output_keep)
            .bind(next.threshold_tokens)
            .execute(&mut *tx)
            .await?;
        tx.commit().await?;
        Ok(next)
    }
}
