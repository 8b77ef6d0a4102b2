"""llama.cpp's model file: the writer (:mod:`.writer`), architecture tables (:mod:`.arch`,
:mod:`.names`, :mod:`.hparams`, :mod:`.config`), the Hugging Face -> GGUF converter
(:mod:`.convert`, :mod:`.hf_config`), the tokenizer (:mod:`.tokenizer`), importance matrices
(:mod:`.imatrix`), llama-quantize's mixes (:mod:`.mix`) and size budgets (:mod:`.budget`).
The container parser itself is :mod:`lowbit.checkpoints.io.gguf_file`.
"""
