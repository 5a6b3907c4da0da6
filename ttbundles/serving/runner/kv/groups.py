"""The KV layer groups: which kind of cache each layer keeps, as the generator class
declares it, and how vLLM's KV groups map back onto layers.

A generator class may answer `get_kv_cache_spec(vllm_config)` (TT-Metal's
`HybridAttentionForCausalLM`, the reference plugin's worker): `{"model.layers.<i>.<module>":
KVCacheSpec or None}` (`self_attn` for attention; the module name is the class's), None
meaning full attention with the model's shape. Sliding-window layers then get a
`SlidingWindowSpec`, and vLLM's hybrid KV-cache manager gives them the blocks of their
window and of the tokens in flight. vLLM groups layers of one kind (a group: one block
table), and layers at the same index in their groups share one allocation (`tensor_idx`): a block
id is owned by one group at a time, so the groups overlay one pool
(`vllm/v1/core/kv_cache_planning.py`, `get_kv_cache_config_from_groups`).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ttbundles.errors import ConfigurationError

if TYPE_CHECKING:
    from vllm.config import VllmConfig
    from vllm.v1.kv_cache_interface import KVCacheConfig, KVCacheSpec

from ttbundles.serving.runner.kv import kinds

LAYER_NAME = "model.layers.{}.self_attn"
"""A layer's name where its class names none (no `get_kv_cache_spec`, or a None answer)."""
STATE_LAYER_NAME = "model.layers.{}.linear_attn"
"""A gated delta net layer's name, where vLLM's KV manager keeps its state (MambaSpec)."""
_LAYER_INDEX = re.compile(r"^model\.layers\.(\d+)\.[A-Za-z_]\w*$")
SPEC_METHOD = "get_kv_cache_spec"


def layer_index(name: str) -> int | None:
    """The layer index of a KV layer name (`model.layers.<i>.<module>`), None for another."""
    match = _LAYER_INDEX.match(name)
    return int(match.group(1)) if match else None


def declares_layout(generator_cls: type) -> bool:
    """The class answers `get_kv_cache_spec` (a layer may then keep less than the context)."""
    return callable(getattr(generator_cls, SPEC_METHOD, None))


def layer_specs(
    generator_cls: type,
    vllm_config: VllmConfig,
    num_layers: int,
    default: KVCacheSpec,
    *,
    ask: bool = True,
    kv_layers: Sequence[int] | None = None,
) -> dict[str, KVCacheSpec]:
    """Every layer's spec: the class's answer where it gives one, `default` (full
    attention with the model's shape) for None and for a class without the method.
    Without `ask` (the launch does not serve the class's groups: a sliding spec vLLM
    would keep even with its hybrid manager off, when every layer slides) every layer
    keeps the whole context: `default`, or where the class gives layers shapes of their
    own (Gemma 4's global layers' head size and KV heads), full attention in each
    layer's shape, so that the bytes vLLM counts are the layers' own.

    `kv_layers`: the layers that keep a KV cache at all, where others keep a state of
    their generator's own (recurrent layers): those get no spec, named or not. A name
    that is not one of the model's KV layers is refused (TTB260): vLLM would keep a cache
    no layer reads, and the layer it meant would get none."""
    layers = list(range(num_layers)) if kv_layers is None else list(kv_layers)
    declared: dict[str, Any] | None = None
    if declares_layout(generator_cls) and ask:
        declared = getattr(generator_cls, SPEC_METHOD)(vllm_config)
    elif declares_layout(generator_cls):
        try:
            declared = getattr(generator_cls, SPEC_METHOD)(vllm_config)
        except Exception:  # noqa: BLE001 - asked only for shapes, as before it was not asked
            # A class may answer only for the launches that serve its groups (TT-Metal's
            # need their block size); its layers then keep the model's shape, as before.
            declared = None
        if declared is not None:
            # Not served as groups: every layer keeps the whole context, in its own
            # shape where the class gives its layers different ones (else the default's).
            declared = {
                name: kinds.whole_context(spec) if spec is not None else None
                for name, spec in declared.items()
            }
            if not any(own_shape(spec, default) for spec in declared.values()):
                declared = None
    if declared is None:
        return {LAYER_NAME.format(i): default for i in layers}
    allowed = set(layers)
    named: dict[int, str] = {}
    unknown = []
    for name in declared:
        index = layer_index(name)
        if index is None or index not in allowed or index in named:
            unknown.append(name)
        else:
            named[index] = name
    unknown.sort()
    if unknown:
        raise ConfigurationError.single(
            "TTB260",
            f"{generator_cls.__qualname__}.{SPEC_METHOD} names {', '.join(unknown[:3])}, "
            f"not one of the model's {num_layers} layers (model.layers.<i>.self_attn)",
            hint=f"key the specs model.layers.<i>.self_attn for i in 0..{num_layers - 1}",
        )
    names = [named.get(i, LAYER_NAME.format(i)) for i in layers]
    return {name: declared.get(name) or default for name in names}


