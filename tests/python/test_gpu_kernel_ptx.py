"""The GPU resampler's committed PTX is what its source gives: `scripts/gen-ptx --check`
compiles crates/stoker-cuda/kernels/resize.cu with NVRTC (contraction off), lowers the PTX
version and compiles the result to machine code for sm_75, sm_80 and sm_90 with nvJitLink, then
compares it with resize.ptx. Neither tool needs a GPU; both come with PyTorch's CUDA wheels (the
test environment's torch). Without them the check cannot run, and says so."""

import glob
import os
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def test_committed_ptx_is_what_the_kernel_source_compiles_to():
    site = sysconfig.get_paths()["purelib"]
    tools = [glob.glob(os.path.join(site, "nvidia", "*", "lib", f"{lib}.so*")) for lib in ("libnvrtc", "libnvJitLink")]
    if not all(tools):
        pytest.skip("NVRTC and nvJitLink (PyTorch's CUDA wheels) are not installed here: PTX not checked")
    r = subprocess.run([sys.executable, str(ROOT / "scripts" / "gen-ptx"), "--check"], capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "is current" in r.stdout
