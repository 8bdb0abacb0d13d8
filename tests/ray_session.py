"""One local Ray session shared by every test that needs it (start-up costs seconds)."""

from __future__ import annotations

_CLUSTER = None


def shared_cluster():
    """The shared local cluster; started again if a test module shut Ray down (multi-node tests do)."""
    global _CLUSTER
    import ray

    from m2flow.runtime import Cluster, ClusterConfig

    if _CLUSTER is None or not ray.is_initialized():
        if ray.is_initialized():
            ray.shutdown()
        _CLUSTER = Cluster(ClusterConfig(cpu_devices_per_node=8))
    return _CLUSTER
