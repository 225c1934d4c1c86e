//! Chunk planning and clipping for an old part too large for one request: plain
//! functions over token counts and text, no I/O, so they are tested as properties.
//!
//! A chunk is a run of whole messages (never split), oldest first, whose token counts fit
//! the room a request leaves for the transcript. A message that alone is over that room
//! goes in a chunk of its own and is clipped: its head and tail are kept, its middle
//! replaced by a marker saying how many characters were left out (the archive keeps the
//! message whole).

use std::ops::Range;

/// What a message costs in a request beyond its own count: where two rendered messages
/// meet, BPE may tokenize the join differently than each alone (it merges whitespace
/// runs), so a concatenation's count can exceed the sum of its parts by a token or so.
pub const JOIN_TOKENS: usize = 2;

/// What a message of `tokens` tokens costs in a chunk.
fn cost(tokens: usize) -> usize {
    tokens.saturating_add(JOIN_TOKENS)
}

/// The end of the chunk that starts at `start`: the most messages whose costs fit in
/// `capacity`, and at least one (a message over `capacity` goes alone, to be clipped).
/// `start` itself when no message is left.
pub fn next_chunk(tokens: &[usize], start: usize, capacity: usize) -> usize {
    let mut used = 0usize;
    let mut end = start;
    while let Some(&t) = tokens.get(end) {
        used = used.saturating_add(cost(t));
        if used > capacity && end > start {
            break;
        }
        end += 1;
        if used > capacity {
            // An oversize message: alone in its chunk.
            break;
        }
    }
    end
}

/// Every chunk at a fixed `capacity`, as [`next_chunk`] gives them one after another.
pub fn plan(tokens: &[usize], capacity: usize) -> Vec<Range<usize>> {
    let mut chunks = Vec::new();
    let mut start = 0;
    while start < tokens.len() {
        let end = next_chunk(tokens, start, capacity);
        chunks.push(start..end);
        start = end;
    }
    chunks
}

/// Whether a message of `tokens` tokens must be clipped to go in a chunk of `capacity`.
pub fn oversize(tokens: usize, capacity: usize) -> bool {
    cost(tokens) > capacity
}

/// The marker that stands for `left_out` characters: `[... 812,345 characters left out ...]`.
pub fn marker(left_out: usize) -> String {
    format!("\n[... {} characters left out ...]\n", thousands(left_out))
}

/// `n` with a comma between groups of three digits.
fn thousands(n: usize) -> String {
    let digits = n.to_string();
    let mut out = String::with_capacity(digits.len() + digits.len() / 3);
    for (i, d) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(d);
    }
    out
}

/// `text` with its first `head` and last `tail` characters kept and the rest replaced by
/// [`marker`]; `text` itself when they cover it.
pub fn clip(text: &str, head: usize, tail: usize) -> String {
    let chars = text.chars().count();
    if head.saturating_add(tail) >= chars {
        return text.to_owned();
    }
    let byte_at = |char_index: usize| {
        text.char_indices()
            .nth(char_index)
            .map_or(text.len(), |(i, _)| i)
    };
    let head_end = byte_at(head);
    let tail_start = byte_at(chars - tail);
    let mut out = String::with_capacity(head_end + (text.len() - tail_start) + 48);
    out.push_str(&text[..head_end]);
    out.push_str(&marker(chars - head - tail));
    out.push_str(&text[tail_start..]);
    out
}

/// A first guess of characters per token: English prose averages about four, logs and
/// identifiers fewer. Starting low wastes a little room; the loop corrects either way.
const CHARS_PER_TOKEN_GUESS: usize = 3;

/// How many times [`clip_to`] measures before settling for the marker alone.
const CLIP_ATTEMPTS: usize = 12;

/// `text` clipped head and tail (see [`clip`]) so that `count` of it is at most `limit`:
/// as much of it as fits, guessed from the counts and checked. `None` when not even the
/// marker alone fits.
pub fn clip_to(text: &str, limit: usize, count: impl Fn(&str) -> usize) -> Option<String> {
    let chars = text.chars().count();
    let mut keep = chars.min(limit.saturating_mul(CHARS_PER_TOKEN_GUESS));
    for _ in 0..CLIP_ATTEMPTS {
        let clipped = clip(text, keep - keep / 2, keep / 2);
        let tokens = count(&clipped);
        if tokens <= limit {
            return Some(clipped);
        }
        if keep == 0 {
            return None;
        }
        // Scale by how far over the count is, with a tenth more off so that the next
        // try is likely under, and always some progress.
        let scaled = (keep as u128 * limit as u128 * 9 / (tokens as u128 * 10)) as usize;
        keep = scaled.min(keep - 1);
    }
    let bare = clip(text, 0, 0);
    (count(&bare) <= limit).then_some(bare)
}

#[cfg(test)]
mod tests;
