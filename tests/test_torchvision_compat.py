"""The torchvision compatibility step: narrow, and in every vLLM process.

Each case runs in a fresh interpreter: the step acts on the first import of torchvision.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest


def run(code: str, *, path: Path | None = None) -> subprocess.CompletedProcess[str]:
    prefix = f"import sys; sys.path.insert(0, {str(path)!r})\n" if path else ""
    return subprocess.run(
        [sys.executable, "-c", prefix + textwrap.dedent(code)],
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_real_torchvision_imports_and_preprocesses_but_its_cpp_ops_stay_unavailable():
    done = run(
        """
        from ttbundles import torchvision_compat
        torchvision_compat.install()
        import torch, torchvision
        from torchvision.transforms import v2
        image = torch.zeros(3, 8, 8, dtype=torch.uint8)
        out = v2.Resize((4, 4), antialias=True)(image)
        print(tuple(out.shape), torchvision_compat.applied())
        try:
            torchvision.ops.nms(torch.zeros(1, 4), torch.zeros(1), 0.5)
        except RuntimeError as error:
            print("nms:", str(error).split(".")[0])
        """
    )
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0] == "(3, 4, 4) True"
    assert lines[1] == "nms: Couldn't load custom C++ ops"


def test_the_start_up_hook_puts_the_step_in_place():
    done = run("import torchvision, ttbundles.torchvision_compat as c; print(c.applied())")
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "True"


def test_without_the_step_the_known_failure_happens():
    # Guards the premise: if a future torchvision fixes this, the step must not be needed.
    done = run(
        """
        import sys
        sys.meta_path[:] = [f for f in sys.meta_path if type(f).__name__ != "_TorchvisionFinder"]
        import torchvision
        """
    )
    assert done.returncode != 0
    assert "operator torchvision::nms does not exist" in done.stderr


@pytest.mark.server  # vLLM in a process of its own
def test_vllm_vision_modules_import_in_a_process_that_loaded_the_general_plugins():
    done = run(
        """
        from vllm.plugins import load_general_plugins
        load_general_plugins()
        import vllm.model_executor.models.qwen2_5_vl
        import vllm.model_executor.models.gemma3_mm
        print("imported")
        """
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip().endswith("imported")


def _fake_torchvision(root: Path, body: str) -> Path:
    package = root / "torchvision"
    package.mkdir()
    (package / "__init__.py").write_text(textwrap.dedent(body))
    return root


def test_another_import_error_is_not_hidden(tmp_path):
    root = _fake_torchvision(tmp_path, 'raise RuntimeError("operator foo::bar does not exist")')
    done = run(
        """
        from ttbundles import torchvision_compat
        torchvision_compat.install()
        import torchvision
        """,
        path=root,
    )
    assert done.returncode != 0
    assert "operator foo::bar does not exist" in done.stderr


def test_the_same_message_is_not_answered_when_the_extension_loaded(tmp_path):
    # Ops loaded (`_has_ops()` True) and still missing: something else is wrong; say so.
    root = _fake_torchvision(
        tmp_path,
        """
        import sys, types
        extension = types.ModuleType("torchvision.extension")
        extension._has_ops = lambda: True
        sys.modules["torchvision.extension"] = extension
        raise RuntimeError("operator torchvision::nms does not exist")
        """,
    )
    done = run(
        """
        from ttbundles import torchvision_compat
        torchvision_compat.install()
        import torchvision
        """,
        path=root,
    )
    assert done.returncode != 0
    assert "operator torchvision::nms does not exist" in done.stderr


def test_the_start_up_hook_loads_two_small_modules_and_nothing_heavy():
    # The .pth runs in every Python process of the environment: it must stay cheap.
    done = run(
        """
        import sys
        ours = sorted(m for m in sys.modules if m.startswith("ttbundles"))
        heavy = sorted(m for m in ("torch", "torchvision", "typing", "pathlib", "logging")
                       if m in sys.modules)
        print(ours, heavy)
        """
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "['ttbundles', 'ttbundles.torchvision_compat'] []"
