"""The validator on real folders: metadata, the adapter checked statically, sets of bundles,
and `--import` in a subprocess."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

import pytest

from tests.bundle_factory import contract_adapter
from ttbundles.check.validate import validate_bundle, validate_path
from ttbundles.errors import Severity
from ttbundles.format.loader import PACKAGE_PREFIX, package_name, qualified_class

ERROR, WARNING, INFO = Severity.ERROR, Severity.WARNING, Severity.INFO
META = "vllm_metadata.json"

# Adapters with one thing wrong each, built from the valid one in conftest.
NO_KWARGS_DECODE = (
    "def decode_forward(self, tokens, start_pos, page_table, kv_cache, **kwargs):",
    "def decode_forward(self, tokens, start_pos, page_table, kv_cache):",
)
CAPS_ON = {
    "async": ('"supports_async_decode": False', '"supports_async_decode": True'),
    "sample": ('"supports_sample_on_device": False', '"supports_sample_on_device": True'),
}
READBACK = """
    def read_decode_output(self, tokens, **kwargs):
        return tokens

    def process_decode_output_host(self, tokens, **kwargs):
        return tokens
"""
BASE_OUTSIDE = """from vendor.generators import VendorBase


class DemoGenerator(VendorBase):
    def decode_forward(self, tokens, start_pos, page_table, kv_cache, **kwargs):
        return None
"""
SUBCLASS = '''from .base import Base


class DemoGenerator(Base):
    """All methods inherited from a module of the bundle."""
'''

# TT-Metal's LlamaForCausalLM (generator_vllm.py @21a4db48): five capabilities, all True.
LLAMA_CAPABILITIES = """\
    model_capabilities = {
        "supports_prefix_caching": True,
        "supports_async_decode": True,
        "supports_sample_on_device": True,
        "supports_device_grammar": True,
        "supports_chunked_prefill": True,
    }
"""
LLAMA_LIKE = contract_adapter("DemoGenerator", attributes=LLAMA_CAPABILITIES + READBACK)
# TT-Metal's Mistral3ForConditionalGeneration: no supports_async_decode, so not supported.
MISTRAL3_LIKE = contract_adapter(
    "DemoGenerator",
    attributes="    model_capabilities = "
    '{"supports_prefix_caching": False, "supports_sample_on_device": True}\n' + READBACK,
)
COMPUTED_CAPABILITY = contract_adapter(
    "DemoGenerator",
    preamble="\ndef _compute():\n    return True\n",
    attributes="""\
    model_capabilities = {
        "supports_prefix_caching": False,
        "supports_async_decode": _compute(),
        "supports_sample_on_device": False,
    }
"""
    + READBACK,
)
# A subclass in the bundle of a Llama-like base in the bundle.
NARROWING_SUBCLASS = SUBCLASS + '    model_capabilities = {"supports_prefix_caching": True}\n'
SPREADING_SUBCLASS = (
    SUBCLASS
    + '    model_capabilities = {**Base.model_capabilities, "supports_chunked_prefill": False}\n'
)
ONLY_CAPABILITIES_OUTSIDE = """from vendor.generators import VendorBase


class DemoGenerator(VendorBase):
    model_capabilities = {"supports_sample_on_device": True}
