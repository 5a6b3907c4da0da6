"""Schema 3: speculative decoding declared as the reference plugin's class keys, and prompt
logprobs; `validate` holds both to the class, statically and with `--import`."""

from __future__ import annotations

import json

import pytest

from tests.bundle_factory import contract_adapter
from ttbundles.check.validate import validate_bundle
from ttbundles.format.contract import SPEC_KEYS
from ttbundles.format.metadata import BundleMetadata, needs_version
from ttbundles.scaffold.migrate import migrate_bundle

SPEC = {
    "spec_decode": ["ngram", "custom_class"],
    "async_spec_decode": True,
    "async_decode": True,
    "spec_requirements": ["device_propose"],
    "spec_plan": True,
}
CLASS_CAPS = """\
    model_capabilities = {
        "supports_async_decode": True,
        "supports_spec_decode": True,
        "supports_async_spec_decode": True,
        "spec_requirements": ["device_propose"],
    }
"""
METHODS = """\
    @classmethod
    def spec_plan(cls, vllm_config, max_num_seqs, requested_k):
        return None

    def propose_draft_tokens(self, num_drafts, committed_tokens, committed_positions,
                             accepted_counts, hidden=None):
        return None

    def read_decode_output(self, out, async_read=False):
        return out, []

    def process_decode_output_host(self, out, is_tokens=False):
        return out, None
"""


def _adapter(caps: str = CLASS_CAPS, methods: str = METHODS) -> str:
    return contract_adapter("DemoGenerator", attributes=caps + methods)


def _bundle(make_bundle, capabilities=None, adapter=None, version=3):
    return make_bundle(
        "demo",
        metadata={"schema_version": version, "capabilities": capabilities or SPEC},
        adapter=adapter or _adapter(),
    )


def _codes(folder, *, import_check=False):
    return sorted(
        (d.code, d.severity.value)
        for d in validate_bundle(folder, import_check=import_check, timeout=60).diagnostics
    )


@pytest.mark.parametrize("import_check", [False, True], ids=["static", "import"])
def test_a_declaration_the_class_bears_out_is_valid(make_bundle, import_check):
    assert _codes(_bundle(make_bundle), import_check=import_check) == []


def test_spec_keys_need_schema_version_3_and_name_it(make_bundle):
    folder = _bundle(make_bundle, version=2)
    [d] = validate_bundle(folder).diagnostics
    assert d.code == "TTB020" and "capabilities.spec_decode needs schema_version 3" in d.message
    doc = {"schema_version": 3, "name": "d", "version": "1", "arch": "A", "main_class": "m:C"}
    assert needs_version(BundleMetadata.model_validate({**doc, "capabilities": SPEC})) == 3
    plain = BundleMetadata.model_validate({**doc, "capabilities": {"prompt_logprobs": True}})
    assert needs_version(plain) == 3 and needs_version(BundleMetadata.model_validate(doc)) == 1


@pytest.mark.parametrize(
    ("capabilities", "words"),
    [
        ({"spec_plan": True}, "without spec_decode"),
        ({"spec_decode": ["custom_class"]}, "needs device_propose"),
        (
            {"spec_decode": ["ngram"], "spec_requirements": ["hidden_feed"]},
            "spec_hidden_handoff is empty",
        ),
    ],
)
def test_a_declaration_that_contradicts_itself_is_ttb234(make_bundle, capabilities, words):
    [d] = validate_bundle(_bundle(make_bundle, capabilities)).diagnostics
    assert d.code == "TTB234" and words in d.message, d.message


@pytest.mark.parametrize("import_check", [False, True], ids=["static", "import"])
def test_declaring_beyond_the_class_is_ttb230(make_bundle, import_check):
    caps = CLASS_CAPS.replace('"supports_async_spec_decode": True', '"x": 1')
    capabilities = {**SPEC, "spec_requirements": ["device_propose", "drafter_scores"]}
    found = validate_bundle(
        _bundle(make_bundle, capabilities, _adapter(caps)), import_check=import_check
    ).diagnostics
    errors = sorted(d.message for d in found if d.code == "TTB230")
    assert len(errors) == 2, [d.message for d in found]
    assert "async_spec_decode declares True" in errors[0]
    assert "does not list 'supports_async_spec_decode'" in errors[0]
    assert "'drafter_scores'" in errors[1]


