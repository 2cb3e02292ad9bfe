"""Batched augmentation: SimCLR views, DACL mixups, Gaussian positives, ArCL shifts."""
