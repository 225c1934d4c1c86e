//! Token counts, as the model will count them: OpenAI's `o200k_base` BPE (the GPT-4o and
//! later vocabulary), bundled in `bpe-openai`, so counting needs no network.
//!
//! `bpe-openai` (GitHub's linear-time BPE) counts exactly as tiktoken does, and some
//! times faster on the texts a compaction removes (docs/benchmarks.md, "Figures behind
//! the code"): a compaction counts what it removes, so that difference was most of the
//! worker's own cost per compaction.
//!
//! The vocabulary is loaded once per process, when the first compaction needs it
//! ([`ensure_loaded`], on the blocking pool), not at start: its tables take tens of MB
//! of resident memory, which a worker that never compacts (or the no-op path) has no use
//! for. Counting is CPU-bound and linear in the text: callers run it on the
//! blocking pool for large inputs.

use std::sync::atomic::{AtomicBool, Ordering};

static LOADED: AtomicBool = AtomicBool::new(false);

/// Loads the vocabulary now (blocking).
pub fn load() {
    let _ = bpe_openai::o200k_base();
    LOADED.store(true, Ordering::Release);
}

/// Loads the vocabulary on the blocking pool unless it is loaded, so that no async
/// thread waits for it.
pub async fn ensure_loaded() {
    if !LOADED.load(Ordering::Acquire) {
        // A panic while loading would be a broken build of the vocabulary; counting
        // then panics too, and the compaction's task turns that into `failed`.
        let _ = tokio::task::spawn_blocking(load).await;
    }
}

/// The number of tokens `text` encodes to (text that spells a special token is read as
/// plain text, as the provider reads a transcript).
pub fn count(text: &str) -> usize {
    bpe_openai::o200k_base().count(text)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_as_o200k_base_does() {
        assert_eq!(count(""), 0);
        // "hello world" is two tokens in every OpenAI vocabulary.
        assert_eq!(count("hello world"), 2);
        let text = "14:01:07 ERROR checkout-api pool exhausted (100/100) on orders-db";
        let n = count(text);
        assert!(n > 5 && n < text.len(), "{n}");
    }

    #[test]
    fn special_token_text_is_counted_as_plain_text() {
        // Content that spells a special token must not make encoding fail or panic.
        assert!(count("<|endoftext|> <|im_start|>") > 2);
    }
}
