"""The KV cache, every kind of it: the one package that knows what a layer keeps.

- `kinds`: what a layer's vLLM `KVCacheSpec` says of its kind (what it reaches back, what
  a request holds at most, its name in the log), asked of the spec's own attributes;
- `groups`: each layer's spec from the generator class's answer (`get_kv_cache_spec`, the
  layer names its own), and vLLM's KV groups mapped back onto layers (`LayerGroups`);
- `sizing`: the bytes a pool takes, from the specs' own methods;
- `cache`: the generator's cache allocated (`Allocator`, for the generation and the
  pooling runner alike), and what several groups cannot serve yet refused;
- `tables`: the persistent page tables by slot, one per group, each as wide as its spec
  needs, and what a step sends of them.

A new KV kind (recurrent state is next) is one new case in `kinds` and the modules that
size, allocate and address it here, plus its contract and its reference; nothing outside
this package asks a spec's class.
"""
