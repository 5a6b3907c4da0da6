"""`ttbundle test` of pooling bundles: the plan's pooling paths, the comparison of pooled
vectors (fast tier); and the command on the transformers-backed embedding and classifier
bundles of the `forward` form, right and wrong, served by vLLM's pooling runner (the
server tier).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from ttbundles.conformance.compare import CaseResult
from ttbundles.conformance.plan import resolve_plan
from ttbundles.conformance.pooling import (
    COSINE_MIN,
    activate,
    compare_pooled,
    golden_vectors,
    normalise,
)
from ttbundles.errors import InvalidBundleError
from ttbundles.format.parse import parse_metadata

BASE = {
    "schema_version": 5,
    "name": "p",
    "version": "1.0.0",
    "arch": "LlamaForCausalLM",
    "main_class": "adapter:Gen",
}


def plan_of(tmp_path: Path, pooling: dict | None, paths=None, **extra):
    document = {**BASE, **extra}
    if pooling is not None:
        document["capabilities"] = {**document.get("capabilities", {}), "pooling": pooling}
    loaded = parse_metadata(json.dumps(document), file=tmp_path / "vllm_metadata.json")
    assert loaded.metadata is not None, [str(d) for d in loaded.diagnostics]
    return resolve_plan(tmp_path, loaded.metadata, paths=paths)


# --- the plan ---------------------------------------------------------------------------


def test_a_forward_form_bundle_runs_its_pooling_paths_only(tmp_path):
    plan = plan_of(tmp_path, {"tasks": ["classify", "embed"], "form": "forward"})
    assert plan.paths == ["pooling_embed", "pooling_classify"]
    assert plan.pooling == ["embed", "classify"] and plan.generation_paths == []
    assert not plan.runs_perplexity


def test_a_prefill_hidden_bundle_runs_generation_and_pooling_paths(tmp_path):
    plan = plan_of(
        tmp_path,
        {"tasks": ["embed"], "form": "prefill_hidden"},
        capabilities={"prefix_caching": True},
    )
    assert plan.paths == ["prefill", "decode", "prefix_cache", "pooling_embed"]
    assert plan.runs_perplexity
    # The tests section names generation paths; the pooling ones run all the same.
    plan = plan_of(
        tmp_path,
        {"tasks": ["embed"], "form": "prefill_hidden"},
        tests={"paths": ["prefill"]},
    )
    assert plan.paths == ["prefill", "pooling_embed"]
    assert plan_of(tmp_path, None).paths == ["prefill", "decode"]


@pytest.mark.parametrize(
    ("pooling", "path", "message"),
    [
        (
            {"tasks": ["embed"]},
            "decode",
            "test path 'decode' needs text generation, which p does not do: its pooling "
            "form 'forward' only pools",
        ),
        (
            {"tasks": ["embed"]},
            "pooling_classify",
            "test path 'pooling_classify' needs capabilities.pooling.tasks to list 'classify'",
        ),
        (None, "pooling_embed", "needs capabilities.pooling.tasks to list 'embed'"),
    ],
)
def test_a_path_the_bundle_cannot_run_is_refused(tmp_path, pooling, path, message):
    with pytest.raises(InvalidBundleError) as caught:
        plan_of(tmp_path, pooling, paths=[path])
    (diagnostic,) = caught.value.diagnostics
    assert diagnostic.code == "TTB110" and message in diagnostic.message


def test_a_classifier_of_the_hidden_states_form_runs_its_pooling_path_only(tmp_path):
    """A *ForSequenceClassification bundle has prefill and decode, but a score head where
    a language model's head would be: nothing to generate, so only its classifier."""
    pooling = {"tasks": ["classify"], "form": "prefill_hidden"}
    arch = "Qwen3ForSequenceClassification"
    assert plan_of(tmp_path, pooling, arch=arch).paths == ["pooling_classify"]
    with pytest.raises(InvalidBundleError) as caught:
        plan_of(tmp_path, pooling, paths=["prefill"], arch=arch)
    assert "needs text generation, which p does not do: it serves a classifier" in (
        caught.value.diagnostics[0].message
    )


def pooling_bundle(make_bundle, **metadata):
    """A bundle of the embedding adapter (the `forward` form), not served."""
    from ttbundles.demo.embedding_bundle import ADAPTER

    document = {
        "schema_version": 5,
        "main_class": "adapter:Embedder",
        "capabilities": {"pooling": {"tasks": ["embed"]}},
        **metadata,
    }
    return make_bundle("p", metadata=document, adapter=ADAPTER)


