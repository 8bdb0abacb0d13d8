"""Text environments for agentic RL: the gymnasium-style interface GEM uses, on strings.

- ``base.py``        ``TextEnv`` (``reset(seed)``, ``step(action_text)``) and ``TEXT_ENVS``
- ``registry.py``    ``make_text_env`` by name (the built-ins registered)
- ``batch.py``       ``TextEnvBatch``: many environments per worker, failures counted, not fatal
- ``tool_env.py``    ``ToolEnv``: a task plus tools; a turn that calls a tool gets the tool's output
- ``calculator.py``  3-digit products with the calculator tool, train/held-out problems disjoint
- ``guess.py``       guess-the-number with higher/lower feedback
- ``adapters.py``    GEM environments and reasoning-gym tasks (optional extras, imported lazily)
"""

from m2flow.envs.text.base import TEXT_ENVS, TextEnv, register_text_env
from m2flow.envs.text.batch import EnvStep, TextEnvBatch, TextEnvStats
from m2flow.envs.text.registry import make_text_env, text_env_names
from m2flow.envs.text.tool_env import ToolEnv

__all__ = [
    "TEXT_ENVS",
    "EnvStep",
    "TextEnv",
    "TextEnvBatch",
    "TextEnvStats",
    "ToolEnv",
    "make_text_env",
    "register_text_env",
    "text_env_names",
]
