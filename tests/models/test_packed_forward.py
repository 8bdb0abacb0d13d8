"""The packed forward (each prompt once, no padding inside a group) against the padded functional forward."""

from __future__ import annotations

import pytest
import torch

from m2flow.data.batch import left_pad, right_pad
from m2flow.models.causal_lm import logprobs_from_logits, response_logprobs
from m2flow.models.functional_lm import functional_logits
from m2flow.models.packed_forward import PAD_SEGMENT, PROMPT_SEGMENT, pack_groups, packed_logits
from m2flow.models.response_forward import create_response_forward
from tests.models.test_functional_lm import MODELS, VOCAB, _model

torch.set_num_threads(1)


def _grpo_batch(prompt_lens, response_lens, seed=0):
    """Rows grouped by prompt (the n responses of a prompt need not be adjacent): the lists give, per
    row, the prompt's length (rows with the same length share the prompt) and the response's length."""
    g = torch.Generator().manual_seed(seed)
    prompts = {n: torch.randint(1, VOCAB, (n,), generator=g).tolist() for n in set(prompt_lens)}
    rows = [prompts[n] for n in prompt_lens]
    responses = [torch.randint(1, VOCAB, (n,), generator=g).tolist() for n in response_lens]
    p_ids, p_mask = left_pad(rows, 0)
    width = max(max(response_lens), 1)
    r_ids = right_pad(responses, 0, width=width)
    r_mask = right_pad([[1] * n for n in response_lens], 0, width=width)
    return p_ids, p_mask, r_ids, r_mask


def _padded_logits(model, p_ids, p_mask, r_ids, r_mask):
    ids, mask = torch.cat([p_ids, r_ids], 1), torch.cat([p_mask, r_mask], 1)
    lr = r_ids.shape[1]
    return functional_logits(model, ids, mask, logits_to_keep=lr + 1)[:, :-1]


# Per row: prompt length (equal lengths share the prompt), response length.
BATCHES = {
    "groups of 4, ragged responses": ([5, 5, 5, 5, 3, 3, 3, 3], [4, 7, 1, 6, 2, 7, 7, 5]),
    "interleaved groups": ([5, 3, 5, 3, 6], [3, 6, 2, 1, 4]),
    "all prompts distinct": ([2, 4, 6], [5, 3, 1]),
    "an empty response": ([4, 4, 4], [3, 0, 5]),
}


@pytest.mark.parametrize("name", sorted(MODELS))
@pytest.mark.parametrize("batch", sorted(BATCHES))
def test_packed_logits_and_gradients_match_the_padded_forward(name, batch):
    model = _model(**MODELS[name])
    p_ids, p_mask, r_ids, r_mask = _grpo_batch(*BATCHES[batch])
    weights = torch.randn(r_ids.shape, generator=torch.Generator().manual_seed(1)) * r_mask

    def run(logits_fn):
        model.zero_grad()
        logits = logits_fn(model, p_ids, p_mask, r_ids, r_mask)
        logp = logprobs_from_logits(logits, r_ids) * r_mask
        (logp * weights).sum().backward()
        return logp.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}

    want_logp, want_grads = run(_padded_logits)
    got_logp, got_grads = run(packed_logits)
    torch.testing.assert_close(got_logp, want_logp, rtol=1e-5, atol=1e-5)
    assert got_grads.keys() == want_grads.keys()
    for n in want_grads:
        torch.testing.assert_close(got_grads[n], want_grads[n], rtol=1e-4, atol=5e-5, msg=lambda m, n=n: f"{n}: {m}")


def test_packing_puts_each_prompt_once_and_drops_last_response_tokens():
    p_ids, p_mask, r_ids, r_mask = _grpo_batch([5, 5, 3, 5], [4, 2, 3, 1])
    packed = pack_groups(p_ids, p_mask, r_ids, r_mask)
    assert packed.input_ids.shape[0] == 2  # two distinct prompts
    for u in range(2):
        seg = packed.segments[u]
        prompt_len = int((seg == PROMPT_SEGMENT).sum())
        assert prompt_len in (3, 5)
        # 5-token prompt: responses of 4, 2 and 1 tokens keep 3 + 1 + 0; 3-token prompt: 3 keeps 2.
        assert int((seg > PROMPT_SEGMENT).sum()) == (4 if prompt_len == 5 else 2)
        assert (seg[seg != PAD_SEGMENT] >= 0).all()
    # The padded layout runs 4 rows x (5 + 4) columns; packed: 2 groups x 9 columns.
    assert packed.input_ids.numel() == 18


def test_response_logprobs_through_the_packed_forward_match_hf():
    model = _model()
    p_ids, p_mask, r_ids, r_mask = _grpo_batch([5, 5, 5, 4, 4, 4], [3, 6, 2, 6, 1, 4])
    forward = create_response_forward("packed")
    with torch.no_grad():
        hf, _ = response_logprobs(model, p_ids, p_mask, r_ids, r_mask, micro_batch_size=4)
        packed, _ = response_logprobs(model, p_ids, p_mask, r_ids, r_mask, micro_batch_size=4, forward=forward)
    torch.testing.assert_close(packed, hf, rtol=1e-5, atol=1e-5)
    assert (packed[r_mask == 0] == 0).all()


def test_a_row_without_prompt_tokens_is_refused():
    p_ids, p_mask, r_ids, r_mask = _grpo_batch([3, 3], [2, 2])
    p_mask[1] = 0
    with pytest.raises(ValueError, match="at least one prompt token"):
        pack_groups(p_ids, p_mask, r_ids, r_mask)
