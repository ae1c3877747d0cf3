"""Decoding: AR, chain and DDTree steps, the fixed trees, sampling, and the decode session."""
