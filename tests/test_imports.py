"""Heavy dependencies stay at the edges: the trainers pull in torch, never ray / mlflow / fastapi."""

import subprocess
import sys


def test_trainers_import_no_service_stack():
    code = "import sys, trainers, trainers.cli; print(sorted(m for m in ('ray','mlflow','fastapi','optuna','sqlalchemy') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
