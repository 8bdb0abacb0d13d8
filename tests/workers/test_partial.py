"""Partial rollouts over a real continuous-batching stream: each step hands out exactly the groups it owes,
every prompt taken is handed out once or still carried, carried rows continue with their tokens' versions,
a row with a token older than the staleness bound starts over, and what is carried, saved and restored,
goes on exactly as it would have."""

from __future__ import annotations

import pytest
import torch

from m2flow.backends.generation import LeanGenerationBackend, SamplingParams
from m2flow.workers.messages import PromptTask
from m2flow.workers.partial import PartialRollouts, share_carried
from m2flow.workers.state_file import load_state, save_state

torch.set_num_threads(1)

TEXTS = ("12+7=", "3+4=", "99-1=", "5*5=", "0+0=", "123+456=", "8=", "41-9=", "7*3=", "6+6=", "1-1=", "2*9=")
G = 4  # prompts per step


def _streamer(backend):
    params = SamplingParams(n=3, temperature=1.0, max_new_tokens=10)

    def stream(ids, seeds, flight):
        return backend.generate_stream(ids, params, seeds, max_running=12, flight=flight)

    return stream


def _new(backend, step: int) -> list[tuple[PromptTask, int]]:
    """Step ``step``'s new prompts (task, seed): 2 G at the first (over-provisioned), G after."""
    prompts = [backend.tokenizer(t)["input_ids"] for t in TEXTS]
    first = 0 if step == 0 else G * (step + 1)
    return [(PromptTask(step, slot, first + slot, prompts[(first + slot) % len(TEXTS)], None), 1000 + first + slot)
            for slot in range(2 * G if step == 0 else G)]


def _run(tiny_ckpt, max_staleness: int, steps: int = 4):
    backend = LeanGenerationBackend.from_pretrained(tiny_ckpt)
    partial = PartialRollouts(max_staleness)
    stream = _streamer(backend)
    taken, emitted, counts = [], [], []

    for step in range(steps):
        new = _new(backend, step)
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
    assert len(partial.carried) == G


def _rows(emitted):
    return [(t, [(r.token_ids, r.logprobs, r.versions, r.finish_reason) for r in g.responses]) for t, g in emitted]


def test_what_is_carried_saved_and_restored_goes_on_exactly_as_it_would_have(tiny_ckpt, tmp_path):
    partial, _, _, _ = _run(tiny_ckpt, max_staleness=2, steps=2)
    assert any(c.rows for c in partial.carried)  # rows with tokens, not only prompts never admitted
    save_state(partial.state(), tmp_path / "carried.pt")
    restored = PartialRollouts(2)
    restored.restore(load_state(tmp_path / "carried.pt"))  # a file of tensors and plain values only
    assert restored.carried == partial.carried  # tasks, seeds, every row's tokens, log-probs, versions, ends
    backend = LeanGenerationBackend.from_pretrained(tiny_ckpt)
    stream = _streamer(backend)
    went_on, resumed = [], []
    for step in (2, 3):
        for rollouts, out in ((partial, went_on), (restored, resumed)):
            rollouts.step(stream, step, step, _new(backend, step), list(range(G)), out.extend)
    assert _rows(resumed) == _rows(went_on) and len(went_on) == 2 * G
    assert restored.carried == partial.carried


def test_carried_prompts_go_back_rank_for_rank_or_are_dealt_to_a_new_number_of_ranks():
    saved = [[{"p": i} for i in range(3)], [{"p": i} for i in range(3, 5)]]
    assert share_carried(saved, 2) == saved
    for ranks in (1, 3, 4):
        shares = share_carried(saved, ranks)
        assert len(shares) == ranks
        assert sorted(c["p"] for s in shares for c in s) == list(range(5))  # none lost, none twice
        assert max(map(len, shares)) - min(map(len, shares)) <= 1
    assert share_carried(saved, 1) == [[{"p": i} for i in range(5)]]  # in rank order


def test_owing_more_than_it_holds_is_refused(tiny_ckpt):
    partial = PartialRollouts(1)
    with pytest.raises(ValueError, match="3 groups owed from 2 prompts"):
        partial.step(lambda *a: iter(()), 0, 0, [(PromptTask(0, s, s, [5], None), s) for s in range(2)], [0, 1, 2],
                     lambda done: None)
