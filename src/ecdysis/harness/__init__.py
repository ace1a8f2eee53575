"""Harness: a versioned directory of layer files (H3 contract, H5 skills, H2 action, H4 regulation)."""
