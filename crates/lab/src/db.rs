//! Throwaway databases for `bench` and `chaos`: created beside the configured one (or
//! as a SQLite file in the temporary directory), migrated, and dropped at the end.
//!
//! The worker's store is used as the worker uses it (migrations, counters, `check`);
//! the simulated agents get a pool of their own and write with plain SQL, as agents do.

use std::path::PathBuf;
use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use serde_json::Value;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::{ConnectOptions, Connection, PgPool, SqlitePool};
use summarizer::store::prelude::*;
use summarizer::store::{PgStore, SharedStore, SqliteStore};

pub struct Scratch {
    pub url: String,
    pub store: PgStore,
    /// The agents' own connections.
    pub agents: PgPool,
}

impl Scratch {
    /// Creates and migrates the database `name` on the server `base_url` names.
    ///
    /// # Errors
    /// When the server is unreachable or refuses, or a migration fails.
    pub async fn create(base_url: &str, name: &str, pool_size: u32) -> anyhow::Result<Self> {
        let url = url_with_database(base_url, name)?;
        PgStore::create_database_if_missing(&url).await?;
        let store = PgStore::connect_lazy(&url, pool_size, Duration::from_secs(30))?;
        store.migrate().await.context("migrating")?;
        let agents = PgPoolOptions::new()
            .max_connections(pool_size)
            .connect_lazy_with(PgConnectOptions::from_str(&url)?);
        Ok(Self { url, store, agents })
    }

    /// Closes both pools.
    pub async fn close(&self) {
        self.agents.close().await;
        self.store.close().await;
    }

    /// Closes both pools and drops the database.
    ///
    /// # Errors
    /// When the server is unreachable or refuses.
    pub async fn drop_database(self) -> anyhow::Result<()> {
        self.close().await;
        drop_database(&self.url).await
    }
}

/// `url` naming the database `name` instead (same server, user and options).
///
/// # Errors
/// When `url` is not a Postgres URL naming a database.
pub fn url_with_database(url: &str, name: &str) -> anyhow::Result<String> {
    let mut parsed = url::Url::parse(url).context("DATABASE_URL is not a URL")?;
    if parsed.path().trim_start_matches('/').is_empty() {
        anyhow::bail!("DATABASE_URL must name its database");
    }
    parsed.set_path(&format!("/{name}"));
    Ok(parsed.into())
}

/// Drops the database `url` names, disconnecting its sessions.
///
/// # Errors
/// When the server is unreachable or refuses.
pub async fn drop_database(url: &str) -> anyhow::Result<()> {
    let options = PgConnectOptions::from_str(url)?;
    let name = options.get_database().unwrap_or_default().to_owned();
    let mut admin = options.database("postgres").connect().await?;
    let quoted: String = sqlx::query_scalar("SELECT quote_ident($1)")
        .bind(&name)
        .fetch_one(&mut admin)
        .await?;
    let drop = format!("DROP DATABASE IF EXISTS {quoted} WITH (FORCE)");
    sqlx::raw_sql(sqlx::AssertSqlSafe(drop))
        .execute(&mut admin)
        .await?;
    admin.close().await?;
    Ok(())
}

/// A SQLite file in the temporary directory, removed (with its WAL) on drop.
pub struct ScratchFile(pub PathBuf);

impl ScratchFile {
    pub fn new(name: &str) -> Self {
        Self(std::env::temp_dir().join(format!("{name}.db")))
    }

    pub fn url(&self) -> String {
        format!("sqlite://{}", self.0.display())
    }

    /// A pool for the agents: plain connections with the busy timeout and the recursive
    /// triggers the worker's have, as an agent on the same host should open the file.
    ///
    /// # Errors
    /// When the file cannot be opened.
    pub async fn agents(&self, size: u32) -> anyhow::Result<SqlitePool> {
        Ok(sqlx::sqlite::SqlitePoolOptions::new()
            .max_connections(size)
            .connect_with(summarizer::store::sqlite::connect_options(&self.url())?)
            .await?)
    }
}

impl Drop for ScratchFile {
    fn drop(&mut self) {
        summarizer::store::sqlite::remove_files(&self.0);
    }
}

/// The agents' own connections, to either store. Each method is one plain statement, as
/// an agent writes it.
#[derive(Clone, Debug)]
pub enum AgentDb {
    Postgres(PgPool),
    Sqlite(SqlitePool),
}

impl AgentDb {
    /// Appends one message (in SQLite, `tool_calls` is JSON text).
    ///
    /// # Errors
    /// When the statement fails.
    pub async fn append(
        &self,
        session: &str,
        role: &str,
        content: &str,
        tool_calls: Option<&Value>,
        tool_call_id: Option<&str>,
    ) -> sqlx::Result<()> {
        const INSERT: &str =
            "INSERT INTO messages (session_id, role, content, tool_calls, tool_call_id)
             VALUES ($1, $2, $3, $4, $5)";
        match self {
            Self::Postgres(pool) => {
                sqlx::query(INSERT)
                    .bind(session)
                    .bind(role)
                    .bind(content)
                    .bind(tool_calls)
                    .bind(tool_call_id)
                    .execute(pool)
                    .await?;
            }
            Self::Sqlite(pool) => {
                sqlx::query(INSERT)
                    .bind(session)
                    .bind(role)
                    .bind(content)
                    .bind(tool_calls.map(Value::to_string))
                    .bind(tool_call_id)
                    .execute(pool)
                    .await?;
            }
        }
        Ok(())
    }