def test_validate_refuses_generation_paths_of_a_forward_form_bundle(make_bundle, run_cli):
    folder = pooling_bundle(make_bundle, tests={"paths": ["prefill"]})
    done = run_cli("validate", folder)
    assert done.returncode == 1
    assert "/tests/paths/0: error TTB110 test path 'prefill' needs text generation" in done.stdout


def test_a_forward_form_bundle_takes_no_other_golden(make_bundle, run_cli):
    folder = pooling_bundle(make_bundle)
    done = run_cli("test", folder, "--model", "ckpt", "--golden", "reference")
    assert done.returncode == 1 and "Traceback" not in done.stderr
    assert (
        "error TTB125 --golden reference: the pooling paths (pooling_embed) are compared "
        "with transformers only" in done.stderr
    )
    done = run_cli("test", folder, "--model", "ckpt", "--record", "g.json.gz")
    assert done.returncode == 1 and "error TTB125 --record writes a golden" in done.stderr


# --- the comparison ---------------------------------------------------------------------


class Golden:
    """A pooling golden of fixed numbers: hidden states `[n, 8]` from the ids."""

    name = "transformers"

    def __init__(self, logits=(0.5, -1.0, 2.0)):
        self._logits = np.array(logits)

    def states(self, ids):
        rng = np.random.default_rng(sum(ids))
        return rng.standard_normal((len(ids), 8))

    def embedding(self, ids, pooling):
        states = self.states(ids)
        return {"LAST": states[-1], "MEAN": states.mean(0), "CLS": states[0]}[pooling]

    def logits(self, ids):
        return self._logits


def case(path="pooling_embed"):
    return CaseResult(path=path, prompt="p0", label="p0 'hi'", golden="transformers")


def embed_case(raw, pooling="LAST"):
    golden = golden_vectors("embed", Golden(), [1, 2, 3], {"seq_pooling_type": pooling})
    served = {"embedding": normalise(raw), "raw": raw}
    result = case()
    compare_pooled(result, "embed", served, golden, pooling)
    return result


def test_a_faithful_embedding_passes_with_its_figures():
    result = embed_case(Golden().embedding([1, 2, 3], "LAST") + 1e-7)
    assert result.passed, [str(d) for d in result.failures]
    assert [s.note for s in result.steps] == ["embedding", "raw"]
    assert all(s.cosine > COSINE_MIN and s.max_abs_diff < 1e-6 for s in result.steps)
    assert result.details["vectors"]["raw"]["size"] == 8
    assert result.summary()["cosine_min"] > COSINE_MIN


def test_mean_pooling_where_vllm_pools_the_last_token_fails_both_vectors():
    result = embed_case(Golden().embedding([1, 2, 3], "MEAN"))
    assert [d.code for d in result.failures] == ["TTB128", "TTB128"]
    first = result.failures[0]
    assert first.message.startswith("pooling_embed, prompt p0 'hi': the embedding vector: cosine")
    assert "vLLM pools LAST here: the last real token of each right-padded row" in first.hint


def test_a_scaled_vector_fails_only_the_raw_vector_and_says_its_scale():
    result = embed_case(2.0 * Golden().embedding([1, 2, 3], "LAST"))
    (failure,) = result.failures
    assert failure.code == "TTB128" and "the raw vector: max abs diff" in failure.message
    assert "cosine" not in failure.message  # the direction is right
    assert "the raw one is 2 times the golden's" in failure.hint


def test_the_golden_pools_as_the_served_engine_resolved():
    """A checkpoint vLLM pools with MEAN (its sentence-transformers files): the golden
    pools the same way, so a generator that means is right."""
    assert embed_case(Golden().embedding([1, 2, 3], "MEAN"), pooling="MEAN").passed


def test_classify_compares_the_logits_and_vllms_activation_of_them():
    golden = golden_vectors("classify", Golden(), [1], {})
    assert np.allclose(golden["probs"].sum(), 1.0)  # softmax over 3 labels
    logits = np.array([0.5, -1.0, 2.0])
    right = case("pooling_classify")
    compare_pooled(right, "classify", {"probs": activate(logits), "logits": logits}, golden)
    assert right.passed and [s.top1 for s in right.steps] == [True, True]
    # Probabilities returned as if they were logits: vLLM activates them again.
    wrong = case("pooling_classify")
    probs = activate(logits)
    compare_pooled(wrong, "classify", {"probs": activate(probs), "logits": probs}, golden)
    assert [d.code for d in wrong.failures] == ["TTB129", "TTB129"]
    assert "the logits vector: max abs diff" in wrong.failures[1].message
    # One label: sigmoid; the calibration of the pooler configuration comes first.
    one = golden_vectors("classify", Golden([3.0]), [1], {"logit_mean": 1.0, "logit_sigma": 2.0})
    assert one["logits"] == pytest.approx([1.0]) and one["probs"] == pytest.approx([0.7310586])


