"""The reference Llama-family generator: the Tenstorrent generator contract in plain torch.

It has two jobs. On the host mesh (MESH_DEVICE=HOST, no TT hardware) it is the generator
vLLM drives, so the whole serving path (paged KV cache, chunked prefill, prefix caching,
on-device sampling, asynchronous readback) runs end to end on a CPU. And it is the golden
reference that bundle authors compare their TT-NN generators against, call for call. So it
is written to be read: one small function per idea, shapes in the docstrings, float32
everywhere, plain torch ops and no tricks. The one fused call is attention, torch's
`scaled_dot_product_attention` with an explicit mask (`causal_attention` spells out what
it computes). A decode step attends for the whole batch in that one call, over contexts
gathered from the paged cache with one index_select each for K and V; prefill chunks
attend one row at a time (see `attention_groups`).

Checkpoints: Hugging Face format (safetensors, sharded or not) of Llama, Mistral, Qwen2
(q/k/v biases), Qwen3 (per-head RMSNorm on q and k) and Gemma 3 text (its differences
from Llama are `config.ModelStyle`: `1 + weight` norms, the scaled embedding and query,
sandwich norms, a GeGLU MLP, local RoPE on the sliding layers, the final soft cap). RoPE types:
"default", "linear", "llama3" and "yarn" (see `rope_frequencies`). Sliding windows
(Mistral's `sliding_window`, Qwen2/Qwen3's `use_sliding_window` layers, Gemma 3's
`layer_types`: `format.attention_window`) are masked as
transformers masks them, on every path (prefill chunks, prefix-cache hits, decode, the
speculative verify, prompt logprobs, the drafter); the cache still holds every position.

The generator is the composed contract surface; its parts are a module each, as the
serving runner's are: the model math (`reference.model`), the paged cache and page tables
(`reference.cache`), the driver that cuts a prefill or a decode into input, run and output
(`reference.driver`), speculative decoding's verify and drafter (`reference.drafter`),
and the checkpoint families (`reference.families`). The parts are mixins rather than
objects the generator holds because their methods are the seams bundle authors override
(`rope`, `forward_segments`, `segment_inputs`): one object, so an override is the method
every part calls.

Shape conventions used throughout (all batch tensors are row-major in the batch):

    B   rows in the call's batch          V   vocabulary size
    S   padded token width of a call       H   query heads, KV key/value heads
    T   real tokens of a call, all rows    D   head size
    N   KV cache blocks                   Bs  tokens per block
    n   rows attending in one call         L   new tokens per row in that call
    C   positions 0 .. C-1 attended in that call: the blocks of the longest context

    tokens        prefill [B, S] int64; decode [B, 1] int64
    page_table    [B, max_blocks] int32: position p of row i lives in block
                  page_table[i, p // Bs], slot p % Bs
    kv_cache      list over layers of [k_cache, v_cache], each [N, KV, Bs, D] float32;
                  with lanes (tt_data_parallel > 1) one such list per lane, N lane-local
    logits        [B, 1, V] float32 (last token of each row)
    sampled       [B] int64
"""

from __future__ import annotations

import dataclasses
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import torch

from ttbundles.format.attention_window import (
    WINDOW_CAPABILITY_KEY,
    AttentionWindow,
    attention_window,
)
from ttbundles.format.contract import SamplingParams
from ttbundles.reference.cache import KVCache, PagedCache
from ttbundles.reference.config import ModelDims, ModelRope, ModelStyle
from ttbundles.reference.drafter import Speculation
from ttbundles.reference.driver import (
    DecodeStep,
    Driver,
    PrefillBatch,
    ResidentInputs,
    check_decode_commands,
)
from ttbundles.reference.families import style_of
from ttbundles.reference.model import DecoderModel
from ttbundles.reference.sampling import MAX_DEVICE_TOP_K, DeviceSampler
from ttbundles.reference.weights import LlamaWeights, checkpoint_dir, load_safetensors


