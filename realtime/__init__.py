"""The voice pipeline behind `/v1/realtime`: a session's audio in, its turns as ASR, LLM and
TTS jobs that stream into each other, and OpenAI's Realtime events out."""
