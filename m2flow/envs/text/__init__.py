"""Text environments for agentic RL: the gymnasium-style interface GEM uses, on strings.

- ``base.py``        ``TextEnv`` (``reset(seed)``, ``step(action_text)``) and ``TEXT_ENVS``
- ``registry.py``    ``make_text_env`` by name (the built-ins registered)
- ``batch.py``       ``TextEnvBatch``: many environments per worker, failures counted, not fatal
- ``tool_env.py``    ``ToolEnv``: a task plus tools; a turn that calls a tool gets the tool's output
- ``calculator.py``  3-digit products with the calculator tool, train/held-out problems disjoint
- ``guess.py``       guess-the-number with higher/lower feedback
- ``adapters.py``    GEM environments and reasoning-gym tasks (optional extras, imported lazily)
"""

from m2flow.lazy import lazy_names

# Names resolve on first use: a config checks an environment's name without importing the environments.
_HOME = {"TEXT_ENVS": "base", "TextEnv": "base", "register_text_env": "base", "EnvStep": "batch",
         "TextEnvBatch": "batch", "TextEnvStats": "batch", "make_text_env": "registry", "text_env_names": "registry",
         "ToolEnv": "tool_env"}
__getattr__, __dir__ = lazy_names(__name__, _HOME)

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