    /// The content of every message of the session that is not a summary, in the history
    /// or the archive, in seq order.
    ///
    /// # Errors
    /// When the statement fails.
    pub async fn everything(&self, session: &str) -> sqlx::Result<Vec<String>> {
        const EVERYTHING: &str = "SELECT coalesce(content, '') FROM (
                 SELECT seq, content FROM messages WHERE session_id = $1 AND NOT is_summary
                 UNION ALL
                 SELECT seq, content FROM archived_messages WHERE session_id = $1 AND NOT is_summary
             ) AS everything ORDER BY seq";
        match self {
            Self::Postgres(pool) => {
                sqlx::query_scalar(EVERYTHING)
                    .bind(session)
                    .fetch_all(pool)
                    .await
            }
            Self::Sqlite(pool) => {
                sqlx::query_scalar(EVERYTHING)
                    .bind(session)
                    .fetch_all(pool)
                    .await
            }
        }
    }

    /// How many dead letters there are, and how many (session, request id) pairs have
    /// more than one compaction.
    ///
    /// # Errors
    /// When a statement fails.
    pub async fn dead_letters_and_twice_compacted(&self) -> sqlx::Result<(i64, i64)> {
        const DEAD: &str = "SELECT count(*) FROM dead_letters";
        Ok(match self {
            Self::Postgres(pool) => (
                sqlx::query_scalar(DEAD).fetch_one(pool).await?,
                sqlx::query_scalar(
                    "SELECT count(*) FROM (
                         SELECT 1 FROM usage_events
                         WHERE metadata @> '{\"summarization\": true}'
                         GROUP BY session_id, metadata ->> 'request_id' HAVING count(*) > 1
                     ) AS twice",
                )
                .fetch_one(pool)
                .await?,
            ),
            Self::Sqlite(pool) => (
                sqlx::query_scalar(DEAD).fetch_one(pool).await?,
                sqlx::query_scalar(
                    "SELECT count(*) FROM (
                         SELECT 1 FROM usage_events
                         WHERE json_type(metadata, '$.summarization') = 'true'
                         GROUP BY session_id, metadata ->> 'request_id' HAVING count(*) > 1
                     ) AS twice",
                )
                .fetch_one(pool)
                .await?,
            ),
        })
    }

    pub async fn close(&self) {
        match self {
            Self::Postgres(pool) => pool.close().await,
            Self::Sqlite(pool) => pool.close().await,
        }
    }
}

/// A throwaway database of either store, for `chaos`.
pub enum AnyScratch {
    Postgres(Scratch),
    Sqlite {
        file: ScratchFile,
        store: SqliteStore,
        agents: SqlitePool,
    },
}

impl AnyScratch {
    /// A Postgres database beside `base_url`'s, or with `sqlite`, a SQLite file; either
    /// named `name` and migrated.
    ///
    /// # Errors
    /// When the database cannot be created or migrated.
    pub async fn create(
        base_url: &str,
        name: &str,
        pool_size: u32,
        sqlite: bool,
    ) -> anyhow::Result<Self> {
        if !sqlite {
            return Ok(Self::Postgres(
                Scratch::create(base_url, name, pool_size).await?,
            ));
        }
        let file = ScratchFile::new(name);
        let store = SqliteStore::connect_lazy(&file.url(), pool_size, Duration::from_secs(30))?;
        store.migrate().await.context("migrating")?;
        let agents = file.agents(pool_size).await?;
        Ok(Self::Sqlite {
            file,
            store,
            agents,
        })
    }

    pub fn url(&self) -> String {
        match self {
            Self::Postgres(db) => db.url.clone(),
            Self::Sqlite { file, .. } => file.url(),
        }
    }

    pub fn store(&self) -> SharedStore {
        match self {
            Self::Postgres(db) => Arc::new(db.store.clone()),
            Self::Sqlite { store, .. } => Arc::new(store.clone()),
        }
    }

    pub fn agents(&self) -> AgentDb {
        match self {
            Self::Postgres(db) => AgentDb::Postgres(db.agents.clone()),
            Self::Sqlite { agents, .. } => AgentDb::Sqlite(agents.clone()),
        }
    }

    /// Closes the pools, then drops the database unless `keep`; returns where it is
    /// when kept.
    ///
    /// # Errors
    /// When the Postgres server refuses the drop.
    pub async fn finish(self, keep: bool) -> anyhow::Result<Option<String>> {
        let url = summarizer::config::redact_url(&self.url());
        match self {
            Self::Postgres(db) if keep => db.close().await,
            Self::Postgres(db) => db.drop_database().await?,
            Self::Sqlite {
                file,
                store,
                agents,
            } => {
                agents.close().await;
                store.close().await;
                if keep {
                    // Not removed: the file outlives the run.
                    std::mem::forget(file);
                }
            }
        }
        Ok(keep.then_some(url))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_url_names_another_database_with_its_options_kept() {
        assert_eq!(
            url_with_database("postgres://u:p@127.0.0.1:5432/app?sslmode=disable", "x").unwrap(),
            "postgres://u:p@127.0.0.1:5432/x?sslmode=disable"
        );
        assert_eq!(
            url_with_database("postgres://[::1]/app", "x").unwrap(),
            "postgres://[::1]/x"
        );
        assert!(url_with_database("postgres://127.0.0.1", "x").is_err());
    }
}
