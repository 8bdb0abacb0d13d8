"""A short supervised warm start: next-token loss on answers given prompts, before RL."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from collections.abc import Callable

import numpy as np
import torch
from transformers import PreTrainedModel

from m2flow.data.batch import left_pad, right_pad
from m2flow.models.causal_lm import response_logprobs

logger = logging.getLogger(__name__)


def _pairs(examples: Sequence[Any]) -> list[tuple[str, str]]:
    out = []
    for ex in examples:
        if isinstance(ex, dict):
            out.append((str(ex["prompt"]), str(ex["answer"])))
        else:
            prompt, answer = ex
            out.append((str(prompt), str(answer)))
    return out


def sft_steps(
    model: PreTrainedModel,
    tokenizer: Any,
    examples: Sequence[tuple[str, str] | dict[str, str]],
    steps: int,
    lr: float = 1e-3,
    batch_size: int = 32,
    seed: int = 0,
    weight_decay: float = 0.0,
    add_eos: bool = True,
    warmup_steps: int = 0,
    on_step: Callable[[int, float], None] | None = None,
) -> list[float]:
    """Train `steps` AdamW steps on random batches of (prompt, answer); returns the loss of each step.

    The loss is the mean negative log-likelihood over answer tokens (plus end-of-sequence when
    `add_eos`), with prompts and answers tokenized separately exactly as generation sees them.
    The learning rate rises linearly from 0 over the first `warmup_steps` steps (Adam's first steps
    are otherwise as large as later ones), then stays at `lr`. `on_step(step, loss)` follows each
    step, counting from 1 (progress bars, metrics). The model is left in eval mode.
    """
    pairs = _pairs(examples)
    if not pairs:
        raise ValueError("sft_steps needs at least one example")
    eos = [tokenizer.eos_token_id] if add_eos else []
    # Demonstrations repeat texts (a teacher's draws of a small task do, a lot): each text once.
    ids: dict[str, list[int]] = {}
    for text in {t for pair in pairs for t in pair}:
        ids[text] = tokenizer(text, add_special_tokens=False)["input_ids"]
    prompts = [ids[p] for p, _ in pairs]
    answers = [ids[a] + eos for _, a in pairs]
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    rng = np.random.default_rng(seed)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=weight_decay)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda k: min(1.0, (k + 1) / max(1, warmup_steps)))
    model.train()
    losses: list[float] = []
    for step in range(steps):
        idx = rng.choice(len(pairs), size=min(batch_size, len(pairs)), replace=len(pairs) < batch_size)
        p_ids, p_mask = left_pad([prompts[i] for i in idx], pad_id)
        r_rows = [answers[i] for i in idx]
        r_ids = right_pad(r_rows, pad_id)
        r_mask = right_pad([[1] * len(r) for r in r_rows], 0)
        logp, _ = response_logprobs(model, p_ids, p_mask, r_ids, r_mask)
        loss = -(logp * r_mask).sum() / r_mask.sum()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        sched.step()
        losses.append(float(loss.detach()))
        if on_step is not None:
            on_step(step + 1, losses[-1])
        if step % 50 == 0 or step == steps - 1:
            logger.info("sft step %d/%d loss %.4f", step + 1, steps, losses[-1])
    model.eval()
    return losses
