"""Timers, NVTX ranges, torch.profiler capture and the report exporters."""
