"""The validator on real folders: metadata, the adapter checked statically, sets of bundles,
and `--import` in a subprocess."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

import pytest

from ttbundles.check.validate import validate_bundle, validate_path
from ttbundles.errors import Severity
from ttbundles.registry.loader import PACKAGE_PREFIX, package_name, qualified_class

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
    "model_capabilities disagrees": (
        {"metadata": {"capabilities": {"prefix_caching": True}}},
        [("TTB056", ERROR, META, "/capabilities/prefix_caching", 9)],
        "make them agree (adapter.py:5)",
    ),
    "model_capabilities disagrees the other way": (
        {
            "edits": (
                CAPS_ON["async"],
                ("    def decode_forward", READBACK + "\n    def decode_forward"),
            )
        },
        # Not declared, so not in the file: no line to point at.
        [("TTB056", ERROR, META, "/capabilities/async_decode", None)],
        "make them agree (adapter.py:5)",
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
        [("TTB058", INFO, META, "/main_class", 6)],
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


@pytest.mark.parametrize("kind", ["empty folder", "missing path"])
def test_not_a_bundle(tmp_path, kind):
    path = tmp_path / "x"
    if kind == "empty folder":
        path.mkdir()
    [d] = validate_path(path).report.diagnostics
    assert (d.code, d.severity, d.file) == ("TTB001", ERROR, str(path))


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


def test_overlap_reported_per_pair(make_bundle, tmp_path):
    models = tmp_path / "models"
    for name in ("a", "b", "c"):
        make_bundle(name, parent=models)
    make_bundle("d", parent=models, metadata={"arch": "OtherForCausalLM"})
    pairs = [
        d.message.split(" (")[0] + "/" + d.message.split(") and ")[1].split(" ")[0]
        for d in validate_path(models).report.diagnostics
    ]
    assert pairs == ["a/b", "a/c", "b/c"]


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
    assert validate_path(folder).ok()  # the static check cannot see it
    found = [
        (d.code, d.severity, d.file and Path(d.file).name, d.line, d.message)
        for d in validate_path(folder, import_check=True, timeout=30).report.diagnostics
    ]
    assert found == [
        ("TTB062", ERROR, "demo", None, "initialize_vllm_model must be a classmethod"),
        (
            "TTB062",
            ERROR,
            "adapter.py",
            21,
            "DemoGenerator.decode_forward: does not accept start_pos as keyword arguments",
        ),
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
