"""The TT platform's configuration decisions, through the real vLLM.

Each test builds a configuration the way `vllm serve` does
(`EngineArgs(...).create_engine_config()`), with the TT platform active on the host mesh
(see conftest) and bundles supplied through EXTRA_MODELS_DIR; the adapter is never
imported, so environment-sourced bundles whose module is an empty file on sys.path are
enough here (the platform refuses a module it cannot find, TTB058).
"""

from __future__ import annotations

import json
import shutil

import pytest
import vllm  # noqa: F401 - required: a missing or broken vllm fails
from vllm.engine.arg_utils import EngineArgs
from vllm.sampling_params import SamplingParams

from tests.bundle_factory import metadata, write_bundle
from ttbundles.errors import ConfigurationError


def bundle(parent, name, arch="LlamaForCausalLM", **fields):
    """An environment-sourced bundle: the adapter is never imported here, only found
    (`models_dir` puts the `tt_models` folder on sys.path)."""
    package = parent.parent / "lib" / "tt_models"
    package.mkdir(parents=True, exist_ok=True)
    (package / "__init__.py").touch()
    (package / f"{name.replace('-', '_')}.py").write_text("class Generator: ...\n")
    document = metadata(
        name,
        arch=arch,
        main_class=f"tt_models.{name.replace('-', '_')}:Generator",
        main_class_source="environment",
        **fields,
    )
    return write_bundle(parent / name, document=document)


def configure(checkpoint, **kwargs):
    kwargs.setdefault("max_model_len", 256)
    config = EngineArgs(model=str(checkpoint), **kwargs).create_engine_config()
    plan = config.additional_config["ttbundles"]
    return config, {d["setting"]: d for d in plan["decisions"]}, plan


def error_of(excinfo) -> str:
    return excinfo.value.diagnostics[0].code


def test_capabilities_off_turn_features_off_with_reasons(models_dir, demo_checkpoint):
    bundle(models_dir, "plain")
    config, decisions, plan = configure(
        demo_checkpoint, enable_prefix_caching=True, async_scheduling=True
    )
    assert plan["tt_arch"] == "TTLlamaForCausalLM"
    assert plan["bundle"]["name"] == "plain"
    assert config.cache_config.enable_prefix_caching is False
    assert decisions["enable_prefix_caching"]["requested"] is True
    assert "prefix_caching" in decisions["enable_prefix_caching"]["reason"]
    assert config.scheduler_config.async_scheduling is False
    assert "async_decode" in decisions["async_scheduling"]["reason"]
    assert config.scheduler_config.enable_chunked_prefill is False
    # Prompts prefill whole: the step budget holds the longest prompt.
    assert config.scheduler_config.max_num_batched_tokens >= config.model_config.max_model_len
    assert config.parallel_config.worker_cls == "ttbundles.serving.worker.TTWorker"
    assert config.scheduler_config.scheduler_cls == "ttbundles.serving.scheduler.TTScheduler"
    assert decisions["sampling"]["effective"] == "host"
    assert plan["prompt_logprobs"] is False
    assert "TTB206" in decisions["prompt_logprobs"]["reason"]


def test_declared_capabilities_keep_features(models_dir, demo_checkpoint):
    bundle(
        models_dir,
        "capable",
        capabilities={
            "prefix_caching": True,
            "async_decode": True,
            "chunked_prefill": True,
            "sample_on_device": ["decode_only"],
        },
    )
    config, decisions, _ = configure(
        demo_checkpoint,
        enable_prefix_caching=True,
        async_scheduling=True,
        additional_config={"tt": {"sample_on_device_mode": "decode_only"}},
    )
    assert config.cache_config.enable_prefix_caching is True
    assert config.scheduler_config.async_scheduling is True
    assert config.scheduler_config.enable_chunked_prefill is True
    assert config.scheduler_config.scheduler_cls.endswith("TTAsyncScheduler")
    assert decisions["tt.sample_on_device_mode"]["effective"] == "decode_only"
    assert config.additional_config["tt"]["sample_on_device_mode"] == "decode_only"


def test_undeclared_sampling_mode_is_a_config_error(models_dir, demo_checkpoint):
    bundle(models_dir, "decode-only", capabilities={"sample_on_device": ["decode_only"]})
    with pytest.raises(ConfigurationError) as excinfo:
        configure(demo_checkpoint, additional_config={"tt": {"sample_on_device_mode": "all"}})
    assert error_of(excinfo) == "TTB204"
    assert "decode_only" in str(excinfo.value)


def test_unknown_device_option_suggests_the_right_one(models_dir, demo_checkpoint):
    bundle(models_dir, "plain")
    with pytest.raises(ConfigurationError) as excinfo:
        configure(demo_checkpoint, additional_config={"tt": {"trace_mod": "all"}})
    assert error_of(excinfo) == "TTB038"
    assert "trace_mode" in str(excinfo.value)
    with pytest.raises(ConfigurationError) as excinfo:
        configure(demo_checkpoint, additional_config={"tt": {"trace_mode": "sometimes"}})
    assert "'all'" in str(excinfo.value) and "'none'" in str(excinfo.value)


