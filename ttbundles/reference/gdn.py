"""Gated delta net (GDN) linear attention, as transformers' `modeling_qwen3_5` computes it,
and the recurrent state it keeps per batch slot.

A GDN layer keeps no KV cache: each request carries a fixed-size state instead, the last
K - 1 inputs of its depthwise causal convolution (`conv`) and the delta rule's matrix per
value head (`recurrent`). The state is the generator's (as TT-Metal's Qwen classes own
it), one slot per user: prefill writes a row's state into its slot, a later chunk and
every decode continue it. Everything here is float32, the recurrent state included
(transformers keeps it float32 whatever the model's dtype).

A row is computed for its real tokens only, never right-padded: a padded token would enter
the state (the conv window and the delta rule both read every token in order), which is
why the forward pass runs GDN rows one at a time in prefill and batched only in decode,
where every row is one token.

Shapes: n rows of L tokens each; C = conv_dim = 2 * Hk * Dk + Hv * Dv (q | k | v);
H = Hv value heads (q and k repeat Hk -> Hv); Dk, Dv the key and value head sizes.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F


def causal_conv(
    mixed: torch.Tensor, previous: torch.Tensor, weight: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """The depthwise causal conv1d with SiLU over `mixed [n, L, C]`, continuing from the
    K - 1 inputs before it (`previous [n, C, K - 1]`, zeros for a fresh row); weight
    `[C, K]` (transformers' `conv1d.weight[:, 0]`, no bias). Returns the output
    `[n, L, C]` and the new state `[n, C, K - 1]` (the last K - 1 inputs)."""
    kernel = weight.shape[-1]
    window = torch.cat([previous, mixed.transpose(1, 2)], dim=-1)  # [n, C, K - 1 + L]
    out = F.conv1d(window, weight[:, None, :], groups=weight.shape[0])  # [n, C, L]
    return F.silu(out).transpose(1, 2), window[:, :, window.shape[-1] - (kernel - 1) :]


def l2norm(x: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """L2 normalisation over the last dimension, as transformers' `l2norm` (eps inside)."""
    return x * torch.rsqrt((x * x).sum(dim=-1, keepdim=True) + eps)


def gated_delta_rule(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    state: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The gated delta rule in its recurrent form, one token at a time.

    q, k `[n, L, H, Dk]` (already L2-normalised, q scaled by Dk^-1/2); v `[n, L, H, Dv]`;
    g (log decay, <= 0) and beta `[n, L, H]`; state `[n, H, Dk, Dv]`. Per token:
    S <- S * exp(g); S <- S + k (x) beta * (v - k^T S); o = q^T S
    (transformers' `torch_recurrent_gated_delta_rule`). Returns o `[n, L, H, Dv]` and the
    final state.
    """
    out = torch.empty_like(v)
    for t in range(q.shape[1]):
        state = state * g[:, t].exp()[..., None, None]
        remembered = (state * k[:, t, ..., None]).sum(dim=-2)  # [n, H, Dv]
        delta = (v[:, t] - remembered) * beta[:, t, ..., None]
        state = state + k[:, t, ..., None] * delta[..., None, :]
        out[:, t] = (state * q[:, t, ..., None]).sum(dim=-2)
    return out, state


@dataclass
class GdnState:
    """Every GDN layer's state, one slot per user: conv `[layers, slots, C, K - 1]` and
    recurrent `[layers, slots, H, Dk, Dv]`, float32 (the GDN layers in model order)."""

    conv: torch.Tensor
    recurrent: torch.Tensor

    @classmethod
    def zeros(cls, layers: int, slots: int, conv: tuple[int, int], recurrent: tuple[int, ...]):
        return cls(
            torch.zeros(layers, slots, *conv, dtype=torch.float32),
            torch.zeros(layers, slots, *recurrent, dtype=torch.float32),
        )

    @property
    def slots(self) -> int:
        return self.conv.shape[1]

    def read(
        self, layer: int, slots: list[int], fresh: list[bool]
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The state the rows start from `([n, C, K - 1], [n, H, Dk, Dv])`: their slots',
        zeros for a fresh row (its first chunk: nothing before it is the row's)."""
        index = torch.tensor(slots)
        keep = torch.tensor([not f for f in fresh], dtype=torch.float32)
        conv = self.conv[layer, index] * keep[:, None, None]
        recurrent = self.recurrent[layer, index] * keep[:, None, None, None]
        return conv, recurrent

    def write(
        self, layer: int, slots: list[int], conv: torch.Tensor, recurrent: torch.Tensor
    ) -> None:
        """Store the rows' final states in their slots."""
        index = torch.tensor(slots)
        self.conv[layer, index] = conv
        self.recurrent[layer, index] = recurrent

    def snapshot(self, slot: int) -> tuple[torch.Tensor, torch.Tensor]:
        """A copy of one slot's state (every layer)."""
        return self.conv[:, slot].clone(), self.recurrent[:, slot].clone()

    def restore(self, slot: int, saved: tuple[torch.Tensor, torch.Tensor]) -> None:
        """Put a `snapshot` into one slot."""
        self.conv[:, slot] = saved[0]
        self.recurrent[:, slot] = saved[1]

    def clear(self, slot: int) -> None:
        """Zero one slot (a released request's)."""
        self.conv[:, slot] = 0
        self.recurrent[:, slot] = 0

    def gather(self, sources: list[int]) -> None:
        """Slot i takes slot sources[i]'s state, all at once (a permutation or a copy);
        slots past the list keep theirs."""
        index = torch.tensor(sources)
        targets = torch.arange(len(sources))
        self.conv[:, targets] = self.conv[:, index].clone()
        self.recurrent[:, targets] = self.recurrent[:, index].clone()


@dataclass
class PerLayerGdnState:
    """Every GDN layer's state in vLLM's layout, as `allocate_kv_cache_per_layer` made it
    from the layers' `{"type": "mamba", ...}` descriptors (vLLM's KV manager owns the
    state: `MambaSpec`): per GDN layer, conv `[slots, K - 1, C]` and recurrent
    `[slots, H, Dv, Dk]` (`MambaStateShapeCalculator.gated_delta_net_state_shape`: V
    before K, transposed against transformers'). The same reads and writes as
    `GdnState`, transposing at the edge; the computation stays float32."""

    conv: list[torch.Tensor]
    recurrent: list[torch.Tensor]

    @property
    def slots(self) -> int:
        return self.conv[0].shape[0] if self.conv else 0

    def read(
        self, layer: int, slots: list[int], fresh: list[bool]
    ) -> tuple[torch.Tensor, torch.Tensor]:
        index = torch.tensor(slots)
        keep = torch.tensor([not f for f in fresh], dtype=torch.float32)
        conv = self.conv[layer][index].transpose(1, 2).float() * keep[:, None, None]
        recurrent = self.recurrent[layer][index].transpose(2, 3).float()
        return conv, recurrent * keep[:, None, None, None]

    def write(
        self, layer: int, slots: list[int], conv: torch.Tensor, recurrent: torch.Tensor
    ) -> None:
        index = torch.tensor(slots)
        target_conv, target_recurrent = self.conv[layer], self.recurrent[layer]
        target_conv[index] = conv.transpose(1, 2).to(target_conv.dtype)
        target_recurrent[index] = recurrent.transpose(2, 3).to(target_recurrent.dtype)

    def clear(self, slot: int) -> None:
        for conv, recurrent in zip(self.conv, self.recurrent):
            conv[slot] = 0
            recurrent[slot] = 0

    def gather(self, sources: list[int]) -> None:
        index = torch.tensor(sources)
        targets = torch.arange(len(sources))
        for conv, recurrent in zip(self.conv, self.recurrent):
            conv[targets] = conv[index].clone()
            recurrent[targets] = recurrent[index].clone()

    def copy(self, sources: list[int], targets: list[int]) -> None:
        """Every layer's state `sources[i]` into `targets[i]` (vLLM's "align" mode: a
        step crossing a block boundary continues a copy of the previous block's state)."""
        src, dst = torch.tensor(sources), torch.tensor(targets)
        for conv, recurrent in zip(self.conv, self.recurrent):
            conv[dst] = conv[src].clone()
            recurrent[dst] = recurrent[src].clone()
