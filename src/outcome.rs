//! What happened to one turn-starting event: the vocabulary shared by replies, logs and
//! tests. It is part of the wire contract, so it lives in `summarizer-client`; the worker
//! uses it from there.

pub use summarizer_client::outcome::*;
