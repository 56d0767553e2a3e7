"""LiLiCorrWorker: SGLang's DFlash v2 speculative worker (used as a library) whose draft block is
proposed by our LiLiCorr pipeline instead of the drafter's per-slot argmax.

What it inherits unchanged from DFlashWorkerV2: target prefill with aux-hidden capture, the draft
KV cache, the block draft forward (a TARGET_VERIFY-shaped pass, CUDA-graph captured per batch
size), target verification (greedy: longest prefix matching the target argmax; T > 0: SGLang's
exact rejection sampling with the drafted block as a deterministic proposal, q = 1 on each
drafted token, where SGLang has it: verification.py says which at start-up, and refuses what it
cannot verify), acceptance, commit and the per-request spec stats in `meta_info`. Which rule commits the drafted
block (the greedy walk, or Viterbi: LILICORR_WALK) is the proposer's; the worker says it in one start-up line.

Under --tp-size N each rank proposes from its shard of the target's LM head: the top-K/LSE is merged over the TP
group (vocab_parallel.py, one all-gather), the head and walk run replicated on the merged candidates, and the token
table is built from the input embedding gathered once (`full_embedding`). README section "Tensor parallelism".

What it overrides (all methods of the DFlash worker, no SGLang source touched):
  _maybe_build_draft_sampler     -> our LiLiCorrProposer: SGLang captures it into the draft graph; first its Triton
                                    kernels for every draft graph and eager size compile concurrently (precompile)
  _greedy_sample_from_vocab_parallel_head
                                 -> the same proposal, eagerly, when no draft graph covers the batch
  _append_target_hidden_to_draft_kv_by_loc
                                 -> also publishes each request's anchor: its last verified row of
                                    the context projection the append computes (draft model keeps it)
  alloc_memory_pool              -> also checks the req_to_token rows hold the verify-block reservation (kv_rows.py)
  forward_batch_generation       -> records the batch's request slots and stages their anchors
  init_attention_backends        -> also picks the target verify's attention kernel (verify_attention.py) and compiles
                                    the target prefill's attention kernel at every batch-size class (target_warmup.py)
  init_cuda_graphs               -> warms the proposal for the batches no draft graph covers and captures their
                                    graphs (proposer.warm); warns when the proposal cannot be captured (graphs disabled)
"""

from __future__ import annotations

import logging

import torch
from sglang.srt.lora.layers import unwrap_lora_layer
from sglang.srt.mem_cache.allocation_sizing import get_alloc_page_size
from sglang.srt.runtime_context import get_parallel
from sglang.srt.speculative.dflash_utils import is_dense_head_weight
from sglang.srt.speculative.dflash_worker_v2 import DFlashWorkerV2

from . import ALGORITHM_NAME
from .graphs import eager_batches_possible, graph_batch_sizes
from .kv_rows import check_rows
from .models.lilicorr_draft import LiLiCorrDraftModel
from .proposer import LiLiCorrProposer, walk_rule
from .server_args import ServingConfigError
from .target_warmup import warm as warm_target_prefill
from .verification import Verification, install_request_refusal
from .verify_attention import configure as configure_verify_attention, target_attention_backends
from .vocab_parallel import VocabShard

logger = logging.getLogger(__name__)


def lm_head_rows(lm_head, vocab_size: int, tp_group) -> tuple[torch.Tensor, VocabShard | None]:
    """This rank's rows of the target LM head over the real vocabulary (padding rows dropped): [V, Hm] and None
    where the rank holds the whole vocabulary; under tensor parallelism its shard [n, Hm] and which ids it holds."""
    weight = getattr(lm_head, "weight", None)
    if not is_dense_head_weight(weight):
        raise ServingConfigError(
            f"{ALGORITHM_NAME} needs the target's LM head as a dense bf16/fp16/fp32 matrix (its top-K reads full-"
            "vocabulary logits); this target's LM head is quantized. Serve an unquantized target or use DFLASH."
        )
    shard = getattr(lm_head, "shard_indices", None)
    if shard is not None and int(shard.num_added_elements) != 0:
        raise ServingConfigError(
            f"{ALGORITHM_NAME} does not support an added vocabulary on the target LM head (LoRA extra vocab)."
        )
    if shard is not None and int(shard.num_org_elements) < vocab_size:  # vocabulary-parallel: rank r's contiguous ids
        start, size = int(shard.org_vocab_start_index), int(shard.num_org_elements)
        return weight[:size], VocabShard(
            start, size, vocab_size, int(tp_group.world_size), tp_group.all_gather_into_tensor
        )
    if weight.shape[0] < vocab_size:
        raise ServingConfigError(f"target LM head has {weight.shape[0]} rows for a {vocab_size}-token vocabulary.")
    return weight[:vocab_size], None


