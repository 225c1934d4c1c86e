//! The wire contract (docs/protocol.md), from `summarizer-client`: the worker decodes
//! and answers with the very types agents use.

pub use summarizer_client::protocol::*;
