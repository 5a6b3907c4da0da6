"""Hybrid KV caches on vLLM's hybrid KV-cache manager, without a server: the generator
class's `get_kv_cache_spec` (`serving.runner.kv.groups`), vLLM's own grouping and block pool
(`get_kv_cache_groups`, `get_kv_cache_config_from_groups`, the scheduler's hybrid
manager), the runner's per-group page tables and the reference's per-layer allocation,
looped as the engine core loops them, against transformers' greedy tokens for a Gemma 3
checkpoint (10 local layers with a 32-token window, 2 global) and prompts several windows
long.
"""

from __future__ import annotations

import pytest
import torch  # required: a missing or broken torch fails, never skips
import vllm  # noqa: F401 - required: a missing or broken vllm fails
from vllm.v1.attention.backends.utils import resolve_kv_cache_layout
from vllm.v1.core.kv_cache_planning import get_global_kv_cache_groups, get_kv_cache_configs
from vllm.v1.kv_cache_interface import FullAttentionSpec, SlidingWindowSpec
from vllm.v1.structured_output import StructuredOutputManager

from tests.bundle_factory import contract_adapter, metadata, write_bundle
from tests.conftest import GEMMA3_LAYER_TYPES, GEMMA3_WINDOW
from tests.test_platform_config import configure
from tests.test_runner_steps import Recording, request, run
from tests.vllm_config import vllm_config
from ttbundles.errors import ConfigurationError, TTBundleError
from ttbundles.format.contract import HostMesh
from ttbundles.reference.generator import ReferenceLlamaGenerator
from ttbundles.serving.runner import TTModelRunner
from ttbundles.serving.runner.kv.groups import LayerGroups, layer_specs
from ttbundles.serving.scheduler import TTScheduler

BLOCK = 16
LAYERS = len(GEMMA3_LAYER_TYPES)
SLIDING = {i for i, kind in enumerate(GEMMA3_LAYER_TYPES) if kind == "sliding_attention"}
MAX_MODEL_LEN = 256


def build(
    checkpoint,
    *,
    hybrid: bool = True,
    prefix_caching: bool = False,
    async_decode: bool = False,
    blocks_per_tensor: int = 96,
    generator: type = Recording,
):
    """The scheduler and runner as the engine core builds them for this model: the
    generator's specs, vLLM's groups and KV cache config (`blocks_per_tensor` blocks per
    shared tensor), the hybrid manager on or off (`--disable-hybrid-kv-cache-manager`)."""
    config = vllm_config(
        checkpoint,
        max_num_seqs=4,
        max_num_batched_tokens=48,  # prompts arrive in chunks of at most 48 tokens
        max_model_len=MAX_MODEL_LEN,
        block_size=BLOCK,
        prefix_caching=prefix_caching,
        async_scheduling=async_decode,
    )
    config.scheduler_config.disable_hybrid_kv_cache_manager = not hybrid
    default = FullAttentionSpec(
        block_size=BLOCK, num_kv_heads=2, head_size=16, dtype=config.model_config.dtype
    )
    specs = layer_specs(generator, config, LAYERS, default)
    # The engine core's order (`EngineCore._initialize_kv_caches`).
    resolve_kv_cache_layout(config, [["LBHNC"]], specs.values())
    groups = get_global_kv_cache_groups(config, [specs])
    tensors = 2 if hybrid else LAYERS
    memory = blocks_per_tensor * tensors * default.page_size_bytes
    kv_config = get_kv_cache_configs(config, [specs], [memory], groups)[0]
    config.cache_config.num_gpu_blocks = kv_config.num_blocks  # as the engine core sets it
    scheduler = TTScheduler(
        vllm_config=config,
        kv_cache_config=kv_config,
        structured_output_manager=StructuredOutputManager(config),
        block_size=BLOCK,
    )
    runner = TTModelRunner(config, generator, HostMesh())
    runner.load_model()
    runner.generator.decodes = []
    runner.generator.prefills = []
    runner.generator.prefill_slots = []
    runner.use_kv_groups(LayerGroups.from_config(kv_config, LAYERS))
    runner.allocate_kv_cache(kv_config.num_blocks, 2, 16, LAYERS, torch.float32)
    return scheduler, runner, kv_config


