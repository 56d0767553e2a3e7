"""Decode steps narrower than the block (verify_width.py) from SGLang's DFlash pieces. `narrow_step` verifies the
first `width` tokens of the drafted block through its tier (verify_tiers.py): open the block, draft it, verify, SGLang's
acceptance, append the committed draft KV. `chain_step` is the width-1 step: `links` plain decode forwards back to
back in the block's first columns, each reading the token the one before chose, committed together with their drafter
context. `serves`: batches without grammar, sampling-mask capture or a hybrid (Mamba) target."""

from __future__ import annotations

import torch
from sglang.kernels.ops.speculative.dflash import _prepare_dflash_draft_block_unchecked
from sglang.kernels.ops.speculative.dflash import compute_dflash_correct_drafts_and_bonus
from sglang.srt.layers.logprob_processor import compute_spec_logprobs
from sglang.srt.lora.layers import unwrap_lora_layer
from sglang.srt.managers.utils import GenerationBatchResult
from sglang.srt.model_executor.forward_batch_info import CaptureHiddenMode, ForwardBatch, ForwardMode
from sglang.srt.model_executor.forward_batch_info import enable_num_token_non_padded
from sglang.srt.speculative.dflash_info import DFlashVerifyInput
from sglang.srt.speculative.dflash_utils import apply_dflash_simulated_acceptance, is_dflash_sampling_verify_available
from sglang.srt.speculative.dflash_utils import apply_dflash_verify_logits_adjustments
from sglang.srt.speculative.dflash_utils import compute_dflash_sampling_correct_drafts_and_bonus
from sglang.srt.speculative.spec_info import SpeculativeAlgorithm
from sglang.srt.speculative.spec_tp_sync import SpecTpSyncSite
from sglang.srt.speculative.spec_utils import SIMULATE_ACC_LEN, SIMULATE_ACC_METHOD, SIMULATE_ACC_TOKEN_MODE
from sglang.srt.speculative.spec_utils import draft_tp_context

from .verify_tiers import verifying


def serves(worker, batch) -> bool:
    """Whether a narrow step may verify this decode batch (else the block does)."""
    return not (
        batch.has_grammar
        or any(getattr(req, "return_sampling_mask", False) for req in batch.reqs)
        or worker._need_mamba_verify_commit
    )


def committed_block(candidates: torch.Tensor, accepted: torch.Tensor, bonus: torch.Tensor):
    """candidates [b, w] (anchor, then w - 1 drafts), accepted drafts [b], bonus [b] -> committed tokens [b, w]
    (accepted drafts, then the bonus) and their count [b] int32."""
    out = torch.zeros_like(candidates, dtype=torch.int64)
    out[:, :-1] = candidates[:, 1:]
    out.scatter_(1, accepted.to(torch.int64)[:, None], bonus.to(torch.int64)[:, None])
    return out, accepted.to(torch.int32) + 1


def open_block(worker, batch, draft_input):
    """The block's slots as SGLang lays them out: ids [b, B] (anchor, then masks), positions [b, B], the KV window's
    cache locations [b, B] and its plan."""
    bs = len(batch.seq_lens)
    worker._ensure_draft_block_buffers(bs)
    ids, positions, locs = (
        worker._draft_block_ids_buf[:bs],
        worker._draft_block_positions_buf[:bs],
        worker._draft_verify_out_cache_loc_buf[:bs],
    )
    _prepare_dflash_draft_block_unchecked(
        bonus_tokens=draft_input.bonus_tokens.view(-1),
        prefix_lens=batch.seq_lens.view(-1),
        req_pool_indices=batch.req_pool_indices.view(-1),
        req_to_token=worker.model_runner.req_to_token_pool.req_to_token,
        block_ids_out=ids,
        positions_out=positions,
        cache_loc_out=locs,
        mask_token_id=int(worker._mask_token_id),
    )
    plan = worker.target_worker.model_runner.kv_index_translator.plan(
        req_pool_indices=batch.req_pool_indices,
        seq_lens=batch.seq_lens,
        seq_lens_cpu=batch.seq_lens_cpu if batch.seq_lens_cpu is not None else draft_input.nxt_kv_lens_cpu,
        write_virtual=locs.reshape(-1),
        read_extent=int(worker.block_size),
    )
    return ids, positions, locs, plan


