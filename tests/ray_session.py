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


def stop_ray() -> None:
    """Shut Ray down from a test (to start it again differently): the pooled rank processes are killed and
    the threads handing processes back have left Ray first. A thread still inside ``ray.wait`` while Ray
    shuts down, or after it starts again, can crash the test process."""
    global _CLUSTER
    import ray

    from m2flow.runtime import host_pool

    host_pool.clear()
    if _CLUSTER is not None:
        _CLUSTER.shutdown()
        _CLUSTER = None
    if ray.is_initialized():
        ray.shutdown()