def own_shape(spec: Any, default: KVCacheSpec) -> bool:
    """The spec's KV heads or head size differ from the default's (the model's)."""
    if spec is None:
        return False
    return (getattr(spec, "num_kv_heads", None), getattr(spec, "head_size", None)) != (
        getattr(default, "num_kv_heads", None),
        getattr(default, "head_size", None),
    )


@dataclass(frozen=True)
class LayerGroups:
    """vLLM's KV groups seen per layer: `group[i]` the block table layer i reads,
    `tensor[i]` the allocation it shares with the layers at its index in other groups,
    `specs[g]` group g's spec, `main` the group whose table goes as `page_table` (the
    first one whose layers read everything: a generator that reads only `page_table` sees every
    position there), `reach[g]` how many tokens below a step's first position group g's
    attention still reads (a sliding window's `num_retained_tokens`; 0: everything)."""

    group: tuple[int, ...]
    tensor: tuple[int, ...]
    specs: tuple[Any, ...]
    main: int
    reach: tuple[int, ...] = ()

    @property
    def num_groups(self) -> int:
        return len(self.specs)

    def table_widths(self, vllm_config: VllmConfig, max_model_len: int) -> tuple[int, ...]:
        """Each group's block-table row width, as its spec sizes it
        (`max_num_blocks_per_req`: a column per block of the longest request for attention,
        whose rows are indexed by position)."""
        return tuple(spec.max_num_blocks_per_req(vllm_config, max_model_len) for spec in self.specs)

    @classmethod
    def from_config(
        cls,
        kv_cache_config: KVCacheConfig,
        num_layers: int,
        kv_layers: Sequence[int] | None = None,
    ) -> LayerGroups:
        """The groups seen per KV layer: `kv_layers` the model layers that keep a KV cache,
        in order (every layer without it); entry i of `group` and `tensor` is the i-th of
        them, as the generator allocates them."""
        layers = list(range(num_layers)) if kv_layers is None else list(kv_layers)
        ordinal = {index: i for i, index in enumerate(layers)}
        group = [0] * len(layers)
        tensor = list(range(len(layers)))
        specs = []
        for g, spec_group in enumerate(kv_cache_config.kv_cache_groups):
            specs.append(spec_group.kv_cache_spec)
            for position, name in enumerate(spec_group.layer_names):
                i = ordinal.get(layer_index(name))  # type: ignore[arg-type]
                if i is None:
                    continue
                group[i] = g
                tensor[i] = position
        if len(specs) == 1:
            tensor = list(range(len(layers)))  # one group: every layer its own tensor
        reach = tuple(kinds.reach(spec) for spec in specs)
        main = next(
            (g for g, r in enumerate(reach) if not r and not kinds.holds_state(specs[g])), 0
        )
        return cls(tuple(group), tuple(tensor), tuple(specs), main, reach)

    def describe(self) -> str:
        """`2 KV groups x 2 layers: full attention (1), sliding window 32 (5)`: what the
        start-up log says."""
        counts: dict[str, int] = {}
        for spec in self.specs:
            kind = kinds.describe(spec)
            counts[kind] = counts.get(kind, 0) + 1
        which = ", ".join(f"{kind} ({count})" for kind, count in counts.items())
        return f"{self.num_groups} KV group{'s' if self.num_groups > 1 else ''}: {which}"
