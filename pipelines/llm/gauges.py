"""What an engine server says of itself on its Prometheus `/metrics`: the sequences it runs
and keeps waiting, its KV cache's use, its prefix cache's lookups and hits, its preemptions
and the tokens it generated.

vLLM exports them (`vllm:num_requests_running`, ...); `transformers serve` has no
`/metrics`. The worker stores the readings with its others, and the API's `/metrics` shows
them per pipeline and worker (`mmq_engine_*`). Only the lines named here are read, summed
over their labels (one model, and its adapters, per engine).
"""

from __future__ import annotations

import http.client
from urllib.parse import urlsplit

ENGINE_READINGS = {
    "vllm:num_requests_running": "requests_running",
    "vllm:num_requests_waiting": "requests_waiting",
    "vllm:kv_cache_usage_perc": "kv_cache_usage",
    "vllm:prefix_cache_queries_total": "prefix_cache_queries",
    "vllm:prefix_cache_hits_total": "prefix_cache_hits",
    "vllm:num_preemptions_total": "preemptions",
    "vllm:generation_tokens_total": "generation_tokens",
}
"""The engine's sample name -> the reading's name in mmq."""


def engine_readings(text: str) -> dict[str, float]:
    """The readings in a Prometheus text exposition (`name{labels} value` lines)."""
    found: dict[str, float] = {}
    for line in text.splitlines():
        if not line.startswith("vllm:"):
            continue
        name = line.split("{", 1)[0].split(" ", 1)[0]
        reading = ENGINE_READINGS.get(name)
        if reading is None:
            continue
        try:
            value = float(line.rsplit(" ", 1)[1])
        except (IndexError, ValueError):
            continue
        found[reading] = found.get(reading, 0.0) + value
    return found


def read_metrics(base_url: str, timeout_s: float) -> tuple[int, str]:
    """(status, text) of the engine's `GET /metrics`. A plain connection: the worker reads
    it every second, which httpx would log each time. Raises OSError."""
    url = urlsplit(base_url)
    connection = http.client.HTTPConnection(
        url.hostname or "127.0.0.1", url.port, timeout=timeout_s
    )
    try:
        connection.request("GET", "/metrics")
        response = connection.getresponse()
        return response.status, response.read().decode(errors="replace")
    except http.client.HTTPException as exc:
        raise OSError(str(exc)) from exc
    finally:
        connection.close()
