"""Tools a language model calls from its text, each under a time limit, and the call format.

- ``calls.py``       the ``<tool>NAME: ARGUMENT</tool>`` format: strict parsing, result/error observations
- ``formats.py``     call formats by name: ``tag`` (``calls.py``) and ``hermes`` (chat templates' ``<tool_call>``)
- ``schema.py``      a tool as a function schema; a call's arguments checked against it
- ``base.py``        the ``Tool`` protocol and ``ToolTimeout``
- ``calculator.py``  exact arithmetic from a parsed expression tree (no ``eval``)
- ``python.py``      a Python snippet in a sandbox process: no network, bounded memory and time
- ``registry.py``    ``TOOLS`` by name and ``ToolBox``: one turn's call answered, outcomes counted

They live beside the reward checks because they share their machinery (the sandbox pool, time limits)
and their rule: text in, text out, no torch and no Ray.
"""
