"""The bundle format: `vllm_metadata.json` v1, its parser and its JSON Schema."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import pytest

from ttbundles.errors import Severity
from ttbundles.format.metadata import BundleMetadata, tt_arch_name
from ttbundles.format.parse import load_metadata, parse_metadata
from ttbundles.format.schema import generate_schema, render_schema
from ttbundles.format.tt_options import TTOptions

SCHEMA_FILE = Path(__file__).parents[1] / "schemas" / "vllm_metadata.schema.json"
FILE = Path("vllm_metadata.json")

MINIMAL = {
    "schema_version": 1,
    "name": "demo",
    "version": "1.0.0",
    "arch": "DemoForCausalLM",
    "main_class": "adapter:DemoGenerator",
}

FULL = {
    "$schema": "https://ttbundles.dev/schemas/vllm_metadata/v1.schema.json",
    "schema_version": 1,
    "name": "my-llama.v2_x",
    "version": "2.1.0rc1",
    "description": "Llama on Wormhole",
    "license": "Apache-2.0 OR MIT",
    "arch": "LlamaForCausalLM",
    "main_class": "pkg.adapter:LlamaGenerator",
    "main_class_source": "bundle",
    "models": [
        {"repo": "meta-llama/Llama-3.1-8B-Instruct", "revision": "0e9e39f"},
        {"repo": "meta-llama/Llama-3.1-70B-Instruct", "revision": "v1.0"},
    ],
    "capabilities": {
        "prefix_caching": True,
        "async_decode": True,
        "sample_on_device": ["decode_only", "all"],
        "chunked_prefill": True,
        "execution": "single",
        "multimodal": True,
    },
    "targets": {
        "N150": {"max_model_len": 8192, "max_num_seqs": 32},
        "TG": {
            "max_model_len": 131072,
            "env": {"TT_CACHE_PATH": "/tmp/cache", "_X1": ""},
            "additional_config": {
                "sample_on_device_mode": "all",
                "always_compat_sampling": False,
                "trace_mode": "decode_only",
                "enable_model_warmup": True,
                "trace_region_size": 0,
                "worker_l1_size": 1344544,
                "l1_small_size": 0,
                "dispatch_core_axis": "col",
                "fabric_config": "FABRIC_1D_RING",
                "fabric_reliability_mode": "RELAXED_SYSTEM_HEALTH_SETUP_MODE",
                "optimizations": "performance",
                "decode_interleave_enabled": True,
                "decode_interleave_prefill_steps": 2,
                "decode_interleave_decode_steps": 1,
            },
        },
    },
    "when": {"env": {"TT_LLAMA_TEXT_VER": "custom"}},
    "requires": {
        "python": ">=3.10",
        "vllm": ">=0.33,<0.34",
        "ttnn": "~=0.60",
        "packages": ["safetensors>=0.4", "numpy; python_version >= '3.10'"],
    },
}


def parse(document, *, bundle_dir=None):
    text = document if isinstance(document, str) else json.dumps(document, indent=2)
    return parse_metadata(text, file=FILE, bundle_dir=bundle_dir)


def only(document, **kwargs):
    """The single diagnostic of an invalid document (and no metadata built)."""
    loaded = parse(document, **kwargs)
    assert len(loaded.diagnostics) == 1, [str(d) for d in loaded.diagnostics]
    assert loaded.metadata is None
    return loaded.diagnostics[0]


def with_(**changes):
    return {**MINIMAL, **changes}


# --- valid documents ---------------------------------------------------------------------


def test_minimal_document_gets_defaults():
    loaded = parse(MINIMAL)
    assert loaded.diagnostics == []
    meta = loaded.metadata
    assert meta.main_class_source == "bundle"
    assert meta.models == [] and meta.targets == {} and meta.when.env == {}
    caps = meta.capabilities
    assert (caps.prefix_caching, caps.async_decode, caps.sample_on_device) == (False, False, [])
    assert (caps.chunked_prefill, caps.execution, caps.multimodal) == (False, "submesh", False)
    assert meta.module == "adapter" and meta.class_name == "DemoGenerator"
    assert meta.legacy is False


def test_full_document():
    loaded = parse(FULL)
    assert loaded.diagnostics == []
    meta = loaded.metadata
    assert meta.schema_uri == FULL["$schema"]
    assert meta.tt_arch == "TTLlamaForCausalLM"
    assert meta.module == "pkg.adapter" and meta.class_name == "LlamaGenerator"
    assert [m.revision for m in meta.models] == ["0e9e39f", "v1.0"]
    assert meta.capabilities.sample_on_device == ["decode_only", "all"]
    assert list(meta.targets) == ["N150", "TG"]
    tg = meta.targets["TG"]
    assert tg.env == {"TT_CACHE_PATH": "/tmp/cache", "_X1": ""}
    assert tg.additional_config == TTOptions(**FULL["targets"]["TG"]["additional_config"])
    assert meta.target("TG") is tg and meta.target(None) is None
    assert meta.requires.packages == FULL["requires"]["packages"]
    # Round trip: what the model dumps is the document it read.
    assert meta.model_dump(by_alias=True, exclude_defaults=True) == {
        k: v for k, v in FULL.items() if k != "main_class_source"
    }


def test_applies_to_mesh_and_environment():
    meta = parse(FULL).metadata
    assert meta.applies_to("TG", {"TT_LLAMA_TEXT_VER": "custom"})
    assert meta.applies_to(None, {"TT_LLAMA_TEXT_VER": "custom"})
    assert not meta.applies_to("T3K", {"TT_LLAMA_TEXT_VER": "custom"})
    assert not meta.applies_to("TG", {})
    assert parse(MINIMAL).metadata.applies_to("P150", {})  # no targets: any mesh


def test_extensions_top_level_and_nested():
    document = with_(
        **{
            "x-top": {"any": ["thing"]},
            "capabilities": {"x-cap": 1},
            "models": [{"repo": "a/b", "revision": "r", "x-model": True}],
            "targets": {"N300": {"x-target": "t"}},
            "when": {"x-when": None},
            "requires": {"x-req": 2.5},
        }
    )
    loaded = parse(document)
    assert loaded.diagnostics == []
    meta = loaded.metadata
    assert meta.extensions == {"x-top": {"any": ["thing"]}}
    assert meta.capabilities.extensions == {"x-cap": 1}
    assert meta.models[0].extensions == {"x-model": True}
    assert meta.targets["N300"].extensions == {"x-target": "t"}
    assert meta.when.extensions == {"x-when": None}
    assert meta.requires.extensions == {"x-req": 2.5}


@pytest.mark.parametrize(
    "changes",
    [
        # Only the document's own: nothing inside is looked through.
        {"x-top": 1, "description": "plain"},
        # The text says "x- more often than the document has x- keys: every object is.
        {"x-top": 1, "capabilities": {"x-cap": 2}},
        {"x-top": 1, "description": 'an "x-ray" model', "when": {"x-when": 3}},
    ],
)
def test_extensions_are_set_aside_wherever_the_text_has_them(changes):
    """Validation looks only at the document's own keys when the raw text shows no other
    `"x-` (registration validates every bundle in every process): a nested extension is
    still found and kept, and nothing is refused as an unknown key."""
    loaded = parse(with_(**changes))
    assert loaded.diagnostics == []
    meta = loaded.metadata
    assert meta.extensions == {"x-top": 1}
    assert meta.capabilities.extensions == ({"x-cap": 2} if "capabilities" in changes else {})
    assert meta.when.extensions == ({"x-when": 3} if "when" in changes else {})


def test_device_options_take_no_extensions():
    """additional_config mirrors --additional-config.tt, where x- keys mean nothing."""
    d = only(with_(targets={"N150": {"additional_config": {"x-opt": 1}}}))
    assert (d.code, d.pointer) == ("TTB038", "/targets/N150/additional_config/x-opt")
    assert "trace_mode" in d.hint
    assert "extensions start with 'x-'" not in d.hint


def test_a_bundle_cannot_open_the_servers_image_urls():
    """tt.allow_private_media_urls is the operator's (the command line), never a target
    default: a bundle must not open the server's network to its clients."""
    d = only(with_(targets={"N150": {"additional_config": {"allow_private_media_urls": True}}}))
    assert (d.code, d.pointer) == (
        "TTB038",
        "/targets/N150/additional_config/allow_private_media_urls",
    )