@pytest.fixture(scope="module")
def gemma_greedy(gemma3_checkpoint):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(gemma3_checkpoint, dtype=torch.float32).eval()

    def continuation(prompt: list[int], count: int) -> list[int]:
        out = model.generate(
            torch.tensor([prompt]), max_new_tokens=count, min_new_tokens=count, do_sample=False
        )
        return out[0, len(prompt) :].tolist()

    return continuation


def prompt(seed: int, length: int) -> list[int]:
    generator = torch.Generator().manual_seed(seed)
    return torch.randint(10, 200, (length,), generator=generator).tolist()


def test_the_reference_declares_sliding_layers_and_vllm_makes_hybrid_groups(gemma3_checkpoint):
    _, runner, kv_config = build(gemma3_checkpoint)
    groups = runner.kv_groups
    assert groups is not None and groups.num_groups == 6  # 1 full + 5 sliding, 2 layers each
    for layer in range(LAYERS):
        spec = groups.specs[groups.group[layer]]
        if layer in SLIDING:
            assert isinstance(spec, SlidingWindowSpec) and spec.sliding_window == GEMMA3_WINDOW
        else:
            assert type(spec) is FullAttentionSpec
    assert not isinstance(groups.specs[groups.main], SlidingWindowSpec)
    # Layers at one index in their groups share one allocation: 2 tensors, not 12.
    assert sorted(set(groups.tensor)) == [0, 1]
    cache = runner.kv_cache
    assert len({id(layer[0]) for layer in cache}) == 2
    assert cache[0][0].shape[0] == kv_config.num_blocks
    described = groups.describe()
    assert described.startswith("6 KV groups: ")
    assert "full attention (1)" in described and "sliding window 32 (5)" in described


def test_without_the_hybrid_manager_every_layer_keeps_the_context(gemma3_checkpoint):
    """--disable-hybrid-kv-cache-manager: vLLM unifies the specs into one full-attention
    group, every layer its own tensor (the reference still masks the window)."""
    _, runner, _ = build(gemma3_checkpoint, hybrid=False)
    assert runner.kv_groups.num_groups == 1
    assert len({id(layer[0]) for layer in runner.kv_cache}) == LAYERS


@pytest.mark.parametrize("async_decode", [False, True])
def test_hybrid_groups_give_transformers_tokens_past_the_window(
    gemma3_checkpoint, gemma_greedy, async_decode
):
    """Prompts of three to four windows, in chunks, then decode past them; a second
    request arrives mid-way. Every prefill and decode carries each layer's group table."""
    scheduler, runner, _ = build(gemma3_checkpoint, async_decode=async_decode)
    a, b = prompt(1, 3 * GEMMA3_WINDOW + 5), prompt(2, 4 * GEMMA3_WINDOW - 3)
    out = run(
        scheduler,
        runner,
        {
            0: [request("a", a, 24, temperature=0.0)],
            4: [request("b", b, 20, temperature=0.0)],
        },
    )
    assert out["a"] == gemma_greedy(a, 24)
    assert out["b"] == gemma_greedy(b, 20)


def test_a_shared_prefix_longer_than_the_window_hits_and_gives_the_same_tokens(
    gemma3_checkpoint, gemma_greedy
):
    scheduler, runner, _ = build(gemma3_checkpoint, prefix_caching=True)
    shared = prompt(3, 3 * GEMMA3_WINDOW)
    first, second = shared + prompt(4, 9), shared + prompt(5, 11)
    out = run(
        scheduler,
        runner,
        {
            0: [request("first", first, 12, temperature=0.0, cached=True)],
            30: [request("second", second, 12, temperature=0.0, cached=True)],
        },
    )
    assert out["first"] == gemma_greedy(first, 12)
    assert out["second"] == gemma_greedy(second, 12)
    stats = scheduler.kv_cache_manager.prefix_cache_stats
    assert stats is None or stats.hits > 0
    # The second request's first prefill started past the shared prefix's cached blocks.
    starts = [p["start"][0] for p in runner.generator.prefills if len(p["start"]) == 1]
    assert any(start >= 2 * GEMMA3_WINDOW for start in starts)