def host_bound(worker, batch, draft_input, extent: int) -> tuple[torch.Tensor, int]:
    """Host-side upper bounds of the KV lengths a forward reaching `extent` tokens past the prefix reads; their sum."""
    bs = len(batch.seq_lens)
    out = worker._draft_seq_lens_cpu_buf[:bs]
    if batch.seq_lens_cpu is not None:
        out.copy_(batch.seq_lens_cpu)
        out.add_(extent)
        return out, int(out.sum())
    out.copy_(draft_input.nxt_kv_lens_cpu)  # a GPU-only backend: the reservation is a safe over-estimate
    return out, int(draft_input.nxt_kv_lens_sum)


def draft(worker, batch, draft_input, ids, positions, locs, plan) -> torch.Tensor:
    """The draft pass over the whole block, with our proposal in its graph -> draft tokens [b, S]."""
    bs, block = len(batch.seq_lens), int(worker.block_size)
    embed = unwrap_lora_layer(worker.target_worker.model_runner.model.get_input_embeddings())(ids)
    if worker._noise_embed_scale != 1.0:
        embed = embed * worker._noise_embed_scale
    seq_lens_cpu, seq_lens_sum = host_bound(worker, batch, draft_input, block)
    non_padded = (
        torch.full((), bs * block, dtype=torch.int32, device=worker.device) if enable_num_token_non_padded() else None
    )
    forward_batch = ForwardBatch(
        forward_mode=ForwardMode.TARGET_VERIFY,
        batch_size=bs,
        input_ids=ids.flatten(),
        req_pool_indices=batch.req_pool_indices,
        seq_lens=batch.seq_lens,
        out_cache_loc=locs.reshape(-1),
        seq_lens_sum=seq_lens_sum,
        seq_lens_cpu=seq_lens_cpu,
        positions=positions.reshape(-1),
        input_embeds=embed.view(-1, embed.shape[-1]),
        spec_algorithm=SpeculativeAlgorithm.DFLASH,
        spec_info=worker._draft_block_spec_info,
        capture_hidden_mode=CaptureHiddenMode.NULL,
        num_token_non_padded=non_padded,
        global_num_token_non_padded_cpu=bs * block,
        can_run_decode_cuda_graph=batch.can_run_decode_cuda_graph,
    )
    plan.bind(forward_batch, worker.draft_model_runner.kv_index_translator)
    with torch.inference_mode(), draft_tp_context(worker.draft_parallel_layout):
        out = worker.draft_model_runner.forward(forward_batch)
    if worker._draft_sampler is not None and out.can_run_graph:
        return worker._draft_sampler.out[: bs * (block - 1)].view(bs, block - 1)
    hidden = out.logits_output.hidden_states.view(bs, block, -1)
    return worker._greedy_sample_from_vocab_parallel_head(
        hidden_states=hidden[:, 1:].reshape(-1, hidden.shape[-1]), lm_head=None
    ).view(bs, block - 1)


def accept(worker, candidates, logits, sampling_info, draft_input, target_predict):
    """SGLang's acceptance of candidates [b, w]: accepted draft counts [b] int32 and the bonus tokens [b]."""
    bs, width = candidates.shape
    greedy = sampling_info is None or sampling_info.is_all_greedy
    if target_predict is None and not greedy and is_dflash_sampling_verify_available():
        accepted, bonus = compute_dflash_sampling_correct_drafts_and_bonus(
            candidates=candidates,
            next_token_logits=logits,
            sampling_info=sampling_info,
            max_top_k=draft_input.max_top_k,
            uniform_top_k_value=draft_input.uniform_top_k_value,
        )
        worker._tp_sync.sync(SpecTpSyncSite.DFLASH_ACCEPT_SAMPLE, accepted)
        worker._tp_sync.sync(SpecTpSyncSite.DFLASH_ACCEPT_SAMPLE, bonus)
        return accepted, bonus
    predict = (torch.argmax(logits, dim=-1) if target_predict is None else target_predict).view(bs, width)
    worker._tp_sync.sync(SpecTpSyncSite.DFLASH_ACCEPT_GREEDY, predict)
    return compute_dflash_correct_drafts_and_bonus(candidates=candidates, target_predict=predict)


