"""The built-in bundles under `bundles/`: TT-Metal's vLLM generators as declarative bundles.

Each folder holds one `vllm_metadata.json` whose generator comes from TT-Metal
(`main_class_source: environment`). The table below is the reference Tenstorrent vLLM
plugin's built-in map (vllm-tt-plugin `platform.py`, `register_tt_models`), including the
variants it selects with `TT_LLAMA_TEXT_VER` and `TT_QWEN3_TEXT_VER`, plus the Gemma 4 demo
and the autoport generators (TT-Metal `models/autoports`), whose variants ttbundles selects
with `TT_QWEN35_TEXT_VER` and `TT_GEMMA4_TEXT_VER`.

Every built-in records the TT-Metal source it was checked against (`x-tt-metal`: file,
commit, and the class's `model_capabilities` verbatim), and declares no capability that
dict lacks: TT-Metal's rule is that an absent key means "not supported".
"""

from __future__ import annotations

import json
import re
from collections import Counter
from itertools import combinations
from pathlib import Path

import pytest

from ttbundles.format.contract import TT_METAL_FLAGS
from ttbundles.format.metadata import (
    METADATA_FILE,
    BundleMetadata,
    Capabilities,
    Target,
    When,
    needs_version,
)
from ttbundles.format.selection import overlaps
from ttbundles.format.tt_options import TTOptions
from ttbundles.registry.registry import compute

BUNDLES = Path(__file__).parents[1] / "bundles"

TTT = "models.tt_transformers.tt.generator_vllm"
GALAXY = "models.demos.llama3_70b_galaxy.tt.generator_vllm"
AUTOPORTS = "models.autoports"

# name -> (TT arch, main_class, when.env)
BUILTINS: dict[str, tuple[str, str, dict[str, str]]] = {
    "tt-llama": ("TTLlamaForCausalLM", f"{TTT}:LlamaForCausalLM", {}),
    "tt-llama-galaxy": (
        "TTLlamaForCausalLM",
        f"{GALAXY}:LlamaForCausalLM",
        {"TT_LLAMA_TEXT_VER": "llama3_70b_galaxy"},
    ),
    "tt-llama2-70b": (
        "TTLlamaForCausalLM",
        "models.demos.t3000.llama2_70b.tt.generator_vllm:TtLlamaForCausalLM",
        {"TT_LLAMA_TEXT_VER": "llama2_70b"},
    ),
    "tt-qwen2": ("TTQwen2ForCausalLM", f"{TTT}:QwenForCausalLM", {}),
    "tt-qwen3": ("TTQwen3ForCausalLM", f"{TTT}:QwenForCausalLM", {}),
    "tt-qwen3-galaxy": (
        "TTQwen3ForCausalLM",
        f"{GALAXY}:QwenForCausalLM",
        {"TT_QWEN3_TEXT_VER": "qwen3_32b_galaxy"},
    ),
    "tt-qwen3.5": (
        "TTQwen3_5ForConditionalGeneration",
        "models.demos.blackhole.qwen36.tt.qwen36_vllm:Qwen36ForCausalLM",
        {},
    ),
    "tt-qwen2.5-vl": (
        "TTQwen2_5_VLForConditionalGeneration",
        "models.demos.qwen25_vl.tt.generator_vllm:Qwen2_5_VLForConditionalGeneration",
        {},
    ),
    "tt-qwen3-vl": (
        "TTQwen3VLForConditionalGeneration",
        "models.demos.qwen3_vl.tt.generator_vllm:Qwen3VLForConditionalGeneration",
        {},
    ),
    "tt-mistral": ("TTMistralForCausalLM", f"{TTT}:MistralForCausalLM", {}),
    "tt-mistral3": (
        "TTMistral3ForConditionalGeneration",
        f"{TTT}:Mistral3ForConditionalGeneration",
        {},
    ),
    "tt-gemma3": (
        "TTGemma3ForConditionalGeneration",
        f"{TTT}:Gemma3ForConditionalGeneration",
        {},
    ),
    "tt-deepseek-v3": (
        "TTDeepseekV3ForCausalLM",
        "models.demos.deepseek_v3.tt.generator_vllm:DeepseekV3ForCausalLM",
        {},
    ),
    "tt-gpt-oss": ("TTGptOssForCausalLM", f"{TTT}:GptOssForCausalLM", {}),
    # Generators the reference plugin's map lacks, or registers only through bundles.
    "tt-gemma4": (
        "TTGemma4ForConditionalGeneration",
        "models.demos.gemma4.tt.generator_vllm:Gemma4ForCausalLM",
        {},
    ),
    "tt-gemma4-text": (
        "TTGemma4ForCausalLM",
        "models.demos.gemma4.tt.generator_vllm:Gemma4ForCausalLM",
        {},
    ),
    "tt-gemma4-unified": (
        "TTGemma4UnifiedForConditionalGeneration",
        "models.demos.gemma4.tt.generator_vllm:Gemma4ForCausalLM",
        {},
    ),
    "tt-gemma-4-31b": (
        "TTGemma4ForConditionalGeneration",
        f"{AUTOPORTS}.google_gemma_4_31b.tt.generator_vllm:Gemma4ForCausalLM",
        {"TT_GEMMA4_TEXT_VER": "gemma4_31b_autoport"},
    ),
    "tt-gemma-4-26b-a4b": (
        "TTAutoportGemma4ForCausalLM",
        f"{AUTOPORTS}.google_gemma_4_26b_a4b_it.tt.generator_vllm:AutoportGemma4ForCausalLM",
        {},
    ),
    "tt-qwen3.6-27b": (
        "TTQwen3_5ForConditionalGeneration",
        f"{AUTOPORTS}.qwen_qwen3_6_27b.tt.generator_vllm:Qwen36ForCausalLM",
        {"TT_QWEN35_TEXT_VER": "qwen36_autoport"},
    ),
    "tt-qwen3.8-27b": (
        "TTQwen38ForCausalLM",
        f"{AUTOPORTS}.qwen_qwen3_8_27b.tt.generator_vllm:Qwen38ForCausalLM",
        {},
    ),
}
NEW_BUILTINS = (
    "tt-gemma4",
    "tt-gemma4-text",
    "tt-gemma4-unified",
    "tt-gemma-4-31b",
    "tt-gemma-4-26b-a4b",
    "tt-qwen3.6-27b",
    "tt-qwen3.8-27b",
)
# Bundles whose arch is already TT-prefixed, as in the TT-Metal bundle they mirror.
TT_PREFIXED_ARCH = {"tt-qwen3.8-27b"}