def test_a_one_label_score_has_no_pcc_only_its_difference():
    """A reranker's score is one number: a correlation of it is no figure (it read
    `PCC 0.000000 ... pass`), so its steps and the vector table carry none."""
    from ttbundles.conformance.report import vector_lines

    golden = golden_vectors("classify", Golden([1.5]), [1, 2], {})
    result = case("pooling_classify")
    served = {"probs": golden["probs"] + 1e-7, "logits": golden["logits"] + 1e-7}
    compare_pooled(result, "classify", served, golden)
    assert result.passed and [s.pcc for s in result.steps] == [None, None]
    assert result.summary()["pcc_min"] is None
    lines = vector_lines(result)
    assert "PCC" not in lines[0] and "0.000000" not in "\n".join(lines), lines
    wrong = case("pooling_classify")
    compare_pooled(
        wrong, "classify", {"probs": golden["probs"] + 0.1, "logits": golden["logits"]}, golden
    )
    assert [d.code for d in wrong.failures] == ["TTB129"]
    three = case("pooling_classify")
    golden3 = golden_vectors("classify", Golden(), [1], {})
    compare_pooled(three, "classify", dict(golden3), golden3)
    assert three.steps[0].pcc == pytest.approx(1.0) and "PCC" in vector_lines(three)[0]


def test_a_rerankers_pair_is_a_case_named_by_its_query_and_document():
    """The harness's pair cases (query p0, document p1, on the ids vLLM made of the
    pair) are compared on those ids and labelled with both prompts."""
    from types import SimpleNamespace

    from ttbundles.conformance.session import TestReport, compare_pooling

    prompts = [SimpleNamespace(name=n, label=lambda n=n: f"{n} 'text'") for n in ("p0", "p1")]
    plan = SimpleNamespace(paths=["pooling_classify"], prompts=prompts)
    served = {
        "pooler": {"classify": {}},
        "runs": {
            "pooling_classify": [
                {
                    "prompt": "p0+p1",
                    "pair": ["p0", "p1"],
                    "context": [1, 2, 3, 4],
                    "vectors": {"probs": "a", "logits": "b"},
                }
            ]
        },
    }
    golden = Golden([0.25])
    wanted = golden_vectors("classify", golden, [1, 2, 3, 4], {})
    report = TestReport.__new__(TestReport)
    report.cases = []
    compare_pooling(report, plan, served, {"a": wanted["probs"], "b": wanted["logits"]}, golden)
    (result,) = report.cases
    assert result.passed and result.prompt == "p0+p1"
    assert result.label == "p0+p1 (query p0 'text', document p1 'text')"
    assert result.details["pair"] == ["p0", "p1"] and result.details["prompt_tokens"] == 4


def test_a_vector_of_the_wrong_width_is_a_failure_of_its_own():
    golden = golden_vectors("embed", Golden(), [1, 2], {})
    result = case()
    compare_pooled(result, "embed", {"embedding": np.ones(4), "raw": np.ones(4)}, golden)
    assert [d.code for d in result.failures] == ["TTB128", "TTB128"]
    assert "4 components, the golden's 8" in result.failures[0].message


# --- the command, served (the server tier) ----------------------------------------------

SERVE_TIMEOUT = 900
MEAN_ADAPTER_LINE = "return hidden[torch.arange(hidden.shape[0]), last]"


def serve_cli(*args):
    from tests.conftest import _run_cli_process

    return _run_cli_process("test", *args, "--format", "json", timeout=SERVE_TIMEOUT)


def write_bundle(folder: Path, metadata: dict, adapter: str) -> Path:
    folder.mkdir(parents=True)
    (folder / "vllm_metadata.json").write_text(json.dumps(metadata, indent=2))
    (folder / "adapter.py").write_text(adapter)
    return folder


def assert_passed(done, path: str, vectors: list[str]) -> dict:
    assert done.stdout.strip(), done.stderr[-3000:]
    report = json.loads(done.stdout)
    assert done.returncode == 0 and report["passed"], report["diagnostics"]
    assert report["paths"] == [path] and report["goldens"] == ["transformers"]
    # each prompt, then a reranker's query/document pairs (the first prompt the query)
    singles = [c["prompt"] for c in report["cases"] if "pair" not in c["details"]]
    assert singles == ["p0", "p1", "p2"]
    for case in report["cases"]:
        assert case["path"] == path
        assert [s["note"] for s in case["steps"]] == vectors
        assert all(s["compared"] for s in case["steps"])
    (engine,) = report["served"]["engines"]
    assert engine["options"]["runner"] == "pooling"
    return report