class Tables(ReferenceLlamaGenerator):
    """The reference, keeping each step's per-layer tables with its positions."""

    seen: list[tuple[list[int], list[torch.Tensor]]]

    def decode_forward(self, *args, **kwargs):
        if kwargs.get("page_tables_per_layer") is not None:
            self.seen.append(
                (
                    kwargs["start_pos"].tolist(),
                    [t.clone() for t in kwargs["page_tables_per_layer"]],
                )
            )
        return super().decode_forward(*args, **kwargs)


def test_positions_past_the_window_keep_their_real_blocks_in_the_sliding_tables(
    gemma3_checkpoint,
):
    """The padding bug TT-Metal describes: a sliding group's table cut to the window's
    blocks puts absolute positions past it onto block 0 (vLLM's null block). Here column
    `p // block_size` of every layer's table holds the block position p was written to,
    a real one (not 0) for every position inside the window, in the layer's own group;
    blocks older than the window are the null block in the sliding tables only."""
    Tables.seen = []
    scheduler, runner, _ = build(gemma3_checkpoint, generator=Tables)
    long = prompt(6, 4 * GEMMA3_WINDOW)
    run(scheduler, runner, {0: [request("a", long, 6, temperature=0.0)]})
    groups = runner.kv_groups
    assert Tables.seen
    positions, tables = Tables.seen[-1]
    position = max(positions)
    assert position > 3 * GEMMA3_WINDOW
    row = positions.index(position)
    for layer, table in enumerate(tables):
        assert table is tables[groups.group.index(groups.group[layer])] or torch.equal(
            table, tables[groups.group.index(groups.group[layer])]
        )
        window_blocks = range((position - GEMMA3_WINDOW + 1) // BLOCK, position // BLOCK + 1)
        for column in window_blocks:
            assert int(table[row, column]) != 0, (layer, column)
        if layer in SLIDING:
            assert int(table[row, 0]) == 0  # freed: the window left it behind
        else:
            assert int(table[row, 0]) != 0
    # Each group's table is its own: a sliding group's blocks are not the full group's.
    full, sliding = groups.main, groups.group[min(SLIDING)]
    by_group = {groups.group[i]: t for i, t in enumerate(tables)}
    assert not torch.equal(by_group[full], by_group[sliding])


def test_features_that_read_one_table_are_refused_with_hybrid_groups(gemma3_checkpoint):
    """Lanes split one block pool by lane: several groups are refused (TTB262) before
    anything is served."""
    _, runner, kv_config = build(gemma3_checkpoint)
    runner.lanes = 2
    with pytest.raises(TTBundleError) as info:
        runner.use_kv_groups(LayerGroups.from_config(kv_config, LAYERS))
    assert info.value.diagnostics[0].code == "TTB262"
    assert "--disable-hybrid-kv-cache-manager" in (info.value.diagnostics[0].hint or "")


# --- at configuration: the plan, vLLM's hybrid manager ---------------------------------

GEMMA_CLASS = """\
class Generator:
    model_capabilities = {"supports_sliding_window": True}

    @classmethod
    def get_kv_cache_spec(cls, vllm_config):
        return None

    def allocate_kv_cache_per_layer(self, per_layer_specs):
        return None
"""


def gemma_bundle(models_dir, name: str, *, declared: bool, chunked: bool = False):
    """An environment bundle for Gemma 3 whose class answers get_kv_cache_spec; its
    metadata declares the KV groups (schema 5) or not, and chunked prefill or not."""
    folder = models_dir.parent / "lib" / "tt_gemma"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "__init__.py").touch()
    (folder / f"{name}.py").write_text(GEMMA_CLASS)
    extra: dict = {"capabilities": {"kv_cache_spec": True}, "schema_version": 5} if declared else {}
    if chunked:
        extra.setdefault("capabilities", {})["chunked_prefill"] = True
    document = metadata(
        name,
        arch="Gemma3ForCausalLM",
        main_class=f"tt_gemma.{name}:Generator",
        main_class_source="environment",
        **extra,
    )
    return write_bundle(models_dir / name, document=document)


