"""How long an audio file plays, read from its header without decoding it: WAV exactly,
MP3 from its first frame's bitrate (exact for constant bitrate, near for variable). The
API holds no decoder (FFmpeg lives in the ASR worker); other containers give None, and
their length is checked by the worker (`limits.audio_max_seconds`)."""

from __future__ import annotations

import io
import wave

MP3_KBPS = {
    # (MPEG-1?, layer) -> kbit/s by the header's bitrate index (1..14)
    (True, 1): (32, 64, 96, 128, 160, 192, 224, 256, 288, 320, 352, 384, 416, 448),
    (True, 2): (32, 48, 56, 64, 80, 96, 112, 128, 160, 192, 224, 256, 320, 384),
    (True, 3): (32, 40, 48, 56, 64, 80, 96, 112, 128, 160, 192, 224, 256, 320),
    (False, 1): (32, 48, 56, 64, 80, 96, 112, 128, 144, 160, 176, 192, 224, 256),
    (False, 2): (8, 16, 24, 32, 40, 48, 56, 64, 80, 96, 112, 128, 144, 160),
    (False, 3): (8, 16, 24, 32, 40, 48, 56, 64, 80, 96, 112, 128, 144, 160),
}
SCAN_BYTES = 64 * 1024
"""How far into an MP3 (past its ID3 tag) its first frame is looked for."""


def seconds_of(data: bytes, audio_format: str) -> float | None:
    """The audio's length in seconds; None where its header cannot tell it."""
    if audio_format == "wav":
        return _wav(data)
    if audio_format == "mp3":
        return _mp3(data)
    return None


def _wav(data: bytes) -> float | None:
    try:
        with wave.open(io.BytesIO(data)) as file:
            rate = file.getframerate()
            return file.getnframes() / rate if rate > 0 else None
    except (wave.Error, EOFError):
        return None


def _mp3(data: bytes) -> float | None:
    start = 0
    if data[:3] == b"ID3" and len(data) >= 10:  # its size: four 7-bit bytes
        size = 0
        for byte in data[6:10]:
            size = (size << 7) | (byte & 0x7F)
        start = 10 + size
    end = min(len(data) - 3, start + SCAN_BYTES)
    for at in range(start, max(start, end)):
        if data[at] != 0xFF or data[at + 1] & 0xE0 != 0xE0:
            continue
        version, layer = (data[at + 1] >> 3) & 0x3, 4 - ((data[at + 1] >> 1) & 0x3)
        index = data[at + 2] >> 4
        if version == 1 or layer == 4 or not 1 <= index <= 14:
            continue  # a reserved value: not a frame header
        kbps = MP3_KBPS[(version == 3, layer)][index - 1]
        return (len(data) - at) * 8 / (kbps * 1000)
    return None
