"""The `tests` section's rules beyond the schema: each path it names is one the bundle's
capabilities declare (TTB110), its prompt file and recorded golden read cleanly.

The pooling paths (`POOLING_PATHS`: path -> task, from the catalogue's record of each
pooling task) are not in the schema's `tests.paths`: `ttbundle test` runs them for every
pooling task the bundle declares, and `--path` may name them. A bundle of the pooling form
'forward' has no generation contract, so no generation path.

`ttbundle validate` runs them; `ttbundle test` resolves its plan with the same
`path_problems`, so both refuse the same paths with the same words.
"""

from __future__ import annotations

from pathlib import Path

from ttbundles.errors import Diagnostic, Severity
from ttbundles.format.capabilities import POOLING_PATHS as POOLING_PATHS
from ttbundles.format.golden_file import GoldenFile, GoldenFileError
from ttbundles.format.metadata import PATH_CAPABILITY, BundleMetadata
from ttbundles.format.prompts import PromptFileError, image_problems, read_prompt_file


def generates(metadata: BundleMetadata) -> bool:
    """Whether the generator has the generation contract and a language-model head:
    every bundle but one that only pools (the pooling form 'forward': forward(input_ids,
    attention_mask), no KV cache) or that serves a classifier (`*ForSequenceClassification`:
    a score head where the LM head would be, so nothing to generate with)."""
    pooling = metadata.capabilities.pooling
    if pooling is None:
        return True
    return pooling.form != "forward" and not metadata.arch.endswith("ForSequenceClassification")


def declares(metadata: BundleMetadata, path: str) -> bool:
    """Whether the bundle allows `path` to run."""
    capabilities = metadata.capabilities
    if path in POOLING_PATHS:
        pooling = capabilities.pooling
        return pooling is not None and POOLING_PATHS[path] in pooling.tasks
    if not generates(metadata):
        return False
    capability = PATH_CAPABILITY.get(path)
    return capability is None or bool(getattr(capabilities, capability))


def path_problems(
    metadata: BundleMetadata, paths: list[str], *, file: str | None, pointer: str | None
) -> list[Diagnostic]:
    """TTB110 for each path whose capability the bundle does not declare; `pointer` is
    the JSON pointer of the list in the metadata file (None: the command line)."""
    out = []
    for index, path in enumerate(paths):
        if declares(metadata, path):
            continue
        if path in POOLING_PATHS:
            task = POOLING_PATHS[path]
            message = (
                f"test path {path!r} needs capabilities.pooling.tasks to list {task!r}, "
                f"which {metadata.name} does not declare"
            )
            hint = f"declare the pooling task {task!r}, or drop {path!r} from the paths"
        elif not generates(metadata):
            pooled = [p for p in POOLING_PATHS if declares(metadata, p)]
            why = (
                "it serves a classifier"
                if metadata.arch.endswith("ForSequenceClassification")
                else "its pooling form 'forward' only pools"
            )
            message = (
                f"test path {path!r} needs text generation, which {metadata.name} does not "
                f"do: {why}"
            )
            hint = (
                f"drop {path!r}: the bundle is tested on its pooling paths "
                f"({', '.join(pooled) or 'none'})"
            )
        else:
            capability = PATH_CAPABILITY[path]
            message = (
                f"test path {path!r} needs capabilities.{capability}, which "
                f"{metadata.name} does not declare"
            )
            hint = f"declare capabilities.{capability}, or drop {path!r} from the paths"
        out.append(
            Diagnostic(
                "TTB110",
                Severity.ERROR,
                message,
                file=file if pointer is not None else None,
                pointer=f"{pointer}/{index}" if pointer is not None else None,
                hint=hint,
            )
        )
    return out


def image_prompt_problems(bundle_dir: Path, metadata: BundleMetadata, file: str) -> list:
    """TTB110 for image prompts the bundle cannot take (no image input, or more images
    than its per-prompt limit); TTB111 for image files that do not read."""
    tests = metadata.tests
    if tests is None or not tests.image_prompts:
        return []
    limit = metadata.capabilities.input_limits().get("image", 0)
    out = []
    for i, prompt in enumerate(tests.image_prompts):
        if len(prompt.images) > limit:
            out.append(
                Diagnostic(
                    "TTB110",
                    Severity.ERROR,
                    f"image prompt {i} has {len(prompt.images)} images; {metadata.name} takes "
                    + (f"at most {limit} per prompt" if limit else "no image input"),
                    file=file,
                    pointer=f"/tests/image_prompts/{i}/images",
                    hint='declare capabilities.modalities, e.g. {"image": 2}, or send fewer images',
                )
            )
    return out + image_problems(bundle_dir, tests.image_prompts, file)


def check_tests(bundle_dir: Path, metadata: BundleMetadata, file: str) -> list[Diagnostic]:
    """The tests section's rules beyond the schema (run by `ttbundle validate`)."""
    tests = metadata.tests
    if tests is None:
        return []
    out: list[Diagnostic] = []
    if tests.paths is not None:
        out.extend(path_problems(metadata, tests.paths, file=file, pointer="/tests/paths"))
    if tests.prompt_file is not None:
        try:
            read_prompt_file(
                bundle_dir / tests.prompt_file, display=str(bundle_dir / tests.prompt_file)
            )
        except PromptFileError as exc:
            out.append(_pointing_from(exc.diagnostic, file, "/tests/prompt_file"))
    out.extend(image_prompt_problems(bundle_dir, metadata, file))
    if tests.golden is not None:
        try:
            GoldenFile.read(bundle_dir / tests.golden)
        except GoldenFileError as exc:
            out.extend(_pointing_from(d, file, "/tests/golden") for d in exc.diagnostics)
    return out


def _pointing_from(d: Diagnostic, file: str, pointer: str) -> Diagnostic:
    """A problem of a file the metadata names, reported at the key that names it when the
    file itself cannot be pointed into (missing, unreadable)."""
    if d.pointer is not None and "does not exist" not in d.message:
        return d
    return Diagnostic(
        d.code,
        d.severity,
        f"{pointer.rsplit('/', 1)[1]}: {d.message}",
        file=file,
        pointer=pointer,
        hint=d.hint,
    )