@pytest.mark.parametrize(
    ("arch", "tt_arch"),
    [
        ("LlamaForCausalLM", "TTLlamaForCausalLM"),
        ("TTLlamaForCausalLM", "TTLlamaForCausalLM"),
        ("TTMyModel", "TTMyModel"),
        ("Ttfoo", "TTTtfoo"),
    ],
)
def test_tt_arch(arch, tt_arch):
    assert tt_arch_name(arch) == tt_arch
    assert parse(with_(arch=arch)).metadata.tt_arch == tt_arch


# --- one field at a time -----------------------------------------------------------------


@pytest.mark.parametrize(
    ("changes", "code", "pointer"),
    [
        # required fields
        ({"name": ...}, "TTB031", ""),
        ({"version": ...}, "TTB031", ""),
        ({"arch": ...}, "TTB031", ""),
        ({"main_class": ...}, "TTB031", ""),
        ({"models": [{"revision": "abc"}]}, "TTB031", "/models/0"),
        # name
        ({"name": "Demo"}, "TTB033", "/name"),
        ({"name": "-demo"}, "TTB033", "/name"),
        ({"name": "de mo"}, "TTB033", "/name"),
        ({"name": "a" * 65}, "TTB033", "/name"),
        ({"name": ""}, "TTB033", "/name"),
        # version, PEP 440
        ({"version": "1.0.0-beta.x"}, "TTB034", "/version"),
        ({"version": "latest"}, "TTB034", "/version"),
        # license, SPDX
        ({"license": "Apache 2"}, "TTB033", "/license"),
        # arch
        ({"arch": "1Llama"}, "TTB033", "/arch"),
        ({"arch": "Llama-For"}, "TTB033", "/arch"),
        # main_class
        ({"main_class": "adapter.Generator"}, "TTB036", "/main_class"),
        ({"main_class": "adapter:"}, "TTB036", "/main_class"),
        ({"main_class": ":Generator"}, "TTB036", "/main_class"),
        ({"main_class": "my-adapter:Generator"}, "TTB036", "/main_class"),
        ({"main_class": "adapter:Gen.erator"}, "TTB036", "/main_class"),
        ({"main_class_source": "pip"}, "TTB033", "/main_class_source"),
        # models
        ({"models": [{"repo": "no-slash"}]}, "TTB033", "/models/0/repo"),
        ({"models": [{"repo": "a/b", "revision": ""}]}, "TTB033", "/models/0/revision"),
        ({"models": {"repo": "a/b"}}, "TTB032", "/models"),
        # capabilities
        (
            {"capabilities": {"sample_on_device": ["all", "all"]}},
            "TTB033",
            "/capabilities/sample_on_device",
        ),
        (
            {"capabilities": {"sample_on_device": ["prefill"]}},
            "TTB033",
            "/capabilities/sample_on_device/0",
        ),
        ({"capabilities": {"sample_on_device": "all"}}, "TTB032", "/capabilities/sample_on_device"),
        ({"capabilities": {"execution": "multi"}}, "TTB033", "/capabilities/execution"),
        ({"capabilities": []}, "TTB032", "/capabilities"),
        # targets
        ({"targets": {"N150": {"max_model_len": 0}}}, "TTB033", "/targets/N150/max_model_len"),
        ({"targets": {"N150": {"max_num_seqs": -1}}}, "TTB033", "/targets/N150/max_num_seqs"),
        ({"targets": {"N150": {"env": {"1BAD": "x"}}}}, "TTB033", "/targets/N150/env/1BAD"),
        ({"targets": {"N150": {"env": {"A": 1}}}}, "TTB032", "/targets/N150/env/A"),
        ({"targets": ["N150"]}, "TTB032", "/targets"),
        # device options
        (
            {"targets": {"N150": {"additional_config": {"trace_mode": "prefill"}}}},
            "TTB038",
            "/targets/N150/additional_config/trace_mode",
        ),
        (
            {"targets": {"N150": {"additional_config": {"fabric_config": "FABRIC_3D"}}}},
            "TTB038",
            "/targets/N150/additional_config/fabric_config",
        ),
        (
            {"targets": {"N150": {"additional_config": {"trace_region_size": -1}}}},
            "TTB038",
            "/targets/N150/additional_config/trace_region_size",
        ),
        (
            {"targets": {"N150": {"additional_config": {"decode_interleave_decode_steps": 0}}}},
            "TTB038",
            "/targets/N150/additional_config/decode_interleave_decode_steps",
        ),
        (
            {"targets": {"N150": {"additional_config": {"sample_on_device_mode": "yes"}}}},
            "TTB038",
            "/targets/N150/additional_config/sample_on_device_mode",
        ),
        # when, requires
        ({"when": {"env": {"A-B": "1"}}}, "TTB033", "/when/env/A-B"),
        ({"when": {"env": {"A": True}}}, "TTB032", "/when/env/A"),
        ({"requires": {"vllm": ">=0.33,<"}}, "TTB034", "/requires/vllm"),
        ({"requires": {"python": "3.10"}}, "TTB034", "/requires/python"),
        ({"requires": {"ttnn": "==banana"}}, "TTB034", "/requires/ttnn"),
        ({"requires": {"packages": ["ok>=1", "foo>="]}}, "TTB034", "/requires/packages"),
        ({"requires": {"packages": "foo"}}, "TTB032", "/requires/packages"),
    ],
)
def test_field_constraint(changes, code, pointer):
    document = {k: v for k, v in with_(**changes).items() if v is not ...}
    d = only(document)
    assert (d.code, d.severity, d.pointer) == (code, Severity.ERROR, pointer)
    assert d.file == str(FILE)
    assert d.line is not None and d.column is not None