def test_a_class_without_the_gate_refuses_every_method(make_bundle):
    caps = CLASS_CAPS.replace('"supports_spec_decode": True', '"supports_spec_decode": False')
    found = validate_bundle(_bundle(make_bundle, adapter=_adapter(caps))).diagnostics
    [d] = [d for d in found if d.code == "TTB230"]
    assert "spec_decode declares ['ngram', 'custom_class']" in d.message
    assert "'supports_spec_decode': False" in d.message


def test_declaring_less_than_the_class_is_a_warning(make_bundle):
    folder = make_bundle("demo", adapter=_adapter())  # schema 1: no speculative keys
    [d] = [d for d in validate_bundle(folder).diagnostics if d.code == "TTB231"]
    assert d.severity.value == "warning" and "speculative decoding is refused" in d.message


@pytest.mark.parametrize("import_check", [False, True], ids=["static", "import"])
@pytest.mark.parametrize(
    ("methods", "code", "words"),
    [
        (METHODS.replace("    @classmethod\n", ""), "TTB232", "must be a classmethod"),
        (
            METHODS.replace("max_num_seqs, requested_k", "max_num_seqs"),
            "TTB232",
            "spec_plan(vllm_config, max_num_seqs, requested_k)",
        ),
        (METHODS.replace("def propose_draft_tokens", "def propose_drafts"), "TTB233", "lacks"),
        (
            METHODS.replace("accepted_counts, hidden=None", "accepted_counts, tree"),
            "TTB233",
            "propose_draft_tokens",
        ),
    ],
    ids=["plan-not-classmethod", "plan-arity", "no-drafter", "drafter-signature"],
)
def test_the_methods_a_declaration_needs(make_bundle, methods, code, words, import_check):
    folder = _bundle(make_bundle, adapter=_adapter(methods=methods))
    found = validate_bundle(folder, import_check=import_check, timeout=60).diagnostics
    [d] = [d for d in found if d.code == code]
    assert words in d.message and d.is_error, d.message


@pytest.mark.parametrize("import_check", [False, True], ids=["static", "import"])
def test_the_verify_needs_decode_forward_to_take_its_keywords(make_bundle, import_check):
    adapter = _adapter().replace(
        "def decode_forward(self, tokens, start_pos, page_table, kv_cache, **kwargs):",
        "def decode_forward(self, tokens, start_pos, page_table, kv_cache, spec_mode=None):",
    )
    found = validate_bundle(
        _bundle(make_bundle, adapter=adapter), import_check=import_check, timeout=60
    ).diagnostics
    [d] = [d for d in found if d.code == "TTB233"]
    assert "num_valid_drafts" in d.message and "accepted_counts" in d.message


@pytest.mark.parametrize("import_check", [False, True], ids=["static", "import"])
def test_prompt_logprobs_need_prefill_to_take_the_keyword(make_bundle, import_check):
    adapter = contract_adapter("DemoGenerator").replace(
        "def prefill_forward(self, tokens, page_table, kv_cache, prompt_lens, **kwargs):",
        "def prefill_forward(self, tokens, page_table, kv_cache, prompt_lens):",
    )
    folder = make_bundle(
        "demo",
        metadata={"schema_version": 3, "capabilities": {"prompt_logprobs": True}},
        adapter=adapter,
    )
    found = validate_bundle(folder, import_check=import_check, timeout=60).diagnostics
    [d] = [d for d in found if d.code == "TTB240"]
    assert "return_prompt_logits" in d.message
    ok = make_bundle(
        "ok",
        metadata={"schema_version": 3, "capabilities": {"prompt_logprobs": True}},
        adapter=contract_adapter("DemoGenerator"),
    )
    assert [d for d in validate_bundle(ok).diagnostics if d.code == "TTB240"] == []


def test_migrate_carries_the_class_speculation_at_schema_3(make_bundle):
    legacy = json.dumps({"arch": "LlamaForCausalLM", "main_class": "adapter:DemoGenerator"})
    folder = make_bundle("demo", metadata=legacy, adapter=_adapter())
    result = migrate_bundle(folder)
    document = json.loads(result.after)
    assert result.version == document["schema_version"] == 3
    caps = document["capabilities"]
    assert caps["spec_decode"] == ["ngram", "custom_class"]
    assert caps["spec_requirements"] == ["device_propose"] and caps["spec_plan"] is True
    assert caps["async_spec_decode"] is True
    assert [d.code for d in validate_bundle(folder).diagnostics] == []
    again = migrate_bundle(folder)
    assert not again.changed and again.version == 3


def test_every_spec_key_of_the_plugin_is_mirrored():
    fields = set(BundleMetadata.model_fields["capabilities"].annotation.model_fields)
    assert set(SPEC_KEYS.values()) <= fields
