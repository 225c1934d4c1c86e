//! What Rust agents call before a turn, from `summarizer-client`: never fails, always
//! "proceed".

pub use summarizer_client::client::*;
pub use summarizer_client::jobs::{JobPublisher, Published, job_subject};
