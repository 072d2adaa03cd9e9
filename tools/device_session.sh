#!/bin/bash
# The open GPU issues' device work, in the order they come first, as two prepared calls on a lent machine.
#
# Runs ON the device machine, from the repository root (the device tool's `run`), each part well under
# its 600 s limit, the second on the still-warm machine:
#
#     python tools/device_wheels.py       # here, first: the service's cp312 wheels into .whl/
#     run(command="bash tools/device_session.sh 1", carry=[".whl"], timeout_s=590)
#     run(command="bash tools/device_session.sh 2",
#         carry=[".venv/lib/python3.11/site-packages/mnist/data/mnist.pkl.gz"], timeout_s=590)
#
# Part 1: the service on the GPU (issue 34: benchmarks/gpu_service.py, the real server, Ray and MLflow)
# and the portable numbers on the host's Intel CPU (issue 33: tools/cross_vendor.py, compared with the
# AMD figures kept in the repository). Part 2, if device time is left (15 minutes a session, the
# machine's start included): the persistent kernel's measurement when the repository has it (issue 37),
# then the GPU check's graphs (benchmarks/gpu_check, a package since issue 36). Every file lands in $OUT; each
# step's log is $OUT/<step>.log and a step that fails does not stop the next one.
set -u -o pipefail
out=${OUT:?run through the device tool: \$OUT is where the results go}
export PYTHONUNBUFFERED=1

step() {  # step NAME SECONDS COMMAND...: run it under a time limit, its output into $OUT/NAME.log
    local name=$1 limit=$2
    shift 2
    echo "== $name (at most $limit s): $*"
    local began=$SECONDS
    timeout "$limit" "$@" 2>&1 | tee "$out/$name.log"
    local rc=${PIPESTATUS[0]}
    echo "== $name: exit $rc after $((SECONDS - began)) s"
    echo "$name $rc $((SECONDS - began))" >>"$out/steps.txt"
}

case ${1:-} in
1)
    # shellcheck source=/dev/null
    . tools/device_install.sh || { echo "device_install failed: no service run" | tee "$out/install.log"; exit 1; }
    step gpu_service 380 python3 benchmarks/gpu_service.py --out "$out"
    step cross_vendor 150 python3 tools/cross_vendor.py --out "$out/xeon.json"
    step cross_vendor_compare 20 python3 tools/cross_vendor.py --compare \
        benchmarks/results/cross-vendor/amd-epyc-torch2.11.json "$out/xeon.json"
    ;;
2)
    export PYTHONPATH=.
    if [ -f benchmarks/persistent_kernel.py ]; then
        step persistent_kernel 330 python3 benchmarks/persistent_kernel.py --budget-s 280 --out "$out"
    fi
    # the GPU check as a package (issue 36) on CUDA once: its graphs and the loop's timing at copy-500
    step gpu_check 200 python3 -m benchmarks.gpu_check --graphs-only --ks 64 --budget-s 140 --out "$out"
    # the persistent kernels' compile report with the card's own Triton (issue 37; registers and spills):
    # 8 warps only (the kernels' NUM_WARPS), on the host's 16 cores; its default set (both warps, 2
    # processes) took 3 minutes on a stand-in here, past this step's limit
    step kernel_report 60 python3 tools/kernel_report.py --n 25 100 128 --warps 8 --jobs 16
    ;;
*)
    echo "usage: bash tools/device_session.sh 1|2   (see the top of this file)" >&2
    exit 2
    ;;
esac
