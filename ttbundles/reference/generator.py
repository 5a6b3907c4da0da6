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
(q/k/v biases) and Qwen3 (per-head RMSNorm on q and k). RoPE types: "default", "linear",
"llama3" and "yarn" (see `rope_frequencies`). Sliding-window attention is not modelled.

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
    kv_cache      list over layers of [k_cache, v_cache], each [N, KV, Bs, D] float32
    logits        [B, 1, V] float32 (last token of each row)
    sampled       [B] int64
"""

from __future__ import annotations

import warnings
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import torch
import torch.nn.functional as F

from ttbundles.format.contract import SamplingParamsBatch
from ttbundles.reference.attention import (
    Segment,
    apply_rope,
    attention_groups,
    rms_norm,
    rope_cos_sin,
)
from ttbundles.reference.config import ModelDims, rope_frequencies
from ttbundles.reference.readback import DeviceOutput, ReadEvent
from ttbundles.reference.sampling import sample_tokens
from ttbundles.reference.weights import LlamaWeights, checkpoint_dir, load_safetensors

KVCache = list[list[torch.Tensor]]
"""Per layer `[k_cache, v_cache]`, each `[N, KV, Bs, D]`."""


def _int_list(values: Any, count: int, name: str) -> list[int]:
    """A list/tensor of `count` ints (positions, lengths) as Python ints."""
    if isinstance(values, torch.Tensor):
        values = values.reshape(-1).tolist()
    values = [int(v) for v in values]
    if len(values) < count:
        raise ValueError(f"{name} has {len(values)} entries for {count} rows")
    return values[:count]


class ReferenceLlamaGenerator:
    """The generator contract for Llama-family checkpoints, in torch, on the host.

    Stateless between calls apart from the KV cache the worker owns: every position's
    K/V lives in the paged cache, so chunked prefill, prefix caching and preemption need
    no bookkeeping here (`empty_slots`, `reset_batch`, `enable_trace` are accepted and
    ignored for that reason).
    """

    model_capabilities = {
        "supports_prefix_caching": True,
        "supports_async_decode": True,
        "supports_sample_on_device": True,
        "supports_chunked_prefill": True,
    }

    def __init__(
        self,
        weights: LlamaWeights,
        dims: ModelDims,
        inv_freq: torch.Tensor,
        attention_scaling: float = 1.0,
        max_batch_size: int = 32,
        max_seq_len: int = 2048,
    ):
        self.weights = weights
        self.dims = dims
        self.inv_freq = inv_freq  # [D / 2]
        self.attention_scaling = attention_scaling  # cos/sin scale (yarn), else 1
        self.max_batch_size = max_batch_size
        self.max_seq_len = max_seq_len
        self.scale = dims.head_dim**-0.5
        # Rows without a seed draw from one stream per generator, seeded unpredictably.
        self.unseeded_generator = torch.Generator()
        self.unseeded_generator.seed()
        # One worker thread stands in for the device's command queue: every forward and
        # readback runs there in submission order, so the host can schedule the next step
        # while a decode computes, as it would with a card.
        self._device_queue = ThreadPoolExecutor(
            max_workers=1, thread_name_prefix="reference-device"
        )
        # The last decode's on-device sampled tokens: the next step's input when the batch
        # is unchanged (`reset_batch=False`), so the host need not read them back first.
        self._last_tokens: DeviceOutput | None = None

    # ---- construction ----------------------------------------------------------------

    @classmethod
    def initialize_vllm_model(
        cls,
        hf_config: Any,
        mesh_device: Any,
        max_batch_size: int,
        max_seq_len: int,
        tt_data_parallel: int = 1,
        optimizations: str | None = None,
    ) -> ReferenceLlamaGenerator:
        """Load the checkpoint named by `hf_config._name_or_path`, float32.

        `mesh_device` (a HostMesh), `tt_data_parallel` and `optimizations` change nothing
        here: rows are independent, and float32 torch has no accuracy/speed trade-off.
        """
        dims = ModelDims.from_hf_config(hf_config)
        window = getattr(hf_config, "sliding_window", None)
        if (
            getattr(hf_config, "use_sliding_window", window is not None)
            and window
            and (window < max_seq_len)
        ):
            warnings.warn(
                f"sliding_window={window} < max_seq_len={max_seq_len}: the reference "
                "generator attends over the full context, so results past the window "
                "differ from the model's",
                stacklevel=2,
            )
        inv_freq, attention_scaling = rope_frequencies(hf_config, dims)
        state = load_safetensors(checkpoint_dir(hf_config))
        weights = LlamaWeights.from_state_dict(
            state, dims, bool(getattr(hf_config, "tie_word_embeddings", False))
        )
        return cls(weights, dims, inv_freq, attention_scaling, max_batch_size, max_seq_len)

    def allocate_kv_cache(
        self, kv_cache_shape: tuple[int, int, int, int], dtype: Any, num_layers: int
    ) -> KVCache:
        """Zeroed paged cache: per layer `[k_cache, v_cache]`, each `kv_cache_shape`
        = `(N, KV, Bs, D)`. Always float32, whatever `dtype` asks: the reference keeps
        full precision so differences from it are the TT generator's own."""
        num_blocks, kv_heads, block_size, head_size = kv_cache_shape
        if (kv_heads, head_size) != (self.dims.num_kv_heads, self.dims.head_dim):
            raise ValueError(
                f"kv_cache_shape {tuple(kv_cache_shape)} does not fit the model "
                f"({self.dims.num_kv_heads} KV heads of size {self.dims.head_dim})"
            )
        if num_layers != self.dims.num_layers:
            raise ValueError(f"num_layers {num_layers} != the model's {self.dims.num_layers}")
        shape = (num_blocks, kv_heads, block_size, head_size)
        return [
            [torch.zeros(shape, dtype=torch.float32), torch.zeros(shape, dtype=torch.float32)]
            for _ in range(num_layers)
        ]

    # ---- the forward pass ------------------------------------------------------------

    @torch.no_grad()
    def forward_segments(
        self, segments: list[Segment], page_table: torch.Tensor, kv_cache: KVCache
    ) -> torch.Tensor:
        """Run the model over new tokens of several sequences; last-token logits `[n, V]`.

        All rows' tokens are flattened into one `[T, hidden]` activation so projections
        and the MLP run once per layer. Each layer first writes the new K/V of every token
        into the paged cache (one indexed write), then attends over each row's context
        read back from it, so earlier chunks and prefix-cached blocks are seen exactly like
        new ones. Attention is batched per `AttentionGroup` (see `attention_groups`).
        """
        dims = self.dims
        lengths = torch.tensor([len(s.tokens) for s in segments])  # [n]
        token_ids = torch.cat([s.tokens for s in segments])  # [T]
        positions = torch.cat([torch.arange(s.start, s.end) for s in segments])  # [T]
        rows = torch.tensor([s.row for s in segments]).repeat_interleave(lengths)  # [T]
        block_size = kv_cache[0][0].shape[2]
        block_of_token = page_table[rows, positions // block_size]  # [T]
        slot_of_token = positions % block_size  # [T]
        cos, sin = rope_cos_sin(positions, self.inv_freq, self.attention_scaling)
        groups = attention_groups(segments, positions, page_table, kv_cache[0][0].shape)

        x = self.weights.embed_tokens[token_ids]  # [T, hidden]
        for layer, (k_cache, v_cache) in zip(self.weights.layers, kv_cache, strict=True):
            h = rms_norm(x, layer.input_norm, dims.rms_norm_eps)
            q = layer.q_proj(h).view(-1, dims.num_heads, dims.head_dim)  # [T, H, D]
            k = layer.k_proj(h).view(-1, dims.num_kv_heads, dims.head_dim)  # [T, KV, D]
            v = layer.v_proj(h).view(-1, dims.num_kv_heads, dims.head_dim)
            if layer.q_norm is not None:  # Qwen3: RMSNorm of each head, before RoPE
                q = rms_norm(q, layer.q_norm, dims.rms_norm_eps)
                k = rms_norm(k, layer.k_norm, dims.rms_norm_eps)
            q = apply_rope(q, cos, sin)
            k = apply_rope(k, cos, sin)

            # cache[block, :, slot, :] for each token t gets k[t] ([KV, D]).
            k_cache[block_of_token, :, slot_of_token, :] = k
            v_cache[block_of_token, :, slot_of_token, :] = v

            # [T, H, D]: the groups' spans tile the flattened tokens in order.
            attended = torch.cat([g.attend(q, k_cache, v_cache, self.scale) for g in groups])
            x = x + layer.o_proj(attended.view(-1, dims.num_heads * dims.head_dim))

            h = rms_norm(x, layer.post_attention_norm, dims.rms_norm_eps)
            x = x + layer.down_proj(F.silu(layer.gate_proj(h)) * layer.up_proj(h))

        last = lengths.cumsum(0) - 1  # [n] each segment's last token
        final = rms_norm(x[last], self.weights.final_norm, dims.rms_norm_eps)
        return F.linear(final, self.weights.lm_head)  # [n, V]

    def _run(
        self, segments: list[Segment], batch: int, page_table: Any, kv_cache: KVCache
    ) -> torch.Tensor:
        """Logits `[B, V]` for a batch where only `segments`' rows are real (others 0)."""
        if page_table is None:
            raise ValueError("the reference generator needs a page_table (paged KV cache only)")
        logits = torch.zeros(batch, self.dims.vocab_size, dtype=torch.float32)
        if segments:
            table = torch.as_tensor(page_table).long()
            rows = torch.tensor([s.row for s in segments])
            logits[rows] = self.forward_segments(segments, table, kv_cache)
        return logits

    # ---- the contract ----------------------------------------------------------------

    def prefill_forward(
        self,
        tokens: torch.Tensor,
        page_table: torch.Tensor,
        kv_cache: KVCache,
        prompt_lens: Any,
        start_pos: Any = None,
        enable_trace: bool = False,
        sampling_params: SamplingParamsBatch | None = None,
        empty_slots: Any = None,
        **kwargs: Any,
    ) -> torch.Tensor:
        """Prefill one chunk per row; last-token logits `[B, 1, V]`, or tokens `[B]`.

        Row i computes positions `start_pos[i] .. prompt_lens[i] - 1` (start_pos None: 0).
        As in TT-Metal's generators, `tokens[i]` holds the row's tokens from position 0:
        the chunk is `tokens[i, start_pos[i]:prompt_lens[i]]`, and what lies before it is
        not read (the rest of the row is padding). Positions below start_pos[i] must
        already be in the cache: an earlier chunk, or blocks shared through prefix
        caching. Rows with nothing
        to compute (prompt_lens <= start_pos) are padding: logits 0, cache untouched.
        With `sampling_params`, the token drawn for row i is the one at position
        prompt_lens[i] (seeded rows are keyed on that position).
        """
        batch = tokens.shape[0]
        ends = _int_list(prompt_lens, batch, "prompt_lens")
        starts = [0] * batch if start_pos is None else _int_list(start_pos, batch, "start_pos")
        segments = []
        for row in range(batch):
            length = ends[row] - starts[row]
            if length <= 0:
                continue
            if ends[row] > tokens.shape[1]:
                raise ValueError(
                    f"row {row}: chunk of positions {starts[row]}..{ends[row] - 1} needs "
                    f"tokens up to position {ends[row] - 1} but tokens has width "
                    f"{tokens.shape[1]} (tokens hold the row from position 0)"
                )
            segments.append(Segment(row, tokens[row, starts[row] : ends[row]].long(), starts[row]))
        self._last_tokens = None  # a prefill changes the batch: the next decode resets it

        def compute() -> torch.Tensor:
            logits = self._run(segments, batch, page_table, kv_cache)
            if sampling_params is None:
                return logits.unsqueeze(1)
            active = [ends[row] > starts[row] for row in range(batch)]
            return sample_tokens(logits, sampling_params, ends, active, self.unseeded_generator)

        return self._device_queue.submit(compute).result()

    def decode_forward(
        self,
        tokens: torch.Tensor,
        start_pos: Any,
        page_table: torch.Tensor,
        kv_cache: KVCache,
        enable_trace: bool = False,
        read_from_device: bool = True,
        sampling_params: SamplingParamsBatch | None = None,
        prompt_tokens: Any = None,
        output_tokens: Any = None,
        reset_batch: bool = False,
        **kwargs: Any,
    ) -> torch.Tensor | DeviceOutput:
        """One token per row: `tokens[i, 0]` at position `start_pos[i]`.

        Writes its K/V and attends over positions <= start_pos[i]. Rows with start_pos -1
        are padding: skipped, cache untouched, logits 0 / token 0. Returns logits
        `[B, 1, V]`, or with `sampling_params` tokens `[B]` (drawn for position
        start_pos[i] + 1). With `read_from_device=False` the result is a DeviceOutput for
        `read_decode_output`. prompt_tokens/output_tokens (penalties on device) are not
        used: SamplingParamsBatch carries no penalties.
        """
        batch = tokens.shape[0]
        positions = _int_list(start_pos, batch, "start_pos")
        host_tokens = tokens.reshape(batch, -1)[:, 0].long().clone()
        previous = None if reset_batch else self._last_tokens
        if previous is None and bool((host_tokens < 0).any()):
            raise ValueError(
                "tokens has unknown (-1) entries but there is no previous decode "
                "on the device to take them from (pass reset_batch=True)"
            )

        def compute() -> torch.Tensor:
            token_ids = host_tokens
            if previous is not None:
                # Same batch as the last decode: its sampled tokens, still on the device,
                # are this step's input wherever the host did not know them yet.
                on_device = previous.tensor.reshape(-1)
                if on_device.shape == token_ids.shape:
                    token_ids = torch.where(token_ids < 0, on_device, token_ids)
            segments = [
                Segment(row, token_ids[row : row + 1], positions[row])
                for row in range(batch)
                if positions[row] >= 0
            ]
            logits = self._run(segments, batch, page_table, kv_cache)
            if sampling_params is None:
                return logits.unsqueeze(1)
            active = [p >= 0 for p in positions]
            next_positions = [p + 1 for p in positions]
            return sample_tokens(
                logits, sampling_params, next_positions, active, self.unseeded_generator
            )

        is_tokens = sampling_params is not None
        out = DeviceOutput(
            self._device_queue.submit(compute),
            is_tokens=is_tokens,
            shape=(batch,) if is_tokens else (batch, 1, self.dims.vocab_size),
        )
        self._last_tokens = out if sampling_params is not None else None
        if read_from_device:
            return out.tensor
        return out

    def read_decode_output(
        self, out: DeviceOutput | torch.Tensor, async_read: bool = False
    ) -> torch.Tensor | tuple[torch.Tensor, list[ReadEvent]]:
        """Copy a decode result to the host.

        `async_read=False`: the host tensor. `async_read=True`: `(host_out, events)`; the
        copy runs on the readback thread, and host_out is valid once every event's
        `wait()` has returned. A tensor already on the host passes through (no events).
        """
        if isinstance(out, torch.Tensor):
            return (out, []) if async_read else out
        if not async_read:
            return out.tensor.clone()
        host = torch.empty(out.shape, dtype=out.dtype)
        future = self._device_queue.submit(lambda: host.copy_(out.tensor))
        return host, [ReadEvent(future)]

    def process_decode_output_host(
        self, host_out: torch.Tensor | DeviceOutput, is_tokens: bool = False
    ) -> torch.Tensor:
        """The final host result: tokens `[B]` int64 when `is_tokens`, else logits
        `[B, 1, V]` float32. Call it only after the read's events were waited on."""
        if isinstance(host_out, DeviceOutput):  # tolerate a skipped read: read it now
            host_out = self.read_decode_output(host_out, async_read=False)
        if is_tokens:
            if host_out.is_floating_point():
                raise ValueError("is_tokens=True but the decode output is logits")
            return host_out.reshape(-1).long()
        if not host_out.is_floating_point():
            raise ValueError("is_tokens=False but the decode output is sampled tokens")
        return host_out.reshape(host_out.shape[0], 1, -1)

    def warmup_model_prefill(self, *args: Any, **kwargs: Any) -> None:
        """Nothing to warm up: no traces or kernels to compile on the host."""

    def warmup_model_decode(self, *args: Any, **kwargs: Any) -> None:
        """Nothing to warm up: no traces or kernels to compile on the host."""