class ReferenceLlamaGenerator(DecoderModel, PagedCache, Driver, Speculation):
    """The generator contract for Llama-family checkpoints, in torch, on the host.

    It speaks TT-Metal's current contract (`format.contract`): decode input-update
    contract v1, tuple returns, TT's `SamplingParams`, device penalties from the prompt
    and output history, top log-probabilities from the device. Like a card it keeps state
    between calls where TT-Metal's generators do: the resident decode inputs (what the
    decode trace reads: tokens, positions, page table) and the sampler's per-slot state.
    Every position's K/V lives in the paged cache the worker allocates through it, so
    chunked prefill, prefix caching and preemption need nothing more.

    Single-execute mode (`tt_data_parallel` = N > 1): like TT-Metal's Galaxy generators,
    one copy of the weights serves N lanes, each with its own KV cache (`kv_cache[lane]`,
    lane-local block ids). Batch slot s belongs to lane `s // (max_batch_size / N)`:
    decode rows are slots, prefill rows go to `empty_slots[i]`'s lane, and each lane's
    rows attend only to that lane's cache.

    The contract's calls, by the part that answers them: construction, `prefill_forward`,
    `decode_forward` and the warm-ups here; `allocate_kv_cache`,
    `allocate_kv_cache_per_layer`, `get_kv_cache_spec` the cache (`PagedCache`);
    `read_decode_output`, `process_decode_output_host` the driver (`Driver`); `spec_plan`,
    `verify`, `propose_draft_tokens` speculation (`Speculation`); the forward pass
    (`forward_segments` and its steps) the model (`DecoderModel`).
    """

    model_capabilities = {
        "supports_prefix_caching": True,
        "supports_async_decode": True,
        "supports_sample_on_device": True,
        "supports_chunked_prefill": True,
        "supports_device_penalties": True,
        "max_device_logprobs": MAX_DEVICE_TOP_K,
        "supports_device_grammar": True,
        "supports_spec_decode": True,
        # A deferred verify: read_decode_output serves the [B, 1+K] block, and there is
        # no hidden handle to keep (the host drafts).
        "supports_async_spec_decode": True,
        # Keys older than the checkpoint's sliding window are masked on every path.
        WINDOW_CAPABILITY_KEY: True,
    }
    decode_input_update_contract = 1
    MAX_SPEC_K = 8
    """The longest draft the reference verifies per step (a bound of this generator's
    choosing, so that `spec_plan` has something to refuse)."""
    DRAFT_LAYERS_FRACTION = 0.5
    """The early-exit drafter (`propose_draft_tokens`, `reference.drafter`) runs this
    share of the target's first layers (at least one)."""

    def __init__(
        self,
        weights: LlamaWeights,
        dims: ModelDims,
        inv_freq: torch.Tensor,
        attention_scaling: float = 1.0,
        max_batch_size: int = 32,
        max_seq_len: int = 2048,
        lanes: int = 1,
        window: AttentionWindow | None = None,
        style: ModelStyle | None = None,
        local_rope: tuple[torch.Tensor, float, frozenset[int]] | None = None,
    ):
        if lanes < 1 or max_batch_size % lanes:
            raise ValueError(
                f"tt_data_parallel={lanes} must divide max_batch_size={max_batch_size} "
                "(each lane holds an equal share of the batch)"
            )
        self.lanes = lanes
        self.per_lane = max_batch_size // lanes
        self.weights = weights
        self.dims = dims
        self.inv_freq = inv_freq  # [D / 2]
        self.attention_scaling = attention_scaling  # cos/sin scale (yarn), else 1
        self.max_batch_size = max_batch_size
        self.max_seq_len = max_seq_len
        # How the family's forward pass differs from Llama's (Gemma 3; else the defaults).
        self.style = style or ModelStyle()
        self.scale = self.style.query_scale or dims.head_dim**-0.5
        # The checkpoint's sliding window (None: every layer attends over everything).
        self.window = window
        # Gemma 3's sliding layers rotate with their own base: (inv_freq, scale, layers).
        self.local_rope = local_rope
        self.sampler = DeviceSampler(max_batch_size, dims.vocab_size)
        # One worker thread stands in for the device's command queue: every forward and
        # readback runs there in submission order, so the host can schedule the next step
        # while a decode computes, as it would with a card.
        self._device_queue = ThreadPoolExecutor(
            max_workers=1, thread_name_prefix="reference-device"
        )
        # The decode inputs "on the device"; only the device queue touches them.
        self._resident: ResidentInputs | None = None
        # For the drafter (`propose_draft_tokens`): each slot's page-table row as the last
        # forward over it had it, and the cache it wrote (device queue only).
        self._slot_pages: dict[int, torch.Tensor] = {}
        self._drafter_cache: Any = None

    # ---- construction ----------------------------------------------------------------

    @classmethod
    def initialize_vllm_model(
        cls,
        hf_config: Any,
        mesh_device: Any,
        max_batch_size: int,
        max_seq_len: int,
        n_layers: int | None = None,
        tt_data_parallel: int = 1,
        optimizations: str | None = None,
    ) -> ReferenceLlamaGenerator:
        """Load the checkpoint named by `hf_config._name_or_path`, float32.

        `tt_data_parallel` is the number of lanes (single-execute mode, see the class);
        `mesh_device` (a HostMesh) and `optimizations` change nothing here: float32
        torch has no accuracy/speed trade-off.
        `n_layers` keeps only the first layers (as TT-Metal's generators do, for tests).
        """
        dims = ModelDims.from_hf_config(hf_config)
        style = style_of(hf_config, dims)
        rope = ModelRope.from_hf_config(hf_config, dims, style)
        state = load_safetensors(checkpoint_dir(hf_config))
        weights = LlamaWeights.from_state_dict(
            state,
            dims,
            bool(getattr(hf_config, "tie_word_embeddings", False)),
            norm_offset=style.norm_offset,
        )
        if n_layers is not None:
            weights.layers = weights.layers[:n_layers]
            dims = dataclasses.replace(dims, num_layers=len(weights.layers))
        return cls(
            weights,
            dims,
            rope.inv_freq,
            rope.scaling,
            max_batch_size,
            max_seq_len,
            lanes=tt_data_parallel,
            window=attention_window(hf_config),
            style=style,
            local_rope=rope.local,
        )

    # ---- the contract ----------------------------------------------------------------

    def prefill_forward(
        self,
        tokens: torch.Tensor,
        page_table: torch.Tensor,
        kv_cache: KVCache,
        prompt_lens: Any,
        empty_slots: Any = None,
        enable_trace: bool = True,
        sampling_params: SamplingParams | None = None,
        start_pos: Any = None,
        return_prompt_logits: bool = False,
        page_tables_per_layer: Any = None,
        return_hidden_states: bool = False,
        **kwargs: Any,
    ) -> torch.Tensor | tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor] | None]:
        """Prefill one chunk per row; logits `[B, 1, V]`, or `(tokens [B, 1], log_probs)`
        when sampling on the device (TT-Metal's `prefill_forward_text` forms). With
        `return_prompt_logits` (a bundle declaring prompt logprobs, ttbundles' own form):
        logits of every position of each row's chunk, `[B, L, V]` (L the longest chunk;
        column j of row i is the distribution after its token start_pos[i] + j).

        Row i computes positions `start_pos[i] .. prompt_lens[i] - 1` (start_pos None: 0).
        As in TT-Metal's generators, `tokens[i]` holds the row's tokens from position 0:
        the chunk is `tokens[i, start_pos[i]:prompt_lens[i]]`, and what lies before it is
        not read. Positions below start_pos[i] must already be in the cache: an earlier
        chunk, or blocks shared through prefix caching. Rows with nothing to compute
        (prompt_lens <= start_pos) are padding. `empty_slots[i]` is the batch slot row i
        is being placed in (default: row i): with `sampling_params`, the row's sampling
        state (parameters, seed, prompt history) is registered there, and the token drawn
        is the one at position prompt_lens[i]. `page_table` rows follow the request rows;
        `page_tables_per_layer` (one per layer, each its KV group's) supersedes it.

        With `return_hidden_states` (a bundle serving pooling of the form
        `prefill_hidden`): the final hidden states, after the last norm, of every position
        of each row's chunk, `[B, L, hidden]` (L the longest chunk, zero past a row's
        chunk), which vLLM's pooler finishes on the host (last token, mean or CLS
        pooling, normalisation, a classifier head).
        """
        if kwargs:
            raise TypeError(f"prefill_forward got unexpected keywords: {', '.join(sorted(kwargs))}")
        inputs = PrefillBatch.read(
            tokens, prompt_lens, start_pos, empty_slots, page_table, page_tables_per_layer
        )
        return self._device_queue.submit(
            self._prefill_run,
            inputs,
            kv_cache,
            sampling_params,
            every_position=return_hidden_states or return_prompt_logits,
            hidden=return_hidden_states,
        ).result()

    def decode_forward(
        self,
        tokens: torch.Tensor,
        start_pos: Any,
        page_table: torch.Tensor | None = None,
        kv_cache: KVCache | None = None,
        enable_trace: bool = True,
        read_from_device: bool = True,
        sampling_params: SamplingParams | None = None,
        prompt_tokens: torch.Tensor | None = None,
        output_tokens: torch.Tensor | None = None,
        slot_remap: Any = None,
        *,
        reload_inputs: bool = True,
        reload_page_table: bool = False,
        reload_sampling_params: bool = False,
        reset_sampling_state: bool = False,
        num_valid_drafts: Any = None,
        accepted_counts: Any = None,
        spec_mode: str | None = None,
        page_tables_per_layer: Any = None,
        grammar_bitmask: torch.Tensor | None = None,
        **kwargs: Any,
    ) -> Any:
        """One token per slot: row i is batch slot i, its token at position `start_pos[i]`
        (-1: an empty slot, skipped). Decode input-update contract v1. The commands say
        what the host inputs are worth (TT-Metal `models/common/decode_contract.py`):
        `reload_inputs` restages tokens, positions and the page table from the host;
        `reload_page_table` only the page table; neither: the resident inputs are used,
        which the last device-sampling decode left (its sampled tokens, positions advanced
        by one), so `tokens` and `start_pos` are deliberately stale and not read.
        `reload_sampling_params` uploads the parameters and registers changed seeds;
        `reset_sampling_state` rebuilds seeds, counters and the penalty history
        (`prompt_tokens`, `output_tokens`: `[B, L]`, -1 padded).
        `slot_remap[i] = j` moves slot j's state to slot i first. `page_tables_per_layer`
        (one per layer, each its KV group's) supersedes `page_table`, resident alike;
        `grammar_bitmask` (packed, a row per slot) constrains the device sampler's tokens.

        With `spec_mode` (and `num_valid_drafts`, `accepted_counts`) it is a speculative
        verify over `[B, 1+K]` tokens and positions instead (`verify`): the host's inputs,
        read now, returning a `VerifyOutput` (with `read_from_device=False` its `argmax_ids`
        or `logits` a DeviceOutput for `read_decode_output`: `supports_async_spec_decode`).

        Returns `(logits [B, 1, V], None)`, or with `sampling_params` `(tokens [B],
        log_probs)`, log_probs None or `(top_logprobs [B, K], top_ids [B, K])` (rows asking
        for them); with `read_from_device=False`, a DeviceOutput for `read_decode_output`.
        """
        check_decode_commands(
            enable_trace, reload_inputs, reload_page_table, reset_sampling_state, kwargs
        )
        speculative = (num_valid_drafts, accepted_counts, spec_mode)
        if any(v is not None for v in speculative):
            return self._verify_forward(
                tokens,
                start_pos,
                page_table,
                kv_cache,
                speculative,
                reload_inputs=reload_inputs,
                read_from_device=read_from_device,
                page_tables_per_layer=page_tables_per_layer,
            )
        step = DecodeStep.read(
            tokens,
            start_pos,
            page_table,
            page_tables_per_layer,
            slot_remap,
            reload_inputs=reload_inputs,
            reload_page_table=reload_page_table,
            sampling_params=sampling_params,
            reload_sampling_params=reload_sampling_params,
            reset_sampling_state=reset_sampling_state,
            prompt_tokens=prompt_tokens,
            output_tokens=output_tokens,
            grammar_bitmask=grammar_bitmask,
        )
        return self._submit_decode(step, kv_cache, read_from_device)

    def warmup_model_prefill(self, *args: Any, **kwargs: Any) -> None:
        """Nothing to warm up: no traces or kernels to compile on the host."""

    def warmup_model_decode(self, *args: Any, **kwargs: Any) -> None:
        """Nothing to warm up: no traces or kernels to compile on the host."""


