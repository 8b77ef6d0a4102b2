"""One library function per job the command line does, each writing the same bytes as its
command: :func:`lowbit.jobs.quantize.quantize_model` (``lowbit quantize``: every source, method
and output), :func:`lowbit.jobs.gguf.gguf_mix` and :func:`lowbit.jobs.gguf.gguf_budget` (its
llama.cpp routes), :func:`lowbit.jobs.mlx_budget.mlx_budget` (its MLX budgets), with typed
results (:mod:`lowbit.jobs.results`). ``lowbit/cli/`` parses arguments and prints; the work is
here.
"""
