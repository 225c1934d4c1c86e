"""The weight of what is not text (`block_chars`): the rule over each kind of block, the
providers' image charges, and the pixel size read from real PNG, JPEG and GIF images made
in `images` (and WebP headers). No store needed."""

from __future__ import annotations

from typing import Any

import pytest
from langchain_core.messages import AIMessage, HumanMessage, ToolMessage

from images import anthropic_image, gif, jpeg, langchain_image, openai_image, png, webp_extended, webp_lossless, webp_lossy
from summarizer_client._codec import text_of, to_row
from summarizer_client._weight import (
    FIXED_CHARS,
    anthropic_image_tokens,
    block_chars,
    image_tokens,
    openai_image_tokens,
    pixel_size,
)


@pytest.mark.parametrize(
    "make", [png, jpeg, gif, webp_lossless, webp_lossy, webp_extended], ids=lambda f: f.__name__
)
@pytest.mark.parametrize("size", [(1, 1), (640, 480), (1919, 1081), (33, 4000)])
def test_the_pixel_size_is_read_from_each_format(make: Any, size: tuple[int, int]) -> None:
    assert pixel_size(make(*size)) == size


def test_a_jpeg_frame_is_found_after_an_exif_segment_and_fill_bytes() -> None:
    image = jpeg(800, 600, exif=b"MM\x00*" + b"\x00" * 5_000)
    assert pixel_size(image) == (800, 600)
    filled = image[:2] + b"\xff\xff" + image[2:]  # fill bytes before a marker
    assert pixel_size(filled) == (800, 600)


@pytest.mark.parametrize(
    "data",
    [
        b"",
        b"not an image at all",
        png(10, 10)[:20],  # cut inside IHDR
        jpeg(10, 10)[:30],  # cut before the frame
        b"\xff\xd8\xff\xda\x00\x02",  # a scan before any frame
        b"\xff\xd8\x00\x00",  # no marker where one must be
        png(10, 10)[:16] + b"\x00\x00\x00\x00" + b"\x00\x00\x00\x0a",  # width 0
        b"RIFF\x00\x00\x00\x00WEBPVP8 " + b"\x00" * 20,  # no start code
    ],
)
def test_what_is_not_a_readable_image_has_no_size(data: bytes) -> None:
    assert pixel_size(data) is None


@pytest.mark.parametrize(
    "size, anthropic, openai",
    [
        # Within every bound: width * height / 750, rounded up; one 512-px tile.
        ((512, 512), 350, 255),
        # OpenAI brings the short side down to 768: 2 x 2 tiles.
        ((1024, 1024), 1399, 765),
        # 1,024,000 pixels; OpenAI: 1228 x 768, 3 x 2 tiles.
        ((1280, 800), 1366, 1105),
        # Anthropic: down to 1.15 megapixels (758 x 1516); OpenAI's documented example:
        # 2048 x 4096 -> 768 x 1536, 6 tiles.
        ((2048, 4096), 1533, 1105),
        # Anthropic: the long edge down to 1,568 px (1568 x 98); OpenAI: 2048 x 128.
        ((4000, 250), 205, 765),
        ((1, 1), 1, 255),
    ],
)
def test_the_providers_image_charges(size: tuple[int, int], anthropic: int, openai: int) -> None:
    assert anthropic_image_tokens(*size) == anthropic
    assert openai_image_tokens(*size) == openai
    assert image_tokens(*size) == max(anthropic, openai)


def test_each_kind_of_block_weighs_by_the_rule() -> None:
    screenshot = png(1280, 800)  # Anthropic 1,366 tokens, OpenAI 1,105: 5,464 chars
    content: list[Any] = [
        "a bare string",
        {"type": "text", "text": "in content already"},
        {"type": "output_text", "text": "so is this"},
        {"type": "tool_use", "id": "t1", "name": "f", "input": {"x": 1}},
        {"type": "tool_call", "id": "t2", "name": "f", "args": {}},
        {"type": "compaction", "content": "the provider's summary"},
        {"type": "thinking", "thinking": "t" * 100, "signature": "s" * 500},
        {"type": "redacted_thinking", "data": "r" * 300},
        {"type": "reasoning", "reasoning": "x" * 7, "id": "rs_1"},
        {
            "type": "reasoning",
            "summary": [{"type": "summary_text", "text": "y" * 11}, {"type": "summary_text", "text": "z" * 13}],
            "encrypted_content": "e" * 1_000,
        },
        openai_image(screenshot),
        anthropic_image(jpeg(1024, 1024), "image/jpeg"),  # 1,399 tokens
        langchain_image(gif(512, 512), "image/gif"),  # 350 tokens
        {"type": "image_url", "image_url": {"url": "https://example.com/graph.png"}},  # a URL: fixed
        {"type": "input_image", "image_url": "data:image/png;base64,bm90IGFuIGltYWdl"},  # unreadable: fixed
        {"type": "file", "file_id": "file-1"},
        {"type": "audio", "base64": "AAAA", "mime_type": "audio/wav"},
        {"type": "document", "source": {"type": "text", "data": "..."}},
        {"no": "type"},
    ]
    expected = (
        100 + 300 + 7 + (11 + 13 + 1_000)
        + 4 * 1_366 + 4 * 1_399 + 4 * 350
        + 6 * FIXED_CHARS  # the URL, the unreadable image, file, audio, document, no type
    )
    assert block_chars(content, {}) == expected
    assert block_chars("plain text", {}) == 0


def test_additional_kwargs_reasoning_weighs_its_texts_and_payload() -> None:
    reasoning = {
        "id": "rs_1",
        "type": "reasoning",
        "summary": [{"type": "summary_text", "text": "a" * 40}],
        "encrypted_content": "g" * 2_000,
    }
    assert block_chars("text", {"reasoning": reasoning}) == 2_040
    # A string is not an item: the database weighs it 0 as well.
    assert block_chars("text", {"reasoning": "pool?"}) == 0


def test_a_row_carries_the_weight_and_a_compaction_blocks_text() -> None:
    message = AIMessage(
        id="m1",
        content=[
            {"type": "compaction", "content": "Earlier: INC-777 on host-zeta-9, error E-9999."},
            {"type": "text", "text": "Continuing."},
            {"type": "reasoning", "encrypted_content": "opaque" * 100, "summary": []},
        ],
        additional_kwargs={"reasoning": {"encrypted_content": "k" * 50}},
    )
    row = to_row(message)

    assert row.content == "Earlier: INC-777 on host-zeta-9, error E-9999.\nContinuing."
    assert "opaque" not in row.content
    assert row.block_chars == 600 + 50
    assert row.as_json()["block_chars"] == 650
    assert to_row(HumanMessage(content="hi", id="h")).block_chars == 0
    tool = ToolMessage(content=[{"type": "text", "text": "shot"}, openai_image(png(512, 512))], tool_call_id="c", id="t")
    assert to_row(tool).block_chars == 4 * 350


def test_an_opaque_compaction_item_adds_no_text_and_weighs_its_payload() -> None:
    # OpenAI's compaction item is encrypted: nothing of it is text, all of it weighs.
    item = {"type": "compaction", "encrypted_content": "gAAAA" * 200}
    assert text_of([item, {"type": "text", "text": "ok"}]) == "ok"
    assert block_chars([item, {"type": "compaction", "content": "Anthropic's text"}], None) == 1_000
