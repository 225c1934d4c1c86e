//! Token counts, as the model will count them: OpenAI's `o200k_base` BPE (the GPT-4o and
//! later vocabulary), bundled in `tiktoken-rs`, so counting needs no network.
//!
//! The vocabulary is loaded once per process (a few hundred milliseconds of CPU, and
//! about 47 MB of resident memory for its tables and pattern): call [`load`] at worker
//! start, off the async threads; the first [`count`] otherwise pays for it. Counting is
//! CPU-bound and linear in the text (some tens of MB/s): callers run it on the blocking
//! pool for large inputs.

use std::sync::LazyLock;

use tiktoken_rs::CoreBPE;

/// `None` only if the bundled vocabulary failed to parse, which would be a broken build
/// of the dependency; [`count`] then falls back to an upper bound (see there).
static BPE: LazyLock<Option<CoreBPE>> = LazyLock::new(|| match tiktoken_rs::o200k_base() {
    Ok(bpe) => Some(bpe),
    Err(e) => {
        tracing::error!(
            error = %e,
            "the o200k_base tokenizer could not be loaded; counting bytes as tokens"
        );
        None
    }
});

/// Loads the vocabulary now (blocking), so that the first summarization does not pay
/// for it.
pub fn load() {
    LazyLock::force(&BPE);
}

/// The number of tokens `text` encodes to (special tokens read as plain text, as the
/// provider reads a transcript). Without the tokenizer, the text's length in bytes: a
/// BPE token covers at least one byte, so that bound is never under the real count.
pub fn count(text: &str) -> usize {
    match &*BPE {
        Some(bpe) => bpe.encode_ordinary(text).len(),
        None => text.len(),
    }
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