"""
# Contract methods bound by assignment, not `def`.
ALIASES = '''"""Contract methods bound by assignment."""
from vendor.generators import VendorBase


def _decode(self, tokens, start_pos, page_table, kv_cache, sampling_params=None):
    return None


class Helpers:
    def prefill(self, tokens, page_table, kv_cache, prompt_lens, **kwargs):
        return None


class DemoGenerator:
    model_capabilities = {"supports_sample_on_device": True}

    def _initialize(cls, **kwargs):
        return cls()

    initialize_vllm_model = classmethod(_initialize)
    prefill_forward = Helpers.prefill
    decode_forward = _decode
    allocate_kv_cache = VendorBase.allocate_kv_cache
'''
SAMPLE_ON = {"capabilities": {"sample_on_device": ["all"]}}


def edit(source, *replacements):
    for old, new in replacements:
        assert old in source, old
        source = source.replace(old, new)
    return source


# --- one broken bundle at a time ---------------------------------------------------------

# id -> (make_bundle kwargs, expected diagnostics as (code, severity, file relative to the
# bundle, pointer, line), a text the last diagnostic's hint contains). In kwargs, "edits"
# are applied to the valid adapter, and the file texts "ADAPTER" and "BASE" stand for the
# valid adapter and the same with its class named Base.
CASES = {
    "module missing, did you mean": (
        {"metadata": {"main_class": "adaptr:DemoGenerator"}},
        [("TTB050", ERROR, META, "/main_class", 6)],
        "did you mean 'adapter'?",
    ),
    "package module missing, did you mean": (
        {
            "metadata": {"main_class": "pkg.adapter:DemoGenerator"},
            "adapter": None,
            "files": {"pkg/__init__.py": "", "pkg/adapters.py": "ADAPTER"},
        },
        [("TTB050", ERROR, META, "/main_class", 6)],
        "did you mean 'pkg.adapters'?",
    ),
    "module missing, no python at all": (
        {"adapter": None},
        [("TTB050", ERROR, META, "/main_class", 6)],
        'main_class_source: "environment"',
    ),
    "syntax error": (
        {"adapter": "class DemoGenerator:\n    def f(self:\n        pass\n"},
        [("TTB051", ERROR, "adapter.py", None, 2)],
        "fix the Python syntax",
    ),
    "syntax error in a base module": (
        {
            "metadata": {"main_class": "pkg.adapter:DemoGenerator"},
            "adapter": None,
            "files": {
                "pkg/__init__.py": "",
                "pkg/adapter.py": SUBCLASS,
                "pkg/base.py": "class Base:\n\n    def f(self) -> :\n        pass\n",
            },
        },
        [("TTB051", ERROR, "pkg/base.py", None, 3)],
        "fix the Python syntax",
    ),
    "class not defined, did you mean": (
        {"metadata": {"main_class": "adapter:DemoGenrator"}},
        [("TTB052", ERROR, "adapter.py", None, None)],
        "did you mean 'DemoGenerator'?",
    ),
    "class not defined, no classes": (
        {"adapter": "def DemoGenerator():\n    pass\n"},
        [("TTB052", ERROR, "adapter.py", None, None)],
        "define class DemoGenerator in adapter.py",
    ),
    "contract methods missing": (
        {
            "adapter": "import os\n\n\nclass DemoGenerator:\n"
            "    def prefill_forward(self, **kwargs):\n        pass\n"
        },
        [("TTB053", ERROR, "adapter.py", None, 4)],
        "ttbundle init",
    ),
    "async_decode without readback": (
        {"metadata": {"capabilities": {"async_decode": True}}, "edits": (CAPS_ON["async"],)},
        [("TTB054", ERROR, "adapter.py", None, 4)],
        "declare async_decode: false",
    ),
    "sample_on_device without sampling_params": (
        {
            "metadata": {"capabilities": {"sample_on_device": ["decode_only"]}},
            "edits": (CAPS_ON["sample"], NO_KWARGS_DECODE),
        },
        [("TTB055", ERROR, "adapter.py", None, 22)],
        "sampling_params=None",
    ),
    "declared, but False in model_capabilities": (
        {"metadata": {"capabilities": {"prefix_caching": True}}},
        [("TTB056", ERROR, META, "/capabilities/prefix_caching", 9)],
        "declare prefix_caching: False, or implement it and set "
        "'supports_prefix_caching': True in the class (adapter.py:5)",
    ),
    "True in model_capabilities, not declared: safe, a warning": (
        {
            "edits": (
                CAPS_ON["async"],
                ("    def decode_forward", READBACK + "\n    def decode_forward"),
            )
        },
        # Not declared, so not in the file: no line to point at.
        [("TTB059", WARNING, META, "/capabilities/async_decode", None)],
        "declare it in capabilities.async_decode to use it",
    ),
    "Llama-like class, the bundle declares less: warnings": (
        {"adapter": LLAMA_LIKE, "metadata": {"capabilities": {"prefix_caching": True}}},
        [
            ("TTB059", WARNING, META, "/capabilities/async_decode", None),
            ("TTB059", WARNING, META, "/capabilities/sample_on_device", None),
            ("TTB059", WARNING, META, "/capabilities/chunked_prefill", None),
        ],
        "(adapter.py:5)",
    ),
    "Llama-like class, the bundle declares all of it": (
        {
            "adapter": LLAMA_LIKE,
            "metadata": {
                "capabilities": {
                    "prefix_caching": True,
                    "async_decode": True,
                    "sample_on_device": ["decode_only", "all"],
                    "chunked_prefill": True,
                }
            },
        },
        [],
        None,
    ),
    "Mistral3-like class, async_decode declared but absent from its dict": (
        {
            "adapter": MISTRAL3_LIKE,
            "metadata": {"capabilities": {"async_decode": True, "sample_on_device": ["all"]}},
        },
        [("TTB056", ERROR, META, "/capabilities/async_decode", 9)],
        "declare async_decode: False",
    ),
    "a computed value hides only its own key": (
        {
            "adapter": COMPUTED_CAPABILITY,
            "metadata": {"capabilities": {"prefix_caching": True, "async_decode": True}},
        },
        [
            ("TTB056", ERROR, META, "/capabilities/prefix_caching", 9),
            ("TTB040", WARNING, META, "/capabilities/async_decode", 10),
        ],
        "--import",
    ),
    "a computed value, capability off: a note": (
        {"adapter": COMPUTED_CAPABILITY},
        [("TTB040", INFO, META, "/capabilities/async_decode", None)],
        "--import",
    ),
    "a subclass's dict replaces its base's": (
        {
            "metadata": {
                "main_class": "pkg.adapter:DemoGenerator",
                "capabilities": {"prefix_caching": True, "async_decode": True},
            },
            "adapter": None,
            "files": {
                "pkg/__init__.py": "",
                "pkg/adapter.py": NARROWING_SUBCLASS,
                "pkg/base.py": LLAMA_LIKE.replace("DemoGenerator", "Base"),
            },
        },
        [("TTB056", ERROR, META, "/capabilities/async_decode", 10)],
        "(adapter.py:6)",
    ),
    "a ** entry merges its base's dict explicitly": (
        {
            "metadata": {
                "main_class": "pkg.adapter:DemoGenerator",
                "capabilities": {
                    "prefix_caching": True,
                    "async_decode": True,
                    "sample_on_device": ["all"],
                },
            },
            "adapter": None,
            "files": {
                "pkg/__init__.py": "",
                "pkg/adapter.py": SPREADING_SUBCLASS,
                "pkg/base.py": LLAMA_LIKE.replace("DemoGenerator", "Base"),
            },
        },
        [],
        None,
    ),
    "async_decode and readback outside the bundle: not checkable here": (
        {"adapter": BASE_OUTSIDE, "metadata": {"capabilities": {"async_decode": True}}},
        [
            ("TTB057", WARNING, "adapter.py", None, 4),  # the readback methods
            ("TTB057", WARNING, "adapter.py", None, 4),  # the contract methods
            ("TTB057", WARNING, META, "/capabilities/async_decode", 9),  # model_capabilities
        ],
        "--import",
    ),
    "sample_on_device and decode_forward outside the bundle: not checkable here": (
        {"adapter": ONLY_CAPABILITIES_OUTSIDE, "metadata": SAMPLE_ON},
        [("TTB057", WARNING, "adapter.py", None, 4), ("TTB057", WARNING, "adapter.py", None, 4)],
        "--import",
    ),
    "aliases define contract methods": ({"adapter": ALIASES, "metadata": SAMPLE_ON}, [], None),
    "an alias to a function without sampling_params": (
        {
            "adapter": ALIASES.replace(", sampling_params=None", ""),
            "metadata": SAMPLE_ON,
        },
        [("TTB055", ERROR, "adapter.py", None, 5)],
        "sampling_params=None",
    ),
    "an alias to a method outside the bundle: not checkable here": (
        {
            "adapter": ALIASES.replace("= _decode", "= VendorBase.decode_forward"),
            "metadata": SAMPLE_ON,
        },
        [("TTB057", WARNING, "adapter.py", None, 22)],
        "--import",
    ),
    "base class outside the bundle": (
        {"adapter": BASE_OUTSIDE},
        [("TTB057", WARNING, "adapter.py", None, 4)],
        "--import",
    ),
    "environment main class not importable": (
        {
            "metadata": {
                "main_class": "models.tt_transformers.tt.generator_vllm:Llama",
                "main_class_source": "environment",
            },
            "adapter": None,
        },
        [("TTB058", WARNING, META, "/main_class", 6)],
        "TT-Metal",
    ),
    "revision missing": (
        {
            "metadata": {
                "models": [{"repo": "org/pinned", "revision": "abc123"}, {"repo": "org/floating"}]
            }
        },
        [("TTB037", WARNING, META, "/models/1", 13)],
        '"revision"',
    ),
    "default sampling mode not declared": (
        {
            "metadata": {
                "capabilities": {"sample_on_device": ["decode_only"]},
                "targets": {"N300": {"additional_config": {"sample_on_device_mode": "all"}}},
            },
            "edits": (CAPS_ON["sample"],),
        },
        [("TTB204", ERROR, META, "/targets/N300/additional_config/sample_on_device_mode", 16)],
        "declare 'all' in capabilities.sample_on_device",
    ),
    "two problems reported together": (
        {
            "metadata": {
                "models": [{"repo": "org/floating"}],
                "capabilities": {"prefix_caching": True},
            }
        },
        [
            ("TTB037", WARNING, META, "/models/0", 9),
            ("TTB056", ERROR, META, "/capabilities/prefix_caching", 14),
        ],
        None,
    ),
    "metadata error stops before the adapter": (
        {"metadata": {"capabilites": {}}, "adapter": "this is not python"},
        [("TTB030", ERROR, META, "/capabilites", 8)],
        "did you mean 'capabilities'?",
    ),
    "base in a sibling module, by relative import": (
        {
            "metadata": {"main_class": "pkg.adapter:DemoGenerator"},
            "adapter": None,
            "files": {"pkg/__init__.py": "", "pkg/adapter.py": SUBCLASS, "pkg/base.py": "BASE"},
        },
        [],
        None,
    ),
    "base two levels up, aliased": (
        {
            "metadata": {"main_class": "pkg.sub.adapter:DemoGenerator"},
            "adapter": None,
            "files": {
                "pkg/__init__.py": "",
                "pkg/sub/__init__.py": "",
                "pkg/base.py": "BASE",
                "pkg/sub/adapter.py": SUBCLASS.replace(
                    "from .base import Base", "from ..base import Base as B"
                ).replace("(Base)", "(B)"),
            },
        },
        [],
        None,
    ),
    "class re-exported by a package __init__": (
        {
            "metadata": {"main_class": "pkg:DemoGenerator"},
            "adapter": None,
            "files": {
                "pkg/__init__.py": "from .impl import DemoGenerator\n",
                "pkg/impl.py": "ADAPTER",
            },
        },
        [],
        None,
    ),
    "sample_on_device with **kwargs": (
        {
            "metadata": {"capabilities": {"sample_on_device": ["all", "decode_only"]}},
            "edits": (CAPS_ON["sample"],),
        },
        [],
        None,
    ),
    "async_decode with readback": (
        {
            "metadata": {"capabilities": {"async_decode": True}},
            "edits": (
                CAPS_ON["async"],
                ("    def decode_forward", READBACK + "\n    def decode_forward"),
            ),
        },
        [],
        None,
    ),
}


def resolve(kwargs, adapter):
    kwargs = dict(kwargs)
    texts = {"ADAPTER": adapter, "BASE": adapter.replace("DemoGenerator", "Base")}
    if "edits" in kwargs:
        kwargs["adapter"] = edit(adapter, *kwargs.pop("edits"))
    if "files" in kwargs:
        kwargs["files"] = {k: texts.get(v, v) for k, v in kwargs["files"].items()}
    return kwargs


@pytest.mark.parametrize("case", list(CASES))
def test_broken_bundle(make_bundle, case):
    kwargs, expected, hint = CASES[case]
    folder = make_bundle("demo", **resolve(kwargs, make_bundle.adapter))
    result = validate_path(folder)
    found = [
        (d.code, d.severity, Path(d.file).relative_to(folder).as_posix(), d.pointer, d.line)
        for d in result.report.diagnostics
    ]
    assert found == expected
    assert result.ok() is not any(e[1] is ERROR for e in expected)
    if hint is not None:
        assert hint in result.report.diagnostics[-1].hint
    assert [b.path for b in result.bundles] == [folder]


def test_missing_metadata(tmp_path):
    folder = tmp_path / "no-meta"
    folder.mkdir()
    (folder / "adapter.py").write_text("class G: ...\n")
    report = validate_bundle(folder)
    [d] = report.diagnostics
    assert (d.code, d.severity, d.file) == ("TTB002", ERROR, str(folder / META))
    assert d.hint == f"create one: ttbundle init {folder} --arch <HFArch>"
    assert not report.ok()


def test_folder_with_a_subfolder_that_is_not_a_bundle(make_bundle, tmp_path):
    models = tmp_path / "models"
    make_bundle("good", parent=models)
    (models / "notes").mkdir()
    (models / ".hidden").mkdir()
    (models / "README.txt").write_text("not a folder\n")
    result = validate_path(models)
    [d] = result.report.diagnostics
    assert (d.code, d.severity, d.file) == ("TTB002", WARNING, str(models / "notes"))
    assert result.ok() and not result.ok(strict=True)
    assert [b.metadata.name for b in result.bundles] == ["good"]


@pytest.mark.parametrize("kind, code", [("empty folder", "TTB002"), ("missing path", "TTB001")])
def test_not_a_bundle(tmp_path, kind, code):
    """A folder without metadata is TTB002 (as the codes page says); a path that is not
    there, TTB001."""
    path = tmp_path / "x"
    if kind == "empty folder":
        path.mkdir()
    [d] = validate_path(path).report.diagnostics
    assert (d.code, d.severity, d.file) == (code, ERROR, str(path))


def test_unparsable_metadata_is_located(make_bundle):
    folder = make_bundle("demo", metadata='{\n  "schema_version": 1,\n  "name": "demo",,\n}\n')
    [d] = validate_path(folder).report.diagnostics
    assert (d.code, d.file, d.line, d.column) == ("TTB010", str(folder / META), 3, 18)


def test_environment_class_importable_here_is_checked(make_bundle, tmp_path, monkeypatch):
    """A main class from the environment is checked statically when its code is found."""
    site = tmp_path / "site"
    (site / "vendor_models").mkdir(parents=True)
    (site / "vendor_models" / "__init__.py").write_text("")
    (site / "vendor_models" / "gen.py").write_text(
        "class Gen:\n    def decode_forward(self, **kwargs):\n        pass\n"
    )
    monkeypatch.syspath_prepend(str(site))
    folder = make_bundle(
        "demo",
        adapter=None,
        metadata={"main_class": "vendor_models.gen:Gen", "main_class_source": "environment"},
    )
    [d] = validate_path(folder).report.diagnostics
    assert (d.code, d.severity, d.file, d.line) == (
        "TTB053",
        ERROR,
        str(site / "vendor_models" / "gen.py"),
        1,
    )
    assert "initialize_vllm_model, prefill_forward" in d.message
    assert "vendor_models" not in sys.modules, "found without importing"


def test_environment_namespace_package_is_searched_in_every_portion(
    make_bundle, tmp_path, monkeypatch
):
    """TT-Metal's `models` may be a namespace package split over several folders: the
    class in one portion, its base in another."""
    first, second = tmp_path / "site-a", tmp_path / "site-b"
    (first / "vendor_ns" / "common").mkdir(parents=True)
    (first / "vendor_ns" / "common" / "base.py").write_text(
        contract_adapter("Base", attributes=LLAMA_CAPABILITIES + READBACK)
    )
    (second / "vendor_ns" / "llm").mkdir(parents=True)
    (second / "vendor_ns" / "llm" / "gen.py").write_text(
        "from vendor_ns.common.base import Base\n\n\nclass Gen(Base):\n"
        '    model_capabilities = {"supports_prefix_caching": True}\n'
    )
    for site in (first, second):
        monkeypatch.syspath_prepend(str(site))
    folder = make_bundle(
        "demo",
        adapter=None,
        metadata={
            "main_class": "vendor_ns.llm.gen:Gen",
            "main_class_source": "environment",
            "capabilities": {"prefix_caching": True, "async_decode": True},
        },
    )
    # Both portions seen: the class and all of its contract were found, and its own dict
    # (which lacks supports_async_decode) was compared.
    found = [(d.code, d.severity, d.pointer) for d in validate_path(folder).report.diagnostics]
    assert found == [("TTB056", ERROR, "/capabilities/async_decode")]
    assert "vendor_ns" not in sys.modules, "found without importing"


def test_environment_module_missing_from_every_portion(make_bundle, tmp_path, monkeypatch):
    for site in ("site-a", "site-b"):
        (tmp_path / site / "vendor_ns" / site.replace("-", "_")).mkdir(parents=True)
        monkeypatch.syspath_prepend(str(tmp_path / site))
    folder = make_bundle(
        "demo",
        adapter=None,
        metadata={"main_class": "vendor_ns.gone:Gen", "main_class_source": "environment"},
    )
    [d] = validate_path(folder).report.diagnostics
    assert (d.code, d.severity, d.pointer) == ("TTB050", ERROR, "/main_class")
    assert str(tmp_path / "site-a" / "vendor_ns") in d.message
    assert str(tmp_path / "site-b" / "vendor_ns") in d.message


# --- strictness --------------------------------------------------------------------------


def test_strict_leaves_what_is_not_checkable_here_alone(make_bundle):
    """A class whose base is outside the bundle (a TT-Metal Generator on a machine without
    TT-Metal) passes --strict; --strict-unverifiable fails it."""
    folder = make_bundle("demo", adapter=BASE_OUTSIDE)
    result = validate_path(folder)
    assert [(d.code, d.severity) for d in result.report.diagnostics] == [("TTB057", WARNING)]
    assert result.ok(strict=True)
    assert not result.ok(strict_unverifiable=True)
    assert [d.severity for d in result.diagnostics(strict=True)] == [WARNING]
    assert [d.severity for d in result.diagnostics(strict_unverifiable=True)] == [ERROR]
    assert [d.severity for d in result.report.diagnostics] == [WARNING], "not mutated"
    # An ordinary warning is still an error under --strict.
    pinned = make_bundle("pinless", adapter=BASE_OUTSIDE, metadata={"models": [{"repo": "o/m"}]})
    result = validate_path(pinned)
    assert not result.ok(strict=True)
    assert [(d.code, d.severity) for d in result.diagnostics(strict=True)] == [
        ("TTB037", ERROR),
        ("TTB057", WARNING),
    ]


def test_strict_unverifiable_fails_an_environment_class_not_importable_here(make_bundle):
    folder = make_bundle(
        "demo",
        adapter=None,
        metadata={"main_class": "models.x.generator_vllm:Gen", "main_class_source": "environment"},
    )
    result = validate_path(folder)
    assert [(d.code, d.severity) for d in result.report.diagnostics] == [("TTB058", WARNING)]
    assert result.ok(strict=True) and not result.ok(strict_unverifiable=True)
    assert validate_bundle(folder).ok(strict=True), "the same rule for validate_bundle"


# --- the contract is described once ------------------------------------------------------


@pytest.mark.parametrize(
    "module",
    [
        "ttbundles.check.adapter",
        "ttbundles.check.static_reader",
        "ttbundles.check.imports",
        "ttbundles.scaffold.init",
        "ttbundles.scaffold.migrate",
    ],
)
def test_contract_names_come_from_format_contract(module):
    """No module repeats the contract's method names, capability keys or commands: they
    import them from ttbundles.format.contract."""
    import ast
    import inspect

    from ttbundles.format import contract

    names = {m.name for m in contract.METHODS} | set(contract.CAPABILITY_KEYS)
    names |= {*contract.DECODE_COMMANDS, contract.CONTRACT_MARKER, contract.CAPABILITIES_ATTRIBUTE}
    tree = ast.parse(inspect.getsource(importlib.import_module(module)))
    literals = {
        n.value for n in ast.walk(tree) if isinstance(n, ast.Constant) and isinstance(n.value, str)
    }
    assert sorted(literals & names) == []


def test_legacy_bundle_validates_with_a_warning(make_bundle):
    folder = make_bundle(
        "old", metadata='{"arch": "DemoForCausalLM", "main_class": "adapter:DemoGenerator"}'
    )
    result = validate_path(folder)
    assert [(d.code, d.severity) for d in result.report.diagnostics] == [("TTB021", WARNING)]
    assert result.ok() and not result.ok(strict=True)
    assert result.bundles[0].metadata.main_class_source == "bundle"


# --- sets of bundles ---------------------------------------------------------------------


def test_duplicate_names(make_bundle, tmp_path):
    models = tmp_path / "models"
    first = make_bundle("a", parent=models, metadata={"name": "same"})
    second = make_bundle("b", parent=models, metadata={"name": "same", "arch": "OtherLM"})
    result = validate_path(models)
    [d] = result.report.diagnostics
    assert (d.code, d.severity, d.file, d.pointer, d.line) == (
        "TTB070",
        ERROR,
        str(second / META),
        "/name",
        3,
    )
    assert str(first) in d.message and str(second) in d.message


@pytest.mark.parametrize(
    ("a", "b", "ambiguous"),
    [
        ({}, {}, True),
        ({"arch": "DemoForCausalLM"}, {"arch": "TTDemoForCausalLM"}, True),
        ({"targets": {"N150": {}, "T3K": {}}}, {"targets": {"T3K": {}}}, True),
        # The one naming the mesh wins on it; elsewhere only the other applies.
        ({"targets": {"N150": {}}}, {}, False),
        ({"targets": {"N150": {}}}, {"targets": {"T3K": {}, "TG": {}}}, False),
        ({"when": {"env": {"V": "1"}}}, {"when": {"env": {"V": "1"}}}, True),
        ({"when": {"env": {"V": "1"}}}, {"when": {"env": {"V": "2"}}}, False),
        ({"when": {"env": {"V": "1"}}}, {"when": {"env": {"W": "1"}}}, True),
        ({"when": {"env": {"V": "1"}}}, {}, False),  # the more specific one wins
        ({}, {"when": {"env": {"V": "1", "W": "2"}}}, False),
        (
            {"when": {"env": {"V": "1"}}, "targets": {"TG": {}}},
            {"when": {"env": {"V": "1"}}, "targets": {"N300": {}}},
            False,
        ),
        ({}, {"arch": "OtherForCausalLM"}, False),
    ],
)
def test_same_arch_overlap(make_bundle, tmp_path, a, b, ambiguous):
    models = tmp_path / "models"
    make_bundle("a", parent=models, metadata=a)
    second = make_bundle("b", parent=models, metadata=b)
    result = validate_path(models)
    found = [(d.code, d.severity, d.file, d.pointer) for d in result.report.diagnostics]
    expected = [("TTB071", ERROR, str(second / META), "/arch")] if ambiguous else []
    assert found == expected
    assert result.ok() is not ambiguous
    if ambiguous:
        assert result.report.diagnostics[0].line == 5
        assert "TTDemoForCausalLM" in result.report.diagnostics[0].message


def test_overlap_reported_once_naming_every_bundle(make_bundle, tmp_path):
    """Four bundles of one architecture are one ambiguity (one TTB071, not six pairs);
    a bundle of another architecture is not in it, and two apart are their own."""
    models = tmp_path / "models"
    for name in ("a", "b", "c", "d"):
        make_bundle(name, parent=models)
    make_bundle("e", parent=models, metadata={"arch": "OtherForCausalLM"})
    make_bundle("f", parent=models, metadata={"arch": "ThirdForCausalLM"})
    make_bundle("g", parent=models, metadata={"arch": "ThirdForCausalLM"})
    found = validate_path(models).report.diagnostics
    assert [d.code for d in found] == ["TTB071", "TTB071"]
    four, two = found
    assert four.message == (
        f"a ({models / 'a'}), b ({models / 'b'}), c ({models / 'c'}), d ({models / 'd'}) "
        "all 4 register TTDemoForCausalLM for overlapping targets and conditions"
    )
    assert four.file == str(models / "d" / META)
    assert two.message.startswith(f"f ({models / 'f'}), g ({models / 'g'}) both register")


def test_invalid_bundles_left_out_of_cross_checks(make_bundle, tmp_path):
    models = tmp_path / "models"
    make_bundle("a", parent=models)
    make_bundle("b", parent=models, metadata={"capabilites": {}})
    codes = [d.code for d in validate_path(models).report.diagnostics]
    assert codes == ["TTB030"]


# --- never run bundle code without --import ----------------------------------------------

MARKER_ADAPTER = """import pathlib

