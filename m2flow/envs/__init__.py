"""Simulator adapters: a worker's vector of gymnasium envs in pipeline groups, with normalisation.

- ``config.py``     EnvConfig: env id, backend, envs per rank, pipeline groups, normalisation
- ``factory.py``    building one env by backend name ('gymnasium', 'maniskill', 'metaworld'); multi-task ids
- ``vector.py``     EnvGroup (raw stepping, same-step autoreset, episode stats) and VecEnv
- ``normalize.py``  RunningMeanStd, ObsNormalizer, RewardScaler (checkpointable, freezable)
- ``types.py``      StepResult, the per-step message
- ``maniskill.py``  optional ManiSkill 3 adapter (imported lazily)
- ``metaworld.py``  optional MetaWorld pixel-and-language envs, offscreen camera (imported lazily)
- ``metaworld_demos.py`` scripted-expert demonstrations (npz) and success evaluation
- ``instructions.py`` one instruction sentence per task, the offline word tokenizer
- ``packed.py``     PackedLayout: image, instruction ids and proprio in one uint8 observation
"""

from m2flow.lazy import lazy_names

# Names resolve on first use: a config's EnvConfig (and the text envs' names) load without gymnasium or numpy.
_HOME = {"EnvConfig": "config", "available_env_backends": "factory", "make_env": "factory",
         "register_env_backend": "factory", "ObsNormalizer": "normalize", "RewardScaler": "normalize",
         "RunningMeanStd": "normalize", "StepResult": "types", "EnvGroup": "vector", "VecEnv": "vector"}
__getattr__, __dir__ = lazy_names(__name__, _HOME)

__all__ = [
    "EnvConfig",
    "EnvGroup",
    "ObsNormalizer",
    "RewardScaler",
    "RunningMeanStd",
    "StepResult",
    "VecEnv",
    "available_env_backends",
    "make_env",
    "register_env_backend",
]
