"""`lilicorr check-draft DRAFT --target TARGET`: offline, the LILICORR server's own draft checks plus the
strict loader; prints what the draft is, or every problem at once (exit 1)."""

import json

import pytest
from safetensors.torch import load_file, save_file

from sglang_lilicorr.cli import main
from test_plugin import BAD_DRAFTS, resolve
from test_serving import HIDDEN, TARGET_LAYERS, VOCAB, draft_config, write_tiny_draft, write_tiny_target


@pytest.fixture(scope="module")
def target(tmp_path_factory):
    return write_tiny_target(tmp_path_factory.mktemp("target"))


def check(capsys, draft, target) -> tuple[int, str, list[str]]:
    capsys.readouterr()
    code = main(["check-draft", str(draft), "--target", str(target)])
    out, err = capsys.readouterr()
    return code, out, [line for line in err.splitlines() if line.startswith("error: ")]


def test_a_servable_draft_is_described(tmp_path, target, capsys):
    code, out, errors = check(capsys, write_tiny_draft(tmp_path / "d"), target)
    assert code == 0 and not errors
    assert "LiLiCorrDraftModel, torch_dtype bfloat16" in out
    assert f"drafter: hidden {HIDDEN}, vocab {VOCAB}, 1 layer(s) of 4 heads (2 kv) x 16" in out
    assert f"target layers [1, 2] of {TARGET_LAYERS}, mask token" in out and "(id 3)" in out
    assert "head: K=8, width 64 (the drafter's), 1 layer(s) of 4 heads, d_e 32, sigma 8" in out
    assert "rope: theta 1e+06, scaling default; positions up to 512" in out
    assert f"hidden {HIDDEN}, vocab {VOCAB}, {TARGET_LAYERS} layers, context 512" in out
    assert "--speculative-algorithm LILICORR" in out


def test_the_rope_scaling_found_is_printed(tmp_path, target, capsys):
    config = {
        **draft_config(),
        "rope_parameters": {
            "rope_theta": 1e5,
            "rope_type": "yarn",
            "factor": 4.0,
            "original_max_position_embeddings": 128,
        },
    }
    code, out, errors = check(capsys, write_tiny_draft(tmp_path / "d", config=config), target)
    assert code == 0 and not errors
    assert "rope: theta 100000, scaling yarn x4 from 128 positions; positions up to 512" in out


def test_a_draft_shorter_than_the_target_context_is_a_problem(tmp_path, target, capsys):
    config = {**draft_config(), "max_position_embeddings": 256}
    code, _, errors = check(capsys, write_tiny_draft(tmp_path / "d", config=config), target)
    assert (
        code == 1
        and len(errors) == 1
        and "draft max_position_embeddings=256 is below the 512-token context" in errors[0]
    )


def test_every_problem_is_listed_at_once(tmp_path, target, capsys):
    config = draft_config(candidate_topk=4)  # the head tensors are K = 8
    config["torch_dtype"] = "float8"
    config["dflash_config"]["target_layer_ids"] = [1, 3]  # 3 is the last layer of a 4-layer target
    folder = write_tiny_draft(tmp_path / "d", config=config)
    other = write_tiny_target(tmp_path / "t", hidden_size=128, intermediate_size=256, vocab_size=300)
    code, out, errors = check(capsys, folder, other)
    assert code == 1 and not out
    found = "\n".join(errors)
    for part in (
        "torch_dtype='float8'",
        "head tensors do not match the lilicorr_* geometry",
        "hidden_size=64 but the target has hidden_size=128",
        "vocab_size=256 but the target has vocab_size=300",
        "target_layer_ids has [3], not capturable layers of the 4-layer target",
    ):
        assert part in found, part
    assert len(errors) == 5


def test_the_strict_loader_finds_what_the_header_cannot(tmp_path, target, capsys):
    folder = write_tiny_draft(tmp_path / "d")
    tensors = load_file(str(folder / "model.safetensors"))
    tensors["fc.weight"][0, 0] = float("nan")
    save_file(tensors, str(folder / "model.safetensors"))
    code, _, errors = check(capsys, folder, target)
    assert code == 1 and len(errors) == 1 and "'fc.weight' holds NaN or Inf values" in errors[0]


def test_a_draft_without_architectures_is_named(tmp_path, target, capsys):
    config = draft_config()
    del config["architectures"]
    folder = write_tiny_draft(tmp_path / "d")
    (folder / "config.json").write_text(json.dumps(config))
    code, _, errors = check(capsys, folder, target)
    assert code == 1 and "`architectures`=None" in errors[0]


@pytest.mark.parametrize("case", sorted(BAD_DRAFTS))
def test_check_draft_says_what_the_server_says(case, target, tmp_path, capsys):
    """One code path: the server's first refusal is check-draft's first problem (option name aside)."""
    from sglang_lilicorr.serving.plugin import register

    register()
    make, _ = BAD_DRAFTS[case]
    folder = make(tmp_path / "d")
    with pytest.raises(ValueError) as server:
        resolve(target, draft=folder)
    code, _, errors = check(capsys, folder, target)
    assert code == 1
    assert errors[0] == "error: " + " ".join(str(server.value).split()).replace(
        "--speculative-draft-model-path", "DRAFT"
    )