def test_a_bundle_declaring_kv_groups_turns_the_hybrid_manager_on(models_dir, gemma3_checkpoint):
    from vllm.platforms import current_platform

    gemma_bundle(models_dir, "groups", declared=True)
    config, decisions, plan = configure(gemma3_checkpoint, max_model_len=256)
    assert plan["kv_groups"] is True and current_platform.support_hybrid_kv_cache()
    assert config.scheduler_config.disable_hybrid_kv_cache_manager is False
    decision = decisions["kv_cache"]
    assert decision["effective"] == "hybrid groups"
    assert "10 sliding-window layers (window 32), 2 full-attention" in decision["reason"]
    assert f"blocks of {config.cache_config.block_size} tokens" in decision["reason"]


def _sliding_holds(config) -> int:
    """What vLLM admits a sliding layer of the fixture for, at the budget served."""
    spec = SlidingWindowSpec(
        block_size=BLOCK,
        num_kv_heads=2,
        head_size=16,
        dtype=config.model_config.dtype,
        sliding_window=GEMMA3_WINDOW,
    )
    return spec.max_admission_blocks_per_request(config.max_in_flight_tokens, MAX_MODEL_LEN)


def test_the_plan_says_what_a_sliding_layer_holds_with_the_tokens_in_flight(
    models_dir, gemma3_checkpoint, monkeypatch
):
    """vLLM sizes a sliding group for its window plus every token in flight: asked for a
    budget as large as the context, the groups hold more than one group (17 blocks a
    sliding layer against 16), and the plan says so with the flag that pays (TTB264),
    not "only their window's blocks"."""
    from ttbundles.serving.planning import command_line

    monkeypatch.setattr(command_line, "COMMAND_LINE", {"max_num_batched_tokens": 256})
    gemma_bundle(models_dir, "groups", declared=True, chunked=True)
    config, decisions, plan = configure(
        gemma3_checkpoint,
        max_model_len=MAX_MODEL_LEN,
        block_size=BLOCK,
        max_num_batched_tokens=256,
        max_num_seqs=4,
    )
    reason = decisions["kv_cache"]["reason"]
    assert "only their window" not in reason
    held = _sliding_holds(config)
    assert held == 17 and config.scheduler_config.max_num_batched_tokens == 256
    assert f"holds 16 blocks per full-attention layer, {held} per sliding layer" in reason
    # 2 full and 10 sliding layers: 2*16 + 10*17 blocks a request against 12*16.
    assert f"({12 * 16 / (2 * 16 + 10 * 17):.2f}x the requests)" in reason
    [warning] = [w for w in plan["warnings"] if w["code"] == "TTB264"]
    # A sliding layer holds at most half a full one's 16 blocks up to 80 tokens a step.
    assert "--max-num-batched-tokens 80" in warning["hint"]


def test_on_the_host_mesh_the_plan_chooses_a_budget_at_which_the_groups_pay(
    models_dir, gemma3_checkpoint, monkeypatch
):
    """Left to vLLM's budget, the host mesh (whose reference prefills in chunks) serves the
    groups at the largest budget where a sliding layer holds at most half a full layer's
    blocks, and says so in a decision line."""
    from ttbundles.serving.planning import command_line

    monkeypatch.setattr(command_line, "COMMAND_LINE", {})
    gemma_bundle(models_dir, "groups", declared=True, chunked=True)
    config, decisions, plan = configure(
        gemma3_checkpoint, max_model_len=MAX_MODEL_LEN, block_size=BLOCK, max_num_seqs=4
    )
    budget = config.scheduler_config.max_num_batched_tokens
    decision = decisions["max_num_batched_tokens"]
    assert decision["effective"] == budget and decision["requested"] > budget
    assert "hybrid KV groups on HOST" in decision["reason"]
    held = _sliding_holds(config)
    assert 2 * held <= MAX_MODEL_LEN // BLOCK
    # One block more a step and a sliding layer would hold more than half.
    config.scheduler_config.max_num_batched_tokens = budget + BLOCK
    assert 2 * _sliding_holds(config) > MAX_MODEL_LEN // BLOCK
    assert f"{held} per sliding layer" in decisions["kv_cache"]["reason"]
    assert not [w for w in plan["warnings"] if w["code"] == "TTB264"]


