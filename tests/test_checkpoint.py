"""Checkpoint format: SGLang's LiLiCorrDraftModel layout, saved atomically, loaded strictly."""

import json

import pytest
import torch
from safetensors.torch import load_file, save_file

from benchmarks.served.random_head import add_random_head, vanilla_copy
from draft_heads import load_head
from sglang_lilicorr import checkpoint as ckpt
from sglang_lilicorr.config import LiLiCorrConfig
from sglang_lilicorr.head import LiLiCorrHead
from sglang_lilicorr.train.heads import serving_tensors

HEAD_CFG = LiLiCorrConfig(block_size=6, candidate_topk=4, factor_dim=16, hidden_size=32, num_heads=4)
VANILLA = {
    "architectures": [ckpt.VANILLA_ARCH],
    "model_type": "qwen3",
    "hidden_size": 24,
    "rms_norm_eps": 1e-6,
    "torch_dtype": "bfloat16",
    "block_size": 6,
    "dflash_config": {"block_size": 6, "target_layer_ids": [1, 3], "mask_token_id": 5},
}


@pytest.fixture
def saved(tmp_path):
    head = LiLiCorrHead(HEAD_CFG, model_hidden_size=24).to(torch.bfloat16)
    tensors = {"fc.weight": torch.randn(24, 48, dtype=torch.bfloat16), **serving_tensors(head)}
    path = ckpt.save_checkpoint(tmp_path / "draft", ckpt.with_head(VANILLA, HEAD_CFG), tensors)
    return path, head


def test_round_trip_is_exact(saved):
    path, head = saved
    config = json.loads((path / "config.json").read_text())
    assert config["architectures"] == ["LiLiCorrDraftModel"]
    assert config["dflash_config"]["lilicorr_candidate_topk"] == 4 and config["dflash_config"]["target_layer_ids"] == [
        1,
        3,
    ]
    loaded = load_head(path)
    for name, t in head.state_dict().items():
        assert torch.equal(loaded.state_dict()[name], t), name
    assert "fc.weight" in load_file(str(path / "model.safetensors"))
    assert not [p for p in path.parent.iterdir() if p.name.startswith(".")]  # no temp dir left


def rewrite(path, mutate):
    tensors = load_file(str(path / "model.safetensors"))
    mutate(tensors)
    save_file(tensors, str(path / "model.safetensors"))


@pytest.mark.parametrize(
    "mutate,message",
    [
        (lambda t: t.pop("lilicorr.in_head.weight"), "missing tensor 'in_head.weight'"),
        (
            lambda t: t.__setitem__("lilicorr.extra.weight", torch.zeros(2, dtype=torch.bfloat16)),
            "unexpected tensor 'extra.weight'",
        ),
        (
            lambda t: t.__setitem__("lilicorr.out_head.bias", torch.zeros(15, dtype=torch.bfloat16)),
            r"'out_head.bias' has shape \(15,\), expected \(16,\)",
        ),
        (lambda t: t.__setitem__("lilicorr.out_head.bias", torch.zeros(16)), "'out_head.bias' has dtype torch.float32"),
        (
            lambda t: t.__setitem__("lilicorr.same_slot_bias", torch.full((4,), float("nan"), dtype=torch.bfloat16)),
            "'same_slot_bias' holds NaN",
        ),
    ],
)
def test_strict_load_names_the_bad_tensor(saved, mutate, message):
    path, _ = saved
    rewrite(path, mutate)
    with pytest.raises(ckpt.CheckpointError, match=message):
        load_head(path)


def test_bad_files_and_fields(saved, tmp_path):
    path, _ = saved
    with pytest.raises(ckpt.CheckpointError, match="does not exist"):
        load_head(tmp_path / "nowhere")
    (path / "model.safetensors").write_bytes(b"garbage" * 10)
    with pytest.raises(ckpt.CheckpointError, match="corrupt"):
        load_head(path)
    config = json.loads((path / "config.json").read_text())
    config["dflash_config"]["lilicorr_candidate_topk"] = 6
    (path / "config.json").write_text(json.dumps(config))
    with pytest.raises(ckpt.CheckpointError, match="candidate_topk=6"):
        load_head(path)
    (path / "config.json").write_text("{not json")
    with pytest.raises(ckpt.CheckpointError, match="not valid JSON"):
        load_head(path)


