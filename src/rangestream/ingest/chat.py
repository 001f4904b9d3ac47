"""Chat templates: messages to text, and where each assistant turn lies in that text.

Templates are Jinja, as in ``transformers`` (``tokenizer_config.json``'s ``chat_template``),
rendered in a sandbox (a template is data: it cannot reach Python objects) with the same
settings transformers uses (``trim_blocks``, ``lstrip_blocks``, ``raise_exception``).

The loss mask comes from *prefix rendering*: for assistant turn ``k``, the text before it
is the conversation up to ``k`` rendered with the generation prompt (it ends where the
model starts answering), and the text through it is the conversation up to and including
``k``. What the second adds to the first, less trailing whitespace (the separator before
the next turn), is the assistant's: its content and the template's end-of-turn token. It
is correct for any number of turns as long as the template renders a conversation's start
the same whatever follows; a template that does not (one that rewrites earlier turns) is
refused with a clear error rather than masked wrongly.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from typing import Any

from rangestream.errors import BadInputError

__all__ = ["KNOWN_ROLES", "ROLE_ALIASES", "ChatTemplate"]

KNOWN_ROLES = frozenset({"system", "user", "assistant", "tool"})
#: ShareGPT-style role names, accepted as their standard equivalents.
ROLE_ALIASES = {"human": "user", "gpt": "assistant", "model": "assistant"}


@functools.lru_cache(maxsize=8)
def _compile(source: str) -> Any:
    from jinja2 import TemplateError
    from jinja2.ext import loopcontrols
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def raise_exception(message: str) -> None:
        raise TemplateError(message)

    environment = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols]
    )
    environment.globals["raise_exception"] = raise_exception
    return environment.from_string(source)


class ChatTemplate:
    """A Jinja chat template and the special-token strings it may refer to.

    Parameters
    ----------
    source
        The template text (``{% for message in messages %}...``).
    variables
        Extra template variables, e.g. ``{"bos_token": "<s>", "eos_token": "</s>"}``.
    """

    def __init__(
        self, source: str, variables: Mapping[str, Any] | None = None, origin: str | None = None
    ) -> None:
        if not isinstance(source, str) or not source.strip():
            raise ValueError("a chat template is a non-empty Jinja string")
        self.source = source
        self.variables = dict(variables or {})
        #: The file the template came from, named by its errors.
        self.origin = origin

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.source, self.variables, self.origin))

    def render(
        self, messages: Sequence[Mapping[str, Any]], add_generation_prompt: bool = False
    ) -> str:
        """The conversation as text, as the model sees it."""
        from jinja2 import TemplateError

        try:
            return str(
                _compile(self.source).render(
                    messages=list(messages),
                    add_generation_prompt=add_generation_prompt,
                    **self.variables,
                )
            )
        except (TemplateError, Exception) as error:  # a template may raise anything
            named = f"the chat template {self.origin}" if self.origin else "the chat template"
            detail = str(error) if isinstance(error, TemplateError) else repr(error)
            raise BadInputError(f"{named} failed: {detail}") from error

    def assistant_spans(
        self, messages: Sequence[Mapping[str, Any]]
    ) -> tuple[str, list[tuple[int, int]]]:
        """The rendered conversation and the ``[start, stop)`` characters of each assistant turn."""
        text = self.render(messages)
        spans = []
        for index, message in enumerate(messages):
            if message["role"] != "assistant":
                continue
            before = self.render(messages[:index], add_generation_prompt=True)
            through = self.render(messages[: index + 1])
            if not (through.startswith(before) and text.startswith(through)):
                raise BadInputError(
                    f"the chat template renders turn {index} differently depending on what "
                    "follows it, so the assistant's tokens cannot be located"
                )
            stop = max(len(before), len(through.rstrip()))
            if stop > len(before):
                spans.append((len(before), stop))
        return text, spans

    def prompt_and_responses(
        self, prompt: Sequence[Mapping[str, Any]], responses: Sequence[str]
    ) -> tuple[str, list[tuple[str, tuple[int, int]]]]:
        """The prompt rendered for generation, and each response appended to it as an
        assistant turn: ``(full text, (start, stop) of the response's characters)``."""
        before = self.render(prompt, add_generation_prompt=True)
        out = []
        for response in responses:
            full = self.render([*prompt, {"role": "assistant", "content": response}])
            if not full.startswith(before):
                raise BadInputError(
                    "the chat template renders the prompt differently once an answer "
                    "follows it, so the answer's tokens cannot be located"
                )
            out.append((full, (len(before), max(len(before), len(full.rstrip())))))
        return before, out


def normalize_messages(
    value: Any, role_field: str, content_field: str, where: str
) -> list[dict[str, str]]:
    """``value`` as ``[{"role", "content"}]`` with known roles, or ``BadInputError``."""
    if not isinstance(value, (list, tuple)) or not value:
        raise BadInputError(f"{where}: messages must be a non-empty list, got {_short(value)}")
    out = []
    for number, message in enumerate(value):
        if not isinstance(message, Mapping):
            raise BadInputError(f"{where}: message {number} is not an object: {_short(message)}")
        role = message.get(role_field)
        content = message.get(content_field)
        role = ROLE_ALIASES.get(role, role) if isinstance(role, str) else role
        # a role that is not text is unknown (a list or dict is not even hashable)
        if not isinstance(role, str) or role not in KNOWN_ROLES:
            raise BadInputError(
                f"{where}: message {number} has unknown role {_short(message.get(role_field))} "
                f"(known: {', '.join(sorted(KNOWN_ROLES))}, or {', '.join(ROLE_ALIASES)})"
            )
        if not isinstance(content, str):
            raise BadInputError(f"{where}: message {number} has no text in field {content_field!r}")
        out.append({"role": role, "content": content})
    return out


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."
