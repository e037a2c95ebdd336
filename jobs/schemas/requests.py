"""The base of OpenAI's requests, as mmq validates them (vLLM's
`vllm/entrypoints/openai/protocol.py`): a request model, or a part of one, keeps what it
does not define aside only to refuse it by name. The OpenAI routes' requests are built on
it (`api.openai.protocol` re-exports it), and so is the `llm` job's input, which is
OpenAI's chat or completions body (`jobs.schemas.llm`).

```
OpenAIBaseModel      a request, or a part of one: an unknown field is kept aside to be refused
 └── OpenAIRequest   a whole request: refused as it is validated (422 naming the field)
```

Nothing a client sends is dropped without a word: a field that a request model does not
define is refused with a 422 naming it (`messages.0.name`) and saying why
(`not_carried`, or that mmq does not know it). A client that sent tools or a JSON format
and got a 200 would believe it got them.
"""

from __future__ import annotations

import functools
import typing
from collections.abc import Mapping
from typing import ClassVar, Self

from pydantic import BaseModel, ConfigDict, model_validator
from pydantic.json_schema import JsonSchemaValue

from jobs.errors import InputError

CLOSED: JsonSchemaValue = {"additionalProperties": False}
"""`json_schema_extra` of a request model: it keeps what it does not define aside
(`extra="allow"`) only to refuse it by name, so its schema says no other field is taken."""
UNKNOWN = "not a field of this request that mmq knows"
REF_TEMPLATE = "#/components/schemas/{model}"


class OpenAIBaseModel(BaseModel):
    """A request of an OpenAI route, or a part of one (a message, a content part)."""

    model_config = ConfigDict(
        extra="allow", json_schema_extra=CLOSED, use_attribute_docstrings=True
    )

    not_carried: ClassVar[Mapping[str, str]] = {}
    """OpenAI's fields of this model that mmq does not carry, with why."""

    def refuse_not_carried(self, where: str = "") -> None:
        """InputError (422) naming the first thing here that mmq would not carry: a value
        (`refuse_values`), then a field this model does not define, then the same in each
        part of it that is a request model too, in field order. `where` prefixes the name
        (`messages.0.`)."""
        self.refuse_values(where)
        for name in self.model_extra or {}:
            raise InputError(f"{where}{name}", self.not_carried.get(name, UNKNOWN))
        for name in _nested(type(self)):
            value = getattr(self, name)
            if isinstance(value, OpenAIBaseModel):
                value.refuse_not_carried(f"{where}{name}.")
            elif isinstance(value, list):
                for i, item in enumerate(value):
                    if isinstance(item, OpenAIBaseModel):
                        item.refuse_not_carried(f"{where}{name}.{i}.")

    def refuse_values(self, where: str) -> None:
        """InputError for a value of this model's fields that mmq does not serve (a content
        part's type); none by default."""


class OpenAIRequest(OpenAIBaseModel):
    """A whole request body (or form): what it does not carry is refused as it is
    validated, after its fields are (a route never sees such a request)."""

    @model_validator(mode="after")
    def _refuse_not_carried(self) -> Self:
        # Pydantic makes a validation error of a ValueError only: an InputError leaves the
        # validation (and FastAPI's) as it is, and its handler answers the 422 naming the
        # field (`api.error_handlers`), as for an InputError a route raises.
        self.refuse_not_carried()
        return self


@functools.cache
def _nested(model: type[BaseModel]) -> tuple[str, ...]:
    """The fields of `model` whose values may hold request models (a message, a part), in
    field order: the others (numbers, texts, a tool's JSON schema) are not walked."""
    return tuple(
        name for name, field in model.model_fields.items() if _holds_request(field.annotation)
    )


def _holds_request(annotation: object) -> bool:
    if isinstance(annotation, type) and issubclass(annotation, OpenAIBaseModel):
        return True
    return any(_holds_request(arg) for arg in typing.get_args(annotation))