@pytest.mark.parametrize(
    ("changes", "pointer", "hint"),
    [
        ({"name": "Demo"}, "/name", "lowercase letters"),
        ({"version": "latest"}, "/version", "'1.0.0'"),
        ({"main_class": "adapter.Generator"}, "/main_class", "'adapter:Generator'"),
        ({"requires": {"vllm": "0.33"}}, "/requires/vllm", "'>=0.33,<0.34'"),
        ({"requires": {"packages": ["foo>="]}}, "/requires/packages", "'safetensors>=0.4'"),
        (
            {"capabilities": {"execution": "multi"}},
            "/capabilities/execution",
            "'submesh' or 'single'",
        ),
    ],
)
def test_messages_carry_the_fix(changes, pointer, hint):
    d = only(with_(**changes))
    assert d.pointer == pointer
    assert hint in d.hint


def test_pep440_messages_name_the_value():
    assert "'1.0.0-beta.x' is not a PEP 440 version" in only(with_(version="1.0.0-beta.x")).message
    d = only(with_(requires={"vllm": ">=0.33,<"}))
    assert "'>=0.33,<' is not a PEP 440 version specifier" in d.message
    d = only(with_(requires={"packages": ["foo>="]}))
    assert "'foo>=' is not a PEP 508 requirement" in d.message