pathlib.Path(__file__).with_name("IMPORTED").write_text("imported")

"""


def test_plain_validate_never_imports(make_bundle, run_cli):
    folder = make_bundle("demo", adapter=MARKER_ADAPTER + make_bundle.adapter)
    assert validate_path(folder).ok()
    assert validate_bundle(folder).ok()
    done = run_cli("validate", folder)
    assert done.returncode == 0, done.stdout + done.stderr
    assert not (folder / "IMPORTED").exists()


# --- --import (subprocesses: kept few) ---------------------------------------------------


def test_import_good_adapter_passes_and_runs_its_code(make_bundle):
    folder = make_bundle("demo", adapter=MARKER_ADAPTER + make_bundle.adapter)
    result = validate_path(folder, import_check=True, timeout=30)
    assert result.report.diagnostics == []
    assert (folder / "IMPORTED").read_text() == "imported"


def test_import_raises(make_bundle):
    adapter = "import ttnn_is_not_here\n\n" + make_bundle.adapter
    folder = make_bundle("demo", adapter=adapter)
    assert validate_path(folder).ok()  # statically fine
    [d] = validate_path(folder, import_check=True, timeout=30).report.diagnostics
    assert (d.code, d.severity, d.file) == ("TTB060", ERROR, str(folder))
    assert "ModuleNotFoundError" in d.message and "ttnn_is_not_here" in d.message


def test_import_times_out(make_bundle):
    folder = make_bundle("demo", adapter="import time\n\ntime.sleep(60)\n\n" + make_bundle.adapter)
    [d] = validate_path(folder, import_check=True, timeout=2).report.diagnostics
    assert (d.code, d.severity, d.file) == ("TTB061", ERROR, str(folder))
    assert "longer than 2s" in d.message and "--timeout" in d.hint


def _imported(folder: Path) -> list:
    """`--import`'s own findings (validate runs it only when the static check is clean)."""
    from ttbundles.check.imports import import_check
    from ttbundles.format.parse import load_metadata

    return import_check(folder, load_metadata(folder).metadata, timeout=30)


