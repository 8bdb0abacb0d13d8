"""The response forwards and their factory: chosen by name, refusals that name the choices."""

from __future__ import annotations

import pytest
import torch

from m2flow.models.causal_lm import response_logprobs
from m2flow.models.response_forward import (
    HFResponseForward,
    PackedResponseForward,
    ResponseForward,
    create_response_forward,
)
from tests.models.test_packed_forward import _grpo_batch
from tests.models.test_functional_lm import _model

torch.set_num_threads(1)


def test_the_factory_builds_each_forward_by_its_config_name():
    hf, packed = create_response_forward("hf"), create_response_forward("packed")
    assert isinstance(hf, HFResponseForward) and hf.name == "hf"
    assert isinstance(packed, PackedResponseForward) and packed.name == "packed"
    assert isinstance(packed, ResponseForward)


def test_unknown_and_renamed_forwards_are_refused_by_name():
    with pytest.raises(ValueError, match=r"unknown response forward 'fast'; valid: \['hf', 'packed'\]"):
        create_response_forward("fast")
    with pytest.raises(ValueError, match="'lean' is now called 'packed'"):
        create_response_forward("lean")


def test_the_packed_forward_refuses_an_unsupported_model():
    model = _model()
    create_response_forward("hf").check(model)
    model.config.hidden_act = "gelu"
    create_response_forward("hf").check(model)  # the model's own forward runs anything
    with pytest.raises(ValueError, match="activation 'gelu' is not supported"):
        create_response_forward("packed").check(model)


def test_the_default_forward_is_the_models_own_bit_for_bit():
    model = _model()
    p_ids, p_mask, r_ids, r_mask = _grpo_batch([5, 5, 4, 4], [3, 6, 2, 5])
    with torch.no_grad():
        default, ent = response_logprobs(model, p_ids, p_mask, r_ids, r_mask, micro_batch_size=3,
                                         return_entropy=True)
        hf, hf_ent = response_logprobs(model, p_ids, p_mask, r_ids, r_mask, micro_batch_size=3,
                                       return_entropy=True, forward=HFResponseForward())
    assert torch.equal(default, hf) and torch.equal(ent, hf_ent)
