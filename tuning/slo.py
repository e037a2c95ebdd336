"""The one SLO type of benches and tunes: `p99=2s`, `ttft_p99=500ms`, `tpot_p50=50ms`,
`first_audio_p95=300ms`.

A metric without a prefix is end to end (submit to the job's end, as the client saw it).
The first-output metrics (`ttft`, `first_audio`, `first_segment`, `first_step`) run from
submit to the job's first partial or progress event (`timings.time_to_first_output_ms`,
queue wait included: what a user waits for); `tpot` is the LLM's time per output token,
`queue_wait` the time a job waited for a worker.

An SLO reads each request (a `Sample`) as one number, `Slo.reading`: its metric, or
infinity for a failed request or one without the metric, which misses any limit. One
exception: an answer of fewer than two tokens has no TPOT (there is no second token to
wait for) and reads 0, meeting any TPOT limit. Its only wait was the first token, which a
TTFT SLO judges; failing it would make a TPOT goal punish short answers, not slow
decoding. vLLM's `benchmarks/serve.py` counts goodput the same way.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from common.stats import percentile

ALL_KINDS = None
METRIC_KINDS: dict[str, frozenset[str] | None] = {
    "e2e": ALL_KINDS,
    "queue_wait": ALL_KINDS,
    "ttft": frozenset({"llm"}),
    "tpot": frozenset({"llm"}),
    "first_audio": frozenset({"tts"}),
    "first_segment": frozenset({"asr"}),
    "first_step": frozenset({"image"}),
}
"""Each metric an SLO may name, and the kinds it applies to (None: every kind)."""

_SPEC = re.compile(r"^(?:(?P<metric>[a-z_]+?)_)?p(?P<pct>\d+(?:\.\d+)?)$")
_DURATION = re.compile(r"^(?P<value>\d+(?:\.\d+)?)\s*(?P<unit>ms|s|m)?$")
_UNIT_MS = {"ms": 1.0, "s": 1000.0, "m": 60_000.0, None: 1000.0}


class SloError(ValueError):
    """An SLO that cannot be read, or that does not apply to the pipeline's kind."""


@dataclass
class Sample:
    """One request as an SLO reads it: its metrics in ms (None: it has none of that one)."""

    ok: bool
    metrics: dict[str, float | None]
    error: str | None = None
    tokens: int = 0
    """Output tokens (LLM: the answer's completion tokens)."""


@dataclass(frozen=True)
class Slo:
    metric: str
    percentile: float
    limit_ms: float

    def __str__(self) -> str:
        name = "" if self.metric == "e2e" else f"{self.metric}_"
        return f"{name}p{self.percentile:g}<={_ms_text(self.limit_ms)}"

    def reading(self, sample: Sample) -> float:
        """What one request counts as, in ms (see the module's docstring)."""
        value = sample.metrics.get(self.metric) if sample.ok else math.inf
        if value is None:
            return 0.0 if self.metric == "tpot" and sample.tokens < 2 else math.inf
        return value

    def met(self, sample: Sample) -> bool:
        return self.reading(sample) <= self.limit_ms

    def observed(self, samples: Sequence[Sample]) -> float:
        """The percentile this SLO names over `samples`, in ms (NaN for none)."""
        return percentile([self.reading(s) for s in samples], self.percentile)

    def allowed_misses(self, count: int) -> int:
        """How many of `count` samples may exceed the limit while the percentile holds."""
        return math.floor(count * (100 - self.percentile) / 100)


def meets_all(slos: Iterable[Slo], sample: Sample) -> bool:
    """Whether one request met every SLO's limit."""
    return all(slo.met(sample) for slo in slos)


def every_request(**limits_ms: float) -> tuple[Slo, ...]:
    """Limits each request must meet, for goodput: `every_request(ttft=500, tpot=100)`."""
    return tuple(Slo(metric, 100, limit) for metric, limit in limits_ms.items())


def parse_slo(text: str) -> Slo:
    """`[METRIC_]pNN=DURATION`; a bare number of seconds, or with `ms`, `s`, `m`."""
    name, sep, value = text.replace(" ", "").partition("=")
    spec = _SPEC.match(name.lower())
    if not sep or spec is None:
        raise SloError(
            f"SLO {text!r}: write METRIC_pNN=DURATION or pNN=DURATION (e.g. p99=2s, ttft_p99=500ms)"
        )
    metric = spec["metric"] or "e2e"
    if metric not in METRIC_KINDS:
        raise SloError(f"SLO {text!r}: unknown metric {metric!r}; one of {', '.join(METRIC_KINDS)}")
    pct = float(spec["pct"])
    if not 0 < pct <= 100:
        raise SloError(f"SLO {text!r}: the percentile must be in (0, 100]")
    return Slo(metric, pct, parse_duration_ms(value, f"SLO {text!r}"))


def parse_duration_ms(text: str, what: str) -> float:
    found = _DURATION.match(text.strip().lower())
    if found is None or float(found["value"]) <= 0:
        raise SloError(f"{what}: {text!r} is not a positive duration (e.g. 500ms, 2s, 1.5m)")
    return float(found["value"]) * _UNIT_MS[found["unit"]]


def check_kind(slos: Iterable[Slo], kind: str) -> None:
    """Raises SloError for an SLO whose metric the kind does not have."""
    for slo in slos:
        kinds = METRIC_KINDS[slo.metric]
        if kinds is not None and kind not in kinds:
            raise SloError(
                f"SLO {slo}: {slo.metric} applies to {', '.join(sorted(kinds))} "
                f"pipelines, not to kind {kind!r}"
            )


def _ms_text(ms: float) -> str:
    return f"{ms / 1000:g}s" if ms >= 1000 else f"{ms:g}ms"