def full_embedding(embed, vocab_size: int) -> torch.Tensor:
    """The target's input embedding over the whole vocabulary [>= V, Hm] (the head's token table reads every row):
    a vocabulary-parallel one is all-gathered over its TP group, once (rank r's padded rows follow rank r - 1's)."""
    weight = getattr(embed, "weight", None)
    if weight is None:
        raise ServingConfigError(f"{ALGORITHM_NAME}: the target exposes no input embedding table.")
    shard = getattr(embed, "shard_indices", None)
    if shard is not None and int(shard.num_org_elements) < vocab_size:
        if int(shard.num_added_elements) != 0 or not is_dense_head_weight(weight):
            raise ServingConfigError(
                f"{ALGORITHM_NAME}: the target's vocabulary-parallel input embedding is quantized or holds an added "
                "vocabulary; serve this target with --tp-size 1 or use DFLASH."
            )
        with torch.no_grad():
            weight = embed.tp_group.all_gather(weight, dim=0)  # [ranks * padded shard, Hm]: global ids in order
    if weight.shape[0] < vocab_size:
        raise ServingConfigError(
            f"the target's input embedding has {weight.shape[0]} rows for a {vocab_size}-token vocabulary."
        )
    return weight


class LiLiCorrWorker(DFlashWorkerV2):
    def __init__(self, server_args, gpu_id: int, nccl_port: int, target_worker) -> None:
        super().__init__(server_args, gpu_id, nccl_port, target_worker)
        if not isinstance(self.draft_model, LiLiCorrDraftModel):
            raise ServingConfigError(
                f"{ALGORITHM_NAME}: the draft loaded as {type(self.draft_model).__name__}, not LiLiCorrDraftModel; "
                'its config.json must declare architectures ["LiLiCorrDraftModel"].'
            )
        target_model = self.model_runner.model
        vocab_size = int(self.model_runner.model_config.vocab_size)
        lm_head_weight, vocab = lm_head_rows(
            unwrap_lora_layer(target_model.lm_head), vocab_size, get_parallel().tp_group
        )
        self.proposer = LiLiCorrProposer(
            head=self.draft_model.lilicorr_head,
            lm_head_weight=lm_head_weight,
            embed_weight=full_embedding(target_model.get_input_embeddings(), vocab_size),
            block_size=int(self.block_size),
            vocab=vocab,
            walk=walk_rule(),
        )
        self._batch_slots: torch.Tensor | None = None  # req_pool_indices of the batch in flight
        self._warned_eager = False
        logger.info(
            "%s worker ready: block_size=%d, K=%d, head width=%d, %s.",
            ALGORITHM_NAME,
            self.proposer.block_size,
            self.proposer.topk,
            self.draft_model.lilicorr_head.width,
            "whole LM head on this rank"
            if vocab is None
            else f"LM head ids {vocab.start}..{vocab.start + vocab.size - 1} of {vocab.vocab_size} on this rank, "
            f"top-K/LSE merged over {vocab.ranks} ranks, head and walk replicated",
        )
        logger.info(self.proposer.startup_line())
        self.verification = Verification.detect()
        logger.log(
            logging.INFO if self.verification.exact_sampling else logging.WARNING, self.verification.startup_line()
        )
        if self.verification.refuses_sampled:
            install_request_refusal(self.verification)

    def alloc_memory_pool(self, memory_pool_config=None, req_to_token_pool=None, token_to_kv_pool_allocator=None):
        super().alloc_memory_pool(
            memory_pool_config=memory_pool_config,
            req_to_token_pool=req_to_token_pool,
            token_to_kv_pool_allocator=token_to_kv_pool_allocator,
        )
        pool = req_to_token_pool if req_to_token_pool is not None else self.model_runner.req_to_token_pool
        check_rows(
            int(pool.req_to_token.shape[1]),
            int(self.model_runner.model_config.context_len),
            int(self.block_size),
            int(get_alloc_page_size()),
        )
        request_slots = int(pool.req_to_token.shape[0])
        self.proposer.allocate(num_request_slots=request_slots, max_rows=max([request_slots, *graph_batch_sizes()]))

    def init_attention_backends(self):
        super().init_attention_backends()
        # The target's backends exist now; its verify graphs are captured later (init_cuda_graphs).
        configure_verify_attention(
            target_attention_backends(self.model_runner),
            int(self.block_size),
            self.model_runner.dtype,
            eager=eager_batches_possible(self.server_args.max_running_requests),
        )
        # Before serving: no batch of new prompts compiles SGLang's prefill kernel while its requests wait.
        warm_target_prefill(self.model_runner)

    # --- CUDA graphs ------------------------------------------------------------------------

    def _maybe_build_draft_sampler(self):
        # Called by DFlashWorkerV2.init_cuda_graphs right before the draft graphs are captured:
        # the returned object runs inside every captured draft forward.
        logger.info(
            "%s: draft pass + top-K/LSE + head + walk captured together in the draft CUDA graph (batch sizes %s).",
            ALGORITHM_NAME,
            sorted(graph_batch_sizes()),
        )
        # Their kernels (and those of the eager sizes `warm` runs next) compile concurrently now, not one by one
        # as the capture meets them.
        sizes, max_batch = graph_batch_sizes(), self.server_args.max_running_requests
        self.proposer.precompile(
            graph_batch_sizes=sizes,
            eager_sizes=self.proposer.eager_sizes(graph_batch_sizes=sizes, capture=True, max_batch=max_batch),
        )
        return self.proposer

    def init_cuda_graphs(self) -> None:
        super().init_cuda_graphs()
        captured = self._draft_sampler is not None
        warmed = self.proposer.warm(
            graph_batch_sizes=graph_batch_sizes() if captured else [],
            capture=captured,
            max_batch=self.server_args.max_running_requests,
        )
        logger.info(
            "%s: the proposal warmed at %s batch sizes above the draft graphs; eager batches replay graphs of %s "
            "requests.",
            ALGORITHM_NAME,
            len(warmed),
            sorted(self.proposer.eager_graphs) or "no",
        )
        if self._draft_sampler is None:
            logger.warning(
                "%s: the draft CUDA graph is disabled (see the DFLASH message above, or "
                "--cuda-graph-backend-decode disabled); the head and walk run eagerly after each draft pass. "
                "Expect much lower throughput; do not compare its tokens/s with a graphed run.",
                ALGORITHM_NAME,
            )

    # --- anchors ----------------------------------------------------------------------------

    def forward_batch_generation(self, batch, *args, **kwargs):
        self._batch_slots = batch.req_pool_indices
        decoding = not (batch.forward_mode.is_extend() or batch.is_extend_in_batch or batch.forward_mode.is_idle())
        if decoding and batch.req_pool_indices is not None:
            self.proposer.stage_anchors(batch.req_pool_indices)
        return super().forward_batch_generation(batch, *args, **kwargs)

    def _append_target_hidden_to_draft_kv_by_loc(self, *, commit_lens=None, extend_lens=None, **append) -> None:
        # SGLang's arguments (target_hidden, cache_loc, positions, cache_loc_2d) pass through in `append`
        super()._append_target_hidden_to_draft_kv_by_loc(commit_lens=commit_lens, extend_lens=extend_lens, **append)
        # The append projected every row of target_hidden (trailing padding trimmed to cache_loc);
        # each request's anchor is its last verified row of that projection.
        context = self.draft_model.take_context_hidden()  # [cache_loc rows, Hm] or None (nothing appended)
        if context is not None and self._batch_slots is not None:
            rows = self.proposer.anchor_rows(
                num_rows=int(context.shape[0]), extend_lens=extend_lens, commit_lens=commit_lens
            )
            self.proposer.publish_anchors(context.index_select(0, rows), self._batch_slots)

    # --- eager proposal ---------------------------------------------------------------------

    def _greedy_sample_from_vocab_parallel_head(self, *, hidden_states, lm_head, chunk_size: int = 256):
        # DFlashWorkerV2 calls this on the drafted slots' hidden states [b*S, Hm] whenever the
        # draft ran without its CUDA graph; LILICORR proposes with the head here too.
        slots = self.proposer.slots
        b = hidden_states.shape[0] // slots
        if not self._warned_eager and self._draft_sampler is not None:
            logger.warning(
                "%s: a batch of %d requests is larger than the captured draft graphs; its proposal ran eagerly "
                "(raise --cuda-graph-max-bs-decode to capture it).",
                ALGORITHM_NAME,
                b,
            )
            self._warned_eager = True
        return self.proposer.propose_eager(hidden_states.view(b, slots, -1)).reshape(-1)
