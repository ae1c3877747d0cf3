"""DDTree Studio engine: config, checkpoints, golden model, torch model, drafters and decoders."""
