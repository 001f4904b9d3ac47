"""Chat templates: assistant spans on multi-turn conversations, refusals stated clearly."""

from __future__ import annotations

import pytest
from support.corpus import CHATML

from rangestream.errors import BadInputError
from rangestream.ingest.chat import ChatTemplate, normalize_messages

CONVERSATION = [
    {"role": "system", "content": "be brief"},
    {"role": "user", "content": "2+2?"},
    {"role": "assistant", "content": "4"},
    {"role": "user", "content": "and 3+3?"},
    {"role": "assistant", "content": "6 ."},
]


def test_each_assistant_turn_spans_its_content_and_end_of_turn_token() -> None:
    text, spans = ChatTemplate(CHATML).assistant_spans(CONVERSATION)
    expected = (
        "<|im_start|>system\nbe brief<|im_end|>\n<|im_start|>user\n2+2?<|im_end|>\n"
        "<|im_start|>assistant\n4<|im_end|>\n<|im_start|>user\nand 3+3?<|im_end|>\n"
        "<|im_start|>assistant\n6 .<|im_end|>\n"
    )
    assert text == expected
    assert [text[a:b] for a, b in spans] == ["4<|im_end|>", "6 .<|im_end|>"]


def test_a_template_that_rewrites_earlier_turns_is_refused() -> None:
    # numbers turns from the end: the same turn renders differently as more follow
    rewriting = (
        "{% for m in messages %}"
        "{{ (messages|length - loop.index)|string + m['content'] }}"
        "{% endfor %}"
    )
    with pytest.raises(BadInputError, match="differently depending on what follows"):
        ChatTemplate(rewriting).assistant_spans(CONVERSATION)


def test_raise_exception_in_a_template_is_a_bad_input() -> None:
    strict = "{% if messages[0]['role'] != 'user' %}{{ raise_exception('user first') }}{% endif %}"
    with pytest.raises(BadInputError, match="user first"):
        ChatTemplate(strict).render(CONVERSATION)


def test_templates_run_sandboxed() -> None:
    probing = "{{ messages.__class__.__mro__ }}"
    with pytest.raises(Exception, match=r"unsafe|access"):
        ChatTemplate(probing).render(CONVERSATION)


def test_prompt_and_responses_locate_each_answer_after_the_generation_prompt() -> None:
    before, rendered = ChatTemplate(CHATML).prompt_and_responses(
        [{"role": "user", "content": "q"}], ["yes", "no"]
    )
    assert before == "<|im_start|>user\nq<|im_end|>\n<|im_start|>assistant\n"
    assert [full[a:b] for full, (a, b) in rendered] == ["yes<|im_end|>", "no<|im_end|>"]


def test_messages_are_normalized_and_unknown_roles_refused() -> None:
    got = normalize_messages(
        [{"from": "human", "value": "hi"}, {"from": "gpt", "value": "yo"}], "from", "value", "f:1"
    )
    assert got == [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]
    with pytest.raises(BadInputError, match="f:1: message 0 has unknown role 'bot'"):
        normalize_messages([{"role": "bot", "content": "x"}], "role", "content", "f:1")
    for role in (5, ["user"], {"name": "user"}):  # not text; a list is not even hashable
        with pytest.raises(BadInputError, match="f:1: message 0 has unknown role"):
            normalize_messages([{"role": role, "content": "x"}], "role", "content", "f:1")
    with pytest.raises(BadInputError, match="f:1: message 0 has no text"):
        normalize_messages([{"role": "user", "content": 3}], "role", "content", "f:1")
