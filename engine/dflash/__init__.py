"""The DFlash block drafter (z-lab's DFlashDraftModel): its checkpoint directory, config, tensor table, fit to a
target, the torch forward with its context cache, and a numpy golden model. engine/drafters/dflash.py is the
drafter built on it; docs/dflash.md describes the format and the forward."""
from .checkpoint import DFlashCheckpoint, dflash_dir_beside, load_tensors, read_dflash_dir, save_dflash_dir
from .config import DFlashConfig, DFlashLoadError, build_target_layer_ids
from .fit import check_fits
from .model import DFlashModel, DFlashWeights

__all__ = ["DFlashCheckpoint", "DFlashConfig", "DFlashLoadError", "DFlashModel", "DFlashWeights",
           "build_target_layer_ids", "check_fits", "dflash_dir_beside", "load_tensors", "read_dflash_dir",
           "save_dflash_dir"]
