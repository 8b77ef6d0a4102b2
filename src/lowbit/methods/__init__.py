"""Methods on one layer: the maths that prepares weights for a low-bit format."""
