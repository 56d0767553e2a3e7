"""JIT-build (or load from the cache) and run once every flashinfer module that SGLang's flashinfer attention backend
and sampling use (benchmarks/device/flashinfer_slim.py, MODULES, but its spare `page`, which SGLang does not call, and
`topk`, which only DFlash2 drafts call: run when asked), at
SmolLM2-135M's shapes (bf16, 9 query / 3 KV heads, head_dim 64, page size 1; the drafts have the same heads), on tiny
tensors; each attention output is checked against a
float32 torch reference, packbits against a bit-by-bit one. Each step names the JIT modules it builds and runs before
any step that builds them only indirectly (packbits before the custom-mask verify). One line per step with its wall
time; exit 1 with one clear line, naming the module, on the first failure; at the end, the JIT modules loaded against
the slim archive's list (flashinfer/SLIM.json). Run by benchmarks/device/flashinfer.sh on the GPU; arguments: only
the steps whose name contains one of them."""

import json
import sys
import time
from pathlib import Path

import torch

H, KV, D = 9, 3, 64
dev = "cuda"
bf = torch.bfloat16


def ref_attention(q, k, v, causal_offset=None, mask=None):
    """q [n, H, D], k/v [m, KV, D]; causal with the query i at key position causal_offset + i."""
    k = k.float().repeat_interleave(H // KV, dim=1)
    v = v.float().repeat_interleave(H // KV, dim=1)
    s = torch.einsum("nhd,mhd->hnm", q.float(), k) / D**0.5
    if causal_offset is not None:
        n, m = q.shape[0], k.shape[0]
        allowed = torch.arange(m, device=dev)[None, :] <= (causal_offset + torch.arange(n, device=dev))[:, None]
        s = s.masked_fill(~allowed, float("-inf"))
    if mask is not None:
        s = s.masked_fill(~mask, float("-inf"))
    return torch.einsum("hnm,mhd->nhd", s.softmax(-1), v)


LOADED = []  # JIT module names, in the order flashinfer built or loaded them


def track_jit_modules():
    """Record every JitSpec.build_and_load (each flashinfer get_*_module goes through it)."""
    from flashinfer.jit.core import JitSpec

    build_and_load = JitSpec.build_and_load

    def recorded(self):
        out = build_and_load(self)
        if self.name not in LOADED:
            LOADED.append(self.name)
        return out

    JitSpec.build_and_load = recorded


def step(name, modules, fn):
    t0, before = time.time(), len(LOADED)
    try:
        err = fn()
        torch.cuda.synchronize()
    except Exception as e:  # noqa: BLE001
        msg = str(e).splitlines()[0] if str(e) else ""
        print(f"flashinfer_warmup: FAILED {name} (JIT module {modules}): {type(e).__name__}: {msg}")
        raise SystemExit(1)
    if err is not None and err > 0.05:
        print(f"flashinfer_warmup: FAILED {name} (JIT module {modules}): max abs error {err:.3g} against the reference")
        raise SystemExit(1)
    extra = f", max abs err {err:.2e}" if err is not None else ""
    built = ", ".join(LOADED[before:]) or "none new"
    print(f"flashinfer_warmup: {name} [{modules}]: {time.time() - t0:.1f} s{extra}; loaded {built}", flush=True)


def pack_bits_little(bits):
    """numpy.packbits(bits, bitorder="little") in torch: bit i of byte j is bits[8 j + i] (zero-padded)."""
    pad = torch.zeros((-bits.numel()) % 8, dtype=torch.bool, device=bits.device)
    b = torch.cat([bits, pad]).view(-1, 8).to(torch.int32)
    return (b << torch.arange(8, device=bits.device, dtype=torch.int32)).sum(-1).to(torch.uint8)


def main(argv: list[str] | None = None) -> None:
    import flashinfer
    from flashinfer.cascade import merge_state

    torch.manual_seed(0)
    ws = torch.empty(128 << 20, dtype=torch.uint8, device=dev)
    seq = [5, 17]  # two requests' KV lengths; page size 1: one page per token
    total = sum(seq)
    k_cache = torch.randn(total, 1, KV, D, device=dev, dtype=bf)
    v_cache = torch.randn(total, 1, KV, D, device=dev, dtype=bf)
    kv_indptr = torch.tensor([0, seq[0], total], dtype=torch.int32, device=dev)
    kv_indices = torch.arange(total, dtype=torch.int32, device=dev)
    last = torch.ones(2, dtype=torch.int32, device=dev)
    kv = (k_cache[:, 0], v_cache[:, 0])

    def decode():  # SGLang's decode wrapper: NHD, fa2, tensor cores off at GQA group 3
        w = flashinfer.BatchDecodeWithPagedKVCacheWrapper(ws, "NHD", backend="fa2", use_tensor_cores=False)
        w.plan(kv_indptr, kv_indices, last, H, KV, D, 1, q_data_type=bf, kv_data_type=bf)
        q = torch.randn(2, H, D, device=dev, dtype=bf)
        o = w.run(q, (k_cache, v_cache))
        return max(
            (
                o[i].float()
                - ref_attention(
                    q[i : i + 1], kv[0][kv_indptr[i] : kv_indptr[i + 1]], kv[1][kv_indptr[i] : kv_indptr[i + 1]]
                )[0]
            )
            .abs()
            .max()
            .item()
            for i in range(2)
        )

    def quantization():  # the paged wrapper's plan(custom_mask=...) packs the mask with segment_packbits
        from flashinfer.quantization import packbits, segment_packbits

        x = torch.rand(37, device=dev) > 0.5
        assert torch.equal(packbits(x, "little"), pack_bits_little(x)), "packbits differs from the reference"
        indptr = torch.tensor([0, 5, 13, 37], dtype=torch.int32, device=dev)
        y, y_indptr = segment_packbits(x, indptr, "little")
        ref = [pack_bits_little(x[a:b]) for a, b in zip(indptr.tolist(), indptr.tolist()[1:])]
        assert torch.equal(y, torch.cat(ref)), "segment_packbits differs from the reference"
        assert y_indptr.tolist() == [0, *torch.tensor([r.numel() for r in ref]).cumsum(0).tolist()], "its indptr"
        return None

    def prefill_paged(custom_mask, v_strides_differ=False):  # SGLang's extend (causal), verify (custom mask), fa2
        nq = [3, 4]
        qo_indptr = torch.tensor([0, nq[0], sum(nq)], dtype=torch.int32, device=dev)
        q = torch.randn(sum(nq), H, D, device=dev, dtype=bf)
        masks = [torch.rand(n, s, device=dev) > 0.3 for n, s in zip(nq, seq)]
        for m, s, n in zip(masks, seq, nq):
            m[:, : s - n] = True  # the prefix is always visible
            m[torch.arange(n), s - n + torch.arange(n)] = True  # every query sees itself
        w = flashinfer.BatchPrefillWithPagedKVCacheWrapper(ws, "NHD", backend="fa2")
        w.plan(
            qo_indptr,
            kv_indptr,
            kv_indices,
            last,
            H,
            KV,
            D,
            1,
            causal=not custom_mask,
            custom_mask=torch.cat([m.flatten() for m in masks]) if custom_mask else None,
            q_data_type=bf,
            kv_data_type=bf,
        )
        v = v_cache
        if v_strides_differ:  # the same values, strided apart: flashinfer runs the independent-stride module
            v = torch.zeros(total, 1, KV, 2 * D, device=dev, dtype=bf)[..., :D]
            v.copy_(v_cache)
            assert v.stride() != k_cache.stride()
        o = w.run(q, (k_cache, v))
        err = 0.0
        for i in range(2):
            qs, ks = slice(qo_indptr[i], qo_indptr[i + 1]), slice(kv_indptr[i], kv_indptr[i + 1])
            r = ref_attention(
                q[qs],
                kv[0][ks],
                kv[1][ks],
                causal_offset=None if custom_mask else seq[i] - nq[i],
                mask=masks[i][None] if custom_mask else None,
            )
            err = max(err, (o[qs].float() - r).abs().max().item())
        return err

    def ragged(backend):  # SGLang's ragged prefill: backend "auto" (FA3 on sm90 at head_dim 64), fa2 elsewhere
        n = [6, 11]
        indptr = torch.tensor([0, n[0], sum(n)], dtype=torch.int32, device=dev)
        q = torch.randn(sum(n), H, D, device=dev, dtype=bf)
        k = torch.randn(sum(n), KV, D, device=dev, dtype=bf)
        v = torch.randn(sum(n), KV, D, device=dev, dtype=bf)
        w = flashinfer.BatchPrefillWithRaggedKVCacheWrapper(ws, "NHD", backend=backend)
        w.plan(indptr, indptr, H, KV, D, causal=True, q_data_type=bf, kv_data_type=bf)
        o, lse = w.run(q, k, v, return_lse=True)
        o2, lse2 = w.run(q, k, v, return_lse=True)
        merged, _ = merge_state(o, lse, o2, lse2)  # SGLang merges the ragged and paged parts' states
        err = (merged.float() - o.float()).abs().max().item()
        for i in range(2):
            s = slice(indptr[i], indptr[i + 1])
            err = max(err, (o[s].float() - ref_attention(q[s], k[s], v[s], causal_offset=0)).abs().max().item())
        print(f"flashinfer_warmup:   ragged backend={backend} ran as {getattr(w, '_backend', '?')}")
        return err

    def sampling():  # SGLang's sampler (--sampling-backend flashinfer) and the DFLASH/EAGLE renorms
        from flashinfer import sampling as s

        probs = torch.softmax(torch.randn(4, 49152, device=dev), -1)
        s.top_k_renorm_probs(probs, 20)
        s.top_p_renorm_probs(probs, 0.9)
        s.top_k_top_p_sampling_from_probs(
            probs,
            torch.full((4,), 20, device=dev, dtype=torch.int32),
            torch.full((4,), 0.9, device=dev),
            filter_apply_order="joint",
        )
        s.min_p_sampling_from_probs(probs, torch.full((4,), 0.05, device=dev))
        s.softmax(torch.randn(4, 49152, device=dev), temperature=torch.ones(4, device=dev))
        return None

    def topk():  # DFlash2's candidate selector (sglang/srt/models/dflash.py, _radix_topk); no system served here
        # calls it, and its build ran past 500 s on an H200 without finishing: only when asked (`top_k`)
        x = torch.randn(4, 49152, device=dev)
        vals, _ = flashinfer.top_k(x, 8, sorted=True, deterministic=True)
        return (vals.float() - torch.topk(x, 8).values).abs().max().item()

    print(
        f"flashinfer_warmup: flashinfer {flashinfer.__version__}, torch {torch.__version__}, "
        f"{torch.cuda.get_device_name()} (sm{''.join(map(str, torch.cuda.get_device_capability()))})",
        flush=True,
    )
    track_jit_modules()
    only = set(sys.argv[1:] if argv is None else argv)
    for name, modules, fn in [
        ("decode (fa2, paged)", "decode", decode),
        ("prefill paged causal (fa2)", "prefill_fa2_primary", lambda: prefill_paged(False)),
        ("packbits, segment_packbits", "quantization", quantization),
        ("prefill paged custom mask (fa2, verify)", "prefill_fa2_primary, quantization", lambda: prefill_paged(True)),
        ("prefill paged, k/v strides differ (fa2)", "prefill_fa2_paged_indep", lambda: prefill_paged(False, True)),
        ("ragged prefill (auto)", "prefill_fa3 on sm90, cascade", lambda: ragged("auto")),
        ("ragged prefill (fa2)", "prefill_fa2_primary, cascade", lambda: ragged("fa2")),
        ("sampling", "sampling", sampling),
        ("top_k", "topk", topk),
    ]:
        if any(o in name for o in only) if only else modules != "topk":
            step(name, modules, fn)
    slim = Path(flashinfer.__file__).parent / "SLIM.json"
    if slim.is_file():
        names = {k: v["name"] for k, v in json.loads(slim.read_text())["modules"].items()}
        missed = [k for k, n in names.items() if n not in LOADED]
        extra = [n for n in LOADED if n not in names.values()]
        print(
            f"flashinfer_warmup: JIT modules loaded: {len(LOADED)}; of the slim archive's {len(names)}, not loaded: "
            f"{', '.join(missed) or 'none'}; loaded but not in it: {', '.join(extra) or 'none'}",
            flush=True,
        )