def test_vanilla_draft_has_no_head(tmp_path):
    ckpt.save_checkpoint(tmp_path / "v", VANILLA, {"fc.weight": torch.zeros(24, 48, dtype=torch.bfloat16)})
    with pytest.raises(ckpt.CheckpointError, match="--speculative-algorithm DFLASH"):
        load_head(tmp_path / "v")


def test_save_refuses_non_finite_and_leaves_nothing(tmp_path):
    with pytest.raises(ckpt.CheckpointError, match="NaN or Inf"):
        ckpt.save_checkpoint(tmp_path / "bad", VANILLA, {"fc.weight": torch.tensor([float("inf")])})
    assert not list(tmp_path.iterdir())


def test_block_size_mismatch_between_head_and_drafter():
    with pytest.raises(ckpt.CheckpointError, match="block_size"):
        ckpt.with_head(VANILLA, LiLiCorrConfig(block_size=16, candidate_topk=4, hidden_size=32, num_heads=4))


def test_vanilla_copy_keeps_the_drafter_and_drops_the_head(saved, tmp_path):
    path, _ = saved
    out = vanilla_copy(path, tmp_path / "vanilla")
    config = ckpt.read_config(out)
    assert config["architectures"] == [ckpt.VANILLA_ARCH] and not ckpt.has_head(config)
    assert not [k for k in config["dflash_config"] if k.startswith("lilicorr_")]
    assert config["dflash_config"]["target_layer_ids"] == [1, 3]
    assert set(load_file(str(out / "model.safetensors"))) == {"fc.weight"}


def write_config(folder, config) -> None:
    folder.mkdir(exist_ok=True)
    (folder / "config.json").write_text(json.dumps(config))


@pytest.mark.parametrize(
    "config",
    [[1, 2], {"architectures": [ckpt.VANILLA_ARCH]}, {"architectures": [ckpt.VANILLA_ARCH], "dflash_config": [6]}],
)
def test_a_config_without_a_dflash_config_object_is_refused(tmp_path, config):
    write_config(tmp_path / "d", config)
    with pytest.raises(ckpt.CheckpointError, match="no `dflash_config` object"):
        ckpt.read_config(tmp_path / "d")


def test_each_unreadable_config_is_named(tmp_path):
    (tmp_path / "d").mkdir()
    with pytest.raises(ckpt.CheckpointError, match="config.json is missing"):
        ckpt.read_config(tmp_path / "d")
    (tmp_path / "d" / "config.json").mkdir()  # not a file: cannot be read
    with pytest.raises(ckpt.CheckpointError, match="cannot be read"):
        ckpt.read_config(tmp_path / "d")
    write_config(tmp_path / "e", VANILLA)
    assert ckpt.read_config(tmp_path / "e") == VANILLA
    with pytest.raises(ckpt.CheckpointError, match="model.safetensors is missing"):
        ckpt.read_tensors(tmp_path / "e")


@pytest.mark.parametrize(
    "declared", [["LlamaForCausalLM"], [ckpt.VANILLA_ARCH, ckpt.LILICORR_ARCH], ckpt.LILICORR_ARCH, [], None]
)
def test_each_foreign_architectures_is_refused(tmp_path, declared):
    with pytest.raises(ckpt.CheckpointError, match="is not \\['DFlashDraftModel'\\] or \\['LiLiCorrDraftModel'\\]"):
        ckpt.architecture_of({"architectures": declared})
    write_config(tmp_path / "d", {**VANILLA, "architectures": declared})
    with pytest.raises(ckpt.CheckpointError, match="architectures"):
        ckpt.read_config(tmp_path / "d")
    assert ckpt.architecture_of({"architectures": [ckpt.LILICORR_ARCH]}) == ckpt.LILICORR_ARCH
    assert not ckpt.has_head(VANILLA) and ckpt.has_head({"architectures": [ckpt.LILICORR_ARCH]})


