"""Let torchvision's Python part import next to a CPU torch that its C++ ops do not fit.

Why this exists: vLLM's vision-language model modules (and transformers' image
processors they use) import torchvision at module scope. The only torchvision built for
our pinned torch 2.13.0 is 0.28.0, a CUDA build. With the CPU torch its C++ extension
(`torchvision/_C.so`) cannot load (it links `libtorch_cuda.so`); torchvision is written
to live without it (`torchvision.extension._has_ops()` is then False and every C++
operator raises torchvision's own "Couldn't load custom C++ ops"), except for one spot:
`torchvision/_meta_registrations.py` registers fake kernels for `torchvision::nms` and
`torchvision::qnms` at import, which fails with "operator torchvision::nms does not
exist" when the extension did not define them.

What it does, and no more: a finder on `sys.meta_path` wraps the loading of the
top-level `torchvision` package. The import runs as usual; only when it fails with
exactly that error, and torchvision's extension did not load, are the two operator
*schemas* defined (no kernels: calling `nms` still raises) and the package executed
again. Any other import error propagates untouched. Image preprocessing (PIL, tensors,
`torchvision.transforms.v2`) works; detection operators do not, and nothing we serve
uses them.

Where it runs: installing torchvision 0.28.0 breaks `import torchvision` in the whole
environment, so the fix has the same scope: the wheel ships `ttbundles-torchvision-
compat.pth`, which Python executes at start-up in every process of the environment
(vLLM's API server, engine core and model-inspection subprocess, tests, a user's own
script). The vLLM general plugin calls `install()` too, for interpreters that skip .pth
files (`python -S`). `install()` is cheap: no import of torch or torchvision, nothing
but `sys` at module level.
"""

from __future__ import annotations

import sys

# Nothing else at module level: the .pth file imports this in every Python process of
# the environment, before anything else runs.

# The exact failure this module answers, as torch words it.
_MISSING_OPERATOR = "operator torchvision::{} does not exist"
_SCHEMAS = {
    "nms": "nms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor",
    "qnms": "qnms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor",
}
_state: dict[str, object] = {}


def install() -> None:
    """Put the finder on `sys.meta_path` once per process (idempotent, no imports)."""
    if any(isinstance(f, _TorchvisionFinder) for f in sys.meta_path):
        return
    sys.meta_path.insert(0, _TorchvisionFinder())


def applied() -> bool:
    """Whether this process had to define the schemas (for `doctor` and logs)."""
    return bool(_state.get("applied"))


def is_compat_failure(error: BaseException) -> bool:
    """Whether `error` is torchvision's missing-operator failure and nothing else."""
    return isinstance(error, RuntimeError) and str(error).strip() in {
        _MISSING_OPERATOR.format(name) for name in _SCHEMAS
    }


class _TorchvisionFinder:
    """Finds `torchvision` the usual way and wraps its loader; passes on everything else."""

    def find_spec(self, fullname, path=None, target=None):  # noqa: ANN001, ANN201
        if fullname != "torchvision":
            return None
        for finder in sys.meta_path:
            if isinstance(finder, _TorchvisionFinder) or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None:
                if spec.loader is not None and not isinstance(spec.loader, _RetryingLoader):
                    spec.loader = _RetryingLoader(spec.loader)
                return spec
        return None


class _RetryingLoader:
    def __init__(self, loader: object) -> None:
        self._loader = loader

    def create_module(self, spec: object) -> object:
        return self._loader.create_module(spec)

    def exec_module(self, module: object) -> None:
        try:
            self._loader.exec_module(module)
        except RuntimeError as error:
            if not is_compat_failure(error) or _extension_loaded():
                raise
            _define_schemas()
            import logging

            logging.getLogger("vllm.ttbundles").info(
                "ttbundles: torchvision's C++ operators do not load with this torch (CPU "
                "build); defined the torchvision::nms/qnms schemas so its Python part "
                "imports (image preprocessing works; detection operators stay unavailable)"
            )
            self._loader.exec_module(module)

    def __getattr__(self, name: str):  # noqa: ANN204 - resource readers and the like
        return getattr(self._loader, name)


def _extension_loaded() -> bool:
    extension = sys.modules.get("torchvision.extension")
    has_ops = getattr(extension, "_has_ops", None)
    return bool(has_ops and has_ops())


def _define_schemas() -> None:
    import torch

    if "library" in _state:
        return
    library = torch.library.Library("torchvision", "FRAGMENT")
    for name, schema in _SCHEMAS.items():
        try:
            torch._C._dispatch_find_schema_or_throw(f"torchvision::{name}", "")
        except RuntimeError:
            library.define(schema)
    _state["library"] = library  # a Library undefines its operators when collected
    _state["applied"] = True
