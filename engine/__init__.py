"""DDTree Studio engine: pure Python and torch (no Streamlit, no profiling, no commands).

config.py and records.py are light (no torch); loaders/ reads models from disk, model/ holds the torch models and
the numpy golden models, decoding/ the AR / chain / DDTree decoders, drafters/ the drafter seam and registry,
training/ the target and drafter training loops.
"""