def test_block_size_and_dtype_fields():
    assert ckpt.block_size_of({"dflash_config": {"block_size": 8}, "block_size": 6}) == 8
    assert ckpt.block_size_of({"dflash_config": {}, "block_size": 6}) == 6
    for bad in (True, "16", 16.0, None):
        with pytest.raises(ckpt.CheckpointError, match="no integer block_size"):
            ckpt.block_size_of({"dflash_config": {"block_size": bad}})
    assert ckpt.dtype_of({}) == torch.bfloat16
    assert ckpt.dtype_of({"dtype": "float16"}) == torch.float16
    assert ckpt.dtype_of({"torch_dtype": "float32", "dtype": "float16"}) == torch.float32
    for bad in ("float64", 32, None):
        with pytest.raises(ckpt.CheckpointError, match="is not one of \\['bfloat16', 'float16', 'float32'\\]"):
            ckpt.dtype_of({"torch_dtype": bad})


def test_the_head_config_takes_the_draft_eps_else_1e_6():
    config = ckpt.with_head(VANILLA, HEAD_CFG)
    assert ckpt.lilicorr_config({k: v for k, v in config.items() if k != "rms_norm_eps"}).rms_norm_eps == 1e-6
    assert ckpt.lilicorr_config({**config, "rms_norm_eps": 1e-5}).rms_norm_eps == 1e-5
    assert ckpt.lilicorr_config(config) == HEAD_CFG
    with pytest.raises(ckpt.CheckpointError, match="draft config: .*lilicorr_factor_dim"):
        ckpt.lilicorr_config(
            {
                **config,
                "dflash_config": {k: v for k, v in config["dflash_config"].items() if k != "lilicorr_factor_dim"},
            }
        )
    with pytest.raises(ckpt.CheckpointError, match="hidden_size"):
        ckpt.new_head({k: v for k, v in config.items() if k != "hidden_size"})
    head = ckpt.new_head({**config, "torch_dtype": "float32"})
    assert head.same_slot_bias.dtype == torch.float32 and ckpt.new_head(config).same_slot_bias.dtype == torch.bfloat16
    assert VANILLA["architectures"] == [ckpt.VANILLA_ARCH] and "lilicorr_factor_dim" not in VANILLA["dflash_config"]


def test_the_digest_covers_names_dtypes_shapes_and_bytes_in_any_order():
    a = {"x": torch.arange(6, dtype=torch.float32), "y": torch.zeros(0), "z": torch.tensor([1, 2], dtype=torch.int64)}
    digest = ckpt.tensor_digest(a)
    assert digest == ckpt.tensor_digest(dict(reversed(list(a.items()))))
    for changed in (
        {**a, "x": a["x"].reshape(2, 3)},
        {**a, "x": a["x"].double()},
        {**a, "x": a["x"] + 1},
        {"w": a["x"], "y": a["y"], "z": a["z"]},
        {**a, "y": torch.zeros(0, 2)},
    ):
        assert ckpt.tensor_digest(changed) != digest
    assert ckpt.tensor_digest({"x": a["x"][::2]}) == ckpt.tensor_digest({"x": a["x"][::2].clone()})


def test_a_file_whose_bytes_changed_does_not_match_its_checksum(tmp_path):
    path = ckpt.save_tensors(tmp_path / "t.safetensors", {"x": torch.arange(4, dtype=torch.float32)})
    assert torch.equal(ckpt.load_tensors(path, fix="f")["x"], torch.arange(4, dtype=torch.float32))
    data = bytearray(path.read_bytes())
    data[-1] ^= 0x40  # a bit of the last tensor byte
    path.write_bytes(bytes(data))
    with pytest.raises(ckpt.CheckpointError, match="does not match its checksum") as e:
        ckpt.load_tensors(path, fix="re-export it")
    assert e.value.fix == "re-export it" and e.value.where == str(path)
    save_file({"x": torch.ones(2)}, str(tmp_path / "old.safetensors"))  # written before the digest: loads
    assert torch.equal(ckpt.load_tensors(tmp_path / "old.safetensors", fix="f")["x"], torch.ones(2))
    with pytest.raises(ckpt.CheckpointError, match="the file is missing"):
        ckpt.load_tensors(tmp_path / "none.safetensors", fix="f")


