"""Recurrent-state and SSM checkpoints, as a new user meets them: described truly and
refused with a code (never a traceback, never a plan that calls a Mamba layer full
attention), and the format's `capabilities.recurrent_state` (schema 6), checked by
`validate` against the class."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from tests.bundle_factory import contract_adapter, metadata, write_bundle
from tests.recurrent_checkpoints import BUILDERS, write_recurrent_checkpoint
from ttbundles.check.validate import validate_bundle
from ttbundles.format.metadata import capability_flags, needs_version
from ttbundles.format.parse import parse_metadata

STATE = {"recurrent_state": {"owner": "generator"}}


def _codes(report) -> list[str]:
    return [d.code for d in report.diagnostics]


def _parse(document: dict):
    """(the model or None, the diagnostics' "CODE message" lines)."""
    loaded = parse_metadata(json.dumps(document), file=Path("vllm_metadata.json"))
    return loaded.metadata, [f"{d.code} {d.message}" for d in loaded.diagnostics]


def _no_traceback(done):
    assert "Traceback" not in done.stdout + done.stderr, done.stdout + done.stderr
    return done


# --- the format --------------------------------------------------------------------------


def test_recurrent_state_is_schema_6_and_listed_with_its_owner():
    meta, problems = _parse(metadata("gdn", schema_version=6, capabilities=STATE))
    assert problems == []
    assert meta.capabilities.recurrent_state.owner == "generator"
    assert meta.capabilities.recurrent_state.layers == "from_config"
    assert needs_version(meta) == 6
    flags = capability_flags(meta.model_dump(mode="json")["capabilities"])
    assert "recurrent_state=generator" in flags


def test_a_lower_schema_version_with_recurrent_state_is_refused():
    meta, problems = _parse(metadata("gdn", schema_version=5, capabilities=STATE))
    assert meta is None and any(p.startswith("TTB020") and "6" in p for p in problems), problems


@pytest.mark.parametrize(
    ("state", "words"),
    [
        ({"owner": "device"}, "owner"),
        ({"owner": "vllm", "layers": [0, 0]}, "lists a layer twice"),
        ({"owner": "vllm", "layers": []}, "is empty"),
        ({"owner": "vllm", "layers": [-1]}, "recurrent_state.layers [-1] is not"),
        ({"owner": "vllm", "layers": "all"}, "recurrent_state.layers 'all' is not"),
    ],
)
def test_a_bad_declaration_is_refused_by_the_format(state, words):
    meta, problems = _parse(
        metadata("gdn", schema_version=6, capabilities={"recurrent_state": state})
    )
    assert meta is None and any(words in p for p in problems), problems


# --- validate ------------------------------------------------------------------------------


def _bundle(tmp_path: Path, capabilities: dict, class_caps: str | None, **fields) -> Path:
    attributes = f"    model_capabilities = {class_caps}\n" if class_caps is not None else ""
    document = metadata("gdn", arch="Qwen3_5ForCausalLM", capabilities=capabilities, **fields)
    return write_bundle(
        tmp_path / "gdn",
        document=document,
        files={"adapter.py": contract_adapter(attributes=attributes)},
    )


def test_validate_warns_that_a_recurrent_architecture_keeps_undeclared_state(tmp_path):
    report = validate_bundle(_bundle(tmp_path, {}, None))
    [warning] = [d for d in report.diagnostics if d.code == "TTB042"]
    assert "Qwen3_5ForCausalLM keeps recurrent state" in warning.message
    assert "gated delta net" in warning.message and "TTB274" in warning.message
    assert not report.errors


def test_validate_takes_a_declaration_the_class_mirrors(tmp_path):
    folder = _bundle(tmp_path, STATE, '{"recurrent_state": "generator"}', schema_version=6)
    report = validate_bundle(folder, import_check=True)
    assert not report.errors, report.errors
    assert "TTB042" not in _codes(report)


def test_a_class_without_the_key_is_an_error(tmp_path):
    folder = _bundle(tmp_path, STATE, "{}", schema_version=6)
    [error] = validate_bundle(folder).errors
    assert error.code == "TTB056" and "'recurrent_state'" in error.message
    assert error.pointer == "/capabilities/recurrent_state"


@pytest.mark.parametrize("import_check", [False, True], ids=["static", "import"])
def test_a_class_naming_the_other_owner_is_an_error(tmp_path, import_check):
    folder = _bundle(tmp_path, STATE, '{"recurrent_state": "vllm"}', schema_version=6)
    errors = validate_bundle(folder, import_check=import_check).errors
    assert [e.code for e in errors] == ["TTB056"], errors
    assert "owner is 'generator'" in errors[0].message and "'vllm'" in errors[0].message
    assert errors[0].pointer == "/capabilities/recurrent_state/owner"


def test_init_reference_gives_the_reason_for_a_recurrent_architecture(run_cli, tmp_path):
    done = _no_traceback(
        run_cli("init", tmp_path / "b", "--arch", "JambaForCausalLM", "--reference")
    )
    assert done.returncode != 0
    out = done.stdout + done.stderr
    assert "TTB041" in out and "Mamba layers keep recurrent state" in out


def test_a_template_for_a_recurrent_architecture_validates_with_a_warning(run_cli, tmp_path):
    folder = tmp_path / "qwen"
    assert _no_traceback(run_cli("init", folder, "--arch", "Qwen3_5ForCausalLM")).returncode == 0
    done = _no_traceback(run_cli("validate", folder))
    assert done.returncode == 0 and "TTB042" in done.stdout + done.stderr


def test_migrate_keeps_the_version_recurrent_state_needs(run_cli, tmp_path):
    folder = write_bundle(
        tmp_path / "gdn",
        document=metadata("gdn", schema_version=6, capabilities=STATE),
    )
    _no_traceback(run_cli("migrate", folder))
    document = json.loads((folder / "vllm_metadata.json").read_text())
    assert document["schema_version"] == 6
    assert document["capabilities"]["recurrent_state"] == {"owner": "generator"}


# --- the vLLM-owned form: init --reference --recurrent-owner vllm, and validate ----------

VLLM_STATE = {"recurrent_state": {"owner": "vllm"}}
_VLLM_CLASS = '''"""A class whose recurrent state vLLM's KV manager owns."""


class Generator:
    model_capabilities = {{"recurrent_state": "vllm"}}

    @classmethod
    def initialize_vllm_model(cls, hf_config, mesh_device, max_batch_size, max_seq_len,
                              **kwargs):
        return cls()

{allocate}
    def prefill_forward(self, tokens, page_table, kv_cache, prompt_lens, empty_slots=None):
        return None

    def decode_forward(self, tokens, start_pos, page_table=None, kv_cache=None{indices}):
        return None
'''
_PER_LAYER = """
    def allocate_kv_cache_per_layer(self, per_layer_specs):
        return []
"""
_WHOLE = """
    def allocate_kv_cache(self, kv_cache_shape, dtype, num_layers):
        return []
"""


_COPY = """
    def copy_recurrent_state(self, sources, targets):
        return None
"""


def _vllm_owned_bundle(
    tmp_path: Path, *, allocate: bool, indices: bool, caching: bool = False, copy: bool = False
) -> Path:
    source = _VLLM_CLASS.format(
        allocate=(_PER_LAYER if allocate else _WHOLE) + (_COPY if copy else ""),
        indices=", gdn_state_indices=None" if indices else "",
    )
    if caching:
        source = source.replace(
            '{"recurrent_state": "vllm"}',
            '{"recurrent_state": "vllm", "supports_prefix_caching": True}',
        )
    caps = {**VLLM_STATE, "prefix_caching": True} if caching else VLLM_STATE
    document = metadata("gdn", arch="Qwen3_5ForCausalLM", schema_version=6, capabilities=caps)
    return write_bundle(tmp_path / "gdn", document=document, files={"adapter.py": source})


@pytest.mark.parametrize("import_check", [False, True], ids=["static", "import"])
def test_validate_takes_a_vllm_owned_class_with_its_allocator_and_indices(tmp_path, import_check):
    folder = _vllm_owned_bundle(tmp_path, allocate=True, indices=True)
    report = validate_bundle(folder, import_check=import_check)
    assert not report.errors, report.errors


@pytest.mark.parametrize("import_check", [False, True], ids=["static", "import"])
def test_validate_refuses_a_vllm_owned_class_without_per_layer_allocation(tmp_path, import_check):
    folder = _vllm_owned_bundle(tmp_path, allocate=False, indices=True)
    errors = validate_bundle(folder, import_check=import_check).errors
    assert {e.code for e in errors} == {"TTB054"}, errors
    assert all("owner 'vllm'" in e.message for e in errors)
    assert "allocate_kv_cache_per_layer" in errors[0].message


@pytest.mark.parametrize("import_check", [False, True], ids=["static", "import"])
def test_validate_refuses_a_vllm_owned_decode_without_state_indices(tmp_path, import_check):
    folder = _vllm_owned_bundle(tmp_path, allocate=True, indices=False)
    errors = validate_bundle(folder, import_check=import_check).errors
    assert {e.code for e in errors} == {"TTB053"}, errors
    assert "decode_forward takes no gdn_state_indices" in errors[0].message


@pytest.mark.parametrize("import_check", [False, True], ids=["static", "import"])
@pytest.mark.parametrize("copy", [False, True], ids=["without-copy", "with-copy"])
def test_validate_wants_the_copy_method_of_a_vllm_owned_class_with_prefix_caching(
    tmp_path, import_check, copy
):
    folder = _vllm_owned_bundle(tmp_path, allocate=True, indices=True, caching=True, copy=copy)
    errors = validate_bundle(folder, import_check=import_check).errors
    if copy:
        assert not errors, errors
        return
    assert {e.code for e in errors} == {"TTB054"}, errors
    assert "lacks copy_recurrent_state" in errors[0].message


def test_a_generator_owned_class_needs_no_state_indices(tmp_path):
    folder = _vllm_owned_bundle(tmp_path, allocate=False, indices=False)
    document = json.loads((folder / "vllm_metadata.json").read_text())
    document["capabilities"] = {"recurrent_state": {"owner": "generator"}}
    (folder / "vllm_metadata.json").write_text(json.dumps(document))
    source = (folder / "adapter.py").read_text().replace('"vllm"', '"generator"')
    (folder / "adapter.py").write_text(source)
    assert not validate_bundle(folder, import_check=True).errors


@pytest.mark.parametrize("arch", ["Qwen3_5ForCausalLM", "Qwen3_5ForConditionalGeneration"])
def test_init_reference_makes_the_vllm_owned_form_that_validates_strictly(run_cli, tmp_path, arch):
    """`--recurrent-owner vllm`: the reference's vLLM-owned class, owner 'vllm' in the
    metadata and the class, no prefix caching, speculation or pooling declared; it
    validates strictly, statically and imported."""
    folder = tmp_path / "q"
    done = _no_traceback(
        run_cli("init", folder, "--arch", arch, "--reference", "--recurrent-owner", "vllm")
    )
    assert done.returncode == 0, done.stderr
    source = (folder / "adapter.py").read_text()
    assert "from ttbundles.reference.qwen3_5 import ReferenceQwen3_5VllmStateGenerator" in source
    assert '"recurrent_state": "vllm"' in source
    assert "gdn_state_indices: Any = None" in source
    assert "gdn_state_indices=gdn_state_indices" in source
    assert "recurrent_prefix_snapshots" not in source and "def release_request" not in source
    assert '"supports_prefix_caching": True' in source
    assert "def copy_recurrent_state(self, sources: Any, targets: Any)" in source
    document = json.loads((folder / "vllm_metadata.json").read_text())
    caps = document["capabilities"]
    assert document["schema_version"] == 6
    assert caps["recurrent_state"] == {"owner": "vllm", "layers": "from_config"}
    assert caps["prefix_caching"] is True and caps["kv_cache_spec"] is True
    assert not {"spec_decode", "spec_plan", "async_spec_decode", "pooling"} & set(caps)
    for flags in (["--strict"], ["--strict", "--import"]):
        done = _no_traceback(run_cli("validate", *flags, folder))
        assert done.returncode == 0 and "0 warnings" in done.stdout, done.stdout + done.stderr


def test_init_reference_defaults_to_the_generator_owned_form(run_cli, tmp_path):
    folder = tmp_path / "q"
    args = ("init", folder, "--arch", "Qwen3_5ForCausalLM", "--reference")
    assert _no_traceback(run_cli(*args, "--recurrent-owner", "generator")).returncode == 0
    caps = json.loads((folder / "vllm_metadata.json").read_text())["capabilities"]
    assert caps["recurrent_state"]["owner"] == "generator" and caps["prefix_caching"] is True


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (
            ["--arch", "LlamaForCausalLM", "--reference", "--recurrent-owner", "vllm"],
            "--recurrent-owner vllm: LlamaForCausalLM keeps no recurrent state",
        ),
        (
            ["--arch", "Qwen3_5ForCausalLM", "--recurrent-owner", "vllm"],
            "--recurrent-owner chooses the reference class of a recurrent family: it "
            "needs --reference",
        ),
        (
            ["--arch", "Qwen3_5ForCausalLM", "--reference", "--recurrent-owner", "device"],
            "--recurrent-owner 'device' is not an owner of recurrent state (generator, vllm)",
        ),
    ],
    ids=["not-recurrent", "no-reference", "unknown-owner"],
)
def test_init_refuses_a_recurrent_owner_it_cannot_serve(run_cli, tmp_path, args, words):
    done = _no_traceback(run_cli("init", tmp_path / "b", *args))
    assert done.returncode == 1 and not (tmp_path / "b").exists()
    assert f"error TTB033 {words}" in done.stderr, done.stderr


