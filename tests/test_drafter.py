"""The trainable DFlash drafter: SGLang-compatible config and names, block masking, serving numerics."""

import pytest
import torch

from sglang_lilicorr.drafter import (
    DFlashDrafter,
    DrafterConfig,
    DrafterConfigError,
    DrafterShapeError,
    RopeScaling,
    block_layout,
    default_target_layer_ids,
    sample_anchors,
)

YARN = RopeScaling("yarn", factor=4.0, original_max_position_embeddings=64)


def tiny_config(**kw):
    base = dict(
        hidden_size=32,
        vocab_size=64,
        num_target_layers=6,
        target_layer_ids=(1, 3),
        mask_token_id=5,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=8,
        intermediate_size=48,
        block_size=4,
        rope_theta=10000.0,
    )
    base.update(kw)
    return DrafterConfig(**base)


def test_target_layer_ids_follow_sglang_convention():
    from sglang.srt.speculative.dflash_utils import build_target_layer_ids

    for n in range(4, 40):
        for k in range(1, 7):
            assert default_target_layer_ids(n, k) == build_target_layer_ids(n, k)
    assert default_target_layer_ids(30, 5) == [1, 8, 14, 20, 27]
    with pytest.raises(DrafterConfigError, match="at least 4 layers"):
        default_target_layer_ids(3, 2)


def test_config_roundtrip_and_sglang_parses_it():
    from sglang.srt.speculative.dflash_utils import parse_dflash_draft_config

    cfg = tiny_config()
    hf = cfg.to_hf_config()
    assert DrafterConfig.from_hf_config(hf) == cfg
    parsed = parse_dflash_draft_config(draft_hf_config=hf)
    assert parsed.block_size == 4 and parsed.target_layer_ids == [1, 3] and parsed.mask_token_id == 5
    assert parsed.resolve_target_layer_ids(target_num_layers=6) == [1, 3]
    assert hf["architectures"] == ["DFlashDraftModel"] and hf["model_type"] == "qwen3"


def test_yarn_config_round_trips_as_sglang_reads_it(tmp_path):
    """Our config.json, parsed the way SGLang's DFlash attention parses it (transformers AutoConfig ->
    get_rope_config), names YaRN with our factor and original length; and it reads back equal."""
    import json

    from sglang.srt.utils.hf_transformers.common import get_context_length, get_rope_config
    from transformers import AutoConfig

    cfg = tiny_config(rope_scaling=YARN, max_position_embeddings=512)
    hf = cfg.to_hf_config()
    assert hf["rope_parameters"] == {
        "rope_theta": 10000.0,
        "rope_type": "yarn",
        "factor": 4.0,
        "original_max_position_embeddings": 64,
    }
    assert DrafterConfig.from_hf_config(hf) == cfg
    (tmp_path / "config.json").write_text(json.dumps(hf))
    parsed = AutoConfig.from_pretrained(tmp_path)
    theta, rope = get_rope_config(parsed)
    assert theta == 10000.0
    assert (rope["rope_type"], rope["factor"], rope["original_max_position_embeddings"]) == ("yarn", 4.0, 64)
    assert get_context_length(parsed) == 512  # SGLang's draft context: max_position_embeddings
    assert DrafterConfig.from_hf_config(parsed.to_dict()) == cfg  # as transformers writes it back


def test_default_rope_config_json_is_byte_identical_to_the_shipped_drafts():
    import json
    from pathlib import Path

    from sglang_lilicorr.checkpoint import lilicorr_config
    from sglang_lilicorr.train.export import draft_config

    for name in ("smollm2-dflash", "smollm2-lilicorr"):
        path = Path(__file__).resolve().parents[1] / "checkpoints" / name / "config.json"
        shipped = json.loads(path.read_text())
        cfg = DrafterConfig.from_hf_config(shipped)
        assert cfg.rope_scaling == RopeScaling()
        head = lilicorr_config(shipped) if "lilicorr" in name else None
        written = json.dumps(draft_config(cfg, head, shipped["torch_dtype"]), indent=2, sort_keys=True) + "\n"
        assert written == path.read_text(), name