def test_check_tensors_lists_the_first_five_and_the_count():
    expected = {f"t{i}": torch.zeros(2) for i in range(7)}
    with pytest.raises(
        ckpt.CheckpointError, match=r"missing tensor 't0' \(7 missing in all: \['t0', 't1', 't2', 't3', 't4'\]\)"
    ):
        ckpt.check_tensors(expected, {}, "w")
    with pytest.raises(
        ckpt.CheckpointError, match=r"unexpected tensor 'u0' \(6 extra in all: \['u0', 'u1', 'u2', 'u3', 'u4'\]\)"
    ):
        ckpt.check_tensors({}, {f"u{i}": torch.zeros(1) for i in range(6)}, "w")
    ckpt.check_tensors(
        {"i": torch.zeros(2, dtype=torch.int64)}, {"i": torch.tensor([5, -3])}, "w"
    )  # ints: no finite check
    with pytest.raises(ckpt.CheckpointError, match="'f' holds NaN or Inf"):
        ckpt.check_tensors({"f": torch.zeros(2)}, {"f": torch.tensor([0.0, float("-inf")])}, "w")


def test_split_head_and_integer_tensors_are_saved(tmp_path):
    drafter, head = ckpt.split_head(
        {"fc.weight": torch.ones(1), "lilicorr.a.b": torch.zeros(1), "xlilicorr.c": torch.ones(2)}
    )
    assert set(drafter) == {"fc.weight", "xlilicorr.c"} and set(head) == {"a.b"}
    path = ckpt.save_checkpoint(tmp_path / "d", VANILLA, {"fc.weight": torch.ones(2), "ids": torch.tensor([7, 8])})
    assert torch.equal(ckpt.read_tensors(path)["ids"], torch.tensor([7, 8]))


def test_add_random_head_is_seeded_and_takes_the_draft_geometry(tmp_path):
    config = {**VANILLA, "rms_norm_eps": 1e-5}
    ckpt.save_checkpoint(tmp_path / "v", config, {"fc.weight": torch.ones(24, 48, dtype=torch.bfloat16)})
    geometry = dict(candidate_topk=4, factor_dim=16, hidden_size=32, num_heads=4)
    head_cfg = add_random_head(tmp_path / "v", tmp_path / "a", **geometry)
    assert head_cfg == LiLiCorrConfig(block_size=6, rms_norm_eps=1e-5, **geometry)
    add_random_head(tmp_path / "v", tmp_path / "b", seed=0, **geometry)
    add_random_head(tmp_path / "v", tmp_path / "c", seed=1, **geometry)
    a, b, c = (ckpt.read_tensors(tmp_path / n) for n in "abc")
    assert all(torch.equal(a[k], b[k]) for k in a) and not all(torch.equal(a[k], c[k]) for k in a)
    assert torch.equal(a["fc.weight"], torch.ones(24, 48, dtype=torch.bfloat16))
    assert load_head(tmp_path / "a").same_slot_bias.dtype == torch.bfloat16
    ckpt.save_checkpoint(
        tmp_path / "no-eps", VANILLA | {"rms_norm_eps": None}, {"fc.weight": torch.ones(24, 48, dtype=torch.bfloat16)}
    )
    config = json.loads((tmp_path / "no-eps" / "config.json").read_text())
    del config["rms_norm_eps"]
    (tmp_path / "no-eps" / "config.json").write_text(json.dumps(config))
    assert add_random_head(tmp_path / "no-eps", tmp_path / "d", **geometry).rms_norm_eps == 1e-6


