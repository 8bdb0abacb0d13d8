"""Execution backends: training (torch DDP / FSDP2) and generation (HF generate; vLLM on CUDA)."""