def test_import_wrong_signatures(make_bundle):
    adapter = edit(
        make_bundle.adapter,
        ("    @classmethod\n", ""),
        ("def initialize_vllm_model(cls,", "def initialize_vllm_model(self,"),
        (
            "def decode_forward(self, tokens, start_pos, page_table, kv_cache, **kwargs):",
            "def decode_forward(self, tokens, pos, page_table, kv_cache):",
        ),
    )
    folder = make_bundle("demo", adapter=adapter)
    # Statically: the required parameter the worker never passes (the classmethod and
    # the keyword start_pos only --import tells).
    assert [(d.code, d.line, d.message) for d in validate_path(folder).report.diagnostics] == [
        (
            "TTB062",
            21,
            "DemoGenerator.decode_forward requires pos, which the worker does not supply "
            "(it passes: tokens, start_pos, page_table, kv_cache, enable_trace, "
            "read_from_device, sampling_params, prompt_tokens, output_tokens, slot_remap, "
            "gdn_state_indices, rope_deltas_all_users, page_tables_per_layer, reset_batch)",
        )
    ]
    found = [
        (d.code, d.severity, d.file and Path(d.file).name, d.line, d.message)
        for d in _imported(folder)
    ]
    assert found == [
        (
            "TTB062",
            ERROR,
            "adapter.py",
            11,
            "DemoGenerator.initialize_vllm_model must be a classmethod",
        ),
        (
            "TTB062",
            ERROR,
            "adapter.py",
            21,
            "DemoGenerator.decode_forward: does not accept start_pos as keyword arguments",
        ),
        (
            "TTB062",
            ERROR,
            "adapter.py",
            21,
            "DemoGenerator.decode_forward requires pos, which the worker does not pass",
        ),
    ]


