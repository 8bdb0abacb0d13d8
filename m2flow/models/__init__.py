"""Policy models: Hugging Face causal LMs (with value heads, tokenizers, tiny test models) and embodied policies
(MLP/CNN actor-critics, the small vision-language-action policy and its behaviour-cloning warm start).

Language-model helpers import `transformers`, an optional dependency, so they are loaded on first
use: `from m2flow.models import response_logprobs` works, while embodied code that never touches
them does not pay for (or need) that import.
"""

from __future__ import annotations

from m2flow.lazy import lazy_names

_LAZY = {
    "CausalLMWithValueHead": "m2flow.models.causal_lm",
    "entropy_from_logits": "m2flow.models.causal_lm",
    "load_causal_lm": "m2flow.models.causal_lm",
    "load_model_and_tokenizer": "m2flow.models.causal_lm",
    "logprobs_from_logits": "m2flow.models.causal_lm",
    "FunctionalLM": "m2flow.models.functional_lm",
    "functional_logits": "m2flow.models.functional_lm",
    "create_response_forward": "m2flow.models.response_forward",
    "position_ids_from_mask": "m2flow.models.causal_lm",
    "response_logprobs": "m2flow.models.causal_lm",
    "sft_steps": "m2flow.models.sft",
    "TinyModelConfig": "m2flow.models.tiny",
    "build_tiny_model": "m2flow.models.tiny",
    "make_tiny_checkpoint": "m2flow.models.tiny",
    "save_checkpoint": "m2flow.models.tiny",
    "load_tokenizer": "m2flow.models.tokenizer",
    "save_tokenizer": "m2flow.models.tokenizer",
    "train_bpe_tokenizer": "m2flow.models.tokenizer",
    "train_char_tokenizer": "m2flow.models.tokenizer",
    "train_tokenizer": "m2flow.models.tokenizer",
    "ActionBins": "m2flow.models.action_tokens",
    "BCConfig": "m2flow.models.bc",
    "behaviour_clone": "m2flow.models.bc",
    "VLAConfig": "m2flow.models.policy_config",
    "VLAPolicy": "m2flow.models.vla",
    "build_vla": "m2flow.models.vla",
}
__getattr__, __dir__ = lazy_names(__name__, _LAZY)