def test_image_urls_are_limited_to_public_addresses_unless_the_operator_allows_more(
    models_dir, demo_checkpoint
):
    bundle(models_dir, "plain")
    _, decisions, plan = configure(demo_checkpoint)
    # text only: the default holds, and is not said (the vision case: below)
    assert "tt.allow_private_media_urls" not in decisions
    assert plan["server"] == {"allow_private_media_urls": False}
    networks = ["10.1.2.0/24", "fd00::/8"]
    config, decisions, plan = configure(
        demo_checkpoint, additional_config={"tt": {"allow_private_media_urls": networks}}
    )
    assert decisions["tt.allow_private_media_urls"]["effective"] == networks
    assert plan["server"] == {"allow_private_media_urls": networks}
    # Not a device option: the device options are what they were.
    assert "allow_private_media_urls" not in plan["options"]


def test_a_bad_network_to_allow_is_a_config_error(models_dir, demo_checkpoint):
    bundle(models_dir, "plain")
    with pytest.raises(ConfigurationError) as excinfo:
        configure(
            demo_checkpoint, additional_config={"tt": {"allow_private_media_urls": ["10.1/x"]}}
        )
    assert error_of(excinfo) == "TTB038"
    assert "'10.1/x' is not a network" in str(excinfo.value)
    with pytest.raises(ConfigurationError) as excinfo:
        configure(demo_checkpoint, additional_config={"tt": {"allow_private_media_url": True}})
    assert error_of(excinfo) == "TTB038"
    assert "allow_private_media_urls" in str(excinfo.value)


def test_target_defaults_fill_what_the_user_left_unset(models_dir, demo_checkpoint):
    bundle(
        models_dir,
        "targeted",
        targets={
            "HOST": {
                "max_model_len": 128,
                "max_num_seqs": 4,
                "additional_config": {"trace_mode": "decode_only", "enable_model_warmup": False},
            }
        },
    )
    config, decisions, _ = configure(
        demo_checkpoint,
        max_model_len=256,
        max_num_seqs=8,
        additional_config={"tt": {"trace_mode": "none"}},
    )
    assert config.model_config.max_model_len == 128
    assert decisions["max_model_len"]["requested"] == 256
    assert config.scheduler_config.max_num_seqs == 4
    assert decisions["tt.trace_mode"] == {
        "setting": "tt.trace_mode",
        "requested": "none",
        "effective": "none",
        "reason": "set by the user",
    }
    assert decisions["tt.enable_model_warmup"]["effective"] is False
    assert "target HOST" in decisions["tt.enable_model_warmup"]["reason"]


def test_interleave_defaults_and_the_prefill_cadence_are_in_the_plan(models_dir, demo_checkpoint):
    bundle(models_dir, "plain")
    config, decisions, _ = configure(demo_checkpoint, prefill_schedule_interval=3)
    assert decisions["tt.decode_interleave_prefill_steps"]["effective"] == 2
    assert decisions["tt.decode_interleave_decode_steps"]["effective"] == 1
    assert decisions["tt.decode_interleave_enabled"]["effective"] is True
    # vLLM's local prefill cadence is kept, not refused: the scheduler honours it.
    assert config.scheduler_config.prefill_schedule_interval == 3
    assert decisions["prefill_schedule_interval"]["effective"] == 3
    _, decisions, _ = configure(demo_checkpoint)
    assert "prefill_schedule_interval" not in decisions


def test_interleave_options_refuse_a_bool_for_an_int(models_dir, demo_checkpoint):
    bundle(models_dir, "plain")
    with pytest.raises(ConfigurationError) as excinfo:
        configure(
            demo_checkpoint, additional_config={"tt": {"decode_interleave_prefill_steps": True}}
        )
    assert error_of(excinfo) == "TTB038"
    assert "decode_interleave_prefill_steps=True" in str(excinfo.value)


@pytest.mark.parametrize(
    "option,code",
    [
        ({"tensor_parallel_size": 2}, "TTB201"),
        ({"pipeline_parallel_size": 2}, "TTB201"),
        ({"enable_lora": True}, "TTB202"),
    ],
)
def test_unsupported_parallelism_and_features(models_dir, demo_checkpoint, option, code):
    bundle(models_dir, "plain")
    with pytest.raises(ConfigurationError) as excinfo:
        configure(demo_checkpoint, **option)
    assert error_of(excinfo) == code


