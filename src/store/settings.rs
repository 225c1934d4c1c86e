//! A session's own settings ([`SettingsTable`]), which operators and agents write.

use async_trait::async_trait;

use super::StoreError;
use crate::config::Limits;
use crate::overrides::{Change, InvalidSetting, SessionSettings};

#[async_trait]
pub trait SettingsTable: Send + Sync {
    /// The session's own settings; all `None` without a row.
    async fn session_settings(&self, session_id: &str) -> Result<SessionSettings, StoreError>;

    /// Applies `changes` to the session's settings, checked as a whole (`configured`
    /// stands in for what the session inherits), in one transaction; returns what was
    /// written.
    ///
    /// # Errors
    /// [`SettingsError::Invalid`] when the edit is wrong; nothing is written then.
    async fn change_session_settings(
        &self,
        session_id: &str,
        changes: &[Change],
        configured: Limits,
    ) -> Result<SessionSettings, SettingsError>;
}

/// A session's `session_settings` columns under the `settings_*` names both backends
/// select them as (NULLs without a row).
#[derive(sqlx::FromRow)]
pub(super) struct SettingsRow {
    settings_enabled: Option<bool>,
    settings_threshold_chars: Option<i64>,
    settings_keep_chars: Option<i64>,
    settings_model: Option<String>,
    settings_tool_output_clearing: Option<bool>,
    settings_tool_output_keep: Option<i64>,
    settings_threshold_tokens: Option<i64>,
}

impl From<SettingsRow> for SessionSettings {
    fn from(row: SettingsRow) -> Self {
        Self {
            enabled: row.settings_enabled,
            threshold_chars: row.settings_threshold_chars,
            keep_chars: row.settings_keep_chars,
            model: row.settings_model,
            tool_output_clearing: row.settings_tool_output_clearing,
            tool_output_keep: row.settings_tool_output_keep,
            threshold_tokens: row.settings_threshold_tokens,
        }
    }
}

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