def test_without_chunked_prefill_the_groups_that_cost_capacity_are_a_warning(
    models_dir, gemma3_checkpoint, monkeypatch
):
    """A bundle that prefills prompts whole keeps a budget of the longest prompt: no budget
    pays, and the warning names the flag that does."""
    from ttbundles.serving.planning import command_line

    monkeypatch.setattr(command_line, "COMMAND_LINE", {})
    gemma_bundle(models_dir, "groups", declared=True)
    config, decisions, plan = configure(
        gemma3_checkpoint, max_model_len=MAX_MODEL_LEN, block_size=BLOCK, max_num_seqs=4
    )
    assert config.scheduler_config.max_num_batched_tokens >= MAX_MODEL_LEN
    [warning] = [w for w in plan["warnings"] if w["code"] == "TTB264"]
    assert "--disable-hybrid-kv-cache-manager" in warning["hint"]


def test_disable_hybrid_kv_cache_manager_still_works(models_dir, gemma3_checkpoint):
    gemma_bundle(models_dir, "groups", declared=True)
    config, decisions, plan = configure(
        gemma3_checkpoint, max_model_len=256, disable_hybrid_kv_cache_manager=True
    )
    assert plan["kv_groups"] is False
    assert config.scheduler_config.disable_hybrid_kv_cache_manager is True
    assert decisions["kv_cache"]["effective"] == "one group"
    assert "--disable-hybrid-kv-cache-manager" in decisions["kv_cache"]["reason"]


def test_an_undeclared_layout_keeps_one_group(models_dir, gemma3_checkpoint):
    from vllm.platforms import current_platform

    gemma_bundle(models_dir, "plain", declared=False)
    config, decisions, plan = configure(gemma3_checkpoint, max_model_len=256)
    assert plan["kv_groups"] is False and not current_platform.support_hybrid_kv_cache()
    assert config.scheduler_config.disable_hybrid_kv_cache_manager is True
    assert "does not declare capabilities.kv_cache_spec" in decisions["kv_cache"]["reason"]


def test_enabling_the_hybrid_manager_with_lanes_is_refused(models_dir, gemma3_checkpoint):
    """Asked for explicitly with a feature the groups do not serve yet: TTB262 at
    configuration; left to vLLM, the plan keeps one group and says why."""
    gemma_bundle(models_dir, "groups", declared=True)
    plan = {"lanes": 2, "speculative": None, "pooling": None, "recurrent_owner": ""}
    decided = type("P", (), {"decide": lambda self, *a: a[2], **plan})()
    from tests.vllm_config import vllm_config as build_config
    from ttbundles.serving.planning.kv_admission import plan_kv_groups

    config = build_config(
        gemma3_checkpoint,
        max_num_seqs=4,
        max_num_batched_tokens=64,
        max_model_len=256,
        block_size=16,
    )
    config.scheduler_config.disable_hybrid_kv_cache_manager = False
    with pytest.raises(ConfigurationError) as info:
        plan_kv_groups(config, decided, True)
    assert info.value.diagnostics[0].code == "TTB262"
    config.scheduler_config.disable_hybrid_kv_cache_manager = None
    plan_kv_groups(config, decided, True)
    assert decided.kv_groups is False


# --- validate and init --------------------------------------------------------------


