"""What each tensor of a model becomes: rules, precision plans, presets and the bits-budget solver."""
