"""What a message's blocks that are not text weigh, in chars: the row's `block_chars`.

The thresholds count chars, and a screenshot, a thinking block or an encrypted reasoning
item holds none of the text in `content`: without a weight a history of images overflows a
model while the worker sees a small session. The rule is the database's
(`block_chars_of`, migration 22, which weighs the rows a writer gives no weight), with
one difference: an image whose pixel size can be read from its base64 data (PNG, JPEG,
GIF, WebP) weighs what the providers charge for it, where the database charges every
image a fixed 1,600 tokens.

- a block that is not an object, or whose type ends in `text` (`text`, `input_text`,
  `output_text`, ...): 0, its text is in `content`;
- a call (`tool_use`, `tool_call`, `function_call`, ...): 0, calls are in `tool_calls`;
- `compaction`: the length of its `encrypted_content` (OpenAI's opaque item); Anthropic's
  block has none and weighs 0, its text is in `content` (see `_codec.text_of`);
- `thinking`: the length of its `thinking`; `redacted_thinking`: of its `data`;
- `reasoning` (and an object in `additional_kwargs["reasoning"]`): the length of its
  `reasoning`, `text` and `encrypted_content` strings and of each `summary` item's `text`;
- an image (`image`, `image_url`, `input_image`) whose size is read: the larger of
  Anthropic's and OpenAI's (high detail) token counts, 4 chars a token;
- anything else (an image whose size is not read, a URL, a file, audio, a document, a
  block of unknown type): 1,600 tokens, 6,400 chars.

Pure functions over plain data; no dependency beyond the standard library.
"""

from __future__ import annotations

import binascii
import math
from typing import Any

#: The worker's default chars per token (`DEFAULT_CHARS_PER_TOKEN`): the unit converting
#: a provider's token charge into the chars the thresholds count.
CHARS_PER_TOKEN = 4
#: What a block is charged when its cost cannot be read: about a large image's tokens on
#: either provider (Anthropic's cap is about 1,600), so that an unread image is not cheap.
FIXED_TOKENS = 1_600
FIXED_CHARS = FIXED_TOKENS * CHARS_PER_TOKEN

_CALLS = frozenset(
    {
        "tool_use",
        "tool_call",
        "tool_call_chunk",
        "function_call",
        "server_tool_use",
        "server_tool_call",
        "invalid_tool_call",
    }
)
_IMAGES = frozenset({"image", "image_url", "input_image"})

# Anthropic resizes an image to fit these before it is charged width * height / 750.
_ANTHROPIC_LONG_EDGE = 1_568
_ANTHROPIC_PIXELS = 1_150_000
_ANTHROPIC_PIXELS_PER_TOKEN = 750
# OpenAI's high detail: fit in 2048 x 2048, short side down to 768, then per 512-px tile.
_OPENAI_BOX = 2_048
_OPENAI_SHORT_SIDE = 768
_OPENAI_TILE = 512
_OPENAI_BASE_TOKENS = 85
_OPENAI_TILE_TOKENS = 170


def block_chars(content: Any, additional_kwargs: Any) -> int:
    """The weight of a message whose content is `content` (a string weighs 0 here: it is
    all text) and whose `additional_kwargs` are given, in chars."""
    total = 0
    if isinstance(content, list):
        total += sum(_block(block) for block in content)
    if isinstance(additional_kwargs, dict):
        reasoning = additional_kwargs.get("reasoning")
        if isinstance(reasoning, dict):
            total += _reasoning(reasoning)
    return total


def _block(block: Any) -> int:
    if not isinstance(block, dict):
        return 0
    kind = block.get("type")
    if isinstance(kind, str) and kind.endswith("text"):
        return 0
    if kind in _CALLS:
        return 0
    if kind == "compaction":
        return _len(block.get("encrypted_content"))
    if kind == "thinking":
        return _len(block.get("thinking"))
    if kind == "redacted_thinking":
        return _len(block.get("data"))
    if kind == "reasoning":
        return _reasoning(block)
    if kind in _IMAGES:
        size = image_size(block)
        if size is not None:
            return CHARS_PER_TOKEN * image_tokens(*size)
    return FIXED_CHARS


def _reasoning(item: dict[str, Any]) -> int:
    total = _len(item.get("reasoning")) + _len(item.get("text")) + _len(item.get("encrypted_content"))
    summary = item.get("summary")
    if isinstance(summary, list):
        total += sum(_len(s.get("text")) for s in summary if isinstance(s, dict))
    return total


def _len(value: Any) -> int:
    return len(value) if isinstance(value, str) else 0


# -- images -----------------------------------------------------------------------------


def image_tokens(width: int, height: int) -> int:
    """The tokens an image of this pixel size costs: the larger of Anthropic's and
    OpenAI's (high detail) charge, so that the weight holds for either provider."""
    return max(anthropic_image_tokens(width, height), openai_image_tokens(width, height))


