"""JIT-build (or load from the cache) and run once every flashinfer module that SGLang's flashinfer attention backend
and sampling use, at SmolLM2-135M's shapes (bf16, 9 query / 3 KV heads, head_dim 64, page size 1; the drafts have the
same heads), on tiny tensors; each attention output is checked against a float32 torch reference. One line per module
with its wall time; exit 1 with one clear line on the first failure. Run by tools/device/flashinfer.sh on the GPU."""

import sys
import time

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


def step(name, fn):
    t0 = time.time()
    try:
        err = fn()
        torch.cuda.synchronize()
    except Exception as e:  # noqa: BLE001
        print(f"flashinfer_warmup: FAILED {name}: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}")
        raise SystemExit(1)
    if err is not None and err > 0.05:
        print(f"flashinfer_warmup: FAILED {name}: max abs error {err:.3g} against the float32 reference")
        raise SystemExit(1)
    extra = f", max abs err {err:.2e}" if err is not None else ""
    print(f"flashinfer_warmup: {name}: {time.time() - t0:.1f} s{extra}", flush=True)


def main():
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

    def prefill_paged(custom_mask):  # SGLang's extend (causal) and speculative verify (custom mask), fa2
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
        o = w.run(q, (k_cache, v_cache))
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

    def topk():  # DFlash's selector (sglang/srt/models/dflash.py)
        x = torch.randn(4, 49152, device=dev)
        vals, _ = flashinfer.top_k(x, 8, sorted=True)
        return (vals.float() - torch.topk(x, 8).values).abs().max().item()

    def page():
        k = torch.randn(3, KV, D, device=dev, dtype=bf)
        flashinfer.append_paged_kv_cache(
            k,
            k,
            torch.tensor([0, 1], dtype=torch.int32, device=dev).repeat_interleave(torch.tensor([1, 2], device=dev)),
            torch.tensor([0, 0, 1], dtype=torch.int32, device=dev),
            (k_cache, v_cache),
            kv_indices,
            kv_indptr,
            torch.tensor([1, 2], dtype=torch.int32, device=dev),
            "NHD",
        )
        return None

    print(
        f"flashinfer_warmup: flashinfer {flashinfer.__version__}, torch {torch.__version__}, "
        f"{torch.cuda.get_device_name()} (sm{''.join(map(str, torch.cuda.get_device_capability()))})",
        flush=True,
    )
    only = set(sys.argv[1:])
    for name, fn in [
        ("decode (fa2, paged)", decode),
        ("prefill paged causal (fa2)", lambda: prefill_paged(False)),
        ("prefill paged custom mask (fa2, verify)", lambda: prefill_paged(True)),
        ("ragged prefill (auto)", lambda: ragged("auto")),
        ("ragged prefill (fa2)", lambda: ragged("fa2")),
        ("sampling", sampling),
        ("top_k", topk),
        ("append_paged_kv_cache", page),
    ]:
        if not only or any(o in name for o in only):
            step(name, fn)


if __name__ == "__main__":
    main()
