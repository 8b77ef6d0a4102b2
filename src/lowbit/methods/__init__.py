"""Calibrated methods, the maths on one layer: GPTQ, AWQ, SmoothQuant and the exact scale folds."""
