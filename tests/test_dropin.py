"""A drop-in for the reference Tenstorrent plugin's deployment surface: its plugin names
and VLLM_PLUGINS filters, TT_MODEL_CLASS_OVERRIDES, TT-Metal's legacy bundle folders and
its variant selectors, each as a deployment written for the reference plugin uses them."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from importlib.metadata import distribution
from pathlib import Path

import pytest

from ttbundles.errors import ConfigurationError
from ttbundles.paths import builtin_bundles_dir
from ttbundles.registry import overrides
from ttbundles.registry.registry import OVERRIDE_PATH, Source, Status, compute, selectors

PLUGIN = "ttbundles.serving.plugin"

# A generator module outside any bundle, as TT_MODEL_CLASS_OVERRIDES names them. The class
# declares two capabilities; the others are absent, which TT-Metal reads as unsupported.
GENERATOR_MODULE = '''
class Base:
    def prefill_forward(self, *args, **kwargs):
        raise RuntimeError("never run here")


class LaunchGenerator(Base):
    model_capabilities = {
        "supports_prefix_caching": True,
        "supports_sample_on_device": True,
        "supports_chunked_prefill": False,
    }


class Bridge:
    """A class with vLLM's model interface, as written to stand under a bare name."""

    def __init__(self, *, vllm_config=None, prefix=""):
        pass

    def embed_input_ids(self, input_ids):
        return input_ids

    def forward(self, input_ids, positions):
        return input_ids

    def compute_logits(self, hidden_states):
        return hidden_states
