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
    max_secrets_per_key: int = Field(default=32, ge=0)
    """Client secrets that one key holds unexpired at once (429 with Retry-After over;
    0: no cap). A revoked key's secrets are deleted with it."""
    max_secret_bytes: int = Field(default=64 * 1024, ge=1024)
    """The session configuration that one client secret keeps, as stored JSON (413 over)."""
    events_ttl_s: int = Field(default=24 * 3600, ge=60)
    """How long a session's events stay readable (`GET /v1/realtime/sessions/{id}/events`)."""
    max_event_bytes: int = Field(default=64 * 1024, ge=1024)
    """One stored event (an audio delta is about 6.4 KB): a larger one (a long item echoed
    back) is sent whole but stored as a `mmq.event_truncated` record of its type and size."""
    max_session_log_bytes: int = Field(default=16 * 1024 * 1024, ge=64 * 1024)
    """The stored events of one session (about four minutes of answer audio, with
    `store_audio_events`); past it the log ends with one `mmq.log_truncated` record."""
    max_key_log_bytes: int = Field(default=64 * 1024 * 1024, ge=64 * 1024)
    """The stored events of all of one owner's sessions kept (`events_ttl_s`) together;
    past it new events are sent but not stored (`mmq_realtime_log_bytes` counts them)."""
    store_audio_events: bool = True
    """Keep the audio deltas in the session's stored events too (a replay plays the
    answer); false keeps the rest alone."""