def test_config_json_is_written_canonically(tmp_path):
    """Sorted keys, two-space indent, a final newline: equal configs give equal bytes, whatever their key order."""
    shuffled = dict(reversed(list(VANILLA.items())))
    for name, config in (("a", VANILLA), ("b", shuffled)):
        ckpt.save_checkpoint(tmp_path / name, config, {"fc.weight": torch.ones(2)})
    text = (tmp_path / "a" / "config.json").read_text()
    paired = {**VANILLA, ckpt.PAIR_KEY: ckpt.stored_digest(tmp_path / "a" / "model.safetensors")}
    assert text == json.dumps(paired, indent=2, sort_keys=True) + "\n" == (tmp_path / "b" / "config.json").read_text()


# --- what mutation testing found untested: each refusal's whole message, `what (where): fix` ----------------

REEXPORT = "re-export the draft"


def refusal(call) -> ckpt.CheckpointError:
    with pytest.raises(ckpt.CheckpointError) as refused:
        call()
    return refused.value


def test_each_config_refusal_in_full(tmp_path):
    d = tmp_path / "d"
    assert str(refusal(lambda: ckpt.read_config(d))) == (
        f"draft checkpoint directory {str(d)!r} does not exist ({d}): pass the folder written by `lilicorr export`"
    )
    d.mkdir()
    cfg = d / "config.json"
    assert str(refusal(lambda: ckpt.read_config(d))) == (
        f"config.json is missing: a draft checkpoint needs it beside model.safetensors ({cfg}): pass the folder "
        "written by `lilicorr export`"
    )
    cfg.mkdir()
    e = refusal(lambda: ckpt.read_config(d))
    assert e.what.startswith("cannot be read (") and (e.where, e.fix) == (
        str(cfg),
        "check the file and its permissions",
    )
    cfg.rmdir()
    cfg.write_text("{not json")
    e = refusal(lambda: ckpt.read_config(d))
    assert e.what.startswith("not valid JSON (") and (e.where, e.fix) == (str(cfg), "re-export the checkpoint")
    write_config(d, {"architectures": [ckpt.VANILLA_ARCH]})
    assert str(refusal(lambda: ckpt.read_config(d))) == (
        f"no `dflash_config` object: not a DFlash draft config ({cfg}): {REEXPORT}"
    )
    write_config(d, {**VANILLA, "architectures": ["X"]})
    foreign = (
        "`architectures`=['X'] is not ['DFlashDraftModel'] or ['LiLiCorrDraftModel'] ({}): a draft config declares "
        "one of them (`lilicorr export` writes it); re-export the draft"
    )
    assert str(refusal(lambda: ckpt.read_config(d))) == foreign.format(cfg)
    assert str(refusal(lambda: ckpt.architecture_of({"architectures": ["X"]}))) == foreign.format("draft config")


def test_each_field_refusal_in_full():
    assert str(refusal(lambda: ckpt.block_size_of({"dflash_config": {"block_size": "6"}}))) == (
        f"no integer block_size ('6') (dflash_config.block_size): {REEXPORT}"
    )
    assert str(refusal(lambda: ckpt.dtype_of({"torch_dtype": "int8"}))) == (
        f"torch_dtype='int8' is not one of ['bfloat16', 'float16', 'float32'] (torch_dtype): {REEXPORT}"
    )
    assert str(refusal(lambda: ckpt.lilicorr_config(VANILLA))) == (
        "draft declares architectures=['DFlashDraftModel'], not ['LiLiCorrDraftModel']: it has no LiLiCorr head "
        "(architectures): serve it with --speculative-algorithm DFLASH, or export one with a head"
    )
    config = ckpt.with_head(VANILLA, HEAD_CFG)
    config["dflash_config"]["lilicorr_candidate_topk"] = 6
    e = refusal(lambda: ckpt.lilicorr_config(config))
    assert e.what.startswith("draft config: ") and (e.where, e.fix) == ("dflash_config", REEXPORT)
    no_width = {k: v for k, v in ckpt.with_head(VANILLA, HEAD_CFG).items() if k != "hidden_size"}
    assert str(refusal(lambda: ckpt.new_head(no_width))) == "hidden_size=None is not an integer."


