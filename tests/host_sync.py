"""A CUDA op's call that must not wait for the device: torch's sync debug mode turns any host sync into an error."""
from __future__ import annotations

import torch


def assert_no_host_sync(op, args) -> None:
    """Call op(*args) once to load it (lazy module loading, shared-memory attributes), then again with host syncs
    made errors."""
    op(*args)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        op(*args)
    finally:
        torch.cuda.set_sync_debug_mode("default")
