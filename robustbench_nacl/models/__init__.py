"""Encoders, heads, dual BatchNorm, frozen feature extraction and checkpoints (ours and foreign)."""
