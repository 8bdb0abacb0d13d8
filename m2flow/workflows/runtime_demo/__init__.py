"""The runtime demo workflow (``workflow: runtime_demo``): three worker groups pass tensors along a pipeline."""
