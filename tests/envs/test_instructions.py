from __future__ import annotations

import importlib.util

import numpy as np
import pytest

from m2flow.config.errors import InputError
from m2flow.envs.instructions import (
    INSTRUCTIONS,
    MT10,
    MT50,
    PAD_ID,
    UNK_ID,
    VOCABULARIES,
    VOCABULARY_VERSION,
    WordTokenizer,
    instruction,
    words,
)
from m2flow.envs.metaworld import TASK_FAMILIES, expand_tasks
from m2flow.envs.packed import PackedLayout


def test_every_task_has_its_own_sentence_and_it_round_trips():
    tok = WordTokenizer.versioned()
    assert len(INSTRUCTIONS) == 50 and set(INSTRUCTIONS) == set(MT50) and set(MT10) <= set(MT50)
    assert len(set(INSTRUCTIONS.values())) == len(INSTRUCTIONS)
    encoded = {task: tuple(tok.encode(text, 16)) for task, text in INSTRUCTIONS.items()}
    assert len(set(encoded.values())) == len(INSTRUCTIONS)  # the ids alone tell the tasks apart
    for task, text in INSTRUCTIONS.items():
        assert text == text.lower() and not tok.unknown(text), task  # every built-in word has its own id
        assert tok.decode(np.array(encoded[task])) == text
    assert tok.vocab_size < 256  # ids are stored as bytes in packed observations
    assert TASK_FAMILIES["mt10"] == list(MT10) and TASK_FAMILIES["mt50"] == list(MT50)
    assert expand_tasks("mt50") == list(MT50)


@pytest.mark.skipif(importlib.util.find_spec("metaworld") is None, reason="the metaworld package is not installed")
def test_the_tables_match_metaworlds_own_task_lists():
    from metaworld.env_dict import ALL_V3_ENVIRONMENTS, MT10_V3, MT50_V3

    assert list(MT50) == list(ALL_V3_ENVIRONMENTS) and set(MT50) == set(MT50_V3)
    assert list(MT10) == list(MT10_V3)
    assert set(INSTRUCTIONS) == set(ALL_V3_ENVIRONMENTS)


def test_the_vocabulary_is_append_only():
    versions = sorted(VOCABULARIES)
    assert versions[-1] == VOCABULARY_VERSION
    for old, new in zip(versions, versions[1:]):
        assert VOCABULARIES[new][: len(VOCABULARIES[old])] == VOCABULARIES[old]  # old ids never move
    # Version 1 is the sorted words of MT10's sentences: the ids every policy before version 2 was trained with.
    assert list(VOCABULARIES[1]) == sorted({w for t in MT10 for w in words(INSTRUCTIONS[t])})
    v1, v2 = WordTokenizer.versioned(1), WordTokenizer.versioned()
    for task in MT10:
        assert np.array_equal(v1.encode(INSTRUCTIONS[task], 16), v2.encode(INSTRUCTIONS[task], 16))
    with pytest.raises(ValueError, match="versions"):
        WordTokenizer.versioned(99)


def test_unknown_words_tasks_and_overlong_sentences():
    tok = WordTokenizer.versioned()
    ids = tok.encode("move the banana", 5)
    assert ids[2] == UNK_ID and ids[3] == PAD_ID and tok.unknown("move the banana") == ["banana"]
    with pytest.raises(ValueError, match="does not fit"):
        tok.encode("the " * 20, 16)
    with pytest.raises(InputError, match="env.env_kwargs.instruction") as info:
        instruction("fly-v3")
    assert "\n" not in str(info.value) and "handle-press-v3" in str(info.value)


def test_a_given_instruction_names_any_task():
    assert instruction("fly-v3", "fly to the goal") == "fly to the goal"
    assert instruction("reach-v3", "touch the red point") == "touch the red point"
    assert expand_tasks("fly-v3", "fly to the goal") == ["fly-v3"]
    with pytest.raises(InputError, match="single task"):
        expand_tasks("reach-v3,push-v3", "do it")
    with pytest.raises(InputError, match="no words"):
        instruction("reach-v3", "  ")


def test_packed_layout_round_trips_bit_exactly():
    lay = PackedLayout(8, 6, 3, text_len=5, proprio_dim=4)
    rng = np.random.default_rng(0)
    image = rng.integers(0, 256, (8, 6, 3), dtype=np.uint8)
    tokens = np.array([3, 7, 255, 0, 0])
    proprio = np.array([0.1, -2.5, 1e-7, np.pi], dtype=np.float32)
    packed = lay.pack(image, tokens, proprio)
    assert packed.shape == (lay.size,) == (8 * 6 * 3 + 5 + 16,) and packed.dtype == np.uint8
    img, ids, pro = lay.unpack(np.stack([packed, packed]))
    assert (img[1] == image).all() and (ids[0] == tokens).all() and (pro[0] == proprio).all()
    import torch

    timg, tids, tpro = lay.unpack_torch(torch.from_numpy(np.stack([packed])))
    assert (timg[0].numpy() == image).all() and (tids[0].numpy() == tokens).all()
    assert (tpro[0].numpy() == proprio).all()
    with pytest.raises(ValueError, match="ids in"):
        lay.pack(image, np.array([1, 2, 300, 0, 0]), proprio)
