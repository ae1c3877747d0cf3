"""The torch models (the MLA/MoE target, the DFlash drafter), their cache, and the numpy golden models."""
