from __future__ import annotations

import numpy as np
import pytest

from m2flow.envs.instructions import INSTRUCTIONS, PAD_ID, UNK_ID, WordTokenizer, instruction
from m2flow.envs.packed import PackedLayout


def test_every_task_has_its_own_sentence_and_it_round_trips():
    tok = WordTokenizer.from_instructions()
    assert len(set(INSTRUCTIONS.values())) == len(INSTRUCTIONS)
    encoded = {task: tuple(tok.encode(text, 16)) for task, text in INSTRUCTIONS.items()}
    assert len(set(encoded.values())) == len(INSTRUCTIONS)  # the ids alone tell the tasks apart
    for task, text in INSTRUCTIONS.items():
        assert tok.decode(np.array(encoded[task])) == text
    assert tok.vocab_size < 256  # ids are stored as bytes in packed observations


def test_unknown_words_tasks_and_overlong_sentences():
    tok = WordTokenizer.from_instructions()
    ids = tok.encode("move the banana", 5)
    assert ids[2] == UNK_ID and ids[3] == PAD_ID
    with pytest.raises(ValueError, match="does not fit"):
        tok.encode("the " * 20, 16)
    with pytest.raises(ValueError, match="known:"):
        instruction("fly-v3")


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