# --- unknown keys and names: did you mean ------------------------------------------------


@pytest.mark.parametrize(
    ("changes", "code", "pointer", "suggestion"),
    [
        ({"capabilites": {}}, "TTB030", "/capabilites", "capabilities"),
        ({"mainclass": "adapter:X"}, "TTB030", "/mainclass", "main_class"),
        (
            {"capabilities": {"prefix_cache": True}},
            "TTB030",
            "/capabilities/prefix_cache",
            "prefix_caching",
        ),
        (
            {"targets": {"N150": {"max_seqs": 1}}},
            "TTB030",
            "/targets/N150/max_seqs",
            "max_num_seqs",
        ),
        ({"models": [{"repo": "a/b", "revison": "r"}]}, "TTB030", "/models/0/revison", "revision"),
        ({"requires": {"vlm": ">=1"}}, "TTB030", "/requires/vlm", "vllm"),
        ({"when": {"environ": {}}}, "TTB030", "/when/environ", "env"),
        (
            {"targets": {"N150": {"additional_config": {"trace_mod": "all"}}}},
            "TTB038",
            "/targets/N150/additional_config/trace_mod",
            "trace_mode",
        ),
        (
            {"targets": {"N150": {"additional_config": {"fabric_cfg": "FABRIC_1D"}}}},
            "TTB038",
            "/targets/N150/additional_config/fabric_cfg",
            "fabric_config",
        ),
        ({"targets": {"N15O": {}}}, "TTB035", "/targets/N15O", "N150"),
        ({"targets": {"t3k": {}}}, "TTB035", "/targets/t3k", "T3K"),
        ({"targets": {"P150X4": {}}}, "TTB035", "/targets/P150X4", "P150x4"),
        ({"targets": {"N150X": {}}}, "TTB035", "/targets/N150X", "N150"),
        ({"targets": {"BH_Galaxy": {}}}, "TTB035", "/targets/BH_Galaxy", "BH-Galaxy"),
    ],
)
def test_did_you_mean(changes, code, pointer, suggestion):
    d = only(with_(**changes))
    assert (d.code, d.pointer) == (code, pointer)
    assert d.hint.startswith(f"did you mean {suggestion!r}?")


