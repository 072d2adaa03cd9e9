"""The one settings class, read from the environment (prefix MEMSWEEP_) and validated at start-up."""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="MEMSWEEP_", env_file=".env", extra="ignore")

    home: Path = Field(
        default=Path.home() / ".memsweep", description="where the ledger, Ray results and MLflow data live"
    )
    database_url: str | None = Field(
        default=None, description="SQLAlchemy URL of the ledger; default: SQLite in home"
    )
    ray_address: str | None = Field(
        default=None, description="join this Ray cluster (else RAY_ADDRESS, else embedded)"
    )
    ray_num_cpus: int | None = Field(default=None, description="CPUs of the embedded Ray (default: all)")
    mlflow_tracking_uri: str | None = Field(
        default=None, description="an MLflow server; default: start one on loopback"
    )
    mlflow_port: int = Field(default=5005, description="port of the MLflow server started on loopback")
    mlflow_experiment: str = Field(default="memsweep", description="MLflow experiment that holds the studies")
    max_grid_size: int = Field(default=50_000, description="largest number of trials one study may hold")

    def resolved_database_url(self) -> str:
        return self.database_url or f"sqlite:///{self.home / 'ledger.db'}"


@lru_cache
def get_settings() -> Settings:
    return Settings()