@pytest.mark.parametrize(
    "option,asked",
    [
        ({"runner": "pooling"}, "--runner pooling"),
        ({"convert": "embed"}, "--convert embed"),
        ({"runner": "pooling", "convert": "classify"}, "--runner pooling --convert classify"),
    ],
)
def test_a_pooling_server_of_a_bundle_without_pooling_is_refused(
    models_dir, demo_checkpoint, option, asked
):
    """vLLM's pooling runner asked of a text-generation bundle: refused at configuration
    with TTB270 naming the flag, the bundle and the fix (it used to start a generation
    server that answered 404 on /v1/embeddings)."""
    bundle(models_dir, "plain")
    with pytest.raises(ConfigurationError) as excinfo:
        configure(demo_checkpoint, **option)
    assert error_of(excinfo) == "TTB270"
    diagnostic = excinfo.value.diagnostics[0]
    assert diagnostic.message.startswith(asked + " asks for a pooling server")
    assert "plain@" in diagnostic.message and "declares no pooling task" in diagnostic.message
    assert "--runner generate" in diagnostic.hint


def test_a_checkpoint_vllm_pools_by_default_is_refused_too(models_dir, demo_checkpoint, tmp_path):
    """No flag at all: a sentence-transformers checkpoint (modules.json) makes vLLM pick
    its pooling runner by itself; still refused, and the message says the checkpoint
    asked. `--runner generate` serves it as text generation."""
    checkpoint = tmp_path / "st-llama"
    shutil.copytree(demo_checkpoint, checkpoint)
    (checkpoint / "modules.json").write_text(
        json.dumps(
            [
                {
                    "idx": 0,
                    "name": "0",
                    "path": "",
                    "type": "sentence_transformers.models.Transformer",
                },
                {
                    "idx": 1,
                    "name": "1",
                    "path": "1_Pooling",
                    "type": "sentence_transformers.models.Pooling",
                },
            ]
        )
    )
    (checkpoint / "1_Pooling").mkdir()
    (checkpoint / "1_Pooling" / "config.json").write_text(
        json.dumps({"pooling_mode_lasttoken": True})
    )
    bundle(models_dir, "plain")
    with pytest.raises(ConfigurationError) as excinfo:
        configure(checkpoint)
    assert error_of(excinfo) == "TTB270"
    assert excinfo.value.diagnostics[0].message.startswith("the checkpoint (vLLM pools it")
    _config, decisions, _plan = configure(checkpoint, runner="generate")
    assert decisions["runner"]["effective"] == "generate"
    assert decisions["runner"]["requested"] == "generate"


def test_plan_command_refuses_a_pooling_server_as_the_server_would(
    run_cli, models_dir, demo_checkpoint
):
    bundle(models_dir, "plain")
    env = {"EXTRA_MODELS_DIR": str(models_dir), "MESH_DEVICE": "HOST"}
    args = ["--model", demo_checkpoint, "--max-model-len", "256", "--convert", "embed"]
    run = run_cli("plan", *args, env=env, timeout=300)
    assert run.returncode == 1, run.stdout + run.stderr
    assert "TTB270" in run.stdout + run.stderr
    assert "--convert embed asks for a pooling server" in run.stdout + run.stderr


POOLING_BUNDLE = {"schema_version": 5, "capabilities": {"pooling": {"tasks": ["embed"]}}}


def test_a_bundle_that_only_pools_is_refused_a_generation_server(models_dir, demo_checkpoint):
    """A bundle of the forward form has no prefill or decode: a generation server of it
    is refused (TTB272) with the flags that serve it."""
    bundle(models_dir, "embedder", **POOLING_BUNDLE)
    with pytest.raises(ConfigurationError) as excinfo:
        configure(demo_checkpoint)
    assert error_of(excinfo) == "TTB272"
    assert "embedder@1.0.0 only pools (embed" in str(excinfo.value)
    assert "--runner pooling" in excinfo.value.diagnostics[0].hint


def test_a_task_the_bundle_does_not_declare_is_refused(models_dir, demo_checkpoint):
    bundle(models_dir, "embedder", **POOLING_BUNDLE)
    with pytest.raises(ConfigurationError) as excinfo:
        configure(demo_checkpoint, runner="pooling", convert="classify")
    assert error_of(excinfo) == "TTB270"
    assert "asks for classify pooling (classify), but embedder@1.0.0 declares the pooling " in (
        str(excinfo.value)
    )
    assert excinfo.value.diagnostics[0].hint == "serve it with --convert embed"


def test_a_pooling_server_is_planned_with_its_tasks(models_dir, demo_checkpoint):
    """--convert embed of a bundle declaring embed and classify: the embed tasks only (vLLM's
    API server opens one pooling task's endpoints), no KV-cache features, whole prompts."""
    bundle(
        models_dir,
        "pooler",
        schema_version=5,
        capabilities={"pooling": {"tasks": ["embed", "classify"]}},
    )
    config, decisions, plan = configure(demo_checkpoint, runner="pooling", convert="embed")
    assert plan["pooling"] == {"tasks": ["embed"], "form": "forward"}
    assert decisions["runner"]["effective"] == "pooling"
    assert decisions["runner"]["requested"] == "pooling"
    assert "tasks embed, form 'forward'" in decisions["runner"]["reason"]
    assert config.scheduler_config.enable_chunked_prefill is False
    assert config.scheduler_config.max_num_batched_tokens >= config.model_config.max_model_len
    _config, _decisions, plan = configure(demo_checkpoint, runner="pooling", convert="classify")
    assert plan["pooling"]["tasks"] == ["classify"]


