//! Threshold checks coalesced: every event starts with a primary-key read of its
//! session's counters, and under load those reads become one `= ANY($1)` query per batch
//! instead of one query per event.
//!
//! No event waits for a batch to fill: while fewer than [`MAX_IN_FLIGHT`] queries are
//! running, a lookup is sent at once (alone, at low load). Only when that many are in
//! flight do new lookups gather, and they go together as soon as one returns.

use std::collections::HashMap;

use futures_util::StreamExt;
use futures_util::stream::FuturesUnordered;
use sqlx::Row;
use tokio::sync::{mpsc, oneshot};

use super::{Counters, PgStore, StoreError, counters_from};

/// Queries in flight before lookups gather. Small: the database shares the machine, and
/// fewer, larger queries cost it less than many small ones.
const MAX_IN_FLIGHT: usize = 4;
/// The most sessions one query asks for.
const MAX_BATCH: usize = 512;

type Answer = Result<Option<Counters>, StoreError>;

struct Lookup {
    session_id: String,
    answer: oneshot::Sender<Answer>,
}

/// A handle to the batching task; cheap to clone. The task ends with the last handle.
#[derive(Clone, Debug)]
pub struct CounterReader {
    lookups: mpsc::UnboundedSender<Lookup>,
}

impl CounterReader {
    /// Starts the batching task on the current runtime.
    pub fn spawn(store: PgStore) -> Self {
        let (lookups, receiver) = mpsc::unbounded_channel();
        tokio::spawn(run(store, receiver));
        Self { lookups }
    }

    /// The session's counters, `None` for a session with no row.
    ///
    /// # Errors
    /// When the database is unreachable (every lookup of the batch gets the error).
    pub async fn counters(&self, session_id: &str) -> Answer {
        let (answer, receiver) = oneshot::channel();
        let lookup = Lookup {
            session_id: session_id.to_owned(),
            answer,
        };
        if self.lookups.send(lookup).is_err() {
            return Err(sqlx::Error::PoolClosed.into());
        }
        receiver
            .await
            .unwrap_or_else(|_| Err(sqlx::Error::PoolClosed.into()))
    }
}

async fn run(store: PgStore, mut lookups: mpsc::UnboundedReceiver<Lookup>) {
    let mut waiting: Vec<Lookup> = Vec::new();
    let mut in_flight = FuturesUnordered::new();
    let mut open = true;
    while open || !waiting.is_empty() || !in_flight.is_empty() {
        tokio::select! {
            received = lookups.recv(), if open => match received {
                Some(lookup) => waiting.push(lookup),
                None => open = false,
            },
            Some(()) = in_flight.next(), if !in_flight.is_empty() => {}
        }
        while let Ok(lookup) = lookups.try_recv() {
            waiting.push(lookup);
        }
        while !waiting.is_empty() && in_flight.len() < MAX_IN_FLIGHT {
            let rest = waiting.split_off(waiting.len().min(MAX_BATCH));
            let batch = std::mem::replace(&mut waiting, rest);
            in_flight.push(answer(store.clone(), batch));
        }
    }
}

/// One query for the whole batch; each lookup gets its session's row.
async fn answer(store: PgStore, batch: Vec<Lookup>) {
    let mut ids: Vec<&str> = batch.iter().map(|l| l.session_id.as_str()).collect();
    ids.sort_unstable();
    ids.dedup();
    let rows = sqlx::query(
        "SELECT session_id, total_chars, message_count, human_turns,
                coalesce(retry_at > now(), false) AS backing_off
         FROM sessions WHERE session_id = ANY($1)",
    )
    .bind(&ids)
    .fetch_all(store.pool())
    .await;
    let found: Result<HashMap<String, Counters>, StoreError> =
        rows.map_err(StoreError::from).and_then(|rows| {
            rows.iter()
                .map(|r| Ok((r.try_get("session_id")?, counters_from(r)?)))
                .collect::<Result<_, sqlx::Error>>()
                .map_err(StoreError::from)
        });
    for lookup in batch {
        let answer = match &found {
            Ok(found) => Ok(found.get(&lookup.session_id).copied()),
            Err(e) => Err(e.clone()),
        };
        // The event may have been abandoned (shutdown); nobody to tell then.
        let _ = lookup.answer.send(answer);
    }
}
