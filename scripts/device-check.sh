#!/usr/bin/env bash
# One prepared command for the lent GPU machine (one H200, Python 3.12, torch+CUDA and
# nvcc preinstalled, no network).  Run from anywhere; works in the repository root:
#   1. builds the extension with CUDA (sm_90 only, to save time) into .venv-gpu, a venv
#      that sees the preinstalled torch (--system-site-packages);
#   2. runs the CUDA parity tests (tests/test_cuda.py), then the whole CPU suite;
#   3. times each dataflow on a ~200k-voxel surface (SubmConv3d 3x3x3, C = 64).
# Every step logs to $OUT (default /tmp/device-check); summary.txt has the verdicts.
# A failing step does not stop later ones; the whole run stays under 8 minutes.
set -u
cd "$(dirname "$0")/.." || exit 1
OUT="${OUT:-/tmp/device-check}"
mkdir -p "$OUT"
SUMMARY="$OUT/summary.txt"
: > "$SUMMARY"

log() { echo "[$(date -u +%H:%M:%S)] $*" | tee -a "$SUMMARY"; }

# Runs "$@" under a time limit, output to $OUT/<name>.log; records the exit status.
step() {
    local name=$1 limit=$2
    shift 2
    local start=$SECONDS
    timeout "$limit" "$@" > "$OUT/$name.log" 2>&1
    local rc=$?
    log "$name: rc=$rc in $((SECONDS - start)) s"
    tail -n 3 "$OUT/$name.log" | sed 's/^/    /' | tee -a "$SUMMARY"
    return $rc
}

log "commit $(git rev-parse --short HEAD 2>/dev/null || echo unknown), $(date -u +%F)"
{
    nvidia-smi
    python3 --version
    python3 -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda)"
    python3 -c "import setuptools, pytest; print('setuptools', setuptools.__version__, \
'pytest', pytest.__version__)"
    command -v nvcc || ls /usr/local/cuda/bin/nvcc
} > "$OUT/env.log" 2>&1
log "environment: see env.log"

PY=.venv-gpu/bin/python
step venv 60 python3 -m venv --system-site-packages .venv-gpu
export CUDA_HOME="${CUDA_HOME:-/usr/local/cuda}"
if step build 240 env TORCH_LATTICE_CUDA=1 TORCH_LATTICE_CUDA_ARCHS=90 \
    "$PY" -m pip install --no-build-isolation --no-deps -v -e .; then
    step import 60 "$PY" -c "import torch_lattice._C as C; \
print('cuda_compiled', C.cuda_compiled(), 'devices', C.cuda_device_count())"
    step test-cuda 180 "$PY" -m pytest -q -m cuda -rs tests/test_cuda.py
    step test-cpu 150 "$PY" -m pytest -q -m "not cuda" -p no:cacheprovider
    step bench 120 "$PY" - <<'PYEOF'
# Dataflow micro-benchmark: medians of CUDA-event timings on torch's current stream.
import statistics

import torch

from torch_lattice.data import height_field
from torch_lattice.geometry import ConvGeometry
from torch_lattice.ops import _cuda


def timed(fn, reps=7, warm=2):
    for _ in range(warm):
        fn()
    times = []
    for _ in range(reps):
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        stop.record()
        stop.synchronize()
        times.append(start.elapsed_time(stop))
    return statistics.median(times)


coords = height_field(450).cuda()
n = coords.shape[0]
geom = ConvGeometry.submanifold((3, 3, 3), (1, 1, 1)).as_c()
print(f"scene: height_field(450), {n} voxels; SubmConv3d 3x3x3, C_in = C_out = 64")
print(f"kernel_map      {timed(lambda: _cuda.kernel_map(coords, coords, geom)):8.3f} ms")
nbr, rev = _cuda.kernel_map(coords, coords, geom)
print(f"kernel_pairs    {timed(lambda: _cuda.kernel_pairs(nbr)):8.3f} ms")
pairs = _cuda.kernel_pairs(nbr)
print(f"pairs: {pairs[1].numel()} ({pairs[1].numel() / n:.2f} per voxel)")
down = ConvGeometry((2, 2, 2), (2, 2, 2)).as_c()
rng = tuple(int(v) for v in (coords[:, 1:].max(0).values + 2) // 2)
t = timed(lambda: _cuda.generate_support(coords, down, rng, 1))
print(f"generate s2     {t:8.3f} ms")
for dtype in (torch.float32, torch.float16, torch.bfloat16):
    g = torch.Generator(device="cuda").manual_seed(0)
    x = torch.randn(n, 64, device="cuda", generator=g).to(dtype)
    w = (0.05 * torch.randn(27, 64, 64, device="cuda", generator=g)).to(dtype)
    dy = torch.randn(n, 64, device="cuda", generator=g).to(dtype)
    ref = None
    for df in _cuda.DATAFLOWS:
        maps = {"nbr": nbr} if df == "implicit_gemm" else {"pairs": pairs}
        y = _cuda.conv_forward(df, x, w, n_out=n, **maps)
        ref = y if ref is None else ref
        diff = (y.float() - ref.float()).abs().max().item()
        f = timed(lambda: _cuda.conv_forward(df, x, w, n_out=n, **maps))
        b = timed(lambda: _cuda.conv_weight_grad(df, x, dy, **maps))
        print(f"{str(dtype):15} {df:16} forward {f:8.3f} ms  weight grad {b:8.3f} ms  "
              f"max|y - y_implicit_gemm| {diff:.2e}")
x32, w32 = x.float(), w.float()
pin, pout = pairs[1].long(), pairs[2].long()
offs = pairs[0].tolist()


def torch_reference():
    y = torch.zeros(n, 64, device="cuda")
    for k in range(27):
        a, b = offs[k], offs[k + 1]
        y.index_add_(0, pout[a:b], x32.index_select(0, pin[a:b]) @ w32[k])
    return y


print(f"plain torch fp32 (index_select, mm, index_add_) forward {timed(torch_reference):8.3f} ms")
torch.backends.cuda.matmul.allow_tf32 = True
for df in _cuda.DATAFLOWS:
    maps = {"nbr": nbr} if df == "implicit_gemm" else {"pairs": pairs}
    f = timed(lambda: _cuda.conv_forward(df, x32, w32, n_out=n, **maps))
    print(f"tf32            {df:16} forward {f:8.3f} ms")
PYEOF
else
    log "build failed: see build.log (tests and benchmark skipped)"
fi
log "done in $SECONDS s"
exit 0
