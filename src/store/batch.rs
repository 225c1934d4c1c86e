//! Threshold checks coalesced: every event starts with a primary-key read of its
//! session's counters (and settings), and under load those reads become one
//! [`Counts::counters_of`](super::Counts::counters_of) query per batch instead of one query
//! per event.
//!
//! No event waits for a batch to fill: when no query is in flight, a lookup is sent at
//! once, alone, from the event's own task (no hop through the batching task at low
//! load). Otherwise it joins the batching task, which runs up to [`MAX_IN_FLIGHT`]
//! queries and sends whatever gathered meanwhile as soon as one returns.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use futures_util::StreamExt;
use futures_util::stream::FuturesUnordered;
use tokio::sync::{mpsc, oneshot};

use super::{Counters, SharedStore, StoreError};

/// Batched queries in flight at once. Small: the database shares the machine, and fewer,
/// larger queries cost it less than many small ones.
const MAX_IN_FLIGHT: usize = 1;
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
    store: SharedStore,
    lookups: mpsc::UnboundedSender<Lookup>,
    /// Queries running now, direct or batched.
    in_flight: Arc<AtomicUsize>,
}

/// Counts a query in flight for as long as it lives.
struct InFlight(Arc<AtomicUsize>);

impl InFlight {
    /// Takes a slot if fewer than `limit` are taken.
    fn try_take(counter: &Arc<AtomicUsize>, limit: usize) -> Option<Self> {
        counter
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < limit).then_some(n + 1)
            })
            .ok()
            .map(|_| Self(counter.clone()))
    }
}

impl InFlight {
    /// Takes a slot whatever the count.
    fn forced(counter: &Arc<AtomicUsize>) -> Self {
        counter.fetch_add(1, Ordering::AcqRel);
        Self(counter.clone())
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

impl CounterReader {
    /// Starts the batching task on the current runtime.
    pub fn spawn(store: SharedStore) -> Self {
        let (lookups, receiver) = mpsc::unbounded_channel();
        let in_flight = Arc::new(AtomicUsize::new(0));
        tokio::spawn(run(store.clone(), receiver, in_flight.clone()));
        Self {
            store,
            lookups,
            in_flight,
        }
    }

    /// The session's counters, `None` for a session with no row.
    ///
    /// # Errors
    /// When the database is unreachable (every lookup of the batch gets the error).
    pub async fn counters(&self, session_id: &str) -> Answer {
        if let Some(_slot) = InFlight::try_take(&self.in_flight, 1) {
            return self.store.counters(session_id).await;
        }
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

async fn run(
    store: SharedStore,
    mut lookups: mpsc::UnboundedReceiver<Lookup>,
    slots: Arc<AtomicUsize>,
) {
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
        // A direct query's completion wakes nothing here, so a batch also goes when the
        // slots are taken but none of them by a batch of ours.
        while !waiting.is_empty() {
            let slot = match InFlight::try_take(&slots, MAX_IN_FLIGHT) {
                Some(slot) => slot,
                None if in_flight.is_empty() => InFlight::forced(&slots),
                None => break,
            };
            let rest = waiting.split_off(waiting.len().min(MAX_BATCH));
            let batch = std::mem::replace(&mut waiting, rest);
            in_flight.push(answer(store.clone(), batch, slot));
        }
    }
}

/// One query for the whole batch; each lookup gets its session's row.
async fn answer(store: SharedStore, batch: Vec<Lookup>, _slot: InFlight) {
    let mut ids: Vec<&str> = batch.iter().map(|l| l.session_id.as_str()).collect();
    ids.sort_unstable();
    ids.dedup();
    let found: Result<HashMap<String, Counters>, StoreError> = store
        .counters_of(&ids)
        .await
        .map(|rows| rows.into_iter().collect());
    for lookup in batch {
        let answer = match &found {
            Ok(found) => Ok(found.get(&lookup.session_id).cloned()),
            Err(e) => Err(e.clone()),
        };
        // The event may have been abandoned (shutdown); nobody to tell then.
        let _ = lookup.answer.send(answer);
    }
}
