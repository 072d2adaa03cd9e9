"""The GPU check: every cell correct on CUDA and Orhan's bundles timed, eager and graphed, in one device
call of a few minutes (what it checks, the device call, its figures: docs/gpu.md).

    PYTHONPATH=. python3 -m benchmarks.gpu_check --out OUT
"""