SOD_ALL = ["decode_only", "all"]
# TT-Metal's vision classes cap images at one per prompt (get_supported_mm_limits).
ONE_IMAGE = {"image": 1}
GENERATOR_STATE = {"owner": "generator"}
TEXT = {"prefix_caching": True, "async_decode": True, "sample_on_device": SOD_ALL}
# name -> capabilities that differ from the defaults (checked against x-tt-metal below).
CAPABILITIES: dict[str, dict] = {
    "tt-llama": {**TEXT, "chunked_prefill": True},
    "tt-llama-galaxy": {"execution": "single"},
    "tt-llama2-70b": {},
    "tt-qwen2": {**TEXT, "chunked_prefill": True},
    "tt-qwen3": {**TEXT, "chunked_prefill": True},
    "tt-qwen3-galaxy": {"execution": "single"},
    "tt-qwen3.5": {
        "sample_on_device": ["decode_only"],
        "modalities": ONE_IMAGE,
        "recurrent_state": GENERATOR_STATE,
    },
    "tt-qwen2.5-vl": {
        "async_decode": True,
        "sample_on_device": ["decode_only"],
        "modalities": ONE_IMAGE,
    },
    "tt-qwen3-vl": {"modalities": ONE_IMAGE},
    "tt-mistral": {**TEXT, "chunked_prefill": True},
    # Text only: its prefill reads the V0 `images` keyword no V1 worker sends (x-notes).
    "tt-mistral3": {"sample_on_device": ["decode_only"]},
    "tt-gemma3": {"async_decode": True, "sample_on_device": SOD_ALL, "modalities": ONE_IMAGE},
    "tt-deepseek-v3": {"sample_on_device": SOD_ALL},
    "tt-gpt-oss": {"async_decode": True, "sample_on_device": SOD_ALL, "execution": "single"},
    "tt-gemma4": {"sample_on_device": SOD_ALL, "chunked_prefill": True},
    "tt-gemma4-text": {"sample_on_device": SOD_ALL, "chunked_prefill": True},
    "tt-gemma4-unified": {"sample_on_device": SOD_ALL, "chunked_prefill": True},
    # TT-Metal's autoports answer get_kv_cache_spec with sliding-window specs and read
    # page_tables_per_layer: served on vLLM's hybrid manager (tt-gemma3's class returns
    # full attention for its sliding layers at the pinned commit: one group).
    "tt-gemma-4-31b": {"async_decode": True, "kv_cache_spec": True},
    "tt-gemma-4-26b-a4b": {
        "async_decode": True,
        "sample_on_device": ["all"],
        "kv_cache_spec": True,
    },
    "tt-qwen3.6-27b": {"sample_on_device": SOD_ALL, "recurrent_state": GENERATOR_STATE},
    "tt-qwen3.8-27b": {"async_decode": True, "sample_on_device": ["all"]},
}