def test_unknown_mesh_without_a_close_match_lists_the_meshes():
    d = only(with_(targets={"galaxy-of-doom": {}}))
    assert d.code == "TTB035"
    assert "N150" in d.hint and "BH-Galaxy" in d.hint and "HOST" in d.hint


def test_unknown_key_hint_mentions_extensions():
    d = only(with_(flavour="x"))
    assert d.code == "TTB030"
    assert d.hint.endswith("free extensions start with 'x-'")


# --- strict JSON types -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("changes", "code", "pointer", "got"),
    [
        (
            {"capabilities": {"prefix_caching": "yes"}},
            "TTB032",
            "/capabilities/prefix_caching",
            "a string",
        ),
        ({"capabilities": {"async_decode": 1}}, "TTB032", "/capabilities/async_decode", "a number"),
        (
            {"targets": {"N150": {"max_num_seqs": "4"}}},
            "TTB032",
            "/targets/N150/max_num_seqs",
            "a string",
        ),
        (
            {"targets": {"N150": {"max_num_seqs": 4.0}}},
            "TTB032",
            "/targets/N150/max_num_seqs",
            "a number",
        ),
        (
            {"targets": {"N150": {"max_model_len": True}}},
            "TTB032",
            "/targets/N150/max_model_len",
            "a boolean",
        ),
        ({"version": 1}, "TTB032", "/version", "a number"),
        ({"name": None}, "TTB032", "/name", "null"),
        (
            {"targets": {"N150": {"additional_config": {"enable_model_warmup": "true"}}}},
            "TTB038",
            "/targets/N150/additional_config/enable_model_warmup",
            "a string",
        ),
        (
            {"targets": {"N150": {"additional_config": {"worker_l1_size": "1024"}}}},
            "TTB038",
            "/targets/N150/additional_config/worker_l1_size",
            "a string",
        ),
    ],
)
def test_strict_types(changes, code, pointer, got):
    d = only(with_(**changes))
    assert (d.code, d.pointer) == (code, pointer)
    assert d.message.endswith(f"got {got}")


@pytest.mark.parametrize("value", [True, "1", None])
def test_schema_version_must_be_the_number_1(value):
    d = only(with_(schema_version=value))
    assert d.pointer == "/schema_version"
    assert d.code in {"TTB032", "TTB033"}
    assert d.severity is Severity.ERROR


# --- schema_version ----------------------------------------------------------------------


@pytest.mark.parametrize("version", [0, 7, 99])
def test_unsupported_schema_version(version):
    d = only(with_(schema_version=version, unknown_key_ignored="x"))
    assert (d.code, d.pointer, d.line) == ("TTB020", "/schema_version", 2)
    assert f"schema_version {version} is not supported" in d.message
    assert "reads version 1" in d.message
    assert "upgrade ttbundles" in d.hint


def test_legacy_and_v1_keys_without_schema_version():
    document = {
        "arch": "LlamaForCausalLM",
        "main_class": "adapter:Gen",
        "name": "x",
        "capabilities": {},
    }
    d = only(document)
    assert (d.code, d.severity, d.pointer) == ("TTB031", Severity.ERROR, "")
    assert "schema_version is missing" in d.message
    assert "name, capabilities" in d.hint