@pytest.mark.parametrize(
    "rope, match",
    [
        ({"rope_type": "llama3", "factor": 8.0}, "rope_type='llama3' is not supported"),
        ({"rope_type": "yarn", "factor": 4.0}, "lacks 'original_max_position_embeddings'"),
        (
            {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64, "beta_fast": 16},
            r"\['beta_fast'\]",
        ),
        (
            {"rope_type": "yarn", "factor": 1.0, "original_max_position_embeddings": 64},
            "factor=1.0 must be a finite number > 1",
        ),
        (
            {"rope_type": "yarn", "factor": "4", "original_max_position_embeddings": 64},
            "rope_parameters.factor='4' is not a number",
        ),
        ({"rope_type": "default", "factor": 4.0}, r"\['factor'\]"),
        ([1, 2], "is not a JSON object"),
    ],
    ids=["llama3", "no-original", "beta", "factor-1", "factor-str", "default-factor", "list"],
)
def test_unsupported_rope_parameters_are_named(rope, match):
    hf = tiny_config().to_hf_config()
    hf["rope_parameters"] = rope
    with pytest.raises(DrafterConfigError, match=match):
        DrafterConfig.from_hf_config(hf)


def test_bad_configs_name_the_field():
    with pytest.raises(DrafterConfigError, match="target_layer_ids"):
        tiny_config(target_layer_ids=(1, 5))  # 5 = last layer of 6: not capturable
    with pytest.raises(DrafterConfigError, match="mask_token_id"):
        tiny_config(mask_token_id=64)
    with pytest.raises(DrafterConfigError, match="num_key_value_heads"):
        tiny_config(num_key_value_heads=3)


def test_tensor_names_are_sglang_checkpoint_names():
    names = set(DFlashDrafter(tiny_config()).state_dict())
    per_layer = [
        "self_attn.q_proj.weight",
        "self_attn.k_proj.weight",
        "self_attn.v_proj.weight",
        "self_attn.o_proj.weight",
        "self_attn.q_norm.weight",
        "self_attn.k_norm.weight",
        "input_layernorm.weight",
        "post_attention_layernorm.weight",
        "mlp.gate_proj.weight",
        "mlp.up_proj.weight",
        "mlp.down_proj.weight",
    ]
    want = {f"layers.{i}.{p}" for i in range(2) for p in per_layer} | {"norm.weight", "fc.weight", "hidden_norm.weight"}
    assert names == want
    assert tuple(DFlashDrafter(tiny_config()).fc.weight.shape) == (32, 2 * 32)


def serving_block(drafter, context, embeds, anchor):
    """What SGLang computes for one block: keys = context 0..a-1 then the block, all visible."""
    bsz = embeds.shape[0]
    ctx = context[:, :anchor]
    attend = torch.ones(1, bsz, anchor + bsz, dtype=torch.bool)
    return drafter(embeds[None], (anchor + torch.arange(bsz))[None], ctx, torch.arange(anchor)[None], attend)[0]


def test_batched_blocks_equal_serving_blocks():
    torch.manual_seed(0)
    cfg = tiny_config()
    drafter = DFlashDrafter(cfg).double()
    b, t = 2, 20
    embed = torch.randn(cfg.vocab_size, cfg.hidden_size, dtype=torch.float64)
    ids = torch.randint(0, cfg.vocab_size, (b, t))
    loss_mask = torch.zeros(b, t, dtype=torch.bool)
    loss_mask[:, 6:] = True
    loss_mask[1, 15:] = False  # shorter second sequence (padding)
    anchors, valid = sample_anchors(loss_mask, 5, torch.Generator().manual_seed(1))
    assert valid[0].all() and (anchors[valid] >= 6).all() and (anchors[1][valid[1]] <= 13).all()
    lay = block_layout(ids, loss_mask, anchors, valid, cfg.block_size, cfg.mask_token_id)
    features = torch.randn(b, t, 2 * cfg.hidden_size, dtype=torch.float64)
    context = drafter.project_target_hidden(features)
    out = drafter(embed[lay.block_ids.view(b, -1)], lay.positions, context, torch.arange(t).expand(b, t), lay.attend)
    out = out.view(b, -1, cfg.block_size, cfg.hidden_size)
    for r in range(b):
        for n in range(anchors.shape[1]):
            if not valid[r, n]:
                continue
            a = int(anchors[r, n])
            ref = serving_block(drafter, context[r : r + 1], embed[lay.block_ids[r, n]], a)
            torch.testing.assert_close(out[r, n], ref, rtol=1e-10, atol=1e-10)
            assert lay.block_ids[r, n, 0] == ids[r, a] and (lay.block_ids[r, n, 1:] == cfg.mask_token_id).all()
            for s in range(1, cfg.block_size):
                ok = a + s < t and bool(loss_mask[r, a + s])
                assert bool(lay.target_valid[r, n, s - 1]) == ok
                if ok:
                    assert lay.targets[r, n, s - 1] == ids[r, a + s]