def test_the_hidden_states_form_pools_and_generates(models_dir, demo_checkpoint):
    """A bundle of the form prefill_hidden pools with whole prompts and nothing of vLLM's KV
    cache (prefix caching, chunking and async scheduling off, though it declares them),
    and generates text when not asked to pool: it has the whole generation contract."""
    bundle(
        models_dir,
        "hidden",
        schema_version=5,
        capabilities={
            "prefix_caching": True,
            "chunked_prefill": True,
            "async_decode": True,
            "pooling": {"tasks": ["embed", "token_embed"], "form": "prefill_hidden"},
        },
    )
    config, decisions, plan = configure(demo_checkpoint, runner="pooling", convert="embed")
    assert plan["pooling"] == {"tasks": ["embed", "token_embed"], "form": "prefill_hidden"}
    for setting in ("enable_prefix_caching", "enable_chunked_prefill"):
        assert decisions[setting]["effective"] is False, setting
        assert "whole prompts in one step" in decisions[setting]["reason"]
    assert config.cache_config.enable_prefix_caching is False
    assert config.scheduler_config.async_scheduling is False  # vLLM's, for pooling
    assert decisions["kv_cache"]["effective"] == "none"
    config, decisions, plan = configure(demo_checkpoint)
    assert plan["pooling"] == {}
    assert decisions["runner"]["effective"] == "generate"
    assert config.cache_config.enable_prefix_caching is True


def test_classification_of_a_checkpoint_without_a_head_is_refused(models_dir, demo_checkpoint):
    """--convert classify of a *ForCausalLM checkpoint, with the hidden-states form: there is
    no score.weight for vLLM's classifier to apply, said at configuration (TTB273)."""
    bundle(
        models_dir,
        "hidden",
        schema_version=5,
        capabilities={"pooling": {"tasks": ["classify"], "form": "prefill_hidden"}},
    )
    with pytest.raises(ConfigurationError) as excinfo:
        configure(demo_checkpoint, runner="pooling", convert="classify")
    assert error_of(excinfo) == "TTB273"
    assert "has no score.weight" in str(excinfo.value)
    assert "--convert embed" in excinfo.value.diagnostics[0].hint


def test_data_parallel_pooling_runs_an_engine_per_submesh(models_dir, demo_checkpoint):
    bundle(models_dir, "forward", **POOLING_BUNDLE)
    config, decisions, plan = configure(
        demo_checkpoint, runner="pooling", convert="embed", data_parallel_size=2
    )
    assert plan["pooling"]["tasks"] == ["embed"]
    assert config.parallel_config.data_parallel_size == 2
    assert "2 engine cores" in decisions["data_parallel_size"]["reason"]


def test_pooling_with_in_process_lanes_is_refused(models_dir, demo_checkpoint):
    bundle(
        models_dir,
        "galaxy",
        schema_version=5,
        capabilities={
            "execution": "single",
            "pooling": {"tasks": ["embed"], "form": "prefill_hidden"},
        },
    )
    with pytest.raises(ConfigurationError) as excinfo:
        configure(demo_checkpoint, runner="pooling", convert="embed", data_parallel_size=2)
    assert error_of(excinfo) == "TTB202"
    assert "in-process lanes do not pool yet" in str(excinfo.value)
    assert "execution 'submesh'" in excinfo.value.diagnostics[0].hint


def test_the_plan_says_the_runner(models_dir, demo_checkpoint):
    bundle(models_dir, "plain")
    _config, decisions, _plan = configure(demo_checkpoint)
    assert decisions["runner"] == {
        "setting": "runner",
        "requested": None,
        "effective": "generate",
        "reason": "plain@1.0.0 generates text (vLLM's default)",
    }


def test_no_bundle_for_the_architecture_lists_what_is_registered(models_dir, demo_checkpoint):
    bundle(models_dir, "qwen", arch="Qwen2ForCausalLM")
    # registered, but its module is not importable here: counted, not listed as servable
    bundle(models_dir, "gone", arch="Qwen3ForCausalLM")
    (models_dir.parent / "lib" / "tt_models" / "gone.py").unlink()
    with pytest.raises(ConfigurationError) as excinfo:
        configure(demo_checkpoint)
    assert error_of(excinfo) == "TTB200"
    message = str(excinfo.value)
    assert "TTLlamaForCausalLM" in message and "TTQwen2ForCausalLM (qwen@1.0.0, extra" in message
    # One architecture a line, no paths; only the servable ones are listed as such.
    listed = message.split("servable:", 1)[1].splitlines()[1:]
    assert any(line.strip().startswith("TTQwen2ForCausalLM (qwen@1.0.0") for line in listed)
    assert "TTQwen3ForCausalLM" not in message
    assert "1 more registered but not servable here: 1 not importable here (TTB058)" in message
    hint = excinfo.value.diagnostics[0].hint
    assert "docs/operators/installing.md" in hint
    # a checkpoint the torch reference reads: the bundle init --reference makes
    assert "ttbundle init models/NAME --reference --from-hf MODEL" in hint
    assert str(models_dir) not in message