# --- vLLM's Mamba cache fields when caching is off --------------------------------------------


def test_caching_off_sets_vllms_mamba_fields_back_so_its_check_passes():
    """vLLM's hybrid hook chose "align" and a block of 16 for caching on; the planner
    turned caching off: the three fields go back to vLLM's caching-off values, and
    vLLM's own validator takes the pair it refused before (TTB209)."""
    from types import SimpleNamespace

    from vllm.config import CacheConfig, VllmConfig

    from ttbundles.serving.planning.recurrent import settle_mamba_cache

    cache = CacheConfig(block_size=16, enable_prefix_caching=False)
    cache.mamba_cache_mode, cache.mamba_block_size, cache.mamba_page_size_padded = (
        "align",
        16,
        4096,
    )
    config = SimpleNamespace(cache_config=cache, model_config=SimpleNamespace(max_model_len=256))
    check = VllmConfig.validate_mamba_block_size
    check = getattr(check, "__func__", check)
    with pytest.raises(ValueError, match="mamba-block-size"):
        check(config)
    settle_mamba_cache(config)
    assert (cache.mamba_cache_mode, cache.mamba_block_size, cache.mamba_page_size_padded) == (
        "none",
        256,
        None,
    )
    assert check(config) is config


# --- ttbundle plan, through the CLI in process ---------------------------------------------

