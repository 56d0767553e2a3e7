"""The frozen target: any Hugging Face causal LM, run teacher-forced (no grad)."""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Iterator

import torch
from torch import nn

from .cli_args import one_level_down
from .errors import LiLiCorrError, UsageError


class TargetMismatchError(LiLiCorrError, ValueError):
    """The target model does not fit the drafter (width, vocabulary, layers)."""


def local_model_dir(path: str | Path, option: str = "--target") -> Path:
    """`path` as a local Hugging Face model folder (config.json inside), before transformers reads it as a hub id."""
    folder = Path(path)
    if not (folder / "config.json").is_file():
        found = "a folder without config.json" if folder.is_dir() else "not an existing folder"
        raise UsageError(
            f"{str(path)!r} is {found}",
            where=option,
            fix=one_level_down(
                folder,
                "pass the local folder of a Hugging Face model "
                "(download a hub model first, e.g. `hf download REPO --local-dir DIR`, and pass DIR)",
            ),
        )
    return folder


@contextlib.contextmanager
def loading_target(path: str | Path, option: str = "--target") -> Iterator[None]:
    """Around from_pretrained of a target folder: a folder it cannot load is a UsageError (exit 2)."""
    try:
        yield
    except (OSError, ValueError) as e:
        if isinstance(e, LiLiCorrError):
            raise
        raise UsageError(
            f"cannot load {str(path)!r} as a model ({' '.join(str(e).split())[:200]})",
            where=option,
            fix="pass the local folder of a Hugging Face model: config.json, tokenizer and weights",
        ) from e


def decoder_layers(model: nn.Module) -> nn.ModuleList:
    """The target's decoder layer stack (HF `get_decoder().layers`)."""
    decoder = model.get_decoder() if hasattr(model, "get_decoder") else None
    layers = getattr(decoder, "layers", None)
    if not isinstance(layers, nn.ModuleList):
        raise TargetMismatchError(
            f"{type(model).__name__} exposes no get_decoder().layers: only decoder-only HF causal LMs "
            "(Llama, Qwen, Mistral, ... families) are supported as targets."
        )
    return layers


class FrozenTarget:
    def __init__(self, model: nn.Module, target_layer_ids: tuple[int, ...]) -> None:
        self.model = model.eval().requires_grad_(False)
        self.layers = decoder_layers(model)
        n = len(self.layers)
        bad = [i for i in target_layer_ids if not 0 <= i < n - 1]
        if bad:
            raise TargetMismatchError(
                f"target_layer_ids {bad} do not name a capturable layer of this {n}-layer target (0..{n - 2})."
            )
        self.target_layer_ids = tuple(target_layer_ids)
        self.embedding = model.get_input_embeddings()
        self.lm_head = model.get_output_embeddings()
        if self.lm_head is None:
            raise TargetMismatchError(f"{type(model).__name__} has no output embeddings (LM head).")

    @property
    def hidden_size(self) -> int:
        return int(self.embedding.weight.shape[1])

    @property
    def vocab_size(self) -> int:
        return int(self.lm_head.weight.shape[0])

    @property
    def num_layers(self) -> int:
        return len(self.layers)

    def check_fits(self, hidden_size: int, vocab_size: int) -> None:
        if self.hidden_size != hidden_size:
            raise TargetMismatchError(
                f"target hidden size {self.hidden_size} != drafter hidden_size {hidden_size}: the drafter shares the "
                "target's embedding and LM head, so build it with the target's width."
            )
        if self.vocab_size != vocab_size:
            raise TargetMismatchError(
                f"target vocabulary {self.vocab_size} != drafter vocab_size {vocab_size}: export/train the drafter "
                "for this target (its config.vocab_size)."
            )

    def run(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """-> (features [b, T, n * Hm], final hidden [b, T, Hm] after the final norm)."""
        features, out = self.decode(input_ids=input_ids, attention_mask=attention_mask, use_cache=False)
        return features, out.last_hidden_state

    @torch.no_grad()
    def decode(self, **inputs) -> tuple[torch.Tensor, object]:
        """The decoder on `inputs` -> (features: the target layers' outputs concatenated, the decoder's output)."""
        captured: dict[int, torch.Tensor] = {}

        def hook(index):
            def grab(_module, _args, output):
                captured[index] = output[0] if isinstance(output, (tuple, list)) else output

            return grab

        handles = [self.layers[i].register_forward_hook(hook(i)) for i in set(self.target_layer_ids)]
        try:
            out = self.model.get_decoder()(**inputs)
        finally:
            for h in handles:
                h.remove()
        return torch.cat([captured[i] for i in self.target_layer_ids], dim=-1), out

    @torch.no_grad()
    def embed(self, ids: torch.Tensor) -> torch.Tensor:
        return self.embedding(ids)

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Frozen LM head; differentiable in ``hidden``. [..., Hm] -> [..., V]."""
        return self.lm_head(hidden.to(self.lm_head.weight.dtype))

    @torch.no_grad()
    def slot_targets(self, final_hidden: torch.Tensor, chunk: int = 256) -> tuple[torch.Tensor, torch.Tensor]:
        """Teacher-forced rows final_hidden [R, Hm] -> (logsumexp [R] fp32, greedy token [R]), in chunks of rows."""
        lse, top = [], []
        for part in final_hidden.split(chunk):
            logits = self.logits(part).float()
            lse.append(logits.logsumexp(dim=-1))
            top.append(logits.argmax(dim=-1))
        return torch.cat(lse), torch.cat(top)

    @torch.no_grad()
    def candidate_log_probs(self, final_hidden: torch.Tensor, lse: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
        """log q of candidate ids [R, K] at rows final_hidden [R, Hm] -> [R, K] fp32."""
        w = self.lm_head.weight[ids]  # [R, K, Hm]
        logit = torch.einsum("rh,rkh->rk", final_hidden.to(w.dtype), w).float()
        bias = getattr(self.lm_head, "bias", None)
        if bias is not None:
            logit = logit + bias[ids].float()
        return logit - lse[:, None]
