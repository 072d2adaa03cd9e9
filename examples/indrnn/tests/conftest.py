"""The test process computes with one numerics mode from its start, as memsweep's own suite does
(tests/conftest.py): `trainers.train` asks for it, and MKL and ATen fix their kernels at their first
use, so a test that computes before the first `train` would otherwise leave `train` unable to set it."""

from trainers import numerics

numerics.use(numerics.default_mode())
