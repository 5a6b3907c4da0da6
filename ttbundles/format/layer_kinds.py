"""What each layer of a checkpoint is: attention, or a layer that keeps recurrent state.

Hybrid and state-space families replace some or all attention layers with layers whose
memory of the context is a fixed-size state per request (a causal convolution's last
K-1 inputs and, for most, a recurrent matrix) instead of a KV cache that grows with the
context. vLLM gives such layers a `MambaSpec`; the Tenstorrent generator contract has no
state yet, so the planner must say which layers they are (never "full attention") and
refuse what it cannot serve (`serving.planning.recurrent`). Each family's rule is read
here as transformers' configuration class derives it:

- Qwen3.5 and Qwen3-Next (`qwen3_5*`, `qwen3_next`): `layer_types` of
  "linear_attention" (gated delta net, GDN) and "full_attention"; absent, every
  `full_attention_interval`-th layer (default 4) is full attention.
- Jamba: layer i is attention when `i % attn_layer_period == attn_layer_offset`, else
  Mamba (Mamba 1).
- Bamba: attention at `attn_layer_indices`, Mamba2 elsewhere.
- Mamba (`mamba`) and Mamba2 (`mamba2`): every layer recurrent, no attention.
- Falcon-H1: every layer runs attention and a Mamba2 mixer side by side (a parallel
  hybrid): each layer keeps both a KV cache and a state.
- Nemotron-H: `hybrid_override_pattern`, "M" Mamba2, "*" attention, "-" and "E" MLP only.
- Granite 4 hybrids (`granitemoehybrid`): `layer_types` "mamba" (Mamba2) and "attention".
- LFM2: `layer_types` "conv" (a gated short convolution) and "full_attention".
- Any other config: `layer_types`' recurrent names when it has them, else every layer is
  attention (sliding windows are `format.attention_window`'s).

Also the state a request holds (`RecurrentState.bytes_per_request`), from the shapes vLLM
gives each kind (`vllm/model_executor/layers/mamba/mamba_utils.py`,
`MambaStateShapeCalculator`): a gated delta net layer keeps a conv state of (K-1) x
conv_dim (conv_dim = 2 Hk Dk + Hv Dv) and a recurrent state Hv x Dk x Dv.

Pure Python over a config object or its `config.json` dict, no vLLM or torch: `validate`,
`init`, the planner and `ttbundle test` read it alike.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

ATTENTION = "attention"
GDN = "gated_delta_net"
MAMBA = "mamba"
MAMBA2 = "mamba2"
SHORT_CONV = "short_conv"
PARALLEL_HYBRID = "attention+mamba2"
MLP_ONLY = "mlp"
"""The kinds of layer. Every kind but ATTENTION and MLP_ONLY keeps recurrent state."""

RECURRENT_KINDS = frozenset({GDN, MAMBA, MAMBA2, SHORT_CONV, PARALLEL_HYBRID})
ATTENDING_KINDS = frozenset({ATTENTION, PARALLEL_HYBRID})

_NAMES = {
    ATTENTION: "full-attention",
    GDN: "linear-attention (gated delta net)",
    MAMBA: "Mamba",
    MAMBA2: "Mamba2",
    SHORT_CONV: "short-convolution",
    PARALLEL_HYBRID: "parallel attention + Mamba2",
    MLP_ONLY: "MLP-only",
}

# `layer_types` names of recurrent layers, by what they mean in every family using them
# (Granite's "mamba" is Mamba2: `_MAMBA_IS_MAMBA2`).
_LAYER_TYPE_KINDS = {
    "linear_attention": GDN,
    "mamba": MAMBA,
    "mamba2": MAMBA2,
    "conv": SHORT_CONV,
    "short_conv": SHORT_CONV,
}
_MAMBA_IS_MAMBA2 = ("granitemoehybrid", "bamba", "nemotron_h", "zamba2")
_GDN_FAMILIES = ("qwen3_5", "qwen3_next")
_DEFAULT_FULL_ATTENTION_INTERVAL = 4  # Qwen3_5TextConfig's and Qwen3NextConfig's default

# Architectures whose checkpoints keep recurrent state, by name: what `validate`, `init`
# and TTB041 can say before any config is read. The config decides which layers.
RECURRENT_ARCHITECTURES: dict[str, str] = {
    "Qwen3_5ForCausalLM": GDN,
    "Qwen3_5ForConditionalGeneration": GDN,
    "Qwen3_5MoeForCausalLM": GDN,
    "Qwen3_5MoeForConditionalGeneration": GDN,
    "Qwen3NextForCausalLM": GDN,
    "JambaForCausalLM": MAMBA,
    "MambaForCausalLM": MAMBA,
    "Mamba2ForCausalLM": MAMBA2,
    "BambaForCausalLM": MAMBA2,
    "FalconH1ForCausalLM": PARALLEL_HYBRID,
    "NemotronHForCausalLM": MAMBA2,
    "GraniteMoeHybridForCausalLM": MAMBA2,
    "Zamba2ForCausalLM": MAMBA2,
    "Lfm2ForCausalLM": SHORT_CONV,
}


def recurrent_kind_of_architecture(arch: str) -> str | None:
    """The recurrent layer kind an architecture's checkpoints have (a `TT` prefix aside),
    None when it keeps none (as far as this table knows)."""
    return RECURRENT_ARCHITECTURES.get(arch) or RECURRENT_ARCHITECTURES.get(arch.removeprefix("TT"))


def kind_name(kind: str) -> str:
    """How a kind is written in plans and messages: `linear-attention (gated delta net)`."""
    return _NAMES.get(kind, kind)


@dataclass(frozen=True)
class RecurrentState:
    """The state one request holds in each recurrent layer, in elements (vLLM's shapes)."""

    conv_elements: int
    """The causal convolution's last K-1 inputs: (K-1) x conv_dim."""
    ssm_elements: int
    """The recurrent (SSM or delta-rule) state: Hv x Dk x Dv for a gated delta net."""

    def bytes_per_layer(self, conv_bytes: int, ssm_bytes: int | None = None) -> int:
        """Bytes of one layer's state, with each part's element size (the recurrent part
        takes the conv part's when not given, as vLLM's `mamba_ssm_cache_dtype` "auto")."""
        return self.conv_elements * conv_bytes + self.ssm_elements * (ssm_bytes or conv_bytes)


@dataclass(frozen=True)
class LayerKinds:
    """Each layer's kind, in order, and the per-layer state of the recurrent ones."""

    kinds: tuple[str, ...]
    state: RecurrentState | None = None
    """The state of one recurrent layer (every recurrent layer of a family has the same
    shape); None when no layer keeps any, or the family's shape is not known here."""

    @property
    def num_layers(self) -> int:
        return len(self.kinds)

    @property
    def recurrent_layers(self) -> tuple[int, ...]:
        """The indices of the layers that keep recurrent state."""
        return tuple(i for i, kind in enumerate(self.kinds) if kind in RECURRENT_KINDS)

    @property
    def attention_layers(self) -> tuple[int, ...]:
        """The indices of the layers that keep a KV cache (parallel hybrids included)."""
        return tuple(i for i, kind in enumerate(self.kinds) if kind in ATTENDING_KINDS)

    @property
    def recurrent(self) -> bool:
        return bool(self.recurrent_layers)

    def state_bytes_per_request(self, conv_bytes: int, ssm_bytes: int | None = None) -> int | None:
        """The recurrent state one request holds over every recurrent layer; None when
        the family's state shape is not known here."""
        if self.state is None:
            return None
        return len(self.recurrent_layers) * self.state.bytes_per_layer(conv_bytes, ssm_bytes)

    def describe(self) -> str:
        """`6 linear-attention (gated delta net) layers with recurrent state, 2
        full-attention layers`: each kind counted, in the order it first appears,
        recurrent kinds first."""
        counts: dict[str, int] = {}
        for kind in sorted(self.kinds, key=lambda k: k not in RECURRENT_KINDS):
            counts[kind] = counts.get(kind, 0) + 1
        parts = []
        for kind, count in counts.items():
            layers = "layer" if count == 1 else "layers"
            state = " with recurrent state" if kind in RECURRENT_KINDS else ""
            if kind == PARALLEL_HYBRID:
                state = " (a KV cache and recurrent state each)"
            parts.append(f"{count} {kind_name(kind)} {layers}{state}")
        return ", ".join(parts)


def _get(config: Any, key: str) -> Any:
    if isinstance(config, Mapping):
        return config.get(key)
    return getattr(config, key, None)


def _int(config: Any, key: str, default: int = 0) -> int:
    value = _get(config, key)
    return int(value) if isinstance(value, int) and not isinstance(value, bool) else default


def _text_config(config: Any) -> Any:
    text = _get(config, "text_config")
    return config if text is None else text


def layer_kinds(config: Any) -> LayerKinds:
    """The layer kinds of a model's config (object or `config.json` dict); a multimodal
    config is read through its `text_config`."""
    config = _text_config(config)
    model_type = str(_get(config, "model_type") or "").lower()
    num_layers = _int(config, "num_hidden_layers")
    kinds = _kinds(config, model_type, num_layers)
    state = _state(config, model_type) if any(k in RECURRENT_KINDS for k in kinds) else None
    return LayerKinds(kinds=tuple(kinds), state=state)


def _kinds(config: Any, model_type: str, num_layers: int) -> list[str]:
    if model_type in ("mamba", "falcon_mamba"):
        return [MAMBA] * num_layers
    if model_type == "mamba2":
        return [MAMBA2] * num_layers
    if model_type == "falcon_h1":
        return [PARALLEL_HYBRID] * num_layers
    if model_type == "jamba":
        period = _int(config, "attn_layer_period", 8) or 8
        offset = _int(config, "attn_layer_offset", 4)
        return [ATTENTION if i % period == offset else MAMBA for i in range(num_layers)]
    if model_type == "bamba":
        attention = set(_get(config, "attn_layer_indices") or ())
        return [ATTENTION if i in attention else MAMBA2 for i in range(num_layers)]
    if model_type == "nemotron_h":
        pattern = str(_get(config, "hybrid_override_pattern") or "")
        by_symbol = {"M": MAMBA2, "*": ATTENTION}
        return [by_symbol.get(symbol, MLP_ONLY) for symbol in pattern[:num_layers]]
    layer_types = _get(config, "layer_types")
    if isinstance(layer_types, list | tuple) and len(layer_types) == num_layers:
        mamba = MAMBA2 if model_type.startswith(_MAMBA_IS_MAMBA2) else MAMBA
        out = []
        for name in layer_types:
            kind = _LAYER_TYPE_KINDS.get(str(name), ATTENTION)
            out.append(mamba if kind == MAMBA else kind)
        return out
    if model_type.startswith(_GDN_FAMILIES):
        interval = _int(config, "full_attention_interval", _DEFAULT_FULL_ATTENTION_INTERVAL)
        interval = interval or _DEFAULT_FULL_ATTENTION_INTERVAL
        return [ATTENTION if (i + 1) % interval == 0 else GDN for i in range(num_layers)]
    return [ATTENTION] * num_layers


def _state(config: Any, model_type: str) -> RecurrentState | None:
    """One recurrent layer's state in elements, by vLLM's shapes for the family."""
    if model_type.startswith(_GDN_FAMILIES):
        key_heads = _int(config, "linear_num_key_heads")
        value_heads = _int(config, "linear_num_value_heads")
        key_dim = _int(config, "linear_key_head_dim")
        value_dim = _int(config, "linear_value_head_dim")
        kernel = _int(config, "linear_conv_kernel_dim")
        if not all((key_heads, value_heads, key_dim, value_dim, kernel)):
            return None
        conv_dim = 2 * key_heads * key_dim + value_heads * value_dim
        return RecurrentState((kernel - 1) * conv_dim, value_heads * key_dim * value_dim)
    hidden = _int(config, "hidden_size")
    if model_type in ("mamba", "falcon_mamba", "jamba"):
        prefix = "mamba_" if model_type == "jamba" else ""
        expand = _int(config, prefix + "expand", 2)
        kernel = _int(config, "mamba_d_conv" if prefix else "conv_kernel", 4)
        d_state = _int(config, "mamba_d_state" if prefix else "state_size", 16)
        inner = _int(config, "intermediate_size") if model_type != "jamba" else 0
        inner = inner or expand * hidden
        return RecurrentState((kernel - 1) * inner, inner * d_state)
    if model_type == "falcon_h1":
        heads = _int(config, "mamba_n_heads")
        head_dim = _int(config, "mamba_d_head")
        groups = _int(config, "mamba_n_groups", 1)
        d_state = _int(config, "mamba_d_state")
        kernel = _int(config, "mamba_d_conv", 4)
        inner = _int(config, "mamba_d_ssm") or heads * head_dim
        if not all((heads, head_dim, d_state)):
            return None
        conv_dim = inner + 2 * groups * d_state
        return RecurrentState((kernel - 1) * conv_dim, heads * head_dim * d_state)
    return None  # Mamba2 families and short convolutions: shapes not read here yet