@pytest.mark.parametrize(
    ("architecture", "fix"),
    [
        ("LlamaForSequenceClassification", "ttbundle init models/NAME --reference"),
        ("XLMRobertaForSequenceClassification", "pooling form 'forward'"),
        ("BertModel", "generator-contract.md#pooling"),
        ("FalconForCausalLM", "add a bundle for it into a folder named by EXTRA_MODELS_DIR"),
    ],
)
def test_no_bundle_says_which_bundle_would_serve_the_checkpoint(architecture, fix):
    """TTB200's fix by what the checkpoint is: a reranker the reference reads gets the
    init --reference step, an encoder the pooling form 'forward' (it has no reference)."""
    from ttbundles.serving.planning.selection import _bundle_for

    hint = _bundle_for([architecture])
    assert fix in hint, hint
    assert ("--reference" in hint) == architecture.startswith("Llama")


def test_single_execute_data_parallel_becomes_lanes(models_dir, demo_checkpoint):
    bundle(models_dir, "galaxy", capabilities={"execution": "single"})
    config, decisions, plan = configure(demo_checkpoint, data_parallel_size=4, max_num_seqs=8)
    assert plan["lanes"] == 4
    assert config.parallel_config.data_parallel_size == 1
    assert config.scheduler_config.max_num_seqs == 32
    assert decisions["max_num_seqs"]["reason"] == "8 per lane x 4 lanes"
    # One engine: vLLM launches one engine core with the worker in it.
    parallel = config.parallel_config
    assert (parallel.data_parallel_size_local, parallel.data_parallel_rank) == (1, 0)
    assert parallel.distributed_executor_backend == "uni"
    assert decisions["distributed_executor_backend"] == {
        "setting": "distributed_executor_backend",
        "requested": "mp",
        "effective": "uni",
        "reason": "the lanes' one worker runs inside its engine-core process",
    }
    assert config.scheduler_config.scheduler_cls == "ttbundles.serving.lanes.TTLaneCoordinator"
    assert "4 in-process lanes in one engine" in decisions["data_parallel_size"]["reason"]


@pytest.mark.parametrize(
    ("capabilities", "dp", "expected"),
    [
        ({}, 1, "one engine"),
        ({"execution": "single"}, 1, "--data-parallel-size N would run N in-process lanes"),
        ({}, 2, "2 engine cores, one per 1x1 submesh of HOST"),
    ],
)
def test_the_data_parallel_decision_is_recorded_for_every_bundle(
    models_dir, demo_checkpoint, capabilities, dp, expected
):
    bundle(models_dir, "any", capabilities=capabilities)
    _config, decisions, plan = configure(demo_checkpoint, data_parallel_size=dp)
    assert expected in decisions["data_parallel_size"]["reason"]
    assert plan["lanes"] == 1


def test_lanes_must_divide_the_target_batch(models_dir, demo_checkpoint):
    bundle(
        models_dir,
        "galaxy",
        capabilities={"execution": "single"},
        targets={"HOST": {"max_num_seqs": 30}},
    )
    with pytest.raises(ConfigurationError) as excinfo:
        configure(demo_checkpoint, data_parallel_size=4, max_num_seqs=8)
    assert error_of(excinfo) == "TTB205"


def test_moe_with_data_parallel_is_refused(models_dir, moe_checkpoint):
    bundle(models_dir, "mixtral", arch="MixtralForCausalLM")
    with pytest.raises(ConfigurationError) as excinfo:
        configure(moe_checkpoint, data_parallel_size=2)
    assert error_of(excinfo) == "TTB207"


def test_an_architecture_vllm_does_not_know_still_configures(models_dir, demo_checkpoint, tmp_path):
    from ttbundles.serving.registration import register_all

    custom = tmp_path / "custom-llama"
    shutil.copytree(demo_checkpoint, custom)
    config = json.loads((custom / "config.json").read_text())
    config["architectures"] = ["AcmeLlamaForCausalLM"]
    (custom / "config.json").write_text(json.dumps(config))
    bundle(models_dir, "acme", arch="AcmeLlamaForCausalLM")
    register_all()  # what the general plugin does at process start
    _, decisions, plan = configure(custom)
    assert plan["tt_arch"] == "TTAcmeLlamaForCausalLM"
    assert decisions["architecture"]["requested"] == ["AcmeLlamaForCausalLM"]


