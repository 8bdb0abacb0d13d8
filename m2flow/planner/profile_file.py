"""Profile files: measured cost points of one workflow config on one machine, fitted into a ``CostModel``.

A profile is JSON::

    {"format": 2, "workflow": "reasoning",
     "machine": {"hostname": ..., "cores": 2, "torch": "2.5.1", "m2flow": "0.1.0"},
     "config_hash": "<sha256 of the config minus the keys a search varies>",
     "device": {"memory_bytes": 2.4e10, "cores": 2},          # cores: null on GPUs
     "link": {"bandwidth": 1e9, "latency": 1e-4,              # between processes
              "local_latency": 0.0, "dispatch": 1e-4},       # in the driver; a call to a process
     "driver_split": {"factor": 2.1, "components": ["rollout", "actor"]},  # see CostModel.split_factor
     "process_factor": 1.1,                                  # calls in Ray processes (CostModel)
     "oversubscribed": 3.0,                                  # beyond the cores (CostModel.speed)
     "offload_bandwidth": 5e9,
     "edge_bytes": {"responses": 4096},                      # bytes per item per edge
     "components": {"rollout": {"points": [[items, devices, seconds(, threads)], ...],
                                "mem_fixed": ..., "mem_per_item": ..., "state_bytes": ...,
                                "weight_bytes": ..., "startup_s": ..., "cpu_share": 1.0}}}

A component may give ``a, c, alpha, s`` instead of points (numbers entered by hand). ``weight_bytes``
(optional) are its model's weights, part of ``mem_fixed``: what a weight sync from it sends and what a
copy fused into another model holder shares with its host (``ComponentCost.shared_bytes``); the
profiler records them for every model holder (the policy's checkpoint); without them a sync sends
``state_bytes`` and a fused copy shares all its ``mem_fixed``, as before the figure existed. ``cpu_share``
(optional, default 1: a profile without it reads as before) is the part of its busy time it computes;
the rest waits and does not contend for the cores (``CostModel``). Loading checks
that the profile was taken on this machine (hostname and cores) with this torch and m2flow, and on
this config; a stale or foreign profile is refused with ``ProfileError`` saying what differs.
"""

from __future__ import annotations

import hashlib
import json
import os
import socket
from collections.abc import Mapping
from importlib import metadata
from pathlib import Path
from typing import Any

from m2flow.planner.cost import ComponentCost, CostModel, Link, fit_component

PROFILE_FORMAT = 2
"""2: points may carry the threads that measured them; measured link latency (format 1 is read when
entered by hand)."""
_MEMORY_KEYS = ("mem_fixed", "mem_per_item", "state_bytes", "weight_bytes", "startup_s", "cpu_share")
"""Per-component figures passed through to ``ComponentCost`` as they are (each optional)."""


class ProfileError(ValueError):
    """A profile that cannot be used here: malformed, foreign (another machine) or stale."""


def machine_identity() -> dict[str, Any]:
    """This machine as a profile names it: hostname, cores, torch and m2flow versions."""
    import m2flow

    try:
        torch_version = metadata.version("torch")
    except metadata.PackageNotFoundError:
        torch_version = "none"
    return {"hostname": socket.gethostname(), "cores": os.cpu_count() or 1, "torch": torch_version,
            "m2flow": m2flow.__version__}


def _drop(data: Mapping[str, Any], dotted: str) -> dict[str, Any]:
    head, _, rest = dotted.partition(".")
    out = dict(data)
    if head in out:
        if rest and isinstance(out[head], Mapping):
            out[head] = _drop(out[head], rest)
        elif not rest:
            del out[head]
    return out


