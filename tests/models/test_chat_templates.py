"""The tool-aware chat template on the tokenizers built here: one token per turn marker, a lossless round trip."""

from __future__ import annotations

import string

from m2flow.models.chat_templates import TOOL_CHAT_TEMPLATE, template_characters
from m2flow.models.tokenizer import load_tokenizer, save_tokenizer, train_bpe_tokenizer, train_char_tokenizer
from m2flow.rewards.tools.calculator import Calculator
from m2flow.rewards.tools.schema import function_schema

TOOLS = [function_schema(Calculator())]
MESSAGES = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "12*34="},
            {"role": "assistant", "content": "", "tool_calls": [
                {"type": "function", "function": {"name": "calculator", "arguments": {"expression": "12*34"}}}]},
            {"role": "tool", "content": "408"}]


def test_the_template_writes_the_tools_the_calls_and_the_results():
    tok = train_char_tokenizer([string.printable + template_characters(TOOLS)], chat_template=TOOL_CHAT_TEMPLATE)
    text = tok.apply_chat_template(MESSAGES, tools=TOOLS, add_generation_prompt=True, tokenize=False)
    schema = '{"type": "function", "function": {"name": "calculator", "description": "exact arithmetic: numbers, ' \
             '+ - * / // % ** and parentheses", "parameters": {"type": "object", "required": ["expression"], ' \
             '"properties": {"expression": {"type": "string", "description": "an arithmetic expression, e.g. 123*456"}}}}}'
    assert text == (
        "<bos>system\nBe brief.\nYou may call a tool; one call per turn. Tools:\n<tools>\n" + schema + "\n</tools>\n"
        'Call one as <tool_call>{"name": NAME, "arguments": {ARGUMENTS}}</tool_call>; the result comes back in '
        "<tool_response></tool_response>.<eos>\n"
        "<bos>user\n12*34=<eos>\n"
        '<bos>assistant\n<tool_call>{"name": "calculator", "arguments": {"expression": "12*34"}}</tool_call><eos>\n'
        "<bos>user\n<tool_response>\n408\n</tool_response><eos>\n"
        "<bos>assistant\n")
    ids = tok(text, add_special_tokens=False)["input_ids"]
    assert tok.unk_token_id not in ids and tok.decode(ids) == text
    assert ids.count(tok.bos_token_id) == 5 and ids.count(tok.eos_token_id) == 4  # each marker one token
    # Without tools or a system message there is no system turn.
    assert tok.apply_chat_template(MESSAGES[1:2], add_generation_prompt=False, tokenize=False) == "<bos>user\n12*34=<eos>\n"


def test_a_bpe_tokenizer_carries_the_template_through_save_and_load(tmp_path):
    tok = train_bpe_tokenizer([string.printable, "12*34=408"], vocab_size=300, chat_template=TOOL_CHAT_TEMPLATE)
    loaded = load_tokenizer(save_tokenizer(tok, tmp_path / "tok"))
    text = loaded.apply_chat_template(MESSAGES, tools=TOOLS, add_generation_prompt=True, tokenize=False)
    assert text == tok.apply_chat_template(MESSAGES, tools=TOOLS, add_generation_prompt=True, tokenize=False)
    assert loaded.decode(loaded(text, add_special_tokens=False)["input_ids"]) == text
