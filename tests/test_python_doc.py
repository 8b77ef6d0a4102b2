"""docs/python.md runs as written: its code blocks in order, in one namespace, on tiny stand-ins
of the same families (a 2-layer Llama with SmolLM2's tokenizer, as a GGUF file for ``"smollm2"``
and as a Hugging Face folder for ``"hf-folder"``); each ``# CLI:`` twin is run through the
command line and every file it writes is compared with the Python call's, byte for byte."""

from __future__ import annotations

import json
import os
import re
import shlex
from pathlib import Path

import pytest

pytest.importorskip("transformers")
pytest.importorskip("gguf")

from lowbit.checkpoints.streaming import convert_hf_to_gguf
from lowbit.cli import main
from tiny_models import llamacpp_tiny_models

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "python.md"


def _blocks() -> list[str]:
    return re.findall(r"```python\n(.*?)```", DOC.read_text(encoding="utf-8"), flags=re.S)


def _outputs(argv: list[str]) -> Path:
    return Path(argv[argv.index("--out") + 1])


def _same(cli: Path, api: Path) -> None:
    if cli.is_file():
        assert cli.read_bytes() == api.read_bytes(), (cli, api)
        return
    names = sorted(p.name for p in cli.glob("*.safetensors"))
    assert names and names == sorted(p.name for p in api.glob("*.safetensors"))
    for n in names:
        assert (cli / n).read_bytes() == (api / n).read_bytes(), n
    for n in ("config.json", "tokenizer.json"):
        if (cli / n).exists():
            assert (cli / n).read_bytes() == (api / n).read_bytes(), n


def test_python_doc_runs_and_matches_the_cli(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    hf = llamacpp_tiny_models(tmp_path) / "tiny-llama"
    gguf_path = tmp_path / "tiny-llama.gguf"
    convert_hf_to_gguf(hf, gguf_path, outtype="f32", progress=False)
    monkeypatch.chdir(tmp_path)
    names = {'"smollm2"': repr(str(gguf_path)), '"hf-folder"': repr(str(hf))}
    cli_names = {"smollm2": str(gguf_path), "hf-folder": str(hf)}
    namespace: dict = {}
    twins = 0
    for block in _blocks():
        code = block
        for k, v in names.items():
            code = code.replace(k, v)
        exec(compile(code, str(DOC), "exec"), namespace)
        for line in block.splitlines():
            j = re.match(r"\s*# CLI --json \((\w+)\): lowbit (.*)", line)
            if j:  # a twin without files: its --json document equals the result's to_json()
                capsys.readouterr()
                assert main([*shlex.split(j.group(2)), "--json"]) == 0, line
                printed = json.loads(capsys.readouterr().out)
                printed.pop("plot", None)  # the command's --plot file, not a result
                assert printed == json.loads(namespace[j.group(1)].to_json()), line
                twins += 1
                continue
            m = re.match(r"\s*# CLI: lowbit (.*)", line)
            if not m:
                continue
            argv = [cli_names.get(a, a) for a in shlex.split(m.group(1).format(**namespace))]
            assert main([*argv, "--no-progress"]) == 0, argv
            cli_out = _outputs(argv)
            api_out = Path(re.sub(r"^cli[-.]?", lambda x: "out" + x.group(0)[3:], cli_out.name))
            if cli_out.name.startswith("cli-hf"):
                api_out = Path(cli_out.name.removeprefix("cli-"))
            _same(cli_out, api_out)
            twins += 1
    assert twins >= 8
    assert not [p for p in Path(os.getcwd()).iterdir() if p.name.startswith(".lowbit-")]
