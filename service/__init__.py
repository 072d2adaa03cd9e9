"""memsweep's service layer: study engine, tracking, REST API, client and CLI (ray, optuna, mlflow, fastapi)."""
