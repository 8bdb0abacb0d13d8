"""GPU transports (need CUDA): IPC between processes sharing a GPU, NCCL between two GPUs."""

from __future__ import annotations

import multiprocessing as mp
import os

import pytest
import torch

pytestmark = pytest.mark.gpu


def _receiver(rdv_dir: str, visible: str, out: mp.Queue) -> None:
    os.environ["CUDA_VISIBLE_DEVICES"] = visible
    from m2flow.runtime.comm import Communicator, FileRendezvous

    comm = Communicator("gpu-recv", 0, rendezvous=FileRendezvous(rdv_dir))
    try:
        got = comm.recv("gpu-send", 0, timeout=120)
        first = got["w"].clone()
        comm.send("received", "gpu-send", 0)
        comm.recv("gpu-send", 0, timeout=120)  # the sender has changed its tensor by now
        out.put({
            "device": got["w"].device.type,
            "same_after_sender_write": torch.equal(first, got["w"]),
            "values": got["w"].cpu().tolist(),
            "cpu": got["cpu"].tolist(),
            "bf16": str(got["bf16"].dtype),
        })
    finally:
        comm.close()


def _run_pair(tmp_path, recv_visible: str, send_device: int) -> dict:
    from m2flow.runtime.comm import Communicator, FileRendezvous

    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    proc = ctx.Process(target=_receiver, args=(str(tmp_path), recv_visible, out))
    proc.start()
    comm = Communicator("gpu-send", 0, rendezvous=FileRendezvous(tmp_path))
    try:
        w = torch.arange(6, dtype=torch.float32, device=f"cuda:{send_device}")
        payload = {"w": w, "cpu": torch.ones(2), "bf16": torch.zeros(3, dtype=torch.bfloat16, device=w.device)}
        comm.send(payload, "gpu-recv", 0)
        assert comm.recv("gpu-recv", 0, timeout=120) == "received"
        w.fill_(-1)  # the receiver must hold its own copy
        torch.cuda.synchronize()
        comm.send("changed", "gpu-recv", 0)
        result = out.get(timeout=120)
    finally:
        proc.join(timeout=60)
        comm.close()
    return result


def test_same_gpu_tensors_arrive_on_the_gpu_as_private_copies(tmp_path):
    result = _run_pair(tmp_path, recv_visible=os.environ.get("CUDA_VISIBLE_DEVICES", "0").split(",")[0], send_device=0)
    assert result == {
        "device": "cuda", "same_after_sender_write": True, "values": [0.0, 1.0, 2.0, 3.0, 4.0, 5.0],
        "cpu": [1.0, 1.0], "bf16": "torch.bfloat16",
    }


@pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.device_count() < 2, reason="needs two GPUs")
def test_tensors_between_two_gpus_go_by_nccl(tmp_path):
    result = _run_pair(tmp_path, recv_visible="1", send_device=0)
    assert result["device"] == "cuda" and result["values"] == [0.0, 1.0, 2.0, 3.0, 4.0, 5.0]
    assert result["same_after_sender_write"]
