"""Pydantic models of the requests ``draftwise serve`` accepts (OpenAI wire format).

FastAPI validates every body against these models before a handler runs, and serves them
as the OpenAPI schema, so the schema says exactly what is accepted. Every number has
bounds; a field the server does not implement (``tools``, ``response_format``,
``logprobs``, ``n > 1``, ...) is refused, never silently ignored: the models forbid
unknown fields, and the few OpenAI fields that are declared accept only the value that
means "off". ``validation_message`` turns pydantic's errors into one sentence naming
the fields.

Example::

    >>> req = ChatRequest.model_validate({"messages": [{"role": "user", "content": "Hi"}]})
    >>> req.stream, req.n
    (False, None)
    >>> from pydantic import ValidationError
    >>> try:
    ...     ChatRequest.model_validate({"messages": [], "tools": [], "n": 2})
    ... except ValidationError as exc:
    ...     print(validation_message(exc.errors())[0])
    unsupported field: tools (draftwise serve does not implement it)
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from draftwise.session import MAX_REQUEST_BUDGET

MAX_TOKENS_CAP = 1 << 20  # no model here has a longer context; the real cap is the context
MAX_BUDGET = MAX_REQUEST_BUDGET  # draft-tree nodes a request may ask for (the server may cap lower)
MAX_TEXT = 1 << 20  # characters in one message, prompt or stop string list entry
MAX_MESSAGES = 1024
MAX_PROMPT_IDS = 1 << 17

Text = Annotated[str, Field(max_length=MAX_TEXT)]
Name = Annotated[str, Field(max_length=256)]


class _Strict(BaseModel):
    """No coercion ("5" is not 5, true is not 1) and no unknown fields."""

    model_config = ConfigDict(extra="forbid", strict=True)


class TextPart(_Strict):
    """One part of a message's content list; only text parts are supported."""

    type: Literal["text"]
    text: Text


class Message(_Strict):
    role: Literal["system", "developer", "user", "assistant"]
    content: Text | Annotated[list[TextPart], Field(max_length=MAX_MESSAGES)]
    name: Name | None = None  # accepted, not used

    def text(self) -> str:
        if isinstance(self.content, str):
            return self.content
        return "".join(p.text for p in self.content)


class StreamOptions(_Strict):
    include_usage: bool = False


class DraftwiseOptions(_Strict):
    """The ``draftwise`` extension object: which drafter, and its tree budget."""

    drafter: Annotated[str, Field(min_length=1, max_length=64)] | None = None
    budget: Annotated[int, Field(ge=0, le=MAX_BUDGET)] | None = None


Stop = (
    Annotated[str, Field(min_length=1, max_length=256)]
    | Annotated[list[Annotated[str, Field(min_length=1, max_length=256)]], Field(max_length=4)]
)
Zero = Annotated[float, Field(ge=0.0, le=0.0)]  # penalties: accepted only when off


class _Common(_Strict):
    """Fields chat and completion requests share."""

    model: Name | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    max_tokens: Annotated[int, Field(ge=1, le=MAX_TOKENS_CAP)] | None = None
    temperature: Annotated[float, Field(ge=0.0, le=2.0)] | None = None
    top_p: Annotated[float, Field(gt=0.0, le=1.0)] | None = None
    seed: Annotated[int, Field(ge=-(2**63), lt=2**64)] | None = None
    stop: Stop | None = None
    n: Literal[1] | None = None
    user: Name | None = None  # accepted, not used
    frequency_penalty: Zero | None = None
    presence_penalty: Zero | None = None
    draftwise: DraftwiseOptions | None = None


class ChatRequest(_Common):
    """``POST /v1/chat/completions``."""

    messages: Annotated[list[Message], Field(min_length=1, max_length=MAX_MESSAGES)]
    max_completion_tokens: Annotated[int, Field(ge=1, le=MAX_TOKENS_CAP)] | None = None
    logprobs: Literal[False] | None = None


PromptText = Annotated[str, Field(min_length=1, max_length=MAX_TEXT)]
PromptIds = Annotated[
    list[Annotated[int, Field(ge=0, lt=2**31)]], Field(min_length=1, max_length=MAX_PROMPT_IDS)
]


class CompletionRequest(_Common):
    """``POST /v1/completions``: one prompt, as text or token ids."""

    prompt: PromptText | PromptIds | Annotated[list[PromptText], Field(min_length=1, max_length=1)]
    logprobs: Literal[0] | None = None
    echo: Literal[False] | None = None
    best_of: Literal[1] | None = None


def _where(loc: Sequence[Any]) -> str:
    """``("body", "messages", 0, "content")`` -> ``"messages[0].content"`` (union branch
    names such as ``str`` or ``list[...]`` left out)."""
    out = ""
    for part in loc:
        if part == "body" and not out:
            continue
        if isinstance(part, int):
            out += f"[{part}]"
        elif isinstance(part, str) and ("[" in part or part in _BRANCHES):
            continue
        else:
            out += ("." if out else "") + str(part)
    return out


_BRANCHES = {"str", "int", "float", "bool", "list", "function-after", "constrained-str"}


def validation_message(errors: Sequence[Any]) -> tuple[str, str | None, str]:
    """One sentence for a list of pydantic / FastAPI errors: (message, param, code).

    Unknown fields are named together ("unsupported fields: tools, response_format");
    otherwise the first error is described with the field it concerns."""
    errs = [e for e in errors if isinstance(e, dict)]
    extra = sorted({_where(e.get("loc", ())) for e in errs if e.get("type") == "extra_forbidden"})
    if extra:
        s = "s" if len(extra) > 1 else ""
        it = "them" if s else "it"
        return (
            f"unsupported field{s}: {', '.join(extra)} (draftwise serve does not implement {it})",
            extra[0],
            "unsupported_parameter",
        )
    if not errs:
        return "invalid request", None, "invalid_value"
    e = errs[0]
    # a union (stop: text or list) reports every branch; a type mismatch names the wrong one
    same = [x for x in errs if _where(x.get("loc", ())) == _where(e.get("loc", ()))]
    e = next((x for x in same if not str(x.get("type")).endswith("_type")), e)
    if e.get("type") == "json_invalid":
        return "the request body is not valid JSON", None, "invalid_json"
    where = _where(e.get("loc", ()))
    got = e.get("input")
    shown = repr(got) if len(repr(got)) <= 80 else repr(got)[:77] + "..."
    if e.get("type") == "missing":
        return f"{where} is required", where or None, "missing_required_parameter"
    if not where:
        return f"the request body must be a JSON object: {e.get('msg', '')}", None, "invalid_json"
    rule = _RULES.get(str(e.get("type")))
    ctx = e.get("ctx") or {}
    try:
        said = rule.format(**ctx) if rule else f": {e.get('msg', 'invalid value')},"
    except (KeyError, IndexError):
        said = f": {e.get('msg', 'invalid value')},"
    return f"{where}{said} got {shown}", where, "invalid_value"


_RULES = {  # pydantic error type -> what the client reads after the field name
    "less_than_equal": " must be <= {le},",
    "less_than": " must be < {lt},",
    "greater_than_equal": " must be >= {ge},",
    "greater_than": " must be > {gt},",
    "int_type": " must be an integer,",
    "float_type": " must be a number,",
    "string_type": " must be a string,",
    "bool_type": " must be true or false,",
    "list_type": " must be a list,",
    "literal_error": " must be {expected},",
    "string_too_short": " must have at least {min_length} characters,",
    "string_too_long": " must have at most {max_length} characters,",
    "too_short": " must have at least {min_length} items,",
    "too_long": " must have at most {max_length} items,",
}