def test_rope_uses_absolute_positions_like_sglang():
    from sglang_lilicorr.drafter.rope import apply_rope

    x = torch.randn(1, 3, 2, 8)
    pos = torch.tensor([[0, 5, 17]])
    inv = 1.0 / (10000.0 ** (torch.arange(0, 8, 2).float() / 8))
    ang = pos[0, :, None].float() * inv
    cos, sin = torch.cat([ang.cos()] * 2, -1)[:, None], torch.cat([ang.sin()] * 2, -1)[:, None]
    rot = torch.cat([-x[0, ..., 4:], x[0, ..., :4]], -1)
    torch.testing.assert_close(apply_rope(x, pos, 10000.0)[0], x[0] * cos + rot * sin)


def test_default_rope_is_bit_identical_to_plain_rope(gen):
    from sglang_lilicorr.drafter.rope import apply_rope

    x = torch.randn(2, 5, 3, 16, generator=gen).bfloat16()
    pos = torch.randint(0, 40000, (2, 5), generator=gen)
    inv_freq = 1.0 / (1e6 ** (torch.arange(0, 16, 2, dtype=torch.float32) / 16))  # plain RoPE, fp32
    angle = pos.to(torch.float32)[..., None] * inv_freq
    cos, sin = angle.cos()[:, :, None, :], angle.sin()[:, :, None, :]
    x1, x2 = x.float().chunk(2, dim=-1)
    want = torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1).bfloat16()
    assert torch.equal(apply_rope(x, pos, 1e6), want)
    assert torch.equal(apply_rope(x, pos, 1e6, RopeScaling()), want)


def publish_tiny_target(tmp_path) -> None:
    """A tiny Llama target's config.json in tmp_path / "target", published as the scheduler's server args: what
    SGLang's draft model reads of its target when it is built."""
    import json

    from sglang.srt.runtime_context import publish
    from sglang.srt.server_args import ServerArgs

    target = tmp_path / "target"
    target.mkdir()
    (target / "config.json").write_text(
        json.dumps(
            {
                "architectures": ["LlamaForCausalLM"],
                "model_type": "llama",
                "hidden_size": 32,
                "intermediate_size": 64,
                "num_hidden_layers": 6,
                "num_attention_heads": 4,
                "num_key_value_heads": 2,
                "vocab_size": 64,
                "max_position_embeddings": 512,
                "rms_norm_eps": 1e-6,
                "torch_dtype": "float32",
            }
        )
    )
    publish(ServerArgs(model_path=str(target), device="cpu"), role="scheduler")


def stub_vllm_rotary_op() -> None:
    """SGLang's rotary layer imports vllm's op on a machine without CUDA; it is never called on CPU."""
    import sys
    import types

    sys.modules.setdefault("vllm", types.ModuleType("vllm"))
    if "vllm._custom_ops" not in sys.modules:
        ops = types.ModuleType("vllm._custom_ops")
        ops.rotary_embedding = None
        sys.modules["vllm._custom_ops"] = ops


def sglang_rope_of(config: DrafterConfig, tmp_path):
    """SGLang's rotary embedding for our exported config, built as its DFlash attention builds it:
    config.json -> transformers AutoConfig -> get_rope_config -> get_rope."""
    import json

    from sglang.srt.layers.rotary_embedding import get_rope
    from sglang.srt.utils.hf_transformers.common import get_rope_config
    from transformers import AutoConfig

    stub_vllm_rotary_op()
    (tmp_path / "config.json").write_text(json.dumps(config.to_hf_config()))
    hf = AutoConfig.from_pretrained(tmp_path)
    theta, rope_scaling = get_rope_config(hf)
    return get_rope(
        config.head_dim, config.head_dim, hf.max_position_embeddings, theta, True, rope_scaling, torch.float32
    )


