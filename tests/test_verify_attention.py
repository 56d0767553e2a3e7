"""benchmarks/micro/verify_attention_bench.py on the CPU: the plot from a saved result, and its clear errors (the
kernels themselves run on the GPU only)."""

from __future__ import annotations

import json

import pytest
import torch

from benchmarks.micro import verify_attention_bench as verify_attention


def test_plot_from_a_saved_result(tmp_path):
    rows = [
        {"geometry": g, "bs": bs, "prefix": n, "speedup": 1.0 + bs / n}
        for g in verify_attention.GEOMETRIES
        for bs in (1, 4)
        for n in (256, 1024)
    ]
    saved = tmp_path / "verify_attention.json"
    saved.write_text(json.dumps({"device": "stub", "rows": rows}))
    assert verify_attention.main(["--plot", str(saved), "--out", str(tmp_path / "out")]) == 0
    assert (tmp_path / "out" / "verify_attention.png").stat().st_size > 0


def test_bad_inputs_are_named(tmp_path, capsys):
    with pytest.raises(SystemExit) as e:
        verify_attention.main(["--plot", str(tmp_path / "missing.json"), "--out", str(tmp_path)])
    assert e.value.code == 2 and "missing.json: not a readable verify_attention.json" in capsys.readouterr().err
    if not torch.cuda.is_available():
        with pytest.raises(SystemExit) as e:
            verify_attention.main(["--out", str(tmp_path)])
        assert e.value.code == 2 and "needs a CUDA GPU" in capsys.readouterr().err