class ReferenceLlamaGeneratorLegacy(ReferenceLlamaGenerator):
    """The same generator in the pre-contract decode form (`reset_batch`), as TT-Metal's
    generators were before `decode_input_update_contract`: the generator decides itself
    what to restage. A reset, host sampling, no trace or a first call restage everything;
    otherwise the resident tokens are used and the page table is copied (TT-Metal compared
    it with the previous one; copying always is the same result). No `**kwargs`: a
    worker that sends the v1 commands to it fails with a TypeError.
    """

    decode_input_update_contract = 0
    _follows_device_decode = False
    model_capabilities = {
        "supports_prefix_caching": True,
        "supports_async_decode": True,
        "supports_sample_on_device": True,
        "supports_chunked_prefill": True,
    }

    def prefill_forward(self, *args: Any, **kwargs: Any) -> Any:
        self._follows_device_decode = False  # TT-Metal restaged after a mode switch
        return super().prefill_forward(*args, **kwargs)

    def decode_forward(  # type: ignore[override]
        self,
        tokens: torch.Tensor,
        start_pos: Any,
        page_table: torch.Tensor | None = None,
        kv_cache: KVCache | None = None,
        enable_trace: bool = True,
        read_from_device: bool = True,
        sampling_params: SamplingParams | None = None,
        reset_batch: bool = False,
        prompt_tokens: torch.Tensor | None = None,
        output_tokens: torch.Tensor | None = None,
        slot_remap: Any = None,
    ) -> Any:
        device = sampling_params is not None
        # Decided on the host at submission, as TT-Metal did: a device-sampling decode
        # follows the last one unless a reset, a prefill or a host-sampled step came between.
        full = reset_batch or not device or not enable_trace or not self._follows_device_decode
        self._follows_device_decode = device and enable_trace
        return super().decode_forward(
            tokens,
            start_pos,
            page_table,
            kv_cache,
            enable_trace=enable_trace,
            read_from_device=read_from_device,
            sampling_params=sampling_params,
            prompt_tokens=prompt_tokens,
            output_tokens=output_tokens,
            slot_remap=slot_remap,
            reload_inputs=full,
            reload_page_table=not full,
            reload_sampling_params=full and device,
            reset_sampling_state=full and device,
        )
