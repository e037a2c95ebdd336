"""Which candidates to measure, and which one won.

By default a hill-climb: measure the config as it is (the candidate to beat) and its
nearest point in the space, then the neighbours of the best so far (one step on one
knob), moving while a neighbour does better; `exhaustive` measures the whole grid, and so
does a space of at most `SMALL_GRID` points (a climb costs about as much there, and one
noisy step can stop it short of a winner two steps away, as a TTS climb once stopped
short of `instances = 2, threads = 1`). Each
candidate is measured `repeats` times, the repeats of a round taking turns with the
other candidates of that round (so that a slow spell on a shared machine spreads over
all of them). A winner is called only when its worst repeat beats the current config's
best; closer than that it is inside the noise, and said so.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from tuning.measure import Measurement
from tuning.space import Candidate, Space, key

SMALL_GRID = 6
"""A space this small is measured whole."""
SINGLE_RUN_MARGIN = 1.10
"""With one repeat (spread unknown), a winner must beat the current config by this."""


@dataclass
class Stats:
    knobs: Candidate
    runs: list[Measurement] = field(default_factory=list)

    @property
    def measured(self) -> list[Measurement]:
        return [m for m in self.runs if m.failed is None]

    @property
    def failed(self) -> str | None:
        """Why, when every run of it failed."""
        if self.runs and not self.measured:
            return self.runs[-1].failed
        return None

    @property
    def goodputs(self) -> list[float]:
        return [m.goodput for m in self.measured]

    @property
    def median(self) -> float:
        return statistics.median(self.goodputs) if self.goodputs else 0.0

    @property
    def spread(self) -> tuple[float, float]:
        values = self.goodputs or [0.0]
        return min(values), max(values)


@dataclass
class Outcome:
    stats: list[Stats]
    base: Stats
    best: Stats | None
    """The highest median goodput measured (None when nothing met the SLOs)."""
    winner: Stats | None
    """`best`, where it beats the current config beyond the noise."""
    verdict: str
    budget_ran_out: bool
    elapsed_s: float


Measure = Callable[[Candidate, int], Measurement]
Progress = Callable[[str, Stats | None], None]


class Tuner:
    def __init__(
        self,
        space: Space,
        measure: Measure,
        *,
        repeats: int = 2,
        budget_s: float = 1200.0,
        exhaustive: bool = False,
        progress: Progress | None = None,
    ) -> None:
        self.space = space
        self.measure = measure
        self.repeats = repeats
        self.budget_s = budget_s
        self.exhaustive = exhaustive
        self.progress = progress or (lambda _line, _best: None)
        self.stats: dict[str, Stats] = {}
        self.started = 0.0
        self.out_of_time = False

    def run(self) -> Outcome:
        self.started = time.monotonic()
        base = self.space.base
        if self.exhaustive or self.space.size <= SMALL_GRID:
            self.evaluate([base, *self.space.grid()])
        else:
            self.climb(base)
        return self.outcome(self.stats[key(base)])

    def climb(self, base: Candidate) -> None:
        start = self.space.snap(base)
        self.evaluate([base, start])
        current = start if self.stats[key(start)].median > self.stats[key(base)].median else base
        current = self.space.snap(current)
        while not self.out_of_time:
            around = self.space.neighbours(current)
            fresh = [c for c in around if key(c) not in self.stats]
            if not fresh:
                break
            self.evaluate(fresh)
            best = max([current, *around], key=lambda c: self._median(c))
            if self._median(best) <= self._median(current):
                break
            current = best

    def evaluate(self, candidates: list[Candidate]) -> None:
        """Measure each (unmeasured) candidate `repeats` times, rounds taking turns."""
        todo: list[Candidate] = []
        for candidate in candidates:
            if key(candidate) not in self.stats and key(candidate) not in {key(c) for c in todo}:
                todo.append(candidate)
        for stats in (Stats(c) for c in todo):
            self.stats[key(stats.knobs)] = stats
        for repeat in range(self.repeats):
            turn = todo[repeat % len(todo) :] + todo[: repeat % len(todo)] if todo else []
            for candidate in turn:
                stats = self.stats[key(candidate)]
                if repeat and stats.failed:
                    continue  # it did not start once: it will not now
                if time.monotonic() - self.started > self.budget_s:
                    self.out_of_time = True
                    return
                run_of = f"run {repeat + 1} of {self.repeats}"
                self.progress(f"measuring {key(candidate)}, {run_of}", self._best())
                run = self.measure(candidate, repeat)
                stats.runs.append(run)
                said = run.failed or f"goodput {run.goodput:.2f}/s"
                self.progress(f"measured {key(candidate)}: {said}", self._best())

    def outcome(self, base: Stats) -> Outcome:
        ranked = sorted(self.stats.values(), key=lambda s: s.median, reverse=True)
        best = ranked[0] if ranked and ranked[0].median > 0 else None
        winner, verdict = None, ""
        if best is None:
            verdict = "no candidate met the SLOs at any load level"
        elif best is base or key(best.knobs) == key(base.knobs):
            verdict = "the current config is the best measured"
        elif len(best.goodputs) >= 2 and len(base.goodputs) >= 2:
            if best.spread[0] > base.spread[1]:
                winner = best
                verdict = (
                    "a winner beyond the noise (its worst run beats the current config's best)"
                )
            else:
                verdict = (
                    "no clear winner: the best candidate's runs overlap the current config's "
                    "(inside the noise)"
                )
        elif base.median == 0 or best.median > base.median * SINGLE_RUN_MARGIN:
            winner = best
            verdict = (
                f"a winner by more than {SINGLE_RUN_MARGIN - 1:.0%} (one run each: spread unknown)"
            )
        else:
            verdict = "no clear winner (one run each, within 10 %)"
        return Outcome(
            ranked, base, best, winner, verdict, self.out_of_time,
            time.monotonic() - self.started,
        )  # fmt: skip

    def _median(self, candidate: Candidate) -> float:
        stats = self.stats.get(key(candidate))
        return stats.median if stats is not None else -1.0

    def _best(self) -> Stats | None:
        measured = [s for s in self.stats.values() if s.measured]
        return max(measured, key=lambda s: s.median) if measured else None
