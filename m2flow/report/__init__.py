"""Run reports: read a run's trace and metrics, say where the time went, and draw it.

Nothing is imported here so that the ``m2flow report`` command loads fast; use the modules:
``m2flow.report.report.build_report``, ``m2flow.report.analysis``, ``m2flow.report.load``.
"""
