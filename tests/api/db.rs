//! [`TestDb`]: a test's own connection to its database, Postgres or SQLite (whichever
//! `SUMMARIZER_TEST_STORE` selects, see [`crate::helpers::backend`]), for what agents and
//! operators do with plain SQL behind the worker's back.
//!
//! Most statements are written once, in SQL both databases run: `$1`-style placeholders
//! (sqlx-sqlite binds `$N` to the N-th argument), no `::` casts, `CAST(x AS BIGINT)`,
//! recursive CTEs rather than `generate_series`. Where the SQL cannot be the same (the
//! lease's and backoff's instants, which SQLite keeps as unix milliseconds; JSON
//! functions; Postgres-only DDL), a method here is named for what the test does and
//! branches inside.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde_json::Value;
use sqlx::postgres::{PgArguments, PgRow};
use sqlx::sqlite::{SqliteArguments, SqliteRow};
use sqlx::{Arguments, FromRow, PgPool, SqlSafeStr, SqlStr, SqlitePool};
use summarizer::store::{Backend, SqliteStore};

/// The test's connection pool to its database.
#[derive(Clone, Debug)]
pub enum TestDb {
    Postgres(PgPool),
    Sqlite(SqlitePool),
}

/// A value bound to a statement, encoded as each database stores it: JSON is `jsonb` in
/// Postgres and JSON text in SQLite, a boolean `boolean` or the integer 0/1.
#[derive(Clone, Debug)]
pub enum Arg {
    Int(i64),
    Text(Option<String>),
    Json(Option<Value>),
    Bool(bool),
}

impl From<i64> for Arg {
    fn from(v: i64) -> Self {
        Self::Int(v)
    }
}

impl From<i32> for Arg {
    fn from(v: i32) -> Self {
        Self::Int(v.into())
    }
}

impl From<bool> for Arg {
    fn from(v: bool) -> Self {
        Self::Bool(v)
    }
}

impl From<&str> for Arg {
    fn from(v: &str) -> Self {
        Self::Text(Some(v.to_owned()))
    }
}

impl From<&String> for Arg {
    fn from(v: &String) -> Self {
        Self::Text(Some(v.clone()))
    }
}

impl From<String> for Arg {
    fn from(v: String) -> Self {
        Self::Text(Some(v))
    }
}

impl From<Option<&str>> for Arg {
    fn from(v: Option<&str>) -> Self {
        Self::Text(v.map(str::to_owned))
    }
}

impl From<Value> for Arg {
    fn from(v: Value) -> Self {
        Self::Json(Some(v))
    }
}

impl From<Option<Value>> for Arg {
    fn from(v: Option<Value>) -> Self {
        Self::Json(v)
    }
}

/// What a row can be read as on either database (tuples of types both decode).
pub trait EitherRow:
    for<'r> FromRow<'r, PgRow> + for<'r> FromRow<'r, SqliteRow> + Send + Unpin
{
}

impl<T> EitherRow for T where
    T: for<'r> FromRow<'r, PgRow> + for<'r> FromRow<'r, SqliteRow> + Send + Unpin
{
}

/// A statement and its arguments, run on whichever database the test has.
#[must_use]
pub struct Query<'a> {
    db: &'a TestDb,
    sql: SqlStr,
    args: Vec<Arg>,
}

