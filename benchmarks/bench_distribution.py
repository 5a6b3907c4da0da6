"""Benchmark `ttbundle push` and `ttbundle pull` against curl moving the same blob.

One run: a bundle of `--size-gib` (incompressible weights, packed once), a real
registry (Debian's `docker-registry` on 127.0.0.1, temporary storage), then `--rounds`
interleaved rounds (the order of the two sides alternates), each measuring:

- push, baseline: `curl` starting an upload and PUTting the archive as one blob (digest
  known in advance: the transfer alone);
- push, ours: `ttbundle push ARCHIVE REF` (interpreter start, verifying the whole
  archive, hashing it, uploading, the manifest);
- pull, baseline: `curl -o` of the same blob;
- pull, ours: `ttbundle pull REF -o DIR` (manifest, config, the layer streamed and
  hashed, the archive verified file by file, renamed into place).

Each push goes to a new repository, so both sides really upload. Reported: the median
seconds and spread (min-max) per side, the ratio ours / baseline of the medians, and the
peak RSS of each of our commands (`wait4` on the child) at this size and at a small
size: equal figures mean memory does not grow with the bundle.

`--registration N` instead measures what the trust policy costs vLLM's registration:
N signed bundles in EXTRA_MODELS_DIR, a fresh interpreter computing the registry (as the
general plugin does in every vLLM process), without a policy (the baseline: no crypto
imported) and with `TT_BUNDLES_TRUST` (every bundle's signature verified), interleaved.

Usage: python benchmarks/bench_distribution.py [--size-gib 1.0] [--rounds 3] [--json]
       python benchmarks/bench_distribution.py --registration 100 [--rounds 5]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from stopping import unwind_on_sigterm  # noqa: E402 - benchmarks/, on sys.path

from tests.oci_registry import running  # noqa: E402 - the tests' registry fixture

MIB = 1 << 20
GIB = 1 << 30
TTBUNDLE = str(Path(sys.executable).parent / "ttbundle")

ADAPTER = """class Generator:
    @classmethod
    def initialize_vllm_model(cls, hf_config, mesh_device, max_batch_size, max_seq_len,
                              **kwargs):
        return cls()

    def allocate_kv_cache(self, kv_cache_shape, dtype, num_layers):
        return None

    def prefill_forward(self, tokens, page_table, kv_cache, prompt_lens, **kwargs):
        return None

    def decode_forward(self, tokens, start_pos, page_table, kv_cache, **kwargs):
        return None
