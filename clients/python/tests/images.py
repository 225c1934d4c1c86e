"""Real, small images made here as bytes (the standard library only): a PNG (zlib and CRC
as the format says), a baseline JPEG (a uniform grey, entropy-coded with one-code Huffman
tables), a GIF (uncompressed LZW), WebP headers (VP8, VP8L, VP8X: what is read of them);
and the content blocks agents put them in."""

from __future__ import annotations

import base64
import struct
import zlib
from typing import Any


def png(width: int, height: int) -> bytes:
    """A valid greyscale PNG of this size, all black."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    header = struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0)
    rows = b"".join(b"\x00" + b"\x00" * width for _ in range(height))
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(rows)) + chunk(b"IEND", b"")


def jpeg(width: int, height: int, *, exif: bytes = b"") -> bytes:
    """A valid baseline greyscale JPEG of this size, uniform mid-grey: every 8x8 block's
    DC difference and its end-of-block are the one code (`0`) of their tables. `exif`
    adds an APP1 segment before the frame, as cameras write one."""

    def segment(marker: int, data: bytes) -> bytes:
        return bytes([0xFF, marker]) + struct.pack(">H", len(data) + 2) + data

    jfif = segment(0xE0, b"JFIF\x00\x01\x01\x00\x00\x01\x00\x01\x00\x00")
    app1 = segment(0xE1, b"Exif\x00\x00" + exif) if exif else b""
    quant = segment(0xDB, b"\x00" + b"\x01" * 64)
    frame = segment(0xC0, struct.pack(">BHHB", 8, height, width, 1) + b"\x01\x11\x00")
    one_code = bytes([1] + [0] * 15) + b"\x00"  # one code of length 1, for symbol 0
    huffman = segment(0xC4, b"\x00" + one_code + b"\x10" + one_code)
    scan = segment(0xDA, b"\x01\x01\x00\x00\x3f\x00")
    blocks = -(-width // 8) * -(-height // 8)
    bits = "00" * blocks
    bits += "1" * (-len(bits) % 8)
    data = int(bits, 2).to_bytes(len(bits) // 8, "big") if bits else b""
    return b"\xff\xd8" + jfif + app1 + quant + frame + huffman + scan + data + b"\xff\xd9"


def gif(width: int, height: int) -> bytes:
    """A valid GIF of this size, all black: 7-bit LZW codes, each 8 bits wide because a
    clear code comes before the code table can grow past 256 entries."""
    palette = b"\x00\x00\x00" * 128
    screen = struct.pack("<HHBBB", width, height, 0xF6, 0, 0)  # a 128-colour global table
    codes = bytearray()
    for n in range(width * height):
        if n % 100 == 0:
            codes.append(128)  # clear
        codes.append(0)
    codes.append(129)  # end of information
    blocks = b"".join(bytes([len(codes[i : i + 255])]) + codes[i : i + 255] for i in range(0, len(codes), 255))
    image = b"\x2c" + struct.pack("<HHHHB", 0, 0, width, height, 0) + b"\x07" + blocks + b"\x00"
    return b"GIF89a" + screen + palette + image + b";"


def webp_lossless(width: int, height: int) -> bytes:
    """A WebP (VP8L) header: the signature byte and 14-bit sizes minus one."""
    bits = (width - 1) | ((height - 1) << 14)
    body = b"VP8L" + struct.pack("<I", 5) + b"\x2f" + struct.pack("<I", bits)
    return b"RIFF" + struct.pack("<I", len(body) + 4) + b"WEBP" + body


def webp_lossy(width: int, height: int) -> bytes:
    """A WebP (VP8) header: a key frame's start code and 14-bit sizes."""
    frame = b"\x00\x00\x00" + b"\x9d\x01\x2a" + struct.pack("<HH", width, height)
    body = b"VP8 " + struct.pack("<I", len(frame)) + frame
    return b"RIFF" + struct.pack("<I", len(body) + 4) + b"WEBP" + body


def webp_extended(width: int, height: int) -> bytes:
    """A WebP (VP8X) header: 24-bit canvas sizes minus one."""
    data = b"\x00\x00\x00\x00" + (width - 1).to_bytes(3, "little") + (height - 1).to_bytes(3, "little")
    body = b"VP8X" + struct.pack("<I", len(data)) + data
    return b"RIFF" + struct.pack("<I", len(body) + 4) + b"WEBP" + body


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def openai_image(data: bytes, mime: str = "image/png") -> dict[str, Any]:
    """OpenAI's chat format, a `data:` URL (LangChain's `image_url` block)."""
    return {"type": "image_url", "image_url": {"url": f"data:{mime};base64,{b64(data)}"}}


def anthropic_image(data: bytes, mime: str = "image/png") -> dict[str, Any]:
    return {"type": "image", "source": {"type": "base64", "media_type": mime, "data": b64(data)}}


def langchain_image(data: bytes, mime: str = "image/png") -> dict[str, Any]:
    """LangChain's standard (v1) image block."""
    return {"type": "image", "base64": b64(data), "mime_type": mime}


def screenshot(width: int = 1280, height: int = 800) -> list[dict[str, Any]]:
    """A tool output as a screenshot tool returns it: a caption and the image."""
    return [{"type": "text", "text": f"screenshot {width}x{height}"}, openai_image(png(width, height))]
