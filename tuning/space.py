"""The knobs `mmq tune` may turn, the values it tries, and the candidates they make.

A knob is a field of `[pipelines.NAME]` (`max_batch`, `max_wait_ms`, `runners`,
`concurrency`, `instances`) or a number among its `options`: a field of the kind's options
model (`jobs.schemas.OPTIONS_MODELS`: `options.max_inflight`, the LLM's engine knobs
`options.max_num_seqs`, `options.max_num_batched_tokens`, `options.gpu_memory_utilization`,
`options.stream_interval`;
TTS `options.threads`; ASR `options.cpu_threads`, `options.num_workers`...), whose type
and bounds a value must meet; for a kind of the user's own, any option its config sets.
Each kind has a default space; `--knob NAME=V1,V2,...` widens or narrows one knob,
`--fix NAME=V` pins it. A knob left out of the space keeps the config's value.
"""

from __future__ import annotations

import itertools
import operator
import types
import typing
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field

import annotated_types
from pydantic.fields import FieldInfo

from jobs.schemas import OPTIONS_MODELS
from jobs.settings import PipelineConfig, on_gpu

Value = int | float
Candidate = dict[str, Value]
"""Knob -> value; every knob of the space has one."""

ENGINE_KNOBS = ("max_batch", "max_wait_ms", "runners", "concurrency", "instances")
UNSET = 0
"""A knob's value in the config's own candidate where the config leaves the option unset
(the engine's own choice, e.g. vLLM's `max_num_seqs`): `apply` leaves it unset."""

DEFAULT_SPACES: dict[str, dict[str, list[Value]]] = {
    "asr": {"max_batch": [1, 2, 4, 8], "max_wait_ms": [0, 10, 50], "runners": [1, 2]},
    "tts": {"instances": [1, 2], "options.threads": [0, 1]},
    "image": {"max_batch": [1, 2, 4], "max_wait_ms": [0, 50, 200]},
    "llm": {"options.max_inflight": [4, 8, 16, 32]},
    "embed": {"max_batch": [1, 8, 32], "max_wait_ms": [0, 5, 20]},
    "rerank": {"max_batch": [1, 8, 32], "max_wait_ms": [0, 5, 20]},
}
"""The values tried for each kind unless told otherwise."""
GENERIC_SPACE: dict[str, list[Value]] = {"max_batch": [1, 2, 4, 8], "max_wait_ms": [0, 20, 100]}
"""For a kind of the user's own."""
VLLM_SPACE: dict[str, list[Value]] = {
    "options.max_num_seqs": [64, 128, 256],
    "options.max_num_batched_tokens": [2048, 8192],
    "options.gpu_memory_utilization": [0.85, 0.92],
    "options.stream_interval": [1, 4],
}
"""Added to the LLM space where the engine is vLLM (on a GPU; on the CPU, where its
cache is sized from memory, without `gpu_memory_utilization`): each point restarts it."""


class KnobError(ValueError):
    """An unknown knob, or a value it cannot take."""


@dataclass
class Space:
    knobs: dict[str, list[Value]]
    """Each knob's values, in order (neighbours are adjacent)."""
    base: Candidate
    """The config's own value of every knob: the candidate to beat."""
    notes: list[str] = field(default_factory=list)

    def grid(self) -> Iterator[Candidate]:
        names = list(self.knobs)
        for values in itertools.product(*(self.knobs[n] for n in names)):
            yield dict(zip(names, values, strict=True))

    @property
    def size(self) -> int:
        count = 1
        for values in self.knobs.values():
            count *= len(values)
        return count

    def snap(self, candidate: Candidate) -> Candidate:
        """`candidate` with each value moved to the nearest value of its knob."""
        return {
            name: min(values, key=lambda v: abs(float(v) - float(candidate[name])))
            for name, values in self.knobs.items()
        }

    def neighbours(self, candidate: Candidate) -> list[Candidate]:
        """Candidates one step away on one knob."""
        out = []
        for name, values in self.knobs.items():
            at = values.index(candidate[name])
            for step in (-1, 1):
                if 0 <= at + step < len(values):
                    out.append({**candidate, name: values[at + step]})
        return out


def key(candidate: Mapping[str, Value]) -> str:
    """A candidate as text: `max_batch=4 max_wait_ms=10`."""
    return " ".join(f"{name}={_text(value)}" for name, value in candidate.items())


def build_space(
    kind: str,
    config: PipelineConfig,
    widen: Mapping[str, Sequence[Value]],
    fix: Mapping[str, Value],
) -> Space:
    """The kind's default space, with `widen`'s knobs set to their values and `fix`'s
    pinned; raises KnobError for a knob this pipeline does not have."""
    knobs: dict[str, list[Value]] = {
        name: list(values) for name, values in DEFAULT_SPACES.get(kind, GENERIC_SPACE).items()
    }
    if kind == "llm" and str(config.options.get("engine", "")) == "vllm":
        knobs.update({name: list(values) for name, values in VLLM_SPACE.items()})
        if not on_gpu(config.device):  # vLLM's CPU build sizes its cache from mmq's sizing
            del knobs["options.gpu_memory_utilization"]
    for name, values in widen.items():
        check_knob(kind, config, name)
        knobs[name] = sorted({_typed(name, v, knob_field(kind, name)) for v in values})
    for name, value in fix.items():
        check_knob(kind, config, name)
        knobs[name] = [_typed(name, value, knob_field(kind, name))]
    base = {name: current_value(kind, config, name) for name in knobs}
    for name, value in base.items():
        if value not in knobs[name]:  # the config's own value is always a candidate
            knobs[name] = sorted({*knobs[name], value}) if name not in fix else knobs[name]
    space = Space(knobs, base)
    if "concurrency" not in knobs:
        space.notes.append(
            "concurrency follows max_batch x runners where the config's is lower "
            "(a worker never holds fewer requests than one batch per runner)"
        )
    return space