@pytest.mark.parametrize("document", [{}, {"arch": "LlamaForCausalLM"}, {"main_class": "a:B"}])
def test_no_schema_version_and_no_legacy_keys(document):
    loaded = parse(document)
    assert loaded.metadata is None
    missing = {"arch", "main_class"} - set(document)
    assert sorted(d.code for d in loaded.diagnostics) == ["TTB031"] * len(missing)
    assert all(any(repr(k) in d.message for d in loaded.diagnostics) for k in missing)


# --- legacy metadata ---------------------------------------------------------------------


LEGACY = {"arch": "LlamaForCausalLM", "main_class": "adapter:LlamaGen"}


def legacy_folder(tmp_path, name, *, module=None):
    folder = tmp_path / name
    folder.mkdir()
    (folder / "vllm_metadata.json").write_text(json.dumps(LEGACY))
    if module is not None:
        (folder / module).parent.mkdir(parents=True, exist_ok=True)
        (folder / module).write_text("class LlamaGen: ...\n")
    return folder


@pytest.mark.parametrize(
    ("module", "source"),
    [("adapter.py", "bundle"), ("adapter/__init__.py", "bundle"), (None, "environment")],
)
def test_legacy_accepted_with_warning(tmp_path, module, source):
    folder = legacy_folder(tmp_path, "My Llama_3", module=module)
    loaded = load_metadata(folder)
    assert [(d.code, d.severity) for d in loaded.diagnostics] == [("TTB021", Severity.WARNING)]
    assert (loaded.diagnostics[0].pointer, loaded.diagnostics[0].line) == ("", 1)
    assert f"ttbundle migrate {folder}" in loaded.diagnostics[0].hint
    meta = loaded.metadata
    assert meta.legacy is True
    assert meta.schema_version == 1
    assert meta.name == "my-llama_3"  # slug of the folder name
    assert (meta.arch, meta.main_class, meta.main_class_source) == (
        "LlamaForCausalLM",
        "adapter:LlamaGen",
        source,
    )
    assert meta.tt_arch == "TTLlamaForCausalLM"


def test_legacy_environment_module_not_in_folder(tmp_path):
    folder = legacy_folder(tmp_path, "env-model")
    (folder / "vllm_metadata.json").write_text(
        json.dumps(
            {
                "arch": "LlamaForCausalLM",
                "main_class": "models.tt_transformers.tt.generator_vllm:LlamaForCausalLM",
            }
        )
    )
    meta = load_metadata(folder).metadata
    assert meta.main_class_source == "environment"
    assert meta.module == "models.tt_transformers.tt.generator_vllm"


def test_legacy_keeps_extensions_and_warns_about_other_keys():
    loaded = parse({**LEGACY, "x-note": "kept", "comment": "dropped"})
    assert [(d.code, d.severity, d.pointer) for d in loaded.diagnostics] == [
        ("TTB021", Severity.WARNING, ""),
        ("TTB030", Severity.WARNING, "/comment"),
    ]
    assert loaded.metadata.extensions == {"x-note": "kept"}


def test_legacy_with_invalid_values_is_an_error():
    loaded = parse({"arch": "Llama-3", "main_class": "adapter.Gen"})
    assert loaded.metadata is None
    assert [d.code for d in loaded.diagnostics] == ["TTB021", "TTB033", "TTB036"]


# --- JSON syntax and shape ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "line", "column"),
    [
        ('{"schema_version": 1,}', 1, 22),
        ('{\n  "schema_version": 1\n  "name": "x"\n}', 3, 3),
        ('{\n  "name": "unterminated\n}', 2, 24),
        ("", 1, 1),
        ("{\n  'name': 1\n}", 2, 3),
    ],
)
def test_json_syntax_error(text, line, column):
    d = only(text)
    assert (d.code, d.line, d.column, d.pointer) == ("TTB010", line, column, None)
    assert d.message.startswith("invalid JSON: ")
    assert str(d).startswith(f"vllm_metadata.json:{line}:{column}: error TTB010")


