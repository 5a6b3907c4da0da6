"""Schema 5: pooling bundles. The metadata declares the pooling tasks and the contract
form; `validate` holds the class to that form (statically and with `--import`);
`migrate` and `list` know them."""

from __future__ import annotations

import json

import pytest
from pydantic import ValidationError

from tests.bundle_factory import contract_adapter
from ttbundles.check.validate import validate_bundle
from ttbundles.format.metadata import BundleMetadata, capability_flags, needs_version
from ttbundles.scaffold.migrate import migrate_bundle

# The reference plugin's form: initialize, then forward on a right-padded batch.
FORWARD_CLASS = '''"""A pooling generator of the form 'forward'."""


class DemoGenerator:
    model_capabilities = {}

    @classmethod
    def initialize_vllm_model(cls, hf_config, mesh_device, max_batch_size, max_seq_len,
                              **kwargs):
        return cls()

    def forward(self, input_ids, attention_mask):
        return input_ids
'''
FORWARD = {"tasks": ["embed", "classify"], "form": "forward"}
HIDDEN = {"tasks": ["embed", "token_embed"], "form": "prefill_hidden"}


def _document(pooling, version=5, **extra):
    return {
        "schema_version": version,
        "name": "pool",
        "version": "1.0.0",
        "arch": "Qwen3ForCausalLM",
        "main_class": "adapter:DemoGenerator",
        "capabilities": {"pooling": pooling},
        **extra,
    }


def _codes(folder, *, import_check=False):
    found = validate_bundle(folder, import_check=import_check, timeout=60).diagnostics
    return [d.code for d in found], found


def test_pooling_is_schema_5_and_needs_it():
    meta = BundleMetadata.model_validate(_document(FORWARD))
    assert meta.capabilities.pooling.tasks == ["embed", "classify"]
    assert needs_version(meta) == 5
    assert BundleMetadata.model_validate(
        _document({"tasks": ["embed"]})
    ).capabilities.pooling.form == ("forward")
    with pytest.raises(ValidationError) as excinfo:
        BundleMetadata.model_validate(_document(FORWARD, version=4))
    assert "TTB020" in str(excinfo.value) or "schema_version 5" in str(excinfo.value)
    assert "capabilities.pooling needs schema_version 5" in str(excinfo.value)


@pytest.mark.parametrize(
    "pooling,says",
    [
        ({"tasks": []}, "at least 1"),
        ({"tasks": ["embed", "embed"]}, "lists a task twice"),
        ({"tasks": ["score"]}, "'embed', 'classify' or 'token_embed'"),
        ({"tasks": ["token_embed"], "form": "forward"}, "token_embed, which needs every position"),
        ({"tasks": ["embed"], "form": "hidden"}, "'forward' or 'prefill_hidden'"),
    ],
)
def test_a_bad_pooling_declaration_is_refused_with_the_reason(pooling, says):
    with pytest.raises(ValidationError) as excinfo:
        BundleMetadata.model_validate(_document(pooling))
    assert says in str(excinfo.value)


def test_list_and_the_start_up_table_say_the_tasks():
    flags = capability_flags({"pooling": {"tasks": ["embed", "classify"], "form": "forward"}})
    assert flags == ["pooling=embed+classify"]


@pytest.mark.parametrize("import_check", [False, True], ids=["static", "import"])
def test_the_forward_form_needs_only_initialize_and_forward(make_bundle, import_check):
    """No KV cache, prefill or decode: a class of the reference plugin's form validates."""
    folder = make_bundle("pool", metadata=_document(FORWARD), adapter=FORWARD_CLASS)
    codes, found = _codes(folder, import_check=import_check)
    assert [d for d in found if d.severity.name == "ERROR"] == [], found
    assert "TTB053" not in codes


@pytest.mark.parametrize("import_check", [False, True], ids=["static", "import"])
def test_the_forward_form_without_forward_lacks_a_contract_method(make_bundle, import_check):
    adapter = FORWARD_CLASS.replace("def forward(self, input_ids, attention_mask)", "def run(self)")
    folder = make_bundle("pool", metadata=_document(FORWARD), adapter=adapter)
    _codes_found, found = _codes(folder, import_check=import_check)
    [d] = [d for d in found if d.code == "TTB053"]
    assert "lacks forward" in d.message


@pytest.mark.parametrize("import_check", [False, True], ids=["static", "import"])
def test_a_forward_the_worker_cannot_call_is_ttb261(make_bundle, import_check):
    adapter = FORWARD_CLASS.replace(
        "def forward(self, input_ids, attention_mask)", "def forward(self, tokens, mask)"
    )
    folder = make_bundle("pool", metadata=_document(FORWARD), adapter=adapter)
    _codes_found, found = _codes(folder, import_check=import_check)
    [d] = [d for d in found if d.code == "TTB271"]
    assert "DemoGenerator.forward" in d.message and "'forward'" in d.message
    assert "input_ids" in d.message


@pytest.mark.parametrize("import_check", [False, True], ids=["static", "import"])
def test_the_hidden_form_needs_prefill_to_take_return_hidden_states(make_bundle, import_check):
    strict = contract_adapter("DemoGenerator").replace(
        "def prefill_forward(self, tokens, page_table, kv_cache, prompt_lens, **kwargs):",
        "def prefill_forward(self, tokens, page_table, kv_cache, prompt_lens):",
    )
    folder = make_bundle("pool", metadata=_document(HIDDEN), adapter=strict)
    _codes_found, found = _codes(folder, import_check=import_check)
    [d] = [d for d in found if d.code == "TTB271"]
    assert "return_hidden_states" in d.message
    # The whole generation contract stays required in this form.
    ok = make_bundle("ok", metadata=_document(HIDDEN), adapter=contract_adapter("DemoGenerator"))
    codes, found = _codes(ok, import_check=import_check)
    assert "TTB271" not in codes and "TTB053" not in codes, found


def test_migrate_declares_a_legacy_pooling_class_as_the_reference_plugin_serves_it(make_bundle):
    legacy = json.dumps({"arch": "BertModel", "main_class": "adapter:DemoGenerator"})
    folder = make_bundle("bge", metadata=legacy, adapter=FORWARD_CLASS)
    result = migrate_bundle(folder)
    document = json.loads(result.after)
    assert result.version == document["schema_version"] == 5
    assert document["capabilities"]["pooling"] == {"tasks": ["embed"], "form": "forward"}
    assert [d for d in validate_bundle(folder).diagnostics if d.severity.name == "ERROR"] == []
