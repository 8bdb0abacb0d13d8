"""Print a CPU float path for torch other than the one it picks on this machine, or nothing if none.

torch runs its CPU kernels on the widest vector instructions the CPU has (``AVX512``, ``AVX2``, else
``DEFAULT``), and each rounds sums differently, so a seeded run's numbers depend on the machine.
``ATEN_CPU_CAPABILITY`` forces a path; a path the CPU lacks is not refused (torch reports it, then
dies on an illegal instruction), so the only safe other path is a narrower one: ``default``.
"""

import sys

import torch

own = torch.backends.cpu.get_cpu_capability()
other = "default" if own in ("AVX2", "AVX512") else ""
print(f"torch's CPU float path here: {own}; the other one tried: {other or 'none'}", file=sys.stderr)
print(other)
