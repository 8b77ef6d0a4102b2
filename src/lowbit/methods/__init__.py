"""Calibrated methods and rotations, the maths on one layer: GPTQ, AWQ, SmoothQuant, Hadamard rotations and the exact scale folds."""