def verify_forward(worker, batch, draft_input, tier, plan, locs, positions, tokens, window: slice, ahead: int = 0):
    """The target's forward over `tokens` [b, w] in the block's columns `window`, reading the prefix and the block's
    first `ahead` tokens -> (logits_output with its logits adjusted for sampling, the greedy prediction where a
    vocabulary-parallel head kept its logits sharded (else None), whether it replayed a CUDA graph)."""
    width = tokens.shape[1]
    verify = DFlashVerifyInput(
        draft_token=tokens.reshape(-1),
        positions=positions[:, window].reshape(-1),
        draft_token_num=width,
        custom_mask=None,
        capture_hidden_mode=CaptureHiddenMode.FULL,
        kv_loc_plan=plan,
        kv_loc_cols=window,
    )
    batch.out_cache_loc = locs[:, window].reshape(-1)
    sampling_info = batch.sampling_info
    saved = batch.seq_lens, batch.seq_lens_cpu, batch.seq_lens_sum
    if ahead:
        batch.seq_lens = saved[0] + ahead
    if saved[1] is not None:
        batch.seq_lens_cpu = saved[1] + (ahead + width)
        batch.seq_lens_sum = int(batch.seq_lens_cpu.sum())
    elif draft_input.nxt_kv_lens_cpu is not None:
        batch.seq_lens_cpu, batch.seq_lens_sum = draft_input.nxt_kv_lens_cpu, int(draft_input.nxt_kv_lens_sum)
    with verifying(worker.target_worker.model_runner, tier):
        forward_batch, _ = verify.prepare_for_verify(batch, worker.target_worker)
        batch.seq_lens, batch.seq_lens_cpu, batch.seq_lens_sum = saved
        target_out = worker.target_worker.forward_batch_generation(
            batch=None, forward_batch=forward_batch, is_verify=True, skip_attn_backend_init=True
        )
    logits_output = target_out.logits_output
    target_predict = None
    processor = worker._target_logits_processor
    if processor is not None and processor.is_deferred_shard(logits_output.next_token_logits):
        if worker._can_skip_verify_logits(batch, sampling_info):
            target_predict = processor.deferred_argmax(logits_output.next_token_logits)
            logits_output.next_token_logits = None
        else:
            logits_output.next_token_logits = processor.finish_deferred_gather(logits_output.next_token_logits)
    if sampling_info is not None and target_predict is None:
        apply_dflash_verify_logits_adjustments(
            next_token_logits=logits_output.next_token_logits, sampling_info=sampling_info, draft_token_num=width
        )
    return logits_output, target_predict, target_out.can_run_cuda_graph


def step_result(
    worker, batch, plan, positions, on_publish, logits_output, hidden, out_tokens, commit_lens, bonus, graphed
):
    """A step's end: logprobs, the new lengths published, the draft KV of the committed tokens (`hidden` [b * w, H] of
    the block's first w columns, out_tokens [b, w]) appended -> SGLang's step result."""
    bs, width = out_tokens.shape
    if batch.return_logprob:
        compute_spec_logprobs(batch, logits_output, out_tokens.reshape(-1), chain_stride=width)
    new_seq_lens = batch.seq_lens + commit_lens.to(batch.seq_lens.dtype)
    if on_publish is not None:
        on_publish(new_seq_lens)
    cache_loc = worker._draft_write_ids(plan).view(bs, -1)[:, :width].contiguous()
    worker._append_target_hidden_to_draft_kv_by_loc(
        target_hidden=hidden,
        cache_loc=cache_loc.reshape(-1),
        cache_loc_2d=cache_loc,
        positions=positions[:, :width].reshape(-1),
        commit_lens=commit_lens,
    )
    logits_output.hidden_states = None
    return GenerationBatchResult(
        logits_output=logits_output,
        next_token_ids=out_tokens.reshape(-1),
        accept_lens=commit_lens,
        can_run_cuda_graph=graphed,
        next_draft_input=worker._make_next_draft_input_decode(bonus_tokens=bonus, new_seq_lens=new_seq_lens),
        speculative_num_draft_tokens=width,
        new_seq_lens=new_seq_lens,
    )


