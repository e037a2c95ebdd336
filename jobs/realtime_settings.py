"""`[realtime]`: the voice sessions of `/v1/realtime` (`realtime/`)."""

from __future__ import annotations

from pydantic import BaseModel, Field


class RealtimeSettings(BaseModel):
    llm_model: str | None = None
    """The LLM that answers (a pipeline, its model or an alias), unless a session names one
    (the websocket's `?model=`, or the session's `model`); unset: the first `llm` pipeline."""
    asr_model: str | None = None
    """The ASR model that transcribes a turn, unless the session's
    `audio.input.transcription.model` names one; unset: the first `asr` pipeline."""
    tts_model: str | None = None
    """The TTS model that speaks the answer (its voices are the session's `voice`); unset:
    the first `tts` pipeline."""
    max_sessions_per_key: int = Field(default=4, ge=0)
    """Sessions one key holds open at once, across the API processes (0: no cap)."""
    max_session_s: float = Field(default=1800.0, gt=0)
    """A session is closed, with an error event naming the limit, after this long."""
    max_buffer_s: float = Field(default=60.0, gt=0)
    """Seconds of input audio a turn may hold before it is committed."""
    max_output_tokens: int = Field(default=512, ge=1)
    """Tokens of an answer when the session and the response name no limit."""
    client_secret_ttl_s: int = Field(default=600, ge=10, le=7200)
    """Default life of a client secret (`POST /v1/realtime/client_secrets`)."""
    events_ttl_s: int = Field(default=24 * 3600, ge=60)
    """How long a session's events stay readable (`GET /v1/realtime/sessions/{id}/events`)."""
    store_audio_events: bool = True
    """Keep the audio deltas in the session's stored events too (a replay plays the
    answer); false keeps the rest alone."""