@pytest.mark.server
def test_the_embedding_bundle_passes(tmp_path, demo_checkpoint):
    from ttbundles.demo.embedding_bundle import write_embedding_bundle

    bundle = write_embedding_bundle(tmp_path)
    report = assert_passed(
        serve_cli(bundle, "--model", demo_checkpoint), "pooling_embed", ["embedding", "raw"]
    )
    for case in report["cases"]:
        assert case["summary"]["cosine_min"] >= 0.99999 and case["details"]["pooling"] == "LAST"
    assert report["served"]["engines"][0]["options"]["convert"] == "embed"
    assert report["served"]["pooler"]["embed"]["seq_pooling_type"] == "LAST"


@pytest.mark.server
def test_the_classifier_bundle_passes(tmp_path, classifier_checkpoint):
    from tests.pooling_bundles import CLASSIFIER, CLASSIFIER_METADATA

    bundle = write_bundle(tmp_path / "reranker", CLASSIFIER_METADATA, CLASSIFIER)
    report = assert_passed(
        serve_cli(bundle, "--model", classifier_checkpoint), "pooling_classify", ["probs", "logits"]
    )
    # vLLM pools a *ForSequenceClassification by itself: no --convert.
    assert "convert" not in report["served"]["engines"][0]["options"]
    # A reranker: scored on query/document pairs too, as /score and /rerank ask it; a
    # score is one number, with no PCC.
    pairs = [c for c in report["cases"] if "pair" in c["details"]]
    assert [c["prompt"] for c in pairs] == ["p0+p1", "p0+p2"]
    singles = {c["prompt"]: c["details"]["prompt_tokens"] for c in report["cases"]}
    for case in pairs:
        query, document = case["details"]["pair"]
        assert case["details"]["prompt_tokens"] >= singles[document]  # the pair's ids
        assert all(s["pcc"] is None for s in case["steps"]), case["steps"]


@pytest.mark.server
def test_an_embedder_that_means_fails_with_ttb128(tmp_path, demo_checkpoint):
    from ttbundles.demo.embedding_bundle import ADAPTER, METADATA

    assert MEAN_ADAPTER_LINE in ADAPTER
    adapter = ADAPTER.replace(
        MEAN_ADAPTER_LINE,
        "mask = attention_mask[..., None]\n"
        "        return (hidden * mask).sum(dim=1) / mask.sum(dim=1)",
    )
    bundle = write_bundle(tmp_path / "mean", {**METADATA, "name": "mean-embedder"}, adapter)
    done = serve_cli(bundle, "--model", demo_checkpoint)
    assert done.returncode == 1, done.stderr[-3000:]
    report = json.loads(done.stdout)
    assert not report["passed"] and len(report["cases"]) == 3
    for case in report["cases"]:
        codes = [d["code"] for d in case["diagnostics"]]
        assert codes == ["TTB128", "TTB128"], case["diagnostics"]
        message = case["diagnostics"][0]["message"]
        assert message.startswith(f"pooling_embed, prompt {case['label']}: the embedding vector")
        assert case["summary"]["cosine_min"] < 0.99999


@pytest.mark.server
def test_reference_bundles_of_the_hidden_states_form_pass(tmp_path):
    """`init --reference` bundles (the form prefill_hidden: the reference's prefill returns
    hidden states, vLLM's pooler finishes): a Qwen3 reranker and a three-label Qwen3
    classifier are tested on their classifier alone; a Qwen3-Embedding-shaped embedder on
    its embeddings, pooled as its modules.json says."""
    from ttbundles.demo.pooling_checkpoints import write_qwen3_classifier, write_qwen3_embedder
    from ttbundles.scaffold.init import init_bundle

    for labels in (1, 3):  # vLLM's sigmoid for one label, softmax for more
        reranker = write_qwen3_classifier(tmp_path / f"qwen3-cls{labels}", num_labels=labels)
        bundle = init_bundle(
            tmp_path / f"b-cls{labels}", arch=None, from_hf=str(reranker), reference=True
        )
        report = assert_passed(
            serve_cli(bundle.folder, "--model", reranker), "pooling_classify", ["probs", "logits"]
        )
        assert "convert" not in report["served"]["engines"][0]["options"]
    embedder = write_qwen3_embedder(tmp_path / "qwen3-embedder")
    bundle = init_bundle(tmp_path / "b-embedder", arch=None, from_hf=str(embedder), reference=True)
    done = serve_cli(bundle.folder, "--model", embedder, "--path", "pooling_embed")
    report = assert_passed(done, "pooling_embed", ["embedding", "raw"])
    assert report["served"]["pooler"]["embed"]["seq_pooling_type"] == "LAST"
