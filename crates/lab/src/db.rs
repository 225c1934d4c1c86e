//! Throwaway databases for `bench` and `chaos`: created beside the configured one,
//! migrated, and dropped at the end.
//!
//! The worker's store is used as the worker uses it (migrations, counters, `check`);
//! the simulated agents get a pool of their own and write with plain SQL, as agents do.

use std::str::FromStr;
use std::time::Duration;

use anyhow::Context;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::{ConnectOptions, Connection, PgPool};
use summarizer::store::PgStore;

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
