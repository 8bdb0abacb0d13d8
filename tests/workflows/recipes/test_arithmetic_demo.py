"""The arithmetic demo recipe: its reward, its schedule, its GRPO step, and that RL improves held-out accuracy."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from m2flow.backends.generation import HFGenerationBackend
from m2flow.data.batch import Response
from m2flow.workflows.recipes.arithmetic_demo import (
    ArithmeticDemoRecipe,
    arithmetic_reward,
    build_demo_model,
    demonstrations,
    grpo_step,
    run_local_grpo,
    supervised,
    train_grpo,
    warmup_schedule,
)

torch.set_num_threads(1)


def _resp(text: str, finish: str = "stop") -> Response:
    return Response(token_ids=[0] * (len(text) + 1), logprobs=[0.0] * (len(text) + 1), finish_reason=finish, text=text)


def test_reward_is_exact_answer_then_end_of_sequence():
    assert arithmetic_reward(_resp("19"), "19") == 1.0
    assert arithmetic_reward(_resp("18"), "19") == 0.0
    assert arithmetic_reward(_resp("190"), "19") == 0.0
    # Right digits but no end-of-sequence within the budget: not an answer.
    assert arithmetic_reward(_resp("19", finish="length"), "19") == 0.0


def test_digit_credit_pays_a_share_of_right_digits_in_same_length_answers():
    assert arithmetic_reward(_resp("18"), "19", digit_credit=0.5) == pytest.approx(0.25)
    assert arithmetic_reward(_resp("109"), "119", digit_credit=0.3) == pytest.approx(0.2)
    assert arithmetic_reward(_resp("1"), "19", digit_credit=0.5) == 0.0
    assert arithmetic_reward(_resp("19"), "19", digit_credit=0.5) == 1.0


def test_warmup_schedule_rises_linearly_then_holds():
    param = torch.nn.Parameter(torch.zeros(1))
    opt = torch.optim.SGD([param], lr=1.0)
    sched = warmup_schedule(opt, 4)
    lrs = []
    for _ in range(6):
        lrs.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    assert lrs == pytest.approx([0.25, 0.5, 0.75, 1.0, 1.0, 1.0])


def test_recipe_defaults_are_valid_and_bad_values_fail_naming_the_field():
    ArithmeticDemoRecipe().validate()
    for field, value in [("grpo_steps", -1), ("sft_steps", -5), ("group_size", 1), ("slip_rate", 1.5),
                         ("lr", 0.0), ("eval_size", 0)]:
        with pytest.raises(ValueError, match=field):
            dataclasses.replace(ArithmeticDemoRecipe(), **{field: value}).validate()
    with pytest.raises(ValueError, match="operator"):
        dataclasses.replace(ArithmeticDemoRecipe(), operators=("/",)).validate()


def test_demonstrations_slip_at_the_set_rate_and_only_where_a_carry_or_borrow_exists():
    recipe = ArithmeticDemoRecipe(slip_rate=0.7)
    task = recipe.task()
    demos = demonstrations(recipe, 2000, seed=3)
    right = task.sample("train", 2000, seed=3, unique=False)
    assert [d["prompt"] for d in demos] == [r["prompt"] for r in right]
    slips = [task.write(task.slip(*task.parse(r["prompt"]))) for r in right]
    differs = [s != r["answer"] for s, r in zip(slips, right)]
    wrong = [d["answer"] != r["answer"] for d, r in zip(demos, right)]
    # A wrong demonstration is always the slip; problems without carries are never wrong.
    assert all(d["answer"] == s for d, s, w in zip(demos, slips, wrong) if w)
    assert not any(w for w, d in zip(wrong, differs) if not d)
    rate = sum(wrong) / sum(differs)
    assert 0.66 < rate < 0.74, rate


def test_supervised_steps_lower_the_loss_and_report_each_step():
    recipe = _tiny_recipe(sft_lr=3e-3, sft_batch_size=16)
    model, tok = build_demo_model(recipe)
    examples = [{"prompt": "12+07=", "answer": "91"}, {"prompt": "30+41=", "answer": "17"}]
    seen = []
    first = supervised(model, tok, examples, recipe, steps=1, seed=0)
    last = supervised(model, tok, examples, recipe, steps=30, seed=0, on_step=lambda s, loss: seen.append(s))
    assert seen == list(range(1, 31))
    assert last < first / 2, (first, last)
    assert not model.training


def _tiny_recipe(**kw) -> ArithmeticDemoRecipe:
    base = dict(hidden_size=32, num_layers=1, num_heads=2, intermediate_size=64, prompts_per_step=8, group_size=8,
                lr_warmup_steps=1, threads=1)
    return dataclasses.replace(ArithmeticDemoRecipe(), **{**base, **kw})


def test_grpo_step_without_signal_leaves_the_weights_alone():
    recipe = _tiny_recipe()
    model, tok = build_demo_model(recipe)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    problems = recipe.task().sample("train", recipe.prompts_per_step, seed=0)
    stats = grpo_step(model, tok, HFGenerationBackend(model, tok), opt, problems, recipe, seed=0,
                      reward_fn=lambda r, a: 1.0)
    # Every group is constant, so every advantage is 0 and no update is taken.
    assert stats.mixed_groups == 0.0 and stats.loss == 0.0 and stats.reward == 1.0
    assert stats.tokens > 0
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())


def test_grpo_raises_the_reward_it_is_given():
    # Pay for answers that start with '7': a signal the random model meets about 1 time in 19.
    recipe = _tiny_recipe(lr=1e-2, grpo_steps=12, temperature=1.0)
    model, tok = build_demo_model(recipe)
    history = train_grpo(model, tok, recipe, reward_fn=lambda r, a: float((r.text or "").startswith("7")))
    first = sum(h["reward"] for h in history[:3]) / 3
    last = sum(h["reward"] for h in history[-3:]) / 3
    assert last > first + 0.2, (first, last)


@pytest.mark.slow
def test_recipe_run_beats_its_warm_start_on_heldout_problems():
    # Seed 0, one thread. The warm-started model answers problems with a carry or borrow the teacher's
    # wrong way; GRPO with the exact-answer reward must fix a good share of them.
    result = run_local_grpo(dataclasses.replace(ArithmeticDemoRecipe(), seed=0, eval_every=0, threads=1))
    assert 0.1 < result.warm_start_accuracy < 0.6, result
    assert result.final_accuracy > result.warm_start_accuracy + 0.2, result
