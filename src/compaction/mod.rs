//! The pure steps of one compaction, with no I/O: each is a function of plain data,
//! tested without a database, and the worker sequences them around the store and the
//! summarizer.
//!
//! - [`split`]: which oldest messages a summary replaces, and which stay in place
//!   (docs/compaction.md, "When and what is compacted").
//! - [`clearing`]: which old tool results are cleared first, and their placeholders
//!   (docs/compaction.md, "Clearing old tool output").
//! - [`tokens`]: token counts, as the model counts them, for the plan's figures and the
//!   LLM's budgets.
//! - [`plan`]: the two above applied to a loaded history: what goes, what stays, what
//!   the summarizer is asked ([`Plan`]).
//! - [`record`]: what the commit writes ([`Record`]), and the usage event's metadata,
//!   defined here alone.

pub mod clearing;
mod plan;
pub mod record;
pub mod split;
pub mod tokens;

pub use plan::{ClearedRow, CountedAt, Loaded, Plan, plan, removed_tokens};
pub use record::{Record, Turn, Written};