def test_each_weights_file_refusal_in_full(tmp_path, monkeypatch):
    write_config(tmp_path / "d", VANILLA)
    weights = tmp_path / "d" / "model.safetensors"
    assert str(refusal(lambda: ckpt.read_tensors(tmp_path / "d"))) == (
        f"model.safetensors is missing: a draft checkpoint needs its weights beside config.json ({weights}): "
        "re-export the checkpoint"
    )
    weights.write_bytes(b"garbage" * 10)
    e = refusal(lambda: ckpt.read_tensors(tmp_path / "d"))
    assert e.what.startswith("truncated, corrupt or not a safetensors file (") and (e.where, e.fix) == (
        str(weights),
        "re-export the checkpoint",
    )
    assert (
        str(refusal(lambda: ckpt.load_tensors(tmp_path / "none", fix="f")))
        == f"the file is missing ({tmp_path / 'none'}): f"
    )
    path = ckpt.save_tensors(tmp_path / "t.safetensors", {"x": torch.arange(4, dtype=torch.float32)})
    data = bytearray(path.read_bytes())
    data[-1] ^= 0x40
    path.write_bytes(bytes(data))
    assert str(refusal(lambda: ckpt.load_tensors(path, fix="f"))) == (
        "does not match its checksum (lilicorr_sha256 in its metadata): "
        f"its bytes changed after it was written ({path}): f"
    )

    def unreadable(_):  # a long cause over several lines: one line of it, its first 200 characters
        raise ValueError("bad\n  header " * 40)

    monkeypatch.setattr(ckpt, "load_file", unreadable)
    cause = " ".join(["bad header"] * 40)[:200]
    assert str(refusal(lambda: ckpt.load_tensors(path, fix="f"))) == (
        f"truncated, corrupt or not a safetensors file ({cause}) ({path}): f"
    )


@pytest.mark.parametrize(
    "expected,found,what,fix",
    [
        ({"a": torch.zeros(2)}, {}, "missing tensor 'a' (1 missing in all: ['a'])", REEXPORT),
        (
            {},
            {"b": torch.zeros(2)},
            "unexpected tensor 'b' (1 extra in all: ['b'])",
            "the config's geometry does not describe these weights: re-export the draft",
        ),
        ({"a": torch.zeros(2)}, {"a": torch.zeros(3)}, "tensor 'a' has shape (3,), expected (2,)", REEXPORT),
        (
            {"a": torch.zeros(2)},
            {"a": torch.zeros(2, dtype=torch.float16)},
            "tensor 'a' has dtype torch.float16, expected torch.float32 (config torch_dtype)",
            REEXPORT,
        ),
        (
            {"a": torch.zeros(2)},
            {"a": torch.tensor([0.0, float("nan")])},
            "tensor 'a' holds NaN or Inf values",
            "export an earlier checkpoint",
        ),
    ],
)
def test_each_tensor_refusal_in_full(expected, found, what, fix):
    assert str(refusal(lambda: ckpt.check_tensors(expected, found, "w"))) == f"{what} (w): {fix}"


def test_a_head_refusal_names_the_weights_file(saved):
    path, _ = saved
    rewrite(path, lambda t: t.pop("lilicorr.in_head.weight"))
    assert refusal(lambda: load_head(path)).where == f"{path / 'model.safetensors'} (head)"


def test_the_config_is_read_as_utf8_whatever_the_locale(tmp_path):
    """An ASCII locale still reads a config holding non-ASCII text."""
    from ascii_locale import run_in_ascii_locale

    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "config.json").write_text(
        json.dumps({**VANILLA, "note": "café"}, ensure_ascii=False), encoding="utf-8"
    )
    assert ckpt.read_config(tmp_path / "d")["note"] == "café"
    code = (
        "import sys; from sglang_lilicorr.checkpoint import read_config; print(ascii(read_config(sys.argv[1])['note']))"
    )
    out = run_in_ascii_locale(code, str(tmp_path / "d"))
    assert out.stdout.strip() == ascii("café"), out.stderr[-2000:]
