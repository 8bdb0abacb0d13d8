"""G1 peer: TRL's `GRPOTrainer` on CPU, on the benchmark's tiny local model, prompts and lengths.

Runs in the TRL environment made by `benchmarks/g1_reasoning.py --setup`. Settings are TRL's own
defaults where the workload does not fix them (no KL term and so no reference model, one update
per generation so no old-policy pass, the 'dapo' token-level loss, group-scaled rewards); generation
is transformers `generate` with the KV cache, as TRL does without vLLM. Each optimizer step is timed
by a trainer callback from its start to its end (generation, reward, loss, backward, optimizer);
the first `warmup_steps` are left out. Prints one JSON line.

    benchmarks/.venvs/trl/bin/python benchmarks/peers/trl_grpo.py --workload WORKDIR/workload.json --threads 2
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
import zlib
from pathlib import Path

import torch


def parity_reward(completions: list[str], **kwargs: object) -> list[float]:
    """The benchmark's reward: parity of each completion's CRC32 (cheap, deterministic, never constant)."""
    return [float(zlib.crc32(c.encode()) & 1) for c in completions]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workload", required=True, help="workload.json written by benchmarks/g1_reasoning.py")
    ap.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    args = ap.parse_args()
    w = json.loads(Path(args.workload).read_text())
    torch.set_num_threads(args.threads)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    p, g = w["prompts_per_step"], w["group_size"]
    total_steps = w["warmup_steps"] + w["steps"]
    # Enough prompt rows for every step, in the same order as the other sides (no shuffling).
    rows = [w["prompts"][i % len(w["prompts"])] for i in range(total_steps * p)]
    dataset = Dataset.from_dict({"prompt": rows})
    tok = AutoTokenizer.from_pretrained(w["model_dir"], local_files_only=True)
    model = AutoModelForCausalLM.from_pretrained(w["model_dir"], local_files_only=True, dtype=torch.float32)

    class StepTimer(TrainerCallback):
        """Wall time of each optimizer step, and the completion lengths TRL logs for it."""

        def __init__(self) -> None:
            self.times: list[float] = []
            self.lengths: list[float] = []
            self._t = 0.0

        def on_step_begin(self, args, state, control, **kw):  # noqa: ANN001
            self._t = time.perf_counter()

        def on_step_end(self, args, state, control, **kw):  # noqa: ANN001
            self.times.append(time.perf_counter() - self._t)

        def on_log(self, args, state, control, logs=None, **kw):  # noqa: ANN001
            if logs and "completions/mean_length" in logs:
                self.lengths.append(float(logs["completions/mean_length"]))

    timer = StepTimer()
    with tempfile.TemporaryDirectory(prefix="g1-trl-") as out:
        config = GRPOConfig(
            output_dir=out,
            use_cpu=True,
            bf16=False,
            fp16=False,
            seed=w["seed"],
            learning_rate=w["lr"],
            lr_scheduler_type="constant",
            warmup_steps=0,
            weight_decay=0.0,
            max_grad_norm=0.0,  # the other sides do not clip either
            per_device_train_batch_size=p * g,  # completions per step; TRL counts completions, not prompts
            gradient_accumulation_steps=1,
            num_generations=g,
            max_completion_length=w["max_new_tokens"],
            temperature=w["temperature"],
            top_p=1.0,
            top_k=0,
            beta=0.0,
            num_iterations=1,
            shuffle_dataset=False,
            max_steps=total_steps,
            logging_steps=1,
            save_strategy="no",
            report_to="none",
            disable_tqdm=True,
            dataloader_num_workers=0,
            gradient_checkpointing=False,
        )
        trainer = GRPOTrainer(
            model=model,
            reward_funcs=parity_reward,
            args=config,
            train_dataset=dataset,
            processing_class=tok,
            callbacks=[timer],
        )
        trainer.train()
    times = timer.times[w["warmup_steps"]:]
    lengths = timer.lengths[w["warmup_steps"]:] or timer.lengths
    total = sum(times)
    completions = p * g * len(times)
    mean_len = sum(lengths) / len(lengths) if lengths else float("nan")
    print(json.dumps({
        "side": "trl", "threads": args.threads, "steps": len(times),
        "seconds_per_step": total / len(times), "completions_per_s": completions / total,
        "tokens_per_s": completions * mean_len / total, "mean_completion_tokens": mean_len,
    }))


if __name__ == "__main__":
    main()
