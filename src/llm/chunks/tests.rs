use proptest::prelude::*;

use super::*;

/// A stand-in tokenizer for the properties: one token per started 4 bytes.
fn quarter_bytes(text: &str) -> usize {
    text.len().div_ceil(4)
}

#[test]
fn the_marker_says_how_many_characters_were_left_out() {
    assert_eq!(marker(812_345), "\n[... 812,345 characters left out ...]\n");
    assert_eq!(marker(7), "\n[... 7 characters left out ...]\n");
    assert_eq!(thousands(1_000), "1,000");
    assert_eq!(thousands(999), "999");
    assert_eq!(thousands(1_234_567_890), "1,234,567,890");
}

#[test]
fn clip_keeps_head_and_tail_by_characters() {
    assert_eq!(
        clip("héllo wörld!", 3, 2),
        "hél\n[... 7 characters left out ...]\nd!"
    );
    assert_eq!(clip("short", 3, 2), "short");
    assert_eq!(clip("short", 0, 0), "\n[... 5 characters left out ...]\n");
}

#[test]
fn a_megabyte_tool_output_is_clipped_to_the_limit_with_its_ends_kept() {
    let text = format!(
        "START {} END",
        "14:01:07 ERROR pool exhausted ".repeat(35_000)
    );
    let clipped = clip_to(&text, 2_000, crate::compaction::tokens::count).unwrap();
    assert!(crate::compaction::tokens::count(&clipped) <= 2_000);
    assert!(clipped.starts_with("START 14:01:07"), "{}", &clipped[..40]);
    assert!(clipped.ends_with("exhausted  END"));
    assert!(clipped.contains(" characters left out ...]"));
    // Most of the room is used: the guess is corrected, not just taken.
    assert!(crate::compaction::tokens::count(&clipped) > 1_500);
}

#[test]
fn chunks_take_as_many_whole_messages_as_fit() {
    // Each message costs its tokens + 2.
    assert_eq!(plan(&[8, 8, 8], 20), vec![0..2, 2..3]);
    assert_eq!(plan(&[8, 8, 8], 30), vec![0..3]);
    assert_eq!(plan(&[3, 50, 3], 20), vec![0..1, 1..2, 2..3]);
    assert_eq!(plan(&[], 20), Vec::<Range<usize>>::new());
    assert_eq!(next_chunk(&[5], 1, 20), 1);
}

proptest! {
    #[test]
    fn every_chunk_fits_in_order_and_nothing_is_dropped(
        tokens in prop::collection::vec(0usize..300, 0..60),
        capacity in 1usize..400,
    ) {
        let chunks = plan(&tokens, capacity);
        let mut next = 0;
        for chunk in &chunks {
            prop_assert_eq!(chunk.start, next, "in order, no gap");
            prop_assert!(chunk.end > chunk.start, "never empty");
            let used: usize = tokens[chunk.clone()].iter().map(|&t| t + JOIN_TOKENS).sum();
            prop_assert!(
                used <= capacity || (chunk.len() == 1 && oversize(tokens[chunk.start], capacity)),
                "{chunk:?} uses {used} of {capacity}"
            );
            // Greedy: the next message would not have fitted.
            if let Some(&t) = tokens.get(chunk.end) {
                prop_assert!(used + t + JOIN_TOKENS > capacity);
            }
            next = chunk.end;
        }
        prop_assert_eq!(next, tokens.len(), "every message is in a chunk");
    }

    #[test]
    fn clipping_keeps_both_ends_and_marks_exactly_what_it_leaves_out(
        text in "\\PC{0,400}",
        head in 0usize..200,
        tail in 0usize..200,
    ) {
        let clipped = clip(&text, head, tail);
        let chars: Vec<char> = text.chars().collect();
        if head + tail >= chars.len() {
            prop_assert_eq!(clipped, text);
        } else {
            let head_text: String = chars[..head].iter().collect();
            let tail_text: String = chars[chars.len() - tail..].iter().collect();
            let expected = format!("{head_text}{}{tail_text}", marker(chars.len() - head - tail));
            prop_assert_eq!(clipped, expected);
        }
    }

    #[test]
    fn a_clipped_message_fits_its_limit(
        text in "\\PC{0,3000}",
        limit in 20usize..400,
    ) {
        match clip_to(&text, limit, quarter_bytes) {
            Some(clipped) => {
                prop_assert!(quarter_bytes(&clipped) <= limit);
                if clipped != text {
                    prop_assert!(clipped.contains(" characters left out ...]"));
                }
            }
            // Only when the marker alone is over the limit.
            None => prop_assert!(quarter_bytes(&clip(&text, 0, 0)) > limit),
        }
    }
}