impl Query<'_> {
    pub fn bind(mut self, value: impl Into<Arg>) -> Self {
        self.args.push(value.into());
        self
    }

    fn pg_args(&self) -> PgArguments {
        let mut args = PgArguments::default();
        for arg in &self.args {
            match arg.clone() {
                Arg::Int(v) => args.add(v),
                Arg::Text(v) => args.add(v),
                Arg::Json(v) => args.add(v),
                Arg::Bool(v) => args.add(v),
            }
            .expect("a bindable argument");
        }
        args
    }

    fn sqlite_args(&self) -> SqliteArguments {
        let mut args = SqliteArguments::default();
        for arg in &self.args {
            match arg.clone() {
                Arg::Int(v) => args.add(v),
                Arg::Text(v) => args.add(v),
                // JSON text, as agents write it to SQLite.
                Arg::Json(v) => args.add(v.map(|v| v.to_string())),
                Arg::Bool(v) => args.add(v),
            }
            .expect("a bindable argument");
        }
        args
    }

    /// Runs the statement; the number of rows it affected.
    pub async fn execute(self) -> Result<u64, sqlx::Error> {
        Ok(match self.db {
            TestDb::Postgres(pool) => sqlx::query_with(self.sql.clone(), self.pg_args())
                .execute(pool)
                .await?
                .rows_affected(),
            TestDb::Sqlite(pool) => sqlx::query_with(self.sql.clone(), self.sqlite_args())
                .execute(pool)
                .await?
                .rows_affected(),
        })
    }

    pub async fn fetch_all<T: EitherRow>(self) -> Result<Vec<T>, sqlx::Error> {
        match self.db {
            TestDb::Postgres(pool) => {
                sqlx::query_as_with(self.sql.clone(), self.pg_args())
                    .fetch_all(pool)
                    .await
            }
            TestDb::Sqlite(pool) => {
                sqlx::query_as_with(self.sql.clone(), self.sqlite_args())
                    .fetch_all(pool)
                    .await
            }
        }
    }

    pub async fn fetch_optional<T: EitherRow>(self) -> Result<Option<T>, sqlx::Error> {
        match self.db {
            TestDb::Postgres(pool) => {
                sqlx::query_as_with(self.sql.clone(), self.pg_args())
                    .fetch_optional(pool)
                    .await
            }
            TestDb::Sqlite(pool) => {
                sqlx::query_as_with(self.sql.clone(), self.sqlite_args())
                    .fetch_optional(pool)
                    .await
            }
        }
    }

    pub async fn fetch_one<T: EitherRow>(self) -> Result<T, sqlx::Error> {
        self.fetch_optional().await?.ok_or(sqlx::Error::RowNotFound)
    }

    /// The first column of the one row.
    pub async fn scalar<T>(self) -> Result<T, sqlx::Error>
    where
        (T,): EitherRow,
    {
        Ok(self.fetch_one::<(T,)>().await?.0)
    }

    /// The first column of the row, if there is one.
    pub async fn scalar_optional<T>(self) -> Result<Option<T>, sqlx::Error>
    where
        (T,): EitherRow,
    {
        Ok(self.fetch_optional::<(T,)>().await?.map(|(v,)| v))
    }
}

/// Now, in the unit of SQLite's lease and backoff columns (unix milliseconds).
fn now_ms() -> i64 {
    let since = SystemTime::now().duration_since(UNIX_EPOCH).unwrap();
    i64::try_from(since.as_millis()).unwrap()
}

fn millis(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap()
}

impl TestDb {
    /// A pool over the database `url` names. SQLite's is configured as the store's own
    /// (WAL, and a busy timeout, so the test's writes wait for a worker's lock).
    pub async fn connect(url: &str) -> Self {
        match Backend::of(url) {
            Backend::Postgres => Self::Postgres(PgPool::connect(url).await.expect("Postgres")),
            Backend::Sqlite => {
                let store = SqliteStore::connect_lazy(url, 8, Duration::from_secs(30))
                    .expect("a SQLite URL");
                Self::Sqlite(store.pool().clone())
            }
        }
    }

    pub fn backend(&self) -> Backend {
        match self {
            Self::Postgres(_) => Backend::Postgres,
            Self::Sqlite(_) => Backend::Sqlite,
        }
    }

