"""Chat templates written for the tokenizers built here (``tokenizer.py``), so a tiny model speaks a chat format
with tools offline, as an instruct model does with its own.

``TOOL_CHAT_TEMPLATE`` is shaped like the Hermes/Qwen templates: turns ``<bos>ROLE\\nTEXT<eos>\\n``, the tools'
function schemas listed in a system turn, calls written as ``<tool_call>{"name": ..., "arguments": {...}}
</tool_call>`` (``rewards/tools/formats.py``, format ``hermes``) and tool results given back in a user turn as
``<tool_response>\\nTEXT\\n</tool_response>``. It deviates on purpose in one point: a turn opens with the
tokenizer's ``bos_token`` and ends with its ``eos_token`` instead of ``<|im_start|>``/``<|im_end|>``, which a
tokenizer built here does not have; so every turn marker is one token, and a model ends its turn with the
end-of-sequence token that generation stops at.
"""

from __future__ import annotations

import json
from typing import Any

TOOL_CHAT_TEMPLATE = (
    # No whitespace control: the template has no incidental whitespace, and each newline it writes is a literal
    # after an expression or inside {{ '\n' }} (Hugging Face renders with trim_blocks, which drops a newline
    # right after a block tag).
    "{% set ns = namespace(first=0) %}"
    "{% if messages and messages[0].role == 'system' %}{% set ns.first = 1 %}{% endif %}"
    "{% if tools or ns.first %}"
    "{{ bos_token }}system"
    "{% if ns.first %}{{ '\\n' + messages[0].content }}{% endif %}"
    "{% if tools %}"
    "{{ '\\n' }}You may call a tool; one call per turn. Tools:{{ '\\n' }}<tools>"
    "{% for tool in tools %}{{ '\\n' }}{{ tool | tojson }}{% endfor %}"
    "{{ '\\n' }}</tools>{{ '\\n' }}"
    "Call one as <tool_call>{\"name\": NAME, \"arguments\": {ARGUMENTS}}</tool_call>; "
    "the result comes back in <tool_response></tool_response>."
    "{% endif %}"
    "{{ eos_token + '\\n' }}"
    "{% endif %}"
    "{% for message in messages[ns.first:] %}"
    "{% if message.role == 'tool' %}"
    "{{ bos_token }}user{{ '\\n' }}<tool_response>{{ '\\n' + message.content + '\\n' }}</tool_response>"
    "{{ eos_token + '\\n' }}"
    "{% elif message.role == 'assistant' %}"
    "{{ bos_token }}assistant{{ '\\n' }}{{ message.content or '' }}"
    "{% for call in message.tool_calls or [] %}"
    "{% set fn = call.function if call.function is defined else call %}"
    "<tool_call>{\"name\": {{ fn.name | tojson }}, \"arguments\": "
    "{{ fn.arguments if fn.arguments is string else fn.arguments | tojson }}}</tool_call>"
    "{% endfor %}"
    "{{ eos_token + '\\n' }}"
    "{% else %}"
    "{{ bos_token + message.role + '\\n' + message.content + eos_token + '\\n' }}"
    "{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ bos_token + 'assistant\\n' }}{% endif %}"
)
"""A Hermes/Qwen-like template with tools, over a tokenizer's own ``bos_token`` and ``eos_token``."""


def template_characters(tools: list[dict[str, Any]] | None = None) -> str:
    """Every character the template writes around the messages (the tools' schemas included), for the
    alphabet of a character tokenizer that is to carry it (``train_char_tokenizer``)."""
    fixed = ("system\nuser\nassistant\ntool\nYou may call a tool; one call per turn. Tools:\n<tools>\n</tools>\n"
             "Call one as <tool_call>{\"name\": NAME, \"arguments\": {ARGUMENTS}}</tool_call>; the result comes back "
             "in <tool_response>\n</tool_response>.")
    schemas = "".join(json.dumps(t) for t in tools or [])
    return "".join(sorted(set(fixed + schemas)))