KINDS = {
    "Qwen3_5ForCausalLM": "6 linear-attention (gated delta net) layers with recurrent state, "
    "2 full-attention layers",
    "Qwen3NextForCausalLM": "6 linear-attention (gated delta net) layers with recurrent "
    "state, 2 full-attention layers",
    "JambaForCausalLM": "2 Mamba layers with recurrent state, 2 full-attention layers",
    "FalconH1ForCausalLM": "4 parallel attention + Mamba2 layers (a KV cache and recurrent "
    "state each)",
    "MambaForCausalLM": "4 Mamba layers with recurrent state",
}


@pytest.fixture(scope="module")
def recurrent_checkpoints(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("recurrent")
    return {arch: write_recurrent_checkpoint(arch, root / arch) for arch in BUILDERS}


def _plan(run_cli, models: Path, checkpoint: Path, *extra: str):
    env = {"EXTRA_MODELS_DIR": str(models), "MESH_DEVICE": "HOST", "TT_VLLM_BUILTIN_MODELS": "0"}
    args = ["plan", "--model", checkpoint, "--max-model-len", "256", "--max-num-seqs", "8"]
    return _no_traceback(run_cli(*args, *extra, env=env, timeout=300))


@pytest.mark.parametrize("arch", list(BUILDERS))
def test_plan_of_a_template_bundle_says_the_layer_kinds_and_refuses(
    run_cli, recurrent_checkpoints, tmp_path, arch
):
    """`ttbundle init --arch ARCH` then `ttbundle plan`: one line, TTB274, the true
    layer kinds (not vLLM's "--mamba-block-size can only be set with
    --enable-prefix-caching", TTB209, and not "full-attention layers" for Mamba)."""
    models = tmp_path / "models"
    models.mkdir()
    assert run_cli("init", models / "t", "--arch", arch).returncode == 0
    done = _plan(run_cli, models, recurrent_checkpoints[arch])
    out = done.stdout + done.stderr
    assert done.returncode == 1, out
    assert "TTB274" in out and "TTB209" not in out, out
    assert f"serves {arch}: {KINDS[arch]};" in out
    assert "does not declare capabilities.recurrent_state" in out
    assert "not served yet" in out


def test_plan_of_a_generator_owned_state_says_its_bytes_and_capacity(
    run_cli, recurrent_checkpoints, tmp_path
):
    """Qwen3.5 (6 GDN layers of conv 3 x 64 and state 4 x 8 x 8, float32 on the host):
    (192 + 256) x 4 B x 6 = 10,752 B a request; 8 requests; 2 attention layers of 2 KV
    heads x 16 x 2 B x 2 = 256 B a token (vLLM's spec counts the model's bfloat16; the
    reference keeps float32 beside it). The generator's slots are served: a plan."""
    models = tmp_path / "models"
    document = metadata("gdn", arch="Qwen3_5ForCausalLM", schema_version=6, capabilities=STATE)
    write_bundle(models / "gdn", document=document)
    done = _plan(
        run_cli, models, recurrent_checkpoints["Qwen3_5ForCausalLM"],
        "--kv-cache-memory-bytes", "1000000", "--format", "json",
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    [decision] = [
        d for d in json.loads(done.stdout)["decisions"] if d["setting"] == "recurrent_state"
    ]
    reason = decision["reason"]
    assert (decision["requested"], decision["effective"]) == ("generator", "the generator's slots")
    assert "state 10,752 B per request (1,792 B per recurrent layer)" in reason
    assert "8 requests (max_num_seqs) hold 86,016 B" in reason
    # (1,000,000 - 86,016) // 256 tokens
    assert "capacity 8 requests, 3,570 tokens of attention KV in 1,000,000 B" in reason
    assert "(256 B a token)" in reason


def test_plan_of_a_vllm_owned_state_serves_mamba_groups_on_the_hybrid_manager(
    run_cli, recurrent_checkpoints, tmp_path
):
    """Owner 'vllm' (MambaSpec groups): the hybrid manager on, "none" mode, the GDN
    layer's state (1,792 B, float32 on the host) within an attention page (2 KV heads x
    16 x 2 x 2 B = 128 B a token, bfloat16 as vLLM's spec counts it: a block of at least
    14 tokens), 6 GDN layers beside 2 attention ones in 3 Mamba groups."""
    models = tmp_path / "models"
    state = {"recurrent_state": {"owner": "vllm"}}
    document = metadata("gdn", arch="Qwen3_5ForCausalLM", schema_version=6, capabilities=state)
    write_bundle(models / "gdn", document=document)
    done = _plan(run_cli, models, recurrent_checkpoints["Qwen3_5ForCausalLM"], "--format", "json")
    assert done.returncode == 0, done.stdout + done.stderr
    plan = json.loads(done.stdout)
    decisions = {d["setting"]: d for d in plan["decisions"]}
    state_decision = decisions["recurrent_state"]
    assert state_decision["effective"] == "vLLM's MambaSpec groups", state_decision
    reason = state_decision["reason"]
    assert "3 Mamba groups, one block each per request" in reason, reason
    assert "the state 1,792 B, padded to the attention block of" in reason, reason
    assert decisions["kv_cache"]["effective"] == "hybrid groups"
    assert "Mamba blocks in one pool" in decisions["kv_cache"]["reason"]


def test_plan_of_a_vllm_owned_state_with_prefix_caching_is_vllms_align_mode(
    run_cli, recurrent_checkpoints, tmp_path
):
    """Owner 'vllm', prefix caching declared, a class that copies states between Mamba
    blocks: vLLM's "align" mode, the Mamba block the grown attention block, and the plan
    says what a hit restores."""
    models = tmp_path / "models"
    caps = {"recurrent_state": {"owner": "vllm"}, "prefix_caching": True, "chunked_prefill": True}
    document = metadata("gdn", arch="Qwen3_5ForCausalLM", schema_version=6, capabilities=caps)
    adapter = contract_adapter(
        attributes="    def copy_recurrent_state(self, sources, targets):\n        pass\n"
    )
    write_bundle(models / "gdn", document=document, files={"adapter.py": adapter})
    done = _plan(run_cli, models, recurrent_checkpoints["Qwen3_5ForCausalLM"], "--format", "json")
    assert done.returncode == 0, done.stdout + done.stderr
    decisions = {d["setting"]: d for d in json.loads(done.stdout)["decisions"]}
    reason = decisions["recurrent_state"]["reason"]
    # The block is the release's (64 on 0.34, whose hybrid hook picks it; 16 on 0.33),
    # the Mamba block the same.
    [block] = re.findall(r"position-indexed blocks of (\d+) tokens each per request", reason)
    assert '("align" mode' in reason and "3 Mamba groups" in reason, reason
    assert f"padded to the attention block of {block} tokens" in reason
    caching = decisions["prefix_caching"]
    assert caching["effective"] == '"align"', caching
    assert (
        "the gated delta net state its cached Mamba block kept after exactly the hit's "
        in (caching["reason"])
    )


@pytest.mark.parametrize(
    "capabilities,extra,words",
    [
        pytest.param(
            {"recurrent_state": {"owner": "vllm"}, "prefix_caching": True},
            [],
            "prefix caching without chunked prefill (vLLM's \"align\" mode ends prefill "
            "chunks on Mamba block boundaries) is not served yet",
            id="vllm-owned-prefix-caching-without-chunked-prefill",
        ),
        pytest.param(
            {"recurrent_state": {"owner": "vllm"}, "prefix_caching": True,
             "chunked_prefill": True},
            [],
            "prefix caching with recurrent state vLLM's KV manager owns (vLLM's \"align\" "
            "mode) needs adapter:Generator.copy_recurrent_state(sources, targets), which "
            "it lacks",
            id="vllm-owned-prefix-caching-without-the-copy",
        ),
        pytest.param(
            {"recurrent_state": {"owner": "vllm"}},
            ["--disable-hybrid-kv-cache-manager"],
            "--disable-hybrid-kv-cache-manager (MambaSpec groups live in vLLM's hybrid "
            "KV-cache manager only) is not served yet",
            id="vllm-owned-without-the-hybrid-manager",
        ),
        pytest.param(
            {**STATE, "prefix_caching": True},
            [],
            "prefix caching without snapshots of the state (a hit would skip tokens whose "
            "state was never saved) is not served yet",
            id="prefix-caching-without-snapshots",
        ),
        pytest.param(
            {**STATE, "execution": "single"},
            ["--data-parallel-size", "2"],
            "in-process data-parallel lanes (a lane's rows in the class's state slots are "
            "not driven or tested yet",
            id="lanes",
        ),
        pytest.param(
            {**STATE, "spec_decode": ["ngram"], "spec_plan": True},
            ["--speculative-config", '{"method": "ngram", "num_speculative_tokens": 2, '
             '"prompt_lookup_max": 3}'],
            "speculative decoding (a verify would advance the state",
            id="speculation",
        ),
    ],
)  # fmt: skip
def test_plan_refuses_what_a_state_slot_cannot_follow(
    run_cli, recurrent_checkpoints, tmp_path, capabilities, extra, words
):
    models = tmp_path / "models"
    document = metadata(
        "gdn", arch="Qwen3_5ForCausalLM", schema_version=6, capabilities=capabilities
    )
    write_bundle(models / "gdn", document=document)
    done = _plan(run_cli, models, recurrent_checkpoints["Qwen3_5ForCausalLM"], *extra)
    out = done.stdout + done.stderr
    assert done.returncode == 1 and "TTB274" in out, out
    assert words in out, out


def test_plan_refuses_declared_layers_the_checkpoint_does_not_keep_state_in(
    run_cli, recurrent_checkpoints, tmp_path
):
    models = tmp_path / "models"
    state = {"recurrent_state": {"owner": "vllm", "layers": [0, 1, 2, 3]}}
    document = metadata("gdn", arch="Qwen3_5ForCausalLM", schema_version=6, capabilities=state)
    write_bundle(models / "gdn", document=document)
    done = _plan(run_cli, models, recurrent_checkpoints["Qwen3_5ForCausalLM"])
    out = done.stdout + done.stderr
    assert done.returncode == 1 and "TTB043" in out, out
    assert "layers 0, 1, 2, 3" in out and "layers 0, 1, 2, 4, 5, 6" in out
