"""Episodes in a chat template with function-schema tools (``tool_format: hermes``): the prompt carries the
tools, a call is parsed and run, its result comes back as the template's tool message, and exactly the model's
own tokens are trained."""

from __future__ import annotations

import itertools
import json
import string
from dataclasses import replace

import pytest

from m2flow.envs.text import TextEnvBatch
from m2flow.envs.text.calculator import draw_problem
from m2flow.models.chat_templates import TOOL_CHAT_TEMPLATE, template_characters
from m2flow.models.tokenizer import train_char_tokenizer
from m2flow.rewards.tools.calculator import Calculator
from m2flow.rewards.tools.schema import function_schema
from m2flow.workers.agentic import EpisodeConfig, run_episodes
from m2flow.workers.agentic.chat import ChatRenderer
from tests.workers.agentic.scripted import ALPHABET, ScriptedBackend, char_tokenizer

TOOLS = [function_schema(Calculator())]
# Printable ASCII too: the error observations are free text.
TOK = train_char_tokenizer([ALPHABET + template_characters(TOOLS) + string.printable], chat_template=TOOL_CHAT_TEMPLATE)
CFG = EpisodeConfig(tool_format="hermes", max_turns=6, max_tokens=2000, max_turn_tokens=200)


def _call(expression: str) -> str:
    return f'<tool_call>{json.dumps({"name": "calculator", "arguments": {"expression": expression}})}</tool_call>'


def _solver(context: str) -> str:
    """Calls the calculator on the problem, then copies the result (the context's special tokens are dropped)."""
    if "<tool_response>\n" in context:
        return context.rsplit("<tool_response>\n", 1)[1].split("\n</tool_response>")[0]
    return _call(context.rsplit("user\n", 1)[1].split("=")[0])


def _ids(text: str) -> list[int]:
    return TOK(text, add_special_tokens=False)["input_ids"]


def _calculator(**kwargs) -> TextEnvBatch:
    return TextEnvBatch.from_registry("calculator", 1, env_kwargs=kwargs, tool_format="hermes")


def _render(messages, generation_prompt=False) -> str:
    return TOK.apply_chat_template(messages, tools=TOOLS, add_generation_prompt=generation_prompt, tokenize=False)


@pytest.mark.parametrize("stop", [None, ()], ids=["turn-ends-at-the-call", "turn-ends-at-eos"])
def test_a_call_is_run_its_result_is_a_tool_message_and_only_the_model_tokens_are_trained(stop):
    cfg = CFG if stop is None else replace(CFG, stop=stop)
    backend = ScriptedBackend(TOK, _solver)
    (traj,), stats = run_episodes(backend, TOK, _calculator(), [7], [0], cfg)
    a, b = draw_problem(7)
    user = {"role": "user", "content": f"{a}*{b}="}
    prompt = _render([user], True)
    assert prompt.startswith("<bos>system\nYou may call a tool") and '"name": "calculator"' in prompt
    assert prompt.endswith(f"<bos>user\n{a}*{b}=<eos>\n<bos>assistant\n") and traj.prompt_ids == _ids(prompt)
    call, answer = _ids(_call(f"{a}*{b}")), _ids(str(a * b)) + [TOK.eos_token_id]
    if stop is None:  # stopped at </tool_call>: the template's end-of-turn token is written for the model, masked
        observation = f"<eos>\n<bos>user\n<tool_response>\n{a * b}\n</tool_response><eos>\n<bos>assistant\n"
    else:  # the model ended its turn itself: its <eos> is trained, and not written twice
        call = call + [TOK.eos_token_id]
        observation = f"\n<bos>user\n<tool_response>\n{a * b}\n</tool_response><eos>\n<bos>assistant\n"
    assert traj.response_ids == call + _ids(observation) + answer
    assert traj.action_mask == [1] * len(call) + [0] * len(_ids(observation)) + [1] * len(answer)
    assert traj.logprobs[: len(call)] == [-(k + 1) / 100 for k in range(len(call))]
    assert set(traj.logprobs[len(call): -len(answer)]) == {0.0}
    # Built turn by turn, the context is what the template renders for the whole conversation.
    whole = _render([user, {"role": "assistant", "content": _call(f"{a}*{b}")},
                     {"role": "tool", "content": str(a * b)}, {"role": "assistant", "content": str(a * b)}])
    assert TOK.decode(traj.prompt_ids + traj.response_ids) + "\n" == whole
    assert traj.turn_texts == [_call(f"{a}*{b}"), str(a * b)] and traj.reward == 1.0
    assert traj.finish_reason == "terminated" and stats.tool_outcomes == {"ok": 1}
    assert backend.calls[0].stop == (("</tool_call>",) if stop is None else ())