def anthropic_image_tokens(width: int, height: int) -> int:
    """Scaled (never up) to fit 1,568 px on the long edge and 1.15 megapixels, then
    width * height / 750, rounded up."""
    scale = min(
        1.0,
        _ANTHROPIC_LONG_EDGE / max(width, height),
        math.sqrt(_ANTHROPIC_PIXELS / (width * height)),
    )
    w, h = _scaled(width, scale), _scaled(height, scale)
    return -(-(w * h) // _ANTHROPIC_PIXELS_PER_TOKEN)


def openai_image_tokens(width: int, height: int) -> int:
    """High detail: scaled (never up) to fit 2,048 x 2,048, then so that the short side
    is at most 768 px; 85 tokens and 170 a 512-px tile."""
    w, h = width, height
    if max(w, h) > _OPENAI_BOX:
        scale = _OPENAI_BOX / max(w, h)
        w, h = _scaled(w, scale), _scaled(h, scale)
    if min(w, h) > _OPENAI_SHORT_SIDE:
        scale = _OPENAI_SHORT_SIDE / min(w, h)
        w, h = _scaled(w, scale), _scaled(h, scale)
    tiles = -(-w // _OPENAI_TILE) * -(-h // _OPENAI_TILE)
    return _OPENAI_BASE_TOKENS + _OPENAI_TILE_TOKENS * tiles


def _scaled(side: int, scale: float) -> int:
    # The epsilon keeps 1024 * 0.75 at 768, not 767.9999.
    return max(1, int(side * scale + 1e-9))


def image_size(block: dict[str, Any]) -> tuple[int, int] | None:
    """The (width, height) of an image block whose data is inline as base64 (LangChain's
    `base64`/`data`, Anthropic's `source`, OpenAI's `data:` URLs) in a format read here;
    None for a URL, another format, or data that cannot be read."""
    data = _base64_of(block)
    if data is None:
        return None
    try:
        raw = binascii.a2b_base64(data)
    except (binascii.Error, ValueError):
        return None
    return pixel_size(raw)


def _base64_of(block: dict[str, Any]) -> str | None:
    for key in ("base64", "data"):
        if isinstance(block.get(key), str):
            return str(block[key])
    source = block.get("source")
    if isinstance(source, dict) and source.get("type") == "base64" and isinstance(source.get("data"), str):
        return str(source["data"])
    for key in ("image_url", "url"):
        url = block.get(key)
        if isinstance(url, dict):
            url = url.get("url")
        if isinstance(url, str) and url.startswith("data:"):
            header, _, payload = url.partition(",")
            return payload if header.endswith(";base64") else None
    return None


def pixel_size(data: bytes) -> tuple[int, int] | None:
    """The (width, height) written in the header of a PNG, JPEG, GIF or WebP image; None
    for anything else, or a header that is cut short or says 0."""
    if data.startswith(b"\x89PNG\r\n\x1a\n"):
        size = _png(data)
    elif data.startswith(b"\xff\xd8"):
        size = _jpeg(data)
    elif data[:6] in (b"GIF87a", b"GIF89a") and len(data) >= 10:
        size = int.from_bytes(data[6:8], "little"), int.from_bytes(data[8:10], "little")
    elif data[:4] == b"RIFF" and data[8:12] == b"WEBP":
        size = _webp(data)
    else:
        size = None
    if size is None or size[0] <= 0 or size[1] <= 0:
        return None
    return size


def _png(data: bytes) -> tuple[int, int] | None:
    if len(data) < 24 or data[12:16] != b"IHDR":
        return None
    return int.from_bytes(data[16:20], "big"), int.from_bytes(data[20:24], "big")


#: The start-of-frame markers, whose segment holds the size: every SOFn but DHT (C4),
#: JPG (C8) and DAC (CC), which share the range.
_JPEG_FRAMES = frozenset(range(0xC0, 0xD0)) - {0xC4, 0xC8, 0xCC}


def _jpeg(data: bytes) -> tuple[int, int] | None:
    i = 2
    while i + 1 < len(data):
        if data[i] != 0xFF:
            return None
        marker = data[i + 1]
        if marker == 0xFF:  # a fill byte before the marker
            i += 1
            continue
        i += 2
        if marker == 0x01 or 0xD0 <= marker <= 0xD8:  # markers without a segment
            continue
        if marker in (0xD9, 0xDA):  # the image or its scan starts before any frame
            return None
        if i + 2 > len(data):
            return None
        length = int.from_bytes(data[i : i + 2], "big")
        if marker in _JPEG_FRAMES:
            if i + 7 > len(data):
                return None
            height = int.from_bytes(data[i + 3 : i + 5], "big")
            width = int.from_bytes(data[i + 5 : i + 7], "big")
            return width, height
        if length < 2:
            return None
        i += length
    return None


def _webp(data: bytes) -> tuple[int, int] | None:
    chunk = data[12:16]
    if chunk == b"VP8 " and len(data) >= 30 and data[23:26] == b"\x9d\x01\x2a":
        width = int.from_bytes(data[26:28], "little") & 0x3FFF
        height = int.from_bytes(data[28:30], "little") & 0x3FFF
        return width, height
    if chunk == b"VP8L" and len(data) >= 25 and data[20] == 0x2F:
        bits = int.from_bytes(data[21:25], "little")
        return (bits & 0x3FFF) + 1, ((bits >> 14) & 0x3FFF) + 1
    if chunk == b"VP8X" and len(data) >= 30:
        return int.from_bytes(data[24:27], "little") + 1, int.from_bytes(data[27:30], "little") + 1
    return None