def test_validate_checks_the_declaration_against_the_class(tmp_path, run_cli):
    """Declared without the methods: TTB054 (read from source, and imported); the
    methods without the declaration: a TTB263 warning."""
    declared = write_bundle(
        tmp_path / "declared",
        document=metadata("declared", capabilities={"kv_cache_spec": True}, schema_version=5),
    )
    result = run_cli("validate", str(declared))
    assert result.returncode == 1 and "TTB054" in result.stdout + result.stderr
    assert "get_kv_cache_spec" in result.stdout + result.stderr
    imported = run_cli("validate", "--import", str(declared))
    assert imported.returncode == 1 and "TTB054" in imported.stdout + imported.stderr

    spec = "    @classmethod\n    def get_kv_cache_spec(cls, vllm_config):\n        return None\n"
    undeclared = write_bundle(
        tmp_path / "undeclared",
        document=metadata("undeclared"),
        files={"adapter.py": contract_adapter(attributes=spec)},
    )
    warned = run_cli("validate", str(undeclared))
    assert "TTB263" in warned.stdout + warned.stderr


def test_a_schema_4_document_cannot_declare_kv_groups(tmp_path, run_cli):
    folder = write_bundle(
        tmp_path / "old",
        document=metadata("old", capabilities={"kv_cache_spec": True}, schema_version=4),
    )
    result = run_cli("validate", str(folder))
    assert result.returncode == 1
    assert "TTB020" in result.stdout + result.stderr and "schema_version 5" in (
        result.stdout + result.stderr
    )


def test_init_reference_declares_the_groups_of_a_windowed_checkpoint(
    tmp_path, run_cli, gemma3_checkpoint, demo_checkpoint
):
    import json

    folder = tmp_path / "gemma"
    made = run_cli("init", str(folder), "--reference", "--from-hf", str(gemma3_checkpoint))
    assert made.returncode == 0, made.stdout + made.stderr
    document = json.loads((folder / "vllm_metadata.json").read_text())
    assert document["schema_version"] == 5
    assert document["capabilities"]["kv_cache_spec"] is True
    source = (folder / "adapter.py").read_text()
    assert "def get_kv_cache_spec" in source and "def allocate_kv_cache_per_layer" in source
    strict = run_cli("validate", "--strict", str(folder))
    assert strict.returncode == 0, strict.stdout + strict.stderr

    plain = tmp_path / "llama"
    assert (
        run_cli("init", str(plain), "--reference", "--from-hf", str(demo_checkpoint)).returncode
        == 0
    )
    document = json.loads((plain / "vllm_metadata.json").read_text())
    assert document["schema_version"] == 5 and "kv_cache_spec" not in document["capabilities"]
    # Every reference bundle pools: its prefill returns hidden states (prefill_hidden).
    assert document["capabilities"]["pooling"]["form"] == "prefill_hidden"
    assert "def get_kv_cache_spec" not in (plain / "adapter.py").read_text()


# --- the budget ------------------------------------------------------------------------


