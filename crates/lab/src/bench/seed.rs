//! The bench's sessions, written in a few set-based statements (explicit seqs keep each
//! session's order whatever order the rows are inserted in).

use sqlx::PgPool;

pub struct Seeded {
    /// 1,000 sessions of 10 messages, below the threshold.
    pub small: Vec<String>,
    /// One session of 10 messages and one of 10,000, both below the threshold.
    pub ten: String,
    pub huge: String,
    /// Sessions of 20 messages (80,000 chars), over the threshold.
    pub over: Vec<String>,
    /// Sessions of 1,000 messages (100,000 chars), over the threshold.
    pub thousand: Vec<String>,
    /// Sessions of 500 messages of prose (2 MB), over the threshold.
    pub two_mb: Vec<String>,
    /// Sessions of 50 investigation steps (a human ask, a call, a 2,000-char tool
    /// result, an answer; 120,000 chars), over the threshold: two sets alike, one for
    /// clearing, one for a summary.
    pub tool_heavy: (Vec<String>, Vec<String>),
}

/// `sessions` sessions named `<prefix><n>` of `messages` messages of `chars` chars, a
/// human turn every fourth message.
async fn insert(
    pool: &PgPool,
    prefix: &str,
    sessions: usize,
    messages: usize,
    chars: usize,
) -> anyhow::Result<Vec<String>> {
    sqlx::query(
        "INSERT INTO messages (session_id, seq, role, content)
         SELECT $1 || s, m, CASE WHEN m % 4 = 0 THEN 'user' ELSE 'assistant' END, repeat('x', $4)
         FROM generate_series(1, $2) AS s, generate_series(0, $3 - 1) AS m",
    )
    .bind(prefix)
    .bind(i32::try_from(sessions)?)
    .bind(i32::try_from(messages)?)
    .bind(i32::try_from(chars)?)
    .execute(pool)
    .await?;
    Ok((1..=sessions).map(|n| format!("{prefix}{n}")).collect())
}

/// `sessions` sessions named `<prefix><n>` of 500 messages of about 4,000 chars of prose
/// each (a realistic text for the tokenizer, unlike a run of one letter), a human turn
/// every fourth message.
async fn insert_prose(pool: &PgPool, prefix: &str, sessions: usize) -> anyhow::Result<Vec<String>> {
    sqlx::query(
        "INSERT INTO messages (session_id, seq, role, content)
         SELECT $1 || s, m, CASE WHEN m % 4 = 0 THEN 'user' ELSE 'assistant' END,
                'Finding ' || m || ': ' || repeat('the connection pool on orders-db stayed '
                    || 'saturated at 14:01 while retries piled up (502 on checkout-api) ', 42)
         FROM generate_series(1, $2) AS s, generate_series(0, 499) AS m",
    )
    .bind(prefix)
    .bind(i32::try_from(sessions)?)
    .execute(pool)
    .await?;
    Ok((1..=sessions).map(|n| format!("{prefix}{n}")).collect())
}

/// `sessions` sessions named `<prefix><n>` of 50 tool steps: a human ask, a call, its
/// 2,000-char result and an answer, each.
async fn insert_tool_steps(
    pool: &PgPool,
    prefix: &str,
    sessions: usize,
) -> anyhow::Result<Vec<String>> {
    sqlx::query(
        "INSERT INTO messages (session_id, seq, role, content, tool_calls, tool_call_id)
         SELECT $1 || s, m,
                CASE m % 4 WHEN 0 THEN 'user' WHEN 2 THEN 'tool' ELSE 'assistant' END,
                CASE m % 4 WHEN 0 THEN 'Why is checkout-api slow at step ' || m || '?'
                           WHEN 1 THEN ''
                           WHEN 2 THEN repeat('14:01:07 ERROR checkout-api pool exhausted ', 46)
                           ELSE 'Read it: the pool on orders-db is full at step ' || m || '.' END,
                CASE WHEN m % 4 = 1 THEN jsonb_build_array(jsonb_build_object(
                    'id', 'call-' || m, 'name', 'get_logs', 'arguments', '{}'::jsonb)) END,
                CASE WHEN m % 4 = 2 THEN 'call-' || (m - 1) END
         FROM generate_series(1, $2) AS s, generate_series(0, 199) AS m",
    )
    .bind(prefix)
    .bind(i32::try_from(sessions)?)
    .execute(pool)
    .await?;
    Ok((1..=sessions).map(|n| format!("{prefix}{n}")).collect())
}

pub async fn sessions(
    pool: &PgPool,
    over: usize,
    thousand: usize,
    two_mb: usize,
) -> anyhow::Result<Seeded> {
    let small = insert(pool, "bench-small-", 1_000, 10, 200).await?;
    let ten = insert(pool, "bench-ten-", 1, 10, 200).await?.remove(0);
    let huge = insert(pool, "bench-huge-", 1, 10_000, 5).await?.remove(0);
    let over = insert(pool, "bench-over-", over, 20, 4_000).await?;
    let tool_sessions = thousand;
    let thousand = insert(pool, "bench-thousand-", thousand, 1_000, 100).await?;
    let two_mb = insert_prose(pool, "bench-2mb-", two_mb).await?;
    let tool_heavy = (
        insert_tool_steps(pool, "bench-tools-cleared-", tool_sessions).await?,
        insert_tool_steps(pool, "bench-tools-summarized-", tool_sessions).await?,
    );
    sqlx::query("ANALYZE").execute(pool).await?;
    Ok(Seeded {
        small,
        ten,
        huge,
        over,
        thousand,
        two_mb,
        tool_heavy,
    })
}
