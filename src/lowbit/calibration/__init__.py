"""Walking a model block by block to calibrate it: the calibration text, captures, Hessians and the GPTQ/AWQ drivers."""