def test_prompt_logprobs_are_refused_per_request_unless_the_bundle_declares_them(monkeypatch):
    from ttbundles.serving import platform
    from ttbundles.serving.platform import TTPlatform

    monkeypatch.setattr(platform.TTPlatform.served, "prompt_logprobs", False)
    with pytest.raises(ValueError, match="TTB206.*does not declare"):
        TTPlatform.validate_request(None, SamplingParams(prompt_logprobs=1))
    TTPlatform.validate_request(None, SamplingParams(logprobs=2))  # allowed
    monkeypatch.setattr(platform.TTPlatform.served, "prompt_logprobs", True)
    TTPlatform.validate_request(None, SamplingParams(prompt_logprobs=1))
    with pytest.raises(ValueError, match="TTB206: prompt_logprob_token_ids"):
        TTPlatform.validate_request(
            None, SamplingParams(prompt_logprobs=1, prompt_logprob_token_ids=[[1]])
        )


def test_the_plan_says_whether_prompt_logprobs_are_served(models_dir, demo_checkpoint):
    bundle(
        models_dir,
        "scored",
        schema_version=3,
        capabilities={"prompt_logprobs": True},
    )
    _, decisions, plan = configure(demo_checkpoint)
    assert plan["prompt_logprobs"] is True
    assert "declares them" in decisions["prompt_logprobs"]["reason"]


def test_the_hook_decides_once_per_configuration(models_dir, demo_checkpoint):
    from ttbundles.serving.planning.configuration import plan_config
    from ttbundles.serving.registration import current_registry

    bundle(models_dir, "plain")
    config, _, plan = configure(demo_checkpoint, enable_prefix_caching=True)
    # The engine core runs the hook again on the same configuration: nothing changes.
    assert plan_config(config, current_registry()) is None
    assert config.additional_config["ttbundles"] == plan


@pytest.mark.parametrize(("requested", "effective"), [(50, 20), (-1, 20), (5, 5)])
def test_max_logprobs_is_clamped_to_20(models_dir, demo_checkpoint, requested, effective):
    bundle(models_dir, "tt-llama")
    config, decisions, _ = configure(demo_checkpoint, max_logprobs=requested)
    assert config.model_config.max_logprobs == effective
    assert decisions["max_logprobs"]["effective"] == effective


def test_the_length_decision_names_where_the_length_came_from(
    models_dir, demo_checkpoint, tmp_path, monkeypatch
):
    """Not "as requested" for a length nobody asked for: a sentence-transformers
    checkpoint's `sentence_bert_config.json` sets it, and the command line's is named
    as the command line's."""
    import shutil

    from ttbundles.serving.planning import command_line

    bundle(models_dir, "plain")
    checkpoint = shutil.copytree(demo_checkpoint, tmp_path / "sentence")
    (checkpoint / "sentence_bert_config.json").write_text('{"max_seq_length": 256}')
    monkeypatch.setattr(command_line, "COMMAND_LINE", {})
    config, decisions, plan = configure(checkpoint, max_model_len=None)
    assert config.model_config.max_model_len == 256
    assert decisions["max_model_len"]["reason"] == (
        "the checkpoint's sentence_bert_config.json (max_seq_length)"
    )
    monkeypatch.setattr(command_line, "COMMAND_LINE", {"max_model_len": 128})
    _, decisions, _ = configure(checkpoint, max_model_len=128)
    assert decisions["max_model_len"]["reason"] == "as requested (--max-model-len)"


def test_decisions_say_default_where_nothing_was_requested(models_dir, demo_checkpoint):
    bundle(models_dir, "full", capabilities={"prefix_caching": True, "chunked_prefill": True})
    _config, decisions, _plan = configure(demo_checkpoint, max_model_len=None)
    assert decisions["max_model_len"]["reason"] == "the model's own limit (default)"
    assert decisions["max_logprobs"]["reason"] == "vLLM's default"
    assert decisions["enable_prefix_caching"]["reason"] == "on: vLLM's default"
    _config, decisions, _plan = configure(
        demo_checkpoint, max_model_len=128, max_logprobs=5, enable_prefix_caching=False
    )
    assert decisions["max_model_len"]["reason"] == "as requested"
    assert decisions["max_logprobs"]["reason"] == "as requested"
    assert decisions["enable_prefix_caching"]["reason"] == "off, as requested"


