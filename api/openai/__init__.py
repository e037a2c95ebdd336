"""OpenAI-compatible routes: thin adapters that submit jobs and stream their events."""