def test_import_required_parameters_the_worker_does_not_pass(make_bundle):
    adapter = edit(
        make_bundle.adapter,
        (
            "def prefill_forward(self, tokens, page_table, kv_cache, prompt_lens, **kwargs):",
            "def prefill_forward(self, tokens, page_table, kv_cache, prompt_lens, images,\n"
            "                        cross_page_table, start_pos=None, *, chunk_size):",
        ),
        (
            # A legacy class (no decode_input_update_contract) never gets the commands.
            "def decode_forward(self, tokens, start_pos, page_table, kv_cache, **kwargs):",
            "def decode_forward(self, tokens, start_pos, page_table, kv_cache, *, reload_inputs):",
        ),
    )
    folder = make_bundle("demo", adapter=adapter)
    # The static check reads the same signatures: Mllama's refusal, as the worker gives it.
    static = [(d.code, d.line) for d in validate_path(folder).report.diagnostics]
    assert static == [("TTB202", 19), ("TTB062", 23)]
    found = [(d.code, d.line, d.message) for d in _imported(folder)]
    assert found == [
        (
            "TTB202",
            19,
            "DemoGenerator.prefill_forward requires images, cross_page_table, which the "
            "worker does not pass: it sends images as pixel_values and image_grid_thw, not "
            "Mllama-style cross-attention inputs",
        ),
        (
            "TTB062",
            19,
            "DemoGenerator.prefill_forward requires chunk_size, which the worker does not pass",
        ),
        (
            "TTB062",
            23,
            "DemoGenerator.decode_forward requires reload_inputs, which the worker passes only "
            "to a class declaring decode_input_update_contract = 1",
        ),
    ]