@pytest.mark.parametrize("text", ["[]", '"adapter:Gen"', "1", "null", "true"])
def test_not_an_object(text):
    d = only(text)
    assert (d.code, d.pointer) == ("TTB011", "")


# --- locations ---------------------------------------------------------------------------

BROKEN = """{
  "schema_version": 1,
  "name": "demo",
  "version": "1.0.0",
  "arch": "DemoForCausalLM",
  "main_class": "adapter:DemoGenerator",
  "capabilities": {
    "prefix_caching": "yes",
    "sample_on_device": ["all", "sometimes"]
  },
  "targets": {
    "N15O": {},
    "T3K": {
      "max_num_seqs": "4",
      "additional_config": {"trace_mod": "all"}
    }
  },
  "models": [
    {"repo": "a/b"},
    {"repo": "nope"}
  ],
  "capabilites": {}
}
"""


def test_every_problem_located():
    loaded = parse(BROKEN)
    assert loaded.metadata is None
    found = {(d.code, d.pointer, d.line, d.column) for d in loaded.diagnostics}
    assert found == {
        ("TTB032", "/capabilities/prefix_caching", 8, 23),
        ("TTB033", "/capabilities/sample_on_device/1", 9, 33),
        ("TTB035", "/targets/N15O", 12, 5),  # the key itself
        ("TTB032", "/targets/T3K/max_num_seqs", 14, 23),
        ("TTB038", "/targets/T3K/additional_config/trace_mod", 15, 29),  # the key
        ("TTB033", "/models/1/repo", 20, 14),
        ("TTB030", "/capabilites", 22, 3),  # the key
    }
    assert all(d.file == str(FILE) and d.is_error for d in loaded.diagnostics)


def test_location_in_rendered_diagnostic():
    d = next(d for d in parse(BROKEN).diagnostics if d.code == "TTB030")
    assert str(d) == (
        "vllm_metadata.json:22:3 /capabilites: error TTB030: unknown key 'capabilites' "
        "(fix: did you mean 'capabilities'?; free extensions start with 'x-')"
    )


def test_pointer_escapes_slash_and_tilde():
    document = with_(targets={"N150": {"env": {"A": "1"}}}, when={"env": {"a/b~c": "1"}})
    d = only(document)
    assert (d.code, d.pointer) == ("TTB033", "/when/env/a~1b~0c")
    assert (d.line, d.column) == (16, 7)


# --- the JSON Schema ---------------------------------------------------------------------


def test_checked_in_schema_is_generated():
    assert SCHEMA_FILE.read_text(encoding="utf-8") == render_schema(), (
        "regenerate: python -m ttbundles.format.schema > schemas/vllm_metadata.schema.json"
    )


def test_installed_schema_printed_by_cli(run_cli):
    done = run_cli("schema")
    assert done.returncode == 0, done.stderr
    assert done.stdout == render_schema()
    assert json.loads(done.stdout)["$id"] == generate_schema()["$id"]


def test_schema_is_draft_2020_12():
    schema = json.loads(render_schema())
    assert schema["$schema"] == "https://json-schema.org/draft/2020-12/schema"
    jsonschema.Draft202012Validator.check_schema(schema)
    assert schema["additionalProperties"] is False
    assert schema["required"] == ["schema_version", "name", "version", "arch", "main_class"]
    for name, definition in schema["$defs"].items():
        assert definition["additionalProperties"] is False, name
    for prop, definition in schema["properties"].items():
        assert definition.get("description") or "$ref" in definition, prop


