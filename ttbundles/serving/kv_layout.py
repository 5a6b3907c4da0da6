"""The KV cache layout: which kind of cache each layer keeps, as the generator class
declares it, and how vLLM's KV groups map back onto layers.

A generator class may answer `get_kv_cache_spec(vllm_config)` (TT-Metal's
`HybridAttentionForCausalLM`, the reference plugin's worker): `{"model.layers.<i>.self_attn":
KVCacheSpec or None}`, None meaning full attention with the model's shape. Sliding-window
layers then get a `SlidingWindowSpec`, and vLLM's hybrid KV-cache manager gives them only
the blocks their window needs. vLLM groups layers of one kind (a group: one block table),
and layers at the same index in their groups share one allocation (`tensor_idx`): a block
id is owned by one group at a time, so the groups overlay one pool
(`vllm/v1/core/kv_cache_planning.py`, `get_kv_cache_config_from_groups`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ttbundles.errors import ConfigurationError

if TYPE_CHECKING:
    from vllm.config import VllmConfig
    from vllm.v1.kv_cache_interface import KVCacheConfig, KVCacheSpec

LAYER_NAME = "model.layers.{}.self_attn"
_LAYER_INDEX = re.compile(r"^model\.layers\.(\d+)\.self_attn$")
SPEC_METHOD = "get_kv_cache_spec"


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
) -> dict[str, KVCacheSpec]:
    """Every layer's spec: the class's answer where it gives one, `default` (full
    attention with the model's shape) for None, for a class without the method, and
    without `ask` (the launch does not serve the class's groups: a sliding spec vLLM
    would keep even with its hybrid manager off, when every layer slides).

    A name that is not one of the model's layers is refused (TTB260): vLLM would keep a
    cache no layer reads, and the layer it meant would get none."""
    names = [LAYER_NAME.format(i) for i in range(num_layers)]
    declared: dict[str, Any] | None = None
    if ask and declares_layout(generator_cls):
        declared = getattr(generator_cls, SPEC_METHOD)(vllm_config)
    if declared is None:
        return dict.fromkeys(names, default)
    unknown = sorted(set(declared) - set(names))
    if unknown:
        raise ConfigurationError.single(
            "TTB260",
            f"{generator_cls.__qualname__}.{SPEC_METHOD} names {', '.join(unknown[:3])}, "
            f"not one of the model's {num_layers} layers (model.layers.<i>.self_attn)",
            hint=f"key the specs model.layers.<i>.self_attn for i in 0..{num_layers - 1}",
        )
    return {name: declared.get(name) or default for name in names}


@dataclass(frozen=True)
class LayerGroups:
    """vLLM's KV groups seen per layer: `group[i]` the block table layer i reads,
    `tensor[i]` the allocation it shares with the layers at its index in other groups,
    `specs[g]` group g's spec, `main` the group whose table goes as `page_table` (the
    first full-attention one: a generator that reads only `page_table` sees every
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

    @classmethod
    def from_config(cls, kv_cache_config: KVCacheConfig, num_layers: int) -> LayerGroups:
        from vllm.v1.kv_cache_interface import SlidingWindowSpec

        group = [0] * num_layers
        tensor = list(range(num_layers))
        specs = []
        for g, spec_group in enumerate(kv_cache_config.kv_cache_groups):
            specs.append(spec_group.kv_cache_spec)
            for position, name in enumerate(spec_group.layer_names):
                match = _LAYER_INDEX.match(name)
                if match is None or int(match.group(1)) >= num_layers:
                    continue
                index = int(match.group(1))
                group[index] = g
                tensor[index] = position
        if len(specs) == 1:
            tensor = list(range(num_layers))  # one group: every layer its own tensor
        main = next(
            (g for g, spec in enumerate(specs) if not isinstance(spec, SlidingWindowSpec)), 0
        )
        reach = tuple(
            spec.num_retained_tokens if isinstance(spec, SlidingWindowSpec) else 0 for spec in specs
        )
        return cls(tuple(group), tuple(tensor), tuple(specs), main, reach)

    def describe(self) -> str:
        """`2 KV groups x 2 layers: full attention (1), sliding window 32 (5)`: what the
        start-up log says."""
        from vllm.v1.kv_cache_interface import SlidingWindowSpec

        kinds: dict[str, int] = {}
        for spec in self.specs:
            sliding = isinstance(spec, SlidingWindowSpec)
            kind = f"sliding window {spec.sliding_window}" if sliding else "full attention"
            kinds[kind] = kinds.get(kind, 0) + 1
        which = ", ".join(f"{kind} ({count})" for kind, count in kinds.items())
        return f"{self.num_groups} KV group{'s' if self.num_groups > 1 else ''}: {which}"
