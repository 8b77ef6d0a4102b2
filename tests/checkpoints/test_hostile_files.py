"""Files that fight back: a GGUF written to a disk that fills up, and GGUF tokenizer merges that
do not fit the vocabulary, are one LowbitError (they were an OSError and tokenizers' bare
Exception)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from lowbit.errors import LowbitError

_FULL_DISK = """
import resource, signal, sys
import numpy as np
from lowbit.checkpoints.gguf.writer import GGUFTensor, write_gguf
from lowbit.errors import LowbitError
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
resource.setrlimit(resource.RLIMIT_FSIZE, (int(sys.argv[2]), resource.RLIM_INFINITY))
t = {"a": np.ones((256, 256), np.float32), "b": GGUFTensor(np.ones((64, 256), np.float32), "Q8_0")}
try:
    write_gguf(sys.argv[1], t, metadata={}, arch="llama", progress=False)
except LowbitError as exc:
    print("LowbitError:", exc)
"""


@pytest.mark.skipif(sys.platform == "win32", reason="needs RLIMIT_FSIZE")
@pytest.mark.parametrize("limit", [100, 5000, 70_000, 200_000])
def test_gguf_to_a_full_disk(tmp_path: Path, limit: int) -> None:
    """The file size limit stands in for a full disk: a short write anywhere in the file is
    one LowbitError and leaves nothing behind (io's short write has no errno: it escaped)."""
    out = tmp_path / "m.gguf"
    r = subprocess.run(
        [sys.executable, "-c", _FULL_DISK, str(out), str(limit)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr
    assert r.stdout.startswith("LowbitError: cannot write"), r.stdout
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("merges", [["Q Z"], ["Ġ"], [""], ["a b c"], ["Ā x"]])
def test_gguf_merges_outside_the_vocabulary(tmp_path: Path, merges: list[str]) -> None:
    """Merges whose tokens (or their join) are not in the vocabulary, or with no space."""
    pytest.importorskip("torch")
    pytest.importorskip("tokenizers")
    from lowbit.checkpoints import open_checkpoint
    from lowbit.checkpoints.tokenizer import build_tokenizer
    from tiny_models import save_gguf, tiny_llama

    p = save_gguf(tiny_llama(), tmp_path / "t.gguf", metadata={"tokenizer.ggml.merges": merges})
    with pytest.raises(LowbitError, match="does not fit the vocabulary"):
        build_tokenizer(open_checkpoint(p))
