//! The agent's own archive ([`Recall`]): a search or a fetch of what compaction removed.

use async_trait::async_trait;
use summarizer_client::Recalled;

use super::StoreError;

#[async_trait]
pub trait Recall: Send + Sync {
    /// The archived messages of `session_id` that `query` asks for, each cut at
    /// `max_chars` chars: a search's best first, a fetch's in seq order. Never another
    /// session's rows.
    async fn recall(
        &self,
        session_id: &str,
        query: &RecallQuery,
        max_chars: usize,
    ) -> Result<Vec<Recalled>, StoreError>;
}

/// What a recall asks of a session's archive (`crate::recall` makes it from a request).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RecallQuery {
    /// The archived messages holding any of `terms` (case-insensitive substrings, each of
    /// 3 chars or more), at most `limit`, best first.
    Search { terms: Vec<String>, limit: usize },
    /// The archived messages of these seqs, in seq order.
    Seqs(Vec<i64>),
}

/// A recalled row as both backends select it.
#[derive(sqlx::FromRow)]
pub(super) struct RecalledRow {
    pub(super) seq: i64,
    role: String,
    tool_call_id: Option<String>,
    content: Option<String>,
    truncated: bool,
    compaction_id: i64,
    archived_at: String,
    tool_name: Option<String>,
}

impl From<RecalledRow> for Recalled {
    fn from(row: RecalledRow) -> Self {
        Self {
            seq: row.seq,
            role: row.role,
            tool_name: row.tool_name,
            tool_call_id: row.tool_call_id,
            content: row.content.unwrap_or_default(),
            truncated: row.truncated,
            compaction_id: row.compaction_id,
            archived_at: row.archived_at,
        }
    }
}
