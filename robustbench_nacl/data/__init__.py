"""Datasets as uint8 tensors: registry, class subsets, shifts, on-disk readers."""