TT_METAL = "x-tt-metal"
COMMIT = re.compile(r"^[0-9a-f]{40}$")


def excess_capabilities(caps: Capabilities, class_capabilities: dict) -> list[str]:
    """The capabilities `caps` declares that the TT-Metal class dict does not.

    TT-Metal's rule: a subclass dict replaces the inherited one, so an absent key means
    "not supported". Only the JSON literal `true` counts as supported; a value recorded as
    Python source (an environment-dependent expression) does not.
    TT-Metal's flags only: ttbundles' own keys (the owner of a recurrent state) are none
    of the class dicts x-tt-metal records.
    """
    return [
        name
        for key, name in TT_METAL_FLAGS.items()
        if getattr(caps, name) and class_capabilities.get(key) is not True
    ]


def lowered_capabilities(caps: Capabilities, class_capabilities: dict) -> list[str]:
    """The capabilities the class dict declares `true` that `caps` leaves off."""
    return [
        name
        for key, name in TT_METAL_FLAGS.items()
        if class_capabilities.get(key) is True and not getattr(caps, name)
    ]


def _builtin_dirs() -> list[Path]:
    """Every bundle folder except demo bundles."""
    return sorted(p for p in BUNDLES.iterdir() if p.is_dir() and not p.name.startswith("demo"))


def _load(folder: Path) -> BundleMetadata:
    data = json.loads((folder / METADATA_FILE).read_text(encoding="utf-8"))
    return BundleMetadata.model_validate(data)


@pytest.fixture(scope="module")
def builtins() -> dict[str, BundleMetadata]:
    return {folder.name: _load(folder) for folder in _builtin_dirs()}


@pytest.mark.parametrize("folder", _builtin_dirs(), ids=lambda p: p.name)
def test_parses(folder: Path) -> None:
    meta = _load(folder)
    assert meta.name == folder.name, "folder name must equal the bundle name"
    # Each built-in is written in the lowest version that expresses it.
    assert meta.schema_version == needs_version(meta)
    assert meta.version == "1.0.0"
    assert meta.main_class_source == "environment"
    assert meta.schema_uri is None, "$schema would point nowhere once installed"
    assert meta.description and "\n" not in meta.description
    assert "x-source" in meta.extensions
    # Declarative: the generator comes from TT-Metal, the bundle ships no Python.
    assert not list(folder.rglob("*.py"))


@pytest.mark.parametrize("folder", _builtin_dirs(), ids=lambda p: p.name)
def test_formatting(folder: Path) -> None:
    """2-space indent, trailing newline, keys in the order of the model's fields."""
    text = (folder / METADATA_FILE).read_text(encoding="utf-8")
    data = json.loads(text)
    assert text == json.dumps(data, indent=2, ensure_ascii=False) + "\n"

    def aliases(model) -> list[str]:
        return [f.alias or name for name, f in model.model_fields.items()]

    def check(obj: dict, model) -> None:
        order = aliases(model)
        known = [k for k in obj if not k.startswith("x-")]
        assert known == sorted(known, key=order.index), f"{model.__name__} keys out of order"

    check(data, BundleMetadata)
    check(data.get("capabilities", {}), Capabilities)
    check(data.get("when", {}), When)
    for target in data.get("targets", {}).values():
        check(target, Target)
        check(target.get("additional_config", {}), TTOptions)


def test_exact_set_of_builtins(builtins: dict[str, BundleMetadata]) -> None:
    assert sorted(builtins) == sorted(BUILTINS)


@pytest.mark.parametrize(
    ("name", "tt_arch", "main_class", "when_env"),
    [(name, *row) for name, row in BUILTINS.items()],
    ids=list(BUILTINS),
)
def test_arch_to_main_class(
    builtins: dict[str, BundleMetadata],
    name: str,
    tt_arch: str,
    main_class: str,
    when_env: dict[str, str],
) -> None:
    meta = builtins[name]
    if name not in TT_PREFIXED_ARCH:
        assert not meta.arch.startswith("TT"), "arch is the bare Hugging Face architecture"
    assert meta.tt_arch == tt_arch
    assert meta.main_class == main_class
    assert meta.when.env == when_env