V1_DECODE = "    decode_input_update_contract = 1\n"


def test_import_v1_decode_must_take_the_four_commands(make_bundle, tmp_path):
    models = tmp_path / "models"
    lacking = make_bundle(
        "lacking",
        parent=models,
        metadata={"arch": "LackingForCausalLM"},
        adapter=edit(
            make_bundle.adapter,
            ("    model_capabilities = {", V1_DECODE + "    model_capabilities = {"),
            (
                "def decode_forward(self, tokens, start_pos, page_table, kv_cache, **kwargs):",
                "def decode_forward(self, tokens, start_pos, page_table, kv_cache, *,\n"
                "                       reload_inputs=True, reset_batch):",
            ),
        ),
    )
    # Explicitly, or through **kwargs (forwarded to a base): both accept the commands.
    explicit = make_bundle(
        "explicit",
        parent=models,
        metadata={"arch": "ExplicitForCausalLM"},
        adapter=edit(
            make_bundle.adapter,
            ("    model_capabilities = {", V1_DECODE + "    model_capabilities = {"),
            (
                "def decode_forward(self, tokens, start_pos, page_table, kv_cache, **kwargs):",
                "def decode_forward(self, tokens, start_pos, page_table, kv_cache, *,\n"
                "                       reload_inputs=True, reload_page_table=False,\n"
                "                       reload_sampling_params=False, reset_sampling_state=False):",
            ),
        ),
    )
    make_bundle(
        "forwarded",
        parent=models,
        metadata={"arch": "ForwardedForCausalLM"},
        adapter=edit(
            make_bundle.adapter,
            ("    model_capabilities = {", V1_DECODE + "    model_capabilities = {"),
        ),
    )
    static = validate_path(models).report.diagnostics
    assert {Path(d.file).parent for d in static} == {lacking}, explicit
    assert [d.code for d in static] == ["TTB062", "TTB062"]
    assert "requires reset_batch" in static[1].message
    assert "does not accept reload_page_table" in static[0].message
    diagnostics = _imported(lacking)
    assert [d.message for d in diagnostics] == [
        "DemoGenerator.decode_forward requires reset_batch, which a class declaring "
        "decode_input_update_contract = 1 never receives",
        "DemoGenerator declares decode_input_update_contract = 1, but decode_forward does not "
        "accept reload_page_table, reload_sampling_params, reset_sampling_state: the worker "
        "sends all four commands on every decode",
    ]
    assert "reload_inputs=True, reload_page_table=False" in diagnostics[-1].hint