def test_plan_command_says_which_topology_and_why(run_cli, demo_checkpoint, tmp_path):
    """`ttbundle plan` of a single-execute bundle with --data-parallel-size: the lanes, the
    per-lane and total max_num_seqs, and the coordinator, as the server would log them."""
    from ttbundles.demo.variants import write_lanes_bundle

    write_lanes_bundle(tmp_path)
    env = {"EXTRA_MODELS_DIR": str(tmp_path), "MESH_DEVICE": "HOST"}
    args = ["--model", demo_checkpoint, "--max-model-len", "256", "--format", "json"]
    # Each plan imports vLLM: minutes on a loaded machine (the default 60 s was exceeded).
    run = run_cli(
        "plan", *args, "--data-parallel-size", "4", "--max-num-seqs", "2", env=env, timeout=300
    )
    assert run.returncode == 0, run.stdout + run.stderr
    plan = json.loads(run.stdout)
    plan = plan.get("plan", plan)
    decisions = {d["setting"]: d for d in plan["decisions"]}
    assert plan["lanes"] == 4
    assert decisions["data_parallel_size"]["effective"] == 1
    assert "4 in-process lanes in one engine" in decisions["data_parallel_size"]["reason"]
    assert decisions["max_num_seqs"]["effective"] == 8
    assert decisions["max_num_seqs"]["reason"] == "2 per lane x 4 lanes"
    assert decisions["scheduler"]["effective"] == "ttbundles.serving.lanes.TTLaneCoordinator"
    # 3 x 16 is capped to the target's 32, which 3 lanes cannot share: refused as the
    # server would refuse it.
    run = run_cli(
        "plan", *args, "--data-parallel-size", "3", "--max-num-seqs", "16", env=env, timeout=300
    )
    assert run.returncode == 1 and "TTB205" in run.stdout + run.stderr


def test_mllama_is_refused_before_any_weights_load(models_dir, demo_checkpoint):
    """vLLM 0.33 has no Mllama (encoder-decoder models left in 0.10.2): the configuration
    is refused with the reason, before a worker, a class import or a weight."""
    bundle(models_dir, "mllama", arch="MllamaForConditionalGeneration")
    with pytest.raises(ConfigurationError) as excinfo:
        configure(
            demo_checkpoint, hf_overrides={"architectures": ["MllamaForConditionalGeneration"]}
        )
    assert error_of(excinfo) == "TTB202"
    message = str(excinfo.value)
    assert "TTMllamaForConditionalGeneration (mllama) cannot be served" in message
    assert "0.10.2" in message and "encoder-decoder" in message


def test_a_lowered_asked_limit_is_a_warning_naming_bundle_target_and_value(
    models_dir, demo_checkpoint, monkeypatch
):
    """max_model_len asked above the target's limit: decided as before, and a TTB246
    WARNING naming the bundle, the target, the asked value and where the limit is; the
    model's own limit lowered without asking is a decision only (nothing was asked)."""
    from ttbundles.serving.planning import command_line

    monkeypatch.setattr(command_line, "COMMAND_LINE", {})
    bundle(models_dir, "targeted", targets={"HOST": {"max_model_len": 128}})
    config, decisions, plan = configure(demo_checkpoint, max_model_len=256)
    assert config.model_config.max_model_len == 128
    assert decisions["max_model_len"]["requested"] == 256
    [warning] = plan["warnings"]
    assert warning["code"] == "TTB246" and warning["severity"] == "warning"
    assert warning["message"] == (
        "max_model_len 256 lowered to 128: bundle targeted@1.0.0's target HOST supports at "
        "most 128 (targets.HOST.max_model_len in its vllm_metadata.json)"
    )
    assert warning["hint"].startswith("ask for at most 128 (--max-model-len 128)")
    config, decisions, plan = configure(demo_checkpoint, max_model_len=None)  # model's 512
    assert config.model_config.max_model_len == 128
    assert plan["warnings"] == []
    assert "supports at most 128" in decisions["max_model_len"]["reason"]


def test_a_lowered_max_num_seqs_warns_only_when_the_command_line_asked(
    models_dir, demo_checkpoint, monkeypatch
):
    from ttbundles.serving.planning import command_line

    bundle(models_dir, "targeted", targets={"HOST": {"max_num_seqs": 4}})
    monkeypatch.setattr(command_line, "COMMAND_LINE", {})
    config, _, plan = configure(demo_checkpoint, max_num_seqs=8)
    assert config.scheduler_config.max_num_seqs == 4 and plan["warnings"] == []
    monkeypatch.setattr(command_line, "COMMAND_LINE", {"max_num_seqs": 8})
    config, _, plan = configure(demo_checkpoint, max_num_seqs=8)
    assert config.scheduler_config.max_num_seqs == 4
    [warning] = plan["warnings"]
    assert warning["message"].startswith(
        "max_num_seqs 8 lowered to 4: bundle targeted@1.0.0's target HOST supports at most 4"
    )
    assert plan["lowered_settings"] == ["max_num_seqs"]


