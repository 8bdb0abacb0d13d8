"""A policy's starting weights from a file (``policy.init_from``): checked, loaded without running code.

The file is a behaviour-cloning result (``{"policy": state_dict, ...}``, as ``vla.save_policy``
writes it), a training run's ``actor.pt`` (the same ``"policy"`` entry beside the optimizer state)
or a bare state dict. It is read with ``torch.load(weights_only=True)``, so a pickle carrying code
is refused; every failure raises ``ModelFileError`` naming the file and what is wrong with it.
"""

from __future__ import annotations

import pickle
from pathlib import Path

import torch
from torch import nn

from m2flow.models.weight_files import ModelFileError, refusal_reason

_SHOWN = 5  # keys listed in a mismatch message


def read_policy_state(path: str | Path) -> dict[str, torch.Tensor]:
    """The state dict stored in ``path`` (its ``"policy"`` entry, or the whole file), on the CPU."""
    path = Path(path)
    if not path.is_file():
        raise ModelFileError(f"{path}: no such file (policy.init_from)")
    try:
        obj = torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as exc:
        if "global" not in str(exc).lower():  # not a refused object: bytes that are no pickle at all
            raise ModelFileError(f"{path}: not a readable weights file ({str(exc).splitlines()[0]}); truncated or "
                                 "not made by torch.save") from None
        raise ModelFileError(f"{path}: refused to load: not a file of tensors and plain values "
                             f"({refusal_reason(exc)})") from None
    except (RuntimeError, EOFError, OSError, ValueError) as exc:
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise ModelFileError(f"{path}: not a readable weights file ({first}); truncated or not made by torch.save") from None
    state = obj.get("policy", obj) if isinstance(obj, dict) else obj
    if not isinstance(state, dict) or not state or not all(
        isinstance(k, str) and isinstance(v, torch.Tensor) for k, v in state.items()
    ):
        raise ModelFileError(f"{path}: holds no policy state dict (expected a dict of tensors, or one under 'policy')")
    return state


def load_policy_weights(policy: nn.Module, path: str | Path) -> None:
    """Copy the weights stored in ``path`` into ``policy`` in place; every name and shape must match."""
    state = read_policy_state(path)
    upgrade = getattr(policy, "upgrade_state", None)
    if callable(upgrade):  # a policy that reads older files (the VLA: a shorter instruction vocabulary)
        state = upgrade(state)
    own = policy.state_dict()
    missing = sorted(set(own) - set(state))
    unexpected = sorted(set(state) - set(own))
    wrong = sorted(k for k in set(own) & set(state) if tuple(own[k].shape) != tuple(state[k].shape))
    if missing or unexpected or wrong:
        problems = []
        if missing:
            problems.append(f"missing {missing[:_SHOWN]}{' ...' if len(missing) > _SHOWN else ''}")
        if unexpected:
            problems.append(f"unexpected {unexpected[:_SHOWN]}{' ...' if len(unexpected) > _SHOWN else ''}")
        if wrong:
            k = wrong[0]
            problems.append(f"{len(wrong)} shape mismatch(es), e.g. {k}: file {tuple(state[k].shape)} vs policy "
                            f"{tuple(own[k].shape)}")
        raise ModelFileError(f"{path}: the weights do not fit this policy ({'; '.join(problems)}); check policy.kind "
                             "and its sizes against the ones the file was trained with")
    with torch.no_grad():
        for name, tensor in own.items():
            tensor.copy_(state[name])