def test_import_compares_the_real_capabilities(make_bundle):
    """What the static check cannot read (a computed dict), --import compares."""
    adapter = contract_adapter(
        "DemoGenerator",
        preamble="\ndef _capabilities():\n    return {'supports_async_decode': False}\n",
        attributes="    model_capabilities = _capabilities()\n" + READBACK,
    )
    folder = make_bundle("demo", adapter=adapter, metadata={"capabilities": {"async_decode": True}})
    found = [
        (d.code, d.severity, d.pointer, d.line)
        for d in validate_path(folder, import_check=True, timeout=30).report.diagnostics
    ]
    assert found == [
        # static: not known here; --import checked it, so a note, not "run --import"
        ("TTB040", INFO, "/capabilities/async_decode", 9),
        ("TTB056", ERROR, "/capabilities/async_decode", 9),  # --import: declared, unsupported
    ]


def test_import_is_skipped_when_static_errors(make_bundle):
    folder = make_bundle("demo", adapter="raise SystemExit(3)\nclass Other: ...\n")
    codes = [d.code for d in validate_path(folder, import_check=True).report.diagnostics]
    assert codes == ["TTB052"]


TWIN = """from .helpers import VALUE


class DemoGenerator:
    value = VALUE

    @classmethod
    def initialize_vllm_model(cls, **kwargs):
        return cls()

    def allocate_kv_cache(self, **kwargs):
        return None

    def prefill_forward(self, **kwargs):
        return None

    def decode_forward(self, **kwargs):
        return None
"""