def test_a_prompt_over_a_lowered_limit_is_refused_with_the_reason(
    models_dir, demo_checkpoint, monkeypatch
):
    """vLLM's own length checks, wrapped: the refusal keeps vLLM's words and class and
    ends with why the limit is lower than the server was started with."""
    import inspect

    from ttbundles.serving import compat
    from ttbundles.serving.api_server import length_limits
    from ttbundles.serving.planning.plan import Plan

    for owner, name in compat.prompt_length_checks():  # restored after the test
        monkeypatch.setattr(owner, name, inspect.unwrap(getattr(owner, name)))
    bundle(models_dir, "targeted", targets={"HOST": {"max_model_len": 128}})
    config, _, plan_dict = configure(demo_checkpoint, max_model_len=256)
    plan = Plan.from_dict(plan_dict)
    assert plan.lowered_length() == (256, 128)
    length_limits.explain_lowered_length(plan, 256, 128)
    checks = dict((name, owner) for owner, name in compat.prompt_length_checks())
    assert checks, "no length check found on this vLLM release"
    from vllm.v1.engine.input_processor import InputProcessor

    processor = object.__new__(InputProcessor)  # only its length check is called
    processor.model_config = config.model_config
    processor.supports_mm_inputs = False
    processor.skip_prompt_length_check = False
    with pytest.raises(Exception, match="maximum model length of 128") as excinfo:
        InputProcessor._validate_prompt_len(processor, 200, "decoder")
    assert str(excinfo.value.args[0]).endswith(
        "(ttbundles: max_model_len is 128 on this server, not 256: bundle "
        "targeted@1.0.0's target HOST supports at most 128.)"
    )


def test_a_prompt_over_a_cap_nobody_asked_past_names_the_bundles_cap(
    models_dir, demo_checkpoint, monkeypatch
):
    """The checkpoint's own 512 positions capped to the target's 128 without a request
    for more (a pooling server's usual case): the refusal still names the bundle's cap."""
    import inspect

    from vllm.v1.engine.input_processor import InputProcessor

    from ttbundles.serving import api_server, compat
    from ttbundles.serving.planning import command_line
    from ttbundles.serving.planning.plan import Plan

    for owner, name in compat.prompt_length_checks():  # restored after the test
        monkeypatch.setattr(owner, name, inspect.unwrap(getattr(owner, name)))
    monkeypatch.setattr(command_line, "COMMAND_LINE", {})
    bundle(models_dir, "targeted", targets={"HOST": {"max_model_len": 128}})
    config, _, plan_dict = configure(demo_checkpoint, max_model_len=None)
    plan = Plan.from_dict(plan_dict)
    assert plan.lowered_length() is None and plan.capped_length() == (512, 128)
    api_server.install(plan, planning=True)
    processor = object.__new__(InputProcessor)  # only its length check is called
    processor.model_config = config.model_config
    processor.supports_mm_inputs = False
    processor.skip_prompt_length_check = False
    with pytest.raises(Exception, match="maximum model length of 128") as excinfo:
        InputProcessor._validate_prompt_len(processor, 200, "decoder")
    assert str(excinfo.value.args[0]).endswith(
        "(ttbundles: max_model_len is 128 on this server, under the checkpoint's 512: "
        "bundle targeted@1.0.0's target HOST supports at most 128.)"
    )


def test_the_plan_says_dtype_has_no_effect_on_the_host_and_image_urls_only_for_images(
    demo_checkpoint, vision_checkpoint
):
    """vLLM logs its dtype (a downcast of a float32 checkpoint to bfloat16); on HOST the
    reference computes in float32 and the plan says so. A text-only server makes no
    decision about image URLs; one that serves images does."""
    _, decisions, _ = configure(demo_checkpoint, dtype="bfloat16")
    dtype = decisions["dtype"]
    assert (dtype["requested"], dtype["effective"]) == ("bfloat16", "float32")
    assert "--dtype has no effect on HOST" in dtype["reason"]
    assert "tt.allow_private_media_urls" not in decisions
    _, decisions, _ = configure(
        demo_checkpoint, additional_config={"tt": {"allow_private_media_urls": True}}
    )
    assert "no effect" in decisions["tt.allow_private_media_urls"]["reason"]
    _, decisions, _ = configure(vision_checkpoint, max_model_len=1024)
    assert decisions["tt.allow_private_media_urls"]["effective"] is False
    assert "TTB220" in decisions["tt.allow_private_media_urls"]["reason"]
    assert decisions["dtype"]["effective"] == "float32"


def test_the_plan_each_process_reads_is_frozen(models_dir, demo_checkpoint):
    """What the worker reads back (`served_plan`) is the plan as decided, and no step
    after the configuration hook can change it: each engine process has its own copy."""
    from ttbundles.serving.planning.plan import FrozenPlanError, served_plan

    bundle(models_dir, "plain")
    config, _, data = configure(demo_checkpoint)
    plan = served_plan(config)
    assert plan is not None and plan.frozen and plan.to_dict() == data
    with pytest.raises(FrozenPlanError):
        plan.lanes = 2
    with pytest.raises(FrozenPlanError):
        plan.decide("max_num_seqs", 1, 2, "too late")
    assert isinstance(plan.decisions, tuple) and plan.lanes == 1