    /// A statement in SQL both databases run.
    pub fn query(&self, sql: impl SqlSafeStr) -> Query<'_> {
        Query {
            db: self,
            sql: sql.into_sql_str(),
            args: Vec::new(),
        }
    }

    /// The statement of this backend, for what each writes its own way.
    pub fn per_backend(&self, postgres: &'static str, sqlite: &'static str) -> &'static str {
        match self {
            Self::Postgres(_) => postgres,
            Self::Sqlite(_) => sqlite,
        }
    }

    /// Runs several statements, without arguments.
    pub async fn raw(&self, sql: impl SqlSafeStr) -> Result<(), sqlx::Error> {
        match self {
            Self::Postgres(pool) => sqlx::raw_sql(sql).execute(pool).await.map(drop),
            Self::Sqlite(pool) => sqlx::raw_sql(sql).execute(pool).await.map(drop),
        }
    }

    /// Whether the session's lease has run out (its expiry has passed).
    pub async fn lease_expired(&self, session: &str) -> bool {
        let query = match self {
            Self::Postgres(_) => self
                .query("SELECT lease_expires_at < now() FROM sessions WHERE session_id = $1")
                .bind(session),
            Self::Sqlite(_) => self
                .query("SELECT lease_expires_at < $2 FROM sessions WHERE session_id = $1")
                .bind(session)
                .bind(now_ms()),
        };
        query.scalar::<bool>().await.unwrap()
    }

    /// Another owner takes the session's lease for `duration`.
    pub async fn hold_lease(&self, session: &str, owner: &str, duration: Duration) {
        let query = match self {
            Self::Postgres(_) => self
                .query(
                    "UPDATE sessions SET lease_owner = $2,
                         lease_expires_at = now() + $3 * interval '1 millisecond'
                     WHERE session_id = $1",
                )
                .bind(session)
                .bind(owner)
                .bind(millis(duration)),
            Self::Sqlite(_) => self
                .query(
                    "UPDATE sessions SET lease_owner = $2, lease_expires_at = $3
                     WHERE session_id = $1",
                )
                .bind(session)
                .bind(owner)
                .bind(now_ms() + millis(duration)),
        };
        assert_eq!(query.execute().await.unwrap(), 1, "{session} has a row");
    }

    /// The session's backoff runs out now.
    pub async fn end_backoff(&self, session: &str) {
        let query = match self {
            Self::Postgres(_) => self
                .query("UPDATE sessions SET retry_at = now() WHERE session_id = $1")
                .bind(session),
            Self::Sqlite(_) => self
                .query("UPDATE sessions SET retry_at = $2 WHERE session_id = $1")
                .bind(session)
                .bind(now_ms()),
        };
        assert_eq!(query.execute().await.unwrap(), 1, "{session} has a row");
    }

    /// The session's failure count and the seconds its backoff has left.
    pub async fn backoff(&self, session: &str) -> (i32, f64) {
        let query = match self {
            Self::Postgres(_) => self
                .query(
                    "SELECT failures, extract(epoch FROM retry_at - now())::float8
                     FROM sessions WHERE session_id = $1",
                )
                .bind(session),
            Self::Sqlite(_) => self
                .query(
                    "SELECT failures, (retry_at - $2) / 1000.0
                     FROM sessions WHERE session_id = $1",
                )
                .bind(session)
                .bind(now_ms()),
        };
        query.fetch_one().await.unwrap()
    }

    /// Runs `statements` as they were written to a database from before the
    /// `tool_calls_is_array` constraint, which may hold `tool_calls` of any JSON shape.
    /// Postgres: the constraint is dropped meanwhile and added back `NOT VALID`, as the
    /// migration adds it over such rows. SQLite, whose schema always had it: the
    /// statements run with its CHECK constraints ignored (`PRAGMA
    /// ignore_check_constraints`), the only way such a row gets into the file.
    pub async fn write_as_before_the_shape_constraint(&self, statements: &[&str]) {
        match self {
            Self::Postgres(pool) => {
                let mut conn = pool.acquire().await.unwrap();
                sqlx::raw_sql("ALTER TABLE messages DROP CONSTRAINT tool_calls_is_array")
                    .execute(&mut *conn)
                    .await
                    .unwrap();
                for sql in statements {
                    sqlx::raw_sql(sqlx::AssertSqlSafe(*sql))
                        .execute(&mut *conn)
                        .await
                        .unwrap();
                }
                sqlx::raw_sql(
                    "ALTER TABLE messages ADD CONSTRAINT tool_calls_is_array
                         CHECK (tool_calls IS NULL OR jsonb_typeof(tool_calls) IN ('array', 'null'))
                         NOT VALID",
                )
                .execute(&mut *conn)
                .await
                .unwrap();
            }
            Self::Sqlite(pool) => {
                let mut conn = pool.acquire().await.unwrap();
                sqlx::raw_sql("PRAGMA ignore_check_constraints = ON")
                    .execute(&mut *conn)
                    .await
                    .unwrap();
                for sql in statements {
                    sqlx::raw_sql(sqlx::AssertSqlSafe(*sql))
                        .execute(&mut *conn)
                        .await
                        .unwrap();
                }
                sqlx::raw_sql("PRAGMA ignore_check_constraints = OFF")
                    .execute(&mut *conn)
                    .await
                    .unwrap();
            }
        }
    }
}