VALID_CORPUS = {
    "minimal": MINIMAL,
    "full": FULL,
    "extensions": with_(
        **{
            "x-a": 1,
            "capabilities": {"x-b": 2},
            "targets": {"HOST": {"x-c": 3}},
            "when": {"x-d": 4},
            "requires": {"x-e": 5},
            "models": [{"repo": "a/b", "x-f": 6}],
        }
    ),
    "nulls": with_(
        description=None,
        license=None,
        models=[{"repo": "a/b", "revision": None}],
        targets={"P150": {"max_model_len": None}},
    ),
    "environment": with_(main_class="models.x.generator_vllm:Gen", main_class_source="environment"),
}
INVALID_CORPUS = {
    "unknown key": with_(capabilites={}),
    "unknown nested key": with_(capabilities={"prefix_cache": True}),
    "unknown device option": with_(targets={"N150": {"additional_config": {"trace_mod": "all"}}}),
    "device option extension": with_(targets={"N150": {"additional_config": {"x-a": 1}}}),
    "bad mesh": with_(targets={"N15O": {}}),
    "extension as mesh": with_(targets={"x-mesh": {}}),
    "bool as string": with_(capabilities={"prefix_caching": "yes"}),
    "int as string": with_(targets={"N150": {"max_num_seqs": "4"}}),
    "int as bool": with_(targets={"N150": {"max_num_seqs": True}}),
    "schema_version as bool": with_(schema_version=True),
    "string as number": with_(version=1),
    "bad enum execution": with_(capabilities={"execution": "multi"}),
    "bad enum sampling": with_(capabilities={"sample_on_device": ["sometimes"]}),
    "bad enum fabric": with_(targets={"N150": {"additional_config": {"fabric_config": "2D"}}}),
    "bad enum source": with_(main_class_source="pip"),
    "duplicate mode": with_(capabilities={"sample_on_device": ["all", "all"]}),
    "zero batch": with_(targets={"N150": {"max_num_seqs": 0}}),
    "missing required": {k: v for k, v in MINIMAL.items() if k != "arch"},
    "bad name": with_(name="Demo"),
    "bad main_class": with_(main_class="adapter.Gen"),
    "bad env name": with_(targets={"N150": {"env": {"1BAD": "x"}}}),
    "bad when env name": with_(when={"env": {"A-B": "x"}}),
    "unsupported version": with_(schema_version=7),
    "modalities in schema 1": with_(capabilities={"modalities": {"image": 1}}),
}


@pytest.fixture(scope="module")
def schema_validator():
    return jsonschema.Draft202012Validator(generate_schema())


@pytest.mark.parametrize("name", list(VALID_CORPUS))
def test_schema_and_model_accept(schema_validator, name):
    document = VALID_CORPUS[name]
    assert list(schema_validator.iter_errors(document)) == []
    BundleMetadata.model_validate(document)
    assert parse(document).diagnostics == []


@pytest.mark.parametrize("name", list(INVALID_CORPUS))
def test_schema_and_model_reject(schema_validator, name):
    document = INVALID_CORPUS[name]
    assert list(schema_validator.iter_errors(document)) != [], "the schema accepts it"
    loaded = parse(document)
    assert loaded.metadata is None, "the model accepts it"
    assert loaded.diagnostics and all(d.is_error for d in loaded.diagnostics)


def test_modalities_need_schema_version_2():
    d = only(with_(capabilities={"modalities": {"image": 2}}))
    assert (d.code, d.pointer) == ("TTB020", "/schema_version")
    assert "needs schema_version 2" in d.message


def test_modalities_with_schema_version_2_set_the_input_limits():
    loaded = parse({**MINIMAL, "schema_version": 2, "capabilities": {"modalities": {"image": 3}}})
    assert loaded.diagnostics == []
    assert loaded.metadata.capabilities.input_limits() == {"image": 3}


def test_multimodal_alone_means_one_image_and_text_only_means_none():
    caps = parse({**MINIMAL, "capabilities": {"multimodal": True}}).metadata.capabilities
    assert caps.input_limits() == {"image": 1}
    assert parse(MINIMAL).metadata.capabilities.input_limits() == {}


def test_an_unknown_modality_gets_a_did_you_mean():
    doc = {**MINIMAL, "schema_version": 2, "capabilities": {"modalities": {"imgae": 1}}}
    d = only(doc)
    assert (d.code, d.pointer) == ("TTB033", "/capabilities/modalities/imgae")
    assert "did you mean 'image'" in d.hint


def test_modalities_contradicting_multimodal_false_are_refused():
    doc = {
        **MINIMAL,
        "schema_version": 2,
        "capabilities": {"multimodal": False, "modalities": {"image": 1}},
    }
    d = only(doc)
    assert d.code == "TTB033" and "multimodal is false" in d.message