@pytest.mark.parametrize("name", list(CAPABILITIES))
def test_capabilities(builtins: dict[str, BundleMetadata], name: str) -> None:
    caps = builtins[name].capabilities
    assert caps.model_dump(exclude_defaults=True) == CAPABILITIES[name]


def test_env_selected_families_have_a_default(builtins: dict[str, BundleMetadata]) -> None:
    """Each arch selected by an env variable also has exactly one bundle with no `when`."""
    selected = {m.arch for m in builtins.values() if m.when.env}
    assert selected == {
        "LlamaForCausalLM",
        "Qwen3ForCausalLM",
        "Qwen3_5ForConditionalGeneration",
        "Gemma4ForConditionalGeneration",
    }
    for arch in selected:
        defaults = [m.name for m in builtins.values() if m.arch == arch and not m.when.env]
        assert len(defaults) == 1, (arch, defaults)
    for name in ("tt-llama", "tt-qwen3", "tt-qwen3.5", "tt-gemma4"):
        assert not builtins[name].when.env


@pytest.mark.parametrize(
    ("environ", "expected"),
    [
        ({}, {"LlamaForCausalLM": "tt-llama", "Qwen3ForCausalLM": "tt-qwen3"}),
        ({"TT_LLAMA_TEXT_VER": "llama3_70b_galaxy"}, {"LlamaForCausalLM": "tt-llama-galaxy"}),
        ({"TT_LLAMA_TEXT_VER": "llama2_70b"}, {"LlamaForCausalLM": "tt-llama2-70b"}),
        ({"TT_QWEN3_TEXT_VER": "qwen3_32b_galaxy"}, {"Qwen3ForCausalLM": "tt-qwen3-galaxy"}),
        ({"TT_QWEN3_TEXT_VER": "tt_transformers"}, {"Qwen3ForCausalLM": "tt-qwen3"}),
        (
            {},
            {
                "Qwen3_5ForConditionalGeneration": "tt-qwen3.5",
                "Gemma4ForConditionalGeneration": "tt-gemma4",
            },
        ),
        (
            {"TT_QWEN35_TEXT_VER": "qwen36_autoport"},
            {"Qwen3_5ForConditionalGeneration": "tt-qwen3.6-27b"},
        ),
        (
            {"TT_QWEN35_TEXT_VER": "qwen36_blackhole"},
            {"Qwen3_5ForConditionalGeneration": "tt-qwen3.5"},
        ),
        (
            {"TT_GEMMA4_TEXT_VER": "gemma4_31b_autoport"},
            {"Gemma4ForConditionalGeneration": "tt-gemma-4-31b"},
        ),
    ],
)
def test_most_specific_match(
    builtins: dict[str, BundleMetadata], environ: dict[str, str], expected: dict[str, str]
) -> None:
    """Under `environ` (any mesh), the most specific matching bundle is the plugin's choice."""
    for arch, name in expected.items():
        matching = [m for m in builtins.values() if m.arch == arch and m.applies_to(None, environ)]
        best = max(len(m.when.env) for m in matching)
        chosen = [m.name for m in matching if len(m.when.env) == best]
        assert chosen == [name]


def test_no_ambiguous_selection(builtins: dict[str, BundleMetadata]) -> None:
    keys = Counter((m.arch, tuple(sorted(m.when.env.items()))) for m in builtins.values())
    assert [k for k, n in keys.items() if n > 1] == []


def test_names_unique() -> None:
    names = Counter(_load(folder).name for folder in _builtin_dirs())
    assert [n for n, c in names.items() if c > 1] == []


def test_galaxy_variants_target_galaxy(builtins: dict[str, BundleMetadata]) -> None:
    for name in ("tt-llama-galaxy", "tt-qwen3-galaxy"):
        meta = builtins[name]
        assert meta.capabilities.execution == "single"
        assert set(meta.targets) == {"TG"}


def test_no_user_specific_paths(builtins: dict[str, BundleMetadata]) -> None:
    """DeepSeek-V3's path variables are documented, never set to a machine's paths."""
    for meta in builtins.values():
        for target in meta.targets.values():
            assert "DEEPSEEK_V3_HF_MODEL" not in target.env
            assert "DEEPSEEK_V3_CACHE" not in target.env
    notes = " ".join(builtins["tt-deepseek-v3"].extensions["x-notes"])
    assert "DEEPSEEK_V3_HF_MODEL" in notes and "DEEPSEEK_V3_CACHE" in notes