'''


@pytest.fixture
def launch_module(tmp_path, monkeypatch):
    """`launch_gen` on sys.path (and PYTHONPATH, for subprocesses); never imported."""
    folder = tmp_path / "pythonpath"
    folder.mkdir()
    (folder / "launch_gen.py").write_text(GENERATOR_MODULE)
    monkeypatch.syspath_prepend(str(folder))
    monkeypatch.setenv("PYTHONPATH", str(folder))
    return folder


def registry_env(**values: str) -> dict[str, str]:
    """An environment for `compute` that the caller's shell cannot leak into."""
    return {"TT_VLLM_BUILTIN_MODELS": "1", **values}


def registered(registry) -> dict[str, tuple[str, str]]:
    return {arch: (e.source.value, e.label) for arch, e in registry.registered.items()}


# --- plugin names and VLLM_PLUGINS -------------------------------------------------------


def test_entry_points_carry_the_reference_plugin_names():
    """Read from the distribution this interpreter imports ttbundles from (the first
    `ttbundles` on sys.path), not from every distribution visible."""
    dist = distribution("ttbundles")
    points = {(ep.group, ep.name): ep.value for ep in dist.entry_points}
    assert points[("vllm.platform_plugins", "tt")] == f"{PLUGIN}:platform_plugin"
    assert points[("vllm.general_plugins", "tt_model_registry")] == f"{PLUGIN}:register_models"
    assert points[("vllm.general_plugins", "ttbundles")] == f"{PLUGIN}:register_models"


def test_serve_environment_names_the_reference_plugins():
    from ttbundles.demo.server import serve_environment

    assert serve_environment({"VLLM_PLUGINS": "tt"})["VLLM_PLUGINS"] == "tt,tt_model_registry"
    assert "VLLM_PLUGINS" not in serve_environment({})  # unset: every plugin loads
    kept = serve_environment({"VLLM_PLUGINS": "ttbundles,tt"})["VLLM_PLUGINS"]
    assert kept == "ttbundles,tt,tt_model_registry"


@pytest.mark.parametrize(
    "plugins",
    ["tt_model_registry,tt", "tt,ttbundles", "tt,tt_model_registry,ttbundles", None],
    ids=["reference-names", "alias", "both", "unset"],
)
def test_any_filter_naming_either_registers_once(plugins, tmp_path, monkeypatch):
    import vllm  # noqa: F401 - required: a missing or broken vllm fails
    from vllm.model_executor.models.registry import ModelRegistry
    from vllm.plugins import PLATFORM_PLUGINS_GROUP, load_plugins_by_group

    from ttbundles.serving import registration

    models = tmp_path / "models"
    models.mkdir()
    _write_v1_bundle(models / "alpha", "AlphaForCausalLM")
    monkeypatch.setenv("EXTRA_MODELS_DIR", str(models))
    monkeypatch.setenv("TT_VLLM_BUILTIN_MODELS", "0")
    if plugins is None:
        monkeypatch.delenv("VLLM_PLUGINS", raising=False)
    else:
        monkeypatch.setenv("VLLM_PLUGINS", plugins)
    monkeypatch.setattr(registration, "_state", {})
    calls: list[str] = []
    monkeypatch.setattr(
        ModelRegistry, "register_model", lambda arch, target: calls.append(arch), raising=False
    )

    general = load_plugins_by_group("vllm.general_plugins")
    ours = [name for name in general if name in ("tt_model_registry", "ttbundles")]
    assert ours, f"no registration entry point loads with VLLM_PLUGINS={plugins}"
    for name in ours:  # what load_general_plugins does: call every loaded function
        general[name]()
    assert calls.count("TTAlphaForCausalLM") == 1
    assert "tt" in load_plugins_by_group(PLATFORM_PLUGINS_GROUP)


def _write_v1_bundle(folder: Path, arch: str, **fields) -> Path:
    folder.mkdir(parents=True)
    (folder / "vllm_metadata.json").write_text(
        json.dumps(
            {
                "schema_version": 1,
                "name": folder.name,
                "version": "1.0.0",
                "arch": arch,
                "main_class": "adapter:Generator",
                **fields,
            }
        )
    )
    (folder / "adapter.py").write_text("class Generator:\n    pass\n")
    return folder


# --- TT_MODEL_CLASS_OVERRIDES: parsing ---------------------------------------------------


def test_overrides_parse_as_the_reference_plugin_does():
    assert overrides.parse(None) == []
    assert overrides.parse("") == []
    parsed = overrides.parse(" ArchA=pkg.mod:ClassA , TTArchB=other.mod:ClassB,")
    assert [(o.arch, o.target) for o in parsed] == [
        ("ArchA", "pkg.mod:ClassA"),
        ("TTArchB", "other.mod:ClassB"),
    ]
    assert parsed[0].names == ("ArchA", "TTArchA")  # the name written and its TT form
    assert parsed[1].names == ("TTArchB",)


@pytest.mark.parametrize(
    ("value", "bad", "says"),
    [
        ("ArchOnlyNoTarget", "ArchOnlyNoTarget", "no '='"),
        ("Arch=missing.colon.Class", "Arch=missing.colon.Class", "not of the form module:Class"),
        ("=pkg.mod:Class", "=pkg.mod:Class", "architecture before '=' is empty"),
        ("Good=a.b:C,Arch=", "Arch=", "no class after '='"),
        ("Bad-Arch=a.b:C", "Bad-Arch=a.b:C", "not a Python identifier"),
        ("Arch=a.b:C:D", "Arch=a.b:C:D", "not of the form module:Class"),
    ],
)
def test_malformed_override_is_one_clear_error(value, bad, says):
    with pytest.raises(ConfigurationError) as excinfo:
        overrides.parse(value)
    (problem,) = excinfo.value.diagnostics
    assert problem.code == "TTB104"
    assert f"TT_MODEL_CLASS_OVERRIDES item {bad!r}" in problem.message
    assert says in problem.message
    assert "e.g." in problem.hint and "separated by ','" in problem.hint


def test_every_malformed_item_is_named_and_duplicates_are_refused():
    with pytest.raises(ConfigurationError) as excinfo:
        overrides.parse("A=a:B,nothing,C=c.d,LlamaForCausalLM=x:Y,TTLlamaForCausalLM=z:W")
    messages = [d.message for d in excinfo.value.diagnostics]
    assert len(messages) == 3
    assert "'nothing'" in messages[0] and "'C=c.d'" in messages[1]
    assert "both override TTLlamaForCausalLM" in messages[2]


def test_malformed_override_stops_registration_and_the_cli(run_cli):
    with pytest.raises(ConfigurationError) as excinfo:
        compute(registry_env(TT_MODEL_CLASS_OVERRIDES="LlamaForCausalLM"))
    assert excinfo.value.diagnostics[0].code == "TTB104"

    done = run_cli("list", env={"TT_MODEL_CLASS_OVERRIDES": "LlamaForCausalLM=broken"})
    assert done.returncode == 1
    assert "error TTB104 TT_MODEL_CLASS_OVERRIDES item 'LlamaForCausalLM=broken'" in done.stderr
    assert "fix:" in done.stderr and "Traceback" not in done.stderr


# --- TT_MODEL_CLASS_OVERRIDES: in the registry --------------------------------------------


def test_override_wins_over_extra_and_builtin_bundles(launch_module, tmp_path):
    models = tmp_path / "models"
    _write_v1_bundle(models / "my-llama", "LlamaForCausalLM")
    registry = compute(
        registry_env(
            EXTRA_MODELS_DIR=str(models),
            TT_MODEL_CLASS_OVERRIDES="LlamaForCausalLM=launch_gen:LaunchGenerator",
        )
    )
    winner = registry.registered["TTLlamaForCausalLM"]
    assert winner.source is Source.OVERRIDE
    assert winner.class_ref() == "launch_gen:LaunchGenerator"
    assert winner.path == launch_module / "launch_gen.py"
    losers = {e.label: e for e in registry.entries if e.tt_arch == "TTLlamaForCausalLM"}
    item = "(LlamaForCausalLM=launch_gen:LaunchGenerator)"
    assert losers["my-llama@1.0.0"].status is Status.SHADOWED
    assert (
        losers["my-llama@1.0.0"].reason == f"TTB103 overridden by TT_MODEL_CLASS_OVERRIDES {item}"
    )
    assert losers["tt-llama@1.0.0"].reason.startswith("TTB103 overridden")
    # Other architectures keep their bundles.
    assert registry.registered["TTQwen2ForCausalLM"].label == "tt-qwen2@1.0.0"
    assert "launch_gen" not in sys.modules  # read from source, never imported


def test_override_capabilities_come_from_the_class_source(launch_module):
    registry = compute(
        registry_env(TT_MODEL_CLASS_OVERRIDES="TTLlamaForCausalLM=launch_gen:LaunchGenerator")
    )
    caps = registry.registered["TTLlamaForCausalLM"].metadata.capabilities
    assert caps.prefix_caching is True
    assert caps.sample_on_device == ["decode_only", "all"]
    assert caps.chunked_prefill is False  # declared False
    assert caps.async_decode is False  # absent: not supported


def test_override_applies_whatever_the_rest_of_the_environment_says(launch_module):
    value = "GemmaLikeForCausalLM=launch_gen:LaunchGenerator"
    for extra in ({"TT_VLLM_BUILTIN_MODELS": "0"}, {"MESH_DEVICE": "TG"}):
        registry = compute({**registry_env(TT_MODEL_CLASS_OVERRIDES=value), **extra})
        assert registered(registry)["TTGemmaLikeForCausalLM"][0] == "override"


def test_override_of_a_module_not_found_here_still_registers():
    registry = compute(registry_env(TT_MODEL_CLASS_OVERRIDES="FooForCausalLM=nowhere.mod:Foo"))
    entry = registry.registered["TTFooForCausalLM"]
    assert entry.path == OVERRIDE_PATH
    assert entry.class_ref() == "nowhere.mod:Foo"
    assert "not found here" in entry.reason
    assert entry.metadata.capabilities.model_dump(exclude_defaults=True) == {}


def test_list_shows_the_override(launch_module, run_cli):
    value = "LlamaForCausalLM=launch_gen:LaunchGenerator"
    done = run_cli(
        "list",
        "--format",
        "json",
        env={"TT_MODEL_CLASS_OVERRIDES": value, "PYTHONPATH": str(launch_module)},
    )
    assert done.returncode == 0, done.stderr
    rows = [e for e in json.loads(done.stdout)["entries"] if e["tt_arch"] == "TTLlamaForCausalLM"]
    assert (rows[0]["source"], rows[0]["status"], rows[0]["main_class"]) == (
        "override",
        "registered",
        "launch_gen:LaunchGenerator",
    )
    assert rows[0]["capabilities"]["prefix_caching"] is True
    assert {r["status"] for r in rows[1:]} <= {"shadowed", "inactive"}


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        # A plain generator: vLLM keeps its own Llama for the bare name.
        ("LlamaForCausalLM=launch_gen:LaunchGenerator", {"TTLlamaForCausalLM": "launch"}),
        # ... and a bare name vLLM does not know gets the placeholder.
        (
            "NovelForCausalLM=launch_gen:LaunchGenerator",
            {"TTNovelForCausalLM": "launch", "NovelForCausalLM": "placeholder"},
        ),
        # A class with vLLM's model interface takes both names, as in the reference plugin.
        (
            "NovelForCausalLM=launch_gen:Bridge",
            {"TTNovelForCausalLM": "bridge", "NovelForCausalLM": "bridge"},
        ),
        # Written in the TT form: only that name.
        ("TTNovelForCausalLM=launch_gen:Bridge", {"TTNovelForCausalLM": "bridge"}),
    ],
)
def test_override_names_registered_in_vllm(launch_module, monkeypatch, value, expected):
    import vllm  # noqa: F401 - required: a missing or broken vllm fails
    from vllm.model_executor.models.registry import ModelRegistry

    from ttbundles.serving import registration

    monkeypatch.setattr(registration, "_state", {})
    monkeypatch.setenv("TT_VLLM_BUILTIN_MODELS", "0")
    monkeypatch.delenv("EXTRA_MODELS_DIR", raising=False)
    monkeypatch.setenv("TT_MODEL_CLASS_OVERRIDES", value)
    calls: dict[str, str] = {}
    monkeypatch.setattr(
        ModelRegistry, "register_model", lambda arch, target: calls.__setitem__(arch, target)
    )
    registration.register_all()
    names = {
        "launch_gen:LaunchGenerator": "launch",
        "launch_gen:Bridge": "bridge",
        registration.PLACEHOLDER: "placeholder",
    }
    assert {arch: names[target] for arch, target in calls.items()} == expected


# --- TT-Metal's legacy bundle folders ------------------------------------------------------

# As TT-Metal ships them: two keys, classes of the TT-Metal checkout (`models.autoports.*`).
QWEN36 = {
    "arch": "Qwen3_5ForConditionalGeneration",
    "main_class": "models.autoports.qwen_qwen3_6_27b.tt.generator_vllm:Qwen36ForCausalLM",
}
QWEN38 = {
    "arch": "TTQwen38ForCausalLM",
    "main_class": "models.autoports.qwen_qwen3_8_27b.tt.generator_vllm:Qwen38ForCausalLM",
}
QWEN36_SOURCE = """
from models.common.generator_base import AutoportGenerator


class Qwen36ForCausalLM(AutoportGenerator):
    model_capabilities = {
        "supports_prefix_caching": False,
        "supports_async_decode": os.environ.get("QWEN36_ASYNC") == "1",
        "supports_sample_on_device": True,
    }
"""
BASE_SOURCE = """
class AutoportGenerator:
    model_capabilities = {"supports_prefix_caching": True}

    def prefill_forward(self, *args, **kwargs):
        raise RuntimeError("never run here")
"""


@pytest.fixture
def tt_metal(tmp_path) -> Path:
    """A TT-Metal checkout's layout: the bundles under models/autoports/vllm_bundles, the
    generators they name elsewhere in the same tree."""
    root = tmp_path / "tt-metal"
    bundles = root / "models" / "autoports" / "vllm_bundles"
    for name, document in (("qwen36_autoport", QWEN36), ("qwen38_autoport", QWEN38)):
        (bundles / name).mkdir(parents=True)
        (bundles / name / "vllm_metadata.json").write_text(json.dumps(document, indent=2))
    generator = root / "models" / "autoports" / "qwen_qwen3_6_27b" / "tt" / "generator_vllm.py"
    generator.parent.mkdir(parents=True)
    generator.write_text("import os\n" + QWEN36_SOURCE)
    base = root / "models" / "common" / "generator_base.py"
    base.parent.mkdir(parents=True)
    base.write_text(BASE_SOURCE)
    return root


def test_tt_metal_legacy_bundles_register(tt_metal, run_cli):
    bundles = tt_metal / "models" / "autoports" / "vllm_bundles"
    registry = compute(registry_env(EXTRA_MODELS_DIR=str(bundles)))
    qwen36 = registry.registered["TTQwen3_5ForConditionalGeneration"]
    assert (qwen36.source, qwen36.metadata.name, qwen36.metadata.legacy) == (
        Source.EXTRA,
        "qwen36_autoport",
        True,
    )
    assert qwen36.metadata.main_class_source == "environment"
    assert qwen36.class_ref() == QWEN36["main_class"]  # as written: no bundle package
    # The class's own dict replaces the base's; the expression reads as unsupported.
    caps = qwen36.metadata.capabilities
    assert caps.sample_on_device == ["decode_only", "all"]
    assert (caps.prefix_caching, caps.async_decode) == (False, False)
    module = QWEN36["main_class"].partition(":")[0]
    assert qwen36.static.file == tt_metal.joinpath(*module.split(".")).with_suffix(".py")
    builtin = [e for e in registry.entries if e.label == "tt-qwen3.5@1.0.0"]
    assert builtin[0].reason.startswith("TTB102 shadowed by qwen36_autoport@0")
    # Arch already TT-prefixed, class not in this checkout: registered as written.
    qwen38 = registry.registered["TTQwen38ForCausalLM"]
    assert qwen38.class_ref() == QWEN38["main_class"]
    assert not [d for d in registry.problems if d.is_error]

    done = run_cli("list", "--format", "json", env={"EXTRA_MODELS_DIR": str(bundles)})
    rows = {e["bundle"]: e for e in json.loads(done.stdout)["entries"]}
    assert rows["qwen36_autoport"]["status"] == "registered"
    assert rows["qwen36_autoport"]["capabilities"]["sample_on_device"] == ["decode_only", "all"]
    assert rows["qwen38_autoport"]["status"] == "registered"


def test_tt_metal_legacy_bundle_registers_the_environment_class(tt_metal, monkeypatch):
    import vllm  # noqa: F401 - required: a missing or broken vllm fails
    from vllm.model_executor.models.registry import ModelRegistry

    from ttbundles.serving import registration

    monkeypatch.setattr(registration, "_state", {})
    monkeypatch.setenv("EXTRA_MODELS_DIR", str(tt_metal / "models/autoports/vllm_bundles"))
    monkeypatch.setenv("TT_VLLM_BUILTIN_MODELS", "0")
    monkeypatch.delenv("TT_MODEL_CLASS_OVERRIDES", raising=False)
    calls: dict[str, str] = {}
    monkeypatch.setattr(
        ModelRegistry, "register_model", lambda arch, target: calls.__setitem__(arch, target)
    )
    registration.register_all()
    assert calls["TTQwen3_5ForConditionalGeneration"] == QWEN36["main_class"]
    assert calls["TTQwen38ForCausalLM"] == QWEN38["main_class"]


def test_migrate_declares_what_the_class_declares(tt_metal, run_cli):
    folder = tt_metal / "models" / "autoports" / "vllm_bundles" / "qwen36_autoport"
    done = run_cli("migrate", folder)
    assert done.returncode == 0, done.stderr
    meta = json.loads((folder / "vllm_metadata.json").read_text())
    assert meta["main_class_source"] == "environment"
    assert meta["capabilities"] == {"sample_on_device": ["decode_only", "all"]}


# --- variant selectors ---------------------------------------------------------------------


def _builtin_selector_values() -> dict[str, set[str]]:
    """What the built-in bundles' metadata names, read here independently of the registry."""
    found: dict[str, set[str]] = {}
    for meta_file in builtin_bundles_dir().glob("*/vllm_metadata.json"):
        when = json.loads(meta_file.read_text()).get("when", {})
        for mapping in (when.get("env", {}), when.get("default_for", {})):
            for name, value in mapping.items():
                found.setdefault(name, set()).add(value)
    return found


def test_selector_values_are_computed_from_the_bundles():
    registry_values = selectors(compute(registry_env()).entries)
    assert {k: set(v) for k, v in registry_values.items()} == _builtin_selector_values()
    # The reference plugin's values for its selectors are among them.
    assert {"tt_transformers", "llama3_70b_galaxy", "llama2_70b"} <= set(
        registry_values["TT_LLAMA_TEXT_VER"]
    )
    assert {"tt_transformers", "qwen3_32b_galaxy"} <= set(registry_values["TT_QWEN3_TEXT_VER"])
    assert "qwen36_blackhole" in registry_values["TT_QWEN35_TEXT_VER"]


@pytest.mark.parametrize(
    "variable", ["TT_LLAMA_TEXT_VER", "TT_QWEN3_TEXT_VER", "TT_QWEN35_TEXT_VER"]
)
def test_unknown_selector_value_names_the_valid_ones(variable):
    valid = _builtin_selector_values()[variable]
    with pytest.raises(ConfigurationError) as excinfo:
        compute(registry_env(**{variable: "tt_transformers_v2"}))
    (problem,) = excinfo.value.diagnostics
    assert problem.code == "TTB105"
    assert problem.message.startswith(f"{variable}='tt_transformers_v2' names no variant")
    listed = problem.message.split("pick one of [")[1].rstrip("]").split(", ")
    assert set(listed) == valid
    for value in valid:  # each valid value computes
        compute(registry_env(**{variable: value}))


def test_default_variant_names_select_the_default():
    registry = compute(
        registry_env(TT_LLAMA_TEXT_VER="tt_transformers", TT_QWEN35_TEXT_VER="qwen36_blackhole")
    )
    assert registry.registered["TTLlamaForCausalLM"].label == "tt-llama@1.0.0"
    assert registry.registered["TTQwen3_5ForConditionalGeneration"].label == "tt-qwen3.5@1.0.0"


def test_selectors_are_not_checked_without_builtins_and_extras_add_values(tmp_path):
    assert compute({"TT_VLLM_BUILTIN_MODELS": "0", "TT_LLAMA_TEXT_VER": "anything"})
    models = tmp_path / "models"
    _write_v1_bundle(
        models / "my-llama", "LlamaForCausalLM", when={"env": {"TT_LLAMA_TEXT_VER": "mine"}}
    )
    registry = compute(registry_env(EXTRA_MODELS_DIR=str(models), TT_LLAMA_TEXT_VER="mine"))
    assert registry.registered["TTLlamaForCausalLM"].label == "my-llama@1.0.0"


# --- the whole surface through vLLM (the slow tier) -----------------------------------------


@pytest.mark.server  # builds a vLLM configuration in a subprocess
def test_plan_names_the_override(launch_module, demo_checkpoint):
    ttbundle = os.path.join(os.path.dirname(sys.executable), "ttbundle")
    env = {
        **os.environ,
        "TT_MODEL_CLASS_OVERRIDES": "LlamaForCausalLM=launch_gen:LaunchGenerator",
        "PYTHONPATH": str(launch_module),
    }
    done = subprocess.run(
        [ttbundle, "plan", "--model", str(demo_checkpoint), "--mesh", "HOST", "--format", "json"],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    plan = json.loads(done.stdout)
    assert plan["bundle"]["source"] == "override"
    assert plan["bundle"]["main_class"] == "launch_gen:LaunchGenerator"
    decisions = {d["setting"]: d for d in plan["decisions"]}
    assert "(override) provides it" in decisions["architecture"]["reason"]
    # Not declared by the class: async scheduling is off.
    assert decisions["async_scheduling"]["effective"] is False
