"""Datasets of prompts (jsonl/parquet, GSM8K, synthetic arithmetic and running sums), samplers, and batch types.

Names are loaded on first use (``from m2flow.data import PromptDataset`` works as usual), so that the
``m2flow data`` command, which lives in this package, answers ``m2flow --help`` without importing torch.
"""

from __future__ import annotations

from m2flow.lazy import lazy_names

_LAZY = {
    "ARITHMETIC_ALPHABET": "m2flow.data.arithmetic",
    "ArithmeticTask": "m2flow.data.arithmetic",
    "BadRecordError": "m2flow.data.records",
    "DataNotFoundError": "m2flow.data.records",
    "EpochSampler": "m2flow.data.sampler",
    "FinishReason": "m2flow.data.batch",
    "GSM8K_PROMPT_TEMPLATE": "m2flow.data.gsm8k",
    "OnBadLine": "m2flow.data.records",
    "PromptDataLoader": "m2flow.data.sampler",
    "PromptDataset": "m2flow.data.prompts",
    "PromptItem": "m2flow.data.prompts",
    "ReadReport": "m2flow.data.records",
    "Record": "m2flow.data.records",
    "RUNNING_SUMS_ALPHABET": "m2flow.data.running_sums",
    "Response": "m2flow.data.batch",
    "ResponseGroup": "m2flow.data.batch",
    "RolloutBatch": "m2flow.data.batch",
    "RunningSumsTask": "m2flow.data.running_sums",
    "extract_gsm8k_reference": "m2flow.data.gsm8k",
    "format_prompt": "m2flow.data.prompts",
    "gsm8k_dataset": "m2flow.data.gsm8k",
    "left_pad": "m2flow.data.batch",
    "read_gsm8k": "m2flow.data.gsm8k",
    "read_records": "m2flow.data.records",
    "right_pad": "m2flow.data.batch",
    "write_jsonl": "m2flow.data.records",
    "write_parquet": "m2flow.data.records",
}
__getattr__, __dir__ = lazy_names(__name__, _LAZY)


__all__ = sorted(_LAZY)