def test_bundles_with_the_same_module_names_import_apart(make_bundle, tmp_path):
    models = tmp_path / "models"
    one = make_bundle(
        "one",
        parent=models,
        adapter=TWIN,
        files={"helpers.py": "VALUE = 1\n"},
        metadata={"arch": "OneForCausalLM"},
    )
    two = make_bundle(
        "two",
        parent=models,
        adapter=TWIN,
        files={"helpers.py": "VALUE = 2\n"},
        metadata={"arch": "TwoForCausalLM"},
    )
    result = validate_path(models, import_check=True, timeout=30)
    assert result.report.diagnostics == []

    packages = [package_name(one, "one"), package_name(two, "two")]
    assert packages[0] != packages[1]
    assert all(p.startswith(PACKAGE_PREFIX) and p.isidentifier() for p in packages)
    assert package_name(one, "one") == package_name(one / ".." / "one", "one"), "stable"
    refs = [
        qualified_class(one, "one", "adapter:DemoGenerator"),
        qualified_class(two, "two", "adapter:DemoGenerator"),
    ]
    assert refs == [f"{p}.adapter:DemoGenerator" for p in packages]
    try:
        classes = []
        for ref in refs:
            module, _, name = ref.partition(":")
            classes.append(getattr(importlib.import_module(module), name))
        assert [c.value for c in classes] == [1, 2]
        assert classes[0] is not classes[1]
        assert "adapter" not in sys.modules and "helpers" not in sys.modules
    finally:
        for name in [m for m in sys.modules if m.startswith(tuple(packages))]:
            del sys.modules[name]
