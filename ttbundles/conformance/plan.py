"""What `ttbundle test` runs: the bundle's `tests` section, its defaults, the command line.

The plan is resolved once, here, without vLLM or torch: which prompts (texts and the
prompt file), which serving paths (the bundle's capabilities decide the default; a path
the bundle does not declare is an error, TTB110), how many tokens, the seeded sampling
and the thresholds. The serving side (`serving.harness`) gets it as one JSON document.

A bundle that pools (`capabilities.pooling`) gets a pooling path per task it declares
(`pooling_embed`, `pooling_classify`), whatever `tests.paths` says (the schema's list
names generation paths only); one of the form 'forward' has no generation path at all.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ttbundles.check.tests_section import (
    POOLING_PATHS,
    declares,
    image_prompt_problems,
    path_problems,
)
from ttbundles.errors import Diagnostic, InvalidBundleError, Severity
from ttbundles.format.meshes import HOST, canonical
from ttbundles.format.metadata import TEST_PATHS, BundleMetadata, BundleTests
from ttbundles.format.prompts import (
    DEFAULT_PROMPTS,
    Prompt,
    PromptFileError,
    image_prompts,
    read_prompt_file,
    text_prompts,
)

# The paths whose logits are read on the host (sampling on the host); perplexity runs
# with them, in the same engine.
HOST_PATHS = ("prefill", "decode", "prefix_cache")


ALL_PATHS: tuple[str, ...] = (*TEST_PATHS, *POOLING_PATHS)
"""Every path `--path` may name: the generation paths, then the pooling ones."""


def default_paths(metadata: BundleMetadata) -> list[str]:
    """Every path the bundle declares, in ALL_PATHS order."""
    return [p for p in ALL_PATHS if declares(metadata, p)]


def pooling_paths(metadata: BundleMetadata) -> list[str]:
    """The pooling paths of the tasks the bundle declares (none for one that only
    generates)."""
    return [p for p in POOLING_PATHS if declares(metadata, p)]


@dataclass
class TestPlan:
    """One resolved `ttbundle test` run."""

    __test__ = False  # not a pytest class

    bundle_dir: Path
    metadata: BundleMetadata
    tests: BundleTests
    prompts: list[Prompt]
    paths: list[str]
    max_tokens: int
    mesh: str
    device_mode: str | None

    @property
    def thresholds(self):  # noqa: ANN201 - format.metadata.Thresholds
        return self.tests.thresholds

    @property
    def has_images(self) -> bool:
        """Whether an image prompt runs (they run on the prefill and decode paths)."""
        return any(p.images for p in self.prompts) and any(
            p in ("prefill", "decode") for p in self.paths
        )

    @property
    def pooling(self) -> list[str]:
        """The pooling tasks checked (`embed`, `classify`), in path order."""
        return [POOLING_PATHS[p] for p in self.paths if p in POOLING_PATHS]

    @property
    def generation_paths(self) -> list[str]:
        return [p for p in self.paths if p not in POOLING_PATHS]

    @property
    def runs_perplexity(self) -> bool:
        return self.tests.perplexity_text is not None and any(p in HOST_PATHS for p in self.paths)

    def harness_spec(self, *, models_dir: Path, checkpoint: str, out_dir: Path) -> dict[str, Any]:
        """The document `serving.harness` runs."""
        target = self.metadata.target(self.mesh)
        env = dict(self.metadata.when.env)
        return {
            "bundle": self.metadata.name,
            "models_dir": str(models_dir),
            "checkpoint": checkpoint,
            "mesh": self.mesh,
            "env": env,
            "out_dir": str(out_dir),
            "prompts": [p.to_dict() for p in self.prompts],
            "paths": list(self.paths),
            "max_tokens": self.max_tokens,
            "chunk_size": self.tests.chunk_size,
            "sampling": self.tests.sampling.model_dump(),
            "device_mode": self.device_mode,
            "perplexity_text": self.tests.perplexity_text if self.runs_perplexity else None,
            "max_model_len": target.max_model_len if target else None,
            "max_num_seqs": target.max_num_seqs if target else None,
        }


def resolve_plan(
    bundle_dir: Path,
    metadata: BundleMetadata,
    *,
    paths: list[str] | None = None,
    max_tokens: int | None = None,
    mesh: str = HOST,
) -> TestPlan:
    """The plan for `bundle_dir`; raises InvalidBundleError (TTB110, TTB111, TTB101), and
    ConfigurationError for a mesh that is no preset or grid (TTB106; any case is fine)."""
    mesh = canonical(mesh, source="--mesh") or HOST
    tests = metadata.tests or BundleTests()
    problems: list[Diagnostic] = []
    if metadata.targets and mesh not in metadata.targets:
        problems.append(
            Diagnostic(
                "TTB101",
                Severity.ERROR,
                f"{metadata.name} does not target mesh {mesh} (targets: "
                f"{', '.join(metadata.targets)})",
                hint=f"test on one of its targets: --mesh {next(iter(metadata.targets))}",
            )
        )
    prompts = text_prompts(tests.prompts)
    if tests.prompt_file is not None:
        try:
            prompts += read_prompt_file(bundle_dir / tests.prompt_file)
        except PromptFileError as exc:
            problems.append(exc.diagnostic)
    if not tests.prompts and tests.prompt_file is None and not tests.image_prompts:
        prompts = text_prompts(list(DEFAULT_PROMPTS))
    prompts += image_prompts(tests.image_prompts, bundle_dir)
    problems.extend(
        image_prompt_problems(bundle_dir, metadata, str(bundle_dir / "vllm_metadata.json"))
    )
    names = [p.name for p in prompts]
    if len(set(names)) != len(names):
        problems.append(
            Diagnostic(
                "TTB111",
                Severity.ERROR,
                "prompt names repeat (texts are named p0, p1, ...; the prompt file's own "
                "names must differ from them)",
                hint="rename the prompt file's entries",
            )
        )
    if paths:
        unknown = [p for p in paths if p not in ALL_PATHS]
        if unknown:
            problems.append(
                Diagnostic(
                    "TTB033",
                    Severity.ERROR,
                    f"unknown test path {unknown[0]!r}",
                    hint=f"use one of {', '.join(ALL_PATHS)}",
                )
            )
        chosen = [p for p in ALL_PATHS if p in paths]
        problems.extend(path_problems(metadata, chosen, file=None, pointer=None))
    elif tests.paths is not None:
        chosen = [p for p in TEST_PATHS if p in tests.paths]
        chosen += pooling_paths(metadata)
        problems.extend(
            path_problems(
                metadata,
                tests.paths,
                file=str(bundle_dir / "vllm_metadata.json"),
                pointer="/tests/paths",
            )
        )
    else:
        chosen = default_paths(metadata)
    if problems:
        raise InvalidBundleError(problems)
    modes = metadata.capabilities.sample_on_device
    device_mode = "all" if "all" in modes else (modes[0] if modes else None)
    return TestPlan(
        bundle_dir=bundle_dir,
        metadata=metadata,
        tests=tests,
        prompts=prompts,
        paths=chosen,
        max_tokens=max_tokens or tests.max_tokens,
        mesh=mesh,
        device_mode=device_mode,
    )
