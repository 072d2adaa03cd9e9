-- The MLflow backend store lives beside the ledger, in its own database.
CREATE DATABASE mlflow OWNER memsweep;
