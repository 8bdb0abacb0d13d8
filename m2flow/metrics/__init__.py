"""Run metrics: named scalars per step, to the console, JSON lines, TensorBoard and W&B."""

from m2flow.metrics.console import ConsoleSink
from m2flow.metrics.logger import SINK_NAMES, MetricsConfig, MetricsLogger, is_main_process
from m2flow.metrics.names import KNOWN_PREFIXES, MetricNameError, NameChecker, prefix_of
from m2flow.metrics.sinks import METRICS_FILE, JsonlSink, MetricsSink, TensorBoardSink, WandbSink
from m2flow.metrics.timing import Timings, timer

__all__ = [
    "KNOWN_PREFIXES", "METRICS_FILE", "SINK_NAMES", "ConsoleSink", "JsonlSink", "MetricNameError",
    "MetricsConfig", "MetricsLogger", "MetricsSink", "NameChecker", "TensorBoardSink", "Timings",
    "WandbSink", "is_main_process", "prefix_of", "timer",
]