@pytest.mark.parametrize("scaling", [RopeScaling(), YARN], ids=["default", "yarn"])
def test_rope_matches_sglang_rotary_embedding(scaling, tmp_path, gen):
    """Against SGLang's own rotary class (YaRNScalingRotaryEmbedding for yarn) on fresh inputs, at
    positions up to 6x the YaRN original length (past original x factor, where SGLang extends its cache)."""
    pytest.importorskip("sglang")
    from sglang_lilicorr.drafter.rope import apply_rope

    cfg = tiny_config(head_dim=16, rope_scaling=scaling)
    rope = sglang_rope_of(cfg, tmp_path)
    assert type(rope).__name__ == ("YaRNScalingRotaryEmbedding" if scaling.is_yarn else "RotaryEmbedding")
    n, heads, kv_heads = 48, cfg.num_attention_heads, cfg.num_key_value_heads
    pos = torch.randint(0, 6 * 64, (n,), generator=gen)
    rope._ensure_cos_sin_cache_length(int(pos.max()))  # SGLang reserves the serving context the same way
    q = torch.randn(n, heads * 16, generator=gen)
    k = torch.randn(n, kv_heads * 16, generator=gen)
    want_q, want_k = rope.forward_native(pos, q.clone(), k.clone())
    got_q = apply_rope(q.view(1, n, heads, 16), pos[None], cfg.rope_theta, scaling)
    got_k = apply_rope(k.view(1, n, kv_heads, 16), pos[None], cfg.rope_theta, scaling)
    torch.testing.assert_close(got_q.reshape(n, -1), want_q, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(got_k.reshape(n, -1), want_k, rtol=1e-5, atol=1e-5)


def test_mismatched_target_width_is_a_clear_error():
    drafter = DFlashDrafter(tiny_config())
    with pytest.raises(DrafterShapeError, match="2 layers x hidden 32"):
        drafter.project_target_hidden(torch.randn(1, 3, 48))


# --- equivalence with SGLang 0.5.23's own DFlashDraftModel (built on CPU) -------------------


class _ContextAttention(torch.nn.Module):
    """Stands in for RadixAttention: non-causal attention over [context K/V | block K/V]."""

    def __init__(self, heads, kv_heads, head_dim):
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = heads, kv_heads, head_dim
        self.context = None  # (k, v) [T, kv_heads * D], set per forward

    def forward(self, q, k, v, forward_batch):
        ck, cv = self.context
        d = self.head_dim
        q = q.view(-1, self.heads, d).transpose(0, 1)
        k = torch.cat([ck, k]).view(-1, self.kv_heads, d).transpose(0, 1)
        v = torch.cat([cv, v]).view(-1, self.kv_heads, d).transpose(0, 1)
        out = torch.nn.functional.scaled_dot_product_attention(q, k, v, enable_gqa=True)
        return out.transpose(0, 1).reshape(-1, self.heads * d)


@pytest.mark.parametrize(
    "scaling",
    [RopeScaling(), RopeScaling("yarn", factor=2.0, original_max_position_embeddings=8)],
    ids=["default", "yarn"],
)
def test_matches_sglang_dflash_draft_model(scaling, tmp_path):
    """Our drafter's block hidden states equal SGLang's DFlashDraftModel's, loaded from our tensors,
    with SGLang's serving-time context path (project_target_hidden -> kv_proj_only -> k_norm -> RoPE);
    with YaRN, the block runs past the original length."""
    import json

    pytest.importorskip("sglang")
    stub_vllm_rotary_op()
    from sglang.srt.models.dflash import DFlashDraftModel
    from sglang.srt.runtime_context import get_parallel
    from transformers import AutoConfig

    cfg = tiny_config(rope_scaling=scaling)
    publish_tiny_target(tmp_path)
    draft_dir = tmp_path / "draft"
    draft_dir.mkdir()
    (draft_dir / "config.json").write_text(json.dumps({**cfg.to_hf_config(), "torch_dtype": "float32"}))
    theirs = DFlashDraftModel(AutoConfig.from_pretrained(draft_dir)).float()

    torch.manual_seed(3)
    ours = DFlashDrafter(cfg)
    for p in ours.parameters():  # non-trivial norms too
        p.data.add_(torch.randn_like(p) * 0.05)
    theirs.load_weights(iter({k: v.clone() for k, v in ours.state_dict().items()}.items()))

    t_len, anchor = 11, 7
    features = torch.randn(t_len, 2 * cfg.hidden_size)
    embeds = torch.randn(cfg.block_size, cfg.hidden_size)
    ctx_pos = torch.arange(anchor)
    positions = anchor + torch.arange(cfg.block_size)
    with torch.no_grad():
        ctx = theirs.project_target_hidden(features[:anchor])
        for layer in theirs.layers:
            attn = layer.self_attn
            k, v = attn.kv_proj_only(theirs.prepare_context_hidden_for_kv(layer, ctx))
            stub = _ContextAttention(attn.num_heads, attn.num_kv_heads, attn.head_dim)
            stub.context = (attn.apply_k_rope(ctx_pos, attn.apply_k_norm(k)), v)
            attn.attn = stub
        with get_parallel().override(tp_group=None):  # single process: no TP group to reduce over
            want = theirs(None, positions, None, input_embeds=embeds).hidden_states

        context = ours.project_target_hidden(features[None])
        got = ours(
            embeds[None],
            positions[None],
            context[:, :anchor],
            ctx_pos[None],
            torch.ones(1, cfg.block_size, anchor + cfg.block_size, dtype=torch.bool),
        )[0]
    torch.testing.assert_close(context[0, :anchor], ctx, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