def narrow_step(worker, batch, width: int, tier, on_publish=None) -> GenerationBatchResult:
    """Verify the first `width` tokens (2 <= width < B) of the batch's drafted block -> SGLang's step result."""
    draft_input, sampling_info = batch.spec_info, batch.sampling_info
    batch.seq_lens.record_stream(torch.cuda.current_stream())
    bs = len(batch.seq_lens)
    ids, positions, locs, plan = open_block(worker, batch, draft_input)
    candidates = worker._draft_block_tokens_buf[:bs, :width]
    candidates[:, 0].copy_(ids[:, 0])
    candidates[:, 1:].copy_(draft(worker, batch, draft_input, ids, positions, locs, plan)[:, : width - 1])
    candidates = candidates.contiguous()
    logits_output, target_predict, graphed = verify_forward(
        worker, batch, draft_input, tier, plan, locs, positions, candidates, slice(0, width)
    )
    accepted, bonus = accept(
        worker, candidates, logits_output.next_token_logits, sampling_info, draft_input, target_predict
    )
    out_tokens, commit_lens = committed_block(candidates, accepted, bonus)
    if SIMULATE_ACC_LEN > 0:  # SGLang's benchmark knob: every step commits min(SGLANG_SIMULATE_ACC_LEN, width)
        apply_dflash_simulated_acceptance(  # a vocabulary-parallel head's greedy verify keeps only its prediction
            candidates=candidates,
            target_predict=None if target_predict is None else target_predict.view(bs, width),
            accept_len=accepted,
            commit_lens=commit_lens,
            bonus=bonus,
            out_tokens=out_tokens,
            simulate_acc_len=SIMULATE_ACC_LEN,
            simulate_acc_method=SIMULATE_ACC_METHOD,
            simulate_acc_token_mode=SIMULATE_ACC_TOKEN_MODE,
            next_token_logits=logits_output.next_token_logits,
        )
    hidden = logits_output.hidden_states[: bs * width]
    return step_result(
        worker, batch, plan, positions, on_publish, logits_output, hidden, out_tokens, commit_lens, bonus, graphed
    )


def chain_step(worker, batch, links: int, tier, on_publish=None) -> GenerationBatchResult:
    """The width-1 step: `links` (<= B) plain decode forwards through the width-1 tier, link j in the block's column j
    reading the token link j - 1 chose, launched back to back with no host sync -> SGLang's step result, `links`
    tokens a request (each the target's own choice, sampled as SGLang samples a block's bonus token)."""
    draft_input, sampling_info = batch.spec_info, batch.sampling_info
    batch.seq_lens.record_stream(torch.cuda.current_stream())
    bs = len(batch.seq_lens)
    ids, positions, locs, plan = open_block(worker, batch, draft_input)
    tokens = torch.empty((bs, links + 1), dtype=torch.int64, device=ids.device)  # the anchor, then each link's choice
    tokens[:, 0].copy_(ids[:, 0])
    context, logits = None, []
    for j in range(links):
        current = tokens[:, j : j + 1].contiguous()
        logits_output, target_predict, graphed = verify_forward(
            worker, batch, draft_input, tier, plan, locs, positions, current, slice(j, j + 1), ahead=j
        )
        _, chosen = accept(worker, current, logits_output.next_token_logits, sampling_info, draft_input, target_predict)
        tokens[:, j + 1].copy_(chosen)
        hidden = logits_output.hidden_states[:bs]  # the graph's output buffer: the next link overwrites it
        if context is None:
            context = hidden.new_empty((bs, links, hidden.shape[-1]))
        context[:, j].copy_(hidden)
        if batch.return_logprob:
            logits.append(logits_output.next_token_logits.clone())
    logits_output.next_token_logits = torch.stack(logits, 1).view(bs * links, -1) if logits else None
    batch.out_cache_loc = locs[:, :links].reshape(-1)  # the slots the step wrote, as a narrow step leaves its window
    commit_lens = torch.full((bs,), links, dtype=torch.int32, device=tokens.device)
    hidden = context.view(bs * links, -1)
    return step_result(
        worker, batch, plan, positions, on_publish, logits_output, hidden, tokens[:, 1:], commit_lens, chosen, graphed
    )
