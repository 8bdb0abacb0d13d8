"""Datasets of prompts (jsonl/parquet, GSM8K, synthetic arithmetic), samplers, and batch types."""

from m2flow.data.arithmetic import ARITHMETIC_ALPHABET, ArithmeticTask
from m2flow.data.batch import FinishReason, Response, ResponseGroup, RolloutBatch, left_pad, right_pad
from m2flow.data.gsm8k import GSM8K_PROMPT_TEMPLATE, extract_gsm8k_reference, gsm8k_dataset, read_gsm8k
from m2flow.data.prompts import PromptDataset, PromptItem, format_prompt
from m2flow.data.records import BadRecordError, OnBadLine, ReadReport, Record, read_records, write_jsonl, write_parquet
from m2flow.data.sampler import EpochSampler, PromptDataLoader

__all__ = [
    "ARITHMETIC_ALPHABET",
    "ArithmeticTask",
    "BadRecordError",
    "EpochSampler",
    "FinishReason",
    "GSM8K_PROMPT_TEMPLATE",
    "OnBadLine",
    "PromptDataLoader",
    "PromptDataset",
    "PromptItem",
    "ReadReport",
    "Record",
    "Response",
    "ResponseGroup",
    "RolloutBatch",
    "extract_gsm8k_reference",
    "format_prompt",
    "gsm8k_dataset",
    "left_pad",
    "read_gsm8k",
    "read_records",
    "right_pad",
    "write_jsonl",
    "write_parquet",
]