def test_required_env_is_documented_not_set(builtins: dict[str, BundleMetadata]) -> None:
    """`x-required-env` names variables the user sets; the notes say what each is for."""
    for meta in builtins.values():
        required = meta.extensions.get("x-required-env", [])
        notes = " ".join([*meta.extensions.get("x-notes", []), meta.extensions.get("x-note", "")])
        for var in required:
            assert var in notes, (meta.name, var)
            assert all(var not in t.env for t in meta.targets.values()), (meta.name, var)


# Built-ins the worker refuses, and the refusal `validate` must give for them too.
REFUSED: dict[str, tuple[str, str, str]] = {}


@pytest.mark.parametrize("folder", _builtin_dirs(), ids=lambda p: p.name)
def test_validates(folder: Path) -> None:
    """Each built-in passes the full validator with no errors (warnings allowed), except
    those the worker refuses: `validate` never calls valid what the worker would refuse."""
    from ttbundles.check.validate import validate_bundle

    report = validate_bundle(folder)
    if folder.name in REFUSED:
        code, pointer, reason = REFUSED[folder.name]
        [error] = report.errors
        assert (error.code, error.pointer) == (code, pointer) and reason in error.message
        return
    assert not report.errors, report.errors
    assert report.ok()


def test_new_generators_have_bundles(builtins: dict[str, BundleMetadata]) -> None:
    """The Gemma 4 demo and the autoport generators ship as built-ins."""
    for name in NEW_BUILTINS:
        assert name in builtins, name
        assert (BUNDLES / name / METADATA_FILE).is_file()


@pytest.mark.parametrize("name", list(BUILTINS))
def test_records_tt_metal_source(builtins: dict[str, BundleMetadata], name: str) -> None:
    """Each built-in names the TT-Metal file and commit its capabilities were checked at."""
    source = builtins[name].extensions.get(TT_METAL)
    assert isinstance(source, dict), f"{name} has no {TT_METAL}"
    assert source["repo"] == "tenstorrent/tt-metal"
    module = builtins[name].main_class.split(":")[0]
    assert source["file"] == module.replace(".", "/") + ".py", "file is the main_class module"
    assert COMMIT.match(source["commit"]), f"{name}: commit is not 40 hex digits"
    assert isinstance(source["class_capabilities"], dict)
    contract = source.get("decode_input_update_contract")
    assert contract in (None, 1)


@pytest.mark.parametrize("name", list(BUILTINS))
def test_declares_no_more_than_the_class(builtins: dict[str, BundleMetadata], name: str) -> None:
    meta = builtins[name]
    class_capabilities = meta.extensions[TT_METAL]["class_capabilities"]
    assert excess_capabilities(meta.capabilities, class_capabilities) == []


@pytest.mark.parametrize("name", list(BUILTINS))
def test_lowered_capabilities_are_explained(builtins: dict[str, BundleMetadata], name: str) -> None:
    """A capability the class declares but the bundle leaves off is explained in x-note."""
    meta = builtins[name]
    lowered = lowered_capabilities(
        meta.capabilities, meta.extensions[TT_METAL]["class_capabilities"]
    )
    if lowered:
        note = meta.extensions.get("x-note", "")
        assert note, f"{name} leaves {lowered} off without an x-note"
        for capability in lowered:
            assert capability in note, (name, capability)


def test_capability_check_catches_excess() -> None:
    """The check above fails for a bundle that declares more than its class."""
    caps = Capabilities.model_validate(
        {"prefix_caching": True, "async_decode": True, "sample_on_device": ["decode_only"]}
    )
    assert excess_capabilities(caps, {"supports_prefix_caching": True}) == [
        "async_decode",
        "sample_on_device",
    ]
    # An environment-dependent value, recorded as its Python source, does not count.
    expression = {"supports_async_decode": 'os.environ.get("X", "1") == "1"'}
    assert excess_capabilities(caps, expression) == [
        "prefix_caching",
        "async_decode",
        "sample_on_device",
    ]
    assert excess_capabilities(Capabilities(), {}) == []
    assert lowered_capabilities(Capabilities(), {"supports_chunked_prefill": True}) == [
        "chunked_prefill"
    ]


def test_no_pair_overlaps(builtins: dict[str, BundleMetadata]) -> None:
    """No two built-ins could both be selected for one TT architecture (TTB071)."""
    pairs = [(a.name, b.name) for a, b in combinations(builtins.values(), 2) if overlaps(a, b)]
    assert pairs == []


