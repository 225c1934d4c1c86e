//! What Rust agents call before a turn, from `summarizer-client`: never fails, always
//! "proceed".

pub use summarizer_client::client::*;