def test_the_generators_capacity_becomes_blocks_per_group(gemma3_checkpoint):
    """`get_max_tokens_all_users` tokens become the full group's blocks plus what each
    sliding group holds per user at most, and bytes as vLLM divides them back (a page of
    each of the two shared tensors)."""
    from ttbundles.serving.runner.kv.sizing import pool_bytes

    _, runner, _ = build(gemma3_checkpoint)
    config = runner.vllm_config
    default = FullAttentionSpec(block_size=BLOCK, num_kv_heads=2, head_size=16, dtype=torch.float32)
    specs = layer_specs(ReferenceLlamaGenerator, config, LAYERS, default)
    tokens, users = 4 * MAX_MODEL_LEN, 4
    window_spec = next(s for s in specs.values() if isinstance(s, SlidingWindowSpec))
    held = window_spec.max_admission_blocks_per_request(config.max_in_flight_tokens, MAX_MODEL_LEN)
    blocks = tokens // BLOCK + 1 + 5 * held * users
    page = default.page_size_bytes
    assert pool_bytes(config, specs, tokens, users) == blocks * page * 2
    # Without the hybrid manager: one group of every layer, each the whole context.
    config.scheduler_config.disable_hybrid_kv_cache_manager = True
    assert pool_bytes(config, specs, tokens, users) == (tokens // BLOCK + 1) * page * LAYERS


def test_the_start_up_line_gives_bytes_per_request_blocks_and_both_capacities(
    gemma3_checkpoint, caplog
):
    """The KV line says the pool's bytes, what one request of max_model_len holds in each
    kind of group (a sliding one: its window plus the 48 tokens in flight, vLLM's bound)
    and the requests the bytes hold with the groups and without (every layer the whole
    context): 96 blocks over 16 + 5 x 6 a request, against 16 blocks of all 12 layers."""
    import logging

    from vllm.v1.core.kv_cache_utils import get_max_concurrency_for_kv_cache_config

    from ttbundles.serving.runner.kv.sizing import capacity

    _, runner, kv_config = build(gemma3_checkpoint)
    config = runner.vllm_config
    held = capacity(config, kv_config, LAYERS)
    page = FullAttentionSpec(
        block_size=BLOCK, num_kv_heads=2, head_size=16, dtype=config.model_config.dtype
    ).page_size_bytes
    assert held.bytes == 96 * 2 * page
    sliding = -(-(GEMMA3_WINDOW - 1 + 48) // BLOCK) + 1
    assert dict(held.per_request) == {
        "full attention": MAX_MODEL_LEN // BLOCK,
        f"sliding window {GEMMA3_WINDOW}": sliding,
    }
    assert held.with_groups == get_max_concurrency_for_kv_cache_config(config, kv_config)
    assert held.with_groups == pytest.approx(96 / (16 + 5 * sliding))
    assert held.without_groups == pytest.approx(96 * 2 / LAYERS / 16)
    with caplog.at_level(logging.INFO, logger="vllm.ttbundles"):
        runner.initialize_kv_cache(kv_config)
    [line] = [r.getMessage() for r in caplog.records if "KV cache of" in r.getMessage()]
    assert f"({96 * 2 * page / 1024:,.0f} KiB)" in line
    assert (
        f"a {MAX_MODEL_LEN}-token request holds 16 blocks of a full attention group, "
        f"{sliding} of a sliding window {GEMMA3_WINDOW} group: {held.with_groups:.2f}x "
        f"concurrency ({held.without_groups:.2f}x without KV groups)"
    ) in line


def test_a_class_is_asked_for_its_specs_only_where_its_groups_are_served(window_checkpoint):
    """Mistral's every layer slides: vLLM keeps a sliding group even with its hybrid
    manager off (nothing to unify), so a launch that does not serve the class's groups
    (undeclared, or --disable-hybrid-kv-cache-manager) does not ask it: full attention."""
    config = vllm_config(
        window_checkpoint,
        max_num_seqs=2,
        max_num_batched_tokens=64,
        max_model_len=64,
        block_size=BLOCK,
    )
    hf = config.model_config.hf_config
    default = FullAttentionSpec(
        block_size=BLOCK,
        num_kv_heads=hf.num_key_value_heads,
        head_size=hf.hidden_size // hf.num_attention_heads,
        dtype=torch.float32,
    )
    layers = hf.num_hidden_layers
    asked = layer_specs(ReferenceLlamaGenerator, config, layers, default)
    assert all(isinstance(s, SlidingWindowSpec) for s in asked.values())
    unasked = layer_specs(ReferenceLlamaGenerator, config, layers, default, ask=False)
    assert all(s is default for s in unasked.values())


def _small_config(checkpoint):
    """A small configuration of the tiny Gemma 3, and its full-attention default spec."""
    config = vllm_config(
        checkpoint, max_num_seqs=2, max_num_batched_tokens=64, max_model_len=64, block_size=BLOCK
    )
    default = FullAttentionSpec(block_size=BLOCK, num_kv_heads=2, head_size=16, dtype=torch.float32)
    return config, default


def test_a_spec_for_a_layer_the_model_lacks_is_refused(gemma3_checkpoint):
    class Stray(ReferenceLlamaGenerator):
        @classmethod
        def get_kv_cache_spec(cls, vllm_config):
            return {"model.layers.12.self_attn": None, "layers.0": None}

    config, default = _small_config(gemma3_checkpoint)
    with pytest.raises(ConfigurationError) as info:
        layer_specs(Stray, config, LAYERS, default)
    diagnostic = info.value.diagnostics[0]
    assert diagnostic.code == "TTB260" and "model.layers.12.self_attn" in diagnostic.message


def test_kv_pressure_gives_the_same_tokens(gemma3_checkpoint, gemma_greedy):
    """A pool too small for three long requests at once (48 blocks; one request may
    hold 46 at its worst): vLLM's hybrid manager admits them as the pool allows (its
    admission counts each sliding group's blocks per request), so they never all decode
    together, and every request's tokens are transformers'. Whether it preempts or
    holds a request back is vLLM's choice; what the pool held is checked below."""
    scheduler, runner, kv_config = build(gemma3_checkpoint, blocks_per_tensor=48)
    prompts = {name: prompt(10 + i, 3 * GEMMA3_WINDOW + 9) for i, name in enumerate("abc")}
    out = run(
        scheduler,
        runner,
        {0: [request(name, ids, 40, temperature=0.0) for name, ids in prompts.items()]},
    )
    for name, ids in prompts.items():
        assert out[name] == gemma_greedy(ids, 40), name
    live = [d["live"] for d in runner.generator.decodes]
    assert max(live) < len(prompts), (kv_config.num_blocks, live)


def test_prompt_logits_in_chunks_through_shared_tensors_are_transformers(gemma3_checkpoint):
    """Prompt logits (every position) in two chunks through a hybrid cache as vLLM lays
    it out: layer i in group i % 6 (5 sliding, 1 full), the layers at one index in their
    groups sharing a tensor, each group its own blocks. The second chunk reads what the
    first wrote, in every group; a layer reading another group's blocks, or groups
    clobbering each other's tensor, would leave transformers' logits."""
    import transformers

    from tests.test_sliding_window import hf_logits, load

    model = transformers.AutoModelForCausalLM.from_pretrained(gemma3_checkpoint).float().eval()
    gen = load(gemma3_checkpoint)
    ids = prompt(20, 3 * GEMMA3_WINDOW + 7)
    shape = (64, 2, BLOCK, 16)
    cache = gen.allocate_kv_cache_per_layer([(shape, torch.float32, i // 6) for i in range(LAYERS)])
    assert len({id(layer[0]) for layer in cache}) == 2
    width = -(-len(ids) // BLOCK)
    tables = [torch.tensor([[1 + g * width + j for j in range(width)]]) for g in range(6)]
    per_layer = [tables[i % 6] for i in range(LAYERS)]
    chunks = []
    for start, end in ((0, 60), (60, len(ids))):
        out = gen.prefill_forward(
            tokens=torch.tensor([ids]),
            page_table=tables[5],
            kv_cache=cache,
            prompt_lens=torch.tensor([end]),
            start_pos=torch.tensor([start]),
            enable_trace=False,
            return_prompt_logits=True,
            page_tables_per_layer=per_layer,
        )
        chunks.append(out[0, : end - start])
    torch.testing.assert_close(torch.cat(chunks), hf_logits(model, ids), atol=1e-4, rtol=0)


def test_the_layer_names_are_the_classs_own(gemma3_checkpoint):
    """A class may name a layer's cache by its own module (a recurrent layer is not
    `self_attn`): the name it gives is the name vLLM groups; layers it does not name keep
    the default name; a layer named twice is refused (TTB260)."""
    window = SlidingWindowSpec(
        block_size=BLOCK, num_kv_heads=2, head_size=16, dtype=torch.float32, sliding_window=16
    )

    class Named(ReferenceLlamaGenerator):
        @classmethod
        def get_kv_cache_spec(cls, vllm_config):
            return {"model.layers.1.linear_attn": window}

    class Twice(ReferenceLlamaGenerator):
        @classmethod
        def get_kv_cache_spec(cls, vllm_config):
            return {"model.layers.1.linear_attn": window, "model.layers.1.self_attn": None}

    config, default = _small_config(gemma3_checkpoint)
    specs = layer_specs(Named, config, LAYERS, default)
    assert list(specs)[:2] == ["model.layers.0.self_attn", "model.layers.1.linear_attn"]
    assert specs["model.layers.1.linear_attn"] is window and len(specs) == LAYERS
    with pytest.raises(ConfigurationError) as info:
        layer_specs(Twice, config, LAYERS, default)
    assert info.value.diagnostics[0].code == "TTB260"
