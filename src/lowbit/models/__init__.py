"""Runnable torch models from checkpoints (needs torch and transformers, imported on use)."""
