"""The contract-keys table (`format.contract_keys`) covers every name the contract twins use.

Each twin (`tests/twins/families.py`) carries a TT-Metal class's real declarations and
signatures, so a name found on one is a name TT-Metal's classes use: its class
attributes, its public methods, its `model_capabilities` keys, and the keywords its
prefill, decode and warm-up accept (as the worker's binding reads them, following a
`**kwargs` that is only forwarded). A name missing from the table would be a key the
worker neither drives nor refuses knowingly: this test fails on it.
"""

from __future__ import annotations

import importlib.util
import inspect
import sys
from pathlib import Path

import pytest

from ttbundles.format import contract_keys as keys
from ttbundles.format.forwarding import accepted_keywords

FAMILIES = Path(__file__).parent / "twins" / "families.py"


def _twins() -> list[type]:
    spec = importlib.util.spec_from_file_location("twin_families_for_keys", FAMILIES)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return [
        cls
        for cls in vars(module).values()
        if isinstance(cls, type)
        and cls.__module__ == module.__name__
        and hasattr(cls, "initialize_vllm_model")
    ]


TWINS = _twins()
HELPERS = {"core", "executor", "model_args"}  # the twins' own plumbing, not TT-Metal's


def names_of(cls: type) -> dict[str, set[str]]:
    """What a twin uses, by kind of the table."""
    found: dict[str, set[str]] = {k: set() for k in ("class attribute", "method")}
    for owner in cls.__mro__:
        if owner is object or owner.__module__ != cls.__module__ or owner.__name__ == "_Wrapped":
            continue
        for name, value in vars(owner).items():
            if name.startswith("__") or name in HELPERS:
                continue
            function = value.__func__ if isinstance(value, classmethod | staticmethod) else value
            if inspect.isfunction(function) or isinstance(value, property):
                if not name.startswith("_"):
                    found["method"].add(name)
            else:
                found["class attribute"].add(name)
    found["capability"] = set(getattr(cls, "model_capabilities", None) or {})
    for kind, method in (
        ("prefill", "prefill_forward"),
        ("decode", "decode_forward"),
        ("warm-up", keys.WARMUP_PREFILL),
    ):
        function = getattr(cls, method, None)
        if function is None:
            continue
        parameters = list(inspect.signature(function).parameters.values())[1:]  # self
        named = {p.name for p in parameters if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}
        found[kind] = (named | set(accepted_keywords(cls, function).names)) - {"self"}
    return found


@pytest.mark.parametrize("twin", TWINS, ids=lambda cls: cls.__name__)
def test_every_name_a_twin_uses_is_in_the_table(twin):
    missing = [
        f"{kind} {name!r}"
        for kind, names in names_of(twin).items()
        for name in sorted(names)
        if not keys.known(kind, name)  # type: ignore[arg-type]
    ]
    assert not missing, f"{twin.__name__}: not in format/contract_keys.py: {', '.join(missing)}"


def test_the_table_fails_on_a_new_key():
    """The check itself: a class with a key the table lacks is caught."""

    class NewClass:
        model_capabilities = {"supports_something_new": True}
        brand_new_attribute = 1

    found = names_of(NewClass)
    assert not keys.known("capability", "supports_something_new")
    assert not keys.known("class attribute", "brand_new_attribute")
    assert found["capability"] == {"supports_something_new"}
    assert "brand_new_attribute" in found["class attribute"]


def test_each_row_is_driven_refused_with_a_code_or_irrelevant_with_why():
    from ttbundles.codes import CODES

    for row in keys.CONTRACT_KEYS:
        assert row.handling in ("driven", "refused", "irrelevant"), row
        assert row.meaning.strip(), row
        if row.handling == "refused":
            assert row.code in CODES, row
        if row.code is not None:
            assert row.code in CODES, row


def test_the_keys_of_the_newest_classes_are_listed():
    for kind, name in [
        ("prefill", "prefill_output_mask"),
        ("prefill", "original_prompt_lens"),
        ("prefill", "start_pos"),
        ("capability", "supports_intermediate_prefill_output_mask"),
        ("capability", "supports_prefill_sampling_origins"),
        ("decode", "reuse_device_decode_inputs"),
        ("class attribute", "requires_prefill_trace_warmup"),
        ("method", "release_persistent_capture"),
    ]:
        assert keys.KEYS_BY_KIND[kind][name].handling == "driven", name


NEWEST_TWINS = {
    "KolibriForCausalLM": {
        "async_decode": True,
        "chunked_prefill": True,
        "sample_on_device": ["decode_only", "all"],
    },
    "ExecutorLlama3Generator": {
        "prefix_caching": True,
        "async_decode": True,
        "sample_on_device": ["decode_only", "all"],
    },
    # As tests/test_block_output.py plans it (synchronous, device-sampled).
    "BlockOutputForCausalLM": {
        "sample_on_device": ["decode_only", "all"],
        "chunked_prefill": True,
        "prefix_caching": True,
    },
}


def _clean(bundle: Path) -> None:
    from ttbundles.check.validate import validate_bundle

    for imported in (False, True):
        report = validate_bundle(bundle, import_check=imported, timeout=300)
        problems = [d for d in report.diagnostics if d.severity.name != "INFO"]
        assert not problems, [f"{d.code} {d.message}" for d in problems]


@pytest.mark.parametrize("name", NEWEST_TWINS)
def test_the_newest_twins_validate_clean_static_and_imported(tmp_path, name):
    """The Kolibri autoport, Llama 3 executor and block-output twins, as bundles the
    server tests serve (`tests/test_contract_twins.py`, `tests/test_block_output.py`):
    nothing to report, read statically or imported."""
    import json

    bundle = tmp_path / f"twin-{name.lower()}"
    bundle.mkdir()
    (bundle / "adapter.py").write_text(FAMILIES.read_text())
    metadata = {
        "schema_version": 1,
        "name": bundle.name,
        "version": "1.0.0",
        "arch": "LlamaForCausalLM",
        "main_class": f"adapter:{name}",
        "capabilities": NEWEST_TWINS[name],
    }
    (bundle / "vllm_metadata.json").write_text(json.dumps(metadata))
    _clean(bundle)


def test_the_gemma4_31b_autoport_twin_validates_clean_static_and_imported(tmp_path, monkeypatch):
    """The Gemma 4 31B autoport twin as `tests/test_contract_twins.py` serves it: an
    environment class of a TT-Metal checkout's layout (found above the bundle statically,
    on the path when imported), async decode and the class's KV specs declared."""
    from tests.test_contract_twins import gemma4_31b_bundle

    tt_metal = tmp_path / "tt-metal"
    bundles = gemma4_31b_bundle(tt_metal)
    monkeypatch.setenv("PYTHONPATH", str(tt_metal))  # the --import check's process
    monkeypatch.syspath_prepend(str(tt_metal))  # the static check's environment
    try:
        _clean(bundles / "twin-gemma4-31b")
    finally:  # the checkout's `models` package is this test's only
        for module in [m for m in sys.modules if m == "models" or m.startswith("models.")]:
            del sys.modules[module]