"""


def make_archive(root: Path, total: int, name: str) -> Path:
    """A packed bundle of about `total` bytes of incompressible weights."""
    bundle = root / name
    (bundle / "weights").mkdir(parents=True)
    (bundle / "vllm_metadata.json").write_text(
        json.dumps(
            {
                "schema_version": 1,
                "name": name,
                "version": "1.0.0",
                "arch": "BenchForCausalLM",
                "main_class": "adapter:Generator",
            }
        )
    )
    (bundle / "adapter.py").write_text(ADAPTER)
    rng = random.Random(20261201)
    files = max(1, total // (256 * MIB))
    for index in range(files):
        left = total // files
        with open(bundle / "weights" / f"shard-{index}.bin", "wb") as out:
            while left > 0:
                chunk = min(left, 8 * MIB)
                out.write(rng.randbytes(chunk))
                left -= chunk
    from ttbundles.build import pack

    archive = pack(bundle, root / f"{name}-dist")
    shutil.rmtree(bundle)
    return archive


def timed(command: list[str]) -> tuple[float, int]:
    """(seconds, peak RSS in bytes) of one child process, which must succeed."""
    start = time.perf_counter()
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    _, status, usage = os.wait4(process.pid, 0)
    seconds = time.perf_counter() - start
    process.returncode = os.waitstatus_to_exitcode(status)
    out, err = process.stdout.read(), process.stderr.read()  # type: ignore[union-attr]
    if process.returncode != 0:
        raise RuntimeError(f"{command[0]} failed: {err.decode()[-2000:]} {out.decode()[-500:]}")
    return seconds, usage.ru_maxrss * 1024  # KiB on Linux


def digest_of(path: Path) -> str:
    import hashlib

    sha = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(MIB):
            sha.update(chunk)
    return "sha256:" + sha.hexdigest()


def curl_push(host: str, repo: str, archive: Path, digest: str) -> float:
    start = time.perf_counter()
    headers = subprocess.run(
        [
            "curl",
            "-sf",
            "-D",
            "-",
            "-o",
            "/dev/null",
            "-X",
            "POST",
            f"http://{host}/v2/{repo}/blobs/uploads/",
        ],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    location = next(
        line.split(":", 1)[1].strip()
        for line in headers.splitlines()
        if line.lower().startswith("location:")
    )
    if location.startswith("/"):
        location = f"http://{host}{location}"
    subprocess.run(
        [
            "curl",
            "-sf",
            "-o",
            "/dev/null",
            "-X",
            "PUT",
            "-H",
            "Content-Type: application/octet-stream",
            "-T",
            str(archive),
            f"{location}&digest={digest}",
        ],
        check=True,
    )
    return time.perf_counter() - start


def curl_pull(host: str, repo: str, digest: str, out: Path) -> float:
    start = time.perf_counter()
    subprocess.run(
        ["curl", "-sf", "-o", str(out), f"http://{host}/v2/{repo}/blobs/{digest}"], check=True
    )
    return time.perf_counter() - start


def summary(values: list[float]) -> dict:
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


REGISTER = """
import sys, time
start = time.perf_counter()
from ttbundles.registry.registry import compute
registry = compute()
assert all(e.status.value == "registered" for e in registry.entries), registry.problems
heavy = sorted({m.split(".")[0] for m in sys.modules} & {"model_signing", "cryptography"})
print(time.perf_counter() - start, ",".join(heavy))
"""


def registration(count: int, rounds: int) -> dict:
    """Registry computation of `count` signed bundles, without and with a policy."""
    sys.path.insert(0, str(REPO))
    from tests.trust_keys import key_pair
    from ttbundles.trust.signing import sign

    with tempfile.TemporaryDirectory(prefix="bench-trust-") as tmp:
        root = Path(tmp)
        keys = key_pair(root / "keys", "signer")
        trusted = root / "trusted"
        trusted.mkdir()
        shutil.copy(keys.public, trusted / "signer.pub")
        models = root / "models"
        for index in range(count):
            bundle = models / f"b{index}"
            bundle.mkdir(parents=True)
            name = f"b{index}"
            (bundle / "vllm_metadata.json").write_text(
                json.dumps(
                    {
                        "schema_version": 1,
                        "name": name,
                        "version": "1.0.0",
                        "arch": f"Bench{index}ForCausalLM",
                        "main_class": "adapter:Generator",
                    }
                )
            )
            (bundle / "adapter.py").write_text(ADAPTER)
            sign(bundle, keys.private)
        base = {**os.environ, "EXTRA_MODELS_DIR": str(models), "TT_VLLM_BUILTIN_MODELS": "0"}
        base.pop("TT_BUNDLES_TRUST", None)
        sides = {"no_policy": base, "policy": {**base, "TT_BUNDLES_TRUST": str(trusted)}}
        times: dict[str, list[float]] = {k: [] for k in sides}
        imported: dict[str, str] = {}
        for index in range(rounds + 1):  # the first round warms the caches, not counted
            order = list(sides) if index % 2 == 0 else list(reversed(sides))
            for side in order:
                start = time.perf_counter()
                done = subprocess.run(
                    [sys.executable, "-c", REGISTER],
                    env=sides[side],
                    capture_output=True,
                    text=True,
                    check=True,
                )
                if index:
                    times[side].append(time.perf_counter() - start)
                imported[side] = done.stdout.split(" ", 1)[1].strip() or "-"
    return {
        "bundles": count,
        **{k: summary(v) for k, v in times.items()},
        "ratio": statistics.median(times["policy"]) / statistics.median(times["no_policy"]),
        "crypto_imported": imported,
    }


def main(argv: list[str] | None = None) -> int:
    unwind_on_sigterm()  # a killed run still stops the servers it started
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--size-gib", type=float, default=1.0)
    parser.add_argument("--small-mib", type=float, default=32.0)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--registration", type=int, default=0, metavar="N")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    if args.registration:
        found = registration(args.registration, args.rounds)
        if args.json:
            print(json.dumps(found, indent=2))
        else:
            a, b = found["no_policy"], found["policy"]
            print(
                f"registration of {found['bundles']} signed bundles (fresh interpreter): "
                f"no policy {a['median']:.2f} s ({a['min']:.2f}-{a['max']:.2f}), "
                f"TT_BUNDLES_TRUST {b['median']:.2f} s ({b['min']:.2f}-{b['max']:.2f}), "
                f"ratio {found['ratio']:.2f}; crypto imported: {found['crypto_imported']}"
            )
        return 0
    if shutil.which("curl") is None:
        print("curl is needed for the baseline", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory(prefix="bench-distribution-") as tmp:
        root = Path(tmp)
        big = make_archive(root, int(args.size_gib * GIB), "bench-big")
        small = make_archive(root, int(args.small_mib * MIB), "bench-small")
        digest = digest_of(big)
        times: dict[str, list[float]] = {k: [] for k in ("curl_push", "push", "curl_pull", "pull")}
        rss: dict[str, int] = {}
        with running(root / "registry") as registry:
            host = registry.host
            # the small bundle: our peak RSS at a small size
            _, rss["push_small"] = timed([TTBUNDLE, "push", str(small), f"{host}/bench/small:1"])
            _, rss["pull_small"] = timed(
                [TTBUNDLE, "pull", f"{host}/bench/small:1", "-o", str(root / "small-out")]
            )
            for index in range(args.rounds):
                ours_first = index % 2 == 1
                repo_curl, repo_ours = f"bench/curl{index}", f"bench/ours{index}"
                out = root / f"out{index}"
                out.mkdir()

                def ours_push(repo: str = repo_ours) -> None:
                    seconds, peak = timed([TTBUNDLE, "push", str(big), f"{host}/{repo}:1"])
                    times["push"].append(seconds)
                    rss["push"] = max(rss.get("push", 0), peak)

                def base_push(repo: str = repo_curl) -> None:
                    times["curl_push"].append(curl_push(host, repo, big, digest))

                for step in (ours_push, base_push) if ours_first else (base_push, ours_push):
                    step()

                def ours_pull(repo: str = repo_ours, out: Path = out) -> None:
                    seconds, peak = timed([TTBUNDLE, "pull", f"{host}/{repo}:1", "-o", str(out)])
                    times["pull"].append(seconds)
                    rss["pull"] = max(rss.get("pull", 0), peak)
                    (out / big.name).unlink()

                def base_pull(repo: str = repo_curl, out: Path = out) -> None:
                    times["curl_pull"].append(curl_pull(host, repo, digest, out / "blob"))
                    (out / "blob").unlink()

                for step in (ours_pull, base_pull) if ours_first else (base_pull, ours_pull):
                    step()
        result = {
            "size_bytes": big.stat().st_size,
            "rounds": args.rounds,
            **{k: summary(v) for k, v in times.items()},
            "ratio_push": statistics.median(times["push"]) / statistics.median(times["curl_push"]),
            "ratio_pull": statistics.median(times["pull"]) / statistics.median(times["curl_pull"]),
            "peak_rss_mib": {k: round(v / MIB, 1) for k, v in rss.items()},
            "small_size_bytes": small.stat().st_size,
        }
    if args.json:
        print(json.dumps(result, indent=2))
        return 0
    print(f"archive {result['size_bytes'] / MIB:.0f} MiB, {args.rounds} interleaved rounds")
    for ours, base in (("push", "curl_push"), ("pull", "curl_pull")):
        o, b = result[ours], result[base]
        print(
            f"{ours}: ttbundle {o['median']:.2f} s ({o['min']:.2f}-{o['max']:.2f}), "
            f"curl {b['median']:.2f} s ({b['min']:.2f}-{b['max']:.2f}), "
            f"ratio {result['ratio_' + ours]:.2f}"
        )
    peak = result["peak_rss_mib"]
    print(
        f"peak RSS: push {peak['push']} MiB (at {result['small_size_bytes'] / MIB:.0f} MiB: "
        f"{peak['push_small']}), pull {peak['pull']} MiB (at small: {peak['pull_small']})"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
