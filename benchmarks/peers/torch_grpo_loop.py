"""G1 limit: the bare GRPO step written directly in torch and transformers, nothing else.

Per step: sample `group_size` completions for each prompt with `model.generate` (KV cache), score them,
take group-normalised advantages, one forward + backward over prompt + completion, one AdamW step.
No reference model, no old-policy pass (one update per batch, so the ratio is exactly 1), no
logging beyond timing. Runs in one process with the given number of torch threads and prints one
JSON line. Uses only torch and transformers, so it runs in any of the benchmark's environments.

    python benchmarks/peers/torch_grpo_loop.py --workload WORKDIR/workload.json --threads 2
"""

from __future__ import annotations

import argparse
import json
import time
import zlib
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer


def parity_reward(text: str) -> float:
    """The benchmark's reward: parity of the completion's CRC32 (cheap, deterministic, never constant)."""
    return float(zlib.crc32(text.encode()) & 1)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workload", required=True, help="workload.json written by benchmarks/g1_reasoning.py")
    ap.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    args = ap.parse_args()
    w = json.loads(Path(args.workload).read_text())
    torch.set_num_threads(args.threads)
    torch.manual_seed(w["seed"])
    tok = AutoTokenizer.from_pretrained(w["model_dir"], local_files_only=True)
    tok.padding_side = "left"  # generation appends on the right
    model = AutoModelForCausalLM.from_pretrained(w["model_dir"], local_files_only=True, dtype=torch.float32)
    opt = torch.optim.AdamW(model.parameters(), lr=w["lr"], weight_decay=0.0, fused=True)  # as TRL's default
    p, g, max_new = w["prompts_per_step"], w["group_size"], w["max_new_tokens"]
    prompts = w["prompts"]
    step_times, completions, tokens = [], 0, 0
    for step in range(w["warmup_steps"] + w["steps"]):
        start = time.perf_counter()
        batch = [prompts[(step * p + i) % len(prompts)] for i in range(p)]
        enc = tok(batch, return_tensors="pt", padding=True, add_special_tokens=False)  # left-padded
        ids = enc["input_ids"].repeat_interleave(g, 0)
        mask = enc["attention_mask"].repeat_interleave(g, 0)
        model.eval()
        with torch.no_grad():
            seq = model.generate(
                input_ids=ids, attention_mask=mask, do_sample=True, temperature=w["temperature"], top_p=1.0, top_k=0,
                max_new_tokens=max_new, pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id, use_cache=True,
            )
        comp = seq[:, ids.shape[1]:]
        # Completion mask: tokens up to and including the first end-of-sequence.
        is_eos = comp == tok.eos_token_id
        first = torch.where(is_eos.any(1), is_eos.float().argmax(1), torch.full((comp.shape[0],), comp.shape[1]))
        cmask = (torch.arange(comp.shape[1])[None, :] <= first[:, None]).long()
        texts = tok.batch_decode(comp * cmask + tok.pad_token_id * (1 - cmask), skip_special_tokens=True)
        scores = torch.tensor([parity_reward(t) for t in texts]).view(p, g)
        adv = ((scores - scores.mean(1, keepdim=True)) / (scores.std(1, keepdim=True) + 1e-4)).view(-1, 1)
        model.train()
        full_mask = torch.cat([mask, cmask], 1)
        pos = (full_mask.cumsum(-1) - 1).clamp(min=0)
        logits = model(input_ids=seq, attention_mask=full_mask, position_ids=pos, logits_to_keep=comp.shape[1] + 1).logits
        logits = logits[:, :-1] / w["temperature"]
        logp = logits.gather(-1, comp.unsqueeze(-1)).squeeze(-1) - torch.logsumexp(logits, -1)
        ratio = torch.exp(logp - logp.detach())
        loss = -(ratio * adv * cmask).sum() / cmask.sum()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        if step >= w["warmup_steps"]:
            step_times.append(time.perf_counter() - start)
            completions += p * g
            tokens += int(cmask.sum())
    total = sum(step_times)
    print(json.dumps({
        "side": "bare_torch", "threads": args.threads, "steps": len(step_times),
        "seconds_per_step": total / len(step_times), "completions_per_s": completions / total,
        "tokens_per_s": tokens / total, "mean_completion_tokens": tokens / completions,
    }))


if __name__ == "__main__":
    main()