def test_each_kind_of_malformed_call_is_an_observation_and_the_episode_goes_on():
    a, b = draw_problem(3)
    turns = iter(['<tool_call>{"name": "calculator", "arguments": {</tool_call>',
                  '<tool_call>{"name": "abacus", "arguments": {"expression": "1+1"}}</tool_call>',
                  '<tool_call>{"name": "calculator", "arguments": {}}</tool_call>',
                  '<tool_call>{"name": "calculator"}</tool_call>', _call(f"{a}*{b}")])
    backend = ScriptedBackend(TOK, lambda context: next(turns, "") or _solver(context))
    (traj,), stats = run_episodes(backend, TOK, _calculator(max_calls=None), [3], [0], CFG)
    text = TOK.decode(traj.response_ids, skip_special_tokens=True)
    for error in ["error: malformed call: the call is not JSON",
                  "error: unknown tool 'abacus'; tools: calculator",
                  "error: malformed call: 'calculator' is missing argument 'expression'",
                  "error: malformed call: the call of 'calculator' has no \"arguments\""]:
        assert f"<tool_response>\n{error}" in text
    assert traj.num_turns == 6 and traj.finish_reason == "terminated" and traj.reward == 1.0
    assert stats.tool_outcomes == {"malformed": 3, "unknown": 1, "ok": 1}
    # Every error observation is masked, every model turn trained.
    spans = [(m, len(list(g))) for m, g in itertools.groupby(traj.action_mask)]
    assert [m for m, _ in spans] == [1, 0] * 5 + [1]


def test_a_task_answer_is_a_user_message():
    backend = ScriptedBackend(TOK, lambda context: "4")
    envs = TextEnvBatch.from_registry("guess_number", 1, env_kwargs={"high": 8, "max_turns": 2}, tool_format="hermes")
    (traj,), stats = run_episodes(backend, TOK, envs, [0], [0], CFG)
    # No tools: no system turn; the environment's answer is the user's next message.
    assert TOK.decode(traj.prompt_ids) == "<bos>user\nguess 1-8:<eos>\n<bos>assistant\n"
    observation = "\n<bos>user\nhigher<eos>\n<bos>assistant\n"  # the secret of seed 0 is above 4
    assert TOK.decode(traj.response_ids) == "4<eos>" + observation + "4<eos>"
    assert traj.action_mask == [1, 1] + [0] * len(_ids(observation)) + [1, 1]
    assert traj.finish_reason == "truncated" and stats.tool_outcomes == {}


def test_a_chat_format_needs_a_chat_template():
    with pytest.raises(ValueError, match="tokenizer has none"):
        run_episodes(ScriptedBackend(char_tokenizer(), _solver), char_tokenizer(), _calculator(), [0], [0], CFG)
    with pytest.raises(ValueError, match="unknown tool format 'json'"):
        EpisodeConfig(tool_format="json")


# A template shaped like the im_start/im_end family: its own turn markers (not bos/eos), a default system message
# when none is given, and tool results inside a user turn.
IM_TEMPLATE = (
    "{% if messages[0].role != 'system' %}<|im_start|>system\nBe helpful.<|im_end|>\n{% endif %}"
    "{% for m in messages %}"
    "{% if m.role == 'tool' %}<|im_start|>user\n<tool_response>{{ m.content }}</tool_response><|im_end|>\n"
    "{% else %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


def test_another_templates_turn_markers_and_default_system_message_are_rendered_turn_by_turn():
    tok = train_char_tokenizer([string.printable], chat_template=IM_TEMPLATE)
    tok.add_special_tokens({"additional_special_tokens": ["<|im_start|>", "<|im_end|>"]})
    end = tok.convert_tokens_to_ids("<|im_end|>")
    chat = ChatRenderer(tok)
    assert chat.close == "<|im_end|>\n"
    prompt = chat.prompt("6*7=", None)
    assert prompt == "<|im_start|>system\nBe helpful.<|im_end|>\n<|im_start|>user\n6*7=<|im_end|>\n<|im_start|>assistant\n"
    turn = tok("<tool_call>x</tool_call>", add_special_tokens=False)["input_ids"]
    # The model wrote its end-of-turn token: it is not written again; it did not: the closing writes it.
    ended = chat.observation("42", "tool", turn + [end])
    assert ended == "\n<|im_start|>user\n<tool_response>42</tool_response><|im_end|>\n<|im_start|>assistant\n"
    assert chat.observation("42", "tool", turn) == "<|im_end|>" + ended
    whole = tok.apply_chat_template([{"role": "user", "content": "6*7="},
                                     {"role": "assistant", "content": "<tool_call>x</tool_call>"},
                                     {"role": "tool", "content": "42"}], add_generation_prompt=True, tokenize=False)
    assert tok.decode(tok(prompt, add_special_tokens=False)["input_ids"] + turn + [end]) + ended == whole


def test_a_template_that_cannot_be_rendered_turn_by_turn_is_refused():
    drops = "{% for m in messages %}{% if m.role == 'user' %}{{ m.content }}{% endif %}{% endfor %}"
    with pytest.raises(ValueError, match="does not write an assistant message's content"):
        ChatRenderer(train_char_tokenizer([string.printable], chat_template=drops))
    # Earlier messages rendered differently once a tool message follows (here: the last assistant turn only).
    changes = ("{% for m in messages %}{% if m.role == 'assistant' and loop.last %}[{{ m.content }}]"
               "{% else %}{{ m.content }}{% endif %}{% endfor %}")
    chat = ChatRenderer(train_char_tokenizer([string.printable], chat_template=changes))
    with pytest.raises(ValueError, match="renders the earlier messages differently"):
        chat.observation("42", "tool", [])