def knob_field(kind: str, name: str) -> FieldInfo | None:
    """The field that knob `name` sets: `PipelineConfig`'s, or the kind's options model's;
    None for an option of a kind without one (any number goes)."""
    if name in ENGINE_KNOBS:
        return PipelineConfig.model_fields[name]
    model = OPTIONS_MODELS.get(kind)
    return None if model is None else model.model_fields.get(name.removeprefix("options."))


def option_knobs(kind: str, config: PipelineConfig) -> list[str]:
    """The options that are knobs: the numbers of the kind's options model, or every option
    the config of a kind of the user's own sets."""
    model = OPTIONS_MODELS.get(kind)
    if model is None:
        return sorted(config.options)
    return sorted(n for n, f in model.model_fields.items() if _number_type(f) is not None)


def check_knob(kind: str, config: PipelineConfig, name: str) -> None:
    if name in ENGINE_KNOBS:
        return
    options = option_knobs(kind, config)
    if name.startswith("options.") and name.removeprefix("options.") in options:
        return
    choices = [*ENGINE_KNOBS, *(f"options.{o}" for o in options)]
    raise KnobError(f"unknown knob {name!r} for a {kind} pipeline; one of {', '.join(choices)}")


def current_value(kind: str, config: PipelineConfig, name: str) -> Value:
    """The knob's value in `config`: an option it does not set has its model's default;
    `UNSET` where that is unset too (the engine chooses), or for a kind without a model."""
    field_info = knob_field(kind, name)
    if name in ENGINE_KNOBS:
        value = getattr(config, name)
    else:
        option = name.removeprefix("options.")
        default = field_info.default if field_info is not None else None
        value = config.options.get(option, default)
    return UNSET if value is None else _typed(name, value, field_info)


def apply(config: PipelineConfig, candidate: Mapping[str, Value], follow: bool) -> PipelineConfig:
    """`config` with the candidate's knobs; with `follow`, concurrency rises to at least
    max_batch x runners."""
    fields = {n: v for n, v in candidate.items() if n in ENGINE_KNOBS}
    options = dict(config.options)
    for name, value in candidate.items():
        if name not in fields:
            option = name.removeprefix("options.")
            if value == UNSET and option not in config.options:
                continue  # the config's own: left unset
            options[option] = value
    updated = config.model_copy(update={**fields, "options": options})
    if follow:
        floor = updated.max_batch * updated.runners
        if updated.concurrency < floor:
            updated = updated.model_copy(update={"concurrency": floor})
    return updated


def parse_assignment(text: str, many: bool) -> tuple[str, list[Value]]:
    """`NAME=V1,V2` (or `NAME=V` where not `many`)."""
    name, sep, values = text.replace(" ", "").partition("=")
    if not sep or not name or not values:
        form = "NAME=V1,V2,..." if many else "NAME=VALUE"
        raise KnobError(f"{text!r}: write {form}")
    parts = values.split(",")
    if not many and len(parts) > 1:
        raise KnobError(f"{text!r}: --fix takes one value; use --knob for several")
    engine = PipelineConfig.model_fields.get(name) if name in ENGINE_KNOBS else None
    return name, [_typed(name, p, engine) for p in parts]


def _number_type(field_info: FieldInfo) -> type[int] | type[float] | None:
    """int or float where the field holds one (or None), else None."""
    annotation: object = field_info.annotation
    if isinstance(annotation, types.UnionType) or typing.get_origin(annotation) is typing.Union:
        rest = [a for a in typing.get_args(annotation) if a is not type(None)]
        annotation = rest[0] if len(rest) == 1 else None
    if annotation is int:
        return int
    return float if annotation is float else None


def _typed(name: str, value: object, field_info: FieldInfo | None = None) -> Value:
    """`value` as the knob's number: a whole one where its field is an int, within the
    field's bounds; any non-negative number where the field is unknown."""
    try:
        number = float(str(value))
    except ValueError:
        raise KnobError(f"knob {name}: {value!r} is not a number") from None
    if number < 0:
        raise KnobError(f"knob {name}: {value!r} is negative")
    for bound in field_info.metadata if field_info is not None else []:
        _check_bound(name, value, number, bound)
    if field_info is not None and _number_type(field_info) is int:
        if number != int(number):
            raise KnobError(f"knob {name}: {value!r} is not a whole number")
        return int(number)
    return int(number) if number == int(number) else number


_BOUNDS = (
    (annotated_types.Ge, "ge", operator.ge, ">="),
    (annotated_types.Gt, "gt", operator.gt, ">"),
    (annotated_types.Le, "le", operator.le, "<="),
    (annotated_types.Lt, "lt", operator.lt, "<"),
)


def _check_bound(name: str, value: object, number: float, bound: object) -> None:
    """KnobError where `number` breaks `bound` (one of a pydantic field's constraints)."""
    for kind, attr, holds, sign in _BOUNDS:
        if isinstance(bound, kind):
            limit = float(getattr(bound, attr))
            if not holds(number, limit):
                raise KnobError(f"knob {name}: {value!r} must be {sign} {limit:g}")


def _text(value: Value) -> str:
    return f"{value:g}" if isinstance(value, float) else str(value)
