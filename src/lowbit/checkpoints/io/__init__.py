"""Bytes on and off disk, below every format: the one checked parser per container
(:mod:`.safetensors`, :mod:`.gguf_file`), the streaming safetensors writer
(:mod:`.safetensors_write`), array casts for writing (:mod:`.arrays`), and output safety
(:mod:`.outputs`: never over an input, never half-written; :mod:`.atomic`, :mod:`.marks`,
:mod:`.debris`). Nothing here knows a checkpoint format.
"""