def config_hash(config: Mapping[str, Any], ignore: tuple[str, ...] = ()) -> str:
    """SHA-256 of ``config`` as canonical JSON, without the dotted keys in ``ignore`` (those a search varies)."""
    data = dict(config)
    for key in ignore:
        data = _drop(data, key)
    text = json.dumps(data, sort_keys=True, default=str, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def check_profile(profile: Mapping[str, Any], workflow: str, cfg_hash: str,
                  machine: Mapping[str, Any] | None = None, source: str = "profile") -> None:
    """Raise ProfileError unless ``profile`` was taken for ``workflow`` on ``machine`` and this config."""
    fmt = profile.get("format")
    if fmt == 1 and "probes" in profile:
        raise ProfileError(f"{source} is stale: measured by an older m2flow profile (format 1: its points do not "
                           "record threads, its link latency was not measured); profile again")
    if fmt not in (1, PROFILE_FORMAT):  # format 1 entered by hand reads as format 2 without threads
        raise ProfileError(f"{source}: not a profile of format {PROFILE_FORMAT}")
    if profile.get("workflow") != workflow:
        raise ProfileError(f"{source} profiles workflow {profile.get('workflow')!r}, the config is {workflow!r}")
    here = dict(machine or machine_identity())
    there = profile.get("machine", {})
    for key, what in (("hostname", "foreign"), ("cores", "foreign"), ("torch", "stale"), ("m2flow", "stale")):
        if there.get(key) != here.get(key):
            raise ProfileError(f"{source} is {what}: taken with {key} {there.get(key)!r}, this machine has "
                               f"{here.get(key)!r}; profile again on this machine")
    if profile.get("config_hash") != cfg_hash:
        raise ProfileError(f"{source} is stale: taken on a config with hash {profile.get('config_hash')!r}, this "
                           f"config hashes to {cfg_hash!r} (only placement and the searched settings may differ); "
                           "profile this config again")


def cost_model(profile: Mapping[str, Any], source: str = "profile") -> CostModel:
    """The ``CostModel`` of a (checked) profile: points are fitted, hand-entered curves taken as they are."""
    try:
        comps: dict[str, ComponentCost] = {}
        for name, entry in profile["components"].items():
            extra = {k: float(entry[k]) for k in _MEMORY_KEYS if k in entry}
            if not 0.0 <= extra.get("cpu_share", 1.0) <= 1.0:
                raise ValueError(f"component {name!r}: cpu_share must be in [0, 1], got {extra['cpu_share']}")
            if "points" in entry:
                comps[name] = fit_component([tuple(p) for p in entry["points"]], **extra).cost
            else:
                comps[name] = ComponentCost(float(entry.get("a", 0.0)), float(entry.get("c", 0.0)),
                                            float(entry.get("alpha", 1.0)), float(entry.get("s", 0.0)), **extra)
        device = profile.get("device", {})
        link = profile.get("link", {})
        memory = device.get("memory_bytes")
        split = profile.get("driver_split", {})
        return CostModel(comps, {k: float(v) for k, v in profile.get("edge_bytes", {}).items()},
                         Link(float(link.get("bandwidth", 1e9)), float(link.get("latency", 1e-4)),
                              float(link.get("local_latency", 0.0)),
                              float(link["dispatch"]) if link.get("dispatch") is not None else None),
                         float(profile.get("offload_bandwidth", 5e9)),
                         float(memory) if memory is not None else float("inf"), device.get("cores"),
                         float(split.get("factor", 1.0)), frozenset(split.get("components", ())),
                         float(profile.get("process_factor", 1.0)), float(profile.get("oversubscribed", 1.0)))
    except (KeyError, TypeError, ValueError) as e:
        raise ProfileError(f"{source}: not a valid profile ({type(e).__name__}: {e})") from None


def load_profile(path: str | Path, workflow: str, cfg_hash: str,
                 machine: Mapping[str, Any] | None = None) -> CostModel:
    """Read, check and fit the profile at ``path``; raises ProfileError saying why it cannot be used."""
    path = Path(path)
    try:
        profile = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ProfileError(f"no profile file {path}") from None
    except json.JSONDecodeError as e:
        raise ProfileError(f"{path}: not JSON ({e})") from None
    check_profile(profile, workflow, cfg_hash, machine, source=str(path))
    return cost_model(profile, source=str(path))


def new_profile(workflow: str, cfg_hash: str, components: Mapping[str, Mapping[str, Any]], *,
                machine: Mapping[str, Any] | None = None, **rest: Any) -> dict[str, Any]:
    """A profile record for this machine (``rest``: device, link, offload_bandwidth, edge_bytes)."""
    return {"format": PROFILE_FORMAT, "workflow": workflow, "machine": dict(machine or machine_identity()),
            "config_hash": cfg_hash, **rest, "components": {k: dict(v) for k, v in components.items()}}