SELECTORS = [
    {},
    {"TT_LLAMA_TEXT_VER": "llama3_70b_galaxy"},
    {"TT_LLAMA_TEXT_VER": "llama2_70b"},
    {"TT_QWEN3_TEXT_VER": "qwen3_32b_galaxy"},
    {"TT_QWEN35_TEXT_VER": "qwen36_autoport"},
    {"TT_GEMMA4_TEXT_VER": "gemma4_31b_autoport"},
]


@pytest.mark.parametrize("mesh", [None, "N150", "N300", "T3K", "TG", "P150x4", "HOST"])
@pytest.mark.parametrize("environ", SELECTORS, ids=lambda e: ",".join(e) or "default")
def test_registry_selects_without_ambiguity(mesh: str | None, environ: dict[str, str]) -> None:
    """The registry over the bundles folder reports no TTB071 on any mesh or selector."""
    registry = compute({"TT_VLLM_BUILTIN_MODELS": "0", **environ}, mesh=mesh, models_dirs=[BUNDLES])
    assert [d for d in registry.problems if d.code == "TTB071"] == []


def test_docs_conformance_table_lists_every_builtin(builtins: dict[str, BundleMetadata]) -> None:
    """docs/authors/tt-metal-families.md, "Built-ins: contract form and outcome": one row
    per built-in with its TT-Metal file and commit, its contract form (v1 exactly where the
    class declares it) and whether it is served or refused (refused exactly for REFUSED)."""
    page = (BUNDLES.parent / "docs" / "authors" / "tt-metal-families.md").read_text("utf-8")
    section = page.split("## Built-ins: contract form and outcome")[1].split("\n## ")[0]
    rows = {}
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 4 and cells[0].startswith("`tt-"):
            rows[cells[0].strip("`")] = cells[1:]
    assert sorted(rows) == sorted(builtins)
    for name, meta in builtins.items():
        source, form, outcome = rows[name]
        record = meta.extensions[TT_METAL]
        assert source == f"`{record['file']}` @{record['commit'][:8]}", name
        assert form.startswith("v1") == (record.get("decode_input_update_contract") == 1), name
        assert outcome.startswith("refused") == (name in REFUSED), name
        assert outcome.startswith(("served", "refused")), name


# --- what the built-ins say they were proven on -----------------------------------------

DEMO_BUNDLES = ("demo", "demo-drafter", "demo-vision")
TIERS = {"complete", "functional", "experimental"}


@pytest.mark.parametrize("name", DEMO_BUNDLES)
def test_the_demo_bundles_carry_fresh_evidence_from_the_host_mesh(name):
    """Recorded by our own `ttbundle test --keep-evidence` (scripts/record-evidence): a
    change to a demo bundle's files without recording again fails here."""
    from ttbundles.archive.evidence import read_evidence

    found, problems = read_evidence(BUNDLES / name)
    assert problems == [], f"run scripts/record-evidence: {[str(d) for d in problems]}"
    (evidence,) = found
    assert (evidence.mesh, evidence.passed, evidence.stale) == ("HOST", True, False)
    assert {"prefill", "decode"} <= set(evidence.record["paths"])
    assert evidence.record["versions"]["vllm"] and evidence.record["cases"]


def test_tt_metal_status_is_quoted_only_with_its_source():
    """`x-tt-metal-status`: what TT-Metal's catalog states (tier, meshes, the TT-Metal
    commit it was stated for), each with the source it is quoted from; the card shows it."""
    from ttbundles.check.support import TT_METAL_STATUS, support_card, to_markdown
    from ttbundles.format.meshes import MESH_NAMES

    quoted = []
    for folder in _builtin_dirs():
        document = json.loads((folder / METADATA_FILE).read_text(encoding="utf-8"))
        stated = document.get(TT_METAL_STATUS)
        if stated is None:
            continue
        quoted.append(folder.name)
        assert stated["source"].startswith("tenstorrent/") and "commit" in stated["source"]
        for row in stated["support"]:
            assert row["status"] in TIERS, folder.name
            assert row["meshes"] and set(row["meshes"]) <= set(MESH_NAMES), folder.name
            assert re.fullmatch(r"[0-9a-f]{7,40}", row["tt_metal_commit"]), folder.name
            assert all("/" in m for m in row["models"]), folder.name
        card = support_card(folder, _load(folder))
        assert card["tt_metal_status"] == stated
        assert "## What TT-Metal states" in to_markdown(card)
    assert "tt-mistral" in quoted and "tt-llama-galaxy" in quoted
