"""Partial rollouts over a real continuous-batching stream: each step hands out exactly the groups it owes,
every prompt taken is handed out once or still carried, carried rows continue with their tokens' versions,
and a row with a token older than the staleness bound starts over."""

from __future__ import annotations

import pytest
import torch

from m2flow.backends.generation import LeanGenerationBackend, SamplingParams
from m2flow.workers.messages import PromptTask
from m2flow.workers.partial import PartialRollouts

torch.set_num_threads(1)

TEXTS = ("12+7=", "3+4=", "99-1=", "5*5=", "0+0=", "123+456=", "8=", "41-9=", "7*3=", "6+6=", "1-1=", "2*9=")
G = 4  # prompts per step


def _run(tiny_ckpt, max_staleness: int, steps: int = 4):
    backend = LeanGenerationBackend.from_pretrained(tiny_ckpt)
    params = SamplingParams(n=3, temperature=1.0, max_new_tokens=10)
    partial = PartialRollouts(max_staleness)
    prompts = [backend.tokenizer(t)["input_ids"] for t in TEXTS]
    taken, emitted, counts = [], [], []
    index = 0

    def stream(ids, seeds, flight):
        return backend.generate_stream(ids, params, seeds, max_running=12, flight=flight)

    for step in range(steps):
        new = []
        for slot in range(2 * G if step == 0 else G):  # the first step over-provisions by one batch
            i = index % len(TEXTS)
            new.append((PromptTask(step, slot, index, prompts[i], None), 1000 + index))
            index += 1
        taken += [t.index for t, _ in new]
        counts.append(partial.step(stream, step, step, new, list(range(G)), emitted.extend))
        assert sorted(t.slot for t, _ in emitted[-G:]) == list(range(G)) and all(t.step == step for t, _ in emitted[-G:])
        with torch.no_grad():  # the step's update, before the next step's generation
            for p in backend.model.parameters():
                p.add_(0.05 * torch.randn_like(p))
    return partial, taken, emitted, counts


def test_every_prompt_is_handed_out_once_or_carried_and_rows_continue_across_steps(tiny_ckpt):
    partial, taken, emitted, counts = _run(tiny_ckpt, max_staleness=1)
    handed = [t.index for t, _ in emitted]
    carried = [c.task.index for c in partial.carried]
    assert len(handed) == len(set(handed)) == 4 * G  # never twice
    assert sorted(handed + carried) == sorted(taken)  # never lost
    assert all(c.carried == G for c in counts)  # the over-provisioned batch stays in flight
    assert sum(c.resumed for c in counts) > 0
    mixed = 0
    for task, group in emitted:
        for r in group.responses:
            assert len(r.versions) == len(r.token_ids) and r.versions == sorted(r.versions)
            assert min(r.versions) >= task.step - 1  # within the bound when trained at this step
            mixed += len(set(r.versions)) > 1
    assert mixed > 0  # responses that continued under the next step's weights


def test_a_carried_row_with_a_token_past_the_bound_starts_over(tiny_ckpt):
    partial, taken, emitted, counts = _run(tiny_ckpt, max_staleness=0, steps=3)
    # Bound 0: a carried row's tokens would be a step old when trained, so every one starts over.
    assert sum(c.restarted for c in counts) > 0
    for task, group in emitted:
        assert all(v == task.step for r in group.responses for v in r.versions)
    handed = [t.index for t, _ in emitted]
    assert sorted(handed + [c.task.index for c in partial.carried]) == sorted(taken)
    assert len(partial.drop()) == G and not partial.carried


def test_owing_more_than_it_holds_is_refused(tiny_ckpt):
    partial = PartialRollouts(1)
    with pytest.raises(ValueError, match="3 groups owed from 2 prompts"):
        partial.step(lambda *a: iter(()), 0, 0, [(PromptTask(0, s, s, [5], None), s) for s in range(2)], [0, 1, 2],
                     lambda done: None)
